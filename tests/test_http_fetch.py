"""Name resolution of the poller's HTTP client (exporter/http_fetch.py): an IP address is never
resolved, a name at most once per RESOLVE_TTL_S, and again at once after its addresses failed."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from sglang_obs.exporter import http_fetch
from sglang_obs.exporter.http_fetch import FetchError, fetch

from helpers import free_port


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def resolver(monkeypatch):
    """Counts getaddrinfo calls; the cache starts empty."""
    calls = []
    real = socket.getaddrinfo

    def counted(*args, **kwargs):
        calls.append(args[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(http_fetch, "_resolved", {})
    monkeypatch.setattr(http_fetch.socket, "getaddrinfo", counted)
    return calls


def test_an_ip_address_is_never_resolved(server, resolver):
    for _ in range(3):
        assert fetch(f"http://127.0.0.1:{server}/", timeout=5, max_bytes=100).body == b"ok\n"
    assert resolver == []


def test_a_name_is_resolved_once_per_ttl_and_again_after_its_addresses_failed(
        server, resolver, monkeypatch):
    for _ in range(5):
        assert fetch(f"http://localhost:{server}/", timeout=5, max_bytes=100).body == b"ok\n"
    assert resolver == [("localhost", server)]

    clock = [http_fetch.time.monotonic() + http_fetch.RESOLVE_TTL_S + 1]
    monkeypatch.setattr(http_fetch.time, "monotonic", lambda: clock[0])
    fetch(f"http://localhost:{server}/", timeout=5, max_bytes=100)
    assert len(resolver) == 2  # the TTL ran out

    closed = free_port()  # nothing listens there: the connection is refused
    for _ in range(2):
        with pytest.raises(FetchError) as err:
            fetch(f"http://localhost:{closed}/", timeout=5, max_bytes=100)
        assert err.value.reason == "connection_refused"
    assert resolver[2:] == [("localhost", closed)] * 2  # not kept after the failure
