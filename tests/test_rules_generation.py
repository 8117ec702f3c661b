"""Generated rule files and the detection table are current, and meet their targets."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sglang_obs.generate import detection, rules
from sglang_obs.tools.alert_sink import AlertSink

from conftest import ROOT, require_binary
from helpers import rendered


def test_rule_files_are_generated_from_thresholds_yml():
    stale = [str(p) for p, text in rules.all_files().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale (run make generate): {stale}"


def test_promtool_accepts_the_shipped_prometheus_config_and_its_rules():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "config", str(ROOT / "prometheus/prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 3 rule files found" in result.stdout


def test_every_threshold_in_the_yaml_reaches_the_rules():
    t = rules.load_thresholds()
    text = "".join(rules.all_files(t).values())
    for section in ("classification", "alerts"):
        for key, value in t[section].items():
            assert str(value) in text, f"{section}.{key}={value} is not used by any rule"


def test_state_codes_are_the_documented_order():
    text = (ROOT / "prometheus/rules/sglang.rules.yml").read_text()
    assert ("Codes: 0 unavailable, 1 idle, 2 healthy, 3 prefill_backlog, 4 decode_contention, "
            "5 kv_capacity, 6 scheduling_bottleneck.") in text


@pytest.fixture(scope="module")
def detections():
    require_binary("promtool")
    # The same renders as the ground-truth checks of test_simulator_scenarios.py: done once.
    return [detection.detect(name, rendered(name, step=detection.STEP, poll_interval=5.0))
            for name in detection.scenarios.available()]


@pytest.mark.slow  # `detections`: every scenario rendered and evaluated by promtool (minutes)
def test_detection_table_is_current(detections):
    assert detection.markdown(detections) == (ROOT / "docs/detection.md").read_text(), (
        "docs/detection.md is stale: run make generate")


@pytest.mark.slow
def test_every_fault_is_paged_with_its_class_within_three_minutes(detections):
    checked = 0
    for d in detections:
        for i, truth in enumerate(d.truth):
            if truth.cls in detection.CLASS_ALERT:
                latency = d.latency(i)
                assert latency is not None, (d.scenario, truth)
                assert latency <= 180, (d.scenario, truth)
                checked += 1
    assert checked >= 8


@pytest.mark.slow
def test_healthy_and_idle_windows_fire_nothing(detections):
    quiet = [(d.scenario, t.cls, d.per_window[i]) for d in detections
             for i, t in enumerate(d.truth) if t.cls in detection.QUIET_CLASSES]
    assert len(quiet) >= 4
    assert all(not fired for _, _, fired in quiet), quiet
    idle = next(d for d in detections if d.scenario == "idle-preallocated")
    assert set(idle.first_fired) == {"Watchdog"}


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
    assert summary == {"received": {"pager": 1}, "rejected": 3}
    [line] = log.read_text().splitlines()
    assert json.loads(line)["labels"]["alertname"] == "SGLangServerDown"


def test_alert_sink_cli_refuses_a_bad_listen_address():
    exe = str(Path(sys.executable).parent / "sglang-obs")
    result = subprocess.run([exe, "alert-sink", "--listen", "nowhere"], capture_output=True,
                            text=True, timeout=10)
    assert result.returncode == 2
    assert "expected host:port" in result.stderr
