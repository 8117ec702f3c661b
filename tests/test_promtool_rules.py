"""The shipped Prometheus rules, checked by promtool and by a lint of their own.

- `promtool check rules` on prometheus/rules/*.yml;
- `promtool test rules` on every tests/rules/*_test.yml (one test per file: 2.42 has no --run);
- coverage: every alert fires in some alert_rule_test entry and stays silent in another;
- the test files' shape: `interval:` in every group (2.42 puts every sample at t=0 without it), all
  rule files loaded, every group in group_eval_order (otherwise promtool evaluates groups at random
  and alerts may read the previous evaluation's recording rules);
- a lint the mixins' tools (pint, dashboard-linter) would do: severity, annotations, runbook anchor,
  for:, counters only under rate/increase/resets, histogram_quantile aggregations keep `le`.
"""

import functools
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sglang_obs.render import rules

from conftest import ROOT, require_binary
from promql_text import innermost_call as _innermost_call
from promql_text import paren_owners as _paren_owners
from promql_text import quantile_violations
from promql_text import strip_strings as _strip_strings

RULES_DIR = ROOT / "prometheus" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
ALERT_FILES = sorted(RULES_DIR.glob("*.alerts.yml"))
TESTS_DIR = Path(__file__).parent / "rules"
TEST_FILES = sorted(TESTS_DIR.glob("*_test.yml"))

SEVERITIES = {"critical", "warning", "info", "none"}
REQUIRED_ANNOTATIONS = ("summary", "description", "runbook_url", "dashboard")
# Always firing by design: no input can make them silent.
ALWAYS_FIRING = {"Watchdog": "dead man's switch, expr vector(1)"}
# Alerts allowed to fire without a for: (each with the reason, as in a .lint exclusions file).
ZERO_FOR_ALLOWED = {
    "Watchdog": "always firing",
    "SGLangContainerRestarting": "increase() over 15m already spans the restarts",
    "SGLangOOMKilled": "an event counter: one kill is the whole event",
    "SGLangLongQueueing": "the signal is itself a duration (queue non-empty that long)",
    "GPULost": "windows over its signals (every read in 15 s, the collector for 30 s) are "
               "its sustain",
    "GPUUncorrectableECC": "an event counter: one uncorrectable error is the whole event",
    "GPURowRemapFailure": "a latched hardware flag",
    "SGLangShipperDroppingData": "an event counter: one dropped block is a permanent gap",
}
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}


@functools.cache  # parsed once per session; callers only read it
def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _rules(paths) -> list[dict]:
    return [rule for path in paths for group in _load(path)["groups"] for rule in group["rules"]]


def _alerts() -> list[dict]:
    return [rule for rule in _rules(ALERT_FILES) if "alert" in rule]


def _alert_names() -> set[str]:
    return {rule["alert"] for rule in _alerts()}


def _group_names() -> list[str]:
    return [group["name"] for path in RULE_FILES for group in _load(path)["groups"]]


def _recording_groups() -> set[str]:
    return {group["name"] for path in RULE_FILES for group in _load(path)["groups"]
            if any("record" in rule for rule in group["rules"])}


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", str(text))
    assert parts, f"bad duration {text!r}"
    assert "".join(n + u for n, u in parts) == str(text), f"bad duration {text!r}"
    return sum(int(n) * units[u] for n, u in parts)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    # pd_test.yml alone takes 110 s of a core: far more with every core busy
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)


# --- promtool ---------------------------------------------------------------------------------


def test_promtool_check_rules():
    promtool = require_binary("promtool")
    assert RULE_FILES, "no rule files under prometheus/rules"
    result = _run([promtool, "check", "rules", "--lint=all", "--lint-fatal",
                   *map(str, RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # promtool evaluates every rule over each file's series: 15-60 s a file
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_promtool_unit_tests(test_file):
    promtool = require_binary("promtool")
    result = _run([promtool, "test", "rules", str(test_file)])
    assert result.returncode == 0, (
        f"promtool test rules {test_file.relative_to(ROOT)} failed:\n"
        + result.stdout + result.stderr)


# --- the test files -------------------------------------------------------------------------


def test_rule_test_files_exist_by_area():
    names = {path.name for path in TEST_FILES}
    assert {"availability_test.yml", "saturation_test.yml", "slo_test.yml", "gpu_test.yml",
            "meta_test.yml"} <= names


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_rule_test_file_shape(test_file):
    spec = _load(test_file)
    loaded = {(test_file.parent / path).resolve() for path in spec["rule_files"]}
    assert loaded == {path.resolve() for path in RULE_FILES}, (
        "load every rule file, so recording rules and all alerts are there")
    assert spec.get("evaluation_interval") in ("15s", "30s")
    order = spec.get("group_eval_order") or []
    assert sorted(order) == sorted(_group_names()), (
        f"group_eval_order must list every rule group once: {_group_names()}")
    recording = [i for i, name in enumerate(order) if name in _recording_groups()]
    alerting = [i for i, name in enumerate(order) if name not in _recording_groups()]
    assert max(recording) < min(alerting), "recording groups must come before alert groups"
    for group in spec["tests"]:
        assert group.get("interval"), f"{group.get('name')}: promtool 2.42 needs interval:"


def test_every_alert_fires_and_stays_silent_in_some_test():
    fires: dict[str, list[str]] = {}
    silent: dict[str, list[str]] = {}
    names = _alert_names()
    annotation_keys = {rule["alert"]: set(rule.get("annotations", {})) for rule in _alerts()}
    for test_file in TEST_FILES:
        for group in _load(test_file)["tests"]:
            for case in group.get("alert_rule_test") or []:
                name = case["alertname"]
                where = f"{test_file.name}: {group.get('name', '?')} @ {case['eval_time']}"
                assert name in names, f"{where}: unknown alert {name}"
                expected = case.get("exp_alerts") or []
                (fires if expected else silent).setdefault(name, []).append(where)
                for alert in expected:
                    assert alert.get("exp_labels", {}).get("severity"), (
                        f"{where}: give the full exp_labels, severity included")
                    assert set(alert.get("exp_annotations", {})) == annotation_keys[name], (
                        f"{where}: give every annotation, to test the templates")
    never_fired = sorted(names - set(fires))
    never_silent = sorted(names - set(silent) - set(ALWAYS_FIRING))
    assert not never_fired, f"alerts no test makes fire: {never_fired}"
    assert not never_silent, f"alerts no test checks silent: {never_silent}"


# --- lint of the alert rules ------------------------------------------------------------------


@pytest.mark.parametrize("alert", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_lint(alert):
    name = alert["alert"]
    assert re.fullmatch(r"(SGLang|GPU)[A-Z][A-Za-z0-9]+|Watchdog", name), name
    assert alert.get("labels", {}).get("severity") in SEVERITIES
    annotations = alert.get("annotations", {})
    for key in REQUIRED_ANNOTATIONS:
        assert annotations.get(key, "").strip(), f"{name}: annotation {key} missing"
    summary = annotations["summary"]
    assert summary[0].isupper(), f"{name}: summary {summary!r} must start with a capital"
    assert summary.endswith("."), f"{name}: summary {summary!r} must end with a period"
    assert "{{" not in summary, f"{name}: summary must be static (grouped notifications)"
    assert annotations["runbook_url"].endswith("#" + name.lower()), annotations["runbook_url"]
    assert annotations["dashboard"].startswith("http"), annotations["dashboard"]
    assert "for" in alert, f"{name}: write for: explicitly"
    if _duration_seconds(alert["for"]) == 0:
        assert name in ZERO_FOR_ALLOWED, f"{name}: threshold alert without for:"


def test_zero_for_allowlist_is_current():
    zero_for = {rule["alert"] for rule in _alerts() if _duration_seconds(rule["for"]) == 0}
    assert set(ZERO_FOR_ALLOWED) <= zero_for | set(ALWAYS_FIRING), (
        f"stale ZERO_FOR_ALLOWED entries: {sorted(set(ZERO_FOR_ALLOWED) - zero_for)}")



def _selector_spans(expr: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\{[^}]*\}", expr)]


def _all_rule_exprs() -> list[tuple[str, str]]:
    return [(rule.get("alert") or rule["record"], rule["expr"]) for rule in _rules(RULE_FILES)]


# Rules that read a counter's raw value on purpose, with the reason.
RAW_COUNTER_READS = {
    # A counter SGLang creates at its first retraction, already counting it: increase() sees
    # nothing, so a young series is counted from zero (min_over_time, unless ... offset).
    rules.retractions_record(rules.inputs()),
}


@pytest.mark.parametrize(("rule_name", "expr"), _all_rule_exprs(),
                         ids=[f"{i}-{name}" for i, (name, _) in enumerate(_all_rule_exprs())])
def test_counters_only_under_rate_increase_resets(rule_name, expr):
    if rule_name in RAW_COUNTER_READS:
        assert "increase(" in expr
        return
    clean = _strip_strings(expr)
    pairs = _paren_owners(clean)
    selectors = _selector_spans(clean)
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*_total\b", clean):
        if any(start < match.start() < end for start, end in selectors):
            continue  # a label name inside a selector
        owner = _innermost_call(pairs, match.start())
        assert owner in COUNTER_FUNCTIONS, (
            f"{rule_name}: counter {match.group()} used under {owner or 'nothing'}(), "
            "not rate/increase/resets")



@pytest.mark.parametrize(("rule_name", "expr"), _all_rule_exprs(),
                         ids=[f"{i}-{name}" for i, (name, _) in enumerate(_all_rule_exprs())])
def test_histogram_quantile_keeps_le(rule_name, expr):
    assert not quantile_violations(expr), f"{rule_name}: {quantile_violations(expr)}"


def test_lint_helpers_catch_bad_expressions():
    """The lint above must reject what it is meant to reject."""
    pairs = _paren_owners(_strip_strings('sum(sglang:num_requests_total{job="x"})'))
    assert _innermost_call(pairs, 5) == "sum"
    bad_quantiles = [
        "histogram_quantile(0.9, sum by (instance) (rate(x_bucket[5m])))",
        "histogram_quantile(0.9, sum(rate(x_bucket[5m])))",
        "histogram_quantile(0.9, sum(rate(x_bucket[5m])) by (job))",
        "histogram_quantile(0.9, sum without (le) (rate(x_bucket[5m])))",
    ]
    for expr in bad_quantiles:
        with pytest.raises(AssertionError):
            test_histogram_quantile_keeps_le("bad", expr)
    test_histogram_quantile_keeps_le(
        "good", "histogram_quantile(0.9, sum(rate(x_bucket[5m])) by (job, le))")
    with pytest.raises(AssertionError):
        test_counters_only_under_rate_increase_resets(
            "bad", 'max by (instance) (sglang:num_requests_total{job="sglang"})')
    test_counters_only_under_rate_increase_resets(
        "good", 'sum by (instance) (rate(sglang:num_requests_total{job="sglang"}[5m])) > 0')
