"""The Grafana dashboards: generated, up to date, and linted as grafana/dashboard-linter would.

- generation: deterministic, committed JSON current (`python -m sglang_obs.generate --check
  dashboards`), stale files reported;
- dashboard-linter's key rules re-implemented on the committed JSON: the datasource variable
  first, every panel and target on `${datasource}`, no hard-coded datasource uid, title /
  description / unit on every panel, `$__rate_interval` in every rate (or `$__range` in a range
  summary), counters only under rate/increase/resets/changes, histogram_quantile keeping `le`,
  unique panel ids, fixed uids, a modern schemaVersion and modern panel types only;
- every division guarded (`num / (den > 0)`), SLO thresholds and states from their one source;
- every expression parses (promtool 2.42 has no `promql` command: the expressions go into a
  throw-away recording-rule file for `promtool check rules`);
- every metric name exists: the exporter catalogue, a recording rule, or the small SGLang
  allow-list below, which must itself appear in a recorded SGLang exposition or the simulator's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache

import pytest
import yaml

from conftest import ROOT, require_binary
from helpers import rendered

DASHBOARDS = ROOT / "grafana" / "dashboards"
PROVISIONING = ROOT / "grafana" / "provisioning"
RULES_DIR = ROOT / "prometheus" / "rules"
sys.path.insert(0, str(DASHBOARDS))

from sglang_obs.core.settings import default as _settings  # noqa: E402
from sglang_obs.core.states import STATES  # noqa: E402
from sglang_obs.exporter.catalogue import METRICS  # noqa: E402
from sglang_obs.generate import products  # noqa: E402

from promql_text import innermost_call as _innermost_call  # noqa: E402
from promql_text import matching_paren as _matching_paren  # noqa: E402
from promql_text import paren_owners as _paren_owners  # noqa: E402

S = _settings()  # the checkout's configuration, read once
dashlib = products.dashlib(S)  # the definitions' library, given the settings
from promql_text import quantile_violations  # noqa: E402
from promql_text import strip_strings as _strip_strings  # noqa: E402

UIDS = {
    "sglang-overview.json": "sglang-overview",
    "sglang-latency.json": "sglang-latency",
    "sglang-kv.json": "sglang-kv",
    "sglang-gpus.json": "sglang-gpus",
    "sglang-server.json": "sglang-server",
    "sglang-exporter.json": "sglang-exporter",
    "sglang-fleet.json": "sglang-fleet",
    "sglang-pd.json": "sglang-pd",
    "sglang-gateway.json": "sglang-gateway",
}
# A prefill/decode deployment's dashboards (docs/pd.md) read recorded series of one cluster
# (cluster, pool, instance and role; no job or model) and the gateway's own: only the cluster
# selects, so the template-job/instance rules do not apply (an exclusion with its reason).
DEPLOYMENT_DASHBOARDS = {
    "sglang-pd.json": "per-cluster and per-pool recorded series",
    "sglang-gateway.json": "the gateway's series and per-cluster recorded series",
}
DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "bargauge", "heatmap", "table",
               "alertlist", "row", "text"}
# Exclusions with a reason each, as in a dashboard-linter .lint file.
NO_UNIT = {"row": "a row holds panels, not values", "alertlist": "lists alerts, not values",
           "text": "says what to configure (the cost panel without a price), no value"}
NO_TARGETS = {"row": "a row holds panels", "alertlist": "reads Grafana's alert state",
              "text": "says what to configure, queries nothing"}
RANGE_SUMMARY_TYPES = {"stat", "table", "bargauge"}  # may summarise over $__range
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets", "changes"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                   "or", "unless", "offset", "inf", "nan"}
PROMETHEUS_BUILTINS = {"up": "Prometheus's own scrape health"}
# The fleet shipper's own series (vmagent 1.79, kept by the shipper job of
# prometheus/fleet/vmagent.yml); tests/test_fleet.py queries them on a running fleet.
SHIPPER_METRICS = {
    "vm_persistentqueue_bytes_pending": "vmagent's on-disk buffer",
    "vm_persistentqueue_bytes_dropped_total": "what vmagent dropped from it",
    "vmagent_remotewrite_rows_pushed_after_relabel_total": "samples vmagent sent",
    "process_resident_memory_bytes": "the shipper's RSS",
}
# The model gateway's own series (lightseekorg/smg metrics.rs; docs/pd.md's table), scraped as
# thresholds.yml selectors.gateway_job; tests/test_pd_dashboards.py checks docs/pd.md names each.
GATEWAY_METRICS = {
    "smg_worker_requests_active": "requests in flight per worker",
    "smg_worker_health": "the gateway's health check per worker",
    "smg_worker_cb_state": "circuit breaker state per worker",
    "smg_worker_cb_transitions_total": "circuit breaker transitions per worker",
    "smg_pd_ttft_seconds_bucket": "the gateway's end-to-end PD TTFT histogram",
}
# The SGLang series the dashboards read (sglang: spelling; prometheus.yml renames sglang_ back).
# Each must appear in tests/fixtures/sglang/metrics_0.5.23_tp4.prom or the simulator's exposition.
SGLANG_METRICS = {
    "sglang:cached_tokens_total",
    "sglang:e2e_request_latency_seconds_count",
    "sglang:e2e_request_latency_seconds_sum",
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:gen_throughput",
    "sglang:http_responses_total",
    "sglang:inter_token_latency_seconds_bucket",
    "sglang:inter_token_latency_seconds_count",
    "sglang:inter_token_latency_seconds_sum",
    "sglang:kv_available_tokens",
    "sglang:kv_evictable_tokens",
    "sglang:kv_used_tokens",
    "sglang:max_total_num_tokens",
    "sglang:new_token_ratio",
    "sglang:num_queue_reqs",
    "sglang:num_requests_total",
    "sglang:num_retracted_input_tokens_total",
    "sglang:num_retracted_output_tokens_total",
    "sglang:num_retracted_requests_total",
    "sglang:num_running_reqs",
    "sglang:per_stage_req_latency_seconds_bucket",
    "sglang:per_stage_req_latency_seconds_count",
    "sglang:per_stage_req_latency_seconds_sum",
    "sglang:queue_time_seconds_bucket",
    "sglang:queue_time_seconds_count",
    "sglang:queue_time_seconds_sum",
    "sglang:realtime_tokens_total",
    "sglang:scheduler_idle_seconds_total",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_count",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:token_usage",
}
SGLANG_FIXTURE = ROOT / "tests" / "fixtures" / "sglang" / "metrics_0.5.23_tp4.prom"


# -- loading -----------------------------------------------------------------------------------
def _dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


DASHBOARD_JSON = _dashboards()


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows
    return out


def _targets() -> list[tuple[str, dict, dict]]:
    return [(name, panel, target) for name, dashboard in DASHBOARD_JSON.items()
            for panel in _panels(dashboard) for target in panel.get("targets", [])]


TARGETS = _targets()
TARGET_IDS = [f"{name}:{panel['id']}{target['refId']}:{panel['title']}"
              for name, panel, target in TARGETS]


def _variables(dashboard: dict) -> list[dict]:
    return dashboard["templating"]["list"]


# -- PromQL text helpers (the same approach as test_promtool_rules) ---------------------------

def _blank(pattern: str, text: str) -> str:
    return re.sub(pattern, lambda m: m.group()[0] + " " * (len(m.group()) - 2) + m.group()[-1],
                  text)



def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers that are neither functions, keywords,
    label names of groupings and matchers, nor numbers)."""
    clean = _strip_strings(expr)
    clean = _blank(r"\{[^}]*\}", clean)
    clean = _blank(r"\[[^\]]*\]", clean)
    clean = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", clean)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:])(?!\s*\()",
                             clean):
        if match.group(1) not in PROMQL_KEYWORDS:
            names.add(match.group(1))
    return names


def range_selectors(expr: str) -> list[str]:
    return re.findall(r"\[([^\]]*)\]", _strip_strings(expr))


def counter_violations(expr: str) -> list[str]:
    clean = _strip_strings(expr)
    pairs = _paren_owners(clean)
    selectors = [m.span() for m in re.finditer(r"\{[^}]*\}", clean)]
    bad = []
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*_total\b", clean):
        if any(start < match.start() < end for start, end in selectors):
            continue
        owner = _innermost_call(pairs, match.start())
        if owner not in COUNTER_FUNCTIONS:
            bad.append(f"{match.group()} under {owner or 'nothing'}()")
    return bad





def unguarded_divisions(expr: str) -> list[str]:
    """Divisions whose denominator is neither a number nor `(... > 0)`."""
    clean = _blank(r"\[[^\]]*\]", _blank(r"\{[^}]*\}", _strip_strings(expr)))
    bad = []
    for match in re.finditer(r"/", clean):
        rest = re.sub(r"^\s*(?:(?:on|ignoring)\s*\([^)]*\)\s*)?"
                      r"(?:group_(?:left|right)\s*(?:\([^)]*\))?\s*)?", "", clean[match.end():])
        if re.match(r"[0-9]", rest):
            continue
        if rest.startswith("(") and re.search(r">\s*0\s*$", rest[1:_matching_paren(rest, 0)]):
            continue
        bad.append(clean[max(0, match.start() - 40):match.start() + 40].strip())
    return bad


VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def for_promtool(expr: str) -> str:
    """The expression with Grafana's variables replaced by values promtool can parse."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
    expr = re.sub(r'(=~\s*")([^"]*)(")',
                  lambda m: m.group(1) + VARIABLE.sub(".*", m.group(2)) + m.group(3), expr)
    return expr


# -- the known metric names --------------------------------------------------------------------
@cache
def catalogue_names() -> set[str]:
    names = set()
    for spec in METRICS:
        if spec.kind == "histogram":
            names.update(spec.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(spec.name)
    return names


@cache
def recorded_names() -> set[str]:
    return {rule["record"] for path in sorted(RULES_DIR.glob("*.yml"))
            for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule}


@cache
def sglang_exposed_names() -> set[str]:
    """SGLang names in the recorded 0.5.23 exposition and in a simulator render."""
    names = {re.split(r"[{\s]", line, maxsplit=1)[0]
             for line in SGLANG_FIXTURE.read_text().splitlines()
             if line and not line.startswith("#")}
    names.update(name for name, _ in rendered("long-context-incident", step=60).series)
    return {name for name in names if name.startswith("sglang:")}


def _all_exprs() -> list[tuple[str, str]]:
    """(where, query) for every target and every query variable."""
    out = [(f"{name} panel {panel['id']} {target['refId']} ({panel['title']})", target["expr"])
           for name, panel, target in TARGETS]
    for name, dashboard in DASHBOARD_JSON.items():
        for variable in _variables(dashboard):
            if variable["type"] == "query":
                match = re.match(r"label_values\((.*),\s*\w+\)$", variable["query"])
                assert match, f"{name}: variable {variable['name']} is not label_values(...)"
                out.append((f"{name} variable {variable['name']}", match.group(1)))
    return out


# -- generation --------------------------------------------------------------------------------
def test_every_definition_is_generated_with_its_uid():
    sources = {dashlib.json_path(source).name for source in dashlib.sources()}
    assert sources == set(UIDS), "dashboards and UIDS disagree"
    assert set(DASHBOARD_JSON) == set(UIDS), "a committed JSON without a definition (or missing)"
    for name, uid in UIDS.items():
        assert DASHBOARD_JSON[name]["uid"] == uid, name


@cache
def _generated() -> dict:
    """products.dashboards: every dashboard as generated, with the panels' release notes."""
    return products.dashboards(S)[0]


@pytest.mark.parametrize("source", dashlib.sources(), ids=lambda p: p.name)
def test_generation_is_deterministic_and_committed(source):
    first, second = dashlib.render(source), dashlib.render(source)
    assert first == second, f"{source.name}: two renders differ"
    assert first == json.dumps(json.loads(first), sort_keys=True, indent=2) + "\n"
    committed = dashlib.json_path(source)
    # What is committed: the render with each panel's release note (products.dashboards).
    assert _generated()[committed] == committed.read_text(), (
        f"stale: {committed.name}; run python -m sglang_obs.generate dashboards")
    rendered_doc, committed_doc = json.loads(first), json.loads(committed.read_text())
    for panel in _panels(committed_doc):  # the note only adds to descriptions
        panel.pop("description", None)
    for panel in _panels(rendered_doc):
        panel.pop("description", None)
    assert committed_doc == rendered_doc


def test_generate_check_passes():
    result = subprocess.run([sys.executable, "-m", "sglang_obs.generate", "--check",
                             "dashboards"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr


def test_generate_check_reports_stale_and_orphaned_files(tmp_path, capsys):
    copy = tmp_path / "grafana" / "dashboards"
    copy.mkdir(parents=True)
    for path in DASHBOARDS.iterdir():
        if path.suffix in (".py", ".json"):
            shutil.copy(path, copy / path.name)
    (copy / "sglang-kv.json").write_text("{}\n")
    (copy / "old.json").write_text("{}\n")
    copied = products.Product("dashboards", "", lambda s: products.dashboards(s, copy))
    assert products.run([copied], True, S) == 1
    err = capsys.readouterr().err
    assert "sglang-kv.json (stale)" in err
    assert "old.json (not generated" in err
    assert "sglang-overview.json" not in err
    assert (copy / "sglang-kv.json").read_text() == "{}\n", "--check must not write"


# -- dashboard-level lint ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(UIDS))
def test_dashboard_shape(name):
    dashboard = DASHBOARD_JSON[name]
    assert dashboard["schemaVersion"] == SCHEMA_VERSION == dashlib.SCHEMA_VERSION
    assert not dashboard.get("rows"), "legacy rows"
    assert dashboard["title"]
    assert dashboard["description"]
    assert dashlib.TAG in dashboard["tags"]
    assert dashboard["id"] is None, "a provisioned dashboard must not carry a database id"
    links = [link for link in dashboard["links"] if link["type"] == "dashboards"]
    assert links, "no cross-links"
    for link in links:
        assert link["tags"] == [dashlib.TAG], link
        assert link["keepTime"], link
        assert link["includeVars"], link


@pytest.mark.parametrize("name", sorted(UIDS))
def test_variables(name):
    variables = _variables(DASHBOARD_JSON[name])
    first = variables[0]
    assert (first["name"], first["type"], first["query"]) == (
        "datasource", "datasource", "prometheus"), "the first variable must be the datasource"
    by_name = {v["name"]: v for v in variables}
    required = (("cluster",) if name in DEPLOYMENT_DASHBOARDS
                else ("job", "instance", "model_name"))  # template-job/instance rules
    for variable_name in required:
        assert by_name[variable_name]["type"] == "query", variable_name
    for variable in variables[1:]:
        assert variable["datasource"] == DS, variable["name"]
        assert variable["query"].startswith("label_values("), variable["name"]


def test_alert_dashboard_annotations_point_at_generated_dashboards():
    uids = set()
    for path in RULES_DIR.glob("*.alerts.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                url = rule.get("annotations", {}).get("dashboard")
                if url:
                    # the fleet's var-cluster/var-host suffix is a template: the uid precedes it
                    uids.add(url.split("{{")[0].rstrip("/").rsplit("/", 1)[-1])
    assert uids, "alerts carry no dashboard annotation"
    missing = uids - set(UIDS.values())
    assert not missing, f"alerts link to missing dashboards: {missing}"
    assert {"sglang-overview", "sglang-gpus"} <= uids


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("name", sorted(UIDS))
def test_no_hard_coded_datasource(name):
    dashboard = DASHBOARD_JSON[name]
    for path, node in _walk(dashboard):
        if node is dashboard:
            continue
        if "uid" in node:
            assert node["uid"] == "${datasource}", f"{path}: hard-coded uid {node['uid']!r}"
        if "datasource" in node:
            is_ds_variable = node.get("type") == "datasource" and "templating" in path
            assert node["datasource"] == DS or (is_ds_variable and node["datasource"] is None), (
                f"{path}: datasource {node['datasource']!r}")


@pytest.mark.parametrize("name", sorted(UIDS))
def test_panels(name):
    panels = _panels(DASHBOARD_JSON[name])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
    for panel in panels:
        where = f"{name}: panel {panel['id']} {panel.get('title')!r}"
        assert panel["type"] in PANEL_TYPES, f"{where}: type {panel['type']}"
        assert panel.get("title"), f"{where}: no title"
        assert panel.get("description"), f"{where}: no description"
        assert "\n" not in panel["description"], f"{where}: description not one line"
        assert panel.get("datasource") == DS, f"{where}: datasource {panel.get('datasource')}"
        if panel["type"] not in NO_UNIT:
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        if panel["type"] not in NO_TARGETS:
            assert panel["targets"], f"{where}: no query"
        refs = [target["refId"] for target in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), f"{where}: duplicate refIds"
        assert "gridPos" in panel
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    # The open layout, then each collapsed row's panels: Grafana places those below their row
    # when it is opened and moves the rest down, so they overlap only among themselves.
    top = DASHBOARD_JSON[name].get("panels", [])
    for layer in [top] + [row["panels"] for row in top if row.get("collapsed")]:
        cells: dict[tuple[int, int], str] = {}
        for panel in layer:
            pos = panel["gridPos"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(("name", "panel", "target"), TARGETS, ids=TARGET_IDS)
def test_target(name, panel, target):
    expr = target["expr"]
    assert target["datasource"] == DS
    assert target["intervalFactor"] == 1
    assert target["legendFormat"], "no legendFormat"
    assert expr.strip() == expr
    assert expr
    for window in range_selectors(expr):
        allowed = {"$__rate_interval"} | (
            {"$__range"} if panel["type"] in RANGE_SUMMARY_TYPES else set())
        assert window in allowed, f"range [{window}] (allowed: {sorted(allowed)})"
    clean = _strip_strings(expr)
    for call in re.finditer(r"\b(rate|irate|increase)\s*\(", clean):
        body = clean[call.end() - 1:_matching_paren(clean, call.end() - 1) + 1]
        assert "[" in body, f"{call.group(1)}() without a range"
    assert not counter_violations(expr), counter_violations(expr)
    assert not quantile_violations(expr), quantile_violations(expr)
    assert not unguarded_divisions(expr), unguarded_divisions(expr)
    for variable in VARIABLE.finditer(expr):
        var = variable.group(1) or variable.group(2)
        if not var.startswith("__"):
            assert re.search(r'=~\s*"[^"]*\$' + var, expr), f"${var} outside a regex matcher"
    if panel["type"] == "heatmap":
        assert target["format"] == "heatmap"
        assert target["legendFormat"] == "{{le}}"
        assert re.match(r"sum by \(le\) \(rate\(", expr), "heatmaps read bucket rates by le"


# -- metric names ------------------------------------------------------------------------------
def test_metric_names_exist():
    known = (catalogue_names() | recorded_names() | SGLANG_METRICS | set(PROMETHEUS_BUILTINS)
             | set(SHIPPER_METRICS) | set(GATEWAY_METRICS))
    unknown, underscore = [], []
    for where, expr in _all_exprs():
        for name in metric_names(expr):
            if name.startswith("sglang_") and not name.startswith("sglang_obs_"):
                underscore.append(f"{where}: {name}")
            elif name not in known:
                unknown.append(f"{where}: {name}")
    assert not underscore, "use the sglang: spelling (prometheus.yml renames sglang_ back):\n" + (
        "\n".join(underscore))
    assert not unknown, "metrics no code or rule defines:\n" + "\n".join(unknown)


@pytest.mark.slow  # renders the seed 000 incident
def test_sglang_allow_list_is_exposed_and_used():
    used = {name for _, expr in _all_exprs() for name in metric_names(expr)
            if name.startswith("sglang:")}
    assert used <= SGLANG_METRICS, f"add to SGLANG_METRICS: {sorted(used - SGLANG_METRICS)}"
    exposed = sglang_exposed_names()
    assert exposed >= SGLANG_METRICS, (
        f"not in the 0.5.23 fixture nor the simulator: {sorted(SGLANG_METRICS - exposed)}")


def test_promql_parses_with_promtool(tmp_path):
    promtool = require_binary("promtool")
    rules, where = [], {}
    for i, (location, expr) in enumerate(_all_exprs()):
        query = for_promtool(expr)
        assert "$" not in query, f"{location}: unreplaced variable in {query}"
        record = f"dashboard_check:expr_{i}"
        where[record] = location
        rules.append({"record": record, "expr": query})
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]},
                                   sort_keys=False, width=1_000_000))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, check=False)
    output = result.stdout + result.stderr
    for record, location in where.items():
        output = output.replace(record, f"{record} [{location}]")
    assert result.returncode == 0, output


# -- thresholds and states from their single sources -----------------------------------------
def _overview_panel(title_start: str) -> dict:
    matches = [p for p in _panels(DASHBOARD_JSON["sglang-overview.json"])
               if p["title"].startswith(title_start)]
    assert len(matches) == 1, f"{title_start}: {len(matches)} panels"
    return matches[0]


@pytest.mark.parametrize(("slo", "histogram", "title"), [
    ("ttft", "time_to_first_token_seconds", "TTFT SLO attainment"),
    ("itl", "inter_token_latency_seconds", "ITL SLO attainment"),
])
def test_slo_tiles_use_the_thresholds_file(slo, histogram, title):
    thresholds = yaml.safe_load((ROOT / "prometheus" / "thresholds.yml").read_text())["slo"][slo]
    le = str(thresholds["threshold_seconds"])
    assert re.fullmatch(r"\d+\.\d+", le), f"{le}: not written as SGLang renders bucket bounds"
    panel = _overview_panel(title)
    expr = panel["targets"][0]["expr"]
    assert f"sglang:{histogram}_bucket{{" in expr, expr
    assert f'le="{le}"' in expr, expr
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "green", "value": thresholds["objective"]}
    lines = [p for name in ("sglang-overview.json", "sglang-latency.json")
             for p in _panels(DASHBOARD_JSON[name])
             if p["type"] == "timeseries" and any(f"sglang_{histogram}:p95_5m" in t["expr"]
                                                  for t in p["targets"])]
    assert lines
    for line in lines:
        values = [s["value"] for s in line["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert float(le) in values, f"{line['title']}: no SLO line at {le}"


def test_state_panels_map_every_state():
    expected = {str(code): name for code, name in enumerate(STATES)}
    state_panels = [p for p in _panels(DASHBOARD_JSON["sglang-overview.json"])
                    if any("instance:sglang_state:code" in t["expr"] for t in p["targets"])
                    and p["type"] in ("state-timeline", "stat")]
    assert {p["type"] for p in state_panels} == {"state-timeline", "stat"}
    for panel in state_panels:
        mappings = panel["fieldConfig"]["defaults"]["mappings"]
        got = {value: result["text"] for m in mappings if m["type"] == "value"
               for value, result in m["options"].items()}
        assert got == expected, panel["title"]


# -- provisioning ------------------------------------------------------------------------------
def test_provisioning():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "datasources.yml").read_text())
    by_uid = {ds["uid"]: ds for ds in datasources["datasources"]}
    prometheus, alertmanager = by_uid["prometheus"], by_uid["alertmanager"]
    assert (prometheus["type"], prometheus["url"], prometheus["isDefault"]) == (
        "prometheus", "http://prometheus:9090", True)
    assert (alertmanager["type"], alertmanager["url"]) == ("alertmanager",
                                                           "http://alertmanager:9093")
    assert alertmanager["jsonData"]["implementation"] == "prometheus"
    assert sum(bool(ds.get("isDefault")) for ds in datasources["datasources"]) == 1
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "dashboards.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["folder"] == "SGLang"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


# -- the lint must reject what it is meant to reject -------------------------------------------
def test_lint_helpers_catch_bad_expressions():
    assert metric_names(
        'sum by (instance, le) (rate(sglang:x_bucket{job=~"$job", le="2.0"}[5m])) '
        "/ on () group_left () (count(up == 0) > 0) * 1e-9 + vector(0) + time()"
    ) == {"sglang:x_bucket", "up"}
    assert counter_violations('max by (instance) (sglang:num_requests_total{job="sglang"})')
    assert not counter_violations("sum(changes(a_total[5m])) + sum(increase(b_total[5m]))")
    assert quantile_violations("histogram_quantile(0.9, sum by (instance) (rate(x_bucket[5m])))")
    assert quantile_violations("histogram_quantile(0.9, sum(rate(x_bucket[5m])))")
    assert not quantile_violations("histogram_quantile(0.9, sum(rate(x_bucket[5m])) by (le))")
    assert unguarded_divisions("sum(rate(a[5m])) / sum(rate(b[5m]))")
    assert unguarded_divisions("a / (b)")
    assert not unguarded_divisions('sum(a{e=~"/v1/x"}) / (sum(b) > 0)')
    assert not unguarded_divisions("a / on () group_left () (sum(b) > 0) + c / 1000")
    assert for_promtool('x{instance=~"$instance", gpu=~"${gpu}"}[$__rate_interval]') == (
        'x{instance=~".*", gpu=~".*"}[5m]')
    assert range_selectors('rate(x{a="[1m]"}[$__range])') == ["$__range"]
