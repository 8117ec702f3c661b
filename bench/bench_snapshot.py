"""`sglang-obs snapshot`'s wall time over a 30-minute window, reported in docs/performance.md.

A real Prometheus is backfilled with the last 30 minutes of the seed 000 incident
(long-context-incident, its recording rules and ALERTS series, as the tests' Prometheus). Three
sides run in turn, the order alternating, in rounds (min and median reported):
- `take(..., charts=False)`: the pack without pictures (`--no-charts`);
- `take(...)`: the whole pack, one PNG chart per server;
- the queries alone: every HTTP request the snapshot made (recorded on the first round), sent
  again as bare `urllib` GETs and decoded with `json.loads`: what any snapshot of this window
  waits for, the floor.
The first three run in-process after a warm-up (imports, matplotlib's font cache), so they are
the snapshot's own work; a fourth side runs the `sglang-obs snapshot --no-charts` command, as a
person does, Python's start and imports included.

Run: .venv/bin/python bench/bench_snapshot.py [--rounds 5] [--json bench/results/snapshot.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from results_file import emit, machine

from sglang_obs.core import prometheus_api
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.tools import snapshot

SCENARIO = "long-context-incident"
WINDOW_S = 1800
TARGET_S = 1.0  # the pack without charts, 30 minutes of one server


def recorded_queries(url: str, start: float, end: float, out: Path) -> list[str]:
    """The URLs of the requests one snapshot sends (the client's own _get, wrapped)."""
    urls: list[str] = []
    real = prometheus_api.Prometheus._get

    def record(self, path, params):
        urls.append(f"{self.url}{path}?{urllib.parse.urlencode(params)}")
        return real(self, path, params)

    prometheus_api.Prometheus._get = record
    try:
        snapshot.take(url, str(start), str(end), out, charts=False)
    finally:
        prometheus_api.Prometheus._get = real
    return urls


def replay(urls: list[str]) -> None:
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as resp:
            json.loads(resp.read())


def run(rounds: int) -> dict:
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        b = backfill(SCENARIO, tmp / "data", alerts=True, duration=WINDOW_S)
        start = max(b.start, b.end - WINDOW_S)
        with prometheus(b.data) as url:
            urls = recorded_queries(url, start, b.end, tmp / "warm")
            snapshot.take(url, str(start), str(b.end), tmp / "warm-charts")  # font cache
            n = iter(range(10**6))

            def pack(charts: bool):
                return lambda: snapshot.take(url, str(start), str(b.end),
                                             tmp / f"pack-{next(n)}", charts=charts)

            exe = str(Path(sys.executable).parent / "sglang-obs")

            def command():
                subprocess.run([exe, "snapshot", "--prometheus", url, "--from", str(start),
                                "--to", str(b.end), "--out", str(tmp / f"cli-{next(n)}"),
                                "--no-charts"], check=True, capture_output=True, timeout=120)

            sides = {"no_charts": pack(False), "charts": pack(True),
                     "queries_only": lambda: replay(urls), "command_no_charts": command}
            seconds: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(rounds):
                for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                    began = time.perf_counter()
                    sides[name]()
                    seconds[name].append(time.perf_counter() - began)
    return {"scenario": SCENARIO, "window_s": round(b.end - start), "rounds": rounds,
            "queries": len(urls),
            "seconds": {k: {"min": min(v), "median": statistics.median(v), "all": v}
                        for k, v in seconds.items()},
            "machine": machine(load_at_start)}


def doc_block(r: dict) -> str:
    m, s = r["machine"], r["seconds"]
    fast = s["command_no_charts"]["median"]
    rows = [f"Measured by `bench/bench_snapshot.py {' '.join(m['argv'])}` on {m['date']}: "
            f"{m['cpus']} CPUs, Python {m['python']}, 1-minute load average "
            f"{m['loadavg_at_start'][0]:.1f} at the start and {m['loadavg'][0]:.1f} at the end. "
            f"A {r['window_s'] / 60:.0f}-minute window of `{r['scenario']}` in a real "
            f"Prometheus, one server; {r['rounds']} rounds, the sides in turn; "
            f"{r['queries']} HTTP queries per snapshot.", "",
            "| target | measured | |", "|---|---|---|",
            f"| `sglang-obs snapshot --no-charts`, 30 minutes, ≤ {TARGET_S:g} s | {fast:.2f} s "
            "median "
            f"| {'met' if fast <= TARGET_S else '**missed**'} |", "",
            "| wall time, s | min | median |", "|---|---|---|"]
    for key, what in (("no_charts", "`snapshot --no-charts`, in-process"),
                      ("charts", "`snapshot` (one PNG chart per server), in-process"),
                      ("command_no_charts", "the `sglang-obs snapshot --no-charts` command, "
                       "Python's start included"),
                      ("queries_only", "its queries alone, replayed with `urllib` + `json.loads`")):
        rows.append(f"| {what} | {s[key]['min']:.3f} | {s[key]['median']:.3f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    emit(run(args.rounds), args.json, doc_block)


if __name__ == "__main__":
    main()
