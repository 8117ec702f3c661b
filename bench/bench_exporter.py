"""Exporter benchmarks reported in docs/performance.md.

Every figure is set against a yardstick that does the same work, and both run interleaved in
this one process run, repeated in rounds (min and median reported); no timed test anywhere.

1. Poll-cycle CPU against the floor. The body is the realistic 975-line /metrics answer of a
   0.5.23 TP4 server (`realistic_exposition()`).
   a. parse: `parse_exposition(text, content_type)` against `floor_scan`, the simplest loop that
      extracts the same values (startswith/split + float, the same DP/rank aggregation, the same
      sample count and spelling); asserted equal. Target <= 3x.
   b. cycle: `TargetPoller.poll_once()` against `floor_cycle`: bare http.client GETs of /metrics
      and /v1/loads with the poller's Accept headers, `floor_scan`, json.loads and the same load
      sums; the extracted values are asserted equal to the poller's. The fake SGLang runs in
      another process, so only the client's CPU (time.process_time) is counted.
2. Scrape latency against a bare prometheus_client registry serving the same families, samples
   and bytes: N pollers are filled once from N fake servers, their families collected once; our
   side serves them through exporter/web.py (`serve(make_app(Exposition(...)))`), the bare side
   through prometheus_client's own `start_http_server` (it renders per request); the two text
   renders and the two HTTP bodies are asserted byte-equal. Both are fetched with Prometheus'
   request (its Accept header, Accept-Encoding: gzip) on a fresh http.client connection each,
   interleaved request by request. A third side, ours with `changed()` before every request,
   shows what a scrape costs when the state moved since the last one (one render, as bare).
   Target: ours <= 1.0x bare.
3. The real `sglang-exporter` console script polling 1..256 fake servers at the default 1 s
   interval (`--no-collector.docker --no-collector.nvml`); the fakes are bench/fake_fleet.py
   processes (pre-encoded answers, one selector thread each). Over a window after a warm-up:
   exporter CPU (utime+stime from /proc/<pid>/stat, % of one core), VmRSS, polls done / due (sum
   of sglang_obs_polls_total deltas / (N x window)); then scrape latency with 1 and with 20
   concurrent scrapers back to back, and with 20 at once once a second (all clients driven by
   one thread over non-blocking sockets; a scrape with no answer in 10 s, Prometheus' default
   scrape_timeout, fails and counts with its 10 s). On a small machine the fakes and the
   scrapers compete with the exporter for the cores: the CPU figure is the exporter's own, the
   latency figures include that contention. With --py-spy BINARY, py-spy then samples the
   thread holding the GIL, polls only and polls plus concurrent scrapers, and the samples are
   sorted by where they are.
4. Where the time goes (breakdown): the CPU of each stage of one poll (urllib fetches, decode +
   parse, JSON, derive; bare http.client beside), one stage at a time on the same answers, and of
   each stage of one scrape's render (collect, OpenMetrics, text, gzip) at N servers.

Run: `make bench` (or .venv/bin/python bench/bench_exporter.py [--quick] [--parts ...]; --help).
Prints the results as JSON, then as a markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import os
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

ROOT = Path(__file__).resolve().parent.parent

from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector  # noqa: E402
from sglang_obs.exporter.derived import derive  # noqa: E402
from sglang_obs.exporter.exposition_format import Renderer  # noqa: E402
from sglang_obs.exporter.http_fetch import METRICS_ACCEPT, fetch  # noqa: E402
from sglang_obs.exporter.poller import PollSettings, TargetPoller  # noqa: E402
from sglang_obs.exporter.sglang_api import parse_loads  # noqa: E402
from sglang_obs.exporter.sglang_exposition import (  # noqa: E402
    ADDITIVE,
    MAXIMUM,
    RENAMES,
    SCHEDULER_PRESENCE,
    SUMMED,
    WANTED,
    parse_exposition,
)
from sglang_obs.exporter.web import GZIP_LEVEL, Exposition, make_app, serve  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "sglang"
FAKE_FLEET = Path(__file__).resolve().parent / "fake_fleet.py"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# What Prometheus (2.x/3.x) sends when it scrapes.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,"
                     "application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
SCRAPE_HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
STAGES = ("request_process", "prefill_forward", "chunked_prefill", "prefill_bootstrap",
          "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_waiting",
          "decode_transferred", "fake_output", "quick_finish")


def realistic_exposition() -> str:
    """The 0.5.23 TP4 fixture plus the big histogram families a real 0.5.23 server also has
    (per-stage latency: 11 stages x 30 buckets; token histograms: 40 buckets x streaming split)."""
    lines = [(FIXTURES / "metrics_0.5.23_tp4.prom").read_text().rstrip("\n")]
    base = 'model_name="qwen3-27b",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    lines.append("# HELP sglang:per_stage_req_latency_seconds Per-stage request latency.")
    lines.append("# TYPE sglang:per_stage_req_latency_seconds histogram")
    bounds = [0.001 * 1.62**i for i in range(30)]
    for stage in STAGES:
        for i, b in enumerate(bounds):
            lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{base},stage="{stage}",'
                         f'le="{b!r}"}} {float(i * 3)}')
        lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{base},stage="{stage}",'
                     f'le="+Inf"}} 100.0')
        lines.append(f'sglang:per_stage_req_latency_seconds_count{{{base},stage="{stage}"}} 100.0')
        lines.append(f'sglang:per_stage_req_latency_seconds_sum{{{base},stage="{stage}"}} 12.5')
    token_bounds = [100, 300, 500, 700, 1000, 1500, *range(2000, 10001, 1000),
                    *range(12500, 30001, 2500), 35000, 40000, 60000, 80000, 1e5, 2e5, 3e5, 4e5,
                    6e5, 8e5, 1e6, 1.1e6]
    for family in ("prompt_tokens_histogram", "generation_tokens_histogram",
                   "uncached_prompt_tokens_histogram"):
        lines.append(f"# HELP sglang:{family} Token histogram.")
        lines.append(f"# TYPE sglang:{family} histogram")
        for streaming in ("true", "false"):
            labels = f'model_name="qwen3-27b",engine_type="unified",is_streaming="{streaming}"'
            for i, b in enumerate(token_bounds):
                lines.append(f'sglang:{family}_bucket{{{labels},le="{float(b)!r}"}} {float(i)}')
            lines.append(f'sglang:{family}_bucket{{{labels},le="+Inf"}} 50.0')
            lines.append(f'sglang:{family}_count{{{labels}}} 50.0')
            lines.append(f'sglang:{family}_sum{{{labels}}} 123456.0')
    return "\n".join(lines) + "\n"


# --- the floor: the least any reader of these answers must do ------------------------------------

# Exposed name (both spellings, old names too) -> bare current name. Data, not code under test.
FLOOR_NAMES = {prefix + exposed: bare
               for bare in WANTED
               for exposed in (bare, *(old for old, new in RENAMES.items() if new == bare))
               for prefix in ("sglang:", "sglang_")}


def _alternation(names: list[str]) -> str:
    """A regular expression for exactly `names`, factored by first letter (a trie), so the
    engine rejects an unwanted name at its first letter that leaves the tree."""
    heads: dict[str, list[str]] = {}
    for name in names:
        heads.setdefault(name[:1], []).append(name[1:])
    parts = [re.escape(head) + (_alternation(tails) if head else "")
             for head, tails in sorted(heads.items())]
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


# The wanted lines, found by one regular expression over the body: a line feed, the prefix, a
# wanted name, then `{` or a blank. Every other line is passed over in C.
FLOOR_LINE = re.compile(r"\n(sglang[:_]" + _alternation(
    sorted({exposed[len("sglang:"):] for exposed in FLOOR_NAMES})) + r")([{ ])([^\n]*)")
FLOOR_NOT_SAMPLE = re.compile(r"\n(?=[#\n])")


def floor_scan(text: str) -> dict:
    """The targeted scan: the least any reader must do to extract these values from a
    well-formed text-format body. One regex finds the ~40 wanted lines; only those are split
    (`find` / `split`) and converted; the same aggregation (max within a DP rank over tp/pp/ep
    ranks and pids, summed over DP ranks for additive gauges, max over all for ratios, summed
    over label sets for tokenizer counters; `priority=""` only; NaN skipped). The sample count
    is the lines less the comment and blank ones, counted in C; the spelling is whether a line
    starts with each prefix."""
    body = "\n" + text
    groups: dict[str, dict[tuple[str, str], float]] = {}
    model_name = ""
    for m in FLOOR_LINE.finditer(body):
        name, sep, rest = m.groups()
        bare = FLOOR_NAMES[name]
        if sep == "{":
            close = rest.rindex("}")
            labels = dict(pair.split("=", 1) for pair in rest[:close].split(","))
            v = float(rest[close + 2:])
        else:
            labels = {}
            v = float(rest)
        if v != v or bare not in SUMMED and labels.get("priority", '""') != '""':
            continue  # NaN; a scheduler gauge's per-priority split (its "" total is kept)
        model = labels.get("model_name", '""')[1:-1]
        if model and not model_name and bare in SCHEDULER_PRESENCE:
            model_name = model
        if bare in SUMMED:
            key = tuple(sorted(labels.items()))
        else:
            key = (model, labels.get("dp_rank", "") if bare in ADDITIVE else "")
        group = groups.setdefault(bare, {})
        old = group.get(key)
        if old is None or v > old:
            group[key] = v
    values = {bare: max(g.values()) if bare in MAXIMUM else sum(g.values())
              for bare, g in groups.items()}
    count = text.count("\n") - len(FLOOR_NOT_SAMPLE.findall(body, 0, len(body) - 1))
    spelling = ("\nsglang:" in body) | ("\nsglang_" in body) << 1
    return {"values": values, "model_name": model_name, "sample_count": count,
            "spelling": ("none", "colon", "underscore", "mixed")[spelling]}


def exporter_scan(text: str, content_type: str) -> dict:
    m = parse_exposition(text, content_type)
    return {"values": m.values, "model_name": m.model_name, "sample_count": m.sample_count,
            "spelling": m.spelling}


LOAD_FIELDS = {"running": "num_running_reqs", "waiting": "num_waiting_reqs",
               "prefill_backlog_tokens": "num_waiting_uncached_tokens",
               "used_tokens": "num_used_tokens", "capacity_tokens": "max_total_num_tokens",
               "max_running_requests": "max_running_requests",
               "gen_throughput": "gen_throughput"}


def _get(host: str, port: int, path: str, accept: str) -> tuple[bytes, str]:
    """http.client GET on a fresh connection (the breakdown's comparison)."""
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path, headers={"Accept": accept, "User-Agent": "sglang-obs"})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}")
        return body, resp.getheader("Content-Type", "")
    finally:
        conn.close()


def raw_get(address: tuple[str, int], path: str, accept: str) -> bytes:
    """The least an HTTP GET costs: a connected socket, the request the poller sends (the same
    header fields, `Connection: close`), recv until the server closes, the head cut off at its
    blank line. No header parsing, no framing checks, no deadline: the floor."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
                     f"Accept: {accept}\r\nAccept-Encoding: identity\r\n"
                     "User-Agent: sglang-obs\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(262144):
            chunks.append(chunk)
    answer = b"".join(chunks)
    if not answer.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"{path}: {answer[:40]!r}")
    return answer[answer.index(b"\r\n\r\n") + 4:]


def floor_cycle(host: str, port: int) -> tuple[dict, dict]:
    """The HTTP work of one poll as raw-socket GETs (a fresh connection each, the poller's
    request), the targeted scan of /metrics and the sums of /v1/loads."""
    address = (host, port)
    native = floor_scan(raw_get(address, "/metrics", METRICS_ACCEPT).decode("utf-8", "replace"))
    loads = json.loads(raw_get(address, "/v1/loads", "application/json"))["loads"]
    load = {field: sum(float(e[key]) for e in loads) for field, key in LOAD_FIELDS.items()}
    return native, load


def poller_answers(poller: TargetPoller) -> tuple[dict, dict]:
    native, load = poller._answers  # what the last cycle read, before derivation
    return ({"values": native.values, "model_name": native.model_name,
             "sample_count": native.sample_count, "spelling": native.spelling},
            {field: getattr(load, field) for field in LOAD_FIELDS})


def require(condition: bool, what: str) -> None:
    """An equality the comparison rests on (an exception, not an assert: -O keeps it)."""
    if not condition:
        raise SystemExit(f"benchmark invalid: {what}")


# --- measuring ------------------------------------------------------------------------------------

def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(samples: list[float], scale: float = 1.0) -> dict:
    return {"n": len(samples), "min": min(samples) * scale,
            "median": statistics.median(samples) * scale,
            "p99": percentile(samples, 99) * scale, "max": max(samples) * scale}


def interleaved_cpu(sides: dict, rounds: int, iterations: int) -> dict:
    """CPU seconds per call of each side, per round. Call by call interleaved (one call of each
    side in turn, the order alternating), so a drift of the machine's speed hits every side
    alike. With two sides, the first is ours and the second the yardstick: their ratio is added."""
    names = list(sides)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    clock = time.process_time
    for _ in range(rounds):
        spent = dict.fromkeys(names, 0.0)
        for i in range(iterations):
            for name in names if i % 2 == 0 else reversed(names):
                fn = sides[name]
                start = clock()
                fn()
                spent[name] += clock() - start
        for name in names:
            per_round[name].append(spent[name] / iterations)
    out = {name: {"min_ms": min(v) * 1e3, "median_ms": statistics.median(v) * 1e3,
                  "rounds_ms": [round(x * 1e3, 4) for x in v]} for name, v in per_round.items()}
    if len(names) == 2:
        ours, floor = names
        out["ratio_min"] = min(per_round[ours]) / min(per_round[floor])
        out["ratio_median"] = (statistics.median(per_round[ours])
                               / statistics.median(per_round[floor]))
    return out


class Fleet:
    """COUNT fake SGLang servers spread over a few bench/fake_fleet.py processes."""

    def __init__(self, count: int, processes: int, files: tuple[Path, Path, Path, Path]):
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        processes = max(1, min(processes, count))
        for i in range(processes):
            share = count // processes + (1 if i < count % processes else 0)
            proc = subprocess.Popen([sys.executable, str(FAKE_FLEET), str(share),
                                     *map(str, files)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
        for proc in self.procs:
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
                self.ports.append(int(line))
        if len(self.ports) != count:
            self.close()
            raise RuntimeError(f"fake fleet listens on {len(self.ports)} ports, not {count}")

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def close(self) -> None:
        for proc in self.procs:
            proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def fixture_files(tmp: Path, exposition: str) -> tuple[Path, Path, Path, Path]:
    metrics = tmp / "metrics.prom"
    metrics.write_text(exposition)
    return (metrics, FIXTURES / "v1_loads_0.5.23.json", FIXTURES / "server_info_0.5.12_seed.json",
            FIXTURES / "v1_models_qwen3.json")


# --- 1. poll-cycle CPU ----------------------------------------------------------------------------

def bench_poll_cpu(files, exposition: str, rounds: int, parse_iters: int,
                   cycle_iters: int) -> dict:
    ours = exporter_scan(exposition, TEXT_CONTENT_TYPE)
    require(ours == floor_scan(exposition), f"parse differs: {ours} != {floor_scan(exposition)}")
    parse = interleaved_cpu({"exporter": lambda: parse_exposition(exposition, TEXT_CONTENT_TYPE),
                             "floor": lambda: floor_scan(exposition)}, rounds, parse_iters)

    fleet = Fleet(1, 1, files)
    try:
        url, port = fleet.urls[0], fleet.ports[0]
        # server_info and /v1/models are read once here and then every 30 s by default; the
        # steady per-second cycle measured is /metrics + /v1/loads.
        poller = TargetPoller(url, PollSettings(timeout=5, server_info_interval=1e9))
        poller.poll_once()
        require(poller.snapshot.up, "the poller did not reach the fake server")
        floor = floor_cycle("127.0.0.1", port)
        require(poller_answers(poller) == floor,
                f"cycle differs: {poller_answers(poller)} != {floor}")
        require(poller_answers(poller)[0] == ours, "the poller read another body")
        cycle = interleaved_cpu({"exporter": poller.poll_once,
                                 "floor": lambda: floor_cycle("127.0.0.1", port)},
                                rounds, cycle_iters)
        require(poller.snapshot.up, "the poller lost the fake server")
        require(sum(poller.snapshot.errors.values()) == 0, "the poller counted errors")
    finally:
        fleet.close()
    return {"exposition_lines": exposition.count("\n"), "exposition_bytes": len(exposition),
            "samples": ours["sample_count"], "values_extracted": len(ours["values"]),
            "rounds": rounds, "parse_iterations_per_round": parse_iters,
            "cycle_iterations_per_round": cycle_iters, "parse": parse, "cycle": cycle}


# --- 2. scrape latency ----------------------------------------------------------------------------

class _Frozen:
    """A collector that yields the same, once-collected families on every collect()."""

    def __init__(self, families):
        self._families = families

    def collect(self):
        return iter(self._families)

    def describe(self):
        return []


SCRAPE_TIMEOUT = 10.0  # Prometheus' default scrape_timeout


def scrape(port: int, headers: dict = SCRAPE_HEADERS,
           timeout: float = 60) -> tuple[float, bytes, dict]:
    """One Prometheus-style scrape on a fresh connection: (seconds, raw body, headers)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        status = resp.status
        got = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    elapsed = time.perf_counter() - start
    if status != 200:
        raise RuntimeError(f"scrape: HTTP {status}")
    return elapsed, body, got


def _decoded(body: bytes, headers: dict) -> bytes:
    return gzip.decompress(body) if headers.get("content-encoding") == "gzip" else body


def bench_scrape(files, servers: int, rounds: int, requests: int) -> dict:
    fleet = Fleet(servers, 1 if servers <= 32 else 2, files)
    try:
        pollers = [TargetPoller(url, PollSettings(timeout=5)) for url in fleet.urls]
        for poller in pollers:
            poller.poll_once()
            require(poller.snapshot.up, f"{poller.server} not up")
    finally:
        fleet.close()
    families = list(GuardedCollector([SGLangCollector(pollers)]).collect())

    ours_registry = CollectorRegistry()
    ours_registry.register(_Frozen(families))
    exposition = Exposition(ours_registry)
    ours_server = serve(make_app(exposition, "/metrics", fleet.urls), "127.0.0.1:0")
    bare_registry = CollectorRegistry()
    bare_registry.register(_Frozen(families))
    bare_server, _ = start_http_server(0, addr="127.0.0.1", registry=bare_registry)
    ports = {"ours": ours_server.server_address[1], "bare": bare_server.server_address[1]}
    try:
        # Same families, samples and bytes.
        require(generate_latest(bare_registry) == exposition.body(False, False),
                "text renders differ")
        require(generate_openmetrics(bare_registry) == exposition.body(True, False),
                "OpenMetrics renders differ")
        answers = {name: scrape(port) for name, port in ports.items()}
        decoded = {name: _decoded(body, h) for name, (_, body, h) in answers.items()}
        require(decoded["ours"] == decoded["bare"], "the two servers answer different bodies")
        require(all(h.get("content-encoding") == "gzip" for _, _, h in answers.values()),
                "a server did not gzip")
        text = decoded["ours"].decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))

        sides = ("ours", "ours_changed", "bare")
        samples: dict[str, list[float]] = {side: [] for side in sides}
        round_medians: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(rounds):
            this_round: dict[str, list[float]] = {side: [] for side in sides}
            for i in range(requests):
                order = sides if (r + i) % 2 == 0 else sides[::-1]
                for side in order:
                    if side == "ours_changed":
                        exposition.changed()  # the state moved: this scrape renders once
                    seconds, _, _ = scrape(ports["bare" if side == "bare" else "ours"])
                    this_round[side].append(seconds)
            for side in sides:
                samples[side] += this_round[side]
                round_medians[side].append(statistics.median(this_round[side]))
    finally:
        ours_server.shutdown()
        ours_server.server_close()
        bare_server.shutdown()
        bare_server.server_close()
    out = {"servers": servers, "series": series, "families": len(families),
           "body_bytes": len(decoded["ours"]),
           "gzip_bytes": {name: len(body) for name, (_, body, _) in answers.items()},
           "rounds": rounds, "requests_per_round": requests}
    for side in sides:
        out[side] = summary(samples[side], 1e3) | {
            "round_median_ms": [round(x * 1e3, 3) for x in round_medians[side]]}
    for side in ("ours", "ours_changed"):
        out[f"{side}_over_bare"] = {
            "min": out[side]["min"] / out["bare"]["min"],
            "median": out[side]["median"] / out["bare"]["median"],
            "p99": out[side]["p99"] / out["bare"]["p99"]}
    return out


# --- 3. the exporter process ---------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies (Linux PR_SET_PDEATHSIG)."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def polls_state(port: int) -> dict:
    """Sum of sglang_obs_polls_total, servers up, poll errors (text format, no gzip), and per
    server its polls and its last successful poll's time: the answer is as of those (the
    exporter renders at most every RENDER_INTERVAL_S, so it may be older than the request)."""
    _, body, headers = scrape(port, {"Accept": "text/plain;version=0.0.4"}, SCRAPE_TIMEOUT * 3)
    polls = errors = up = 0.0
    polled = 0
    per_server: dict[str, list[float]] = {}
    for line in _decoded(body, headers).decode().splitlines():
        if line.startswith(("sglang_obs_polls_total{",
                            "sglang_obs_last_poll_success_timestamp_seconds{")):
            server = line.split('server="', 1)[1].split('"', 1)[0]
            value = float(line.rsplit(" ", 1)[1])
            slot = per_server.setdefault(server, [0.0, math.nan])
            if line.startswith("sglang_obs_polls_total{"):
                slot[0] = value
                polls += value
                polled += value >= 1
            else:
                slot[1] = value
        elif line.startswith("sglang_obs_poll_errors_total{"):
            errors += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sglang_obs_up{"):
            up += float(line.rsplit(" ", 1)[1])
    return {"polls": polls, "errors": errors, "up": up, "polled": polled,
            "per_server": per_server}


def polls_and_due(before: dict, after: dict, interval: float = 1.0) -> tuple[float, float]:
    """(polls done, polls due) between two polls_state answers: per server, the polls between
    its last successful polls in each, against the time between those polls / the interval."""
    done = due = 0.0
    for server, (count, at) in after["per_server"].items():
        old_count, old_at = before["per_server"].get(server, (math.nan, math.nan))
        if math.isfinite(at) and math.isfinite(old_at) and at > old_at:
            done += count - old_count
            due += (at - old_at) / interval
    return done, due


def scrape_load(port: int, scrapers: int, seconds: float, burst_every: float = 0.0) -> dict:
    """`scrapers` concurrent clients for `seconds`: back to back (closed loop: a client starts
    its next scrape when its last one ends), or, with `burst_every`, all of them at the same
    moment once every `burst_every` seconds (as that many Prometheus servers scraping alike).

    One thread drives every client over non-blocking sockets (a selector), so the client side
    adds no GIL contention of its own: each request is Prometheus' (its Accept header, gzip) on
    a fresh connection, timed from connect to the server's close. A scrape that fails (no full
    answer within SCRAPE_TIMEOUT) counts with the time it took: the percentiles are then lower
    bounds."""
    request = ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: bench\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in SCRAPE_HEADERS.items())
               + "Connection: close\r\n\r\n").encode()
    latencies: list[float] = []
    failures: list[str] = []
    sel = selectors.DefaultSelector()
    stop_at = time.monotonic() + seconds
    active = 0
    again = not burst_every

    def start() -> None:
        nonlocal active
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sel.register(sock, selectors.EVENT_WRITE, [time.perf_counter(), []])
        active += 1

    def done(sock, state, error: str | None) -> None:
        nonlocal active
        sel.unregister(sock)
        sock.close()
        active -= 1
        latencies.append(time.perf_counter() - state[0])
        body = b"".join(state[1])
        if error is None and not body.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
            error = f"answer {body[:20]!r}"
        if error is not None:
            failures.append(error)
        if again and time.monotonic() < stop_at:
            start()

    next_burst = time.monotonic()
    while True:
        if not active:
            if time.monotonic() >= stop_at or (again and latencies):
                break
            if latencies and len(failures) >= scrapers and failures[-scrapers:] == [
                    "timeout"] * scrapers:
                break  # a whole burst timed out: more of them only add 10 s each
            time.sleep(max(0.0, next_burst - time.monotonic()))
            next_burst += burst_every
            for _ in range(scrapers):
                start()
        now = time.perf_counter()
        for key, _ in sel.select(timeout=0.1):
            sock, state = key.fileobj, key.data
            try:
                if key.events & selectors.EVENT_WRITE:
                    sock.sendall(request)  # small: fits the send buffer of a fresh socket
                    sel.modify(sock, selectors.EVENT_READ, state)
                    continue
                chunk = sock.recv(1 << 16)
            except OSError as err:
                done(sock, state, repr(err))
                continue
            if chunk:
                state[1].append(chunk)
            else:
                done(sock, state, None)
        for key in list(sel.get_map().values()):
            if now - key.data[0] > SCRAPE_TIMEOUT:
                done(key.fileobj, key.data, "timeout")
    sel.close()
    out = summary(latencies, 1e3) if latencies else {"n": 0}
    return out | {"failures": len(failures), "failure_kinds": sorted(set(failures))[:3],
                  "scrapers": scrapers, "seconds": seconds, "burst_every": burst_every}


# Where a py-spy sample's stack is, by the first rule that matches a frame's file.
SPY_RULES = (
    ("gzip", ("gzip.py",)),
    ("render (prometheus_client)", ("openmetrics/exposition.py", "client/exposition.py")),
    ("collect (families from snapshots)", ("collector.py", "catalogue.py", "metrics_core.py")),
    ("parse /metrics", ("sglang_exposition.py",)),
    ("HTTP client (polls)", ("http_fetch.py",)),
    ("JSON + parse_loads", ("json/", "sglang_api.py")),
    ("derive", ("derived.py",)),
    ("poll, other (snapshot, queue run, logging)", ("poller.py",)),
    ("HTTP server (scrapes)", ("wsgiref", "socketserver", "exporter/web.py", "http/server")),
)


def py_spy(binary: str, pid: int, seconds: float) -> dict:
    """Samples of the thread holding the GIL (`py-spy record --gil`), by where they are."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        subprocess.run([binary, "record", "--gil", "--nonblocking", "--format", "raw", "-r", "100",
                        "-d", str(max(1, round(seconds))), "-o", out.name, "-p", str(pid)],
                       check=True, capture_output=True)
        lines = Path(out.name).read_text().splitlines()
    counts: dict[str, int] = {}
    for line in lines:
        stack, _, n = line.rpartition(" ")
        where = next((what for what, files in SPY_RULES if any(f in stack for f in files)),
                     "other")
        counts[where] = counts.get(where, 0) + int(n)
    total = sum(counts.values()) or 1
    return {"samples": total, "gil_held_share": total / (100 * max(1, round(seconds))),
            "share": {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}}


def bench_fleet(files, servers: int, warmup: float, window: float, scrape_seconds: float,
                bursts: int, fake_procs: int, concurrent: int, spy: str | None = None) -> dict:
    with tempfile.TemporaryFile(mode="w+") as log:  # a pipe nobody reads would block logging
        return _fleet_run(files, servers, warmup, window, scrape_seconds, bursts, fake_procs,
                          concurrent, spy, log)


def _fleet_run(files, servers, warmup, window, scrape_seconds, bursts, fake_procs, concurrent,
               spy, log) -> dict:
    fleet = Fleet(servers, fake_procs, files)
    port = free_port()
    exe = Path(sys.executable).parent / "sglang-exporter"
    argv = [str(exe), "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.docker",
            "--no-collector.nvml", "--log.level", "warn"]
    for url in fleet.urls:
        argv += ["--sglang.url", url]
    proc = subprocess.Popen(argv, stderr=log, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 60
        while True:  # listening, and every server polled at least once
            try:
                if polls_state(port)["polled"] == servers:
                    break
            except (OSError, RuntimeError, http.client.HTTPException):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"exporter did not come up: {log.read()[-2000:]}")
            time.sleep(0.2)
        time.sleep(warmup)
        before = polls_state(port)
        fakes0 = sum(cpu_seconds(p.pid) for p in fleet.procs)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        load0 = os.getloadavg()[0]
        time.sleep(window)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        fakes1 = sum(cpu_seconds(p.pid) for p in fleet.procs)
        rss = status_kib(proc.pid, "VmRSS") / 1024
        hwm = status_kib(proc.pid, "VmHWM") / 1024
        threads = status_kib(proc.pid, "Threads")
        after = polls_state(port)
        polls, due = polls_and_due(before, after)
        result = {
            "servers": servers, "warmup_s": warmup, "window_s": round(t1 - t0, 2),
            "cpu_percent_of_core": (cpu1 - cpu0) / (t1 - t0) * 100,
            "fakes_cpu_percent_of_core": (fakes1 - fakes0) / (t1 - t0) * 100,
            "fake_processes": len(fleet.procs),
            "loadavg_1m": [load0, os.getloadavg()[0]],
            "rss_mib": rss, "rss_peak_mib": hwm, "threads": threads,
            "polls": polls, "polls_due": due,  # one per server per 1 s interval
            "poll_errors": after["errors"] - before["errors"],
            "up": after["up"],
        }
        result["polls_of_due"] = result["polls"] / result["polls_due"]
        result["scrape_1"] = scrape_load(port, 1, scrape_seconds)
        before = polls_state(port)
        result[f"scrape_{concurrent}"] = scrape_load(port, concurrent, scrape_seconds)
        after = polls_state(port)
        polls, due = polls_and_due(before, after)
        result["polls_of_due_while_scraped"] = polls / due
        result[f"scrape_{concurrent}_bursts"] = scrape_load(port, concurrent, bursts,
                                                            burst_every=1.0)
        if spy:  # after the measurements: the sampler takes CPU of its own
            result["py_spy_polls_only"] = py_spy(spy, proc.pid, scrape_seconds * 2)
            scrapers = threading.Thread(target=scrape_load,
                                        args=(port, concurrent, scrape_seconds * 2))
            scrapers.start()
            result[f"py_spy_polls_and_{concurrent}_scrapers"] = py_spy(spy, proc.pid,
                                                                       scrape_seconds * 2)
            scrapers.join()
        if proc.poll() is not None:
            raise RuntimeError("exporter exited during the run")
        return result
    finally:
        proc.terminate()
        proc.wait()
        fleet.close()
        log.seek(0)
        warnings = log.read().splitlines()
        if warnings:
            print(f"exporter at {servers} servers logged {len(warnings)} lines, the last: "
                  f"{warnings[-1]}", file=sys.stderr)


# --- where the time goes --------------------------------------------------------------------------

def bench_breakdown(files, servers: int, rounds: int, iterations: int) -> dict:
    """CPU of each stage of the poll path, one stage at a time on the same answers (interleaved,
    in rounds), and of each stage of one scrape's render with `servers` servers."""
    fleet = Fleet(servers, 1 if servers <= 32 else 2, files)
    try:
        pollers = [TargetPoller(url, PollSettings(timeout=5, server_info_interval=1e9))
                   for url in fleet.urls]
        for poller in pollers:
            poller.poll_once()
            require(poller.snapshot.up, f"{poller.server} not up")
        poller, port = pollers[0], fleet.ports[0]
        limit = 16 << 20
        metrics_url, loads_url = poller.base_url + "/metrics", poller.base_url + "/v1/loads"
        metrics = fetch(metrics_url, timeout=5, max_bytes=limit, accept=METRICS_ACCEPT)
        loads_body = fetch(loads_url, timeout=5, max_bytes=limit, accept="application/json").body
        native = parse_exposition(metrics.body.decode("utf-8", "replace"), metrics.content_type)
        load = parse_loads(json.loads(loads_body))
        stages = {
            "poll_once": poller.poll_once,
            "http_urllib": lambda: (
                fetch(metrics_url, timeout=5, max_bytes=limit, accept=METRICS_ACCEPT),
                fetch(loads_url, timeout=5, max_bytes=limit, accept="application/json")),
            "http_bare_http_client": lambda: (
                _get("127.0.0.1", port, "/metrics", METRICS_ACCEPT),
                _get("127.0.0.1", port, "/v1/loads", "application/json")),
            "decode_and_parse": lambda: parse_exposition(
                metrics.body.decode("utf-8", "replace"), metrics.content_type),
            "json_and_parse_loads": lambda: parse_loads(json.loads(loads_body)),
            "derive": lambda: derive(native, load, poller._config, poller._models_context),
        }
        poll = interleaved_cpu(stages, rounds, iterations)
    finally:
        fleet.close()
    stats = {}
    for stat in ("min_ms", "median_ms"):
        v = {name: r[stat] for name, r in poll.items()}
        v["rest_snapshot_queue_locks"] = v["poll_once"] - sum(
            v[k] for k in ("http_urllib", "decode_and_parse", "json_and_parse_loads", "derive"))
        stats[stat] = v
    medians = stats["median_ms"]

    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector(pollers)]))
    families = _Frozen(list(registry.collect()))
    om = generate_openmetrics(families)
    ours = Renderer()
    require(ours.openmetrics(families.collect()) == om, "our OpenMetrics render differs")
    require(ours.text(families.collect()) == generate_latest(families), "our text render differs")
    render = interleaved_cpu({
        "collect": lambda: list(registry.collect()),
        "render_openmetrics": lambda: ours.openmetrics(families.collect()),
        "render_text": lambda: ours.text(families.collect()),
        "render_openmetrics_prometheus_client": lambda: generate_openmetrics(families),
        "render_text_prometheus_client": lambda: generate_latest(families),
        "gzip": lambda: gzip.compress(om, GZIP_LEVEL, mtime=0),
    }, rounds, max(1, iterations // 20))
    scrape_ms = sum(render[k]["median_ms"] for k in ("collect", "render_openmetrics", "gzip"))
    per_poll = medians["poll_once"]
    return {
        "servers": servers, "rounds": rounds, "poll_iterations_per_round": iterations,
        "poll_stage_median_ms": medians, "poll_stage_min_ms": stats["min_ms"],
        "poll_stages": poll,
        "render_stage_median_ms": {k: v["median_ms"] for k, v in render.items()},
        "render": render, "openmetrics_bytes": len(om),
        "model": {
            "poll_cpu_ms": per_poll,
            "one_core_polls_per_second": 1e3 / per_poll,
            "scrape_render_ms": scrape_ms,
            "percent_of_core_at": {n: n * per_poll / 10 for n in (1, 8, 32, 128, 256)},
        },
    }


# --- report --------------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:,.0f}"


# Targets (issue "cost at the floor"): ratios against the yardsticks, and absolute figures.
PARSE_RATIO = 1.5  # parse_exposition / the targeted scan
CYCLE_RATIO = 1.5  # poll_once / the raw-socket floor cycle
CPU_8_SERVERS = 1.0  # % of one core
SCRAPE_P99_MS, SCRAPE_MAX_MS = 25.0, 100.0  # 20 concurrent scrapers at 32 servers
POLLS_OF_DUE_256 = 0.99  # 256 servers, while 20 scrapers run


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _fleet_at(results: dict, servers: int) -> dict | None:
    return next((r for r in results.get("fleet", []) if r.get("servers") == servers
                 and "error" not in r), None)


def targets(results: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target this run measured."""
    rows = []
    poll = results.get("poll_cpu")
    if poll:
        for key, what, limit in (("parse", "parse ≤ {:g}× the targeted scan", PARSE_RATIO),
                                 ("cycle", "poll cycle ≤ {:g}× the raw-socket floor",
                                  CYCLE_RATIO)):
            r = poll[key]
            rows.append((what.format(limit), f"{r['ratio_min']:.2f}× min, "
                         f"{r['ratio_median']:.2f}× median", r["ratio_median"] <= limit))
    c = results.get("concurrent", 20)
    at8 = _fleet_at(results, 8)
    if at8:
        rows.append((f"8 servers ≤ {CPU_8_SERVERS:g} % of a core",
                     f"{at8['cpu_percent_of_core']:.2f} %",
                     at8["cpu_percent_of_core"] <= CPU_8_SERVERS))
    at32 = _fleet_at(results, 32)
    if at32:
        for key, how in ((f"scrape_{c}", "back to back"), (f"scrape_{c}_bursts", "all at once")):
            r = at32[key]
            ok = bool(r.get("n")) and not r["failures"] and r["p99"] <= SCRAPE_P99_MS \
                and r["max"] <= SCRAPE_MAX_MS
            measured = (f"p99 {_ms(r['p99'])} ms, max {_ms(r['max'])} ms"
                        + (f", {r['failures']} of {r['n']} failed" if r["failures"] else "")
                        if r.get("n") else "none answered")
            rows.append((f"scrape p99 ≤ {SCRAPE_P99_MS:g} ms and max ≤ {SCRAPE_MAX_MS:g} ms, "
                         f"{c} scrapers {how}, 32 servers", measured, ok))
    at256 = _fleet_at(results, 256)
    if at256:
        share = at256["polls_of_due_while_scraped"]
        rows.append((f"256 servers ≥ {POLLS_OF_DUE_256:.0%} of due polls while {c} scrapers run",
                     f"{share:.1%}", share >= POLLS_OF_DUE_256))
    return rows


def doc_block(results: dict) -> str:
    """docs/performance.md's exporter block, from the JSON this script writes."""
    m = results["machine"]
    load = m["loadavg_at_start"], m["loadavg"]
    out = [f"Measured by `bench/bench_exporter.py {' '.join(m['argv'])}` on {m['date']}: "
           f"{m['cpus']} CPUs, Python {m['python']}, prometheus_client "
           f"{m['prometheus_client']}, 1-minute load average {load[0][0]:.1f} at the start and "
           f"{load[1][0]:.1f} at the end. Rounds interleave both sides; min and median over "
           "the rounds.", "", "| target | measured | |", "|---|---|---|"]
    out += [f"| {what} | {measured} | {_met(ok)} |" for what, measured, ok in targets(results)]
    poll = results.get("poll_cpu")
    if poll:
        out += ["", f"CPU per call, {poll['rounds']} rounds of "
                f"{poll['parse_iterations_per_round']} parses and "
                f"{poll['cycle_iterations_per_round']} cycles per side (body: "
                f"{poll['exposition_lines']:,} lines, {poll['exposition_bytes']:,} bytes, "
                f"{poll['samples']:,} samples, {poll['values_extracted']} values kept):", "",
                "| ms of CPU | min | median |", "|---|---|---|"]
        for key, ours, floor in (("parse", "`parse_exposition`", "targeted scan (`floor_scan`)"),
                                 ("cycle", "`TargetPoller.poll_once` (/metrics + /v1/loads)",
                                  "raw-socket GETs + targeted scan + `json.loads`")):
            r = poll[key]
            out += [f"| {ours} | {r['exporter']['min_ms']:.3f} | "
                    f"{r['exporter']['median_ms']:.3f} |",
                    f"| {floor} | {r['floor']['min_ms']:.3f} | {r['floor']['median_ms']:.3f} |"]
    sc = results.get("scrape")
    if sc:
        out += ["", f"A scrape of {sc['servers']} servers' families ({sc['series']:,} series) "
                "against bare prometheus_client serving the same bytes, ms:", "",
                "| side | min | median | p99 |", "|---|---|---|---|"]
        for side, what in (("ours", "ours, state unchanged"),
                           ("ours_changed", "ours, state changed before each scrape"),
                           ("bare", "bare prometheus_client (renders per request)")):
            r = sc[side]
            out.append(f"| {what} | {_ms(r['min'])} | {_ms(r['median'])} | {_ms(r['p99'])} |")
    fleet = results.get("fleet", [])
    if fleet:
        c = results.get("concurrent", 20)
        out += ["", "The `sglang-exporter` process polling N fake servers every second:", "",
                "| servers | CPU, % of a core | RSS, MiB | polls / due | … while "
                f"{c} scrape | scrape p50 / p99 / max, ms: 1 scraper | {c} back to back | "
                f"{c} at once, each second |", "|---|---|---|---|---|---|---|---|"]

        def lat(r):
            if not r.get("n"):
                return "none answered"
            failed = f" ({r['failures']} of {r['n']} failed)" if r["failures"] else ""
            return f"{_ms(r['median'])} / {_ms(r['p99'])} / {_ms(r['max'])}{failed}"

        for r in fleet:
            if "error" in r:
                out.append(f"| {r['servers']} | failed: {r['error'][:120]} |||||||")
                continue
            out.append(f"| {r['servers']} | {r['cpu_percent_of_core']:.2f} | {r['rss_mib']:.1f} "
                       f"| {r['polls_of_due']:.1%} | {r['polls_of_due_while_scraped']:.1%} | "
                       f"{lat(r['scrape_1'])} | {lat(r[f'scrape_{c}'])} | "
                       f"{lat(r[f'scrape_{c}_bursts'])} |")
    bd = results.get("breakdown")
    if bd:
        med, low = bd["poll_stage_median_ms"], bd["poll_stage_min_ms"]
        out += ["", "Where one poll's CPU goes, stage by stage on the same answers (ms):", "",
                "| stage | min | median |", "|---|---|---|"]
        for key, what in (("http_urllib", "HTTP client (`fetch` of /metrics + /v1/loads)"),
                          ("decode_and_parse", "decode + `parse_exposition`"),
                          ("json_and_parse_loads", "`json.loads` + `parse_loads`"),
                          ("derive", "`derive`"),
                          ("rest_snapshot_queue_locks", "the rest (snapshot, queue run, locks)"),
                          ("poll_once", "whole `poll_once`"),
                          ("http_bare_http_client", "for comparison: `http.client`, same GETs")):
            out.append(f"| {what} | {low[key]:.3f} | {med[key]:.3f} |")
        r = bd["render"]
        out += ["", f"One scrape's render at {bd['servers']} servers ({bd['openmetrics_bytes']:,} "
                "bytes of OpenMetrics), ms of CPU:", "", "| stage | min | median |",
                "|---|---|---|"]
        for key, what in (("collect", "collect (families from the snapshots)"),
                          ("render_openmetrics", "OpenMetrics render (exposition_format.py)"),
                          ("render_text", "text render (exposition_format.py)"),
                          ("render_openmetrics_prometheus_client",
                           "for comparison: prometheus_client's OpenMetrics render"),
                          ("render_text_prometheus_client",
                           "for comparison: prometheus_client's text render"),
                          ("gzip", f"gzip, level {GZIP_LEVEL}")):
            out.append(f"| {what} | {r[key]['min_ms']:.2f} | {r[key]['median_ms']:.2f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a short run: fewer rounds and iterations, fleet 1,8,32, 5 s windows")
    parser.add_argument("--parts", default="poll,scrape,fleet,breakdown",
                        help="comma-separated: poll, scrape, fleet, breakdown (default: all)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of parts 1 and 2 (>= 5)")
    parser.add_argument("--parse-iterations", type=int, default=200,
                        help="parse calls per side per round")
    parser.add_argument("--cycle-iterations", type=int, default=100,
                        help="poll cycles per side per round")
    parser.add_argument("--scrape-servers", type=int, default=32,
                        help="servers whose families the scrape benchmark serves")
    parser.add_argument("--scrape-requests", type=int, default=20,
                        help="requests per side per round in the scrape benchmark")
    parser.add_argument("--fleet", default="1,8,32,128,256",
                        help="comma-separated server counts for the exporter-process runs")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    parser.add_argument("--window", type=float, default=6.0,
                        help="seconds of CPU / RSS / polls measurement per server count")
    parser.add_argument("--scrape-seconds", type=float, default=2.0,
                        help="seconds of scraping per scraper count per server count")
    parser.add_argument("--concurrent", type=int, default=20, help="concurrent scrapers")
    parser.add_argument("--bursts", type=int, default=2,
                        help="bursts of all concurrent scrapers at once, one a second")
    parser.add_argument("--fake-procs", type=int, default=2,
                        help="processes the fake servers are spread over (one for <= 8)")
    parser.add_argument("--breakdown-servers", type=int, default=128,
                        help="servers of the where-the-time-goes part (its render stages)")
    parser.add_argument("--py-spy", metavar="BINARY",
                        help="profile the exporter with this py-spy after each fleet run "
                        "(polls only, then polls + concurrent scrapers)")
    parser.add_argument("--json", type=Path, help="also write the JSON results here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.parse_iterations, args.cycle_iterations = 5, 50, 20
        args.scrape_requests, args.fleet = 30, "1,8,32"
        args.warmup, args.window, args.scrape_seconds, args.bursts = 2.0, 5.0, 1.5, 2
        args.breakdown_servers = 32
    if args.rounds < 5:
        parser.error("--rounds: at least 5")
    parts = set(args.parts.split(","))

    results: dict = {}
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        exposition = realistic_exposition()
        files = fixture_files(Path(tmp), exposition)
        if "poll" in parts:
            results["poll_cpu"] = bench_poll_cpu(files, exposition, args.rounds,
                                                 args.parse_iterations, args.cycle_iterations)
        if "scrape" in parts:
            results["scrape"] = bench_scrape(files, args.scrape_servers, args.rounds,
                                             args.scrape_requests)
        if "fleet" in parts:
            results["fleet"] = []
            for n in map(int, args.fleet.split(",")):
                try:
                    results["fleet"].append(bench_fleet(
                        files, n, args.warmup, args.window, args.scrape_seconds, args.bursts,
                        1 if n <= 8 else args.fake_procs, args.concurrent, args.py_spy))
                except (RuntimeError, OSError, subprocess.SubprocessError) as err:
                    results["fleet"].append({"servers": n, "error": str(err)[-500:]})
        if "breakdown" in parts:
            results["breakdown"] = bench_breakdown(files, args.breakdown_servers, args.rounds,
                                                   args.cycle_iterations)
    results["concurrent"] = args.concurrent
    from results_file import emit, machine

    results["machine"] = machine(load_at_start) | {
        "prometheus_client": _version("prometheus_client")}
    emit(results, args.json, doc_block)


def _version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


if __name__ == "__main__":
    main()
