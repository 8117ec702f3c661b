"""`sglang-obs analyze-requests`: where slow requests spent their time, by prompt length, from
the request-record files SGLang writes with `--export-metrics-to-file`.

Reads records (plain or gzipped files, or a directory of hourly `sglang-request-metrics-*.log`
files, oldest first) with the exporter's own reader and parser (sglang_obs.exporter.
request_records: of a record in SGLang's layout only its meta_info is decoded, where it lies in
the read buffer; its request_parameters only for the slowest N, for max_new_tokens), and
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
from itertools import repeat
from operator import truediv
from pathlib import Path

from sglang_obs.core.safe_files import (
    SYMLINK_OUTSIDE,
    Refused,
    not_regular,
    open_output,
    resolve_within,
)
from sglang_obs.exporter.request_records import (
    MAX_PARAMS_CHARS,
    MAX_RECORD_BYTES,
    PROMPT_CLASS_BOUNDS,
    PROMPT_CLASSES,
    Record,
    RecordReader,
    max_new_tokens,
    parse_numbers,
    parse_span,
    request_parameters,
    safe_request_id,
)
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
SPAN_BYTES = 256 * 1024  # lines handed to read_spans at once: at most 128K spans (~16 MB)
FILE_GLOBS = ("sglang-request-metrics-*.log", "sglang-request-metrics-*.log.gz")
CSV_COLUMNS = ("minute", "prompt_class", "requests", "ttft_p50_seconds", "ttft_p95_seconds",
               "queue_p95_seconds", "e2e_p95_seconds", "tpot_p50_seconds", "cached_share")


_ZERO = -10**9  # the bucket of values <= 1e-9
_LN_GROWTH = math.log(GROWTH)  # math.log(v, GROWTH) is math.log(v) / this, bit for bit
_ABOVE_ZERO = (1e-9).__lt__  # v > 1e-9: not in the _ZERO bucket
_BRACE = ord("{")


class Quantiles:
    """Counts in log-spaced buckets GROWTH wide: any quantile to within 1 %, bounded memory."""

    __slots__ = ("counts",)

    def __init__(self):
        self.counts: Counter = Counter()

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    def add(self, value: float) -> None:
        self.counts[_ZERO if value <= 1e-9 else math.floor(math.log(value) / _LN_GROWTH)] += 1

    def quantile(self, q: float) -> float | None:
        n = self.n
        if not n:
            return None
        rank, seen = q * (n - 1), 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen > rank:
                return 0.0 if key == _ZERO else GROWTH ** (key + 0.5)
        return None  # not reached


@dataclass(slots=True)
class ClassStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: Quantiles = field(default_factory=Quantiles)
    queue: Quantiles = field(default_factory=Quantiles)
    e2e: Quantiles = field(default_factory=Quantiles)
    tpot: Quantiles = field(default_factory=Quantiles)

    def add(self, r: Record) -> None:
        self.add_numbers(r.prompt_tokens, r.cached_tokens, r.e2e_seconds, r.ttft_seconds,
                         r.queue_seconds, r.tpot_seconds)

    def add_numbers(self, prompt: int, cached: int, e2e: float, ttft: float | None,
                    queue: float | None, tpot: float | None) -> None:
        self.requests += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        log, floor = math.log, math.floor
        self.e2e.counts[_ZERO if e2e <= 1e-9 else floor(log(e2e) / _LN_GROWTH)] += 1
        if ttft is not None:
            self.ttft.counts[_ZERO if ttft <= 1e-9 else floor(log(ttft) / _LN_GROWTH)] += 1
        if queue is not None:
            self.queue.counts[_ZERO if queue <= 1e-9 else floor(log(queue) / _LN_GROWTH)] += 1
        if tpot is not None:
            self.tpot.counts[_ZERO if tpot <= 1e-9 else floor(log(tpot) / _LN_GROWTH)] += 1

    def add_batch(self, prompts: list[int], cached: list[int], e2e: list[float],
                  ttft: list[float], queue: list[float], tpot: list[float]) -> None:
        """add_numbers for many records at once (one e2e each), counted in C: the same counts."""
        self.requests += len(e2e)
        self.prompt_tokens += sum(prompts)
        self.cached_tokens += sum(cached)
        for quantiles, values in ((self.e2e, e2e), (self.ttft, ttft), (self.queue, queue),
                                  (self.tpot, tpot)):
            if values:
                above = list(filter(_ABOVE_ZERO, values))
                if len(above) < len(values):
                    quantiles.counts[_ZERO] += len(values) - len(above)
                quantiles.counts.update(map(math.floor, map(
                    truediv, map(math.log, above), repeat(_LN_GROWTH))))

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
    """The report's figures, fed records one by one (`feed`, a parse_record result: the whole
    line decoded) or as the request-record reader cuts them (`read_spans`: parse_span, the
    exporter's reading, which leaves a record's request_parameters unread and reads
    max_new_tokens only for the records that enter the slowest; the same report for the same
    records, tests/test_analyze_requests_paths.py). per_minute: keep the per-minute table
    (--csv) too."""

    top: int = TOP
    start: float | None = None  # only records finished in [start, end] (the snapshot's window)
    end: float | None = None
    per_minute: bool = True
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
            if self.per_minute:
                self._minute(int(at // 60 * 60), parsed.prompt_class).add(parsed)
        item = (_slowness(parsed), self.records, parsed)
        if len(self._slowest) < self.top:
            heapq.heappush(self._slowest, item)
        elif self.top:
            heapq.heappushpop(self._slowest, item)

    def _minute(self, minute: int, cls: str) -> ClassStats:
        stats = self.minutes.get((minute, cls))
        if stats is None:
            stats = self.minutes[(minute, cls)] = ClassStats()
        return stats

    def read_spans(self, spans: list[tuple[bytes, int, int]]) -> None:
        """Records where RecordReader.feed_spans found them: the same as
        `feed(parse_record(buf[start:end], keep_id=True, read_params=True))` for each, without
        a copy of the line, nor a Record (or the prompt's decoding) for a record that is not
        among the slowest."""
        rejected, classes, heap, top = self.rejected, self.classes, self._slowest, self.top
        # The by-class figures of these records: their values, counted at the end in C
        # (ClassStats.add_batch), lists of at most as many values as the spans hold lines.
        batch = {cls: ([], [], [], [], [], []) for cls in classes}
        windowed = self.start is not None or self.end is not None
        per_minute = self.per_minute
        records = self.records
        first = math.inf if self.first is None else self.first
        last = -math.inf if self.last is None else self.last
        # A record enters the slowest when its slowness is at least this (heappushpop lets a
        # record in when its (slowness, order) is above the least one's, and its order is the
        # latest): any while there are fewer than `top`, none with top 0.
        least = -math.inf if len(heap) < top else heap[0][0] if top else math.inf
        brace = _BRACE
        try:
            for buf, start, end in spans:
                if buf[start] == brace:
                    n = parse_span(buf, start, end)
                else:  # not in SGLang's layout: parsed whole
                    line = buf[start:end]
                    if line.isspace():
                        continue  # a blank line: not a record
                    n = parse_numbers(line)
                if type(n) is str:
                    rejected[n] += 1
                    continue
                (prompt, completion, cached, e2e, ttft, queue, tpot, reason, cls, received,
                 at, release, rid, params) = n
                if windowed and self._outside(at):
                    self.outside += 1
                    continue
                records += 1
                prompts, cacheds, e2es, ttfts, queues, tpots = batch[cls]
                prompts.append(prompt)
                cacheds.append(cached)
                e2es.append(e2e)
                if ttft is not None:
                    ttfts.append(ttft)
                    slowness = ttft
                else:
                    slowness = e2e
                if queue is not None:
                    queues.append(queue)
                if tpot is not None:
                    tpots.append(tpot)
                if at is not None:
                    if at < first:
                        first = at
                    if at > last:
                        last = at
                    if per_minute:
                        self._minute(int(at // 60 * 60), cls).add_numbers(
                            prompt, cached, e2e, ttft, queue, tpot)
                if slowness >= least:
                    if params is None:  # left unread: from the line
                        params = request_parameters(buf[start:end], MAX_PARAMS_CHARS)
                    item = (slowness, records, Record(
                        prompt, completion, cached, e2e, ttft, queue, tpot, reason, cls,
                        received, at, release, safe_request_id(rid),
                        None if params is None else max_new_tokens(params)))
                    if len(heap) < top:
                        heapq.heappush(heap, item)
                    else:
                        heapq.heappushpop(heap, item)
                    if len(heap) >= top:
                        least = heap[0][0]
        finally:
            self.records = records
            self.first = None if first == math.inf else first
            self.last = None if last == -math.inf else last
            for cls, values in batch.items():
                if values[2]:
                    classes[cls].add_batch(*values)

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
        if not self.per_minute:
            raise ValueError("per_minute_rows of an Analysis made without per_minute")
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
        # The exporter's reader: a record's prompt is not copied out of the chunk it was read
        # into, nor decoded (bar max_new_tokens of the slowest); a line over MAX_RECORD_BYTES
        # is skipped unread. Memory: a chunk, one line, the spans of SPAN_BYTES of lines, the
        # buckets and the slowest.
        reader = RecordReader(MAX_RECORD_BYTES)
        for chunk in read_chunks(raw, item.path):
            before = reader.too_long
            for at in range(0, len(chunk), SPAN_BYTES):
                analysis.read_spans(reader.feed_spans(chunk[at:at + SPAN_BYTES]))
            if reader.too_long != before:
                analysis.rejected["too_long"] += reader.too_long - before
        last = reader.finish()
        if last is not None:
            analysis.read_spans([(last, 0, len(last))])
    return analysis


def analyze(args: Iterable[str], top: int = TOP, start: float | None = None,
            end: float | None = None, per_minute: bool = True) -> Analysis:
    """Raises UnreadableLog for a file named that cannot be read; a file of a directory that
    cannot be is left out and listed in the result's `skipped`. per_minute: also the per-minute
    table (`per_minute_rows`, --csv)."""
    analysis = Analysis(top=top, start=start, end=end, per_minute=per_minute)
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
        result = analyze(files, top=top, per_minute=csv_out is not None)
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
