"""The replica recommendation validated on the simulator's ramp (docs/scaling.md).

The scenario `scale-ramp` is replayed twice through simulator/autoscale.py: once on one
server (unscaled), once with the recommendation applied as KEDA would apply it (a server asked
for is ready after the start-up delay). The shipped rule files then run in promtool over each
replay's series, every evaluation: the recommendation the PromQL computes must be, step by step,
the one the replay applied (core/scaling.py's Python spelling of it), and the TTFT SLO's fast
burn (the 1h/5m error ratios over 14.4 times the budget, rules.BURN_RATES' first row) and every
alert are read from the same run. docs/scaling.md's numbers come from here
(`python -m sglang_obs.generate scaling`), and tests/test_scaling.py holds them to a new run.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from sglang_obs.core import scaling
from sglang_obs.core.settings import Settings
from sglang_obs.generate import promtool_eval
from sglang_obs.generate.detection import _parse_got
from sglang_obs.render import rules
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.autoscale import STARTUP_S, Fleet, promtool_series, render_fleet

SCENARIO = "scale-ramp"
DOC = "scaling.md"  # in docs/
BLOCK = "scaling-replay"
TTFT_1H = "instance_model:sglang_ttft_slo_errors:ratio_rate1h"
TTFT_5M = "instance_model:sglang_ttft_slo_errors:ratio_rate5m"
FIRING = 'ALERTS{alertstate="firing"}'


def fast_burn_factor() -> float:
    severity, long, short, factor, _ = rules.BURN_RATES[0]
    assert (severity, long, short) == ("critical", "1h", "5m")
    return factor


@dataclass
class Run:
    """One replay as promtool saw it, per evaluation step."""
    name: str
    step: int
    steps: int
    recommended: dict[int, float] = field(default_factory=dict)  # PromQL
    load: dict[int, float] = field(default_factory=dict)
    burning: set[int] = field(default_factory=set)  # a server's 1h and 5m ratios over the burn
    alerts: dict[str, set[int]] = field(default_factory=dict)  # alertname -> firing steps
    ttft_errors: float = 0.0  # share of the replay's requests over the TTFT threshold
    requests: int = 0
    fleet: Fleet | None = None

    def first(self, steps) -> float | None:
        return min(steps) * self.step if steps else None

    @property
    def burn_onset(self) -> float | None:
        return self.first(self.burning)

    def alert_onset(self, name: str) -> float | None:
        return self.first(self.alerts.get(name, set()))

    def first_alert(self) -> tuple[str, float] | None:
        """The first alert to fire (Watchdog, the heartbeat, aside)."""
        onsets = [(self.alert_onset(n), n) for n in self.alerts if n != "Watchdog"]
        return min(onsets)[::-1] if onsets else None

    def rise(self) -> float | None:
        """When the recommendation first asked for more servers than it started with."""
        return self.first({i for i, v in self.recommended.items()
                           if v > self.recommended.get(0, 1)})


def rule_series_names(s: Settings) -> set[str]:
    """Every raw metric name the rule files read: the replay's other series are left out of
    promtool's input, which they would only slow down."""
    text = "\n".join(p.read_text() for p in promtool_eval.rule_files(s))
    return set(re.findall(r"\b(sglang:[a-z_:]+|sglang_obs_[a-z_]+|up)\b", text))


def _evaluate(fleet: Fleet, name: str, s: Settings, workdir: Path) -> Run:
    out = fleet.rendered
    step = int(out.step)
    run = Run(name, step, out.steps, fleet=fleet)
    series = promtool_series(fleet, rule_series_names(s))
    exprs = [(e, i * step) for i in range(out.steps)
             for e in (scaling.RECOMMENDED, scaling.LOAD, TTFT_1H, TTFT_5M, FIRING)]
    output = promtool_eval.evaluate(series, exprs, step, workdir, s, name)
    limit = fast_burn_factor() * (1 - float(s.thresholds["slo"]["ttft"]["objective"]))
    def got(expr: str, at: int):
        return _parse_got(output, expr.replace('"', '\\"'), at)

    for i in range(out.steps):
        at = i * step
        for _, v in got(scaling.RECOMMENDED, at):
            run.recommended[i] = v
        for _, v in got(scaling.LOAD, at):
            run.load[i] = v
        long = {lab.get("instance"): v for lab, v in got(TTFT_1H, at)}
        short = {lab.get("instance"): v for lab, v in got(TTFT_5M, at)}
        if any(v > limit and short.get(inst, 0) > limit for inst, v in long.items()):
            run.burning.add(i)
        for labels, _ in got(FIRING, at):
            run.alerts.setdefault(labels["alertname"], set()).add(i)
    # Every arrival counts: one still without a first token at the end is an error once it
    # has waited longer than the threshold, as is one no server could take.
    threshold = float(s.thresholds["slo"]["ttft"]["threshold_seconds"])
    end = (out.steps - 1) * step
    waits = [(r.first_token_at if r.first_token_at is not None else end) - r.arrival
             for r in fleet.requests]
    run.requests = len(waits)
    run.ttft_errors = sum(1 for x in waits if x > threshold) / max(len(waits), 1)
    return run


def replay(s: Settings, workdir: Path | None = None) -> tuple[Run, Run]:
    """(unscaled, scaled): the ramp on one server, and with the recommendation applied."""
    sc = scenarios.load(SCENARIO)
    policy = scaling.Policy.from_thresholds(s.thresholds)
    with tempfile.TemporaryDirectory() as tmp:
        work = workdir or Path(tmp)
        unscaled = _evaluate(render_fleet(sc, None, step=s.scrape_interval_s), "unscaled", s,
                             work)
        scaled = _evaluate(render_fleet(sc, scaling.Recommender(policy),
                                        step=s.scrape_interval_s), "scaled", s, work)
    return unscaled, scaled


def minutes(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 60:.1f} min"


def _phase_words(p: dict) -> str:
    start, end = p["at"] / 60, (p["at"] + p["duration"]) / 60
    rate = p["rate"]
    if isinstance(rate, dict):
        lo, hi = rate["ramp"]
        return f"{lo:g} to {hi:g} requests/s from {start:g} to {end:g} min"
    return f"{rate:g} requests/s to {end:g} min"


def _alert(run: Run) -> str:
    first = run.first_alert()
    return "none" if first is None else f"{first[0]} at {minutes(first[1])}"


def doc_block(unscaled: Run, scaled: Run) -> str:
    """docs/scaling.md's generated numbers."""
    fleet = scaled.fleet
    changes = [d for a, d in pairwise(fleet.decisions)
               if d.recommended != a.recommended]
    ups = [d for a, d in pairwise(fleet.decisions) if d.recommended > a.recommended]
    downs = [d for a, d in pairwise(fleet.decisions)
             if d.recommended < a.recommended]
    peak = max(d.recommended for d in fleet.decisions)
    lines = [
        f"Replayed by `python -m sglang_obs.generate scaling` (scenario `{SCENARIO}`: "
        + "; ".join(_phase_words(p) for p in scenarios.load(SCENARIO).phases)
        + f"; start-up delay {STARTUP_S:.0f} s, rules evaluated by promtool every "
        f"{unscaled.step} s):",
        "",
        "| | one server | with the recommendation |",
        "|---|---|---|",
        f"| recommendation first above 1 | {minutes(unscaled.rise())} | "
        f"{minutes(scaled.rise())} |",
        f"| TTFT fast burn (1h and 5m error ratios over {fast_burn_factor():g}x the budget) "
        f"from | {minutes(unscaled.burn_onset)} | {minutes(scaled.burn_onset)} |",
        f"| SGLangTTFTBudgetBurn fires | {minutes(unscaled.alert_onset('SGLangTTFTBudgetBurn'))} "
        f"| {minutes(scaled.alert_onset('SGLangTTFTBudgetBurn'))} |",
        f"| first alert | {_alert(unscaled)} | {_alert(scaled)} |",
        f"| alerts that fired | {', '.join(sorted(unscaled.alerts)) or 'none'} | "
        f"{', '.join(sorted(scaled.alerts)) or 'none'} |",
        f"| requests over the TTFT threshold, whole replay | {unscaled.ttft_errors:.1%} of "
        f"{unscaled.requests} | {scaled.ttft_errors:.1%} of {scaled.requests} |",
        f"| most servers recommended | 1 (fixed) | {peak} |",
        "",
        "The recommendation with the replay: " + "; ".join(
            f"{minutes(d.t)}: {d.recommended}" for d in changes) + ".",
        f"{len(ups)} rise(s) and {len(downs)} fall(s); the falls came "
        + ", ".join(minutes(b.t - a.t) for a, b in pairwise(downs)) + " apart."
        if len(downs) > 1 else f"{len(ups)} rise(s) and {len(downs)} fall(s).",
    ]
    return "\n".join(lines)
