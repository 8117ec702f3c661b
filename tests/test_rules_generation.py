"""Generated rule files and the detection table are current, and meet their targets."""

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.generate import detection
from sglang_obs.render import rules
from sglang_obs.tools.alert_sink import AlertSink

from conftest import ROOT, require_binary
from helpers import rendered

S = _settings()  # the checkout's configuration, read once


def test_rule_files_are_generated_from_thresholds_yml():
    stale = [str(p) for p, text in rules.rule_files(rules.inputs()).items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale (run make generate): {stale}"


def test_promtool_accepts_the_shipped_prometheus_config_and_its_rules():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "config", str(ROOT / "prometheus/prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rule files found" in result.stdout


def test_every_threshold_in_the_yaml_reaches_the_rules():
    t = rules.inputs()
    text = "".join(rules.rule_files(t).values())
    for section in ("classification", "alerts"):
        for key, value in t[section].items():
            assert str(value) in text, f"{section}.{key}={value} is not used by any rule"


def _finite_alternatives(pattern: str) -> set[str]:
    """The names an anchored regex of literals, groups and | matches; anything open-ended (., *,
    classes...) fails, since then no list of alert names could be checked against it."""

    def alternation(i: int) -> tuple[set[str], int]:
        names, i = sequence(i)
        while i < len(pattern) and pattern[i] == "|":
            more, i = sequence(i + 1)
            names |= more
        return names, i

    def sequence(i: int) -> tuple[set[str], int]:
        names = {""}
        while i < len(pattern) and pattern[i] not in "|)":
            if pattern[i] == "(":
                i += 3 if pattern.startswith("(?:", i) else 1
                part, i = alternation(i)
                assert pattern[i:i + 1] == ")", f"unbalanced ( in {pattern!r}"
            elif pattern[i] in ".*+?[]{}^$\\":
                pytest.fail(f"{pattern!r}: {pattern[i]!r} makes the set of names open-ended")
            else:
                part = {pattern[i]}
            i += 1
            names = {n + p for n in names for p in part}
        return names, i

    names, end = alternation(0)
    assert end == len(pattern), f"unbalanced ) in {pattern!r}"
    return names


def test_finite_alternatives_expands_groups():
    assert _finite_alternatives("A") == {"A"}
    assert _finite_alternatives("A|B") == {"A", "B"}
    assert _finite_alternatives("X(A|B(?:C|D))Y") == {"XAY", "XBCY", "XBDY"}


_MATCHER = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(\S*))\s*')


def _alertname_matchers(config: dict) -> list[tuple[str, str]]:
    """(operator, value) of every alertname matcher in the routes and the inhibit rules."""
    found = []

    def collect(matchers: list[str] | None, match: dict | None, match_re: dict | None) -> None:
        for text in matchers or []:
            m = _MATCHER.fullmatch(text)
            assert m, f"unparsed matcher {text!r}"
            if m[1] == "alertname":
                found.append((m[2], m[3] if m[3] is not None else m[4]))
        if "alertname" in (match or {}):
            found.append(("=", match["alertname"]))
        if "alertname" in (match_re or {}):
            found.append(("=~", match_re["alertname"]))

    def walk(route: dict) -> None:
        collect(route.get("matchers"), route.get("match"), route.get("match_re"))
        for child in route.get("routes", []):
            walk(child)

    walk(config["route"])
    for rule in config.get("inhibit_rules", []):
        for side in ("source", "target"):
            collect(rule.get(f"{side}_matchers"), rule.get(f"{side}_match"),
                    rule.get(f"{side}_match_re"))
    return found


def test_every_alertname_alertmanager_matches_is_a_generated_alert():
    generated = {rule["alert"] for path in S.rules_dir.glob("*.alerts.yml")
                 for group in yaml.safe_load(path.read_text())["groups"]
                 for rule in group["rules"] if "alert" in rule}
    config = yaml.safe_load((ROOT / "alertmanager/alertmanager.yml").read_text())
    matchers = _alertname_matchers(config)
    assert len(matchers) >= 6, matchers
    for op, value in matchers:
        names = _finite_alternatives(value) if op in ("=~", "!~") else {value}
        missing = sorted(names - generated)
        assert not missing, f"alertmanager.yml alertname{op}{value!r}: no such alert {missing}"


def test_state_codes_are_the_documented_order():
    text = (ROOT / "prometheus/rules/sglang.rules.yml").read_text()
    assert ("Codes: 0 unavailable, 1 idle, 2 healthy, 3 prefill_backlog, 4 decode_contention, "
            "5 kv_capacity, 6 scheduling_bottleneck.") in text


@pytest.fixture(scope="module")
def detections():
    require_binary("promtool")
    # The same renders as the ground-truth checks of test_simulator_scenarios.py: done once.
    step = detection.step_seconds(S)
    return ([detection.detect(name, S, rendered(name, step=step, poll_interval=5.0))
             for name in detection.scenarios.available()]
            + [detection.detect(name, S) for name in detection.pd_scenario.available()])


@pytest.mark.slow  # `detections`: every scenario rendered and evaluated by promtool (minutes)
def test_detection_table_is_current(detections):
    e2e = detection.load_e2e(S.docs_dir / detection.E2E_RESULTS)
    assert detection.markdown(detections, S, e2e) == (
        ROOT / "docs/detection.md").read_text(), "docs/detection.md is stale: run make generate"


@pytest.mark.slow
def test_every_fault_notifies_with_its_class_within_90_seconds(detections):
    """promtool's firing time plus the route's group_wait: the e2e run measures the rest."""
    budgets = detection.budgets(S)
    checked = 0
    for d in detections:
        for i, truth in enumerate(d.truth):
            if truth.cls in detection.CLASS_ALERT:
                latency = d.latency(i)
                assert latency is not None, (d.scenario, truth)
                wait = budgets[detection.CLASS_ALERT[truth.cls]].group_wait
                assert latency + wait <= detection.NOTIFY_WITHIN_SECONDS, (d.scenario, truth)
                checked += 1
    assert checked >= 9


@pytest.mark.slow
def test_every_fault_that_clears_is_resolved_within_the_budget(detections):
    """Resolved in Prometheus early enough that the group's next flush is within target."""
    budgets = detection.budgets(S)
    checked = 0
    for d in detections:
        for i, truth in enumerate(d.truth):
            if truth.cls in detection.CLASS_ALERT and truth.end < d.end - detection.step_seconds(S):
                resolved = d.resolved_after_clear(i)
                flush = budgets[detection.CLASS_ALERT[truth.cls]].group_interval
                assert resolved is not None, (d.scenario, truth, "still firing")
                assert resolved + flush <= detection.RESOLVE_WITHIN_SECONDS, (d.scenario, truth)
                checked += 1
    assert checked >= 8


@pytest.mark.slow
def test_healthy_and_idle_windows_fire_nothing(detections):
    quiet = [(d.scenario, t.cls, d.per_window[i]) for d in detections
             for i, t in enumerate(d.truth) if t.cls in detection.QUIET_CLASSES]
    assert len(quiet) >= 4
    assert all(not fired for _, _, fired in quiet), quiet
    assert any(d.pd for d in detections if d.scenario in {s for s, _, _ in quiet})
    idle = next(d for d in detections if d.scenario == "idle-preallocated")
    assert set(idle.first_fired) == {"Watchdog"}
    for name in detection.quiet_scenarios() + detection.quiet_scenarios(pd=True):
        d = next(d for d in detections if d.scenario == name)
        assert set(d.first_fired) == {"Watchdog"}, (name, d.first_fired)


@pytest.mark.slow
def test_each_sustain_is_longer_than_its_state_ever_holds_on_a_quiet_scenario(detections):
    budgets = detection.budgets(S)
    quiet = [d for d in detections if d.longest_runs]
    assert {d.scenario for d in quiet} == set(detection.quiet_scenarios()
                                              + detection.quiet_scenarios(pd=True))
    assert {s for d in quiet if d.pd for s in d.longest_runs} == set(
        detection.PD_GUARDED_STATES)
    alert_of = {"unavailable": "SGLangServerDown", **detection.CLASS_ALERT}
    for d in quiet:
        for state, run in d.longest_runs.items():
            held = (run - 1) * detection.step_seconds(S) if run else None
            assert run < detection.MAX_RUN, (d.scenario, state)
            assert held is None or held < budgets[alert_of[state]].sustain, (d.scenario, state)


@pytest.mark.slow
def test_each_pd_incident_notifies_with_its_own_alert_and_nothing_else(detections):
    """A PD deployment's incident is one notification: its state's alert, none of the
    per-server symptoms its state explains (docs/alerting.md)."""
    pd = [d for d in detections if d.pd]
    assert {d.scenario for d in pd} == set(detection.pd_scenario.available())
    assert {t.cls for d in pd for t in d.truth} >= set(detection.pd_rules.ALERTS)
    for d in pd:
        expected = {detection.CLASS_ALERT[t.cls] for t in d.truth
                    if t.cls in detection.CLASS_ALERT}
        assert set(d.first_fired) - detection.ALWAYS_FIRING == expected, d.scenario


@pytest.mark.slow
def test_the_pd_ttft_decomposition_closes_on_every_pd_scenario(detections):
    """Over the whole run and over each ground-truth window, the stages on the critical path
    explain the gateway's TTFT to within 10 %; the 1-min record is measured and shown."""
    pd = [d for d in detections if d.pd]
    for d in pd:
        values = [d.ttft_unexplained_run, *d.ttft_unexplained_windows]
        assert len(values) == len(d.truth) + 1
        assert all(v is not None and abs(v) <= detection.TTFT_UNEXPLAINED_RATIO
                   for v in values), (d.scenario, values)
        assert d.ttft_unexplained_minute_max is not None, d.scenario
    healthy = next(d for d in pd if d.scenario == "pd-healthy")
    assert healthy.ttft_unexplained_minute_max <= detection.TTFT_UNEXPLAINED_RATIO


def test_time_budget_is_read_from_the_shipped_files():
    b = detection.budgets(S)
    am = yaml.safe_load((ROOT / "alertmanager/alertmanager.yml").read_text())
    t = rules.inputs()
    assert b["SGLangDecodeContention"].sustain == detection.seconds(
        t["sustain"]["decode_contention"])
    ticket = next(r for r in am["route"]["routes"] if r["receiver"] == "ticket")
    assert b["SGLangPrefillBacklog"].group_wait == detection.seconds(ticket["group_wait"])
    for budget in b.values():
        assert budget.notify_worst <= detection.NOTIFY_WITHIN_SECONDS, budget
        assert budget.resolve_worst <= detection.RESOLVE_WITHIN_SECONDS, budget


def test_alert_sink_logs_alerts_and_rejects_junk(tmp_path):
    log = tmp_path / "alerts.jsonl"
    with log.open("a") as stream:
        sink = AlertSink("127.0.0.1", 0, [stream])
        sink.start()
        url = f"http://127.0.0.1:{sink.port}"
        payload = {"receiver": "pager", "status": "firing", "alerts": [
            {"status": "firing", "labels": {"alertname": "SGLangServerDown", "instance": "a"},
             "annotations": {"summary": "SGLang server is not answering."},
             "startsAt": "2026-11-29T10:00:00Z"}]}
        request = urllib.request.Request(url + "/pager", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(request, timeout=5).status == 200
        for junk in (b"not json", b'{"alerts": "x"}', b"[]"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url + "/pager", data=junk),
                                       timeout=5)
            assert err.value.code == 400
        summary = json.load(urllib.request.urlopen(url + "/", timeout=5))
        sink.stop()
    assert summary == {"received": {"pager": 1}, "rejected": 3,
                       "connections_closed_to_make_room": 0}
    [line] = log.read_text().splitlines()
    assert json.loads(line)["labels"]["alertname"] == "SGLangServerDown"


def test_alert_sink_cli_refuses_a_bad_listen_address():
    exe = str(Path(sys.executable).parent / "sglang-obs")
    result = subprocess.run([exe, "alert-sink", "--listen", "nowhere"], capture_output=True,
                            text=True, timeout=10)
    assert result.returncode == 2
    assert "expected host:port" in result.stderr


@pytest.mark.slow
def test_the_cache_hit_ratio_from_counters_is_the_truth_and_the_gauge_is_not(detections):
    """Every 5-min window with enough requests: the shipped counter ratio within one point of
    the simulated requests' own ratio; the per-batch gauge off by more on some scenario."""
    singles = [d for d in detections if not d.pd]
    gauge_off = []
    for d in singles:
        n, counters, gauge = detection.cache_errors(d)
        assert n == 0 or counters is not None, d.scenario
        if n:
            assert counters <= detection.CACHE_RATIO_WITHIN, (d.scenario, d.cache_windows)
        if gauge is not None and gauge > detection.CACHE_RATIO_WITHIN:
            gauge_off.append(d.scenario)
    assert sum(detection.cache_errors(d)[0] for d in singles) >= 20
    assert {"long-context-incident", "healthy"} <= set(gauge_off), gauge_off


@pytest.mark.slow
def test_the_hit_ratio_of_each_hicache_tier_from_counters_is_the_truth(detections):
    """With HiCache, the device and host tiers' ratios from the tokenizer's cached_tokens_total
    {cache_source} within one point of the simulated requests' own split, in every window."""
    tiered = [d for d in detections if d.tier_windows]
    assert [d.scenario for d in tiered] == ["hicache-host-drops"]
    for d in tiered:
        errors = detection.tier_errors(d)
        for tier, (_, _, error) in errors.items():
            assert error is not None, (tier, d.tier_windows)
            assert error <= detection.CACHE_RATIO_WITHIN, (tier, d.tier_windows)
        assert errors["host"][1] > 0.2, "the host tier serves hits in the scenario"
