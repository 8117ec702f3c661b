"""The exporter's HTTP server against slow, idle and many clients (exporter/http_server.py).

Issue 28: 16 connections that sent `G` and then one byte every 5 s made every `/metrics` scrape
time out (the worker pool was 16, and the 10 s timeout applied per read); 2,000 held
connections failed every probe. A scrape must be answered while such clients hold connections,
and every answer must carry nosniff (the HTML ones a CSP)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge

from sglang_obs.core.connections import ConnectionTable
from sglang_obs.exporter import http_server
from sglang_obs.exporter.web import Exposition, make_app, serve


@pytest.fixture
def exporter():
    registry = CollectorRegistry()
    Gauge("sglang_obs_example", "An example.", registry=registry).set(1)
    server = serve(make_app(Exposition(registry), "/metrics", ["http://127.0.0.1:30000"]),
                   "127.0.0.1:0", "/metrics")
    yield server
    server.shutdown()
    server.server_close()


def get(port: int, path: str = "/metrics", timeout: float = 1.0) -> tuple[bytes, float]:
    """A raw GET; (the answer, seconds it took)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - started


def probes(port: int, n: int, timeout: float = 1.0) -> tuple[int, list[float]]:
    ok, took = 0, []
    for _ in range(n):
        try:
            answer, seconds = get(port, timeout=timeout)
        except OSError:
            continue
        if answer.startswith(b"HTTP/1.1 200") and b"sglang_obs_example 1.0" in answer:
            ok += 1
            took.append(seconds)
    return ok, took


class Dripping:
    """`n` connections that each send `G` and then one more byte every `every` seconds."""

    def __init__(self, port: int, n: int, every: float = 0.5, send: bool = True):
        self.socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            if send:
                s.sendall(b"G")
            self.socks.append(s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, args=(every, send), daemon=True)
        self._thread.start()

    def _drip(self, every: float, send: bool) -> None:
        while send and not self._stop.wait(every):
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.send(b"E")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.close()


def test_slowloris_clients_do_not_starve_a_scrape(exporter):
    port = exporter.server_address[1]
    drip = Dripping(port, 40)  # more than the old pool of 16 workers
    try:
        time.sleep(0.3)
        ok, took = probes(port, 20)
    finally:
        drip.close()
    print(f"\n20 probes with 40 dripping connections: {ok} answered, slowest {max(took):.3f} s")
    assert ok == 20


def test_half_open_connections_do_not_starve_a_scrape(exporter):
    port = exporter.server_address[1]
    held = Dripping(port, 60, send=False)
    try:
        ok, _ = probes(port, 16)
    finally:
        held.close()
    assert ok == 16


def test_a_slow_head_is_closed_at_its_deadline_not_per_read(exporter, monkeypatch):
    monkeypatch.setattr(http_server, "HEAD_DEADLINE", 1.0)
    port = exporter.server_address[1]
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    started = time.monotonic()
    answer = b""
    try:
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.2 s, never done
            s.send(bytes([byte]))
            time.sleep(0.2)
    except OSError:
        pass
    s.settimeout(5)
    with contextlib.suppress(OSError):
        answer = s.recv(1024)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < 3.0


def test_past_the_per_client_cap_the_oldest_waiting_connection_makes_room(exporter, monkeypatch):
    table = exporter.connections
    monkeypatch.setattr(table, "max_per_client", 20)
    port = exporter.server_address[1]
    held = Dripping(port, 50, send=False)
    try:
        ok, _ = probes(port, 5)
        time.sleep(0.2)
        assert len(table) <= 20
    finally:
        held.close()
    assert ok == 5
    assert table.evicted >= 30


def test_connection_table_evicts_the_oldest_waiting_and_refuses_when_all_are_answered():
    closed = []
    table = ConnectionTable(max_total=3, max_per_client=2)
    a = table.admit("p", lambda: closed.append("a"))
    b = table.admit("p", lambda: closed.append("b"))
    table.answering(a)
    c = table.admit("p", lambda: closed.append("c"))  # p is at its cap: b (waiting) goes
    assert closed == ["b"]
    assert c is not None
    d = table.admit("q", lambda: closed.append("d"))
    table.answering(c)
    table.answering(d)
    assert table.admit("r", lambda: closed.append("e")) is None  # all three being answered
    assert (table.evicted, table.refused) == (1, 1)
    table.release(b)  # released twice (closed, then its coroutine ends): no harm
    table.release(a)
    assert table.admit("r", lambda: None) is not None


@pytest.mark.parametrize("path", ["/metrics", "/sd/sglang", "/", "/nothing-here"])
def test_every_answer_says_nosniff_and_html_has_a_policy(exporter, path):
    answer, _ = get(exporter.server_address[1], path)
    head = answer.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert "x-content-type-options: nosniff" in head
    assert "content-security-policy: default-src 'none'" in head
    if path == "/":
        assert "text/html" in head


def test_not_http_gets_400_and_the_server_goes_on(exporter):
    port = exporter.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"HELLO\r\n\r\n")
        assert s.recv(1024).startswith(b"HTTP/1.1 400")
    assert probes(port, 1)[0] == 1
