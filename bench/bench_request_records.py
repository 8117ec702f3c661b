"""Request-record follower cost, reported in docs/performance.md.

Another process appends SGLang request records (the simulator's 0.5.23 records of seed 000 and
the healthy scenario) to an hourly file at --rate records/s for --seconds; the follower
(exporter.request_follow.RequestRecordDir, polled every 1 s as `--sglang.request-metrics-poll-
interval` defaults to) reads them in this process, in its own thread, and the CPU time of that
thread (time.thread_time) is its cost, as a share of one core. Two record sizes:

  small  the simulator's records as written (a short fake prompt): about 1.3 KB a record;
  large  each record's request_parameters also holding a 2,000-token prompt's text and its
         input_ids, as SGLang writes them without --log-requests: about 33 KB a record.

With --exporter, the whole `sglang-exporter` process is measured too (its /proc CPU time), with
the follower, the exposition re-rendered after every batch of records, and no SGLang server
(--no-collector.sglang).

Run: .venv/bin/python bench/bench_request_records.py [--seconds 30] [--repeats 3] [--exporter]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from sglang_obs.exporter.periodic import Periodic  # noqa: E402
from sglang_obs.exporter.request_follow import RequestRecordDir  # noqa: E402
from sglang_obs.exporter.request_records import RequestStats  # noqa: E402
from sglang_obs.simulator import scenario as scenarios  # noqa: E402
from sglang_obs.simulator.profiles import profile  # noqa: E402
from sglang_obs.simulator.records import RecordSink, line  # noqa: E402
from sglang_obs.simulator.simulation import Simulation  # noqa: E402

FILE = "sglang-request-metrics-20261129_10.log"
WRITER = """
import sys, time
lines = open(sys.argv[1], "rb").read().splitlines(keepends=True)
out = open(sys.argv[2], "ab")
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
i = 0
while (now := time.monotonic()) < start + seconds:
    due = int((now - start) * rate)
    if due > i:
        out.write(b"".join(lines[j % len(lines)] for j in range(i, due)))
        out.flush()
        i = due
    time.sleep(0.02)
print(i)
"""


def records(large: bool) -> list[str]:
    out: list[str] = []
    for name in ("long-context-incident", "healthy"):
        sc = scenarios.load(name)
        sink = RecordSink(profile("0.5.23"), sc.server, 1_785_232_800.0, sc.seed,
                          [lambda rec: out.append(rec)])
        Simulation(sc, "0.5.23", start_ts=1_785_232_800.0, on_request=sink).advance(sc.duration)
    if large:
        text = " ".join(f"word{i % 997}" for i in range(2000))
        for rec in out:
            params = json.loads(rec["request_parameters"])
            params["text"] += " " + text
            params["input_ids"] = list(range(100_000, 102_000))
            rec["request_parameters"] = json.dumps(params)
    return [line(rec) for rec in out]


def follower_run(source: Path, rate: float, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / FILE).write_bytes(b"")
        stats = RequestStats()
        follower = RequestRecordDir(str(directory), stats, server="bench:1")
        cpu = [0.0]

        def cycle():
            t = time.thread_time()
            follower.poll()
            cpu[0] += time.thread_time() - t

        stop = threading.Event()
        loop = Periodic("requests bench", cycle, 1.0)
        loop.start(stop)
        time.sleep(0.2)  # the first poll: the (empty) file from its end
        wall0 = time.monotonic()
        writer = subprocess.run([sys.executable, "-c", WRITER, str(source),
                                 str(directory / FILE), str(rate), str(seconds)],
                                capture_output=True, text=True, check=True)
        time.sleep(1.5)  # the last poll reads the last records
        wall = time.monotonic() - wall0
        stop.set()
        loop.join(2)
        written = int(writer.stdout.strip())
        read = stats.snapshot().records
    return {"written": written, "read": read, "records_per_second": read / seconds,
            "cpu_share_of_one_core": cpu[0] / wall}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exporter_run(source: Path, rate: float, seconds: float) -> dict:
    """The whole sglang-exporter process: follower, exposition renders, no SGLang polling."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / FILE).write_bytes(b"")
        exe = Path(sys.executable).parent / "sglang-exporter"
        proc = subprocess.Popen([exe, "--sglang.url", "http://127.0.0.1:9",
                                 "--no-collector.sglang", "--no-collector.nvml",
                                 "--no-collector.docker", "--web.listen-address",
                                 "127.0.0.1:0", "--sglang.request-metrics-dir", str(directory)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2.0)  # started, first poll done
            cpu0, wall0 = _cpu_seconds(proc.pid), time.monotonic()
            subprocess.run([sys.executable, "-c", WRITER, str(source), str(directory / FILE),
                            str(rate), str(seconds)], capture_output=True, check=True)
            time.sleep(1.5)
            cpu, wall = _cpu_seconds(proc.pid) - cpu0, time.monotonic() - wall0
        finally:
            proc.terminate()
            proc.wait(10)
    return {"cpu_share_of_one_core": cpu / wall}


def summary(runs: list[dict]) -> dict:
    shares = [r["cpu_share_of_one_core"] for r in runs]
    return {"min": min(shares), "median": statistics.median(shares), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--exporter", action="store_true",
                        help="also measure the whole sglang-exporter process")
    args = parser.parse_args()
    out = {"rate": args.rate, "seconds": args.seconds, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            lines = records(size == "large")
            source = Path(tmp) / f"{size}.log"
            source.write_text("".join(lines))
            mean_bytes = source.stat().st_size / len(lines)
            runs = [follower_run(source, args.rate, args.seconds) for _ in range(args.repeats)]
            out[size] = {"record_bytes": round(mean_bytes), "follower": summary(runs)}
            if args.exporter:
                out[size]["exporter_process"] = summary(
                    [exporter_run(source, args.rate, args.seconds)
                     for _ in range(args.repeats)])
            print(json.dumps({size: out[size]}), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
