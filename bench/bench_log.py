"""Log-source benchmarks reported in docs/performance.md.

1. Parser throughput: exporter.sglang_log.parse_line over the scheduler lines of a rendered
   incident, against a bare `re` match of the same lines with the reference's prefill/decode
   regexes (the least any parser must do).
2. Follower cost: CPU of a FileFollower polling every 0.5 s while another process appends 200
   lines/s to the file, as a share of one core.

Run: .venv/bin/python bench/bench_log.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from sglang_obs.exporter.log_follow import FileFollower  # noqa: E402
from sglang_obs.exporter.log_stats import LogStats  # noqa: E402
from sglang_obs.exporter.sglang_log import parse_line  # noqa: E402
from sglang_obs.simulator import scenario as scenarios  # noqa: E402
from sglang_obs.simulator.logs import format_event  # noqa: E402
from sglang_obs.simulator.simulation import Simulation  # noqa: E402

PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)"
                    r"(?P<ranks>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] (?P<msg>.*)$")
PREFILL = re.compile(r"Prefill batch(?: \[\d+\])?[.,] #new-seq: (?P<new_seq>\d+), #new-token: "
                     r"(?P<new_token>\d+), #cached-token: (?P<cached_token>\d+), .*?token usage: "
                     r"(?P<token_usage>[\d.]+),(?:.*?#running-req: (?P<running>\d+),)?.*?"
                     r"#queue-req: (?P<queue>\d+)")
DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,] #running-req: (?P<running>\d+), .*?token "
                    r"usage: (?P<token_usage>[\d.]+),(?:.*?accept len: (?P<accept_len>[\d.]+),)?"
                    r".*?(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False), gen throughput "
                    r"\(token/s\): (?P<gen_tps>[\d.]+), #queue-req: (?P<queue>\d+)")


def incident_lines() -> list[str]:
    events: list = []
    sim = Simulation(scenarios.load("long-context-incident"), start_ts=1_785_232_800.0,
                     on_event=events.append)
    sim.advance(1200)
    return [format_event(e, "0.5.12", tp_size=4) for e in events]


def best_rate(fn, lines, repeats=5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(lines)
        best = min(best, time.perf_counter() - start)
    return len(lines) / best


def bare(lines):
    for line in lines:
        m = PREFIX.match(line)
        if m:
            msg = m.group("msg")
            PREFILL.search(msg) or DECODE.search(msg)


def ours(lines):
    for line in lines:
        parse_line(line)


WRITER = """
import sys, time
lines = open(sys.argv[1]).read().splitlines()
out = open(sys.argv[2], "a", buffering=1)
end = time.monotonic() + float(sys.argv[3])
i = 0
while time.monotonic() < end:
    for _ in range(20):
        out.write(lines[i % len(lines)] + "\\n"); i += 1
    time.sleep(0.1)
"""


def follower_cpu(lines: list[str], seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        source, log = Path(tmp) / "source.log", Path(tmp) / "sglang.log"
        source.write_text("\n".join(lines) + "\n")
        log.write_text("")
        stats = LogStats()
        follower = FileFollower(str(log), stats)
        follower.poll()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(log),
                                   str(seconds)])
        cpu0, wall0 = time.process_time(), time.monotonic()
        while writer.poll() is None:
            follower.poll()
            time.sleep(0.5)
        follower.poll()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        read = sum(stats.snapshot().lines.values())
    return {"lines_per_second": read / wall, "cpu_share_of_one_core": cpu / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    lines = incident_lines()
    parse = {"lines": len(lines), "exporter_parser_lines_per_second": best_rate(ours, lines),
             "bare_re_lines_per_second": best_rate(bare, lines)}
    parse["ratio_bare_over_ours"] = (parse["bare_re_lines_per_second"]
                                     / parse["exporter_parser_lines_per_second"])
    print(json.dumps({"parser": parse, "follower": follower_cpu(lines, args.seconds)}, indent=2))


if __name__ == "__main__":
    main()
