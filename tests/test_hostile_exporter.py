"""The exporter polling hostile SGLang look-alikes: raw-socket servers on loopback that drip
bytes, never end their trailers, redirect, send absurd numbers, wrong types, huge labels, a
million lines, infinite denominators and secrets.

For each case the poller runs in its own thread as in production, behind the exporter's own
HTTP server, and the checks are the same: the exporter's /metrics answers 200 within 1 s, `up`
equals the truth within two poll intervals (plus CPU_SLACK: two cores are shared with other
work), polls keep advancing, the log has at most one line per state change (none once the
state is steady), and no marker planted in the answers shows in /metrics, on the landing page
or in the log at debug level. Memory is checked on the real `sglang-exporter` process (peak
RSS from /proc) for the size cases. Every hostile loop is bounded (BEHAVIOUR_SECONDS, or the
client going away, or the server stopping), so each test ends by itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.exporter.cli import parse_args
from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.web import Exposition, make_app, serve

from helpers import free_port, stop_process, wait_for

EXPORTER = str(Path(sys.executable).parent / "sglang-exporter")
INTERVAL = 0.4  # poll interval of the exporter under test
TIMEOUT = 0.25  # its deadline per request
CPU_SLACK = 0.75  # seconds of scheduling slack on top of two poll intervals
BEHAVIOUR_SECONDS = 8.0  # no hostile loop runs longer than this
MARKER = "MARKER-7Q1Z"  # planted in answers; must never come out
API_KEY = "KEY-MARKER-5678"

GOOD_METRICS = (
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'
    b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n'
)


# -- the hostile server ----------------------------------------------------------------------
Behaviour = Callable[[socket.socket, "Request", threading.Event], None]


class Request:
    def __init__(self, path: str, headers: dict[str, str]):
        self.path, self.headers = path, headers


class Hostile:
    """HTTP on a raw socket, 127.0.0.1 only: each path (without query) maps to a behaviour that
    writes what it likes; unknown paths get 404. `requests` records every request."""

    def __init__(self, routes: dict[str, Behaviour]):
        self.routes = routes
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = f"127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def hits(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, conn: socket.socket):
        with conn:
            conn.settimeout(2.0)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 16384:
                    data = conn.recv(4096)
                    if not data:
                        return
                    head += data
            except OSError:
                return
            lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            target = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:])}
            request = Request(target, headers)
            self.requests.append(request)
            behaviour = self.routes.get(target.split("?")[0], answer(b"not found", status=404))
            with contextlib.suppress(OSError):
                behaviour(conn, request, self._stop)

    def stop(self):
        self._stop.set()
        self._accepter.join(2)
        self._sock.close()
        for thread in self._threads:
            thread.join(2)


@pytest.fixture
def hostile():
    servers: list[Hostile] = []

    def start(routes):
        servers.append(Hostile(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


# Behaviours. Each returns within BEHAVIOUR_SECONDS, when the client leaves or at stop.
def head(status: int = 200, reason: str = "OK", headers: dict[str, str] | None = None,
         length: int | None = None) -> bytes:
    fields = dict(headers or {})
    if length is not None:
        fields.setdefault("Content-Length", str(length))
    return (f"HTTP/1.1 {status} {reason}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n").encode()


def answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None,
           reason: str = "OK", delay: float = 0.0) -> Behaviour:
    def run(conn, request, stop):
        if delay and stop.wait(delay):
            return
        conn.sendall(head(status, reason, headers, len(body)) + body)
    return run


def raw(data: bytes) -> Behaviour:
    def run(conn, request, stop):
        conn.sendall(data)
    return run


def json_answer(payload) -> Behaviour:
    text = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return answer(text, headers={"Content-Type": "application/json"})


def drip(prefix: bytes, dripped: bytes, every: float = 0.1) -> Behaviour:
    """`prefix` at once, then `dripped` one byte every `every` seconds, round and round."""
    def run(conn, request, stop):
        conn.sendall(prefix)
        deadline = time.monotonic() + BEHAVIOUR_SECONDS
        i = 0
        while time.monotonic() < deadline and not stop.wait(every):
            conn.sendall(dripped[i % len(dripped):i % len(dripped) + 1])
            i += 1
    return run


def endless_trailers(body: bytes) -> Behaviour:
    """A complete chunked body, then trailer lines for ever (as fast as the client reads)."""
    def run(conn, request, stop):
        conn.sendall(head(headers={"Transfer-Encoding": "chunked"})
                     + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n")
        deadline = time.monotonic() + BEHAVIOUR_SECONDS
        batch = b"X-Trailer: more\r\n" * 4096
        while time.monotonic() < deadline and not stop.is_set():
            conn.sendall(batch)
    return run


def lazy_lines(count: int, line: bytes, batch: int = 10_000) -> Behaviour:
    """A chunked body of `count` copies of `line`, sent `batch` lines a chunk (the body never
    exists whole, here or in the client's socket buffer)."""
    chunk = line * batch
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"

    def run(conn, request, stop):
        conn.sendall(head(headers={"Transfer-Encoding": "chunked"}))
        for _ in range(count // batch):
            if stop.is_set():
                return
            conn.sendall(framed)
        conn.sendall(b"0\r\n\r\n")
    return run


# -- the exporter under test, in process -------------------------------------------------------
class LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, str, str]] = []  # (time, logger, formatted text)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record):
        self.lines.append((time.monotonic(), record.name, self.format(record)))

    def poll_lines(self, since: float = 0.0) -> list[str]:
        """Lines about polling (the HTTP server's access lines are not state changes)."""
        return [text for at, name, text in self.lines
                if at >= since and name != "sglang_obs.exporter.web"]

    def text(self) -> str:
        return "\n".join(text for _, _, text in self.lines)


class Running:
    def __init__(self, port: int, poller: TargetPoller, logs: LogLines):
        self.port, self.poller, self.logs = port, poller, logs
        self.started = time.monotonic()

    def get(self, path: str = "/metrics") -> str:
        return scrape(self.port, path)

    def samples(self) -> dict:
        return samples_of(self.get())


def samples_of(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def named(samples, name) -> dict:
    return {labels: v for (n, labels), v in samples.items() if n == name}


@pytest.fixture
def exporter():
    stack = contextlib.ExitStack()

    def start(url: str, max_bytes: int = 16 << 20, api_key: str | None = None) -> Running:
        logs = LogLines()
        logger = logging.getLogger("sglang_obs")
        old_level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(logs)
        stack.callback(logger.removeHandler, logs)
        stack.callback(logger.setLevel, old_level)
        settings = PollSettings(interval=INTERVAL, server_info_interval=2.0, timeout=TIMEOUT,
                                max_response_bytes=max_bytes, api_key=api_key)
        registry = CollectorRegistry()
        exposition = Exposition(registry)
        poller = TargetPoller(url, settings, on_change=exposition.changed)
        registry.register(GuardedCollector([SGLangCollector([poller])]))
        server = serve(make_app(exposition, "/metrics", [poller.base_url]), "127.0.0.1:0")
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        stop = threading.Event()
        poller.start(stop)
        stack.callback(poller.join, TIMEOUT * 5 + 1)
        stack.callback(stop.set)
        return Running(server.server_address[1], poller, logs)

    with stack:
        yield start


def check_alive_and_truthful(run: Running, server: str, up: float, max_log_lines: int = 3,
                             observe: float = 3 * INTERVAL) -> dict:
    """The checks every case shares (module docstring); returns the last samples."""
    # up equals the truth within two poll intervals
    settled = wait_for(lambda: value(run.samples(), "sglang_obs_up", server=server) == up and
                       value(run.samples(), "sglang_obs_polls_total", server=server),
                       2 * INTERVAL + CPU_SLACK, interval=0.05)
    assert settled, f"up != {up} after two poll intervals: {run.samples()}"
    polls = value(run.samples(), "sglang_obs_polls_total", server=server)
    steady_since = time.monotonic()
    time.sleep(observe)
    samples = run.samples()
    # still true, polls advancing, nothing more to say in the log
    assert value(samples, "sglang_obs_up", server=server) == up
    assert value(samples, "sglang_obs_polls_total", server=server) >= polls + 2
    assert run.poller._loop._thread.is_alive()
    assert not run.logs.poll_lines(since=steady_since + 0.05), run.logs.poll_lines(steady_since)
    assert len(run.logs.poll_lines()) <= max_log_lines, run.logs.poll_lines()
    assert "Traceback" not in run.logs.text()
    for page in (run.get(), run.get("/"), run.logs.text()):
        assert MARKER not in page
        assert API_KEY not in page
    return samples


def errors(samples, server, endpoint, reason):
    return value(samples, "sglang_obs_poll_errors_total", server=server, endpoint=endpoint,
                 reason=reason)


# -- 1. no freeze: one deadline over the whole exchange ---------------------------------------
STATUS = b"HTTP/1.1 200 OK\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"


@pytest.mark.parametrize(("behaviour", "reason"), [
    (drip(b"", STATUS + b"Content-Length: 10\r\n\r\n"), "timeout"),
    (drip(STATUS, b"X-Slow-Header: " + MARKER.encode() + b"\r\n"), "timeout"),
    (drip(STATUS + CHUNKED, b"1111111111"), "timeout"),  # a chunk-size line that never ends
    (drip(STATUS + CHUNKED + f"{len(GOOD_METRICS):x}\r\n".encode() + GOOD_METRICS
          + b"\r\n0\r\n", b"X-T: 1\r\n"), "timeout"),  # dripped trailers
    (endless_trailers(GOOD_METRICS), "too_large"),
    (answer(b"", headers={f"X-H{i}": "v" for i in range(500)}), "too_large"),
    (answer(b"", headers={"X-Big": "v" * 20000}), "too_large"),
    (answer(GOOD_METRICS, reason="OK", headers={"Transfer-Encoding": "gzip, chunked"}),
     "protocol"),
], ids=["status-line-dripped", "headers-dripped", "chunk-size-dripped", "trailers-dripped",
        "endless-trailers", "too-many-headers", "huge-header", "unknown-coding"])
def test_a_stalling_or_endless_answer_ends_at_the_deadline_and_reads_as_down(
        hostile, exporter, behaviour, reason):
    # Prepare: only /metrics answers at all (it is the only way to be up here)
    server = hostile({"/metrics": behaviour})
    # Act
    run = exporter(server.url)
    # Check
    samples = check_alive_and_truthful(run, server.server, up=0.0)
    assert errors(samples, server.server, "metrics", reason) >= 2
    duration = value(samples, "sglang_obs_poll_duration_seconds", server=server.server)
    assert duration < 2 * TIMEOUT + 0.5, "a poll must end at its deadlines"


def _thread_cpu_seconds(thread: threading.Thread) -> float:
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1]
    utime, stime = fields.split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def test_endless_trailers_cost_the_poller_little_cpu(hostile, exporter):
    server = hostile({"/metrics": endless_trailers(GOOD_METRICS)})
    run = exporter(server.url)
    thread = run.poller._loop._thread
    wait_for(lambda: run.poller.snapshot.polls >= 1, 2)
    before, started = _thread_cpu_seconds(thread), time.monotonic()
    time.sleep(4 * INTERVAL)
    used = _thread_cpu_seconds(thread) - before
    assert run.poller.snapshot.polls >= 4
    assert used < 0.3 * (time.monotonic() - started), f"poller used {used:.2f}s CPU"


# -- 2. no redirects --------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["other-host", "ftp", "slow-chain"])
def test_redirects_are_errors_and_no_other_host_or_scheme_is_asked(hostile, exporter, where):
    # Prepare: another server with good numbers; a redirect to it, to ftp://, or a slow chain
    # (each hop just inside the deadline) back to this server
    other = hostile({"/metrics": answer(GOOD_METRICS), "/v1/loads": json_answer(
        {"loads": [{"num_running_reqs": 5, "num_waiting_reqs": 0}]})})
    server = hostile({})
    for path in ("/metrics", "/v1/loads", "/get_load"):
        location, delay = {
            "other-host": (other.url + path, 0.0),
            "ftp": (f"ftp://127.0.0.1:{other.port}{path}", 0.0),
            "slow-chain": (server.url + path + "?hop=2", 0.8 * TIMEOUT),
        }[where]
        server.routes[path] = answer(b"", 302, {"Location": location}, delay=delay)
    # Act
    run = exporter(server.url)
    # Check: down (no valid answer of its own), each 3xx counted, nothing followed
    samples = check_alive_and_truthful(run, server.server, up=0.0)
    assert errors(samples, server.server, "metrics", "http_status") >= 2
    assert other.requests == []
    assert [r.path for r in server.requests if "?" in r.path] == []
    assert not named(samples, "sglang_obs_running_requests")


# -- 3. absurd numbers and wrong types --------------------------------------------------------
HUGE = "1" + "0" * 400


@pytest.mark.parametrize("info", [
    f'{{"version": "0.5.23", "tp_size": 2, "dp_size": {HUGE}, "internal_states": 5}}',
    '{"version": "0.5.23", "tp_size": 2, "internal_states": [{"memory_usage": []}], '
    '"served_model_name": 5, "schedule_policy": ["fcfs"], "enable_mixed_chunk": "yes"}',
    f'{{"version": "0.5.23", "tp_size": 2, "max_total_num_tokens": {HUGE}e5, '
    '"internal_states": [5, {"effective_max_running_requests_per_dp": "many"}]}',
], ids=["huge-dp-size", "wrong-types", "huge-float"])
def test_absurd_numbers_and_wrong_types_are_unknowns_counted_once_per_answer(
        hostile, exporter, info):
    # Prepare: /server_info is bad from first contact; /metrics is healthy
    server = hostile({
        "/metrics": answer(GOOD_METRICS),
        "/v1/loads": json_answer(f'{{"loads": [{{"num_running_reqs": {HUGE}, '
                                 f'"num_waiting_reqs": 1, "num_used_tokens": true}}]}}'.encode()),
        "/server_info": json_answer(info.encode()),
        "/v1/models": json_answer(f'{{"data": [{{"id": "m", "max_model_len": {HUGE}}}]}}'
                                  .encode()),
    })
    # Act
    run = exporter(server.url)
    # Check: up, the good fields used, one parse error per answer, no traceback
    samples = check_alive_and_truthful(run, server.server, up=1.0, max_log_lines=4)
    polls = value(samples, "sglang_obs_polls_total", server=server.server)
    loads = errors(samples, server.server, "loads", "parse")
    assert polls - 1 <= loads <= polls
    assert errors(samples, server.server, "server_info", "parse") == server.hits("/server_info")
    assert errors(samples, server.server, "models", "parse") == server.hits("/v1/models")
    labels = {"server": server.server, "model_name": "m"}
    assert value(samples, "sglang_obs_waiting_requests", **labels) == 1.0
    assert value(samples, "sglang_obs_running_requests", **labels) == 3.0  # from /metrics
    assert value(samples, "sglang_obs_config_tp_size", **labels) == 2.0


# -- 4. huge labels, a million lines ----------------------------------------------------------
@pytest.mark.parametrize("size", [300, 60_000])
def test_a_long_or_unprintable_model_name_becomes_a_short_label(hostile, exporter, size):
    name = ("x" * size + "\u0007").encode()
    body = (b'sglang:num_running_reqs{model_name="' + name + b'",tp_rank="0"} 3.0\n'
            b'sglang:num_queue_reqs{model_name="' + name + b'",tp_rank="0"} 1.0\n')
    server = hostile({"/metrics": answer(body)})
    run = exporter(server.url)
    samples = check_alive_and_truthful(run, server.server, up=1.0)
    (labels,) = named(samples, "sglang_obs_running_requests")
    assert re.fullmatch(r"x{100}~[0-9a-f]{12}", dict(labels)["model_name"])
    assert len(run.get()) < 64 * 1024


def test_a_line_with_a_4_mib_label_is_skipped_unread_and_counted(hostile, exporter):
    body = (b'sglang:num_running_reqs{model_name="' + b"x" * (4 << 20) + b'",tp_rank="0"} 3.0\n'
            b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n')
    server = hostile({"/metrics": answer(body)})
    run = exporter(server.url)
    samples = check_alive_and_truthful(run, server.server, up=1.0)
    assert value(samples, "sglang_obs_waiting_requests", server=server.server,
                 model_name="m") == 1.0
    assert not named(samples, "sglang_obs_running_requests")
    polls = value(samples, "sglang_obs_polls_total", server=server.server)
    assert value(samples, "sglang_obs_native_lines_dropped_total", server=server.server,
                 reason="over_limit") == polls
    assert len(run.get()) < 64 * 1024


@pytest.fixture
def run_exporter():
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = subprocess.Popen(
            [EXPORTER, *args, "--web.listen-address", f"127.0.0.1:{port}",
             "--no-collector.nvml", "--no-collector.docker"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, port

    yield start
    for proc in procs:
        stop_process(proc)


def scrape(port: int, path: str = "/metrics") -> str:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    assert time.monotonic() - started < 1.0, f"{path} took over 1 s"
    return text


def try_scrape(port: int) -> dict | None:
    try:
        return samples_of(scrape(port))
    except OSError:
        return None


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


# Peak RSS of the exporter reading a 15 MiB label and a 1M-line (40 MiB) body under a 64 MiB
# cap: ~235 MiB measured (the body is held about four times over while it is read, decoded and
# split), so this leaves room for allocator variance but not for a second copy of the body.
PEAK_RSS_MIB = 400


def test_huge_labels_and_a_million_lines_keep_work_and_memory_bounded(hostile, run_exporter):
    # Prepare: a 15 MiB model name on one server; on the other, one million wanted sample lines
    # (40 MiB) made as they are sent, under a raised body cap
    name = b"y" * (15 << 20)
    label = hostile({"/metrics": answer(
        b'sglang:num_running_reqs{model_name="' + name + b'",tp_rank="0"} 3.0\n'
        b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n')})
    lines = hostile({"/metrics": lazy_lines(
        1_000_000, b'sglang:num_queue_reqs{model_name="m",dp_rank="0"} 1\n')})
    # Act
    proc, port = run_exporter("--sglang.url", label.url, "--sglang.url", lines.url,
                              "--sglang.poll-interval", "1s", "--sglang.timeout", "3s",
                              "--sglang.max-response-bytes", "64MiB")
    # Check: both up, polls advancing, the excess counted, work per poll and memory bounded
    def both_up():
        s = try_scrape(port)
        return s if s and all(value(s, "sglang_obs_up", server=t.server) == 1.0
                              for t in (label, lines)) else None

    samples = wait_for(both_up, 15, interval=0.2)
    assert samples, proc.stdout.read1().decode() if proc.poll() is not None else "not up"
    polls = value(samples, "sglang_obs_polls_total", server=lines.server)

    def two_more_polls():  # each streams 40 MiB: seconds on a loaded machine
        s = samples_of(scrape(port))
        return s if value(s, "sglang_obs_polls_total", server=lines.server) >= polls + 2 else None
    samples = wait_for(two_more_polls, 20, interval=0.5)
    assert proc.poll() is None
    assert samples, "the polls stopped advancing"
    dropped = value(samples, "sglang_obs_native_lines_dropped_total", server=lines.server,
                    reason="over_limit")
    assert dropped
    assert dropped % 980_000 == 0
    assert value(samples, "sglang_obs_poll_duration_seconds", server=lines.server) < 2.5
    assert value(samples, "sglang_obs_native_lines_dropped_total", server=label.server,
                 reason="over_limit")
    assert [dict(k)["model_name"] for k in named(samples, "sglang_obs_waiting_requests")] == [
        "m", "m"]
    assert peak_rss_mib(proc.pid) < PEAK_RSS_MIB


# -- 5. values outside their domain -----------------------------------------------------------
@pytest.mark.parametrize("capacity", ["+Inf", "-Inf", "1e-308", "NaN"])
def test_values_outside_their_domain_are_dropped_and_counted(hostile, exporter, capacity):
    body = (b'sglang:num_running_reqs{model_name="m",tp_rank="0"} -2.0\n'
            b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n'
            b'sglang:kv_used_tokens{model_name="m",tp_rank="0"} 10.0\n'
            b'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} '
            + capacity.encode() + b"\n")
    server = hostile({"/metrics": answer(body)})
    run = exporter(server.url)
    samples = check_alive_and_truthful(run, server.server, up=1.0, max_log_lines=3)
    labels = {"server": server.server, "model_name": "m"}
    assert value(samples, "sglang_obs_kv_occupancy_ratio", **labels) is None
    assert value(samples, "sglang_obs_running_requests", **labels) is None
    assert value(samples, "sglang_obs_waiting_requests", **labels) == 1.0
    dropped = named(samples, "sglang_obs_derived_values_dropped_total")
    signals = {dict(k)["signal"] for k in dropped}
    assert "running_requests" in signals
    if capacity != "NaN":  # a NaN sample is skipped as no value at all
        assert signals & {"kv_capacity_tokens", "kv_occupancy_ratio"}
    for (name, _), v in samples.items():
        if name.startswith("sglang_obs_") and name != "sglang_obs_kv_capacity_tokens":
            assert math.isfinite(v), name


# -- 6. secrets -------------------------------------------------------------------------------
SECRET_INFO = {
    "version": f"0.5.23+{MARKER}", "served_model_name": None,
    "model_path": f"/models/{MARKER}/Llama-3.1-8B", "tp_size": 1,
    "schedule_policy": MARKER, "kv_cache_dtype": f"fp8 {MARKER}",
    "speculative_algorithm": f"EAGLE?key={MARKER}", "disaggregation_mode": MARKER,
}
SECRET_METRICS = (
    b'sglang:num_running_reqs{model_name="llama?token=' + MARKER.encode()
    + b'",tp_rank="0"} 3.0\n'
    b'{api_key="' + MARKER.encode() + b'"} 1\n'
    b'sglang:num_queue_reqs{model_name="x",tp_rank="0"} one ' + MARKER.encode() + b"\n"
)


@pytest.mark.parametrize("model_path", [f"/models/{MARKER}/Llama-3.1-8B",
                                        f"Llama-3.1-8B?token={MARKER}",
                                        f"http://user:{MARKER}@hub/Llama-3.1-8B",
                                        f"hf_{MARKER.replace('-', '')}abcdef"])
def test_secrets_in_answers_never_reach_metrics_landing_page_or_debug_log(
        hostile, exporter, model_path):
    server = hostile({
        "/metrics": answer(SECRET_METRICS, reason=f"OK api_key={MARKER}",
                           headers={"X-Api-Key": MARKER}),
        "/v1/loads": raw(f"HTTP/1.1 20{MARKER}\r\n\r\n".encode()),
        "/server_info": json_answer({**SECRET_INFO, "model_path": model_path}),
    })
    run = exporter(server.url)
    samples = check_alive_and_truthful(run, server.server, up=1.0, max_log_lines=6)
    (info,) = [dict(k) for k in named(samples, "sglang_obs_server_config_info")]
    assert info["version"] == info["schedule_policy"] == info["kv_cache_dtype"] == "other"
    assert info["speculative_algorithm"] == info["disaggregation_mode"] == "other"
    assert info["model_name"] in ("Llama-3.1-8B", "redacted")
    assert errors(samples, server.server, "loads", "protocol")
    assert value(samples, "sglang_obs_native_lines_dropped_total", server=server.server,
                 reason="malformed") >= 2
    # the log says where, not what
    assert any("line 2" in line for line in run.logs.poll_lines()), run.logs.poll_lines()


# -- 7. credentials: refused in the URL, an API key from a file --------------------------------
def test_credentials_in_the_url_are_refused_in_one_line_without_echoing_them():
    result = subprocess.run([EXPORTER, "--sglang.url", f"http://admin:{MARKER}@127.0.0.1:1"],
                            capture_output=True, text=True, timeout=10)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--sglang.api-key-file" in result.stderr
    assert MARKER not in result.stderr + result.stdout


def test_the_api_key_file_is_sent_as_bearer_and_never_shown(hostile, run_exporter, tmp_path):
    # Prepare
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    server = hostile({"/metrics": answer(GOOD_METRICS)})
    # Act
    proc, port = run_exporter("--sglang.url", server.url, "--sglang.api-key-file",
                              str(key_file), "--log.level", "debug",
                              "--sglang.poll-interval", "200ms")
    samples = wait_for(lambda: (s := try_scrape(port)) and
                       value(s, "sglang_obs_up", server=server.server) == 1.0 and s, 10)
    # Check
    assert samples
    assert server.requests[0].headers.get("authorization") == f"Bearer {API_KEY}"
    pages = scrape(port) + scrape(port, "/")
    proc.terminate()
    log = proc.communicate(timeout=5)[0].decode()
    assert API_KEY not in pages + log
    assert len([line for line in log.splitlines() if "logger=sglang_obs.exporter.web" not in line
                ]) <= 4, log


@pytest.mark.parametrize("content", ["", "two words\n", "x" * 5000])
def test_a_bad_api_key_file_exits_2_naming_the_file_not_its_content(tmp_path, capsys, content):
    key_file = tmp_path / "key"
    key_file.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--sglang.url", "http://127.0.0.1:1", "--sglang.api-key-file", str(key_file)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert str(key_file) in err
    assert err.count("\n") == 1
    assert not content.strip() or content.strip() not in err
