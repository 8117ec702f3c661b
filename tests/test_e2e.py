"""End to end, the way on-call meets it: simulator (seed 000 incident and a healthy server) →
exporter → real Prometheus with the shipped rules → real Alertmanager → alert sink.

Runs the native stack (`sglang-obs stack up --native`) with prometheus/override.fast.yml
(5 s scrape and evaluation); the rules, their thresholds and for: durations are the shipped
ones. Takes about four minutes.
"""

import json
import time
import urllib.request

import pytest

from sglang_obs.tools.stack import NativeStack

from conftest import ROOT, require_binary
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

INCIDENT, HEALTHY = "sglang-sim-0", "sglang-sim-1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_binary("prometheus")
    require_binary("promtool")
    require_binary("amtool")
    stack = NativeStack(tmp_path_factory.mktemp("stack"),
                        demo=["long-context-incident", "healthy"],
                        override=ROOT / "prometheus/override.fast.yml",
                        demo_start_at=110.0)  # the incident's backlog starts at 165 s
    stack.prepare()
    stack.start()
    yield stack
    stack.stop()


def received(stack):
    with urllib.request.urlopen(stack.url("alert-sink") + "/alerts", timeout=5) as resp:
        return json.load(resp)


def wait_received(stack, predicate, timeout):
    """The alerts the sink received that match `predicate`, once there are any ([] if none
    within `timeout`)."""
    return wait_for(lambda: [a for a in received(stack) if predicate(a)], timeout, interval=2)


def instance(stack, name):
    return f"127.0.0.1:{stack.ports[name]}"


def test_incident_pages_prefill_backlog_to_the_ticket_queue_with_links(stack):
    incident = instance(stack, INCIDENT)
    found = wait_received(stack, lambda a: a["labels"]["alertname"] == "SGLangPrefillBacklog"
                     and a["status"] == "firing", timeout=240)
    assert found, received(stack)
    alert = found[0]
    assert alert["receiver"] == "ticket"  # a warning: routed by severity
    assert alert["labels"]["instance"] == incident
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("#sglangprefillbacklog")
    assert alert["annotations"]["dashboard"].endswith("/d/sglang-overview")
    assert "prefill_backlog" in alert["annotations"]["description"]
    assert wait_received(stack, lambda a: a["labels"]["alertname"] == "Watchdog"
                    and a["receiver"] == "deadman", timeout=30)


def test_the_healthy_server_pages_nothing(stack):
    healthy = instance(stack, HEALTHY)
    pages = [a for a in received(stack) if a["labels"].get("instance") == healthy]
    assert pages == []


def test_killing_the_server_pages_server_down_and_silences_its_saturation_alerts(stack):
    incident = instance(stack, INCIDENT)
    stack.stop_component(INCIDENT)
    killed_at = time.monotonic()
    found = wait_received(stack, lambda a: a["labels"]["alertname"] == "SGLangServerDown"
                     and a["labels"]["instance"] == incident, timeout=150)
    assert found, received(stack)
    assert found[0]["receiver"] == "pager"
    assert time.monotonic() - killed_at < 150
    with urllib.request.urlopen(stack.url("alertmanager") + "/api/v2/alerts", timeout=5) as r:
        alerts = json.load(r)
    saturation = [a for a in alerts if a["labels"].get("instance") == incident
                  and a["labels"]["alertname"] not in ("SGLangServerDown", "Watchdog")]
    assert all(a["status"]["state"] == "suppressed" for a in saturation), saturation
