"""Request records: `sglang-obs analyze-requests` against a bare `json.loads` loop, and the
exporter's follower, reported in docs/performance.md ("Request records").

Records: the simulator's 0.5.23 records of seed 000 and the healthy scenario (1,490). Two sizes:

  short  as the simulator writes them (a short fake prompt): about 1.2 KB a record, as SGLang
         writes them with --log-requests-level 0/1 (no prompt text, no input ids);
  long   request_parameters also holding a 2,000-token prompt's text and its input_ids, as
         SGLang writes them without --log-requests: about 33 KB a record.

Part 1, analyze-requests (`--parts analyze`). Two files of --mb MiB each, the records repeated:
"mixed" (one record in ten long) and "short" (short records only). Per file, in --rounds rounds
(after one warm-up round), interleaved: `sglang_obs.tools.analyze_requests.main` (what the CLI
calls: the text report, stdout to /dev/null), the bare loop `for line in f: json.loads(line)`
over the same file, and a yardstick, `json.loads` of every line plus the field reads and sums
the report needs (exact quantiles from sorted lists, the slowest by a sort). CPU seconds of this
process (time.process_time; wall seconds are in the JSON too); records/s = records / seconds.
Before the rounds the yardstick's figures are checked against the tool's: record and request
counts, token sums, time range and the slowest requests equal, quantiles within 1 %.

Part 2, the follower (`--parts follower`). Another process appends records at --rate records/s
to an hourly file for --seconds; the follower (exporter.request_follow.RequestRecordDir, polled
every 1 s as `--sglang.request-metrics-poll-interval` defaults to) reads them in this process,
in its own thread, and the CPU time of that thread (time.thread_time) is its cost, as a share
of one core. With --exporter, the whole `sglang-exporter` process is measured too (its /proc CPU
time), with the follower, the exposition re-rendered after every batch of records, and no
SGLang server (--no-collector.sglang).

Run: .venv/bin/python bench/bench_request_records.py [--seconds 15] [--repeats 2] [--rounds 5]
     [--mb 100] [--parts analyze,follower] [--exporter] [--json PATH]
`doc_block(results)` is the Markdown of docs/performance.md's block, from the --json document.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from pathlib import Path

FILE = "sglang-request-metrics-20261129_10.log"
ANALYZE_RATIO = 1.0  # analyze-requests records/s >= this x the bare json.loads loop's
FOLLOWER_SHARE = 0.01  # the follower <= 1 % of a core at RATE records/s
RATE = 200
LONG_EVERY = 10  # the mixed file: one record in ten long
LONG_PROMPT_TOKENS = 2000  # a long record's prompt: its text and input_ids
TOP = 10  # the slowest the report lists (analyze-requests' default)
QUANTILE_TOLERANCE = 0.01  # the report's quantiles: within 1 % of the exact ones
POLL_SECONDS = 1.0  # the follower's poll interval (--sglang.request-metrics-poll-interval)
RELEASE = "0.5.23"
SCENARIOS = ("long-context-incident", "healthy")  # seed 000's incident, a healthy server
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


# -- records ---------------------------------------------------------------------------------
def simulated() -> list[dict]:
    """The simulator's 0.5.23 records of seed 000 and the healthy scenario, as dicts."""
    from sglang_obs.simulator import scenario as scenarios
    from sglang_obs.simulator.profiles import profile
    from sglang_obs.simulator.records import RecordSink
    from sglang_obs.simulator.simulation import Simulation

    out: list[dict] = []
    for name in SCENARIOS:
        sc = scenarios.load(name)
        sink = RecordSink(profile(RELEASE), sc.server, 1_785_232_800.0, sc.seed,
                          [lambda rec: out.append(rec)])
        Simulation(sc, RELEASE, start_ts=1_785_232_800.0, on_request=sink).advance(sc.duration)
    return out


def record_lines(recs: list[dict], long: bool) -> list[str]:
    """Each record as SGLang writes it (one line); long: with a 2,000-token prompt's text and
    input_ids in its request_parameters."""
    from sglang_obs.simulator.records import line

    if not long:
        return [line(rec) for rec in recs]
    text = " ".join(f"word{i % 997}" for i in range(LONG_PROMPT_TOKENS))
    out = []
    for rec in recs:
        params = json.loads(rec["request_parameters"])
        params["text"] += " " + text
        params["input_ids"] = list(range(100_000, 100_000 + LONG_PROMPT_TOKENS))
        out.append(line({**rec, "request_parameters": json.dumps(params)}))
    return out


def write_repeated(path: Path, block: bytes, mib: float) -> int:
    """`block` repeated to at least `mib` MiB; the number of lines written."""
    n, size = 0, 0
    with path.open("wb") as f:
        while size < mib * 2**20:
            f.write(block)
            size += len(block)
            n += block.count(b"\n")
    return n


# -- part 1: analyze-requests against the bare loop ----------------------------------------
def run_tool(path: Path) -> None:
    """What `sglang-obs analyze-requests FILE` runs, its text report to /dev/null."""
    from sglang_obs.tools import analyze_requests

    saved = sys.stdout
    with open(os.devnull, "w") as null:
        sys.stdout = null
        try:
            code = analyze_requests.main([str(path)], False, None, TOP)
        finally:
            sys.stdout = saved
    if code != 0:
        raise RuntimeError(f"analyze-requests {path} exited {code}")


def run_bare(path: Path) -> None:
    loads = json.loads
    with path.open("rb") as f:
        for line in f:
            loads(line)


def yardstick(path: Path) -> dict:
    """json.loads of every line and the reads the report needs (the same fields and rules as
    exporter/request_records.py for valid records), exact: per class the requests, token sums
    and the values of each quantile, sorted; the time range; the slowest TOP."""
    from sglang_obs.exporter.request_records import PROMPT_CLASS_BOUNDS, PROMPT_CLASSES

    classes = {c: {"requests": 0, "prompt": 0, "cached": 0, "ttft": [], "queue": [], "e2e": [],
                   "tpot": []} for c in PROMPT_CLASSES}
    first = last = None
    slowest: list = []  # heap of (slowness, order, figures), the latest order winning a tie
    order = 0
    loads = json.loads
    with path.open("rb") as f:
        for line in f:
            r = loads(line)
            prompt, e2e = r["prompt_tokens"], float(r["e2e_latency"])
            cached = r.get("cached_tokens") or 0
            completion = r.get("completion_tokens") or 0
            received, first_token = r.get("request_received_ts"), r.get("prefill_finished_time")
            ttft = None if received is None or first_token is None else min(
                first_token - received, e2e)
            queue = r.get("queue_time")
            reason = r.get("finish_reason")
            reason = reason.get("type") if isinstance(reason, dict) else reason
            tpot = ((e2e - ttft) / (completion - 1) if ttft is not None and completion > 1
                    and reason in ("stop", "length") else None)
            at = r.get("request_finished_ts")
            if at is None and received is not None:
                at = received + e2e
            c = classes[PROMPT_CLASSES[bisect_right(PROMPT_CLASS_BOUNDS, prompt)]]
            c["requests"] += 1
            c["prompt"] += prompt
            c["cached"] += cached
            c["e2e"].append(e2e)
            for key, value in (("ttft", ttft), ("queue", queue), ("tpot", tpot)):
                if value is not None:
                    c[key].append(float(value))
            if at is not None:
                first = at if first is None else min(first, at)
                last = at if last is None else max(last, at)
            order += 1
            item = (ttft if ttft is not None else e2e, order,
                    (r.get("id"), ttft, e2e, prompt, completion, cached))
            if len(slowest) < TOP:
                heapq.heappush(slowest, item)
            else:
                heapq.heappushpop(slowest, item)
    for c in classes.values():
        for key in ("ttft", "queue", "e2e", "tpot"):
            c[key].sort()
    return {"records": order, "classes": classes, "first": first, "last": last,
            "slowest": [s for _, _, s in sorted(slowest, key=lambda i: (-i[0], i[1]))]}


def _exact(values: list[float], q: float) -> float | None:
    return values[math.floor(q * (len(values) - 1))] if values else None


def check_yardstick(path: Path) -> dict:
    """The tool's figures against the yardstick's; raises AssertionError where they differ."""
    from sglang_obs.tools import analyze_requests

    doc = analyze_requests.analyze([str(path)], top=TOP, per_minute=False).document()
    y = yardstick(path)
    assert doc["records"] == y["records"], (doc["records"], y["records"])
    assert not doc["rejected"], doc["rejected"]
    checked = 0
    for cls, c in doc["classes"].items():
        yc = y["classes"][cls]
        assert c["requests"] == yc["requests"], cls
        assert c["cached_share"] == (yc["cached"] / yc["prompt"] if yc["prompt"] else None), cls
        for key, values, q in (("ttft_p50_seconds", yc["ttft"], 0.5),
                               ("ttft_p95_seconds", yc["ttft"], 0.95),
                               ("queue_p95_seconds", yc["queue"], 0.95),
                               ("e2e_p95_seconds", yc["e2e"], 0.95),
                               ("tpot_p50_seconds", yc["tpot"], 0.5)):
            exact = _exact(values, q)
            if exact is None:
                assert c[key] is None, (cls, key)
                continue
            assert abs(c[key] - exact) <= QUANTILE_TOLERANCE * exact + 1e-9, (cls, key, c[key],
                                                                              exact)
            checked += 1
    assert doc["time_range"] == {"from": analyze_requests._iso(y["first"]),
                                 "to": analyze_requests._iso(y["last"])}
    got = [(s["id"], s["ttft_seconds"], s["e2e_seconds"], s["prompt_tokens"],
            s["completion_tokens"], s["cached_tokens"]) for s in doc["slowest"]]
    assert got == y["slowest"], (got, y["slowest"])
    return {"records": y["records"], "quantiles_checked": checked,
            "quantile_tolerance": QUANTILE_TOLERANCE, "slowest_equal": len(got)}


def _side(cpu: list[float], wall: list[float], records: int) -> dict:
    low, mid = min(cpu), statistics.median(cpu)
    return {"cpu_s": cpu, "wall_s": wall, "min_s": low, "median_s": mid,
            "records_per_second_at_min": records / low,
            "records_per_second_at_median": records / mid,
            "wall_records_per_second_at_median": records / statistics.median(wall)}


def analyze_part(tmp: Path, recs: list[dict], mib: float, rounds: int) -> dict:
    short, long = record_lines(recs, False), record_lines(recs, True)
    mixed = [long[i] if i % LONG_EVERY == 0 else short[i] for i in range(len(recs))]
    out = {"rounds": rounds, "release": RELEASE, "scenarios": list(SCENARIOS),
           "long_prompt_tokens": LONG_PROMPT_TOKENS, "top": TOP, "files": {}}
    sides = (("analyze_requests", run_tool), ("bare_json_loads", run_bare),
             ("yardstick", yardstick))
    for name, lines, every in (("mixed", mixed, LONG_EVERY), ("short", short, None)):
        block = "".join(lines).encode()
        path = tmp / f"{name}.log"
        n = write_repeated(path, block, mib)
        check = check_yardstick(path)  # also the warm-up round of the tool and yardstick
        run_bare(path)
        times: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s, _ in sides}
        for i in range(rounds):
            k = i % len(sides)  # who goes first turns
            for side, fn in sides[k:] + sides[:k]:
                c0, w0 = time.process_time(), time.perf_counter()
                fn(path)
                times[side][0].append(time.process_time() - c0)
                times[side][1].append(time.perf_counter() - w0)
        r = {"records": n, "bytes": path.stat().st_size, "record_bytes": round(len(block) / len(
            lines)), "long_every": every,
            "long_records": sum(len(x) > 10_000 for x in lines) * n // len(lines),
            "yardstick_check": check}
        for side, (cpu, wall) in times.items():
            r[side] = _side(cpu, wall, n)
        tool, bare = r["analyze_requests"], r["bare_json_loads"]
        r["ratio_min"] = bare["min_s"] / tool["min_s"]
        r["ratio_median"] = bare["median_s"] / tool["median_s"]
        out["files"][name] = r
        path.unlink()
        print(json.dumps({name: {k: v for k, v in r.items() if k != "yardstick_check"}},
                         default=str)[:400], file=sys.stderr)
    return out


# -- part 2: the follower ------------------------------------------------------------------
def follower_run(source: Path, rate: float, seconds: float) -> dict:
    from sglang_obs.exporter.periodic import Periodic
    from sglang_obs.exporter.request_follow import RequestRecordDir
    from sglang_obs.exporter.request_records import RequestStats

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
        loop = Periodic("requests bench", cycle, POLL_SECONDS)
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


def follower_part(tmp: Path, recs: list[dict], args) -> dict:
    out = {"rate": args.rate, "seconds": args.seconds, "repeats": args.repeats,
           "poll_seconds": POLL_SECONDS}
    for size in ("short", "long"):
        lines = record_lines(recs, size == "long")
        source = tmp / f"follow-{size}.log"
        source.write_text("".join(lines))
        runs = [follower_run(source, args.rate, args.seconds) for _ in range(args.repeats)]
        out[size] = {"record_bytes": round(source.stat().st_size / len(lines)),
                     "follower": summary(runs)}
        if args.exporter:
            out[size]["exporter_process"] = summary(
                [exporter_run(source, args.rate, args.seconds) for _ in range(args.repeats)])
        print(json.dumps({size: out[size]}), file=sys.stderr)
    return out


# -- docs/performance.md -------------------------------------------------------------------
def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _pct(share: float, digits: int = 2) -> str:
    return f"{share * 100:.{digits}f} %"


def _file(f: dict) -> str:
    every = f.get("long_every")
    return f"one record in {every} long" if every else "short records only"

SIDES = (("analyze_requests", "`analyze-requests` (`main`, text report)"),
         ("bare_json_loads", "bare `for line in f: json.loads(line)`"),
         ("yardstick", "yardstick: `json.loads` + the report's field reads"))


def targets(results: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target this run measured."""
    rows, goal = [], results["targets"]
    for f in results.get("analyze", {}).get("files", {}).values():
        rows.append((f"analyze-requests ≥ {goal['analyze_over_bare']:g}× the bare json.loads "
                     f"loop, {_file(f)}",
                     f"{f['ratio_median']:.2f}× median, {f['ratio_min']:.2f}× min",
                     f["ratio_median"] >= goal["analyze_over_bare"]))
    follow = results.get("follower", {})
    for size in ("short", "long"):
        if size in follow:
            s = follow[size]["follower"]
            rows.append((f"follower ≤ {_pct(goal['follower_share_of_core'], 0)} of a core at "
                         f"{follow['rate']:g} records/s, {size} records "
                         f"({follow[size]['record_bytes']:,} bytes)",
                         f"{_pct(s['median'])} median, {_pct(s['min'])} min",
                         s["median"] <= goal["follower_share_of_core"]))
    return rows


def doc_block(results: dict) -> str:
    """docs/performance.md's "Request records" block, from the JSON this script writes."""
    m = results["machine"]
    command = " ".join(["bench/bench_request_records.py", *m["argv"]])
    out = [f"Measured by `{command}` on {m['date']}: {m['cpus']} CPUs, Python {m['python']}, "
           f"1-minute load average {m['loadavg_at_start'][0]:.1f} at the start and "
           f"{m['loadavg'][0]:.1f} at the end.", "", "| target | measured | |", "|---|---|---|"]
    out += [f"| {what} | {measured} | {_met(ok)} |" for what, measured, ok in targets(results)]
    a = results.get("analyze")
    if a:
        tolerance = max((f["yardstick_check"]["quantile_tolerance"]
                         for f in a["files"].values()), default=0)
        out += ["", "`sglang-obs analyze-requests FILE` (its `main`, the text report to "
                "/dev/null) against the bare loop over the same file: the simulator's "
                f"{a['release']} records of the scenarios {', '.join(a['scenarios'])}, repeated; "
                "a long record's "
                f"request_parameters also holds a {a['long_prompt_tokens']:,}-token prompt's "
                "text and input_ids, as SGLang writes it without --log-requests. "
                f"{a['rounds']} rounds, interleaved (after a warm-up round), CPU seconds of the "
                "process; records/s = records / seconds. The yardstick's figures equal the "
                f"tool's (counts, token sums, time range, the slowest {a['top']}; quantiles within "
                f"{_pct(tolerance, 0)})."]
        for f in a["files"].values():
            out += ["", f"{_file(f).capitalize()}: {f['records']:,} records, "
                    f"{f['bytes'] / 2**20:,.0f} MiB ({f['record_bytes']:,} bytes a record; "
                    f"{f['long_records']:,} long):", "",
                    "| side | s, min | s, median | records/s at min | records/s at median |",
                    "|---|---|---|---|---|"]
            for key, what in SIDES:
                r = f[key]
                out.append(f"| {what} | {r['min_s']:.3f} | {r['median_s']:.3f} | "
                           f"{r['records_per_second_at_min']:,.0f} | "
                           f"{r['records_per_second_at_median']:,.0f} |")
            out.append(f"| analyze-requests / bare loop | | | {f['ratio_min']:.2f}× | "
                       f"{f['ratio_median']:.2f}× |")
    follow = results.get("follower")
    if follow:
        out += ["", f"The follower (`RequestRecordDir`, polled every {follow['poll_seconds']:g} "
                f"s) while another process appends {follow['rate']:g} records/s for "
                f"{follow['seconds']:g} s, "
                f"{follow['repeats']} run(s); CPU of its thread as a share of one core:", "",
                "| records | bytes a record | min | median | records/s read |",
                "|---|---|---|---|---|"]
        for size in ("short", "long"):
            if size in follow:
                s = follow[size]
                rate = statistics.median(r["records_per_second"] for r in s["follower"]["runs"])
                out.append(f"| {size} | {s['record_bytes']:,} | {_pct(s['follower']['min'])} "
                           f"| {_pct(s['follower']['median'])} | {rate:,.1f} |")
                if "exporter_process" in s:
                    e = s["exporter_process"]
                    out.append(f"| {size}, whole `sglang-exporter` process | "
                               f"{s['record_bytes']:,} | {_pct(e['min'])} | "
                               f"{_pct(e['median'])} | |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="analyze,follower",
                        help="comma-separated: analyze, follower (default: both)")
    parser.add_argument("--mb", type=float, default=100,
                        help="MiB of each analyze-requests file (part 1)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of part 1 (>= 3)")
    parser.add_argument("--seconds", type=float, default=15, help="follower window (part 2)")
    parser.add_argument("--repeats", type=int, default=2, help="follower runs per size")
    parser.add_argument("--rate", type=float, default=RATE, help="records/s appended")
    parser.add_argument("--exporter", action="store_true",
                        help="also measure the whole sglang-exporter process")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    load_at_start = os.getloadavg()
    results: dict = {"targets": {"analyze_over_bare": ANALYZE_RATIO,
                                 "follower_share_of_core": FOLLOWER_SHARE}}
    recs = simulated()
    with tempfile.TemporaryDirectory() as tmp:
        if "analyze" in parts:
            results["analyze"] = analyze_part(Path(tmp), recs, args.mb, args.rounds)
        if "follower" in parts:
            results["follower"] = follower_part(Path(tmp), recs, args)
    from results_file import emit, machine

    results["machine"] = machine(load_at_start)
    emit(results, args.json, doc_block)


if __name__ == "__main__":
    main()
