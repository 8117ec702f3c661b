"""Fleet-safe rules: no recording rule or alert aggregates across clusters by accident. Every
`by (...)` and `on (...)` of every generated rule keeps `cluster` — the only exceptions are the
fleet alerts that compare hosts with one another on purpose (rules.FLEET_WIDE_ALERTS) — and no
aggregation drops every label without saying so. tests/rules/fleet_test.yml proves the effect
with two clusters holding the same instance."""

from __future__ import annotations

import re

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.render import rules

from conftest import ROOT

S = _settings()  # the checkout's configuration, read once

CLAUSE = re.compile(r"\b(by|on|without|ignoring)\s*\(([^)]*)\)")
AGGREGATIONS = ("sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "quantile",
                "topk", "bottomk", "count_values")
BARE = re.compile(r"\b(" + "|".join(AGGREGATIONS) + r")\s*\(")


def _rules(directory):
    out = []
    for path in sorted(directory.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append((rule.get("alert") or rule["record"], rule["expr"]))
    return out


def clause_violations(expr: str) -> list[str]:
    """The by/on clauses of `expr` that lack cluster, and without/ignoring clauses that drop it."""
    bad = []
    for kind, labels in CLAUSE.findall(expr):
        names = {n.strip() for n in labels.split(",") if n.strip()}
        if kind in ("by", "on") and "cluster" not in names:
            bad.append(f"{kind} ({labels})")
        if kind in ("without", "ignoring") and "cluster" in names:
            bad.append(f"{kind} ({labels})")
    return bad


def bare_aggregations(expr: str) -> list[str]:
    """Aggregations with no by/without clause, which sum over every cluster and host."""
    bad = []
    for m in BARE.finditer(expr):
        before = expr[max(0, m.start() - 40):m.start()]
        after = expr[m.end():]
        if re.search(r"\b(by|without)\s*\([^)]*\)\s*$", before):
            continue  # `sum by (...) (`: the clause comes first
        depth, i = 1, 0
        while depth and i < len(after):
            depth += {"(": 1, ")": -1}.get(after[i], 0)
            i += 1
        if not re.match(r"\s*(by|without)\s*\(", after[i:]):
            bad.append(m.group(0))
    return bad


def test_the_scanners_catch_what_they_are_for():
    assert clause_violations("sum by (instance) (x)") == ["by (instance)"]
    assert clause_violations("a and on (instance, model_name) b") == ["on (instance, model_name)"]
    assert clause_violations("sum by (cluster, instance) (x) and on (cluster, instance) y") == []
    assert clause_violations("sum without (cluster) (x)") == ["without (cluster)"]
    assert bare_aggregations("max(x)") == ["max("]
    assert bare_aggregations("max by (cluster) (x)") == []
    assert bare_aggregations("max(x) by (cluster)") == []
    assert bare_aggregations("max_over_time(x[5m])") == []


@pytest.mark.parametrize("directory", [S.rules_dir, S.vmalert_rules_dir],
                         ids=["prometheus", "vmalert"])
def test_every_generated_rule_keeps_cluster_in_its_by_and_on_clauses(directory):
    problems = []
    checked = 0
    for name, expr in _rules(directory):
        if name in rules.FLEET_WIDE_ALERTS:
            continue
        checked += 1
        for bad in clause_violations(expr) + bare_aggregations(expr):
            problems.append(f"{name}: {bad}")
    assert checked > 70, checked
    assert not problems, "\n".join(problems)


def test_the_fleet_wide_alerts_are_the_only_exceptions_and_exist():
    names = {name for name, _ in _rules(S.rules_dir)}
    assert set(rules.FLEET_WIDE_ALERTS) <= names
    exceptions = {name for name, expr in _rules(S.rules_dir)
                  if clause_violations(expr) or bare_aggregations(expr)}
    assert exceptions == set(rules.FLEET_WIDE_ALERTS)


def test_templated_queries_in_annotations_select_the_alerts_cluster():
    for path in sorted(S.rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for text in rule.get("annotations", {}).values():
                    for query in re.findall(r"printf `([^`]*)`", text):
                        assert "cluster=%q" in query, (rule["alert"], query)


def test_dashboard_links_of_alerts_carry_the_cluster_and_host():
    for path in sorted(S.rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    link = rule["annotations"]["dashboard"]
                    assert link.endswith(rules.DASHBOARD_FLEET_VARS), rule["alert"]
    assert "var-cluster={{ . | urlquery }}" in rules.DASHBOARD_FLEET_VARS
    assert "var-host=" in rules.DASHBOARD_FLEET_VARS


def test_fleet_rule_test_exists_and_uses_two_clusters_with_one_instance():
    spec = yaml.safe_load((ROOT / "tests/rules/fleet_test.yml").read_text())
    series = [s["series"] for test in spec["tests"] for s in test["input_series"]]
    clusters = set(re.findall(r'cluster="([^"]+)"', "\n".join(series)))
    assert len(clusters) >= 2
    shared = [inst for inst in set(re.findall(r'instance="([^"]+)"', "\n".join(series)))
              if all(f'cluster="{c}"' in s for c in clusters for s in series
                     if f'instance="{inst}"' in s and f'cluster="{c}"' in s)]
    assert shared
