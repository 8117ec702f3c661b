"""SGLang PD deployment (uid sglang-pd): a prefill/decode deployment read as a request flows
(docs/pd.md): the gateway, the prefill pool, the KV transfer between them, the decode pool.

Top to bottom: the deployment's verdict and each pool's state (cluster:sglang_pd_state:code,
pool:sglang_pd_state:code; codes and colours from sglang_obs.core.states.PD_STATES), where the
gateway's time to first token goes, then one row per step of the flow with the signals its
state is classified from. Reading guide:
- prefill backlog growing while the inflight queue holds: the transfer or the decode side is
  holding prefilled KV, not the prefill GPUs;
- KV moved per second steady while each transfer slows: a slow link (kv_transfer_bottleneck);
- decode prealloc queue with the decode pool at its limit: decode_pool_contention;
- one server of a pool far above the pool's mean: routing skew (the gateway dashboard says why).
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

D = d.DEPLOYMENT
BACKLOG = float(d.CLASSIFY["prefill_backlog_tokens"])
AT_LIMIT = float(d.CLASSIFY["running_ratio_at_limit"])
KV_HIGH = float(d.CLASSIFY["kv_occupancy_ratio"])
FAILURE_RATIO = float(d.PD["transfer_failure_ratio"])
SPEED_DROP = float(d.PD["transfer_speed_drop_ratio"])
SLOW_TRANSFER = float(d.PD["min_transfer_seconds"])
PREALLOC = float(d.PD["min_prealloc_queue_requests"])
SKEW = float(d.PD["routing_skew_ratio"])
SKEW_WINDOW = d.PD["routing_skew_window"]
TTFT_LE = d.slo_le("ttft")
CODES = ", ".join(f"{code} {name}" for code, name in enumerate(d.PD_STATES))
SERVER_LINK = d.data_links("sglang-overview", "Overview of this server", ("cluster", "instance"))
GATEWAY_LINK = d.data_links("sglang-gateway", "Gateway dashboard of this cluster")


def pool_state(pool: str, title: str, description: str):
    panel = d.state_timeline(
        title, description,
        [(f'max by (cluster, pool) (pool:sglang_pd_state:code{{{D}, pool="{pool}"}})',
          "{{pool}} {{cluster}}")],
        d.pd_state_mappings(), w=6, h=4)
    return d.linked(panel, GATEWAY_LINK) if pool == "gateway" else panel


def per_server(role: str, w: int):
    return d.linked(d.timeseries(
        f"Requests per {role} server",
        f"Requests each {role} server finished per second (SGLang's own counter, 2 min rate): "
        "the gateway's selection counter has no worker label; click a line for its overview.",
        [(f'instance:sglang_pd_requests:rate2m{{{D}, role="{role}"}}', "{{instance}}")],
        d.REQ_PER_S, w=w, min_=0), SERVER_LINK)


state = [
    d.stat("Verdict now",
           "The deployment's state now (cluster:sglang_pd_state:code): the first of its pools' "
           "states by priority, the cause before the symptoms it produces.",
           [(f"max by (cluster) (cluster:sglang_pd_state:code{{{D}}})", "verdict {{cluster}}")],
           d.NONE, w=6, h=5, mappings=d.pd_state_mappings(), graph=False, background=True,
           text_mode="value_and_name"),
    d.state_timeline("Deployment verdict",
                     f"The deployment's state over time; codes {CODES} "
                     "(sglang_obs.core.states.PD_STATES).",
                     [(f"max by (cluster) (cluster:sglang_pd_state:code{{{D}}})",
                       "verdict {{cluster}}")],
                     d.pd_state_mappings(), w=18, h=5),
    pool_state("gateway", "Gateway",
               "The gateway's own state: worker_circuit_open (a breaker open) or routing_skew "
               "(one worker takes far more than its share); click for the gateway dashboard."),
    pool_state("prefill", "Prefill pool",
               "The prefill pool's state: prefill_pool_backlog when its pending prompt tokens "
               "pass the backlog threshold while requests wait; unavailable with no server up."),
    pool_state("transfer", "KV transfer",
               "The KV transfer's state: kv_transfer_failing (handshakes or transfers fail) or "
               "kv_transfer_bottleneck (each transfer slow against the usual speed)."),
    pool_state("decode", "Decode pool",
               "The decode pool's state: decode_pool_contention when requests wait for decode "
               "KV while the pool is at its limit or its KV pool is full."),
]

ttft = [
    d.timeseries("TTFT decomposition",
                 "Where the gateway's time to first token goes, mean per request over 1 min: the "
                 "engine stages stacked, against the gateway's end-to-end TTFT (dashed) and the "
                 f"share no stage explains (right axis); SLO line at {TTFT_LE} s.",
                 [(f"cluster:sglang_pd_ttft_stage_seconds:avg1m{{{D}}}", "{{stage}} {{cluster}}"),
                  (f"cluster:smg_pd_ttft_seconds:avg1m{{{D}}}",
                   "gateway end to end {{cluster}}"),
                  (f"cluster:sglang_pd_ttft_unexplained:ratio1m{{{D}}}",
                   "unexplained share {{cluster}}")],
                 d.SECONDS, w=12, stack=True,
                 thresholds=d.steps("green", (d.slo_seconds("ttft"), "red")),
                 overrides=d.dashed("B", unstack=True) + [
                     {"matcher": {"id": "byFrameRefID", "options": "C"},
                      "properties": [{"id": "unit", "value": d.RATIO},
                                     {"id": "custom.axisPlacement", "value": "right"},
                                     {"id": "custom.stacking",
                                      "value": {"group": "A", "mode": "none"}},
                                     {"id": "custom.fillOpacity", "value": 0}]}]),
    d.linked(d.timeseries(
        "Gateway vs engine TTFT",
        "The gateway's TTFT minus the decode engines' own, mean over 1 min: time spent in the "
        "gateway (routing, retries, the prefill leg before the decode side saw the request).",
        [(f"cluster:smg_router_ttft_gap_seconds:avg1m{{{D}}}", "gap {{cluster}}")],
        d.SECONDS, w=6), GATEWAY_LINK),
    d.linked(d.timeseries(
        "Requests through the gateway",
        "Requests the gateway routed per second (1 min rate); click for the gateway dashboard.",
        [(f"cluster:smg_router_requests:rate1m{{{D}}}", "routed {{cluster}}")],
        d.REQ_PER_S, w=6, min_=0), GATEWAY_LINK),
]

prefill = [
    d.timeseries("Prefill backlog",
                 "Prompt tokens waiting to be prefilled across the prefill pool; "
                 f"prefill_pool_backlog from {BACKLOG:g} tokens while requests wait.",
                 [(f'pool:sglang_pd_prefill_backlog_tokens:sum{{{D}, pool="prefill"}}',
                   "pending tokens {{cluster}}")],
                 d.TOKENS, w=6, min_=0, thresholds=d.steps("green", (BACKLOG, "red"))),
    d.timeseries("Prefill queues",
                 "Requests in the prefill pool's queues: bootstrap (handshake with the decode "
                 "side), waiting (for the prefill forward), inflight (KV being sent).",
                 [(f'pool:sglang_pd_queue_requests:sum{{{D}, pool="prefill"}}',
                   "{{queue}} {{cluster}}"),
                  (f'pool:sglang_pd_waiting_requests:sum{{{D}, pool="prefill"}}',
                   "waiting {{cluster}}")],
                 d.COUNT, w=6, min_=0),
    d.timeseries("Prefill running / effective max",
                 "The prefill pool's running requests over its summed effective "
                 f"max_running_requests; at the limit from {AT_LIMIT:g}.",
                 [(f'pool:sglang_pd_running_requests_per_max:ratio{{{D}, pool="prefill"}}',
                   "prefill {{cluster}}")],
                 d.RATIO, w=6, min_=0, max_=1, thresholds=d.steps("green", (AT_LIMIT, "orange"))),
    per_server("prefill", 6),
]

transfer = [
    d.timeseries("KV moved",
                 "Bytes of KV sent from prefill to decode servers per second (1 min rate of "
                 "SGLang's per-transfer size).",
                 [(f"cluster:sglang_pd_kv_transfer_bytes:rate1m{{{D}}}", "moved {{cluster}}")],
                 d.BYTES_PER_S, w=8, min_=0),
    d.timeseries("Transfer speed",
                 "Mean speed of one transfer over 1 min against its usual speed (median over "
                 f"1 h) and {SPEED_DROP:g}x of it (both dashed): kv_transfer_bottleneck below.",
                 [(f"cluster:sglang_pd_kv_transfer_speed_bytes_per_second:avg1m{{{D}}}",
                   "speed {{cluster}}"),
                  (f"cluster:sglang_pd_kv_transfer_speed_bytes_per_second:median_1h{{{D}}}",
                   "usual {{cluster}}"),
                  (f"{SPEED_DROP:g} * cluster:sglang_pd_kv_transfer_speed_bytes_per_second"
                   f":median_1h{{{D}}}", "bottleneck below {{cluster}}")],
                 d.BYTES_PER_S, w=8, min_=0, overrides=d.dashed("B", "C")),
    d.timeseries("Transfer latency",
                 "Mean time one KV transfer takes over 1 min; a slow transfer counts as a "
                 f"bottleneck only from {SLOW_TRANSFER:g} s.",
                 [(f"cluster:sglang_pd_kv_transfer_latency_seconds:avg1m{{{D}}}",
                   "latency {{cluster}}")],
                 d.SECONDS, w=8, min_=0, thresholds=d.steps("green", (SLOW_TRANSFER, "orange"))),
    d.timeseries("Transfer failures by kind",
                 "Failed handoffs per second (1 min rate) by kind: bootstrap (handshake), "
                 "transfer (KV send), timeout.",
                 [(f"cluster:sglang_pd_transfer_failures:rate1m{{{D}}}", "{{kind}} {{cluster}}")],
                 d.REQ_PER_S, w=12, min_=0, stack=True, bars=True),
    d.timeseries("Transfer failure ratio",
                 "Share of the requests the prefill pool took whose handshake or KV transfer "
                 f"failed (1 min); kv_transfer_failing from {FAILURE_RATIO:g}.",
                 [(f"cluster:sglang_pd_transfer_failure:ratio1m{{{D}}}", "failed {{cluster}}")],
                 d.RATIO, w=12, min_=0, thresholds=d.steps("green", (FAILURE_RATIO, "red"))),
]

decode = [
    d.timeseries("Decode queues",
                 "Requests in the decode pool's queues: prealloc (waiting for decode KV), "
                 "transfer (KV on its way), retracted; contention needs "
                 f"{PREALLOC:g}+ in prealloc with the pool at its limit.",
                 [(f'pool:sglang_pd_queue_requests:sum{{{D}, pool="decode"}}',
                   "{{queue}} {{cluster}}")],
                 d.COUNT, w=8, min_=0, thresholds=d.steps("green", (PREALLOC, "orange"))),
    d.timeseries("Decode running / effective max and KV",
                 "The decode pool's running requests over its summed effective max, and its "
                 f"fullest KV pool; at the limit from {AT_LIMIT:g}, KV full from {KV_HIGH:g}.",
                 [(f'pool:sglang_pd_running_requests_per_max:ratio{{{D}, pool="decode"}}',
                   "running / max {{cluster}}"),
                  (f'pool:sglang_pd_kv_occupancy:max{{{D}, pool="decode"}}',
                   "KV occupancy {{cluster}}")],
                 d.RATIO, w=8, min_=0, max_=1,
                 thresholds=d.steps("green", (min(AT_LIMIT, KV_HIGH), "orange"))),
    d.timeseries("Decode speed per request",
                 "Generation tokens per second one request sees on the decode pool's slowest "
                 "server: falling while the pool is at its limit is contention.",
                 [(f'pool:sglang_pd_decode_speed_per_request:min{{{D}, pool="decode"}}',
                   "slowest server {{cluster}}")],
                 d.TOKENS_PER_S, w=8, min_=0),
    per_server("decode", 12),
    d.timeseries("Routing skew",
                 f"Busiest server's request rate over its pool's mean ({SKEW_WINDOW}), in pools "
                 f"of 2+ servers with traffic; routing_skew from {SKEW:g}.",
                 [(f"pool:sglang_pd_request_rate_skew:ratio{{{D}}}", "{{pool}} {{cluster}}")],
                 d.NONE, w=12, min_=1, thresholds=d.steps("green", (SKEW, "red"))),
]

dashboard = d.dashboard(
    "SGLang PD deployment", "sglang-pd",
    "A prefill/decode deployment as a request flows: the verdict and each pool's state, where "
    "the gateway's TTFT goes, then the prefill pool, the KV transfer and the decode pool.",
    [
        ("Deployment state",
         "The verdict and the state of each step a request passes, left to right.", state),
        ("Gateway: time to first token",
         "The gateway's end-to-end TTFT split into the engines' stages.", ttft),
        ("Prefill pool", "Backlog, queues, limit and traffic of the prefill servers.", prefill),
        ("KV transfer", "Bytes moved, speed, latency and failures of the prefill to decode "
         "handoff.", transfer),
        ("Decode pool", "Queues, limit, decode speed, traffic and routing skew of the decode "
         "servers.", decode),
    ],
    variables=(d.DEPLOYMENT_CLUSTER,),
)
