"""`sglang-obs analyze-requests`: where slow requests spent their time, by prompt length, from
the request-record files SGLang writes with `--export-metrics-to-file`.

Reads records (plain or gzipped files, or a directory of hourly `sglang-request-metrics-*.log`
files, oldest first) with the exporter's own parser (sglang_obs.exporter.request_records), and
reports per prompt-length class: requests, TTFT p50/p95, queue p95, e2e p95, TPOT p50 and the
cached share of prompt tokens; then the slowest N requests (by TTFT, e2e where a record has no
timing fields) with their token counts and stage times: queue, prefill (TTFT - queue), decode
(e2e - TTFT). `--json` prints the same as a stable document (docs/request-records.md);
`--csv OUT` writes the per-minute table by class.

Only numbers are read. Request ids are shown (this report stays local), SGLang's own uuid ids as
they are and any other id hashed (a client may set its own id to anything); no text of a record,
prompt or otherwise, can reach the output. Memory is bounded: quantiles come from log-spaced
buckets 1 % wide (so they are within 1 % of the exact value), the slowest requests from a heap.
"""

from __future__ import annotations

import csv
import fnmatch
import heapq
import json
import math
import os
import stat
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sglang_obs.core.safe_files import (
    SYMLINK_OUTSIDE,
    Refused,
    not_regular,
    open_output,
    resolve_within,
)
from sglang_obs.exporter.request_records import (
    MAX_RECORD_BYTES,
    PROMPT_CLASS_BOUNDS,
    PROMPT_CLASSES,
    Record,
    parse_record,
)
from sglang_obs.exporter.sglang_log import LineReader
from sglang_obs.tools.analyze_log import (
    RefusedFile,
    UnreadableLog,
    check_path,
    open_input,
    read_chunks,
)

SCHEMA_VERSION = 1
TOP = 10
GROWTH = 1.01  # quantile bucket width: values within 1 %
FILE_GLOBS = ("sglang-request-metrics-*.log", "sglang-request-metrics-*.log.gz")
CSV_COLUMNS = ("minute", "prompt_class", "requests", "ttft_p50_seconds", "ttft_p95_seconds",
               "queue_p95_seconds", "e2e_p95_seconds", "tpot_p50_seconds", "cached_share")


class Quantiles:
    """Counts in log-spaced buckets GROWTH wide: any quantile to within 1 %, bounded memory."""

    __slots__ = ("counts", "n")

    def __init__(self):
        self.counts: Counter = Counter()
        self.n = 0

    def add(self, value: float) -> None:
        self.counts[-10**9 if value <= 1e-9 else math.floor(math.log(value, GROWTH))] += 1
        self.n += 1

    def quantile(self, q: float) -> float | None:
        if not self.n:
            return None
        rank, seen = q * (self.n - 1), 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen > rank:
                return 0.0 if key == -10**9 else GROWTH ** (key + 0.5)
        return None  # not reached


@dataclass
class ClassStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: Quantiles = field(default_factory=Quantiles)
    queue: Quantiles = field(default_factory=Quantiles)
    e2e: Quantiles = field(default_factory=Quantiles)
    tpot: Quantiles = field(default_factory=Quantiles)

    def add(self, r: Record) -> None:
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.e2e.add(r.e2e_seconds)
        for hist, value in ((self.ttft, r.ttft_seconds), (self.queue, r.queue_seconds),
                            (self.tpot, r.tpot_seconds)):
            if value is not None:
                hist.add(value)

    def doc(self) -> dict:
        return {
            "requests": self.requests,
            "ttft_p50_seconds": self.ttft.quantile(0.5),
            "ttft_p95_seconds": self.ttft.quantile(0.95),
            "queue_p95_seconds": self.queue.quantile(0.95),
            "e2e_p95_seconds": self.e2e.quantile(0.95),
            "tpot_p50_seconds": self.tpot.quantile(0.5),
            "cached_share": (self.cached_tokens / self.prompt_tokens if self.prompt_tokens
                             else None),
        }


def _slowness(r: Record) -> float:
    return r.ttft_seconds if r.ttft_seconds is not None else r.e2e_seconds


@dataclass
class Analysis:
    top: int = TOP
    start: float | None = None  # only records finished in [start, end] (the snapshot's window)
    end: float | None = None
    files: list[str] = field(default_factory=list)
    records: int = 0
    rejected: Counter = field(default_factory=Counter)
    outside: int = 0  # records outside [start, end], or without a time when a window is set
    skipped: list[str] = field(default_factory=list)  # "path: why" of files of a directory
    first: float | None = None
    last: float | None = None
    classes: dict[str, ClassStats] = field(
        default_factory=lambda: {c: ClassStats() for c in PROMPT_CLASSES})
    minutes: dict[tuple[int, str], ClassStats] = field(default_factory=dict)
    _slowest: list = field(default_factory=list)  # heap of (slowness, order, Record)

    def feed(self, parsed: Record | str) -> None:
        if isinstance(parsed, str):
            self.rejected[parsed] += 1
            return
        at = parsed.finished_at
        if self._outside(at):
            self.outside += 1
            return
        self.records += 1
        self.classes[parsed.prompt_class].add(parsed)
        if at is not None:
            self.first = at if self.first is None else min(self.first, at)
            self.last = at if self.last is None else max(self.last, at)
            minute = int(at // 60 * 60)
            self.minutes.setdefault((minute, parsed.prompt_class), ClassStats()).add(parsed)
        item = (_slowness(parsed), self.records, parsed)
        if len(self._slowest) < self.top:
            heapq.heappush(self._slowest, item)
        elif self.top:
            heapq.heappushpop(self._slowest, item)

    def _outside(self, at: float | None) -> bool:
        if self.start is None and self.end is None:
            return False
        return (at is None or (self.start is not None and at < self.start)
                or (self.end is not None and at > self.end))

    def slowest(self) -> list[Record]:
        return [r for _, _, r in sorted(self._slowest, key=lambda i: (-i[0], i[1]))]

    def document(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "files": self.files,
            "records": self.records,
            "rejected": dict(sorted(self.rejected.items())),
            "time_range": {"from": _iso(self.first), "to": _iso(self.last)},
            "class_bounds_tokens": list(PROMPT_CLASS_BOUNDS),
            "classes": {c: s.doc() for c, s in self.classes.items()},
            "slowest": [_request_doc(r) for r in self.slowest()],
        }

    def per_minute_rows(self) -> Iterator[list]:
        for (minute, cls) in sorted(self.minutes, key=lambda k: (k[0],
                                                                 PROMPT_CLASSES.index(k[1]))):
            d = self.minutes[(minute, cls)].doc()
            yield [_iso(minute), cls, d["requests"],
                   *(_csv(d[k]) for k in ("ttft_p50_seconds", "ttft_p95_seconds",
                                          "queue_p95_seconds", "e2e_p95_seconds",
                                          "tpot_p50_seconds", "cached_share"))]


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts).isoformat(sep=" ",
                                                                        timespec="seconds")


def _csv(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _request_doc(r: Record) -> dict:
    return {
        "id": r.request_id, "finished": _iso(r.finished_at), "prompt_class": r.prompt_class,
        "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
        "completion_tokens": r.completion_tokens, "max_new_tokens": r.max_new_tokens,
        "finish_reason": r.finish_reason, "ttft_seconds": r.ttft_seconds,
        "queue_seconds": r.queue_seconds, "prefill_seconds": r.prefill_seconds,
        "decode_seconds": r.decode_seconds, "e2e_seconds": r.e2e_seconds,
        "tpot_seconds": r.tpot_seconds,
    }


# -- reading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    path: Path
    within: Path | None = None  # the directory it was found in; None: named by the user


def _listed(directory: Path) -> tuple[list[Path], list[str]]:
    """The record files of a directory in name (= time) order, and why the others named like
    one were skipped: only regular files of the directory itself (a link to another of its
    files too), never a FIFO, device or directory, nor a link out of it (not opened)."""
    found, skipped = [], []
    with os.scandir(directory) as it:
        for entry in it:
            if not any(fnmatch.fnmatchcase(entry.name, g) for g in FILE_GLOBS):
                continue
            path = directory / entry.name
            try:
                if entry.is_symlink():
                    mode = os.stat(resolve_within(directory, entry.name)).st_mode
                    if not stat.S_ISREG(mode):
                        raise not_regular(mode)
                elif not entry.is_file(follow_symlinks=False):
                    raise not_regular(entry.stat(follow_symlinks=False).st_mode)
            except Refused as err:
                hint = (" (name the file itself to read it)"
                        if err.reason == SYMLINK_OUTSIDE else "")
                skipped.append(f"{path}: {err}{hint}")
                continue
            except OSError:  # gone since it was listed, or a link to nothing
                skipped.append(f"{path}: no such file")
                continue
            found.append(path)
    return sorted(found), sorted(skipped)


def expand(args: Iterable[str], skipped: list[str] | None = None) -> list[Input]:
    """Files as given; a directory becomes its hourly record files in name (= time) order.
    Raises UnreadableLog naming the path when one cannot be read; a file of a directory that
    cannot be is left out, and why is added to `skipped`."""
    out: list[Input] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            try:
                found, left_out = _listed(path)
            except OSError as err:
                raise UnreadableLog(path, f"cannot list it ({err.strerror or err})") from None
            if not found:
                why = "no sglang-request-metrics-*.log files in this directory"
                if left_out:
                    more = ", ..." if len(left_out) > 1 else ""
                    why += f" ({len(left_out)} skipped: {left_out[0]}{more})"
                raise UnreadableLog(path, why)
            if skipped is not None:
                skipped += left_out
            out += [Input(p, path) for p in found]
            continue
        why = check_path(path)
        if why is not None:
            raise UnreadableLog(path, why)
        out.append(Input(path))
    return out


def read(inputs: Iterable[Input], analysis: Analysis) -> Analysis:
    for item in inputs:
        try:  # never blocks: a FIFO nothing writes to, a device or a link out is refused
            raw = open_input(item.path, item.within)
        except RefusedFile as err:
            if item.within is None:
                raise  # named by the user: the report would lack what was asked for
            analysis.skipped.append(str(err))  # one odd file of a directory: the others
            continue
        analysis.files.append(str(item.path))
        reader = LineReader(MAX_RECORD_BYTES)
        for chunk in read_chunks(raw, item.path):
            before = reader.too_long
            for line in reader.feed(chunk):
                if line.strip():
                    analysis.feed(parse_record(line, keep_id=True, read_params=True))
            if reader.too_long != before:
                analysis.rejected["too_long"] += reader.too_long - before
        last = reader.finish()
        if last is not None and last.strip():
            analysis.feed(parse_record(last, keep_id=True, read_params=True))
    return analysis


def analyze(args: Iterable[str], top: int = TOP, start: float | None = None,
            end: float | None = None) -> Analysis:
    """Raises UnreadableLog for a file named that cannot be read; a file of a directory that
    cannot be is left out and listed in the result's `skipped`."""
    analysis = Analysis(top=top, start=start, end=end)
    return read(expand(args, analysis.skipped), analysis)


# -- output -------------------------------------------------------------------------------------
def _s(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "—"
    if unit == "ms":
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def class_table(doc: dict) -> list[str]:
    lines = [f"{'class':9} {'requests':>9} {'TTFT p50':>10} {'TTFT p95':>10} "
             f"{'queue p95':>10} {'e2e p95':>10} {'TPOT p50':>10} {'cached':>7}"]
    for cls, c in doc["classes"].items():
        share = "—" if c["cached_share"] is None else f"{c['cached_share']:.1%}"
        lines.append(f"{cls:9} {c['requests']:>9,} {_s(c['ttft_p50_seconds']):>10} "
                     f"{_s(c['ttft_p95_seconds']):>10} {_s(c['queue_p95_seconds']):>10} "
                     f"{_s(c['e2e_p95_seconds']):>10} {_s(c['tpot_p50_seconds'], 'ms'):>10} "
                     f"{share:>7}")
    return lines


def slowest_table(rows: list[dict]) -> list[str]:
    lines = [f"{'finished':19} {'id':34} {'class':8} {'prompt':>8} {'cached':>8} {'output':>7} "
             f"{'finish':6} {'queue':>8} {'prefill':>8} {'decode':>8} {'TTFT':>8} {'e2e':>8}"]
    for r in rows:
        lines.append(
            f"{r['finished'] or '—':19} {r['id'] or '—':34} {r['prompt_class']:8} "
            f"{r['prompt_tokens']:>8,} {r['cached_tokens']:>8,} {r['completion_tokens']:>7,} "
            f"{r['finish_reason']:6} {_s(r['queue_seconds']):>8} {_s(r['prefill_seconds']):>8} "
            f"{_s(r['decode_seconds']):>8} {_s(r['ttft_seconds']):>8} {_s(r['e2e_seconds']):>8}")
    return lines


def text_report(doc: dict) -> str:
    rejected = sum(doc["rejected"].values())
    bounds = ", ".join(f"{b // 1024}K" for b in doc["class_bounds_tokens"])
    lines = [
        f"Request records: {doc['records']:,} from {len(doc['files'])} file(s), finished "
        f"{doc['time_range']['from'] or '—'} to {doc['time_range']['to'] or '—'}"
        + (f"; {rejected:,} skipped (" + ", ".join(f"{k} {v:,}" for k, v in
                                                    doc["rejected"].items()) + ")"
           if rejected else ""),
        "",
        f"By prompt length (class bounds {bounds} tokens; quantiles within 1 %):",
        *class_table(doc),
        "",
        f"Slowest {len(doc['slowest'])} by TTFT (e2e where a record has no timing fields); "
        "prefill = TTFT - queue, decode = e2e - TTFT:",
        *slowest_table(doc["slowest"]),
    ]
    return "\n".join(lines) + "\n"


def main(files: list[str], as_json: bool, csv_out: str | None, top: int) -> int:
    name = "sglang-obs analyze-requests"
    try:
        result = analyze(files, top=top)
    except UnreadableLog as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 1
    for why in result.skipped:
        print(f"{name}: skipped {why}", file=sys.stderr)
    if not result.records:
        skipped = sum(result.rejected.values())
        print(f"{name}: no usable request records in {', '.join(files)}"
              + (f" ({skipped:,} skipped: " + ", ".join(
                  f"{k} {v:,}" for k, v in sorted(result.rejected.items())) + ")"
                 if skipped else ""), file=sys.stderr)
        return 1
    if csv_out:
        try:
            with open_output(csv_out) as fh:
                writer = csv.writer(fh)
                writer.writerow(CSV_COLUMNS)
                writer.writerows(result.per_minute_rows())
        except Refused as err:
            print(f"{name}: {csv_out}: {err}", file=sys.stderr)
            return 1
        except OSError as err:
            print(f"{name}: {csv_out}: {err.strerror or type(err).__name__}", file=sys.stderr)
            return 1
    doc = result.document()
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if as_json else text_report(doc))
    return 0
