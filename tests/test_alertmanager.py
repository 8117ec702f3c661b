"""alertmanager/alertmanager.yml: amtool checks, routing, and inhibition on a live Alertmanager
that delivers to the bundled alert sink."""

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from sglang_obs.tools.alert_delivery import seconds
from sglang_obs.tools.alert_sink import AlertSink

from conftest import ROOT, require_binary
from helpers import free_port, wait_for

CONFIG = ROOT / "alertmanager" / "alertmanager.yml"


def test_amtool_accepts_the_config():
    amtool = require_binary("amtool")
    result = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("labels", "receiver"), [
    (["alertname=SGLangServerDown", "severity=critical", "instance=a:30000"], "pager"),
    (["alertname=SGLangPrefillBacklog", "severity=warning", "instance=a:30000"], "ticket"),
    (["alertname=GPUXidCritical", "severity=critical", "gpu=0"], "pager"),
    (["alertname=Watchdog", "severity=none"], "deadman"),
    (["alertname=SomethingInformative", "severity=info"], "blackhole"),
])
def test_routes_send_each_severity_to_its_receiver(labels, receiver):
    amtool = require_binary("amtool")
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={CONFIG}",
         f"--verify.receivers={receiver}", *labels], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def start_alertmanager(tmp_path, sink, adjust):
    """A real Alertmanager with the shipped config, receivers pointed at `sink`, each route
    (the top one first) passed to `adjust`; (process, URL) once it is ready."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        require_binary("prometheus-alertmanager")
    text = CONFIG.read_text().replace("http://alert-sink:9095", f"http://127.0.0.1:{sink.port}")
    config = yaml.safe_load(text)
    for route in [config["route"], *config["route"]["routes"]]:
        adjust(route)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={path}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "am.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                break
        assert proc.poll() is None, (tmp_path / "am.log").read_text()
        assert time.monotonic() < deadline, "alertmanager did not become ready"
        time.sleep(0.1)
    return proc, url


@pytest.fixture
def live(tmp_path):
    """A real Alertmanager with the shipped config, receivers pointed at a local alert sink
    and group timings shortened; nothing else changed."""
    sink = AlertSink("127.0.0.1", 0, [])
    sink.start()
    proc, url = start_alertmanager(
        tmp_path, sink, lambda route: route.update(group_wait="0s", group_interval="1s"))
    yield url, sink
    proc.terminate()
    proc.wait(timeout=10)
    sink.stop()


def post(url, *alerts):
    body = json.dumps([{"labels": labels, "annotations": {"summary": "test."}}
                       for labels in alerts]).encode()
    request = urllib.request.Request(url + "/api/v2/alerts", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(request, timeout=5).status == 200


def states(url):
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as resp:
        alerts = json.load(resp)
    return {(a["labels"]["alertname"], a["labels"].get("instance", ""), a["labels"]
             .get("gpu", ""), a["labels"]["severity"]): a["status"] for a in alerts}


def test_cause_silences_symptoms_on_the_same_server_only(live):
    url, _ = live
    post(url,
         {"alertname": "SGLangServerDown", "severity": "critical", "instance": "a:30000"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangTTFTBudgetBurn", "severity": "critical", "instance": "a:30000",
          "model_name": "m", "slo": "ttft", "long": "1h", "short": "5m"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "b:30000"},
         {"alertname": "SGLangLongQueueing", "severity": "critical", "instance": "b:30000"},
         {"alertname": "SGLangLongQueueing", "severity": "warning", "instance": "b:30000"},
         {"alertname": "GPULost", "severity": "critical", "instance": "h:9840", "gpu": "0"},
         {"alertname": "GPUThermalThrottling", "severity": "warning", "instance": "h:9840",
          "gpu": "0"},
         {"alertname": "GPUThermalThrottling", "severity": "warning", "instance": "h:9840",
          "gpu": "1"})
    assert wait_for(lambda: len(states(url)) == 9, 15, interval=0.2)
    assert wait_for(lambda: states(url)[("SGLangPrefillBacklog", "a:30000", "", "warning")][
        "state"] == "suppressed", 15, interval=0.2)
    s = states(url)
    assert s[("SGLangPrefillBacklog", "a:30000", "", "warning")]["inhibitedBy"]
    assert s[("SGLangTTFTBudgetBurn", "a:30000", "", "critical")]["state"] == "suppressed"
    assert s[("SGLangServerDown", "a:30000", "", "critical")]["state"] == "active"
    assert s[("SGLangPrefillBacklog", "b:30000", "", "warning")]["state"] == "active"
    assert s[("SGLangLongQueueing", "b:30000", "", "warning")]["state"] == "suppressed"
    # b's prefill backlog explains its queueing, at either severity
    assert s[("SGLangLongQueueing", "b:30000", "", "critical")]["state"] == "suppressed"
    assert s[("GPUThermalThrottling", "h:9840", "0", "warning")]["state"] == "suppressed"
    assert s[("GPUThermalThrottling", "h:9840", "1", "warning")]["state"] == "active"


def test_a_state_silences_its_symptoms_and_a_lost_gpu_its_server_on_the_same_host(live):
    url, _ = live
    post(url,
         {"alertname": "SGLangKVCachePressure", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangLongQueueing", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangTTFTBudgetBurn", "severity": "critical", "instance": "a:30000",
          "model_name": "m", "slo": "ttft", "long": "1h", "short": "5m"},
         {"alertname": "SGLangLongQueueing", "severity": "warning", "instance": "b:30000"},
         {"alertname": "GPULost", "severity": "critical", "instance": "h1:9840", "host": "h1:9840",
          "gpu": "1"},
         {"alertname": "GPUXidCritical", "severity": "critical", "instance": "h1:9840",
          "host": "h1:9840", "gpu": "1", "xid": "79"},
         {"alertname": "SGLangServerDown", "severity": "critical", "instance": "a:30000",
          "host": "h1:9840"},
         {"alertname": "SGLangServerDown", "severity": "critical", "instance": "c:30000",
          "host": "h2:9840"})
    assert wait_for(lambda: len(states(url)) == 8, 15, interval=0.2)
    assert wait_for(lambda: states(url)[("SGLangLongQueueing", "a:30000", "", "warning")][
        "state"] == "suppressed", 15, interval=0.2)
    s = states(url)
    assert s[("SGLangTTFTBudgetBurn", "a:30000", "", "critical")]["state"] == "suppressed"
    assert s[("SGLangLongQueueing", "b:30000", "", "warning")]["state"] == "active"
    assert s[("SGLangServerDown", "a:30000", "", "critical")]["state"] == "suppressed"
    assert s[("GPUXidCritical", "h1:9840", "1", "critical")]["state"] == "suppressed"
    assert s[("SGLangServerDown", "c:30000", "", "critical")]["state"] == "active"
    assert s[("GPULost", "h1:9840", "1", "critical")]["state"] == "active"


@pytest.mark.slow  # waits for deliveries
def test_one_server_s_alerts_arrive_as_one_notification(live):
    url, sink = live
    post(url,
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangRequestErrors", "severity": "warning", "instance": "a:30000",
          "model_name": "m"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "b:30000"})
    assert wait_for(lambda: len([e for e in sink.received
                                 if e["labels"]["alertname"] != "Watchdog"]) >= 3, 20)
    time.sleep(2)
    # A later flush of a group repeats what it already sent: the sink marks those lines.
    got = [e for e in sink.received if e["labels"]["alertname"] != "Watchdog"
           and not e.get("duplicate")]
    by_server = {}
    for e in got:
        by_server.setdefault(e["labels"]["instance"], set()).add((e["notification"], e["group"]))
    assert len(by_server["a:30000"]) == 1  # both of a's alerts in one notification
    assert len(by_server["b:30000"]) == 1
    assert by_server["a:30000"] != by_server["b:30000"]


def test_a_stalled_poller_silences_the_state_alerts_of_its_server_only(live):
    url, _ = live
    post(url,
         {"alertname": "SGLangExporterPollerStalled", "severity": "warning",
          "instance": "a:30000"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangLongQueueing", "severity": "warning", "instance": "a:30000"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "b:30000"},
         {"alertname": "SGLangExporterPollerStalled", "severity": "warning",
          "instance": "c:30000"},
         {"alertname": "SGLangServerDown", "severity": "critical", "instance": "c:30000"},
         # The SLO alerts read SGLang's own series: a stalled exporter does not silence them.
         {"alertname": "SGLangExporterPollerStalled", "severity": "warning",
          "instance": "d:30000"},
         {"alertname": "SGLangTTFTBudgetBurn", "severity": "warning", "instance": "d:30000",
          "model_name": "m", "slo": "ttft", "long": "1d", "short": "2h"})
    assert wait_for(lambda: len(states(url)) == 8, 15, interval=0.2)
    assert wait_for(lambda: states(url)[("SGLangPrefillBacklog", "a:30000", "", "warning")][
        "state"] == "suppressed", 15, interval=0.2)
    s = states(url)
    assert s[("SGLangLongQueueing", "a:30000", "", "warning")]["state"] == "suppressed"
    assert s[("SGLangExporterPollerStalled", "a:30000", "", "warning")]["state"] == "active"
    assert s[("SGLangTTFTBudgetBurn", "d:30000", "", "warning")]["state"] == "active"
    assert s[("SGLangPrefillBacklog", "b:30000", "", "warning")]["state"] == "active"
    assert s[("SGLangServerDown", "c:30000", "", "critical")]["state"] == "active"


@pytest.mark.slow  # waits for deliveries, then 2 s more
def test_notifications_reach_the_sink_by_severity_and_watchdog_reaches_the_deadman(live):
    url, sink = live
    post(url,
         {"alertname": "Watchdog", "severity": "none"},
         {"alertname": "SGLangServerDown", "severity": "critical", "instance": "a:30000"},
         {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "b:30000"},
         {"alertname": "SomethingInformative", "severity": "info", "instance": "b:30000"})

    def delivered():
        return {(a["receiver"], a["labels"]["alertname"]) for a in sink.received}

    assert wait_for(lambda: len(delivered()) >= 3, 15, interval=0.2)
    time.sleep(2)  # anything else that was going to arrive has arrived
    assert delivered() == {("deadman", "Watchdog"), ("pager", "SGLangServerDown"),
                           ("ticket", "SGLangPrefillBacklog")}


def _scaled(duration: str, factor: float) -> str:
    return f"{round(seconds(duration, 0) * 1000 * factor)}ms"


@pytest.mark.slow  # watches 6 heartbeats
def test_the_watchdog_heartbeat_arrives_at_one_regular_gap(tmp_path):
    """A dead-man receiver is set up with one expected gap: every heartbeat must come one
    group_interval after the last (Alertmanager checks repeat_interval only at a group's
    flushes, so repeat_interval = group_interval skipped every other flush: gaps of 60/120 s).
    The Watchdog route's timings run 20 times faster here; nothing else changes."""
    shipped = next(r for r in yaml.safe_load(CONFIG.read_text())["route"]["routes"]
                   if r["matchers"] == ['alertname="Watchdog"'])
    factor = 1 / 20
    gap = seconds(shipped["group_interval"], 0) * factor

    def faster(route):
        if route.get("matchers") == ['alertname="Watchdog"']:
            route.update({k: _scaled(route[k], factor)
                          for k in ("group_wait", "group_interval", "repeat_interval")})

    sink = AlertSink("127.0.0.1", 0, [])
    sink.start()
    proc, url = start_alertmanager(tmp_path, sink, faster)
    try:
        post(url, {"alertname": "Watchdog", "severity": "none"})
        beats = wait_for(lambda: (b := [e["time"] for e in sink.received
                                        if e["labels"]["alertname"] == "Watchdog"])[6:] and b,
                         gap * 14, interval=0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        sink.stop()
    gaps = [b - a for a, b in zip(beats, beats[1:], strict=False)]
    print(f"expected gap {gap:.2f} s; gaps " + ", ".join(f"{g:.2f}" for g in gaps))
    assert len(gaps) >= 6, f"{len(beats)} heartbeats in {gap * 14:.0f} s: {gaps}"
    assert all(abs(g - gap) < gap / 4 for g in gaps), gaps


@pytest.mark.slow  # waits for three deliveries
def test_a_resolved_alert_that_a_group_sends_again_is_logged_as_a_duplicate(live):
    """Alertmanager sends a group's whole state each time, and Prometheus re-sends a resolved
    alert for 15 minutes, so the group's next notification carries that "resolved" again. The
    sink logs it, marked as a duplicate: a reader counting events counts it once."""
    url, sink = live
    a = {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "a:30000"}
    b = {"alertname": "SGLangDecodeContention", "severity": "warning", "instance": "a:30000"}

    def lines(name, status):
        return [e for e in sink.received
                if e["labels"]["alertname"] == name and e["status"] == status]

    # As Prometheus sends them: every post of an alert carries its activeAt as startsAt
    # (without one Alertmanager takes the time it is sent, or its endsAt, and a re-sent
    # "resolved" would be a new alert whenever the posts straddle a second).
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    post_ended(url, None, a, b, starts_at=started)
    assert wait_for(lambda: lines(b["alertname"], "firing"), 15, interval=0.1)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    post_ended(url, now, a, starts_at=started)  # the backlog is over: its "resolved"; b fires
    assert wait_for(lambda: lines(a["alertname"], "resolved"), 15, interval=0.1)
    post_ended(url, now, a, b, starts_at=started)  # a's "resolved" again; b is over too
    assert wait_for(lambda: lines(b["alertname"], "resolved"), 15, interval=0.1)
    time.sleep(2)  # a flush that was going to come has come
    resolved = lines(a["alertname"], "resolved")
    print(json.dumps(resolved, indent=1))
    assert len(resolved) == 2, resolved  # Alertmanager did deliver it twice...
    assert [e.get("duplicate", False) for e in resolved] == [False, True]  # ...one event
    assert [e.get("duplicate", False) for e in lines(b["alertname"], "resolved")] == [False]
    firing_b = lines(b["alertname"], "firing")  # in the first and the second notification
    assert [e.get("duplicate", False) for e in firing_b] == [False] + [True] * (
        len(firing_b) - 1)


def post_ended(url, ends_at, *alerts, starts_at=None):
    """Posts `alerts` ended at `ends_at` (None: firing), started at `starts_at` if given."""
    times = {"endsAt": ends_at} if ends_at else {}
    if starts_at:
        times["startsAt"] = starts_at
    body = json.dumps([{"labels": labels, "annotations": {"summary": "test."}, **times}
                       for labels in alerts]).encode()
    request = urllib.request.Request(url + "/api/v2/alerts", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(request, timeout=5).status == 200
