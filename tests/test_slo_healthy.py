"""The shipped alerts stay silent on a healthy server and on an idle one over three days.

Each scenario is looped for three days of simulated time (backfill.looped: the round repeated
as `sglang-sim serve` repeats it), backfilled into a real Prometheus with the recording rules,
and every alert of the shipped rule files is evaluated over the whole period at the evaluation
interval, honouring its `for:`. Nothing has fired before, so an alert that reads ALERTS sees
what a live Prometheus would. The margins (longest pending run, worst SLO error ratio against
each burn-rate budget) are printed.
"""

import re

import pytest
import yaml

from sglang_obs.core.doc_blocks import replace_blocks
from sglang_obs.core.settings import default as _settings
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.render import rules
from sglang_obs.simulator import profiles

from conftest import ROOT, require_binary
from helpers import query_range

DAYS = 3
BURN = re.compile(r"instance_model:sglang_\w+_slo_errors:ratio_rate\w+ > [-+.0-9e]+")
QUIET = ("healthy", "idle-preallocated")


def shipped_alerts(s):
    return [r for name, _ in rules.RULE_FILES
            for g in yaml.safe_load((s.rules_dir / name).read_text())["groups"]
            for r in g["rules"] if "alert" in r]


def seconds(duration: str) -> float:
    return rules._seconds(duration) if duration else 0.0


def longest_run(values: list, step: float) -> float:
    """Longest stretch (seconds from its first to its last evaluation) of consecutive
    evaluations that returned the series."""
    best, run, previous = 0.0, None, None
    for at, _ in values:
        at = float(at)
        run = run if previous is not None and at - previous <= step * 1.5 else at
        best, previous = max(best, at - run), at
    return best


def pending(url, expr, start, end, step):
    """{labels: longest pending run in seconds} of an alert expression over the period; a run
    of the alert's `for:` or longer fired."""
    out = {}
    for series in query_range(url, expr, start, end, step):
        labels = ", ".join(f"{k}={v}" for k, v in sorted(series["metric"].items()))
        out[labels] = longest_run(series["values"], step)
    return out


def burn_condition(alert) -> str:
    """The burn-rate comparisons of an SLO alert alone, without its traffic floor and without
    the saturation states that silence it: the SLO itself must hold on a quiet server, not only
    its alert be silenced."""
    return " and ".join(BURN.findall(alert["expr"]))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", QUIET)
def test_no_alert_fires_over_three_days(scenario, tmp_path):
    require_binary("promtool")
    require_binary("prometheus")
    s = _settings()
    step = s.evaluation_interval_s
    b = backfill(scenario, tmp_path / "data", s=s, duration=DAYS * 86400,
                 for_alerts=True)
    checks = [(a["alert"], a["expr"], a.get("for", "0s")) for a in shipped_alerts(s)]
    checks += [(f"{a['alert']} burn alone ({dict(a['labels'])['long']})", burn_condition(a),
                a["for"]) for a in shipped_alerts(s) if BURN.search(a["expr"])]
    fired, lines = [], []
    with prometheus(b.data, s=s) as url:
        for name, expr, for_ in checks:
            runs = pending(url, expr, b.start, b.end, step)
            worst = max(runs.values(), default=None)
            lines.append(f"{name} (for {for_}): " + (
                "never true" if worst is None else f"longest true run {worst:.0f}s"))
            if expr.strip() == "vector(1)":  # the heartbeat: true all along, so it was evaluated
                assert worst == b.end - b.start, name
                continue
            fired += [f"{name} {labels}: true for {run:.0f}s, for: {for_}"
                      for labels, run in runs.items() if run >= seconds(for_)]
        for o in rules.SLOS:
            for window in rules.SLO_WINDOWS:
                ratio = query_range(
                    url, f"instance_model:sglang_{o.key}_slo_errors:ratio_rate{window}",
                    b.start, b.end, step)
                worst = max((float(v) for r in ratio for _, v in r["values"]), default=0.0)
                lines.append(f"{o.key} error ratio over {window}: worst {worst:.4%}")
    print(f"\n{scenario}, {DAYS} days:\n  " + "\n  ".join(lines))
    slo = [f for f in fired if "BudgetBurn" in f]
    assert not slo, "\n".join(slo)
    assert not fired, "\n".join(fired)


def test_slo_thresholds_are_bucket_bounds_of_every_release():
    t = rules.inputs()
    for release in profiles.RELEASES:
        golden = (ROOT / "conformance/goldens" / release / "default/metrics.prom").read_text()
        for o in rules.SLOS:
            le = t["slo"][o.key]["threshold_seconds"]
            bounds = re.findall(rf'^sglang:{o.histogram}_bucket{{.*le="([^"]+)"', golden, re.M)
            assert le in bounds, (release, o.key, le, sorted(set(bounds)))


def test_alerting_doc_quotes_the_shipped_slo():
    doc = ROOT / "docs/alerting.md"
    text = doc.read_text()
    assert replace_blocks(text, {"slo-defaults": rules.slo_doc_block(rules.inputs())},
                          doc) == text
