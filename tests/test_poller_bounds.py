"""What one SGLang server can cost the exporter's poller, bounded (exporter/poller.py,
exporter/json_bounds.py, sglang_obs/core/log_budget.py):

1. memory to decode a JSON answer under the body cap: held to an estimate made before decoding,
   measured as peak RSS in a subprocess of its own;
2. log lines of a server that flaps: one per change of state, at most LOG_BURST per LOG_WINDOW
   per server, then one line saying how many were not logged;
3. the time a hung server (it accepts the connection and never answers) takes to read down at
   the CLI's defaults: within two poll intervals of the onset.

The hostile servers and the log capture are tests/test_hostile_exporter.py's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_hostile_exporter import (
    BEHAVIOUR_SECONDS,
    GOOD_METRICS,
    Hostile,
    LogLines,
    answer,
    json_answer,
    samples_of,
    value,
)

from sglang_obs.exporter.cli import parse_args
from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.poller import PollSettings, TargetPoller

from helpers import wait_for
from test_conformance import GOLDENS

LOADS = {"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 1, "dp_rank": 0}]}
SERVER_INFO = (GOLDENS / "0.5.23" / "default" / "server_info.json").read_bytes()
MiB = 1 << 20


@pytest.fixture
def hostile_server():
    """test_hostile_exporter.Hostile servers, stopped at the end of the test."""
    with contextlib.ExitStack() as stack:

        def start(routes) -> Hostile:
            server = Hostile(routes)
            stack.callback(server.stop)
            return server

        yield start


@contextlib.contextmanager
def captured(level: int):
    """The exporter's log lines at `level` (test_hostile_exporter.LogLines)."""
    logs = LogLines()
    logger = logging.getLogger("sglang_obs")
    old_level = logger.level
    logger.setLevel(level)
    logger.addHandler(logs)
    try:
        yield logs
    finally:
        logger.removeHandler(logs)
        logger.setLevel(old_level)


def registry_of(poller: TargetPoller) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector([poller])]))
    return registry


def exported_up(registry: CollectorRegistry, server: str) -> float | None:
    return value(samples_of(generate_latest(registry).decode()), "sglang_obs_up", server=server)


# -- 1. memory to decode JSON ------------------------------------------------------------------
# Runs in a fresh interpreter: builds the body in place (no transient copy), resets the peak
# RSS (/proc/self/clear_refs 5), then either runs one poll cycle whose /v1/loads answer is the
# body (`poll`: the fetcher keeps fetch()'s contract, a body over max_bytes is `too_large`
# before it is read) or decodes the body with json_bounds.loads (`decode`), and prints the body
# size, the peak RSS growth and the outcome as JSON.
PEAK = r"""
import json, sys

def kib(key):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) * 1024

def build(head, piece, tail, count):
    buf = bytearray(len(head) + count * len(piece) + len(tail))
    view = memoryview(buf)
    view[:len(head)] = head
    start, total = len(head), count * len(piece)
    if count:
        view[start:start + len(piece)] = piece
        filled = len(piece)
        while filled < total:  # doubling copies within the buffer
            k = min(filled, total - filled)
            view[start + filled:start + filled + k] = view[start:start + k]
            filled += k
    view[start + total:] = tail
    view.release()
    return bytes(buf)

what = sys.argv[1]
head, piece, tail = (bytes.fromhex(h) for h in sys.argv[2:5])
count = int(sys.argv[5])
body = build(head, piece, tail, count)
at = piece.find(b"#######")
if at >= 0:  # a counter in every piece (distinct keys), written in place
    buf = bytearray(body)
    for i in range(count):
        buf[len(head) + i * len(piece) + at:len(head) + i * len(piece) + at + 7] = b"%07d" % i
    body = bytes(buf)
    del buf
if what == "poll":
    from sglang_obs.exporter.http_fetch import FetchError, Response
    from sglang_obs.exporter.poller import PollSettings, TargetPoller

    metrics = sys.argv[6].encode()

    def fetcher(url, *, timeout, max_bytes, accept="*/*", headers=None):
        answer = {"/metrics": metrics, "/v1/loads": body}.get(url.split(":30000", 1)[1])
        if answer is None:
            raise FetchError("http_status", "HTTP 404", status=404)
        if len(answer) > max_bytes:
            raise FetchError("too_large", f"Content-Length {len(answer)} > {max_bytes} bytes")
        return Response(200, "application/json", answer)

    poller = TargetPoller("http://sglang:30000", PollSettings(), fetcher=fetcher)
    act = poller.poll_once
else:
    from sglang_obs.exporter.json_bounds import loads
    act = lambda: loads(body)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kib("VmRSS:")
outcome = act()
growth = kib("VmHWM:") - before
out = {"body": len(body), "growth": growth}
if what == "poll":
    out.update(up=outcome.up,
               errors={f"{e} {r}": n for (e, r), n in outcome.errors.items()})
print(json.dumps(out))
"""


def peak(what: str, head: bytes, piece: bytes, tail: bytes, count: int) -> dict:
    """PEAK in a fresh interpreter for the body head + piece * count + tail."""
    result = subprocess.run(
        [sys.executable, "-c", PEAK, what, head.hex(), piece.hex(), tail.hex(), str(count),
         GOOD_METRICS.decode()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


ASTRAL = "\U0001f600".encode()  # one character beyond U+FFFF: CPython then stores 4 bytes each


@pytest.mark.parametrize(("head", "piece", "tail", "size"), [
    (b"[", b'{"a":1},', b'{"a":1}]', 15 * MiB),
    (b'{"loads":[', b"{},", b"{}]}", 15 * MiB),
    (b"[", b'{"a":1},', b'{"a":1}]', 7 * MiB),  # under the JSON byte cap: the value count
    (b'{"loads":[{"num_running_reqs":1,"model":"' + ASTRAL, b"a", b'"}]}', 7 * MiB),
], ids=["15MiB-small-objects", "15MiB-empty-loads", "7MiB-small-objects", "7MiB-wide-string"])
def test_a_json_answer_under_the_body_cap_cannot_amplify_memory(head, piece, tail, size):
    # Act: one poll cycle (the real poller, default settings) whose /v1/loads is the body
    result = peak("poll", head, piece, tail, (size - len(head) - len(tail)) // len(piece))
    growth, body = result["growth"], result["body"]
    print(f"\nbody {body / MiB:.1f} MiB: peak RSS growth of the poll {growth / MiB:.1f} MiB "
          f"({growth / body:.2f}x the body); errors {result['errors']}")
    # Check: refused before it is decoded, counted once, the server still up from /metrics
    assert growth <= 2 * body, f"the poll took {growth / MiB:.0f} MiB for {body / MiB:.0f} MiB"
    assert growth <= 64 * MiB
    assert result["up"]
    assert list(result["errors"].values()) == [1], result["errors"]
    assert set(result["errors"]) <= {"loads parse", "loads too_large"}, result["errors"]


def _synthetic_server_info(dp_ranks: int) -> bytes:
    """0.5.23's golden /server_info with `dp_ranks` ranks of internal_states (SGLang sends one
    entry per data-parallel rank)."""
    info = json.loads(SERVER_INFO)
    info["dp_size"] = dp_ranks
    info["internal_states"] = info["internal_states"] * dp_ranks
    return json.dumps(info, indent=1).encode()


def test_sglang_answers_decode_as_before_with_a_margin_for_many_dp_ranks():
    from sglang_obs.exporter.json_bounds import decode_estimate, loads

    bodies = {str(p.relative_to(GOLDENS)): p.read_bytes()
              for name in ("server_info.json", "v1_loads.json", "get_load.json")
              for p in sorted(GOLDENS.glob(f"*/*/{name}"))}
    assert len(bodies) > 20
    bodies["server_info dp=256"] = _synthetic_server_info(256)
    for where, body in bodies.items():
        assert loads(body) == json.loads(body), where
    big = bodies["server_info dp=256"]
    values, estimate = decode_estimate(big)
    print(f"\n/server_info at dp=256: {len(big) / MiB:.1f} MiB, at most {values:,} values, "
          f"decoding estimated at {estimate / MiB:.1f} MiB")


# Shapes at the edge of the bounds, each decoded in a fresh interpreter: the estimate that the
# bounds hold answers to must be an upper bound of what decoding takes on this interpreter.
@pytest.mark.parametrize(("head", "piece", "tail"), [
    (b"[", b'{"a":1},', b'{"a":1}]'),
    (b"{", b'"k#######":0,', b'"k":0}'),
    (b"[", b'"abcdefghijklmnop",', b'"a"]'),
    (b"[", b"[1.5,1.5],", b"[1.5]]"),
    (b"[", b"1000,", b"1000]"),
    (b'{"loads":[{"model":"' + ASTRAL, b"a", b'"}]}'),
    (b'{"loads":[{"model":"\\ud83d\\ude00', b"a", b'"}]}'),
    (b'{"loads":[{"model":"', b"a", b'"}]}'),
], ids=["objects", "distinct-keys", "strings-of-16", "float-pairs", "ints", "wide-string",
        "escaped-wide-string", "ascii-string"])
def test_decoding_stays_under_its_estimate_at_the_edge_of_the_bounds(head, piece, tail):
    from sglang_obs.exporter import json_bounds

    # Prepare: the largest body of this shape that the bounds accept
    def body(count: int) -> bytes:  # the counters of distinct keys change no count
        return head + piece * count + tail

    def accepted(count: int) -> bool:
        try:
            json_bounds.check(body(count))
        except json_bounds.JSONBoundsError:
            return False
        return True

    low, high = 0, json_bounds.MAX_JSON_BYTES // len(piece) + 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid)
    estimate = json_bounds.decode_estimate(body(low))[1]
    # Act
    result = peak("decode", head, piece, tail, low)
    # Check
    growth = result["growth"]
    print(f"\nbody {result['body'] / MiB:.2f} MiB, estimate {estimate / MiB:.1f} MiB, "
          f"peak RSS growth of decoding {growth / MiB:.1f} MiB")
    assert growth <= estimate
    assert result["body"] + growth <= 64 * MiB


def _body(kind: str) -> bytes:
    if kind == "7MiB-small-objects":
        return b"[" + b'{"a":1},' * (7 * MiB // 8) + b'{"a":1}]'
    if kind == "15MiB-empty-objects":
        return b"[" + b"{}," * (15 * MiB // 3) + b"{}]"
    depth = int(kind.split("-")[0])
    return b'{"loads":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(("kind", "reason"), [
    ("7MiB-small-objects", "parse"),
    ("15MiB-empty-objects", "too_large"),
    ("200-deep", "parse"),
    ("100000-deep", "parse"),
])
def test_a_json_answer_over_its_bounds_is_one_error_per_poll_and_one_log_line(
        hostile_server, kind, reason):
    # Prepare: /metrics and /server_info answer well; /v1/loads is over a bound
    server = hostile_server({
        "/metrics": answer(GOOD_METRICS),
        "/v1/loads": answer(_body(kind), headers={"Content-Type": "application/json"}),
        "/server_info": json_answer(SERVER_INFO),
    })
    poller = TargetPoller(server.url, PollSettings(timeout=5.0))
    # Act
    with captured(logging.DEBUG) as logs:
        for _ in range(3):
            snapshot = poller.poll_once()
    # Check: counted once per poll, said once, the other endpoints' values standing
    assert snapshot.up
    assert snapshot.errors == {("loads", reason): 3}, snapshot.errors
    about_loads = [line for line in logs.poll_lines() if " loads " in line]
    assert len(about_loads) == 1, about_loads
    assert "Traceback" not in logs.text()
    assert snapshot.config is not None
    assert snapshot.config.version == json.loads(SERVER_INFO)["version"]
    assert snapshot.derived is not None
    assert snapshot.derived.waiting_requests == 1.0


# -- 2. log lines of a flapping server -------------------------------------------------------
FLAPPING_POLLS = 180  # three simulated minutes, one poll a second
LINES_PER_WINDOW = 10 + 1  # the burst, then one line saying how many were not logged
UNLOGGED = re.compile(r"(\d+) more state changes")


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG], ids=["info", "debug"])
def test_a_flapping_server_logs_a_burst_per_window_then_says_how_many_it_left_out(
        hostile_server, level):
    # Prepare: /metrics answers on even requests and refuses (503) on odd ones, so the server
    # is up and down on alternate polls; the poller's clock is simulated, one poll a second
    flapping = {"on": True}
    requests = itertools.count()
    good, refused = answer(GOOD_METRICS), answer(b"refused", status=503)

    def metrics(conn, request, stop):
        flip = next(requests) % 2 if flapping["on"] else 0
        (refused if flip else good)(conn, request, stop)

    server = hostile_server({"/metrics": metrics})
    now = [1000.0]
    poller = TargetPoller(server.url, PollSettings(timeout=5.0), clock=lambda: now[0])
    registry = registry_of(poller)
    lines_at: list[tuple[float, list[str]]] = []
    changes, was_up = 0, False
    # Act: three minutes of flapping, then a steady minute and a bit (the last summary)
    with captured(level) as logs:
        for i in range(FLAPPING_POLLS + 65):
            if i == FLAPPING_POLLS:
                flapping["on"] = False
            seen = len(logs.poll_lines())
            snapshot = poller.poll_once()
            lines_at.append((now[0], logs.poll_lines()[seen:]))
            changes, was_up = changes + (snapshot.up != was_up), snapshot.up
            # sglang_obs_up stays truthful on every poll, logged or not
            expected = i >= FLAPPING_POLLS or i % 2 == 0
            assert snapshot.up == expected, i
            assert exported_up(registry, server.server) == float(expected), i
            now[0] += 1.0
    # Check: per window of the budget (from the first line), the burst plus one summary
    lines = [(t, line) for t, batch in lines_at for line in batch]
    first = lines[0][0]
    per_minute = [sum(1 for t, _ in lines if first + 60 * k <= t < first + 60 * (k + 1))
                  for k in range(4)]
    print(f"\nlog lines per simulated minute ({logging.getLevelName(level)}): {per_minute}")
    assert max(per_minute) <= LINES_PER_WINDOW, per_minute
    assert "Traceback" not in logs.text()
    summaries = [line for _, line in lines if UNLOGGED.search(line)]
    assert len(summaries) >= 3, summaries
    assert all(server.server in line for line in summaries)
    last = lines[-1][1]  # the log ends on the truth
    assert " is reachable" in last, last
    if level == logging.INFO:  # every up/down change is either logged or counted as left out
        said = sum(1 for _, line in lines if " is reachable" in line or " is unreachable" in line)
        left_out = sum(int(UNLOGGED.search(line).group(1)) for line in summaries)
        assert said + left_out == changes, (said, left_out)


# -- 3. a hung server reads down within two poll intervals ------------------------------------
SCHEDULING_SLACK = 0.5  # seconds: two cores shared with other work


def hang(conn, request, stop) -> None:
    """Accept, read the request, never answer (until the test ends)."""
    stop.wait(BEHAVIOUR_SECONDS)


@pytest.mark.parametrize("onset", ["after-metrics-answered", "between-polls"])
def test_a_hung_server_reads_down_within_two_poll_intervals_at_the_defaults(
        hostile_server, onset):
    # Prepare: the CLI's defaults; a server that answers until the onset, then hangs on every
    # request. "after-metrics-answered" is the worst moment: the poll in flight has its valid
    # /metrics answer (it still reads up) and hangs on /v1/loads.
    args = parse_args(["--sglang.url", "http://127.0.0.1:1"])
    interval = args.sglang_poll_interval
    settings = PollSettings(interval=interval, server_info_interval=30.0,
                            timeout=args.sglang_timeout)
    hung, armed = threading.Event(), threading.Event()
    onset_at: list[float] = []

    def start_hanging() -> None:
        onset_at.append(time.monotonic())
        hung.set()

    def metrics(conn, request, stop):
        (hang if hung.is_set() else answer(GOOD_METRICS))(conn, request, stop)

    def loads(conn, request, stop):
        if armed.is_set() and not hung.is_set():
            start_hanging()
        (hang if hung.is_set() else json_answer(LOADS))(conn, request, stop)

    server = hostile_server({"/metrics": metrics, "/v1/loads": loads})
    polls: list[tuple[float, float, bool]] = []  # the poller's own (start, end, up)
    stop = threading.Event()
    poller = TargetPoller(server.url, settings, on_poll=lambda started, snap: polls.append(
        (started, started + snap.poll_duration_seconds, snap.up)))
    poller.start(stop)
    try:
        assert wait_for(lambda: sum(1 for p in polls if p[2]) >= 2, 10), polls
        # Act
        if onset == "between-polls":
            last_end = polls[-1][1]
            time.sleep(max(last_end + interval / 3 - time.monotonic(), 0))
            start_hanging()
        else:
            armed.set()
        assert wait_for(lambda: onset_at and any(not up and end > onset_at[0]
                                                 for _, end, up in polls), 4 * interval + 5)
    finally:
        stop.set()
        poller.join(10)
    # Check: from the onset to the end of the poll that published up=0
    down_at = min(end for _, end, up in polls if not up and end > onset_at[0])
    latency = down_at - onset_at[0]
    limit = 2 * interval
    print(f"\nhung at onset ({onset}): read down after {latency:.3f} s; two poll intervals "
          f"{limit:.1f} s, margin {limit - latency:+.3f} s (slack allowed {SCHEDULING_SLACK} s)")
    assert latency <= limit + SCHEDULING_SLACK
