"""Generates prometheus/rules/*.yml from prometheus/thresholds.yml (`make generate`).

Recording rules first (throughput, cache hit, quantiles, SLO error ratios, the per-server state
signals and the one state classification), then the alerts, which read the recorded series so
that dashboards and alerts share one definition. Every rule carries a comment saying why.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sglang_obs import config_dir
from sglang_obs.states import STATES

ROOT = config_dir.resolve()  # prometheus/, alertmanager/, grafana/
THRESHOLDS = ROOT / "prometheus" / "thresholds.yml"
RULES_DIR = ROOT / "prometheus" / "rules"

SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# (severity, long window, short window, burn factor, for) — SRE workbook, alerting.md §2.
BURN_RATES = (("critical", "1h", "5m", 14.4, "2m"), ("critical", "6h", "30m", 6, "15m"),
              ("warning", "1d", "2h", 3, "1h"), ("warning", "3d", "6h", 1, "3h"))
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
# State alerts keep firing this long after their state ends: an episode shorter than
# Alertmanager's group_wait still reaches the receiver, and a state flickering at its threshold
# does not flap (keep_firing_for: Prometheus 2.42+).
KEEP_FIRING = "2m"
LATENCY_HISTOGRAMS = (
    ("time_to_first_token_seconds", "TTFT"), ("inter_token_latency_seconds", "ITL"),
    ("e2e_request_latency_seconds", "E2E"), ("queue_time_seconds", "queue time"))
SERVING_ENDPOINTS = "/v1/chat/completions|/v1/completions|/generate"


def load_thresholds(path: Path = THRESHOLDS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@dataclass
class Rule:
    comment: str
    body: dict[str, Any]


@dataclass
class Group:
    name: str
    rules: list[Rule] = field(default_factory=list)
    interval: str | None = None

    def record(self, name: str, expr: str, comment: str) -> None:
        self.rules.append(Rule(comment, {"record": name, "expr": _clean(expr)}))

    def alert(self, name: str, expr: str, comment: str, *, severity: str, for_: str,
              summary: str, description: str, labels: dict | None = None,
              dashboard: str = "sglang-overview", keep_firing_for: str | None = None) -> None:
        t = CONFIG
        body = {
            "alert": name, "expr": _clean(expr), "for": for_,
            **({"keep_firing_for": keep_firing_for} if keep_firing_for else {}),
            "labels": {"severity": severity, **(labels or {})},
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{t['runbook_base']}#{name.lower()}",
                "dashboard": f"{t['dashboard_base']}/{dashboard}",
            },
        }
        self.rules.append(Rule(comment, body))


def _clean(expr: str) -> str:
    return "\n".join(line.rstrip() for line in expr.strip().splitlines())


CONFIG: dict[str, Any] = {}


def _s(t) -> str:
    return f'job="{t["selectors"]["sglang_job"]}"'


def _e(t) -> str:
    return f'job="{t["selectors"]["exporter_job"]}"'


# -- recording rules ---------------------------------------------------------------------------
def recording_groups(t: dict) -> list[Group]:
    s = _s(t)
    by = "sum by (instance, model_name)"
    serving = Group("sglang-serving.rules")
    for metric, label in (("num_requests", "Requests finished"),
                          ("prompt_tokens", "Prompt tokens"),
                          ("generation_tokens", "Generated tokens")):
        serving.record(
            f"instance_model:sglang_{metric}:rate5m",
            f"{by} (rate(sglang:{metric}_total{{{s}}}[5m]))",
            f"{label} per second, per server and model; sums away is_streaming.")
    for window in ("5m", "15m", "6h"):
        serving.record(
            f"instance_model:sglang_cache_hit:ratio_rate{window}",
            f"""
{by} (rate(sglang:cached_tokens_total{{{s}}}[{window}]))
  / ({by} (rate(sglang:prompt_tokens_total{{{s}}}[{window}])) > 0)""",
            "Prefix-cache hit ratio from counters: the cache_hit_rate gauge is per batch and "
            "was zeroed by decode reports up to 0.5.17.")
    for hist, label in LATENCY_HISTOGRAMS:
        for qname, q in QUANTILES:
            serving.record(
                f"instance_model:sglang_{hist}:{qname}_5m",
                f"histogram_quantile({q}, sum by (instance, model_name, le) "
                f"(rate(sglang:{hist}_bucket{{{s}}}[5m])))",
                f"{label} {qname} over 5 minutes (capped at the top finite bucket).")
    serving.record(
        "instance_model:sglang_aborted_requests:ratio_rate5m",
        f"""
{by} (rate(sglang:num_aborted_requests_total{{{s}}}[5m]))
  / ({by} (rate(sglang:num_requests_total{{{s}}}[5m])) > 0)""",
        "Share of requests aborted (client gone, or the server gave up).")
    serving.record(
        "instance:sglang_http_5xx:ratio_rate5m",
        f"""
(sum by (instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}", status_code=~"5.."}}[5m]))
   or 0 * sum by (instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])))
  / (sum by (instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])) > 0)""",  # noqa: E501
        "Share of serving-endpoint responses that are 5xx (0.5.7+), 0 when there are none; "
        "/metrics and /health are counted by SGLang too, hence the endpoint filter.")

    slo = Group("sglang-slo.rules")
    for name, hist in (("ttft", "time_to_first_token_seconds"),
                       ("itl", "inter_token_latency_seconds")):
        le = t["slo"][name]["threshold_seconds"]
        for window in SLO_WINDOWS:
            slo.record(
                f"instance_model:sglang_{name}_slo_errors:ratio_rate{window}",
                f"""
({by} (rate(sglang:{hist}_count{{{s}}}[{window}]))
  - {by} (rate(sglang:{hist}_bucket{{{s}, le="{le}"}}[{window}])))
  / ({by} (rate(sglang:{hist}_count{{{s}}}[{window}])) > 0)""",
                f"{name.upper()} SLO error ratio over {window}: share above {le} s "
                f"(an exact bucket bound).")
    slo.record(
        "instance_model:sglang_requests:rate1h",
        f"{by} (rate(sglang:time_to_first_token_seconds_count{{{s}}}[1h]))",
        "Traffic floor of the SLO alerts: requests per second over the last hour.")
    return [serving, slo, state_group(t)]


def state_group(t: dict) -> Group:
    s, e, c = _s(t), _e(t), t["classification"]
    g = Group("sglang-state.rules")
    g.record("instance:sglang_available:min",
             f"max by (instance) (sglang_obs_up{{{e}}})\nor max by (instance) (up{{{s}}})",
             "1 when the server answers: the exporter's poll (any endpoint) when it watches the "
             "server, else Prometheus's scrape. A server with metrics off still serves.")
    for name, metric in (("running_requests", "running_requests"),
                         ("waiting_requests", "waiting_requests"),
                         ("prefill_backlog_tokens", "prefill_backlog_tokens"),
                         ("queue_nonempty_duration_seconds", "queue_nonempty_duration_seconds"),
                         ("decode_speed_per_request",
                          "decode_speed_per_request_tokens_per_second")):
        g.record(f"instance:sglang_{name}:max", f"max by (instance) (sglang_obs_{metric}{{{e}}})",
                 f"Exporter's live {name.replace('_', ' ')} (polled every second), per server.")
    g.record("instance:sglang_running_requests_per_max:ratio",
             f"max by (instance) (sglang_obs_running_requests_ratio{{{e}}})",
             "Running requests over the effective max_running_requests.")
    g.record("instance:sglang_kv_occupancy:ratio",
             f"max by (instance) (sglang_obs_kv_occupancy_ratio{{{e}}})",
             "KV pool used over capacity at full resolution.")
    x = f"sglang:num_retracted_requests_total{{{s}}}"
    g.record("instance:sglang_retractions:increase5m", f"""
sum by (instance) (
    (increase({x}[5m]) or 0 * {x})
  + ((min_over_time({x}[5m]) unless {x} offset 5m) or 0 * {x}))""",
             "Requests retracted (KV pool full in decode) in the last 5 minutes (0.5.7+). "
             "SGLang creates the counter at the first retraction, already counting it, so a "
             "series younger than 5 minutes counts from zero.")
    g.record("instance:sglang_decode_speed_per_request:p90_1h",
             "quantile_over_time(0.9, instance:sglang_decode_speed_per_request:max[1h])",
             "The server's usual good decode speed per request: the baseline of contention.")
    g.record("instance:sglang_running_requests:avg_1h",
             "avg_over_time(instance:sglang_running_requests:max[1h])",
             "The server's usual running-batch size.")
    kv = (f"(instance:sglang_kv_occupancy:ratio >= {c['kv_occupancy_ratio']})"
          " or (instance:sglang_retractions:increase5m > 0)")
    # Waiting prompts behind a running batch at its limit are not a prefill backlog: they wait
    # for a slot (decode contention or a scheduling limit), not for prefill compute.
    prefill = (f"(instance:sglang_prefill_backlog_tokens:max >= {c['prefill_backlog_tokens']})"
               " and on (instance) (instance:sglang_waiting_requests:max > 0)"
               " unless on (instance) (instance:sglang_running_requests_per_max:ratio >= "
               f"{c['running_ratio_at_limit']})")
    # At the limit a batch is slower per request anyway: only a collapse counts there; below
    # it, a batch twice its usual size with a clear drop does.
    decode = f"""(((instance:sglang_decode_speed_per_request:max
    < {c['decode_speed_collapse_ratio']} * instance:sglang_decode_speed_per_request:p90_1h)
   and on (instance)
       (instance:sglang_running_requests_per_max:ratio >= {c['running_ratio_at_limit']}))
  or ((instance:sglang_decode_speed_per_request:max
       < {c['decode_speed_drop_ratio']} * instance:sglang_decode_speed_per_request:p90_1h)
      and on (instance) (instance:sglang_running_requests:max >= {c['min_running_for_contention']})
      and on (instance) (instance:sglang_running_requests:max
                         >= {c['running_growth_factor']} * instance:sglang_running_requests:avg_1h))
 ) and on (instance) (instance:sglang_kv_occupancy:ratio >= {c['min_kv_for_contention']})"""
    scheduling = (f"(instance:sglang_queue_nonempty_duration_seconds:max >= "
                  f"{c['scheduling_queue_seconds']})"
                  f" and on (instance) (instance:sglang_kv_occupancy:ratio < "
                  f"{c['scheduling_kv_ratio_below']})")
    idle = ("(instance:sglang_running_requests:max == 0)"
            " and on (instance) (instance:sglang_waiting_requests:max == 0)")
    code = STATES.index
    g.record("instance:sglang_state:code", f"""
  0 * (instance:sglang_available:min == 0)
or {code('kv_capacity')} + 0 * ({kv})
or {code('prefill_backlog')} + 0 * ({prefill})
or {code('decode_contention')} + 0 * ({decode})
or {code('scheduling_bottleneck')} + 0 * ({scheduling})
or {code('idle')} + 0 * ({idle})
or {code('healthy')} + 0 * (instance:sglang_available:min == 1)""",
             "One state per server, by priority: unavailable, kv_capacity, prefill_backlog, "
             "decode_contention, scheduling_bottleneck, idle, healthy (seed 000's reading guide). "
             "Codes: " + ", ".join(f"{i} {n}" for i, n in enumerate(STATES)) + ".")
    g.record("instance:sglang_state:class",
             "\nor ".join(f'label_replace(0 * (instance:sglang_state:code == {i}) + 1, '
                          f'"state", "{name}", "", "")' for i, name in enumerate(STATES)),
             "The same state as a label (value 1), for tables, alerts and snapshots.")
    return g


# -- alerts ------------------------------------------------------------------------------------
def alert_groups(t: dict) -> list[Group]:
    s, e, a = _s(t), _e(t), t["alerts"]
    code = STATES.index
    avail = Group("sglang-availability.alerts")
    avail.alert(
        "SGLangServerDown",
        f"""
max by (instance) (sglang_obs_up{{{e}}}) == 0
or (max by (instance) (up{{{s}}}) == 0 unless on (instance) max by (instance) (sglang_obs_up{{{e}}}) == 1)""",  # noqa: E501
        "The server answers neither the exporter nor Prometheus. A failed scrape alone, while "
        "the exporter still reaches the API, is SGLangMetricsMissing, not this.",
        severity="critical", for_="30s", summary="SGLang server is not answering.",
        description="{{ $labels.instance }} has not answered for 30 seconds (state "
                    "unavailable): requests to it fail.")
    avail.alert(
        "SGLangMetricsMissing",
        f"""
(max by (instance) (up{{{s}}}) == 0 and on (instance) max by (instance) (sglang_obs_up{{{e}}}) == 1)
or (max by (instance) (up{{{s}}}) == 1
    unless on (instance) count by (instance) ({{__name__=~"sglang:num_running_reqs|sglang:num_queue_reqs", {s}}}))""",  # noqa: E501
        "The API answers but /metrics fails (--enable-metrics off: 404) or has no scheduler "
        "series (sglang_* names not renamed back, see prometheus.yml).",
        severity="warning", for_="10m", summary="SGLang is up but exposes no scheduler metrics.",
        description="{{ $labels.instance }} serves requests but Prometheus gets no "
                    "sglang:num_running_reqs from it: metrics disabled or a spelling mismatch.")
    avail.alert(
        "SGLangContainerRestarting",
        f"increase(sglang_obs_container_restarts_total{{{e}}}[15m]) >= "
        f"{a['container_restarts_in_15m']}",
        "A restart loop: the container keeps dying and coming back.",
        severity="critical", for_="0m", summary="SGLang container is restarting repeatedly.",
        description="Container {{ $labels.container }} ({{ $labels.instance }}) restarted "
                    "{{ $value | humanize }} times in 15 minutes (state unavailable between "
                    "restarts).")
    avail.alert(
        "SGLangOOMKilled",
        f"increase(sglang_obs_container_oom_kills_total{{{e}}}[15m]) > 0",
        "The kernel killed the container for host memory (not GPU memory).",
        severity="critical", for_="0m", summary="SGLang container was OOM-killed.",
        description="Container {{ $labels.container }} ({{ $labels.instance }}) was killed "
                    "for running out of host memory {{ $value | humanize }} times in 15 "
                    "minutes.")
    avail.alert(
        "SGLangExporterDown",
        f"up{{{e}}} == 0 or absent(up{{{e}}})",
        "Without the exporter the derived signals and GPU and container metrics are gone.",
        severity="critical", for_="2m", summary="The sglang-obs exporter is down.",
        description="Prometheus cannot scrape the exporter{{ with $labels.instance }} {{ . }}"
                    "{{ end }}: derived SGLang, GPU and container metrics are missing.")
    avail.alert(
        "SGLangExporterCollectorFailing",
        f"sglang_obs_collector_success{{{e}}} == 0",
        "A collector raised while rendering: its series are missing from every scrape.",
        severity="warning", for_="5m", summary="An exporter collector is failing.",
        description="Collector {{ $labels.collector }} on {{ $labels.instance }} has failed "
                    "for 5 minutes; its series are missing.")

    sat = Group("sglang-saturation.alerts")
    sat.alert(
        "SGLangPrefillBacklog",
        f"instance:sglang_prefill_backlog_tokens:max and on (instance) "
        f"(instance:sglang_state:code == {code('prefill_backlog')})",
        "State prefill_backlog: prompt tokens pile up faster than chunked prefill drains them.",
        severity="warning", for_="1m", summary="SGLang prefill backlog is building up.",
        keep_firing_for=KEEP_FIRING,
        description="{{ $labels.instance }} is in state prefill_backlog: {{ $value | humanize }} "
                    "prompt tokens wait to be prefilled while requests queue.",
        dashboard="sglang-overview")
    sat.alert(
        "SGLangDecodeContention",
        f"instance:sglang_decode_speed_per_request:max and on (instance) "
        f"(instance:sglang_state:code == {code('decode_contention')})",
        "State decode_contention: too many long requests decode at once; each one is slow. "
        "Decode speed and running come from the exporter's 1 s polls, so 1m is enough.",
        severity="warning", for_="1m", summary="SGLang requests are slowed by decode contention.",
        keep_firing_for=KEEP_FIRING,
        description="{{ $labels.instance }} is in state decode_contention: each request decodes "
                    "at {{ $value | humanize }} tokens/s, well below its usual speed.")
    sat.alert(
        "SGLangKVCachePressure",
        f"instance:sglang_kv_occupancy:ratio and on (instance) "
        f"(instance:sglang_state:code == {code('kv_capacity')})",
        "State kv_capacity: the KV pool is full; requests are retracted or wait for memory.",
        severity="warning", for_="2m", summary="SGLang KV cache pool is out of room.",
        keep_firing_for=KEEP_FIRING,
        description="{{ $labels.instance }} is in state kv_capacity: the KV pool is "
                    "{{ $value | humanizePercentage }} used, or requests were retracted in the "
                    "last 5 minutes.")
    sat.alert(
        "SGLangRequestsRetracted",
        "instance:sglang_retractions:increase5m > 0",
        "Retraction (SGLang's preemption) throws away decode work: the pool ran out.",
        severity="warning", for_="1m", summary="SGLang is retracting requests.",
        description="{{ $labels.instance }} retracted {{ $value | humanize }} requests in 5 "
                    "minutes (state kv_capacity): the KV pool ran out during decode.")
    sat.alert(
        "SGLangSchedulingBottleneck",
        f"instance:sglang_queue_nonempty_duration_seconds:max and on (instance) "
        f"(instance:sglang_state:code == {code('scheduling_bottleneck')})",
        "State scheduling_bottleneck: requests wait for a running slot while memory is free.",
        severity="warning", for_="2m", summary="SGLang requests queue while capacity is free.",
        keep_firing_for=KEEP_FIRING,
        description="{{ $labels.instance }} is in state scheduling_bottleneck: the queue has "
                    "been non-empty for {{ $value | humanizeDuration }} with the KV pool far "
                    "from full.")
    sat.alert(
        "SGLangLongQueueing",
        f"instance:sglang_queue_nonempty_duration_seconds:max >= {a['long_queueing_seconds']}",
        "The signal is itself a duration (the queue has been non-empty that long), so the rule "
        "needs no for:. A symptom: the state alerts name the cause.",
        severity="warning", for_="0m", summary="SGLang requests have been queueing for long.",
        description="{{ $labels.instance }}: the waiting queue has been continuously "
                    "non-empty for {{ $value | humanizeDuration }}.")

    slo = Group("sglang-slo.alerts")
    floor = t["slo"]["traffic_floor_rps"]
    for name, alert, what in (
        ("ttft", "SGLangTTFTBudgetBurn", "of requests waited more than {t} s for the first token"),
        ("itl", "SGLangITLBudgetBurn", "of output tokens came more than {t} s after the previous"),
    ):
        objective = t["slo"][name]["objective"]
        threshold = t["slo"][name]["threshold_seconds"]
        allowed = round((1 - objective) * 100, 3)
        for severity, long, short, factor, for_ in BURN_RATES:
            budget = round(factor * (1 - objective), 6)
            slo.alert(
                alert,
                f"""
instance_model:sglang_{name}_slo_errors:ratio_rate{long} > {budget}
and instance_model:sglang_{name}_slo_errors:ratio_rate{short} > {budget}
and on (instance, model_name) instance_model:sglang_requests:rate1h > {floor}""",
                f"{factor}x burn over {long} and {short}: "
                f"{'pages' if severity == 'critical' else 'a ticket'}; traffic floor {floor} "
                f"req/s.",
                severity=severity, for_=for_, labels={"slo": name, "long": long, "short": short},
                summary=f"SGLang {name.upper()} error budget is burning too fast.",
                description="{{ $labels.instance }} ({{ $labels.model_name }}): "
                            "{{ $value | humanizePercentage }} "
                            + what.format(t=threshold)
                            + f" over {long}; the SLO allows {allowed:g}%.",
                dashboard="sglang-latency")
    slo.alert(
        "SGLangRequestErrors",
        f"""
(instance_model:sglang_aborted_requests:ratio_rate5m > {a['request_error_ratio']}
  and on (instance, model_name) instance_model:sglang_num_requests:rate5m > {a['request_error_floor_rps']})
or on (instance) (instance:sglang_http_5xx:ratio_rate5m > {a['request_error_ratio']}
  and on (instance) sum by (instance) (rate(sglang:http_requests_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])) > {a['request_error_floor_rps']})""",  # noqa: E501
        "Aborted or 5xx requests above the threshold, with a traffic floor.",
        severity="warning", for_="5m", summary="SGLang requests are failing.",
        description="{{ $labels.instance }}: {{ $value | humanizePercentage }} of requests "
                    "were aborted or answered 5xx over 5 minutes.")
    slo.alert(
        "SGLangCacheHitRateDrop",
        f"""
instance_model:sglang_cache_hit:ratio_rate15m
  < {a['cache_hit_drop_ratio']} * instance_model:sglang_cache_hit:ratio_rate6h
and on (instance, model_name) instance_model:sglang_cache_hit:ratio_rate6h > {a['cache_hit_baseline_min']}
and on (instance, model_name) instance_model:sglang_prompt_tokens:rate5m > {a['cache_hit_floor_prompt_tokens_per_second']}
unless on (instance) (max by (instance) (resets(sglang:num_requests_total{{{s}}}[1h])) > 0)""",  # noqa: E501
        "Against the server's own 6 h baseline, with a traffic floor; a restart empties the "
        "cache, so servers restarted in the last hour are excluded.",
        severity="warning", for_="15m", summary="SGLang prefix-cache hit ratio dropped.",
        description="{{ $labels.instance }} ({{ $labels.model_name }}): the prefix-cache hit "
                    "ratio fell to {{ $value | humanizePercentage }}, under half its 6-hour "
                    "baseline: more prefill work per request.")

    gpu = Group("gpu.alerts")
    gpu.alert(
        "GPULost",
        f"""
sglang_obs_gpu_device_up{{{e}}} == 0
or on (instance) (max by (instance) (sglang_obs_gpu_collector_up{{{e}}}) == 0
    and on (instance) max by (instance) (max_over_time(sglang_obs_gpu_device_up{{{e}}}[1h])) == 1)""",  # noqa: E501
        "NVML lost the GPU (GpuIsLost, fallen off the bus): the workload on it is dead. Also a "
        "host whose NVML stopped working after it had GPUs in the last hour.",
        severity="critical", for_="1m", summary="A GPU is lost.",
        description="GPU {{ with $labels.gpu }}{{ . }}{{ else }}(all){{ end }} on "
                    "{{ $labels.instance }} no longer answers NVML.", dashboard="sglang-gpus")
    gpu.alert(
        "GPUXidCritical",
        f"time() - sglang_obs_gpu_xid_last_timestamp_seconds{{{e}, xid=~\"{a['gpu_xid_critical']}\"}}"  # noqa: E501
        f" < {a['gpu_xid_window_seconds']}",
        "Xid codes that mean hardware or driver failure; on the timestamp, since increase() "
        "misses the first event of a new series.",
        severity="critical", for_="0m", summary="A GPU reported a critical Xid error.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} reported Xid "
                    "{{ $labels.xid }} {{ $value | humanizeDuration }} ago.",
        dashboard="sglang-gpus")
    gpu.alert(
        "GPUUncorrectableECC",
        f"increase(sglang_obs_gpu_ecc_errors_volatile_total{{{e}, type=\"uncorrected\"}}[10m]) > 0",
        "Uncorrectable ECC errors corrupt data; the GPU needs a reset and maybe an RMA.",
        severity="critical", for_="0m", summary="A GPU has uncorrectable ECC errors.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} counted "
                    "{{ $value | humanize }} uncorrectable ECC errors in 10 minutes.",
        dashboard="sglang-gpus")
    gpu.alert(
        "GPURowRemapFailure",
        f"sglang_obs_gpu_remapped_rows_failure{{{e}}} == 1",
        "NVIDIA's RMA criterion: the row remapper ran out of spare rows.",
        severity="critical", for_="0m", summary="A GPU failed to remap a memory row.",
        description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} "
                    "reports a row-remapping failure.", dashboard="sglang-gpus")
    gpu.alert(
        "GPUThermalThrottling",
        f"max by (instance, gpu, uuid) (sglang_obs_gpu_clock_event_active{{{e}, "
        f"reason=~\"{a['gpu_throttle_reasons']}\"}}) == 1",
        "Clocks held down by heat or a power brake: everything on this GPU runs slower.",
        severity="warning", for_="5m", summary="A GPU is throttling.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} has been slowed by a "
                    "thermal or power event for 5 minutes.", dashboard="sglang-gpus")
    gpu.alert(
        "GPUPCIeLinkDegraded",
        f"""
(sglang_obs_gpu_pcie_link_width{{{e}}} < sglang_obs_gpu_pcie_link_width_max{{{e}}}
 or sglang_obs_gpu_pcie_link_generation{{{e}}} < sglang_obs_gpu_pcie_link_generation_max{{{e}}})
and on (instance, gpu) sglang_obs_gpu_utilization_ratio{{{e}}} > {a['gpu_pcie_min_utilization']}""",
        "A link below its maximum under load (links may downshift at idle to save power).",
        severity="warning", for_="10m", summary="A GPU's PCIe link is degraded.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} runs its PCIe link below "
                    "its maximum width or generation under load.", dashboard="sglang-gpus")

    meta = Group("meta.alerts")
    meta.alert("Watchdog", "vector(1)",
               "Always firing: if it stops arriving at the dead-man receiver, the alerting "
               "pipeline is broken.", severity="none", for_="0m",
               summary="Alerting pipeline heartbeat.",
               description="Always firing; its absence downstream means Prometheus or "
                           "Alertmanager is not delivering alerts.")
    return [avail, sat, slo, gpu, meta]


# -- rendering ---------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, so the files read like hand-written ones."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_groups(groups: list[Group], header: str) -> str:
    out = [f"# GENERATED by `make generate` from prometheus/thresholds.yml "
           f"(sglang_obs/rules.py). {header}", "groups:"]
    for group in groups:
        out.append(f"- name: {group.name}")
        if group.interval:
            out.append(f"  interval: {group.interval}")
        out.append("  rules:")
        for rule in group.rules:
            out.append(f"  # {rule.comment}")
            text = yaml.dump([rule.body], Dumper=_Dumper, sort_keys=False, width=1000,
                             allow_unicode=True)
            out += ["  " + line for line in text.rstrip("\n").splitlines()]
    return "\n".join(out) + "\n"


def all_files(t: dict | None = None) -> dict[Path, str]:
    t = t or load_thresholds()
    CONFIG.clear()
    CONFIG.update(t)
    alerts = alert_groups(t)
    sglang_alerts = [g for g in alerts if not g.name.startswith(("gpu", "meta"))]
    return {
        RULES_DIR / "sglang.rules.yml": render_groups(
            recording_groups(t), "Recording rules: read these, not raw SGLang series."),
        RULES_DIR / "sglang.alerts.yml": render_groups(sglang_alerts, "SGLang alerts."),
        RULES_DIR / "gpu.alerts.yml": render_groups(
            [g for g in alerts if g.name.startswith(("gpu", "meta"))], "GPU and meta alerts."),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    files = all_files()
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for p in stale:
            print(f"stale: {p} (run make generate)", file=sys.stderr)
        return 1 if stale else 0
    RULES_DIR.mkdir(parents=True, exist_ok=True)
    for p, text in files.items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
