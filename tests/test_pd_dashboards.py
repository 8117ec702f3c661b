"""The prefill/decode deployment's dashboards (sglang-pd, sglang-gateway; docs/pd.md): read as a
request flows, states coded and coloured from sglang_obs.core.states, every line drawn at a
thresholds.yml value, the gateway's raw series on its own scrape job, links to dashboards that
exist. tests/test_dashboards.py lints them with the others."""

from __future__ import annotations

import re

import pytest
import yaml
from test_dashboards import DASHBOARD_JSON, GATEWAY_METRICS, UIDS, _panels

from sglang_obs.core.states import PD_POOLS, PD_STATE_COLOURS, PD_STATES

from conftest import ROOT

PD = DASHBOARD_JSON["sglang-pd.json"]
GATEWAY = DASHBOARD_JSON["sglang-gateway.json"]
THRESHOLDS = yaml.safe_load((ROOT / "prometheus" / "thresholds.yml").read_text())
GATEWAY_JOB = THRESHOLDS["selectors"]["gateway_job"]


def panel(dashboard: dict, title: str) -> dict:
    matches = [p for p in _panels(dashboard) if p["title"] == title]
    assert len(matches) == 1, f"{title}: {len(matches)} panels"
    return matches[0]


def value_mappings(p: dict) -> dict[str, tuple[str, str]]:
    return {value: (result["text"], result["color"])
            for m in p["fieldConfig"]["defaults"]["mappings"] if m["type"] == "value"
            for value, result in m["options"].items()}


def lines(p: dict) -> list[float]:
    return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]]


def test_pd_dashboard_reads_as_a_request_flows():
    rows = [p["title"] for p in PD["panels"] if p["type"] == "row"]
    assert rows == ["Deployment state", "Gateway: time to first token", "Prefill pool",
                    "KV transfer", "Decode pool"]
    pools = [p for p in _panels(PD) if any("pool:sglang_pd_state:code" in t["expr"]
                                           for t in p.get("targets", []))]
    order = [re.search(r'pool="(\w+)"', p["targets"][0]["expr"]).group(1)
             for p in sorted(pools, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))]
    assert tuple(order) == PD_POOLS, "one state timeline per pool, left to right as a request flows"
    assert len({p["gridPos"]["y"] for p in pools}) == 1, "the pools side by side"


@pytest.mark.parametrize("name", ["sglang-pd.json", "sglang-gateway.json"])
def test_state_panels_map_every_pd_state_in_its_colour(name):
    expected = {str(code): (state, PD_STATE_COLOURS[state]) for code, state in enumerate(PD_STATES)}
    state_panels = [p for p in _panels(DASHBOARD_JSON[name])
                    if any(":sglang_pd_state:code" in t["expr"] for t in p.get("targets", []))]
    assert state_panels
    for p in state_panels:
        assert p["type"] in ("state-timeline", "stat"), p["title"]
        assert value_mappings(p) == expected, p["title"]
    if name == "sglang-pd.json":
        verdict = [p for p in state_panels
                   if "cluster:sglang_pd_state:code" in p["targets"][0]["expr"]]
        assert {p["type"] for p in verdict} == {"state-timeline", "stat"}


def test_breaker_and_health_timelines_name_every_value():
    breaker = panel(GATEWAY, "Circuit breaker state")
    assert breaker["type"] == "state-timeline"
    assert {v: text for v, (text, _) in value_mappings(breaker).items()} == {
        "-1": "removed", "0": "closed", "1": "open", "2": "half_open"}
    health = panel(GATEWAY, "Worker health")
    assert {v: text for v, (text, _) in value_mappings(health).items()} == {
        "0": "unhealthy", "1": "healthy"}


@pytest.mark.parametrize(("name", "title", "value"), [
    ("sglang-pd.json", "Prefill backlog", THRESHOLDS["classification"]["prefill_backlog_tokens"]),
    ("sglang-pd.json", "Prefill running / effective max",
     THRESHOLDS["classification"]["running_ratio_at_limit"]),
    ("sglang-pd.json", "Transfer latency", THRESHOLDS["pd"]["min_transfer_seconds"]),
    ("sglang-pd.json", "Transfer failure ratio", THRESHOLDS["pd"]["transfer_failure_ratio"]),
    ("sglang-pd.json", "Decode queues", THRESHOLDS["pd"]["min_prealloc_queue_requests"]),
    ("sglang-pd.json", "Routing skew", THRESHOLDS["pd"]["routing_skew_ratio"]),
    ("sglang-pd.json", "TTFT decomposition", float(THRESHOLDS["slo"]["ttft"]["threshold_seconds"])),
    ("sglang-gateway.json", "Error ratio", THRESHOLDS["alerts"]["request_error_ratio"]),
    ("sglang-gateway.json", "Gateway TTFT p90",
     float(THRESHOLDS["slo"]["ttft"]["threshold_seconds"])),
])
def test_lines_are_drawn_at_the_thresholds_file(name, title, value):
    assert float(value) in lines(panel(DASHBOARD_JSON[name], title))


def test_transfer_speed_bottleneck_line_reads_the_drop_ratio():
    exprs = [t["expr"] for t in panel(PD, "Transfer speed")["targets"]]
    assert f"{THRESHOLDS['pd']['transfer_speed_drop_ratio']:g} * " in exprs[-1]


def test_gateway_series_select_the_gateway_job():
    for name in ("sglang-pd.json", "sglang-gateway.json"):
        for p in _panels(DASHBOARD_JSON[name]):
            for target in p.get("targets", []):
                for match in re.finditer(r"\b(smg_\w+)\{([^}]*)\}", target["expr"]):
                    assert f'job="{GATEWAY_JOB}"' in match.group(2), (p["title"], match.group())
                    assert 'cluster=~"$cluster"' in match.group(2), (p["title"], match.group())


def test_gateway_allow_list_is_documented_and_used():
    doc = (ROOT / "docs" / "pd.md").read_text()
    used = {m for name in ("sglang-pd.json", "sglang-gateway.json")
            for p in _panels(DASHBOARD_JSON[name]) for t in p.get("targets", [])
            for m in re.findall(r"\bsmg_\w+(?=\{)", t["expr"])}
    assert used == set(GATEWAY_METRICS)
    for name in GATEWAY_METRICS:
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"`{family}`" in doc, f"docs/pd.md does not name {family}"


@pytest.mark.parametrize("name", ["sglang-pd.json", "sglang-gateway.json"])
def test_deployment_dashboards_select_the_cluster_only(name):
    variables = DASHBOARD_JSON[name]["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", "cluster"]
    jobs = re.search(r'job=~"([^"]*)"', variables[1]["query"]).group(1).split("|")
    assert GATEWAY_JOB in jobs, "the cluster variable must list a gateway-only cluster"


def test_data_links_open_generated_dashboards_with_the_series_labels():
    uids = set(UIDS.values())
    found = 0
    for name in ("sglang-pd.json", "sglang-gateway.json"):
        for p in _panels(DASHBOARD_JSON[name]):
            for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                found += 1
                uid = re.match(r"/d/([\w-]+)\?", link["url"]).group(1)
                assert uid in uids, link
                assert link["url"].endswith("${__url_time_range}"), link
                labels = re.findall(r"\$\{__field\.labels\.(\w+)\}", link["url"])
                assert "cluster" in labels, link
                if "instance" in labels:  # only per-server series carry it
                    assert all(t["expr"].startswith("instance:") for t in p["targets"]), link
    assert found >= 4


def test_docs_show_each_pd_dashboard_on_its_incident():
    """docs/pd.md shows the pictures `make generate` draws (sglang_obs/generate/examples.py)."""
    from sglang_obs.generate.examples import PD_PICTURES

    shown = set(re.findall(r"!\[[^\]]*\]\((images/[^)]+\.png)\)",
                           (ROOT / "docs/pd.md").read_text()))
    assert {uid for uid, _, _ in PD_PICTURES} == {"sglang-pd", "sglang-gateway"}
    for _, _, name in PD_PICTURES:
        assert f"images/{name}" in shown, name
        assert (ROOT / "docs/images" / name).stat().st_size > 10_000, name
