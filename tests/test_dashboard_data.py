"""Every panel of every generated dashboard returns data from a real Prometheus backfilled
with simulator scenarios (raw and recorded series, as if it had watched them happen)."""

import json
import math

import pytest

from sglang_obs.generate.render_dashboard import panels, substitute

from conftest import ROOT
from helpers import query_range

DASHBOARDS = sorted((ROOT / "grafana/dashboards").glob("*.json"))
# Panels that count events the seed 000 incident does not have; each is shown non-empty by the
# scenario that has the event (below). Matched on the panel title.
EVENT_ONLY = {
    "Xid": "slow-gpu", "Last Xid": "slow-gpu", "throttle": "slow-gpu",
    "Retraction": "kv-exhaustion", "Retracted": "kv-exhaustion",
    "Restarts": "crash-restart", "restart": "crash-restart", "OOM": "crash-restart",
    "Exit": "crash-restart", "Uptime": "crash-restart",
    "Poll errors": "crash-restart",  # a poll-error series starts at its first failure
    "HiCache": "hicache-host-drops",  # a feature the other scenarios do not turn on
    "Speculative": "spec-decoding-collapse",
    "Structured output": "grammar-compile-backlog",
    "LoRA": "lora-churn",
    "Priorities": "priority-starvation",
}
# Opt-in features the simulator does not turn on, with the reason.
NOT_SIMULATED = {
    "by SGLang server": "per-process GPU memory is opt-in (--collector.nvml.processes)",
    "NVML errors": "the simulator's GPU feed never fails an NVML call, and an NVML-error series "
                   "starts at its first failure",
    "Shipper": "a backfill has no shipper: tests/test_fleet.py reads these on a running fleet",
    "not reporting": "lists only hosts that went silent: tests/test_fleet.py stops a shipper",
}


# Dashboards of a prefill/decode deployment (docs/pd.md) show data only on a PD render: each is
# checked on its scenario alone, skipped until the simulator has a PD render.
PD_SCENARIOS = {"sglang-pd": "pd-healthy", "sglang-gateway": "pd-healthy"}
# PD panels and series that exist only once the event happened (the gateway creates a counter
# at its first increment): checked on the scenario with the event, a series' key (in its
# expression) before its panel's title. Requests whose every attempt hangs use up their retries
# and are answered 500 only in pd-bootstrap-timeouts.
PD_EVENT_ONLY = {"smg_router_errors": "pd-bootstrap-timeouts",
                 "retries_exhausted": "pd-bootstrap-timeouts",
                 "Retries": "pd-circuit-open", "Breaker transitions": "pd-circuit-open"}


def pd_scenario_of(dashboard: str, title: str, expr: str) -> str:
    return next((s for key, s in PD_EVENT_ONLY.items() if key in expr or key == title),
                PD_SCENARIOS[dashboard])


def has_data(result):
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


# 0.5.23: the newest release, so release-gated panels (scheduler busy share) have data.
SCENARIOS = ("long-context-incident", *sorted(set(EVENT_ONLY.values())))
RELEASE = "0.5.23"


def targets(pd: bool = False):
    """Every target of the unified-server dashboards, or with `pd` of the PD ones."""
    for path in DASHBOARDS:
        if (path.stem in PD_SCENARIOS) != pd:
            continue
        dashboard = json.loads(path.read_text())
        for panel in panels(dashboard):
            for target in panel["targets"]:
                if target.get("expr"):
                    yield pytest.param(path.stem, panel["title"], target["expr"],
                                       id=f"{path.stem}:{panel['title']}:{target.get('refId')}")


@pytest.fixture(scope="module")
def results(backfilled):
    """Every target on every scenario, one backfilled Prometheus per scenario."""
    out = {}
    for name in SCENARIOS:
        b, url = backfilled(name, release=RELEASE)
        for param in targets():
            _, _, expr = param.values
            out[(name, expr)] = has_data(
                query_range(url, substitute(expr, b.end - b.start, b.step), b.start, b.end,
                            step=60))
    return out


@pytest.fixture(scope="module")
def pd_results(backfilled):
    """Every PD dashboard target on its PD scenario."""
    out = {}
    wanted = {(pd_scenario_of(*param.values), param.values[2]) for param in targets(pd=True)}
    for name in sorted({name for name, _ in wanted}):
        b, url = backfilled(name, release=RELEASE)
        for param in targets(pd=True):
            _, _, expr = param.values
            if (name, expr) not in wanted:
                continue
            out[(name, expr)] = has_data(
                query_range(url, substitute(expr, b.end - b.start, b.step), b.start, b.end,
                            step=60))
    return out


@pytest.mark.slow  # backfills a PD scenario into a real Prometheus TSDB
@pytest.mark.parametrize(("dashboard", "title", "expr"), list(targets(pd=True)))
def test_every_pd_panel_shows_data(pd_results, dashboard, title, expr):
    scenario = pd_scenario_of(dashboard, title, expr)
    assert pd_results[(scenario, expr)], f"{dashboard} / {title}: no data on {scenario}"


@pytest.mark.slow  # backfills four scenarios into real Prometheus TSDBs
@pytest.mark.parametrize(("dashboard", "title", "expr"), list(targets()))
def test_every_panel_shows_data_on_the_seed_000_incident(results, dashboard, title, expr):
    reason = next((r for key, r in NOT_SIMULATED.items() if key in title), None)
    if reason:
        pytest.skip(reason)
    scenario = next((s for key, s in EVENT_ONLY.items() if key.lower() in title.lower()),
                    "long-context-incident")
    assert results[("long-context-incident", expr)] or results[(scenario, expr)], (
        f"{dashboard} / {title}: no data on long-context-incident"
        + ("" if scenario == "long-context-incident" else f" nor on {scenario}"))


def test_dashboards_were_found():
    assert len(DASHBOARDS) == 9
    assert sum(1 for _ in targets()) > 100
    assert {path.stem for path in DASHBOARDS} >= set(PD_SCENARIOS)
    assert sum(1 for _ in targets(pd=True)) > 30
