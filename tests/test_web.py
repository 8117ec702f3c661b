"""The exporter's HTTP side: the exposition is rendered once per change and served as bytes,
negotiated like prometheus_client's own app, by a bounded pool of workers."""

import gzip
import http.client
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.exporter.http_server import LISTEN_BACKLOG
from sglang_obs.exporter.web import Exposition, make_app, negotiate, serve

# What Prometheus 2.42 sends when it scrapes.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


class CountingCollector:
    """One gauge whose value is the number of times it was collected."""

    def __init__(self):
        self.collects = 0
        self.lock = threading.Lock()

    def collect(self):
        with self.lock:
            self.collects += 1
        family = GaugeMetricFamily("sglang_obs_test_value", "Test.", labels=["server"])
        family.add_metric(["a:1"], float(self.collects))
        yield family


@pytest.fixture
def served():
    collector = CountingCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    exposition = Exposition(registry)
    server = serve(make_app(exposition, "/metrics", ["http://a:1"]), "127.0.0.1:0")
    yield collector, exposition, registry, server.server_address[1]
    server.shutdown()
    server.server_close()


def get(port, path="/metrics", method="GET", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_concurrent_scrapes_of_one_state_render_it_once(served):
    collector, exposition, _, port = served
    exposition.changed()
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: get(port)[1], range(40)))
    assert collector.collects == 1
    assert len(set(answers)) == 1
    exposition.changed()
    assert b"sglang_obs_test_value{server=\"a:1\"} 2.0" in get(port)[1]
    assert collector.collects == 2


def test_prometheus_request_gets_gzipped_openmetrics_and_curl_plain_text(served):
    _, exposition, _, port = served
    exposition.changed()
    resp, body = get(port, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert resp.status == 200
    assert resp.getheader("Content-Encoding") == "gzip"
    assert resp.getheader("Content-Type").startswith("application/openmetrics-text")
    families = list(openmetrics_families(gzip.decompress(body).decode()))
    assert [(f.name, f.samples[0].value) for f in families] == [("sglang_obs_test_value", 1.0)]
    plain_resp, plain = get(port)
    assert plain_resp.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    assert plain_resp.getheader("Content-Encoding") is None
    families = {f.name for f in text_string_to_metric_families(plain.decode())}
    assert families == {"sglang_obs_test_value"}


def test_cached_bytes_equal_a_fresh_render_of_the_same_families():
    registry = CollectorRegistry()
    family = GaugeMetricFamily("sglang_obs_fixed", "Fixed.", labels=["server"])
    family.add_metric(["a:1"], 0.25)

    class Fixed:
        def collect(self):
            yield family

    registry.register(Fixed())
    exposition = Exposition(registry)
    assert exposition.body(False, False) == generate_latest(registry)
    assert exposition.body(True, False) == generate_openmetrics(registry)
    assert gzip.decompress(exposition.body(True, True)) == generate_openmetrics(registry)


@pytest.mark.parametrize(("accept", "encoding", "expected"), [
    (PROMETHEUS_ACCEPT, "gzip", (True, True)),
    ("text/plain;version=0.0.4", "", (False, False)),
    ("*/*", "deflate, gzip;q=1.0", (False, True)),
    ("", "gzipped", (False, False)),
])
def test_negotiation(accept, encoding, expected):
    assert negotiate(accept, encoding) == expected


def test_only_get_and_head_and_head_has_no_body(served):
    _, _, _, port = served
    resp, body = get(port, method="HEAD")
    assert resp.status == 200
    assert body == b""
    assert int(resp.getheader("Content-Length")) > 0
    for method in ("POST", "TRACE", "DELETE"):
        resp, _ = get(port, method=method)
        assert resp.status == 405
        assert resp.getheader("Allow") == "GET, HEAD"


def test_more_concurrent_clients_than_workers_are_all_answered(served):
    _, _, _, port = served
    assert LISTEN_BACKLOG >= 128
    with ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda _: get(port)[0].status, range(200)))
    assert statuses == [200] * 200


def test_scrapes_queued_behind_a_render_take_its_bytes_while_the_state_keeps_changing():
    class SlowCollector(CountingCollector):
        def collect(self):
            time.sleep(0.3)  # a render of many servers
            yield from super().collect()

    collector = SlowCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    exposition = Exposition(registry)
    stop = threading.Event()

    def polls():  # many pollers: the state changes every few milliseconds
        while not stop.is_set():
            exposition.changed()
            time.sleep(0.005)

    changer = threading.Thread(target=polls, daemon=True)
    changer.start()
    try:
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda _: exposition.body(True, True), range(10)))
    finally:
        stop.set()
        changer.join()
    # One render for the first scrape, at most one more for those that arrived during it
    # (each scrape rendering again would be 10).
    assert collector.collects <= 3


def test_a_render_serves_the_scrapes_of_its_interval_then_the_next_state_renders(monkeypatch):
    import sglang_obs.exporter.web as web

    collector = CountingCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    clock = [100.0]
    monkeypatch.setattr(web.time, "monotonic", lambda: clock[0])
    exposition = Exposition(registry, min_render_interval=web.RENDER_INTERVAL_S)
    first = exposition.body(False, False)
    exposition.changed()  # a poll, within the interval of the render
    clock[0] += web.RENDER_INTERVAL_S / 2
    assert exposition.body(False, False) == first
    assert collector.collects == 1
    clock[0] += web.RENDER_INTERVAL_S / 2  # the interval is over: the change renders
    assert exposition.body(False, False) != first
    assert collector.collects == 2
    clock[0] += 10 * web.RENDER_INTERVAL_S  # no change since: nothing to render
    exposition.body(False, False)
    assert collector.collects == 2
