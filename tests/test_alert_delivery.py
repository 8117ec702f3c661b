"""Which alerts that fired in Prometheus reached a receiver (sglang_obs.tools.alert_delivery):
Alertmanager's routing, group_wait and inhibition as the shipped alertmanager.yml sets them, and
the alert sink's log where there is one."""

import json
import subprocess
import urllib.request

import pytest
import yaml

from sglang_obs.core.times import iso
from sglang_obs.tools import alert_delivery as delivery
from sglang_obs.tools.snapshot import report

from conftest import ROOT, require_binary
from helpers import free_port, stop_process, wait_for

T0 = 1_800_000_000.0
SHIPPED = yaml.safe_load((ROOT / "alertmanager/alertmanager.yml").read_text())
GROUP_WAIT = delivery.seconds(SHIPPED["route"]["group_wait"], 0)


def alert(name, severity, *episodes, instance="sglang:30000"):
    labels = {"alertname": name, "severity": severity, "instance": instance}
    return {"alertname": name, "severity": severity, "labels": {"instance": instance},
            "all_labels": labels,
            "_episodes": [{"start": T0 + a, "end": T0 + b} for a, b in episodes]}


def judged(*alerts, log=None, window=(T0 - 600, T0 + 3600)):
    alerts = list(alerts)
    delivery.judge(alerts, delivery.AlertmanagerConfig.shipped(), *window, log=log)
    return {a["alertname"] if a["labels"]["instance"] == "sglang:30000"
            else (a["alertname"], a["labels"]["instance"]): a for a in alerts}


def test_the_shipped_routes_send_warnings_to_ticket_and_critical_to_pager():
    config = delivery.AlertmanagerConfig.shipped()
    assert config.route({"alertname": "X", "severity": "warning"}).receiver == "ticket"
    assert config.route({"alertname": "X", "severity": "critical"}).receiver == "pager"
    watchdog = config.route({"alertname": "Watchdog", "severity": "none"})
    assert watchdog.receiver == "deadman"
    assert watchdog.group_wait == 0
    assert not config.route({"alertname": "X", "severity": "info"}).has_configs


def test_an_alert_firing_for_less_than_group_wait_only_flickered():
    out = judged(alert("SGLangLongQueueing", "warning", (100, 100 + GROUP_WAIT / 2)),
                 alert("SGLangPrefillBacklog", "warning", (100, 100 + GROUP_WAIT + 60)))
    flicker, held = out["SGLangLongQueueing"], out["SGLangPrefillBacklog"]
    assert flicker["delivery"]["verdict"] == "flickered"
    assert flicker["delivery"]["source"] == "timing"
    assert held["delivery"]["verdict"] == "notified"
    assert held["delivery"]["receiver"] == "ticket"
    text = delivery.describe(flicker)
    assert "only flickered" in text
    assert f"group_wait of {GROUP_WAIT:g} s" in text


def test_a_symptom_of_a_down_server_is_inhibited():
    out = judged(alert("SGLangServerDown", "critical", (0, 600)),
                 alert("SGLangPrefillBacklog", "warning", (60, 400)),
                 alert("SGLangPrefillBacklog", "warning", (60, 400), instance="other:1"))
    assert out["SGLangServerDown"]["delivery"]["verdict"] == "notified"
    assert out["SGLangServerDown"]["delivery"]["receiver"] == "pager"
    backlog = out["SGLangPrefillBacklog"]
    assert backlog["delivery"]["verdict"] == "inhibited"
    assert "inhibited by SGLangServerDown" in delivery.describe(backlog)
    # the same alert of another server is not: the rule needs the same instance
    assert out[("SGLangPrefillBacklog", "other:1")]["delivery"]["verdict"] == "notified"


def test_an_alert_routed_to_blackhole_reaches_no_receiver_by_design():
    out = judged(alert("SGLangSomething", "info", (0, 600)))
    assert out["SGLangSomething"]["delivery"]["verdict"] == "not_routed"


def test_the_alert_sink_log_decides_where_it_covers_the_time():
    sent = {"time": T0 + 130, "receiver": "ticket", "status": "firing",
            "labels": {"alertname": "SGLangPrefillBacklog", "severity": "warning",
                       "instance": "sglang:30000"}}
    watchdog = [{"time": T0 + t, "receiver": "deadman", "status": "firing",
                 "labels": {"alertname": "Watchdog"}} for t in range(-600, 3600, 60)]
    out = judged(alert("SGLangPrefillBacklog", "warning", (100, 400)),
                 alert("SGLangDecodeContention", "warning", (100, 400)),
                 alert("SGLangLongQueueing", "warning", (100, 110)),
                 log=[sent, *watchdog])
    backlog = out["SGLangPrefillBacklog"]["delivery"]
    assert (backlog["verdict"], backlog["source"]) == ("notified", "alert-sink log")
    assert backlog["first_notified_at"] == T0 + 130
    contention = out["SGLangDecodeContention"]["delivery"]
    # long enough to have been sent, yet the receiver never got it: the log says so
    assert (contention["verdict"], contention["source"]) == ("not_notified", "alert-sink log")
    # the backlog explains the queueing of its own server
    assert out["SGLangLongQueueing"]["delivery"]["verdict"] == "inhibited"


def test_a_log_that_does_not_cover_the_alert_leaves_it_to_timing():
    early = [{"time": T0 - 3000, "receiver": "deadman", "status": "firing",
              "labels": {"alertname": "Watchdog"}}]
    out = judged(alert("SGLangPrefillBacklog", "warning", (100, 400)), log=early)
    assert out["SGLangPrefillBacklog"]["delivery"]["source"] == "timing"


def test_the_report_lists_reached_and_stopped_alerts_apart(tmp_path):
    alerts = judged(alert("SGLangPrefillBacklog", "warning", (100, 400)),
                    alert("SGLangLongQueueing", "warning", (100, 105), instance="other:1"))
    listed = []
    for a in alerts.values():
        a["description"] = delivery.describe(a)
        a["first_firing"] = a["last_firing"] = "2027-01-15T08:00:00Z"
        a["episodes"] = [{"from": iso(e["start"]), "to": iso(e["end"]), "seconds": e["seconds"],
                          "verdict": e["verdict"]} for e in a.pop("_episodes")]
        del a["all_labels"]
        listed.append(a)
    summary = {"window": {"from": "a", "to": "b"}, "servers": {}, "alerts": listed}
    text = report(summary, [])
    reached = text.index("**Reached a receiver:**")
    stopped = text.index("**Fired in Prometheus, reached no receiver:**")
    assert reached < text.index("SGLangPrefillBacklog (warning)") < stopped
    assert stopped < text.index("SGLangLongQueueing (warning)")
    assert "only flickered" in text.split("SGLangLongQueueing (warning)")[1]
    json.dumps(summary)  # what summary.json gets


@pytest.mark.slow  # a real Alertmanager
def test_a_running_alertmanager_gives_its_configuration_and_what_it_holds(tmp_path):
    binary = require_binary("prometheus-alertmanager")
    port = free_port()
    (tmp_path / "am.yml").write_text((ROOT / "alertmanager/alertmanager.yml").read_text())
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'am.yml'}",
                             f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _answers(url + "/-/ready"), 20)
        body = json.dumps([{"labels": {"alertname": "SGLangPrefillBacklog",
                                       "severity": "warning", "instance": "sglang:30000"}}])
        urllib.request.urlopen(urllib.request.Request(
            url + "/api/v2/alerts", data=body.encode(),
            headers={"Content-Type": "application/json"}), timeout=5)
        config, held = wait_for(lambda: (s := delivery.alertmanager_state(url))[1] and s, 10)
    finally:
        stop_process(proc)
    assert config.origin == f"the Alertmanager at {url}"
    assert config.route({"alertname": "X", "severity": "critical"}).receiver == "pager"
    alerts = [alert("SGLangPrefillBacklog", "warning", (100, 400))]
    delivery.judge(alerts, config, T0 - 600, T0 + 3600, held=held)
    now = alerts[0]["delivery"]["alertmanager"]
    assert now == {"state": "active", "inhibited_by": [], "silenced_by": [],
                   "receivers": ["ticket"]}
    assert "Alertmanager holds it now (active, receivers ticket)" in delivery.describe(alerts[0])


def _answers(url):
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except OSError:
        return False


def test_a_log_holding_the_alert_s_notifications_decides_each_episode_it_covers():
    """The log has the first episode's notifications and nothing else (no heartbeat around
    them): that episode reached the receiver by the log; the second, seven minutes later and
    past the log's end, is left to timing; the alert is notified, by the log."""
    labels = {"alertname": "SGLangPrefillBacklog", "severity": "warning",
              "instance": "sglang:30000"}
    log = [{"time": T0 + 130, "receiver": "ticket", "status": "firing", "labels": labels},
           {"time": T0 + 420, "receiver": "ticket", "status": "resolved", "labels": labels}]
    out = judged(alert("SGLangPrefillBacklog", "warning", (100, 400), (820, 1000)), log=log)
    backlog = out["SGLangPrefillBacklog"]
    assert (backlog["delivery"]["verdict"], backlog["delivery"]["source"]) == (
        "notified", "alert-sink log")
    assert backlog["delivery"]["first_notified_at"] == T0 + 130
    assert [e["verdict"] for e in backlog["_episodes"]] == ["notified", "notified"]
    # a log that covers the second episode and has nothing for it says so, for that episode
    log.append({"time": T0 + 1100, "receiver": "deadman", "status": "firing",
                "labels": {"alertname": "Watchdog"}})
    out = judged(alert("SGLangPrefillBacklog", "warning", (100, 400), (820, 1000)), log=log)
    assert [e["verdict"] for e in out["SGLangPrefillBacklog"]["_episodes"]] == [
        "notified", "not_notified"]
    assert out["SGLangPrefillBacklog"]["delivery"]["verdict"] == "notified"
