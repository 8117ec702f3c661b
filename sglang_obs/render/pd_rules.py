"""The rules of a prefill/decode deployment behind a gateway (docs/pd.md), from thresholds.yml's
`pd:` section: per-pool signals, the state of each pool (gateway, prefill, transfer, decode),
the deployment's one verdict, and its alerts. rules.py places the groups in its files.

A pool is the servers of one role in one cluster; the role comes from /server_info through the
exporter (`sglang_obs_server_config_info{disaggregation_mode}`), never from configuration. The
gateway is the scrape job `selectors.gateway_job`; its worker URL `http://host:port` is the
engine's instance. The deployment's verdict is the first state by PD_PRIORITY: the cause before
the symptoms it makes elsewhere in the flow. Its alert is the deployment's one notification, and
the per-server alerts of its servers are silent (their pool's state explains them).
"""

from __future__ import annotations

from sglang_obs.core.states import PD_POOLS, PD_PRIORITY, PD_STATE_POOL, PD_STATES

# The stages on a PD request's critical path to its first token, in the order it meets them
# (docs/pd.md): their means add up to the gateway's end-to-end TTFT, less what no stage
# measures. Each is a sglang:per_stage_req_latency_seconds{stage} except `prefill_waiting`,
# which SGLang observes as the prefill server's sglang:queue_time_seconds. decode_bootstrap and
# decode_transferred run beside the prefill leg, so they are not on the path.
TTFT_STAGES = ("prefill_bootstrap", "prefill_waiting", "prefill_forward",
               "prefill_transfer_kv_cache", "decode_waiting", "fake_output")
QUEUE_STAGE = "prefill_waiting"
ROLE_INFO = "instance:sglang_pd_role:info"
IN_STATE = "cluster:sglang_pd_in_state:bool"
CLUSTER_CODE = "cluster:sglang_pd_state:code"
POOL_CODE = "pool:sglang_pd_state:code"
BUSY = "pool:sglang_pd_busy:sum"
# The deployment's alerts, in PD_PRIORITY order.
ALERTS = {
    "kv_transfer_failing": "SGLangPDKVTransferFailing",
    "worker_circuit_open": "SGLangPDWorkerCircuitOpen",
    "routing_skew": "SGLangPDRoutingSkew",
    "kv_transfer_bottleneck": "SGLangPDKVTransferBottleneck",
    "decode_pool_contention": "SGLangPDDecodePoolContention",
    "prefill_pool_backlog": "SGLangPDPrefillPoolBacklog",
}
SATURATION = tuple(ALERTS)


def _sel(t: dict, key: str) -> str:
    return f'job="{t["selectors"][key]}"'


def gateway_job(t: dict) -> str:
    return t["selectors"]["gateway_job"]


def _pool(expr: str) -> str:
    """A per-server series of PD members, with its server's pool (role) as a label."""
    return f"({expr}) * on (cluster, instance) group_left (pool) {ROLE_INFO}"


def conditions(t: dict) -> dict[str, tuple[str, str]]:
    """Each PD state's condition (PromQL keyed by cluster) and the same in words."""
    c, p = t["classification"], t["pd"]
    floor = t["slo"]["traffic_floor_rps"]
    return {
        "kv_transfer_failing": (
            f"cluster:sglang_pd_transfer_failure:ratio1m >= {p['transfer_failure_ratio']}",
            f"bootstrap and transfer failures are ≥ {p['transfer_failure_ratio']} of the "
            "requests the prefill pool took over 1 min (`cluster:sglang_pd_transfer_failure"
            ":ratio1m`)"),
        "worker_circuit_open": (
            "cluster:smg_worker_cb_open:count > 0",
            "the gateway holds a worker's circuit breaker open (`smg_worker_cb_state == 1`, "
            "counted in `cluster:smg_worker_cb_open:count`)"),
        "routing_skew": (
            f"max by (cluster) (pool:sglang_pd_request_rate_skew:ratio) >= "
            f"{p['routing_skew_ratio']}\n"
            f"  unless on (cluster) max_over_time(cluster:smg_worker_cb_open:count"
            f"[{p['routing_skew_window']}]) > 0",
            f"the busiest worker of a pool finishes ≥ {p['routing_skew_ratio']} × the pool's "
            f"mean request rate over {p['routing_skew_window']} "
            f"(`pool:sglang_pd_request_rate_skew:ratio`; pools of ≥ 2 workers taking ≥ "
            f"{floor} requests/s), and no circuit breaker was open over that window (the "
            "traffic an open breaker moves is its own state's symptom)"),
        "kv_transfer_bottleneck": (
            f"(cluster:sglang_pd_kv_transfer_speed_bytes_per_second:avg1m < "
            f"{p['transfer_speed_drop_ratio']} * "
            "cluster:sglang_pd_kv_transfer_speed_bytes_per_second:median_1h)\n"
            "  and on (cluster) (cluster:sglang_pd_kv_transfer_latency_seconds:avg1m >= "
            f"{p['min_transfer_seconds']})",
            f"KV moves at < {p['transfer_speed_drop_ratio']} × its usual speed "
            "(`cluster:sglang_pd_kv_transfer_speed_bytes_per_second:avg1m` against the median "
            f"of the last hour) and a transfer takes ≥ {p['min_transfer_seconds']} s on "
            "average (`cluster:sglang_pd_kv_transfer_latency_seconds:avg1m`)"),
        "decode_pool_contention": (
            'max by (cluster) (pool:sglang_pd_queue_requests:sum{pool="decode", '
            f'queue="prealloc"}}) >= {p["min_prealloc_queue_requests"]}\n'
            '  and on (cluster) (max by (cluster) (pool:sglang_pd_running_requests_per_max:ratio'
            f'{{pool="decode"}}) >= {c["running_ratio_at_limit"]}\n'
            '    or max by (cluster) (pool:sglang_pd_kv_occupancy:max{pool="decode"}) >= '
            f'{c["kv_occupancy_ratio"]})',
            f"≥ {p['min_prealloc_queue_requests']} requests wait for decode KV "
            "(`pool:sglang_pd_queue_requests:sum{queue=\"prealloc\"}`) while the decode pool "
            f"runs ≥ {c['running_ratio_at_limit']} of its effective `max_running_requests` or "
            f"a decode server's KV pool is ≥ {c['kv_occupancy_ratio']} full"),
        "prefill_pool_backlog": (
            'max by (cluster) (pool:sglang_pd_prefill_backlog_tokens:sum{pool="prefill"}) >= '
            f'{c["prefill_backlog_tokens"]}\n'
            '  and on (cluster) (max by (cluster) (pool:sglang_pd_waiting_requests:sum'
            '{pool="prefill"}) > 0)',
            f"≥ {c['prefill_backlog_tokens']} prompt tokens wait in the prefill pool "
            "(`pool:sglang_pd_prefill_backlog_tokens:sum`) and its queue is non-empty"),
    }


def ttft_stage_means(t: dict, w: str) -> str:
    """Mean seconds per request in each TTFT_STAGES stage over window `w`, by (cluster, stage)."""
    s = _sel(t, "sglang_job")
    stages = "|".join(x for x in TTFT_STAGES if x != QUEUE_STAGE)
    prefill = f'{ROLE_INFO}{{pool="prefill"}}'
    return (
        f'sum by (cluster, stage) (rate(sglang:per_stage_req_latency_seconds_sum{{{s}, stage=~"{stages}"}}[{w}]))\n'  # noqa: E501
        f'  / (sum by (cluster, stage) (rate(sglang:per_stage_req_latency_seconds_count{{{s}, stage=~"{stages}"}}[{w}])) > 0)\n'  # noqa: E501
        f'or label_replace(sum by (cluster) (sum by (cluster, instance) (rate(sglang:queue_time_seconds_sum{{{s}}}[{w}])) and on (cluster, instance) {prefill})\n'  # noqa: E501
        f'  / (sum by (cluster) (sum by (cluster, instance) (rate(sglang:queue_time_seconds_count{{{s}}}[{w}])) and on (cluster, instance) {prefill}) > 0), '  # noqa: E501
        f'"stage", "{QUEUE_STAGE}", "", "")')


def gateway_ttft_mean(t: dict, w: str) -> str:
    """The gateway's mean PD TTFT over window `w`, by cluster."""
    g = f'job="{gateway_job(t)}"'
    return (f"sum by (cluster) (rate(smg_pd_ttft_seconds_sum{{{g}}}[{w}]))\n"
            f"  / (sum by (cluster) (rate(smg_pd_ttft_seconds_count{{{g}}}[{w}])) > 0)")


def ttft_unexplained(t: dict, w: str) -> str:
    """The share of the gateway's mean TTFT over `w` that the stages' means leave unexplained:
    the recorded 1-min ratio's definition, over any window (docs/detection.md uses each
    incident's)."""
    gateway = f"({gateway_ttft_mean(t, w)})"
    return (f"({gateway} - on (cluster) sum by (cluster) ({ttft_stage_means(t, w)}))\n"
            f"  / {gateway}")


def signal_records(t: dict) -> list[tuple[str, str, str]]:
    """(record, expr, why) of the per-pool and per-deployment signals, in evaluation order."""
    s, e = _sel(t, "sglang_job"), _sel(t, "exporter_job")
    g = f'job="{gateway_job(t)}"'
    p = t["pd"]
    floor = t["slo"]["traffic_floor_rps"]
    w = p["routing_skew_window"]
    out = [
        (ROLE_INFO,
         f'max by (cluster, host, instance, role, pool) (label_replace(label_replace('
         f'sglang_obs_server_config_info{{{e}, disaggregation_mode=~"prefill|decode"}}, '
         f'"role", "$1", "disaggregation_mode", "(.*)"), "pool", "$1", "disaggregation_mode", '
         f'"(.*)"))',
         "1 for each PD server, with its role (= its pool): read from /server_info by the "
         "exporter, never configured."),
        ("pool:sglang_pd_servers:count", f"count by (cluster, pool) ({ROLE_INFO})",
         "Servers in each pool."),
        ("pool:sglang_pd_servers_up:count",
         f"sum by (cluster, pool) ({_pool('instance:sglang_available:min')})",
         "Servers of each pool that answer."),
        ("pool:sglang_pd_running_requests:sum",
         f"sum by (cluster, pool) ({_pool('instance:sglang_running_requests:max')})",
         "Running requests in each pool."),
        ("pool:sglang_pd_waiting_requests:sum",
         f"sum by (cluster, pool) ({_pool('instance:sglang_waiting_requests:max')})",
         "Waiting requests in each pool."),
        ("pool:sglang_pd_running_requests_per_max:ratio",
         "pool:sglang_pd_running_requests:sum\n  / on (cluster, pool) (sum by (cluster, pool) ("
         + _pool(f"max by (cluster, host, instance) (sglang_obs_max_running_requests{{{e}}})")
         + ") > 0)",
         "The pool's running batch over its summed effective max_running_requests."),
        ("pool:sglang_pd_kv_occupancy:max",
         f"max by (cluster, pool) ({_pool('instance:sglang_kv_occupancy:ratio')})",
         "The fullest KV pool of the pool's servers."),
        ("pool:sglang_pd_prefill_backlog_tokens:sum",
         f"sum by (cluster, pool) ({_pool('instance:sglang_prefill_backlog_tokens:max')})",
         "Prompt tokens waiting to be prefilled across the pool."),
        ("pool:sglang_pd_queue_requests:sum",
         "sum by (cluster, pool, queue) ("
         + _pool(f"max by (cluster, host, instance, queue) (sglang_obs_pd_queue_requests{{{e}}})")
         + ")",
         "The PD queues (bootstrap, inflight on prefill; prealloc, transfer, retracted on "
         "decode), live from /v1/loads, summed over the pool."),
        ("pool:sglang_pd_decode_speed_per_request:min",
         f"min by (cluster, pool) ({_pool('instance:sglang_decode_speed_per_request:max')})",
         "Decode speed per request of the pool's slowest server."),
        ("instance:sglang_pd_requests:rate2m",
         f"sum by (cluster, host, instance) (rate(sglang:num_requests_total{{{s}}}[2m]))\n"
         f"  * on (cluster, instance) group_left (role, pool) {ROLE_INFO}",
         "Requests each PD worker finished per second: the gateway's selection counter has no "
         "worker label, so each engine's own count is the per-worker traffic."),
        (BUSY,
         "pool:sglang_pd_running_requests:sum + pool:sglang_pd_waiting_requests:sum\n"
         "  + on (cluster, pool) (sum by (cluster, pool) (pool:sglang_pd_queue_requests:sum)"
         " or 0 * pool:sglang_pd_running_requests:sum)\n"
         "  + on (cluster, pool) (sum by (cluster, pool) ("
         + _pool(f"sum by (cluster, host, instance) (increase(sglang:num_requests_total{{{s}}}[1m]))")  # noqa: E501
         + ") or 0 * pool:sglang_pd_running_requests:sum)",
         "The pool's work: requests running, waiting and in its PD queues, plus those it "
         "finished over the last minute (the glance page's finished_last_minute); 0 only when "
         "the pool is idle. A prefill server's requests pass through in about a second, so at "
         "a scrape it often holds none."),
        ("pool:sglang_pd_request_rate_skew:ratio",
         f"max by (cluster, pool) ({_pool(f'sum by (cluster, host, instance) (rate(sglang:num_requests_total{{{s}}}[{w}]))')})\n"  # noqa: E501
         f"  / on (cluster, pool) (avg by (cluster, pool) ({_pool(f'sum by (cluster, host, instance) (rate(sglang:num_requests_total{{{s}}}[{w}]))')}) > 0)\n"  # noqa: E501
         f"  and on (cluster, pool) (pool:sglang_pd_servers:count >= 2)\n"
         f"  and on (cluster, pool) (sum by (cluster, pool) ({_pool(f'sum by (cluster, host, instance) (rate(sglang:num_requests_total{{{s}}}[{w}]))')}) >= {floor})",  # noqa: E501
         f"Routing skew: the busiest worker's request rate over the pool's mean, over {w}."),
        ("cluster:sglang_pd_kv_transfer_bytes:rate1m",
         f"sum by (cluster) (rate(sglang:kv_transfer_total_mb_sum{{{s}}}[1m])) * 1e6",
         "Bytes of KV moved per second (SGLang observes each transfer on the prefill side, in "
         "MB)."),
        ("cluster:sglang_pd_kv_transfer_speed_bytes_per_second:avg1m",
         f"sum by (cluster) (rate(sglang:kv_transfer_speed_gb_s_sum{{{s}}}[1m])) * 1e9\n"
         f"  / (sum by (cluster) (rate(sglang:kv_transfer_speed_gb_s_count{{{s}}}[1m])) > 0)",
         "Mean speed of one transfer (GB/s in SGLang, bytes/s here)."),
        ("cluster:sglang_pd_kv_transfer_speed_bytes_per_second:median_1h",
         "quantile_over_time(0.5, cluster:sglang_pd_kv_transfer_speed_bytes_per_second:avg1m[1h])",
         "The deployment's usual transfer speed: the baseline of the transfer bottleneck."),
        ("cluster:sglang_pd_kv_transfer_latency_seconds:avg1m",
         f"sum by (cluster) (rate(sglang:kv_transfer_latency_ms_sum{{{s}}}[1m])) / 1e3\n"
         f"  / (sum by (cluster) (rate(sglang:kv_transfer_latency_ms_count{{{s}}}[1m])) > 0)",
         "Mean time one transfer takes (ms in SGLang, seconds here)."),
    ]
    kinds = (("bootstrap", "num_bootstrap_failed_reqs_total"),
             ("transfer", "num_transfer_failed_reqs_total"),
             ("timeout", "kv_transfer_timeouts_total"))
    # Both sides count a failed pair; the side that counted more is the deployment's count.
    out.append((
        "cluster:sglang_pd_transfer_failures:rate1m",
        "\nor ".join(
            'label_replace(max by (cluster) (sum by (cluster, pool) ('
            + _pool(f"sum by (cluster, host, instance) (rate(sglang:{metric}{{{s}}}[1m]))")
            + f')), "kind", "{kind}", "", "")' for kind, metric in kinds),
        "Handoff failures per second by kind: " + ", ".join(
            f"{kind} (sglang:{metric})" for kind, metric in kinds)
        + "; of the two sides, the one that counted more."))
    out += [
        ("cluster:sglang_pd_transfer_failure:ratio1m",
         'sum by (cluster) (cluster:sglang_pd_transfer_failures:rate1m{kind=~"bootstrap|transfer"})\n'  # noqa: E501
         "  / (sum by (cluster) ("
         + _pool(f"sum by (cluster, host, instance) (rate(sglang:num_requests_total{{{s}}}[1m]))")
         + ' and on (cluster, pool) pool:sglang_pd_servers:count{pool="prefill"})\n'
         '     + sum by (cluster) (cluster:sglang_pd_transfer_failures:rate1m{kind=~"bootstrap|transfer"}) > 0)',  # noqa: E501
         "Share of the requests the prefill pool took whose handshake or KV transfer failed."),
        ("cluster:sglang_pd_ttft_stage_seconds:avg1m", ttft_stage_means(t, "1m"),
         "Mean time a request spends in each stage on its critical path to the first token "
         "(the prefill server's queue time as `prefill_waiting`): the TTFT decomposition."),
        ("cluster:smg_pd_ttft_seconds:avg1m", gateway_ttft_mean(t, "1m"),
         "The gateway's end-to-end TTFT (prefill start to the first decode token), mean over "
         "1 min."),
        ("cluster:sglang_pd_ttft_unexplained:ratio1m",
         "(cluster:smg_pd_ttft_seconds:avg1m - sum by (cluster) "
         "(cluster:sglang_pd_ttft_stage_seconds:avg1m))\n"
         "  / (cluster:smg_pd_ttft_seconds:avg1m > 0)",
         "The share of the gateway's TTFT that no engine stage accounts for (negative: the "
         "stages add up to more, e.g. a retried request's first attempt)."),
        ("cluster:smg_router_ttft_gap_seconds:avg1m",
         "cluster:smg_pd_ttft_seconds:avg1m\n  - on (cluster) (sum by (cluster) ("
         + _pool(f"sum by (cluster, host, instance) (rate(sglang:time_to_first_token_seconds_sum{{{s}}}[1m]))")  # noqa: E501
         + ' and on (cluster, pool) pool:sglang_pd_servers:count{pool="decode"})\n'
         "    / (sum by (cluster) ("
         + _pool(f"sum by (cluster, host, instance) (rate(sglang:time_to_first_token_seconds_count{{{s}}}[1m]))")  # noqa: E501
         + ' and on (cluster, pool) pool:sglang_pd_servers:count{pool="decode"}) > 0))',
         "Gateway TTFT minus the decode engines' own TTFT: time spent in the gateway (routing, "
         "retries, the prefill leg before the decode side saw the request)."),
        ("worker:smg_worker_cb_open:bool",
         f"(max by (cluster, worker) (smg_worker_cb_state{{{g}}}) == bool 1)\n"
         f'  * on (cluster, worker) group_left (instance, pool) label_replace({ROLE_INFO}, '
         f'"worker", "http://$1", "instance", "(.*)")\n'
         f"or max by (cluster, worker) (smg_worker_cb_state{{{g}}}) == bool 1",
         "1 while the gateway holds the worker's circuit breaker open, with the engine "
         "(instance) and pool the worker URL names."),
        ("cluster:smg_worker_cb_open:count",
         f"sum by (cluster) (max by (cluster, worker) (smg_worker_cb_state{{{g}}}) == bool 1)",
         "Workers whose breaker is open (a removed worker's -1 and half-open 2 are not)."),
        ("cluster:smg_worker_retries:rate1m",
         f"sum by (cluster) (rate(smg_worker_retries_total{{{g}}}[1m]))",
         "Retries the gateway made per second."),
        ("cluster:smg_worker_retries_exhausted:rate1m",
         f"sum by (cluster) (rate(smg_worker_retries_exhausted_total{{{g}}}[1m]))",
         "Requests per second that failed after every retry."),
        ("cluster:smg_router_requests:rate1m",
         f"sum by (cluster) (rate(smg_router_requests_total{{{g}}}[1m]))",
         "Requests the gateway routed per second."),
        ("cluster:smg_router_errors:ratio1m",
         f"sum by (cluster) (rate(smg_router_request_errors_total{{{g}}}[1m]))\n"
         f"  / (cluster:smg_router_requests:rate1m > 0)",
         "Share of routed requests the gateway answered with an error."),
    ]
    return out


def state_records(t: dict) -> list[tuple[str, str, str]]:
    cond = conditions(t)
    out = [(IN_STATE, "\nor ".join(
        f'label_replace(0 * ({cond[state][0]}) + 1, "state", "{state}", "", "")'
        for state in SATURATION),
        "1 for each slow state whose condition the deployment meets (several may): "
        "the verdicts below pick by priority.")]
    deployment = "max by (cluster) (pool:sglang_pd_servers:count)"
    up = "sum by (cluster) (pool:sglang_pd_servers_up:count)"
    busy = f"sum by (cluster) ({BUSY})"
    base = {"unavailable": f"{up} == 0", "idle": f"({busy}) == 0", "healthy": f"{up} > 0"}

    def branch(state: str, expr: str) -> str:
        code = PD_STATES.index(state)
        return f"{code} + 0 * ({expr})" if code else f"0 * ({expr})"

    def in_state(state: str) -> str:
        return f'max by (cluster) ({IN_STATE}{{state="{state}"}})'

    cluster = [branch(k, base[k] if k in base else in_state(k)) for k in PD_PRIORITY]
    out.append((CLUSTER_CODE, "\nor on (cluster) ".join(cluster),
                "The deployment's verdict, by priority: " + ", ".join(PD_PRIORITY)
                + ". Codes: " + ", ".join(f"{i} {n}" for i, n in enumerate(PD_STATES)) + "."))
    pools = []
    for pool in PD_POOLS:
        own = [k for k in PD_PRIORITY if PD_STATE_POOL.get(k) == pool]
        if pool in ("prefill", "decode"):
            pool_up = f'sum by (cluster) (pool:sglang_pd_servers_up:count{{pool="{pool}"}})'
            pool_busy = f'sum by (cluster) ({BUSY}{{pool="{pool}"}})'
            rest = [branch("unavailable", f"{pool_up} == 0"),
                    *(branch(k, in_state(k)) for k in own),
                    branch("idle", f"({pool_busy}) == 0"), branch("healthy", f"{pool_up} > 0")]
        else:
            rest = [*(branch(k, in_state(k)) for k in own), branch("healthy", f"{deployment} > 0")]
        pools.append("label_replace(\n    " + "\n or on (cluster) ".join(rest)
                     + f',\n  "pool", "{pool}", "", "")')
    out.append((POOL_CODE, "\nor ".join(pools),
                "Each pool's state (pool: " + ", ".join(PD_POOLS) + "): the first, in the "
                "deployment's priority, of its own states, unavailable, idle and healthy."))
    out.append(("cluster:sglang_pd_state:class",
                "\nor ".join(f'label_replace(0 * ({CLUSTER_CODE} == {i}) + 1, "state", "{n}", '
                             '"", "")' for i, n in enumerate(PD_STATES)),
                "The deployment's verdict as a label (value 1), for tables and the glance page."))
    codes = " or ".join(f"{CLUSTER_CODE} == {PD_STATES.index(k)}" for k in SATURATION)
    out.append(("cluster:sglang_pd_saturated:bool",
                f"0 * {CLUSTER_CODE} + 1 and on (cluster) ({codes})\nor 0 * {CLUSTER_CODE}",
                "1 while the deployment is in one of its slow states, else 0."))
    out.append(("instance:sglang_pd_explained:bool",
                f"{ROLE_INFO} * on (cluster) group_left cluster:sglang_pd_saturated:bool",
                "For each PD server, its deployment's slow state: the per-server symptom "
                "alerts of a PD server read it, and are silent while it explains them."))
    return out


# What each alert says: (summary, description's first sentence, why the rule exists). The
# description then quotes the deployment's numbers.
ALERT_TEXT = {
    "kv_transfer_failing": (
        "PD KV transfers are failing.",
        "KV handoffs between the prefill and decode pools fail: requests are retried or lost",
        "State kv_transfer_failing: handshakes time out or transfers fail. It comes first: "
        "every other PD symptom follows from requests that never reach decode."),
    "worker_circuit_open": (
        "The gateway has taken a PD worker out of rotation.",
        "the gateway's circuit breaker for a worker is open: that worker failed its requests, "
        "the others take its share and the gateway retries",
        "State worker_circuit_open: a worker failed enough requests in a row that the gateway "
        "stopped sending to it; the skew and load it causes on the others are its symptoms."),
    "routing_skew": (
        "PD traffic is routed unevenly.",
        "one worker of a pool takes much more than its share of the requests",
        "State routing_skew: the gateway's policy concentrates traffic (a sticky cache-aware "
        "key, a stale load report); the overloaded worker's contention is its symptom."),
    "kv_transfer_bottleneck": (
        "PD KV transfer is slow.",
        "KV moves between the pools far below its usual speed: requests wait for their KV "
        "after prefill",
        "State kv_transfer_bottleneck: the link (RDMA, NIC, the transfer engine) is slower than "
        "usual; the prefill pool's backlog it causes is its symptom."),
    "decode_pool_contention": (
        "The PD decode pool is full.",
        "requests wait for KV on the decode pool, which runs at its limit",
        "State decode_pool_contention: the decode pool has no room for the requests prefill "
        "has finished; they wait in the prealloc queue and hold prefill KV meanwhile."),
    "prefill_pool_backlog": (
        "The PD prefill pool is backlogged.",
        "prompt tokens pile up in the prefill pool faster than it computes them",
        "State prefill_pool_backlog: prompts arrive faster than the prefill pool computes them, "
        "with the transfer and the decode pool keeping up."),
}
# The deployment's figures the alerts quote: (series, its matchers besides cluster, label,
# humanize function, unit).
QUOTED = (
    ("cluster:smg_pd_ttft_seconds:avg1m", "", "TTFT mean over 1 min (gateway)",
     "humanizeDuration", ""),
    ("cluster:sglang_pd_kv_transfer_latency_seconds:avg1m", "", "KV transfer mean over 1 min",
     "humanizeDuration", ""),
    ("cluster:sglang_pd_transfer_failure:ratio1m", "", "failed handoffs over 1 min",
     "humanizePercentage", ""),
    ("pool:sglang_pd_prefill_backlog_tokens:sum", ', pool="prefill"', "prefill pool backlog",
     "humanize", " tokens"),
    ("pool:sglang_pd_queue_requests:sum", ', pool="decode", queue="prealloc"',
     "requests waiting for decode KV", "humanize", ""),
    ("pool:sglang_pd_request_rate_skew:ratio", "", "busiest worker over its pool's mean",
     "humanize", "×"),
    ("cluster:smg_worker_cb_open:count", " ", "breakers open", "humanize", ""),
)
# The series each alert's value is (what the description calls "the value").
VALUE = {
    "kv_transfer_failing": "cluster:sglang_pd_transfer_failure:ratio1m",
    "worker_circuit_open": "cluster:smg_worker_cb_open:count",
    "routing_skew": "max by (cluster) (pool:sglang_pd_request_rate_skew:ratio)",
    "kv_transfer_bottleneck": "cluster:sglang_pd_kv_transfer_latency_seconds:avg1m",
    "decode_pool_contention": 'max by (cluster) (pool:sglang_pd_queue_requests:sum{pool="decode", '
                              'queue="prealloc"})',
    "prefill_pool_backlog": 'max by (cluster) (pool:sglang_pd_prefill_backlog_tokens:sum'
                            '{pool="prefill"})',
}


# The figures each alert quotes (indices into QUOTED): the gateway's TTFT, then its own.
QUOTES = {"kv_transfer_failing": (0, 2), "worker_circuit_open": (0, 6, 5),
          "routing_skew": (0, 5), "kv_transfer_bottleneck": (0, 1),
          "decode_pool_contention": (0, 4), "prefill_pool_backlog": (0, 3)}


def quotes(state: str) -> str:
    """"; label: value" for each figure the alert quotes (nothing where the deployment has
    none)."""
    out = []
    for i in QUOTES[state]:
        series, matchers, label, fmt, unit = QUOTED[i]
        query = f"max({series}{{cluster=%q{matchers.strip()}}})"
        out.append(f'{{{{ with printf `{query}` $labels.cluster | query }}}}; {label}: '
                   f'{{{{ . | first | value | {fmt} }}}}{unit}{{{{ end }}}}')
    return "".join(out)
