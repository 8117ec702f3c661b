"""The replica recommendation's recording rules (docs/scaling.md), from thresholds.yml's
`scaling:` section: the policy sglang_obs/core/scaling.py states in words and evaluates in
Python for the simulator's autoscaled replay, here in PromQL. rules.py places the group."""

from __future__ import annotations

from sglang_obs.core import scaling
from sglang_obs.core.scaling import (
    DESIRED,
    INSTANCE_LOAD,
    LOAD,
    LOAD_WINDOW_S,
    POOL_INFO,
    RECOMMENDED,
    SERVERS,
)

POOL = f"on (cluster, instance) group_left (pool) {POOL_INFO}"


def _number(x: float) -> str:
    return repr(float(x)).removesuffix(".0")


def records(t: dict) -> list[tuple[str, str, str]]:
    """(record, expr, why) of the recommendation, each reading only records before it (the
    last reads its own previous value)."""
    p = scaling.Policy.from_thresholds(t)
    e = f'job="{t["selectors"]["exporter_job"]}"'
    w = p.scale_down_window
    fill = _number(p.scale_down_fill_ratio)
    return [
        (POOL_INFO, f"""
max by (cluster, host, instance, pool) (
  label_replace(
    label_replace(sglang_obs_server_config_info{{{e}}}, "pool", "$1", "disaggregation_mode", "(prefill|decode)"),
    "pool", "unified", "pool", ""))""",  # noqa: E501
         "Each server's pool: its PD role (prefill, decode), else unified."),
        (INSTANCE_LOAD, f"""
max by (cluster, host, instance) (
  label_replace(
    (instance:sglang_running_requests:max + instance:sglang_waiting_requests:max)
      / (max by (cluster, host, instance) (sglang_obs_max_running_requests{{{e}}}) > 0)
      / {_number(p.running_target_ratio)},
    "signal", "requests", "", "")
  or label_replace(instance:sglang_kv_occupancy:ratio / {_number(p.kv_target_ratio)}, "signal", "kv", "", "")
  or label_replace(instance:sglang_prefill_backlog_tokens:max / {_number(p.backlog_tokens * p.backlog_target_ratio)}, "signal", "backlog", "", ""))""",  # noqa: E501
         "One server's load in servers at target: its busiest leading signal over its "
         "target (requests in the server over max_running_requests, KV occupancy, prefill "
         "backlog; thresholds.yml scaling:). Above 1 the server is past its target; a queue "
         "makes it grow without bound."),
        (SERVERS, f"sum by (cluster, pool) (instance:sglang_available:min * {POOL})",
         "Servers of each pool that answer."),
        (LOAD, f"""
sum by (cluster, pool) (
  avg_over_time({INSTANCE_LOAD}[{LOAD_WINDOW_S // 60}m]) * {POOL})""",
         "The pool's load: the servers' loads, each its mean over 2 min, summed: how many "
         "servers at target the pool's traffic needs now."),
        (DESIRED, f"clamp(ceil({LOAD}), {p.min_replicas}, {p.max_replicas})",
         "Servers the pool's load needs now: the load rounded up, within scaling: "
         "min_replicas and max_replicas."),
        (RECOMMENDED, f"""
(
  {DESIRED} > {RECOMMENDED}
  or ({RECOMMENDED} - 1)
    and on (cluster, pool) (max_over_time({LOAD}[{w}])
      <= on (cluster, pool) ({RECOMMENDED} - 1) * {fill})
    and on (cluster, pool) (changes({RECOMMENDED}[{w}]) == 0)
  or {RECOMMENDED}
) and on (cluster, pool) {DESIRED}
or {DESIRED}""",
         f"Servers to run (KEDA and the HPA scale on it): up to the desired count at once; "
         f"down one server at a time, once the load stayed at or below "
         f"{p.scale_down_fill_ratio:g} of one server fewer for {w} and it has not changed for "
         f"{w}. It reads its own previous value."),
    ]


def doc_block(t: dict) -> str:
    """docs/scaling.md's table of the policy's numbers and the records, from thresholds.yml."""
    p = scaling.Policy.from_thresholds(t)
    rows = [
        ("a server's requests signal: (running + waiting) / max_running_requests over",
         f"{p.running_target_ratio:g}", "scaling.running_target_ratio"),
        ("its KV signal: KV occupancy over", f"{p.kv_target_ratio:g}", "scaling.kv_target_ratio"),
        ("its backlog signal: prefill backlog tokens over",
         f"{p.backlog_tokens * p.backlog_target_ratio:g} ({p.backlog_target_ratio:g} of "
         f"classification.prefill_backlog_tokens)", "scaling.backlog_target_ratio"),
        ("the pool's load: each server's mean over", f"{LOAD_WINDOW_S // 60} min", "(the rule)"),
        ("servers, at least / at most", f"{p.min_replicas} / {p.max_replicas}",
         "scaling.min_replicas, max_replicas"),
        ("scale down when the load stayed at or below this share of one server fewer",
         f"{p.scale_down_fill_ratio:g}", "scaling.scale_down_fill_ratio"),
        ("... for, and not within this of the last change", p.scale_down_window,
         "scaling.scale_down_window"),
    ]
    lines = ["| | value | thresholds.yml |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c if c.startswith('(') else '`' + c + '`'} |" for a, b, c in rows]
    lines += ["", "| record | what |", "|---|---|"]
    lines += [f"| `{name}` | {why.split(': ', 1)[0] if name == POOL_INFO else why} |"
              for name, _, why in records(t)]
    return "\n".join(lines) + "\n"
