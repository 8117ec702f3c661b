"""Log-source benchmarks reported in docs/performance.md ("Scheduler-log source").

1. Parser throughput: exporter.sglang_log.parse_line over the scheduler lines of a rendered
   incident, against a bare `re` match of the same lines with the reference's prefill/decode
   regexes (the least any parser must do).
2. Follower cost: CPU of a FileFollower polling every 0.5 s while another process appends 200
   lines/s to the file, as a share of one core.
3. `sglang-obs analyze-log` against its floor, on a large log (1M lines by default: the
   incident's lines repeated, their timestamps moved on, as from a server that stays up): the
   command's own code path (analyze_log.main with --json and --csv-per-minute, stdout kept in
   memory) against the cheapest honest loop that produces the same output -- one regex aimed
   at exactly this file's lines, the same number conversions, the same peaks, per-minute rows,
   prompt contexts (the shared PromptRuns) and report. Both outputs (the JSON document and the
   CSV) are asserted byte for byte equal. Rounds interleave the two sides, the order
   alternating; CPU seconds (process time) per side, min and median over the rounds.

Run: .venv/bin/python bench/bench_log.py [--seconds 20] [--lines 1000000] [--rounds 5]
                                          [--json PATH]
`doc_block(results)` is the Markdown of docs/performance.md's "Scheduler-log source" section.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from sglang_obs.exporter.log_follow import FileFollower  # noqa: E402
from sglang_obs.exporter.log_stats import LogStats, PromptRuns  # noqa: E402
from sglang_obs.exporter.sglang_log import parse_line  # noqa: E402
from sglang_obs.simulator import scenario as scenarios  # noqa: E402
from sglang_obs.simulator.logs import format_event  # noqa: E402
from sglang_obs.simulator.simulation import Simulation  # noqa: E402
from sglang_obs.tools import analyze_log  # noqa: E402

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

SCENARIO, RELEASE, TP_SIZE = "long-context-incident", "0.5.12", 4  # seed 000's incident
START = 1_785_232_800.0  # 2026-07-28 10:00:00 UTC
INCIDENT_SECONDS = 1200
APPEND_EVERY_S, APPEND_LINES, POLL_EVERY_S = 0.1, 20, 0.5  # part 2: 200 lines/s, polled at 2 Hz


def incident_lines() -> list[str]:
    events: list = []
    sim = Simulation(scenarios.load(SCENARIO), start_ts=START, on_event=events.append)
    sim.advance(INCIDENT_SECONDS)
    return [format_event(e, RELEASE, tp_size=TP_SIZE) for e in events]


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
n, every = int(sys.argv[4]), float(sys.argv[5])
i = 0
while time.monotonic() < end:
    for _ in range(n):
        out.write(lines[i % len(lines)] + "\\n"); i += 1
    time.sleep(every)
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
                                   str(seconds), str(APPEND_LINES), str(APPEND_EVERY_S)])
        cpu0, wall0 = time.process_time(), time.monotonic()
        while writer.poll() is None:
            follower.poll()
            time.sleep(POLL_EVERY_S)
        follower.poll()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        read = sum(stats.snapshot().lines.values())
    return {"seconds": seconds, "poll_interval_s": POLL_EVERY_S,
            "appended_lines_per_second": APPEND_LINES / APPEND_EVERY_S,
            "lines_per_second": read / wall, "cpu_share_of_one_core": cpu / wall}


# -- 3. analyze-log against its floor ---------------------------------------------------------


def write_large_log(path: Path, lines: list[str], total: int) -> dict:
    """`total` lines: the incident's, then its batch lines again and again, each pass
    INCIDENT_SECONDS later (the start-up lines once: a server that stays up)."""
    stamp = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
    start = datetime(2026, 7, 28, 10, 0, 0)
    base = []  # (seconds after START, the line after its timestamp)
    for line in lines:
        m = stamp.match(line)
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        base.append((int((at - start).total_seconds()), line[m.end():]))
    repeat = [b for b, line in zip(base, lines, strict=True)
              if " Prefill batch" in line or " Decode batch" in line]
    minute_text: dict[int, str] = {}
    written, n = 0, 0
    with open(path, "w") as out:
        while written < total:
            todo = base if n == 0 else repeat
            offset = n * INCIDENT_SECONDS
            block = []
            for seconds, rest in todo[:total - written]:
                minute, second = divmod(offset + seconds, 60)
                head = minute_text.get(minute)
                if head is None:
                    head = minute_text[minute] = (
                        "[" + (start + timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M:"))
                block.append(f"{head}{second:02d}{rest}\n")
            out.write("".join(block))
            written += len(block)
            n += 1
    return {"lines": written, "bytes": path.stat().st_size, "passes": n,
            "hours": round((n * INCIDENT_SECONDS) / 3600, 1), "scenario": SCENARIO,
            "release": RELEASE, "tp_size": TP_SIZE}


# The floor's one regex, aimed at exactly the lines of the generated file (0.5.12, TP4: the
# " TP0" tag; no milliseconds, no DP ranks) and at only the fields the report uses.
FLOOR_BATCH = re.compile(
    rb"\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}):([0-9]{2}) TP0\] (?:"
    rb"Prefill batch, #new-seq: ([0-9]+), #new-token: ([0-9]+), #cached-token: ([0-9]+), "
    rb"token usage: [0-9.]+, #running-req: ([0-9]+), #queue-req: ([0-9]+), "
    rb"#pending-token: ([0-9]+), "
    rb"|Decode batch, #running-req: ([0-9]+), #token: ([0-9]+), [^#]*"
    rb"gen throughput \(token/s\): ([0-9.]+), #queue-req: ([0-9]+)$)")
FLOOR_STAMP = re.compile(rb"\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}):([0-9]{2})[^\]]*\] ")
FLOOR_CHUNK = re.compile(rb"max_total_num_tokens=[0-9]+, chunked_prefill_size=(-?[0-9]+|None), ")
FLOOR_READY = b"The server is fired up and ready to roll!"
EPOCH = datetime(1, 1, 1)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else (EPOCH + timedelta(milliseconds=ms)).isoformat(sep=" ")


def _minute_ms(text: bytes) -> int:
    at = datetime(int(text[:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                  int(text[14:16]))
    return (at - EPOCH) // timedelta(milliseconds=1)


def floor(path: Path, csv_path: Path) -> str:
    """The report (the JSON analyze-log prints) and the per-minute CSV of the generated file,
    at the least cost: see the module's docstring. Times are milliseconds since 0001-01-01."""
    kinds = {"prefill": 0, "decode": 0, "capacity": 0, "ready": 0, "other": 0}
    first = last = None
    # minute -> [prefill batches, new, cached, pending peak, queue peak, running peak,
    #            full-token peak, gen throughput sum, its count, retracted]
    minutes: dict[int, list] = {}
    prompts, chunk, contexts, chunked = PromptRuns(), None, array("q"), 0
    new_total = cached_total = 0
    pend_v = queue_v = run_v = full_v = 0
    pend_at = queue_at = run_at = full_at = None
    since, longest, longest_from = None, 0.0, None
    key = base = row = None
    match = FLOOR_BATCH.match
    with open(path, "rb") as fh:
        rest = b""
        while block := fh.read(1 << 20):
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            for line in lines:
                m = match(line)
                if m is None:  # the start-up lines
                    m = FLOOR_STAMP.match(line)
                    if m is None:
                        kinds.setdefault("unparsed", 0)
                        kinds["unparsed"] += 1
                        continue
                    if m.group(1) != key:
                        key, base = m.group(1), _minute_ms(m.group(1))
                        row = minutes.setdefault(base, [0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0])
                    t = base + int(m.group(2)) * 1000
                    first = t if first is None else first
                    last = t
                    c = FLOOR_CHUNK.match(line, m.end())
                    if c is not None:
                        kinds["capacity"] += 1
                        prompts.clear()
                        size = -1 if c.group(1) == b"None" else int(c.group(1))
                        chunk = size if size > 0 else None
                    elif line.endswith(FLOOR_READY):
                        kinds["ready"] += 1
                    else:
                        kinds["other"] += 1
                    continue
                mk, sec, seq, new, cached, running, queue, pending, d_running, num, gen, d_queue \
                    = m.groups()
                if mk != key:
                    key, base = mk, _minute_ms(mk)
                    row = minutes.get(base)
                    if row is None:
                        row = minutes[base] = [0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0]
                t = base + int(sec) * 1000
                if first is None:
                    first = t
                last = t
                if seq is not None:
                    kinds["prefill"] += 1
                    new, cached, running = int(new), int(cached), int(running)
                    queue, pending = int(queue), int(pending)
                    new_total += new
                    cached_total += cached
                    row[0] += 1
                    row[1] += new
                    row[2] += cached
                    if pend_at is None or pending > pend_v:
                        pend_v, pend_at = pending, t
                    if pending > row[3]:
                        row[3] = pending
                    for tokens, whole in prompts.line(0, int(seq) == 1, new, cached, chunk):
                        contexts.append(tokens)
                        chunked += whole
                else:
                    kinds["decode"] += 1
                    running, queue, num = int(d_running), int(d_queue), int(num)
                    if full_at is None or num > full_v:
                        full_v, full_at = num, t
                    if num > row[6]:
                        row[6] = num
                    row[7] += float(gen)
                    row[8] += 1
                if queue_at is None or queue > queue_v:
                    queue_v, queue_at = queue, t
                if run_at is None or running > run_v:
                    run_v, run_at = running, t
                if queue > row[4]:
                    row[4] = queue
                if running > row[5]:
                    row[5] = running
                if queue > 0:
                    if since is None:
                        since = t
                elif since is not None:
                    if (t - since) / 1000 > longest:
                        longest, longest_from = (t - since) / 1000, since
                    since = None
        if rest:
            raise ValueError("the generated file ends with a newline")
    if since is not None and (last - since) / 1000 > longest:
        longest, longest_from = (last - since) / 1000, since

    # Pressure windows: runs of consecutive minutes with a queue or a backlog.
    runs, current = [], []
    for minute in sorted(minutes):
        pressured = minutes[minute][4] > 0 or minutes[minute][3] > 0
        if pressured and (not current or minute - current[-1] == 60_000):
            current.append(minute)
            continue
        if current:
            runs.append(current)
        current = [minute] if pressured else []
    if current:
        runs.append(current)
    windows = []
    for run in runs:
        rows = [minutes[m] for m in run]
        windows.append({"from": _iso(run[0]), "to": _iso(run[-1] + 60_000), "minutes": len(run),
                        "prefill_batches": sum(r[0] for r in rows),
                        "new_tokens": sum(r[1] for r in rows),
                        "pending_peak": max(r[3] for r in rows),
                        "queue_peak": max(r[4] for r in rows),
                        "running_peak": max(r[5] for r in rows),
                        "full_token_peak": max(r[6] for r in rows)})
    windows.sort(key=lambda d: (-d["new_tokens"], d["from"]))
    total = new_total + cached_total

    def peak(value, at):
        return {"value": value if at is not None else None, "at": _iso(at)}

    doc = {
        "schema_version": analyze_log.SCHEMA_VERSION,
        "files": [str(path)],
        "lines": {"total": sum(kinds.values()),
                  **{k: n for k, n in sorted(kinds.items()) if n}, "too_long": 0},
        "time_range": {"from": _iso(first), "to": _iso(last)},
        "context_tokens": {
            "requests": len(contexts), "chunked": chunked, "chunk_size": chunk,
            "mean": statistics.fmean(contexts) if contexts else None,
            "median": statistics.median(contexts) if contexts else None,
            "max": max(contexts) if contexts else None,
            "first": contexts[0] if contexts else None,
            "last": contexts[-1] if contexts else None},
        "prefill_tokens": {"new": new_total, "cached": cached_total,
                           "cache_hit_ratio": cached_total / total if total else None},
        "peaks": {"pending_tokens": peak(pend_v, pend_at),
                  "queue_requests": peak(queue_v, queue_at),
                  "running_requests": peak(run_v, run_at),
                  "full_tokens": peak(full_v, full_at)},
        "longest_queueing": {"seconds": longest, "from": _iso(longest_from)},
        "retracted_requests": 0,
        "pressure_windows": windows[:analyze_log.TOP_WINDOWS],
    }
    with open(csv_path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(analyze_log.CSV_COLUMNS)
        writer.writerows(
            [_iso(m), r[0], r[1], r[2], r[3], r[4], r[5], r[6],
             round(r[7] / r[8], 2) if r[8] else "", r[9]] for m, r in sorted(minutes.items()))
    return json.dumps(doc, indent=2) + "\n"


def analyze_log_cli(path: Path, csv_path: Path) -> str:
    """What `sglang-obs analyze-log PATH --json --csv-per-minute CSV` runs (the CLI's
    analyze_log.main), its stdout kept in memory."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = analyze_log.main([str(path)], True, str(csv_path))
    if code != 0:
        raise RuntimeError(f"analyze-log exited {code}")
    return out.getvalue()


def bench_analyze_log(lines: list[str], total: int, rounds: int) -> dict:
    """Part 3: CPU seconds of analyze-log and of the floor on the same file, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sglang.log"
        made = write_large_log(path, lines, total)
        sides = {"analyze_log": analyze_log_cli, "floor": floor}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        wall: dict[str, list[float]] = {name: [] for name in sides}
        outputs: dict[str, tuple[str, str]] = {}
        for i in range(rounds):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for name in order:
                csv_path = Path(tmp) / f"{name}.csv"
                c0, w0 = time.process_time(), time.perf_counter()
                text = sides[name](path, csv_path)
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
                outputs[name] = (text, csv_path.read_text())
            if outputs["analyze_log"] != outputs["floor"]:
                raise AssertionError("analyze-log and the floor disagree:\n"
                                     + outputs["analyze_log"][0][:2000] + "\n--\n"
                                     + outputs["floor"][0][:2000])
        doc = json.loads(outputs["floor"][0])
    result: dict = {"file": made, "rounds": rounds, "outputs_equal": True,
                    "report": {"time_range": doc["time_range"], "lines": doc["lines"],
                               "prompts": doc["context_tokens"]["requests"],
                               "csv_rows": outputs["floor"][1].count("\n") - 1}}
    for name in sides:
        lo, mid = min(cpu[name]), statistics.median(cpu[name])
        result[name] = {"cpu_s": cpu[name], "wall_s": wall[name], "min_s": lo, "median_s": mid,
                        "lines_per_second_min": made["lines"] / lo,
                        "lines_per_second_median": made["lines"] / mid}
    result["ratio_min"] = result["analyze_log"]["min_s"] / result["floor"]["min_s"]
    result["ratio_median"] = result["analyze_log"]["median_s"] / result["floor"]["median_s"]
    return result


# -- the results as docs/performance.md shows them --------------------------------------------

TARGETS = {"analyze_log_over_floor": 1.5,  # analyze-log's CPU time / the floor's (median)
           "follower_share_of_one_core": 0.05}


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def targets(results: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target this run measured."""
    rows, limits = [], results.get("targets", TARGETS)
    a = results.get("analyze_log")
    if a:
        limit = limits["analyze_log_over_floor"]
        rows.append((f"`analyze-log` ≤ {limit:g}× the floor's CPU time",
                     f"{a['ratio_min']:.2f}× min, {a['ratio_median']:.2f}× median",
                     a["ratio_median"] <= limit))
    f = results.get("follower")
    if f:
        limit = limits["follower_share_of_one_core"]
        rows.append((f"follower < {limit:.0%} of one core at "
                     f"{f['appended_lines_per_second']:g} lines/s",
                     f"{f['cpu_share_of_one_core']:.2%}", f["cpu_share_of_one_core"] < limit))
    return rows


def doc_block(results: dict) -> str:
    """docs/performance.md's "Scheduler-log source" block, from the JSON this script writes."""
    m = results["machine"]
    command = " ".join([".venv/bin/python bench/bench_log.py", *m["argv"]])
    what = [part for key, part in (
        ("analyze_log", "`sglang-obs analyze-log` against its floor on a "
         f"{results.get('analyze_log', {}).get('file', {}).get('lines', 0):,}-line log"),
        ("parser", "the exporter's line parser against a bare `re` match"),
        ("follower", "the CPU of the log follower")) if key in results]
    listed = ", ".join(what[:-1]) + (" and " if len(what) > 1 else "") + what[-1]
    out = [f"Measured by `{command}` on {m['date']}, on a machine with {m['cpus']} CPUs "
           f"(Python {m['python']}), 1-minute load average {m['loadavg_at_start'][0]:.1f} at the "
           f"start and {m['loadavg'][0]:.1f} at the end: {listed}.",
           "", "| target | measured | |", "|---|---|---|"]
    out += [f"| {what} | {measured} | {_met(ok)} |" for what, measured, ok in targets(results)]
    a = results.get("analyze_log")
    if a:
        f, rep = a["file"], a["report"]
        out += ["", f"`sglang-obs analyze-log FILE --json --csv-per-minute OUT` (its `main`, "
                f"stdout kept in memory) against the floor on one file of {f['lines']:,} lines "
                f"({f['bytes'] / 2**20:,.0f} MiB, {f['hours']:,} hours: the {f['scenario']} "
                f"scenario's lines rendered as {f['release']} TP{f['tp_size']} prints them, "
                f"repeated; {rep['prompts']:,} prompts, {rep['csv_rows']:,} minutes). "
                "The floor is one regex aimed at exactly this "
                "file's lines, the same conversions, peaks, per-minute rows and prompt contexts; "
                f"both outputs equal byte for byte. {a['rounds']} rounds, interleaved, CPU "
                "seconds:", "",
                "| side | s, min | s, median | lines/s at min | lines/s at median |",
                "|---|---|---|---|---|"]
        for key, what in (("analyze_log", "`analyze-log`"), ("floor", "floor")):
            r = a[key]
            out.append(f"| {what} | {r['min_s']:.2f} | {r['median_s']:.2f} | "
                       f"{r['lines_per_second_min']:,.0f} | {r['lines_per_second_median']:,.0f} |")
        out.append(f"| ratio | {a['ratio_min']:.2f}× | {a['ratio_median']:.2f}× | | |")
    p = results.get("parser")
    if p:
        out += ["", f"Parser over the {p['lines']:,} scheduler lines of the incident, best of "
                f"{p['repeats']}:", "", "| what | lines/s |", "|---|---|",
                f"| `exporter.sglang_log.parse_line` | "
                f"{p['exporter_parser_lines_per_second']:,.0f} |",
                f"| bare `re` match, the reference's prefill/decode regexes | "
                f"{p['bare_re_lines_per_second']:,.0f} |",
                f"| bare / `parse_line` | {p['ratio_bare_over_ours']:.1f}× |"]
    f = results.get("follower")
    if f:
        out += ["", f"A `FileFollower` polling every {f['poll_interval_s']:g} s while another "
                f"process appends {f['appended_lines_per_second']:g} lines/s, over "
                f"{f['seconds']:g} s:", "", "| CPU, share of one core | lines/s read |",
                "|---|---|",
                f"| {f['cpu_share_of_one_core']:.2%} | {f['lines_per_second']:,.1f} |"]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20, help="follower window (part 2)")
    parser.add_argument("--lines", type=int, default=1_000_000,
                        help="lines of the generated log (part 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of part 3 (>= 3)")
    parser.add_argument("--parts", default="parser,follower,analyze",
                        help="comma-separated: parser, follower, analyze (default: all)")
    parser.add_argument("--json", type=Path, help="also write the JSON results here")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    parts = set(args.parts.split(","))
    load_at_start = os.getloadavg()
    results: dict = {}
    lines = incident_lines()
    if "parser" in parts:
        parse = {"lines": len(lines), "repeats": 5,
                 "exporter_parser_lines_per_second": best_rate(ours, lines),
                 "bare_re_lines_per_second": best_rate(bare, lines)}
        parse["ratio_bare_over_ours"] = (parse["bare_re_lines_per_second"]
                                         / parse["exporter_parser_lines_per_second"])
        results["parser"] = parse
    if "analyze" in parts:
        results["analyze_log"] = bench_analyze_log(lines, args.lines, args.rounds)
    if "follower" in parts:
        results["follower"] = follower_cpu(lines, args.seconds)
    results["targets"] = TARGETS
    from results_file import emit, machine

    results["machine"] = machine(load_at_start)
    emit(results, args.json, doc_block)


if __name__ == "__main__":
    main()
