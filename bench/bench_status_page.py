"""The glance page's cost, reported in docs/performance.md.

1. /metrics scrape latency with and without the page being polled. N pollers are filled once
   from the realistic 0.5.23 answer (bench_exporter.realistic_exposition, served in-process) and
   N trackers with an hour and a bit of 1 s polls; one exporter app (exporter/web.py with the
   glance routes) serves both. Each scrape is Prometheus' request on a fresh connection, with
   `changed()` before it, so every scrape renders (the live exporter's state moves every poll).
   Sides, interleaved phase by phase within every round (their order alternating): `alone` (no
   page request), `viewers` (/api/v1/status once a second: five open pages at the script's 5 s)
   and `hammered` (a client fetching /api/v1/status and / back to back, without pause, the
   whole phase). Min and median over all scrapes of a side, and each round's median.
2. Bytes per server: tracemalloc's traced memory of one tracker after one hour and after two
   hours of 1 s polls (its history is full after one: the two are equal), and the bytes of its
   ring arrays.

Run: .venv/bin/python bench/bench_status_page.py [--servers 32] [--rounds 7] [--scrapes 40]
Prints JSON, then a markdown table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_exporter import (
    SCRAPE_HEADERS,
    TEXT_CONTENT_TYPE,
    interleaved_cpu,
    realistic_exposition,
    require,
    scrape,
    summary,
)
from prometheus_client import CollectorRegistry
from results_file import emit, machine

from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.http_fetch import Response
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.status import StatusBoard, load_classification
from sglang_obs.exporter.status_page import GlancePages, page, status_json
from sglang_obs.exporter.web import Exposition, make_app, serve

LOADS = json.dumps({"loads": [{
    "dp_rank": 0, "num_running_reqs": 9, "num_waiting_reqs": 3,
    "num_waiting_uncached_tokens": 292965, "num_used_tokens": 486000,
    "max_total_num_tokens": 2300000, "max_running_requests": 44, "gen_throughput": 210.0}]})


def fetcher(metrics: bytes):
    def fetch(url, *, timeout, max_bytes, accept="*/*", headers=None):
        if url.endswith("/metrics"):
            return Response(200, TEXT_CONTENT_TYPE, metrics)
        if url.endswith("/v1/loads"):
            return Response(200, "application/json", LOADS.encode())
        if url.endswith("/v1/models"):
            return Response(200, "application/json", b'{"data": []}')
        return Response(200, "application/json", b'{"version": "0.5.23", "tp_size": 4}')
    return fetch


def fill(tracker, snapshot, seconds: int, start: float = 0.0) -> None:
    """`seconds` of 1 s polls of a busy server whose load moves."""
    d = snapshot.derived
    counters = dict(snapshot.native_values)
    for i in range(seconds):
        t = start + i
        wave = (i % 97) / 97
        counters = {k: v + 1.0 for k, v in counters.items()}
        tracker.observe(t, replace(snapshot, polls=int(t) + 1, native_values=counters,
                                   derived=replace(d, running_requests=4 + 8 * wave,
                                                   waiting_requests=float(i % 5),
                                                   decode_speed_per_request=20 + 10 * wave)))


def get(port: int, path: str) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        require(resp.status == 200, f"{path}: HTTP {resp.status}")
    finally:
        conn.close()
    return time.perf_counter() - started


class PageLoad:
    """A client thread asking for the page while a phase runs: every `every` seconds, or back
    to back when `every` is 0 (/api/v1/status and / alternately)."""

    def __init__(self, port: int, every: float):
        self.port, self.every = port, every
        self.latencies: dict[str, list[float]] = {"/api/v1/status": [], "/": []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            path = "/api/v1/status" if self.every or i % 2 == 0 else "/"
            self.latencies[path].append(get(self.port, path))
            i += 1
            if self.every:
                self._stop.wait(self.every)


def bench_scrapes(servers: int, rounds: int, scrapes: int, history: int) -> dict:
    metrics = realistic_exposition().encode()
    pollers = [TargetPoller(f"http://10.0.0.{i}:30000", PollSettings(), fetcher=fetcher(metrics))
               for i in range(servers)]
    for poller in pollers:
        poller.poll_once()
        require(poller.snapshot.up, "a poller is not up")
    board = StatusBoard(load_classification(), poll_interval=1.0)
    for poller in pollers:
        tracker = board.add(poller.server)
        fill(tracker, poller.snapshot, history)
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector(pollers)]))
    exposition = Exposition(registry)
    urls = [p.base_url for p in pollers]
    server = serve(make_app(exposition, "/metrics", urls, GlancePages(board, "/metrics", urls)),
                   "127.0.0.1:0")
    port = server.server_address[1]
    sides = {"alone": None, "viewers": 1.0, "hammered": 0.0}
    samples: dict[str, list[float]] = {s: [] for s in sides}
    medians: dict[str, list[float]] = {s: [] for s in sides}
    page: dict[str, list[float]] = {"/api/v1/status": [], "/": []}
    page_requests = {s: 0 for s in sides}
    try:
        scrape(port)
        status = json.loads(_body(port, "/api/v1/status"))
        require(len(status["servers"]) == servers, "the page lacks servers")
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for side in order:
                this: list[float] = []
                load = PageLoad(port, sides[side]) if sides[side] is not None else None
                with load or _Nothing():
                    for _ in range(scrapes):
                        exposition.changed()
                        seconds, _, _ = scrape(port, SCRAPE_HEADERS)
                        this.append(seconds)
                        time.sleep(0.01)
                if load is not None:
                    page_requests[side] += sum(len(v) for v in load.latencies.values())
                    if side == "hammered":
                        for path, values in load.latencies.items():
                            page[path] += values
                samples[side] += this
                medians[side].append(statistics.median(this))
    finally:
        server.shutdown()
        server.server_close()
    out: dict = {"servers": servers, "rounds": rounds, "scrapes_per_phase": scrapes,
                 "history_seconds": history, "page_requests": page_requests}
    for side in sides:
        out[side] = summary(samples[side], 1e3) | {
            "round_median_ms": [round(x * 1e3, 2) for x in medians[side]]}
    for side in ("viewers", "hammered"):
        out[f"{side}_over_alone"] = {"min": out[side]["min"] / out["alone"]["min"],
                                     "median": out[side]["median"] / out["alone"]["median"]}
    out["page_ms"] = {path: summary(v, 1e3) for path, v in page.items() if v}
    return out


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _body(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def bench_memory() -> dict:
    metrics = realistic_exposition().encode()
    poller = TargetPoller("http://10.0.0.1:30000", PollSettings(), fetcher=fetcher(metrics))
    poller.poll_once()
    snap = poller.snapshot
    board = StatusBoard(load_classification(), poll_interval=1.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracker = board.add(poller.server)
        fill(tracker, snap, 3600)
        one_hour = tracemalloc.get_traced_memory()[0] - before
        fill(tracker, snap, 3600, start=3600.0)
        two_hours = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return {"traced_bytes_after_1h": one_hour, "traced_bytes_after_2h": two_hours,
            "ring_bytes": tracker.nbytes()}


def bench_cost(servers: int, rounds: int, iterations: int, history: int) -> dict:
    """CPU of one uncached /api/v1/status and one uncached / against one /metrics render (the
    collect, the OpenMetrics render) of the same servers, interleaved call by call."""
    metrics = realistic_exposition().encode()
    pollers = [TargetPoller(f"http://10.0.0.{i}:30000", PollSettings(), fetcher=fetcher(metrics))
               for i in range(servers)]
    board = StatusBoard(load_classification(), poll_interval=1.0)
    for poller in pollers:
        poller.poll_once()
        fill(board.add(poller.server), poller.snapshot, history)
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector(pollers)]))
    exposition = Exposition(registry)

    def render():
        exposition.changed()
        return exposition.body(openmetrics=True, gzipped=False)

    require(len(json.loads(status_json(board))["servers"]) == servers, "status lacks servers")
    cost = {}
    for name, call in (("status", lambda: status_json(board)),
                       ("page", lambda: page(board, "/metrics", []))):
        cost[name] = interleaved_cpu({name: call, "metrics_render": render}, rounds, iterations)
    return {"servers": servers, "rounds": rounds, "iterations_per_round": iterations, **cost}


PAGE_RATIO = 1.5  # an uncached /api/v1/status or / against one /metrics render


def doc_block(r: dict) -> str:
    s, m, c, mach = r["scrapes"], r["memory"], r["cost"], r["machine"]
    lines = [f"Measured by `bench/bench_status_page.py {' '.join(mach['argv'])}` on "
             f"{mach['date']}: {mach['cpus']} CPUs, Python {mach['python']}, 1-minute load "
             f"average {mach['loadavg_at_start'][0]:.1f} at the start and "
             f"{mach['loadavg'][0]:.1f} at the end.", "",
             "| target | measured | |", "|---|---|---|"]
    for name, what in (("status", "`/api/v1/status`"), ("page", "`/`")):
        ratio = c[name]["ratio_median"]
        lines.append(f"| {what}, uncached, ≤ {PAGE_RATIO:g}× one `/metrics` render "
                     f"({c['servers']} servers) | {ratio:.1f}× ({c[name][name]['median_ms']:.1f} "
                     f"ms against {c[name]['metrics_render']['median_ms']:.1f} ms) | "
                     f"{'met' if ratio <= PAGE_RATIO else '**missed**'} |")
    lines += ["", f"| /metrics scrape, {s['servers']} servers, renders each time | min | median |",
              "|---|---|---|"]
    names = {"alone": "no page request", "viewers": "/api/v1/status once a second",
             "hammered": "/api/v1/status and / back to back"}
    for side, name in names.items():
        lines.append(f"| {name}, ms | {s[side]['min']:.2f} | {s[side]['median']:.2f} |")
    for side in ("viewers", "hammered"):
        ratio = s[f"{side}_over_alone"]
        lines.append(f"| **{side} / alone** | {ratio['min']:.2f}× | **{ratio['median']:.2f}×** |")
    for path, v in s["page_ms"].items():
        lines.append(f"| `{path}` itself (hammered), ms | {v['min']:.1f} | {v['median']:.1f} |")
    lines += ["", "| bytes per server | |", "|---|---|",
              f"| traced after 1 h of 1 s polls | {m['traced_bytes_after_1h']:,} |",
              f"| traced after 2 h | {m['traced_bytes_after_2h']:,} |",
              f"| of which ring arrays | {m['ring_bytes']:,} |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scrapes", type=int, default=40, help="scrapes per side per round")
    parser.add_argument("--json", type=Path, help="also write the JSON results here")
    parser.add_argument("--history", type=int, default=3900,
                        help="seconds of 1 s polls each tracker holds (>= 1 h: full)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5")
    load_at_start = os.getloadavg()
    results = {"memory": bench_memory(),
               "cost": bench_cost(args.servers, args.rounds, 5, args.history),
               "scrapes": bench_scrapes(args.servers, args.rounds, args.scrapes, args.history),
               "machine": machine(load_at_start)}
    emit(results, args.json, doc_block)


if __name__ == "__main__":
    main()
