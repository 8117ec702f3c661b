"""Generates prometheus/rules/*.yml from prometheus/thresholds.yml (`make generate`).

Recording rules first (throughput, cache hit, quantiles, SLO error ratios, the per-server state
signals and the one state classification), then the alerts, which read the recorded series so
that dashboards and alerts share one definition. Every rule carries a comment saying why.

The alerts are a table (`Alert` rows built from the thresholds) that one function renders; each
row also says in words when it fires, which runbooks.py quotes in docs/runbooks.md, so the
runbook and the rules cannot disagree on a number.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sglang_obs.core import quantities, settings
from sglang_obs.core.sglang import SERVING_ENDPOINTS
from sglang_obs.core.states import PD_PRIORITY, PD_STATES, STATES
from sglang_obs.core.times import duration_words
from sglang_obs.exporter.request_records import PROMPT_CLASS_BOUNDS
from sglang_obs.render import energy_rules, feature_rules, pd_rules, scaling_rules

# The same rules for vmalert (the fleet's central ruler, docs/fleet.md): vmalert up to 1.91
# (Debian 12 ships 1.79) rejects keep_firing_for, which vmalert 1.92 added (VictoriaMetrics
# pull request 4669, July 2023).
VMALERT_DROPPED_FIELDS = ("keep_firing_for",)
# vmalert reads recorded series back from the store, so the variant is one group, every rule in
# the order Prometheus evaluates them (docs/fleet.md, "Onset to page"). vmalert starts each group
# at a phase hashed from its file path and name, and a rule's results become visible only after
# the remote-write flush; a rule in another group could therefore find nothing within its lookback
# (-datasource.queryStep) and an alert miss its incident, depending on where the files lie. In
# one group each rule reads the previous evaluation's results, exactly one interval old.
# nocache=1: VictoriaMetrics then answers at the evaluation's own time instead of moving a query
# made within -search.latencyOffset of now back by that offset (vmalert asks for the evaluation's
# time, not the interval's start: fleet.vmalert_args).
VMALERT_FILE = "sglang-obs.yml"
VMALERT_GROUP = "sglang-obs"
VMALERT_PARAMS = {"nocache": ["1"]}
# The files in prometheus/rules/ with their header lines, recording rules first: Prometheus and
# promtool evaluate the groups in this order.
RULE_FILES = (
    ("sglang.rules.yml", "Recording rules: read these, not raw SGLang series."),
    ("sglang.alerts.yml", "SGLang alerts."),
    ("gpu.alerts.yml", "GPU and meta alerts."),
    ("fleet.alerts.yml", "Fleet alerts: hosts shipping into one store (docs/fleet.md)."),
)

SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# (severity, long window, short window, burn factor, for) — SRE workbook, alerting.md §2.
BURN_RATES = (("critical", "1h", "5m", 14.4, "2m"), ("critical", "6h", "30m", 6, "15m"),
              ("warning", "1d", "2h", 3, "1h"), ("warning", "3d", "6h", 1, "3h"))
# The saturation states: a server in one of them is slow for a reason the state names. Their
# alerts are the one notification of an incident; the symptoms they explain stay silent.
SATURATION_STATES = ("prefill_backlog", "decode_contention", "kv_capacity",
                     "scheduling_bottleneck")


@dataclass(frozen=True)
class Slo:
    key: str  # under slo: in thresholds.yml
    histogram: str
    alert: str
    promise: str  # what the SLO promises, with {t} the threshold in seconds (runbook)
    error: str  # what an error is, with {t} (alert description)


SLOS = (
    Slo("ttft", "time_to_first_token_seconds", "SGLangTTFTBudgetBurn",
        "of requests get their first token within {t} s",
        "of requests waited more than {t} s for the first token"),
    Slo("itl", "inter_token_latency_seconds", "SGLangITLBudgetBurn",
        "of output tokens arrive within {t} s of the previous one",
        "of output tokens came more than {t} s after the previous"),
)


def inputs(s: settings.Settings | None = None) -> dict[str, Any]:
    """What the rules are made of: thresholds.yml's sections, and prometheus.yml's
    evaluation_interval (a for: of one evaluation; longer sustains of the state alerts are
    windows over the recorded state). A fresh copy: callers may change it."""
    s = s or settings.default()
    return {**copy.deepcopy(dict(s.thresholds)), "evaluation_interval": s.evaluation_interval}


@dataclass(frozen=True)
class Record:
    name: str
    expr: str
    comment: str


@dataclass(frozen=True)
class Alert:
    """One alerting rule, and in `fires_when` the same condition in words for its runbook."""

    name: str
    expr: str
    comment: str
    severity: str
    for_: str
    summary: str
    description: str
    fires_when: str  # Markdown: expr in words, with the same thresholds
    labels: tuple[tuple[str, str], ...] = ()  # besides severity, in this order
    dashboard: str = "sglang-overview"
    keep_firing_for: str | None = None


@dataclass(frozen=True)
class Group:
    name: str
    file: str  # one of RULE_FILES
    rules: tuple[Record | Alert, ...]


@dataclass(frozen=True)
class StateClass:
    """A state of the classification: its PromQL condition and the same in words (runbook)."""

    state: str
    condition: str
    meaning: str


def _clean(expr: str) -> str:
    return "\n".join(line.rstrip() for line in expr.strip().splitlines())


def _s(t) -> str:
    return f'job="{t["selectors"]["sglang_job"]}"'


def _e(t) -> str:
    return f'job="{t["selectors"]["exporter_job"]}"'


# -- recording rules ---------------------------------------------------------------------------
def recording_groups(t: dict) -> list[Group]:
    s = _s(t)
    by = "sum by (cluster, host, instance, model_name)"
    serving: list[Record] = []
    for metric, label in (("num_requests", "Requests finished"),
                          ("prompt_tokens", "Prompt tokens"),
                          ("generation_tokens", "Generated tokens")):
        serving.append(Record(
            f"instance_model:sglang_{metric}:rate5m",
            f"{by} (rate(sglang:{metric}_total{{{s}}}[5m]))",
            f"{label} per second, per server and model; sums away is_streaming."))
    for window in ("5m", "15m", "6h"):
        serving.append(Record(
            f"instance_model:sglang_cache_hit:ratio_rate{window}",
            f"""
{by} (rate(sglang:cached_tokens_total{{{s}}}[{window}]))
  / ({by} (rate(sglang:prompt_tokens_total{{{s}}}[{window}])) > 0)""",
            "Prefix-cache hit ratio from counters: the cache_hit_rate gauge is per batch and "
            "was zeroed by decode reports up to 0.5.19."))
    serving.append(Record(
        "instance_model_source:sglang_cache_hit:ratio_rate5m",
        f"""
sum by (cluster, host, instance, model_name, cache_source) (
  rate(sglang:cached_tokens_total{{{s}}}[5m]))
  / ignoring (cache_source) group_left ()
({by} (rate(sglang:prompt_tokens_total{{{s}}}[5m])) > 0)""",
        "Prefix-cache hit ratio per tier the hits came from (cache_source: device, host, "
        "storage; 0.5.9+), from the tokenizer's counters: both count a request when it finishes."))
    serving.append(Record(
        "instance_model_mode:sglang_prefill_effective_hit:ratio_rate5m",
        f"""
sum by (cluster, host, instance, model_name, mode) (
  rate(sglang:prefill_effective_tokens_total{{{s},mode=~".+_hit"}}[5m]))
  / ignoring (mode) group_left ()
({by} (rate(sglang:prefill_effective_tokens_total{{{s}}}[5m])) > 0)""",
        "Prefix-cache hit ratio per tier (mode: device_hit, host_hit, storage_hit; HiCache "
        "fills the last two) over all prefill tokens, from counters (0.5.18+)."))
    window = quantities.QUANTILE_WINDOW
    for hist in quantities.LATENCIES.values():
        short = hist.removesuffix("_seconds")
        for qname, q in quantities.QUANTILES:
            x = quantities.q(f"{short}_{qname}_{window}")
            serving.append(Record(
                x.record,
                f"histogram_quantile({q}, sum by (cluster, host, instance, model_name, le) "
                f"(rate(sglang:{hist}_bucket{{{s}}}[{window}])))",
                f"{x.label} (capped at the top finite bucket)."))
        x = quantities.q(f"{short}_mean_{window}")
        serving.append(Record(
            x.record,
            f"""
{by} (rate(sglang:{hist}_sum{{{s}}}[{window}]))
  / ({by} (rate(sglang:{hist}_count{{{s}}}[{window}])) > 0)""",
            f"{x.label}: the quantiles' window, so a panel's lines share one."))
    serving.append(Record(
        "instance_model:sglang_aborted_requests:ratio_rate5m",
        f"""
{by} (rate(sglang:num_aborted_requests_total{{{s}}}[5m]))
  / ({by} (rate(sglang:num_requests_total{{{s}}}[5m])) > 0)""",
        "Share of requests aborted (client gone, or the server gave up)."))
    serving.append(Record(
        "instance:sglang_http_5xx:ratio_rate5m",
        f"""
(sum by (cluster, host, instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}", status_code=~"5.."}}[5m]))
   or 0 * sum by (cluster, host, instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])))
  / (sum by (cluster, host, instance) (rate(sglang:http_responses_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])) > 0)""",  # noqa: E501
        "Share of serving-endpoint responses that are 5xx (0.5.7+), 0 when there are none; "
        "/metrics and /health are counted by SGLang too, hence the endpoint filter."))

    slo: list[Record] = []
    for o in SLOS:
        le = t["slo"][o.key]["threshold_seconds"]
        for window in SLO_WINDOWS:
            slo.append(Record(
                f"instance_model:sglang_{o.key}_slo_errors:ratio_rate{window}",
                f"""
({by} (rate(sglang:{o.histogram}_count{{{s}}}[{window}]))
  - {by} (rate(sglang:{o.histogram}_bucket{{{s}, le="{le}"}}[{window}])))
  / ({by} (rate(sglang:{o.histogram}_count{{{s}}}[{window}])) > 0)""",
                f"{o.key.upper()} SLO error ratio over {window}: share above {le} s "
                f"(an exact bucket bound)."))
    count = f"sglang:time_to_first_token_seconds_count{{{s}}}"
    slo.append(Record(
        "instance_model:sglang_requests:rate1h",
        f"""
{by} (increase({count}[1h]))
  / on (cluster, instance, model_name) clamp(
      time() - min by (cluster, host, instance, model_name) (min_over_time(timestamp({count})[1h:1m])),
      300, 3600)""",  # noqa: E501
        "Traffic floor of the SLO alerts: requests per second over the last hour, or over the "
        "history there is (at least 5 minutes) when Prometheus has less: rate() over 1h would "
        "divide a new server's 8 minutes of requests by 60 minutes."))
    return [Group("sglang-serving.rules", "sglang.rules.yml", tuple(serving)),
            Group("sglang-slo.rules", "sglang.rules.yml", tuple(slo)),
            state_group(t), request_group(t), pd_group(t), scaling_group(t), feature_group(t),
            energy_group(t)]


def feature_group(t: dict) -> Group:
    """Per-feature signals (feature_rules.py): speculative decoding, ..."""
    return Group("sglang-features.rules", "sglang.rules.yml", tuple(
        Record(name, expr, why) for name, expr, why in feature_rules.records(t)))


def energy_group(t: dict) -> Group:
    """Energy and cost per token per host (energy_rules.py): raw series and its own records."""
    return Group("sglang-energy.rules", "sglang.rules.yml", tuple(
        Record(name, expr, why) for name, expr, why in energy_rules.records(t)))


def feature_alerts(t: dict) -> tuple[Alert, ...]:
    return tuple(Alert(**spec) for spec in feature_rules.alerts(t))


def pd_group(t: dict) -> Group:
    """The PD deployment's signals and states (pd_rules.py), after the per-server states they
    read."""
    return Group("sglang-pd.rules", "sglang.rules.yml", tuple(
        Record(name, expr, why)
        for name, expr, why in pd_rules.signal_records(t) + pd_rules.state_records(t)))


def scaling_group(t: dict) -> Group:
    """The replica recommendation per pool (scaling_rules.py), after the per-server states and
    the PD roles it reads."""
    return Group("sglang-scaling.rules", "sglang.rules.yml", tuple(
        Record(name, expr, why) for name, expr, why in scaling_rules.records(t)))


def pd_alerts(t: dict) -> tuple[Alert, ...]:
    """One alert per slow state of a PD deployment, keyed by cluster: the deployment's one
    notification (Alertmanager groups by cluster and instance; these have no instance)."""
    cond = pd_rules.conditions(t)
    out = []
    for state, name in pd_rules.ALERTS.items():
        summary, first, why = pd_rules.ALERT_TEXT[state]
        code = PD_STATES.index(state)
        before = PD_PRIORITY[1:PD_PRIORITY.index(state)]
        out.append(Alert(
            name, f"{pd_rules.VALUE[state]}\nand on (cluster) ({pd_rules.CLUSTER_CODE} == {code})",
            why, severity="warning", for_=t["sustain"][state],
            keep_firing_for=t["sustain"]["keep_firing_for"],
            summary=summary,
            description="The PD deployment{{ with $labels.cluster }} of cluster {{ . }}{{ end }} "
                        f"is in state {state}: {first}" + pd_rules.quotes(state) + ".",
            fires_when=f"the PD deployment's verdict is `{state}`: {cond[state][1]}"
                       + (f"; and none of {', '.join(f'`{k}`' for k in before)} (they come "
                          "first)" if before else ""),
            dashboard="sglang-pd"))
    return tuple(out)


def state_classes(t: dict) -> tuple[StateClass, ...]:
    """The states in priority order: a server is in the first one whose condition holds."""
    c = t["classification"]
    kv = (f"(instance:sglang_kv_occupancy:ratio >= {c['kv_occupancy_ratio']})"
          f" or on (cluster, instance) ({retractions_record(t)} > 0)")
    # Waiting prompts behind a running batch at its limit are not a prefill backlog: they wait
    # for a slot (decode contention or a scheduling limit), not for prefill compute.
    prefill = (f"(instance:sglang_prefill_backlog_tokens:max >= {c['prefill_backlog_tokens']})"
               " and on (cluster, instance) (instance:sglang_waiting_requests:max > 0)"
               " unless on (cluster, instance) (instance:sglang_running_requests_per_max:ratio >= "
               f"{c['running_ratio_at_limit']})")
    # At the limit a batch is slower per request anyway: only a collapse counts there; below
    # it, a batch of long requests twice its usual size with a clear drop does.
    decode = f"""(((instance:sglang_decode_speed_per_request:max
    < {c['decode_speed_collapse_ratio']} * instance:sglang_decode_speed_per_request:p90_1h)
   and on (cluster, instance)
       (instance:sglang_running_requests_per_max:ratio >= {c['running_ratio_at_limit']}))
  or ((instance:sglang_decode_speed_per_request:max
       < {c['decode_speed_drop_ratio']} * instance:sglang_decode_speed_per_request:p90_1h)
      and on (cluster, instance) (instance:sglang_running_requests:max >= {c['min_running_for_contention']})
      and on (cluster, instance) (instance:sglang_running_requests:max
                         >= {c['running_growth_factor']} * instance:sglang_running_requests:avg_1h)
      and on (cluster, instance) (instance:sglang_kv_used_tokens:max
                         >= {c['min_kv_tokens_per_running_request']} * instance:sglang_running_requests:max))
 ) and on (cluster, instance) (instance:sglang_kv_occupancy:ratio >= {c['min_kv_for_contention']})"""  # noqa: E501
    scheduling = (f"(instance:sglang_queue_nonempty_duration_seconds:max >= "
                  f"{c['scheduling_queue_seconds']})"
                  f" and on (cluster, instance) (instance:sglang_kv_occupancy:ratio < "
                  f"{c['scheduling_kv_ratio_below']})")
    idle = ("(instance:sglang_running_requests:max == 0)"
            " and on (cluster, instance) (instance:sglang_waiting_requests:max == 0)")
    limit = f"{c['running_ratio_at_limit']} of the effective `max_running_requests`"
    return (
        StateClass("unavailable", "instance:sglang_available:min == 0",
                   "`instance:sglang_available:min == 0`: the exporter's poll or Prometheus's "
                   "scrape fails"),
        StateClass("kv_capacity", kv,
                   f"KV occupancy (`instance:sglang_kv_occupancy:ratio`) ≥ "
                   f"{c['kv_occupancy_ratio']}, or any retraction in the last "
                   f"{c['kv_retraction_window']}"),
        StateClass("prefill_backlog", prefill,
                   f"≥ {c['prefill_backlog_tokens']} prompt tokens wait to be prefilled "
                   "(`instance:sglang_prefill_backlog_tokens:max`), the queue is non-empty, and "
                   f"the running batch is below {limit}"),
        StateClass("decode_contention", decode,
                   f"KV occupancy ≥ {c['min_kv_for_contention']}, and either decode speed per "
                   "request (`instance:sglang_decode_speed_per_request:max`) < "
                   f"{c['decode_speed_collapse_ratio']} × its 1 h p90 with running ≥ {limit}, "
                   f"or < {c['decode_speed_drop_ratio']} × its 1 h p90 with running ≥ "
                   f"{c['min_running_for_contention']} and ≥ {c['running_growth_factor']} × its "
                   f"1 h average, holding ≥ {c['min_kv_tokens_per_running_request']} KV tokens per "
                   "running request (`instance:sglang_kv_used_tokens:max`): long requests"),
        StateClass("scheduling_bottleneck", scheduling,
                   f"the queue has been non-empty ≥ {c['scheduling_queue_seconds']} s "
                   "(`instance:sglang_queue_nonempty_duration_seconds:max`) while KV occupancy "
                   f"< {c['scheduling_kv_ratio_below']}"),
        StateClass("idle", idle, "nothing running, nothing waiting"),
        StateClass("healthy", "instance:sglang_available:min == 1",
                   "reachable and none of the above"),
    )


def retractions_record(t: dict) -> str:
    return f"instance:sglang_retractions:increase{t['classification']['kv_retraction_window']}"


def pd_explained(t: dict) -> str:
    """`unless` clause of an alert that a PD deployment's slow state explains on its servers
    (a failed KV transfer aborts the request on both sides)."""
    w = t["symptom_explained_window"]
    return ("unless on (cluster, instance) "
            f"max_over_time(instance:sglang_pd_explained:bool[{w}]) == 1")


def explained(t: dict, window: str | None = None, first_token: bool = False) -> str:
    """`unless` clause of a symptom alert: silent while a saturation state of its server holds
    or held within the window (its state alert is the notification). A `first_token` symptom
    is also explained by a feature that delays first tokens (feature_rules.FIRST_TOKEN)."""
    w = window or t["symptom_explained_window"]
    feature = (f"\n  or max_over_time({feature_rules.FIRST_TOKEN}[{w}]) == 1" if first_token
               else "")
    return ("unless on (cluster, instance) "
            f"(max_over_time(instance:sglang_saturated:bool[{w}]) == 1\n"
            f"  or max_over_time(instance:sglang_pd_explained:bool[{w}]) == 1{feature})")


def state_group(t: dict) -> Group:
    s, e = _s(t), _e(t)
    g: list[Record] = [Record(
        "instance:sglang_available:min",
        f"max by (cluster, host, instance) (sglang_obs_up{{{e}}})\n"
        f"or on (cluster, instance) max by (cluster, host, instance) (up{{{s}}})",
        "1 when the server answers: the exporter's poll (any endpoint) when it watches the "
        "server, else Prometheus's scrape. A server with metrics off still serves.")]
    for name, metric in (("running_requests", "running_requests"),
                         ("waiting_requests", "waiting_requests"),
                         ("prefill_backlog_tokens", "prefill_backlog_tokens"),
                         ("queue_nonempty_duration_seconds", "queue_nonempty_duration_seconds"),
                         ("decode_speed_per_request",
                          "decode_speed_per_request_tokens_per_second")):
        g.append(Record(
            f"instance:sglang_{name}:max",
            f"max by (cluster, host, instance) (sglang_obs_{metric}{{{e}}})",
            f"Exporter's live {name.replace('_', ' ')} (polled every second), per server."))
    g.append(Record("instance:sglang_running_requests_per_max:ratio",
                    f"max by (cluster, host, instance) (sglang_obs_running_requests_ratio{{{e}}})",
                    "Running requests over the effective max_running_requests."))
    g.append(Record("instance:sglang_kv_used_tokens:max",
                    f"max by (cluster, host, instance) (sglang_obs_kv_used_tokens{{{e}}})",
                    "KV tokens held by the running requests: per request, how long they are."))
    g.append(Record("instance:sglang_kv_occupancy:ratio",
                    f"max by (cluster, host, instance) (sglang_obs_kv_occupancy_ratio{{{e}}})",
                    "KV pool used over capacity at full resolution."))
    x = f"sglang:num_retracted_requests_total{{{s}}}"
    w = t["classification"]["kv_retraction_window"]
    g.append(Record(retractions_record(t), f"""
sum by (cluster, host, instance) (
    (increase({x}[{w}]) or 0 * {x})
  + ((min_over_time({x}[{w}]) unless {x} offset {w}) or 0 * {x}))""",
                    f"Requests retracted (KV pool full in decode) in the last {w} (0.5.7+). "
                    f"SGLang creates the counter at the first retraction, already counting it, so "
                    f"a series younger than {w} counts from zero."))
    g.append(Record("instance:sglang_decode_speed_per_request:p90_1h",
                    "quantile_over_time(0.9, instance:sglang_decode_speed_per_request:max[1h])",
                    "The server's usual good decode speed per request: the baseline of "
                    "contention."))
    g.append(Record("instance:sglang_running_requests:avg_1h",
                    "avg_over_time(instance:sglang_running_requests:max[1h])",
                    "The server's usual running-batch size."))
    classes = state_classes(t)
    # Each state's code where its condition holds; `or` keeps the first, so priority is order.
    branches = [(f"{STATES.index(k.state)} + " if STATES.index(k.state) else "")
                + f"0 * ({k.condition})" for k in classes]
    g.append(Record("instance:sglang_state:code", "\nor on (cluster, instance) ".join(branches),
                    "One state per server, by priority: "
                    + ", ".join(k.state for k in classes) + " (seed 000's reading guide). "
                    "Codes: " + ", ".join(f"{i} {n}" for i, n in enumerate(STATES)) + "."))
    g.append(Record("instance:sglang_state:class",
                    "\nor ".join(f'label_replace(0 * (instance:sglang_state:code == {i}) + 1, '
                                 f'"state", "{name}", "", "")' for i, name in enumerate(STATES)),
                    "The same state as a label (value 1), for tables, alerts and snapshots."))
    codes = " or ".join(f"instance:sglang_state:code == {STATES.index(k)}"
                        for k in SATURATION_STATES)
    g.append(Record("instance:sglang_saturated:bool",
                    f"0 * instance:sglang_state:code + 1 and on (cluster, instance) ({codes})\n"
                    "or 0 * instance:sglang_state:code",
                    "1 while the server is in a saturation state ("
                    + ", ".join(SATURATION_STATES) + "), else 0: the symptom alerts read it."))
    return Group("sglang-state.rules", "sglang.rules.yml", tuple(g))


def request_group(t: dict) -> Group:
    """Latency by prompt-length class from the exporter's request records (opt-in:
    --sglang.request-metrics-dir). Recorded only where the class had requests in the window, so
    an empty class has no series rather than NaN."""
    bounds = tuple(t["request_classes"]["prompt_tokens_bounds"])
    if bounds != PROMPT_CLASS_BOUNDS:
        raise ValueError(f"thresholds.yml request_classes {bounds} differ from the exporter's "
                         f"PROMPT_CLASS_BOUNDS {PROMPT_CLASS_BOUNDS}: change both")
    e = _e(t)
    by = "sum by (cluster, host, instance, model_name, prompt_class"
    rules = []
    why = {"ttft_seconds": "TTFT p95 over 5 minutes per prompt-length class (request "
                           "records): which prompt lengths the wait falls on.",
           "queue_time_seconds": "Queue time p95 over 5 minutes per prompt-length class: "
                                 "alike across classes when all queue behind a backlog; TTFT "
                                 "minus it is the class's own prefill."}
    for metric in ("ttft_seconds", "queue_time_seconds"):
        name = f"sglang_obs_request_{metric}"
        rules.append(Record(
            f"instance_model_prompt_class:{name}:p95_5m",
            f"""
histogram_quantile(0.95, {by}, le) (rate({name}_bucket{{{e}}}[5m])))
  and on (cluster, instance, model_name, prompt_class) ({by}) (rate({name}_count{{{e}}}[5m])) > 0)""",  # noqa: E501
            why[metric]))
    return Group("sglang-requests.rules", "sglang.rules.yml", tuple(rules))


# -- alerts ------------------------------------------------------------------------------------
def availability_alerts(t: dict) -> tuple[Alert, ...]:
    s, e, a = _s(t), _e(t), t["alerts"]
    restarts = a["container_restarts_in_15m"]
    stall = a["poller_stall_window"]
    return (
        Alert(
            "SGLangServerDown",
            f"""
max by (cluster, host, instance) (sglang_obs_up{{{e}}}) == 0
or (max by (cluster, host, instance) (up{{{s}}}) == 0 unless on (cluster, instance) max by (cluster, host, instance) (sglang_obs_up{{{e}}}))""",  # noqa: E501
            "The server answers neither the exporter nor Prometheus. A failed scrape alone, while "
            "the exporter still reaches the API, is SGLangMetricsMissing, not this. `host` (the "
            "exporter's) lets a lost GPU of the same host inhibit it. Prometheus's scrape decides "
            "only for a server no exporter watches: one alert per server, with its host.",
            severity="critical", for_="30s", summary="SGLang server is not answering.",
            description="{{ $labels.instance }} has not answered for {for} (state "
                        "unavailable): requests to it fail.",
            fires_when="the exporter's poll gets no answer from any endpoint "
                       f"(`sglang_obs_up == 0`), or Prometheus cannot scrape the server "
                       f"(`up{{{s}}} == 0`) while no exporter reaches it either"),
        Alert(
            "SGLangMetricsMissing",
            f"""
(max by (cluster, host, instance) (up{{{s}}}) == 0 and on (cluster, instance) max by (cluster, host, instance) (sglang_obs_up{{{e}}}) == 1)
or (max by (cluster, host, instance) (up{{{s}}}) == 1
    unless on (cluster, instance) count by (cluster, host, instance) ({{__name__=~"sglang:num_running_reqs|sglang:num_queue_reqs", {s}}}))""",  # noqa: E501
            "The API answers but /metrics fails (--enable-metrics off: 404) or has no scheduler "
            "series (sglang_* names not renamed back, see prometheus.yml).",
            severity="warning", for_="10m",
            summary="SGLang is up but exposes no scheduler metrics.",
            description="{{ $labels.instance }} serves requests but Prometheus gets no "
                        "sglang:num_running_reqs from it: metrics disabled or a spelling mismatch.",
            fires_when=f"the scrape fails while the exporter still reaches the API "
                       f"(`up{{{s}}} == 0` and `sglang_obs_up == 1`), or the scrape succeeds "
                       "but has no `sglang:num_running_reqs` or `sglang:num_queue_reqs` series "
                       "for the instance"),
        Alert(
            "SGLangContainerRestarting",
            f"increase(sglang_obs_container_restarts_total{{{e}}}[15m]) >= {restarts}",
            "A restart loop: the container keeps dying and coming back.",
            severity="critical", for_="0m", summary="SGLang container is restarting repeatedly.",
            description="Container {{ $labels.container }} ({{ $labels.instance }}) restarted "
                        "{{ $value | humanize }} times in 15 minutes (state unavailable between "
                        "restarts).",
            fires_when=f"the container restarted at least {restarts} times in 15 minutes "
                       f"(`increase(sglang_obs_container_restarts_total[15m]) >= {restarts}`)"),
        Alert(
            "SGLangOOMKilled",
            f"increase(sglang_obs_container_oom_kills_total{{{e}}}[15m]) > 0",
            "The kernel killed the container for host memory (not GPU memory).",
            severity="critical", for_="0m", summary="SGLang container was OOM-killed.",
            description="Container {{ $labels.container }} ({{ $labels.instance }}) was killed "
                        "for running out of host memory {{ $value | humanize }} times in 15 "
                        "minutes.",
            fires_when="the kernel killed a process of the container in the last 15 minutes "
                       "(`increase(sglang_obs_container_oom_kills_total[15m]) > 0`)"),
        Alert(
            "SGLangExporterDown",
            f"up{{{e}}} == 0 or absent(up{{{e}}})",
            "Without the exporter the derived signals and GPU and container metrics are gone.",
            severity="critical", for_="2m", summary="The sglang-obs exporter is down.",
            description="Prometheus cannot scrape the exporter{{ with $labels.instance }} {{ . }}"
                        "{{ end }}: derived SGLang, GPU and container metrics are missing.",
            fires_when=f"Prometheus cannot scrape the exporter (`up{{{e}}} == 0`), or has no "
                       f"such target at all (`absent(up{{{e}}})`)"),
        Alert(
            "SGLangExporterCollectorFailing",
            f"sglang_obs_collector_success{{{e}}} == 0",
            "A collector raised while rendering: its series are missing from every scrape.",
            severity="warning", for_="5m", summary="An exporter collector is failing.",
            description="Collector {{ $labels.collector }} on {{ $labels.instance }} has failed "
                        "for {for}; its series are missing.",
            fires_when="a collector raised while rendering "
                       "(`sglang_obs_collector_success{collector=\"…\"} == 0`)"),
        Alert(
            "SGLangExporterPollerStalled",
            f"increase(sglang_obs_polls_total{{{e}}}[{stall}]) == 0",
            "The exporter still answers scrapes but its poller of this server completed no cycle: "
            "every sglang_obs_* series of the server (sglang_obs_up, the state inputs) is frozen "
            "at its last value. increase() needs two scrapes in the window, so a new series or an "
            "unscraped exporter (SGLangExporterDown) does not fire it; a restart counts as "
            "progress.",
            severity="warning", for_="1m", summary="The exporter's poller of a server stalled.",
            description=f"The exporter has completed no poll of {{{{ $labels.instance }}}} in "
                        f"{stall}: its sglang_obs_* series, the state classification and the "
                        "saturation alerts of this server are frozen at their last values.",
            dashboard="sglang-exporter",
            fires_when=f"the exporter completed no poll cycle of the server in the last {stall} "
                       f"(`increase(sglang_obs_polls_total[{stall}]) == 0`) while Prometheus "
                       "still scrapes the exporter"),
    )


def _quote(query: str, text: str, fmt: str = "humanize") -> str:
    """A description fragment with the value of `query` for this alert's instance (the `%q`s are
    the cluster, empty outside a fleet, and the instance); nothing when the query returns
    nothing, so a missing series never prints junk."""
    return (f'{{{{ with printf `{query}` $labels.cluster $labels.instance | query }}}}'
            f'{text.format(v=f"{{{{ . | first | value | {fmt} }}}}")}{{{{ end }}}}')


def _quote_quantity(key: str, fmt: str, unit: str = "", condition: str = "") -> str:
    """"; <label>: <value>" of a quantity (core/quantities.py) for this alert's instance, as
    every surface names it."""
    x = quantities.q(key)
    return _quote(f"max({x.record}{{cluster=%q, instance=%q}}){condition}",
                  f"; {x.label}: {{v}}{unit}", fmt)


def _value(key: str, fmt: str, unit: str = "") -> str:
    """"<label>: <the alert's value>": the signal the alert fires on, under its label."""
    return f"{quantities.q(key).label}: {{{{ $value | {fmt} }}}}{unit}"


# What the user sees, quoted in each saturation alert: the symptom alerts it silences.
WAITING = _quote_quantity("queue_continuous", "humanizeDuration", condition=" > 0")
TTFT_P95 = _quote_quantity("time_to_first_token_p95_5m", "humanizeDuration")
ITL_P95 = _quote_quantity("inter_token_latency_p95_5m", "humanizeDuration")
USUAL_SPEED = _quote_quantity("decode_speed_usual", "humanize", " tokens/s")


def saturation_alerts(t: dict) -> tuple[Alert, ...]:
    step = _seconds(t["evaluation_interval"])
    a, sustain = t["alerts"], t["sustain"]
    keep = sustain["keep_firing_for"]
    meaning = {k.state: k.meaning for k in state_classes(t)}
    retracted = _quote(f"{retractions_record(t)}{{cluster=%q, instance=%q}} > 0",
                       "{v} requests were retracted in the last "
                       f"{t['classification']['kv_retraction_window']}. ")

    def in_state(state: str) -> str:
        held = (f" It fires once the state has held {sustain[state]} (a window over the state, "
                f"then `for:`), or {for_(state)} when the server was in another saturation state "
                f"within the last {t['incident_window']} (a class change within an incident); "
                f"once firing, it lasts while the state does: a gap in the state shorter than "
                f"{keep} does not end it"
                if _seconds(sustain[state]) > step else "")
        return f"the server is in state `{state}`: {meaning[state]}.{held}".rstrip(".")

    def state_expr(signal: str, state: str, alert: str) -> str:
        # The signal as the value, so the description can quote it. A sustain longer than one
        # evaluation is a window here (for: is one evaluation), and it is waived when the server
        # was in another saturation state within the incident window: the long sustain guards
        # against a quiet server's flicker, and this server is no quiet one. The class change
        # is then an update of the incident, not a new one. The window is waived too while the
        # alert fires (hysteresis): otherwise one evaluation outside the state, which
        # keep_firing_for absorbs, empties the window for longer than keep_firing_for, and the
        # alert resolves in the middle of the incident and pages again.
        code = STATES.index(state)
        # A PD server's saturation is its pool's (the PD alerts): not its own notification.
        expr = (f"{signal} and on (cluster, instance) (instance:sglang_state:code == {code})\n"
                f"unless on (cluster, instance) {pd_rules.ROLE_INFO}")
        held = _seconds(sustain[state]) - step
        if held <= 0:
            return expr
        return (f"{expr}\nand on (cluster, instance) (\n"
                f"    min_over_time((instance:sglang_state:code == bool {code})[{held}s:]) == 1\n"
                f"  or max_over_time((instance:sglang_saturated:bool unless on (cluster, instance) "
                f"instance:sglang_state:code == {code})[{t['incident_window']}:]) == 1\n"
                f'  or ALERTS{{alertname="{alert}", alertstate="firing"}})')

    def for_(state: str) -> str:
        return sustain[state] if _seconds(sustain[state]) <= step else f"{step}s"

    def state_alert(name: str, signal: str, state: str, comment: str, *, summary: str,
                    description: str, also: str = "") -> Alert:
        return Alert(name, state_expr(signal, state, name), comment, severity="warning",
                     for_=for_(state), summary=summary, keep_firing_for=keep,
                     description=description, fires_when=in_state(state) + also)

    return (
        state_alert(
            "SGLangPrefillBacklog", "instance:sglang_prefill_backlog_tokens:max",
            "prefill_backlog",
            "State prefill_backlog: prompt tokens pile up faster than chunked prefill drains "
            "them. No quiet scenario ever enters the state, so one more evaluation suffices.",
            summary="SGLang prefill backlog is building up.",
            description="{{ $labels.instance }} is in state prefill_backlog: prompt tokens "
                        "pile up faster than prefill drains them. "
                        + _value("prefill_backlog", "humanize") + WAITING + TTFT_P95 + "."),
        state_alert(
            "SGLangDecodeContention", "instance:sglang_decode_speed_per_request:max",
            "decode_contention",
            "State decode_contention: too many long requests decode at once; each one is slow. "
            "No quiet scenario enters the state (a burst of short requests is not contention), "
            "so one more evaluation suffices.",
            summary="SGLang requests are slowed by decode contention.",
            description="{{ $labels.instance }} is in state decode_contention: each request "
                        "decodes well below its usual speed. "
                        + _value("decode_speed", "humanize", " tokens/s") + USUAL_SPEED
                        + ITL_P95 + WAITING + "."),
        state_alert(
            "SGLangKVCachePressure", "instance:sglang_kv_occupancy:ratio", "kv_capacity",
            "State kv_capacity: the KV pool is full; requests are retracted (SGLang's "
            "preemption throws away their decode work) or wait for memory. Retractions are part "
            "of the state, so they need no alert of their own.",
            summary="SGLang KV cache pool is out of room.",
            description="{{ $labels.instance }} is in state kv_capacity: the KV pool is out "
                        "of room. " + retracted + _value("kv_occupancy", "humanizePercentage")
                        + WAITING + TTFT_P95 + "."),
        state_alert(
            "SGLangSchedulingBottleneck", "instance:sglang_queue_nonempty_duration_seconds:max",
            "scheduling_bottleneck",
            "State scheduling_bottleneck: requests wait for a running slot while memory is free. "
            "The state's condition is itself a duration (the queue has been non-empty that "
            "long), so a short sustain suffices.",
            summary="SGLang requests queue while capacity is free.",
            description="{{ $labels.instance }} is in state scheduling_bottleneck: requests "
                        "queue with the KV pool far from full. "
                        + _value("queue_continuous", "humanizeDuration") + TTFT_P95
                        + feature_rules.queue_causes(t) + ".",
            also=", with no prefill backlog and no decode contention (those come first)"),
        Alert(
            "SGLangLongQueueing",
            "instance:sglang_queue_nonempty_duration_seconds:max >= "
            f"{a['long_queueing_seconds']}\n{explained(t)}",
            "The signal is itself a duration (the queue has been non-empty that long), so the "
            "rule needs no for:. A symptom: silent when a saturation state explains it (that "
            "state's alert quotes the queueing).",
            severity="warning", for_="0m", summary="SGLang requests have been queueing for long.",
            description="{{ $labels.instance }}: the waiting queue has been continuously "
                        "non-empty for {{ $value | humanizeDuration }}, with no saturation state "
                        "to explain it" + feature_rules.queue_causes(t) + ".",
            fires_when="the waiting queue has been continuously non-empty for ≥ "
                       f"{a['long_queueing_seconds']} s "
                       "(`instance:sglang_queue_nonempty_duration_seconds:max`), and the server "
                       "has not been in a saturation state ("
                       + ", ".join(f"`{k}`" for k in SATURATION_STATES)
                       + f") in the last {t['symptom_explained_window']}"),
    )


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[duration[-1]]


def _longer(a: str, b: str) -> str:
    return a if _seconds(a) >= _seconds(b) else b


def slo_doc_block(t: dict) -> str:
    """The shipped SLO as docs/alerting.md quotes it (its block `slo-defaults`)."""
    rows = ["| SLO | `slo:` key | Threshold | Objective | Error budget |",
            "|---|---|---|---|---|"]
    for o in SLOS:
        slo = t["slo"][o.key]
        le = slo["threshold_seconds"]
        rows.append(f"| {slo['objective'] * 100:g} % {o.promise.format(t=le)} | `{o.key}` "
                    f"| `sglang:{o.histogram}_bucket{{le=\"{le}\"}}` | {slo['objective']} "
                    f"| {round((1 - slo['objective']) * 100, 3):g} % |")
    return ("\n".join(rows) + f"\n\nTraffic floor (`traffic_floor_rps`): "
            f"{t['slo']['traffic_floor_rps']} requests per second.\n")


def slo_alerts(t: dict) -> tuple[Alert, ...]:
    s, a = _s(t), t["alerts"]
    floor = t["slo"]["traffic_floor_rps"]
    burns = []
    for o in SLOS:
        objective = t["slo"][o.key]["objective"]
        threshold = t["slo"][o.key]["threshold_seconds"]
        allowed = round((1 - objective) * 100, 3)
        for severity, long, short, factor, for_ in BURN_RATES:
            budget = round(factor * (1 - objective), 6)
            burns.append(Alert(
                o.alert,
                f"""
instance_model:sglang_{o.key}_slo_errors:ratio_rate{long} > {budget}
and instance_model:sglang_{o.key}_slo_errors:ratio_rate{short} > {budget}
and on (cluster, instance, model_name) instance_model:sglang_requests:rate1h > {floor}
{explained(t, _longer(short, t["symptom_explained_window"]), first_token=o.key == "ttft")}""",
                f"{factor}x burn over {long} and {short}: "
                f"{'pages' if severity == 'critical' else 'a ticket'}; traffic floor {floor} "
                f"req/s.",
                severity=severity, for_=for_,
                labels=(("slo", o.key), ("long", long), ("short", short)),
                summary=f"SGLang {o.key.upper()} error budget is burning too fast.",
                description="{{ $labels.instance }} ({{ $labels.model_name }}): "
                            "{{ $value | humanizePercentage }} "
                            + o.error.format(t=threshold)
                            + f" over {long}; the SLO allows {allowed:g}%.",
                dashboard="sglang-latency",
                fires_when=f"the error ratio is above {budget} ({factor}× the {allowed:g} % "
                           f"budget) over both {long} and {short}, with > {floor} req/s over "
                           "1 h (or the history there is), and no saturation state in the last "
                           f"{_longer(short, t['symptom_explained_window'])} (its alert is the "
                           "notification and quotes the latency)"))
    endpoints = ", ".join(f"`{path}`" for path in SERVING_ENDPOINTS.split("|"))
    return (
        *burns,
        Alert(
            "SGLangRequestErrors",
            f"""
((instance_model:sglang_aborted_requests:ratio_rate5m > {a['request_error_ratio']}
  and on (cluster, instance, model_name) instance_model:sglang_num_requests:rate5m > {a['request_error_floor_rps']})
or on (cluster, instance) (instance:sglang_http_5xx:ratio_rate5m > {a['request_error_ratio']}
  and on (cluster, instance) sum by (cluster, host, instance) (rate(sglang:http_requests_total{{{s}, endpoint=~"{SERVING_ENDPOINTS}"}}[5m])) > {a['request_error_floor_rps']}))
{pd_explained(t)}""",  # noqa: E501
            "Aborted or 5xx requests above the threshold, with a traffic floor; on a PD server, "
            "silent while its deployment's state explains them (its alert is the one "
            "notification).",
            severity="warning", for_="5m", summary="SGLang requests are failing.",
            description="{{ $labels.instance }}: {{ $value | humanizePercentage }} of requests "
                        "were aborted or answered 5xx over 5 minutes.",
            fires_when=f"more than {a['request_error_ratio']} of requests were aborted over 5 "
                       "minutes (`instance_model:sglang_aborted_requests:ratio_rate5m`), or more "
                       f"than {a['request_error_ratio']} of responses on {endpoints} were 5xx "
                       "(`instance:sglang_http_5xx:ratio_rate5m`, SGLang 0.5.7+); both only "
                       f"while the server handles > {a['request_error_floor_rps']} req/s, "
                       "and not on a PD server whose deployment is, or within "
                       f"{t['symptom_explained_window']} was, in a slow state"),
        Alert(
            "SGLangCacheHitRateDrop",
            f"""
instance_model:sglang_cache_hit:ratio_rate15m
  < {a['cache_hit_drop_ratio']} * instance_model:sglang_cache_hit:ratio_rate6h
and on (cluster, instance, model_name) instance_model:sglang_cache_hit:ratio_rate6h > {a['cache_hit_baseline_min']}
and on (cluster, instance, model_name) instance_model:sglang_prompt_tokens:rate5m > {a['cache_hit_floor_prompt_tokens_per_second']}
unless on (cluster, instance) (max by (cluster, host, instance) (resets(sglang:num_requests_total{{{s}}}[1h])) > 0)""",  # noqa: E501
            "Against the server's own 6 h baseline, with a traffic floor; a restart empties the "
            "cache, so servers restarted in the last hour are excluded.",
            severity="warning", for_="15m", summary="SGLang prefix-cache hit ratio dropped.",
            description="{{ $labels.instance }} ({{ $labels.model_name }}): the prefix-cache hit "
                        "ratio fell to {{ $value | humanizePercentage }}, under half its 6-hour "
                        "baseline: more prefill work per request.",
            fires_when="the prefix-cache hit ratio over 15 minutes "
                       "(`instance_model:sglang_cache_hit:ratio_rate15m`) is below "
                       f"{a['cache_hit_drop_ratio']} × its own 6 h ratio, the 6 h ratio is > "
                       f"{a['cache_hit_baseline_min']}, and the server takes > "
                       f"{a['cache_hit_floor_prompt_tokens_per_second']} prompt tokens/s; "
                       "servers restarted in the last hour are excluded"),
    )


def gpu_alerts(t: dict) -> tuple[Alert, ...]:
    e, a = _e(t), t["alerts"]
    xids, window = a["gpu_xid_critical"], a["gpu_xid_window_seconds"]
    reasons = a["gpu_throttle_reasons"]
    return (
        Alert(
            "GPULost",
            f"""
max_over_time(sglang_obs_gpu_device_up{{{e}}}[15s]) == 0
or on (cluster, instance) (max by (cluster, host, instance) (max_over_time(sglang_obs_gpu_collector_up{{{e}}}[30s])) == 0
    and on (cluster, instance) max by (cluster, host, instance) (max_over_time(sglang_obs_gpu_device_up{{{e}}}[1h])) == 1)""",  # noqa: E501
            "NVML lost the GPU (GpuIsLost, fallen off the bus): the workload on it is dead. Also "
            "a host whose NVML stopped working after it had GPUs in the last hour. Windows "
            "(every read in the last 15 s, 30 s for the whole collector) instead of a for: "
            "reject one missed read and fire at the first evaluation after, so the alert reaches "
            "Alertmanager before SGLangServerDown and GPUXidCritical (longer sustains) and "
            "inhibits the down server and the Xid it explains.",
            severity="critical", for_="0m", summary="A GPU is lost.",
            description="GPU {{ with $labels.gpu }}{{ . }}{{ else }}(all){{ end }} on "
                        "{{ $labels.instance }} no longer answers NVML.", dashboard="sglang-gpus",
            fires_when="NVML no longer reaches the GPU (`sglang_obs_gpu_device_up == 0`), or the "
                       "whole NVML collector is down (`sglang_obs_gpu_collector_up == 0`) on a "
                       "host that had GPUs in the last hour"),
        Alert(
            "GPUXidCritical",
            f"time() - sglang_obs_gpu_xid_last_timestamp_seconds{{{e}, xid=~\"{xids}\"}}"
            f" < {window}",
            "Xid codes that mean hardware or driver failure; on the timestamp, since increase() "
            "misses the first event of a new series. The event arrives before NVML's next "
            "sample shows a lost GPU: the sustain lets GPULost come first and inhibit it.",
            severity="critical", for_="45s", summary="A GPU reported a critical Xid error.",
            description="GPU {{ $labels.gpu }} on {{ $labels.instance }} reported Xid "
                        "{{ $labels.xid }} {{ $value | humanizeDuration }} ago.",
            dashboard="sglang-gpus",
            fires_when=f"a GPU reported one of the critical Xid codes {xids.replace('|', ', ')} "
                       f"within the last {window} s (`time() - "
                       f"sglang_obs_gpu_xid_last_timestamp_seconds{{xid=~\"{xids}\"}} < "
                       f"{window}`); it resolves {window} s after the last event"),
        Alert(
            "GPUUncorrectableECC",
            f"increase(sglang_obs_gpu_ecc_errors_volatile_total{{{e}, type=\"uncorrected\"}}[10m])"
            " > 0",
            "Uncorrectable ECC errors corrupt data; the GPU needs a reset and maybe an RMA.",
            severity="critical", for_="0m", summary="A GPU has uncorrectable ECC errors.",
            description="GPU {{ $labels.gpu }} on {{ $labels.instance }} counted "
                        "{{ $value | humanize }} uncorrectable ECC errors in 10 minutes.",
            dashboard="sglang-gpus",
            fires_when="the GPU counted uncorrectable memory errors in the last 10 minutes "
                       "(`increase(sglang_obs_gpu_ecc_errors_volatile_total"
                       "{type=\"uncorrected\"}[10m]) > 0`)"),
        Alert(
            "GPURowRemapFailure",
            f"sglang_obs_gpu_remapped_rows_failure{{{e}}} == 1",
            "NVIDIA's RMA criterion: the row remapper ran out of spare rows.",
            severity="critical", for_="0m", summary="A GPU failed to remap a memory row.",
            description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} "
                        "reports a row-remapping failure.", dashboard="sglang-gpus",
            fires_when="the GPU reports a row-remapping failure "
                       "(`sglang_obs_gpu_remapped_rows_failure == 1`)"),
        Alert(
            "GPUThermalThrottling",
            f"max by (cluster, host, instance, gpu, uuid) (sglang_obs_gpu_clock_event_active{{{e}, "
            f"reason=~\"{reasons}\"}}) == 1",
            "Clocks held down by heat or a power brake: everything on this GPU runs slower.",
            severity="warning", for_="5m", summary="A GPU is throttling.",
            description="GPU {{ $labels.gpu }} on {{ $labels.instance }} has been slowed by a "
                        "thermal or power event for {for}.", dashboard="sglang-gpus",
            fires_when="one of these clock-event reasons is active: "
                       f"`sglang_obs_gpu_clock_event_active{{reason=~\"{reasons}\"}} == 1`"),
        Alert(
            "GPUPCIeLinkDegraded",
            f"""
sglang_obs_gpu_pcie_link_downgraded{{{e}}} == 1
and on (cluster, instance, gpu) sglang_obs_gpu_utilization_ratio{{{e}}} > {a['gpu_pcie_min_utilization']}""",  # noqa: E501
            "A link below its maximum under load (links may downshift at idle to save power).",
            severity="warning", for_="10m", summary="A GPU's PCIe link is degraded.",
            description="GPU {{ $labels.gpu }} on {{ $labels.instance }} runs its PCIe link below "
                        "its maximum width or generation under load.", dashboard="sglang-gpus",
            fires_when="the GPU's PCIe link runs below its maximum width or generation "
                       "(`sglang_obs_gpu_pcie_link_downgraded == 1`: the exporter compares "
                       "`pcie_link_width` and `pcie_link_generation` with the maxima in "
                       "`sglang_obs_gpu_info`) while the GPU is busy "
                       f"(`sglang_obs_gpu_utilization_ratio > {a['gpu_pcie_min_utilization']}`)"),
    )


META_ALERTS = (
    Alert(
        "Watchdog", "vector(1)",
        "Always firing: if it stops arriving at the dead-man receiver, the alerting pipeline is "
        "broken.",
        severity="none", for_="0m", summary="Alerting pipeline heartbeat.",
        description="Always firing; its absence downstream means Prometheus or Alertmanager is "
                    "not delivering alerts.",
        fires_when="always: `vector(1)`"),
)


def _sh(t) -> str:
    return f'job="{t["selectors"]["shipper_job"]}"'


# Alerts that compare hosts with one another on purpose: they aggregate across clusters (the one
# exception to "every by (...) and on (...) keeps cluster", tests/test_fleet_rules.py).
FLEET_WIDE_ALERTS = ("SGLangHostClusterLabelMissing", "SGLangHostIdentityConflict")


def fleet_alerts(t: dict) -> tuple[Alert, ...]:
    e, s, sh, f = _e(t), _s(t), _sh(t), t["fleet"]
    window, for_ = f["not_reporting_window"], f["not_reporting_for"]
    dropped = " or ".join(
        f"increase({c}{{{sh}}}[15m]) > 0" for c in (
            "vm_persistentqueue_bytes_dropped_total", "vmagent_remotewrite_packets_dropped_total",
            "prometheus_remote_storage_samples_dropped_total",
            "prometheus_remote_storage_samples_failed_total"))
    return (
        Alert(
            "SGLangHostNotReporting",
            f"""
group by (cluster, host) (max_over_time(up[1h]))
unless on (cluster, host) group by (cluster, host) (max_over_time(up[{window}]))""",
            "The store heard from the host in the last hour and nothing for the window: no up "
            "sample of any job, so neither a healthy nor a failing scrape. The host's last values "
            "are not its state: its servers, GPUs and alerts are unknown, not healthy. A store "
            "outage does not fire it: the shippers' buffers fill the gap within the for:.",
            severity="critical", for_=for_, summary="A fleet host stopped reporting.",
            description="No sample has arrived from host {{ $labels.host }} (cluster "
                        "{{ $labels.cluster }}) for "
                        + duration_words(f"{_seconds(window) + _seconds(for_)}s")
                        + ": its shipper, its network or the host is down, and the state of its "
                        "servers is unknown.",
            dashboard="sglang-fleet",
            fires_when=f"the store has an `up` sample of the host in the last hour but none in "
                       f"the last {window} (every job: SGLang, the exporter, the shipper), for "
                       f"{duration_words(for_)}"),
        Alert(
            "SGLangShipperDroppingData",
            dropped,
            "The shipper threw data away: its on-disk buffer reached its bound while the store was "
            "down or slow (vmagent drops the oldest blocks), or the store refused the writes "
            "(vmagent drops a block the store answers 4xx; Prometheus agent counts failed and "
            "dropped samples). The gap is permanent.",
            severity="warning", for_="0m", summary="A fleet shipper is dropping samples.",
            description="The shipper on host {{ $labels.host }} (cluster {{ $labels.cluster }}) "
                        "dropped data in the last 15 minutes: those samples never reach the "
                        "store.",
            dashboard="sglang-fleet",
            fires_when="in the last 15 minutes the shipper dropped buffered bytes "
                       "(`vm_persistentqueue_bytes_dropped_total`), blocks the store refused "
                       "(`vmagent_remotewrite_packets_dropped_total`), or, for a Prometheus agent, "
                       "samples (`prometheus_remote_storage_samples_dropped_total`, "
                       "`prometheus_remote_storage_samples_failed_total`)"),
        Alert(
            "SGLangHostClusterLabelMissing",
            """
group by (job, instance, host) (up{cluster=""})
and on () (count(up{cluster!=""}) > 0)""",
            "A store where some hosts name their cluster and some do not: the unnamed ones would "
            "be merged with one another by every per-cluster rule and dashboard. Silent outside "
            "a fleet, where no series has a cluster.",
            severity="warning", for_="5m", summary="A fleet host ships without a cluster label.",
            description="Target {{ $labels.instance }} ({{ $labels.job }}, host "
                        "{{ $labels.host }}) has no cluster label while other hosts have one: set "
                        "its shipper's cluster.",
            dashboard="sglang-fleet",
            fires_when="a target's `up` has no `cluster` label while other targets in the store "
                       "have one, for 5 minutes"),
        Alert(
            "SGLangHostIdentityConflict",
            f"""
count by (cluster, instance) (group by (cluster, instance, host) (up{{{s}}})) > 1
or label_replace(count by (host) (group by (cluster, host) (up{{{e}}})) > 1, "cluster", "(several)", "", "")""",  # noqa: E501
            "Two hosts claim one identity: one server address reported by two hosts of a cluster "
            "(their series merge in every per-server rule), or one host name in two clusters (a "
            "copied shipper configuration with a wrong cluster).",
            severity="warning", for_="5m", summary="Two fleet hosts share an identity.",
            description="{{ with $labels.instance }}Server {{ . }} is reported by "
                        "{{ $value }} hosts of cluster {{ $labels.cluster }}{{ else }}Host "
                        "{{ $labels.host }} reports in {{ $value }} clusters{{ end }}: their "
                        "series are merged; give each host its own name and cluster.",
            dashboard="sglang-fleet",
            fires_when="one SGLang `instance` is reported by more than one `host` of a cluster, or "
                       "one `host` reports an exporter in more than one `cluster`, for 5 minutes"),
    )


def alert_groups(t: dict) -> list[Group]:
    return [Group("sglang-availability.alerts", "sglang.alerts.yml", availability_alerts(t)),
            Group("sglang-saturation.alerts", "sglang.alerts.yml", saturation_alerts(t)),
            Group("sglang-slo.alerts", "sglang.alerts.yml", slo_alerts(t)),
            Group("sglang-pd.alerts", "sglang.alerts.yml", pd_alerts(t)),
            Group("sglang-features.alerts", "sglang.alerts.yml", feature_alerts(t)),
            Group("gpu.alerts", "gpu.alerts.yml", gpu_alerts(t)),
            Group("meta.alerts", "gpu.alerts.yml", META_ALERTS),
            Group("fleet.alerts", "fleet.alerts.yml", fleet_alerts(t))]


def alerts(t: dict) -> list[Alert]:
    return [rule for group in alert_groups(t) for rule in group.rules]


# -- rendering ---------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, so the files read like hand-written ones."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def runbook_anchor(alert_name: str) -> str:
    """The runbook section of an alert: its heading is the name, so GitHub's anchor is this."""
    return alert_name.lower()


# In a fleet the dashboard link opens on the alert's cluster and host (Grafana's var- URL
# parameters); outside one (no cluster label) the link is the plain dashboard.
DASHBOARD_FLEET_VARS = ("{{ with $labels.cluster }}?var-cluster={{ . | urlquery }}"
                        "{{ with $labels.host }}&var-host={{ . | urlquery }}{{ end }}{{ end }}")


def rule_body(rule: Record | Alert, t: dict) -> dict[str, Any]:
    """A rule as Prometheus reads it; thresholds give the alerts' runbook and dashboard links."""
    if isinstance(rule, Record):
        return {"record": rule.name, "expr": _clean(rule.expr)}
    return {
        "alert": rule.name, "expr": _clean(rule.expr), "for": rule.for_,
        **({"keep_firing_for": rule.keep_firing_for} if rule.keep_firing_for else {}),
        "labels": {"severity": rule.severity, **dict(rule.labels)},
        "annotations": {
            "summary": rule.summary,
            "description": rule.description.replace("{for}", duration_words(rule.for_)),
            "runbook_url": f"{t['runbook_base']}#{runbook_anchor(rule.name)}",
            "dashboard": f"{t['dashboard_base']}/{rule.dashboard}{DASHBOARD_FLEET_VARS}",
        },
    }


def render_groups(groups: list[Group], header: str, t: dict, vmalert: bool = False) -> str:
    out = [f"# GENERATED by `make generate` from prometheus/thresholds.yml "
           f"(sglang_obs/render/rules.py). {header}", "groups:"]
    if vmalert:
        out.insert(1, "# vmalert variant of prometheus/rules/: the same rules without "
                   + ", ".join(VMALERT_DROPPED_FIELDS) + " (vmalert < 1.92 rejects it), in one "
                   "group whose queries bypass the store's latency offset (docs/fleet.md).")
    for group in groups:
        out.append(f"- name: {group.name}")
        if vmalert:
            out += ["  params:", *(f"    {k}: {json.dumps(v)}" for k, v in VMALERT_PARAMS.items())]
        out.append("  rules:")
        for rule in group.rules:
            out.append(f"  # {rule.comment}")
            body = rule_body(rule, t)
            if vmalert:
                for key in VMALERT_DROPPED_FIELDS:
                    body.pop(key, None)
            text = yaml.dump([body], Dumper=_Dumper, sort_keys=False, width=1000,
                             allow_unicode=True)
            out += ["  " + line for line in text.rstrip("\n").splitlines()]
    return "\n".join(out) + "\n"


def rule_files(t: dict) -> dict[Path, str]:
    """prometheus/rules/*.yml (paths relative to the configuration folder), each holding the
    groups that name it, in RULE_FILES order."""
    groups = recording_groups(t) + alert_groups(t)
    unknown = {g.file for g in groups} - {name for name, _ in RULE_FILES}
    if unknown:
        raise ValueError(f"groups name files missing from RULE_FILES: {sorted(unknown)}")
    return {settings.RULES_DIR / name:
            render_groups([g for g in groups if g.file == name], header, t)
            for name, header in RULE_FILES}


def vmalert_rule_files(t: dict) -> dict[Path, str]:
    """prometheus/rules-vmalert/sglang-obs.yml: rule_files' rules, in their order, as one group
    rendered for vmalert < 1.92."""
    order = {name: i for i, (name, _) in enumerate(RULE_FILES)}
    groups = sorted(recording_groups(t) + alert_groups(t), key=lambda g: order[g.file])
    one = Group(VMALERT_GROUP, VMALERT_FILE, tuple(r for g in groups for r in g.rules))
    header = ("Every recording and alerting rule of prometheus/rules/, in their order, as one "
              "group.")
    return {settings.VMALERT_RULES_DIR / VMALERT_FILE:
            render_groups([one], header, t, vmalert=True)}
