"""The generated blocks of docs/runbooks.md (`python -m sglang_obs.generate rules`; a test checks
them): every number the runbook quotes from prometheus/thresholds.yml or from an alert rule.

- `states`: the state classification, in priority order, with its thresholds;
- `pd-states`: the same for a prefill/decode deployment's states;
- `traffic-floors`: below which traffic the SLO, error and cache alerts stay silent;
- `slo:KEY`: each SLO's target and error budget;
- `xid-tiers`: which Xid codes page (alerts.gpu_xid_critical) and what the others mean;
- `alert:NAME`: for each alert, its severity, `for:`, `keep_firing_for:` and condition, one line
  per rule of that name (the burn-rate alerts have one per window pair).
"""

from __future__ import annotations

from pathlib import Path

from sglang_obs.core.doc_blocks import DocBlockError, replace_blocks
from sglang_obs.core.states import PD_PRIORITY, PD_STATE_POOL, PD_STATES, STATES
from sglang_obs.render import pd_rules, rules

BUDGET_DAYS = 30  # the SLO period the burn factors are defined against

# Xid codes by what they mean on call, each row with its tier when it does not page; whether it
# pages comes from alerts.gpu_xid_critical.
XID_ROWS = (
    ((48, 95, 64), "48 double-bit ECC, 95 uncontained ECC, 64 page-retirement/row-remapper "
     "recording failure", "drain and reset; check [GPUUncorrectableECC](#gpuuncorrectableecc) "
     "and [GPURowRemapFailure](#gpurowremapfailure)", "critical (not alerted)"),
    ((62, 119, 120), "62 internal micro-controller halt, 119 GSP RPC timeout, 120 GSP error",
     "drain and reset (or reboot); if it recurs, check the driver version with the vendor",
     "critical (not alerted)"),
    ((74,), "74 NVLink error",
     "drain and reset; if it recurs, the NVLink or baseboard is faulty: vendor",
     "critical (not alerted)"),
    ((79,), "79 fallen off the bus", "[GPULost](#gpulost)", "critical (not alerted)"),
    ((94,), "94 contained ECC", "only the affected process was hit; watch for repeats",
     "warning (not alerted)"),
    ((13, 31, 43, 45), "13, 31, 43, 45", "usually the workload: read SGLang's log",
     "application (do not page)"),
    ((63, 92), "63, 92", "none", "informational"),
)


def state_table(t: dict) -> str:
    lines = ["| priority | code | state | condition |", "|---|---|---|---|"]
    for priority, k in enumerate(rules.state_classes(t), 1):
        lines.append(f"| {priority} | {STATES.index(k.state)} | `{k.state}` | {k.meaning} |")
    return "\n".join(lines) + "\n"


def pd_state_table(t: dict) -> str:
    """The PD deployment's states in priority order, each with its pool and its condition."""
    cond = pd_rules.conditions(t)
    words = {"unavailable": "no server of the deployment answers",
             "idle": "nothing running, nothing waiting in either pool",
             "healthy": "a server answers and none of the above"}
    lines = ["| priority | code | state | pool | condition |", "|---|---|---|---|---|"]
    for priority, k in enumerate(PD_PRIORITY, 1):
        text = cond[k][1] if k in cond else words[k]
        lines.append(f"| {priority} | {PD_STATES.index(k)} | `{k}` | "
                     f"{PD_STATE_POOL.get(k, 'all')} | {text} |")
    return "\n".join(lines) + "\n"


def traffic_floors(t: dict) -> str:
    a = t["alerts"]
    return (
        f"- The SLO burn alerts stay silent below {t['slo']['traffic_floor_rps']} req/s "
        "(`instance_model:sglang_requests:rate1h`).\n"
        f"- `SGLangRequestErrors` needs > {a['request_error_floor_rps']} req/s, on its aborted "
        "and its 5xx branch alike.\n"
        f"- `SGLangCacheHitRateDrop` needs > {a['cache_hit_floor_prompt_tokens_per_second']} "
        f"prompt tokens/s and a 6 h baseline hit ratio > {a['cache_hit_baseline_min']}, and it "
        "skips servers restarted in the last hour.\n")


def slo_target(t: dict, slo: rules.Slo) -> str:
    objective = t["slo"][slo.key]["objective"]
    threshold = t["slo"][slo.key]["threshold_seconds"]
    allowed = round((1 - objective) * 100, 3)  # as the alert descriptions quote it
    fastest = max(factor for _, _, _, factor, _ in rules.BURN_RATES)
    return (
        f"The {slo.key.upper()} SLO: {objective * 100:g} % {slo.promise.format(t=threshold)}, "
        f"an error budget of {allowed:g} %. The error ratio "
        f"`instance_model:sglang_{slo.key}_slo_errors:ratio_rate<w>` is the share above the "
        f'`le="{threshold}"` bucket. At the fastest burn ({fastest}×) a {BUDGET_DAYS}-day '
        f"budget is gone in {BUDGET_DAYS / fastest:.1f} days.\n")


def xid_tiers(t: dict) -> str:
    paging = {int(code) for code in t["alerts"]["gpu_xid_critical"].split("|")}
    lines = ["| tier | Xid | what to do |", "|---|---|---|"]
    for codes, what, action, quiet_tier in XID_ROWS:
        pages = paging & set(codes)
        if pages and pages != set(codes):
            raise DocBlockError(f"Xid row {codes}: only {sorted(pages)} page; split the row")
        lines.append(f"| {'critical (page)' if pages else quiet_tier} | {what} | {action} |")
    unlisted = paging - {code for codes, *_ in XID_ROWS for code in codes}
    if unlisted:
        raise DocBlockError(f"paging Xid codes {sorted(unlisted)} have no row in XID_ROWS")
    return "\n".join(lines) + "\n"


def alert_block(rows: list[rules.Alert]) -> str:
    lines = []
    for a in rows:
        keep = f", `keep_firing_for: {a.keep_firing_for}`" if a.keep_firing_for else ""
        lines.append(f"- `{a.severity}`, `for: {a.for_}`{keep}: {a.fires_when}.")
    return "\n".join(lines) + "\n"


def blocks(t: dict) -> dict[str, str]:
    by_name: dict[str, list[rules.Alert]] = {}
    for a in rules.alerts(t):
        by_name.setdefault(a.name, []).append(a)
    return {
        "states": state_table(t),
        "pd-states": pd_state_table(t),
        "traffic-floors": traffic_floors(t),
        **{f"slo:{slo.key}": slo_target(t, slo) for slo in rules.SLOS},
        "xid-tiers": xid_tiers(t),
        **{f"alert:{name}": alert_block(rows) for name, rows in by_name.items()},
    }


def render(text: str, t: dict, doc: Path = Path("docs/runbooks.md")) -> str:
    return replace_blocks(text, blocks(t), doc)
