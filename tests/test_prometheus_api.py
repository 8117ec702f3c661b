"""The project's Prometheus client against a fake Prometheus on loopback: range queries split
under the points limit, retention, and errors that name the URL without dumping the answer."""

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_obs.core.prometheus_api import EXCERPT, MAX_POINTS, Prometheus, PrometheusError
from sglang_obs.tools.snapshot import SnapshotError, take

from fake_sglang import Route
from helpers import free_port


@pytest.fixture
def fake_prometheus():
    """Answers query_range with one series per query, a sample of value t at each step (NaN at
    t == 0), and records every query's parameters."""
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            params = {k: float(v[0]) if k != "query" else v[0]
                      for k, v in urllib.parse.parse_qs(url.query).items()}
            asked.append((url.path, params))
            if url.path == "/api/v1/status/runtimeinfo":
                data = {"storageRetention": "15d"}
            else:
                start, end, step = params["start"], params["end"], params["step"]
                n = int((end - start) // step) + 1
                assert n <= MAX_POINTS, "Prometheus would refuse this"
                values = [[start + i * step, "NaN" if start + i * step == 0 else
                           str(start + i * step)] for i in range(n)]
                data = {"resultType": "matrix",
                        "result": [{"metric": {"instance": "a"}, "values": values}]}
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_a_long_range_is_asked_in_chunks_under_the_points_limit_and_joined(fake_prometheus):
    url, asked = fake_prometheus
    progress = []
    end = 2.5 * MAX_POINTS
    series = Prometheus(url).query_range("up", 0, end, 1.0, progress=progress.append)
    assert len(asked) == 3
    assert [p["start"] for _, p in asked] == [0, MAX_POINTS, 2 * MAX_POINTS]
    assert progress == [MAX_POINTS - 1, 2 * MAX_POINTS - 1, end]
    [(key, points)] = series.items()
    assert key == (("instance", "a"),)
    assert sorted(points) == [float(t) for t in range(1, int(end) + 1)]  # NaN left out
    raw = Prometheus(url).range_series("up", 0, end, 1.0)
    assert len(raw[0]["values"]) == int(end) + 1  # as answered, NaN included


def test_retention_is_read_from_runtimeinfo(fake_prometheus):
    url, _ = fake_prometheus
    assert Prometheus(url).retention_seconds() == 15 * 86400


def test_errors_name_the_url_and_quote_only_an_excerpt(fake_sglang):
    huge = "x" * 1_000_000
    api = "/api/v1"  # the fake's routes, answered badly
    server = fake_sglang({
        f"{api}/query": Route(json.dumps({"status": "error", "errorType": "bad_data",
                                          "error": huge}).encode(),
                              content_type="application/json"),
        f"{api}/query_range": Route(huge.encode(), status=400),
        f"{api}/status/runtimeinfo": Route(b"not json"),
    })
    prom = Prometheus(server.url, timeout=5)
    for call in (lambda: prom.query("up"), lambda: prom.range_series("up", 0, 60, 15)):
        with pytest.raises(PrometheusError) as err:
            call()
        message = str(err.value)
        assert server.url in message
        assert "(query up)" in message
        assert len(message) < EXCERPT + 200
    assert prom.retention_seconds() is None


def test_an_unreachable_prometheus_is_named_and_snapshot_says_so_as_its_own_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError, match=f"Prometheus at {url} is unreachable"):
        Prometheus(url, timeout=2).query("up", 0)
    with pytest.raises(SnapshotError, match=f"Prometheus at {url} is unreachable"):
        take(url, "10m ago", "now", tmp_path / "pack")
