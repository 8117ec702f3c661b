"""`sglang-obs analyze-log`: the evidence seed 000 assembled by hand, from saved SGLang logs.

Reads scheduler logs (plain or gzipped, any release from 0.4.6, several files in order) and
reports: the effective context of each request whose whole prompt the log shows (one
single-request prefill, or the run of single-request chunks chunked prefill splits it into),
the aggregate prefix-cache hit ratio,
the pending-token, queue, running and full-token peaks with their times, the longest continuous
queueing, and the top windows of sustained pressure. `--json` prints the same as a stable
document (fields in docs/log-analysis.md); `--csv-per-minute` writes a per-minute table.
Only numbers are read from the lines: no prompt text can reach the output.

Memory stays bounded whatever the files hold: they are read in chunks (a gzipped one
decompressed as a stream), a line over MAX_LINE_BYTES is skipped whole and counted
(`lines.too_long`), and per line only numbers are kept.

Speed: a batch line in a layout already seen (nearly every line of a log) is read by that
layout's strict regex (exporter.sglang_log.BatchLayouts), which gives exactly what parse_line
gives, or nothing; only the numbers used here are converted, times are kept as integer
milliseconds, and no per-line object is made. Every other line takes parse_line. Both go on to
the same code (Analysis.feed_lines); tests/test_analyze_log_speed_paths.py holds the two paths
to one report, and bench/bench_log.py measures the command against its floor.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import statistics
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sglang_obs.core.cli_support import Failure, output_file, report
from sglang_obs.core.safe_files import (
    SYMLINK_OUTSIDE,
    Refused,
    open_checked,
    open_output,
    open_within,
    stream,
)
from sglang_obs.exporter.log_stats import PromptRuns
from sglang_obs.exporter.sglang_log import (
    MAX_LINE_BYTES,
    BatchLayouts,
    LineReader,
    ParsedLine,
    parse_line,
)

SCHEMA_VERSION = 1
CHUNK_BYTES = 1024 * 1024
TOP_WINDOWS = 5
CSV_COLUMNS = ("minute", "prefill_batches", "new_tokens", "cached_tokens", "pending_peak",
               "queue_peak", "running_peak", "full_token_peak", "gen_throughput_mean",
               "retracted_requests")


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(sep=" ") if ts else None


# Times are kept as whole milliseconds since 0001-01-01 00:00 of the log's own (naive) clock:
# SGLang prints milliseconds at most, so they are exact, and a line costs no datetime.
_EPOCH = datetime(1, 1, 1)
_MINUTE_MS = 60_000
_NO_FIRST = 1 << 62  # after any time (9999-12-31 is 3e14 ms)


def _ms(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(milliseconds=1)


def _at(ms: int | None) -> datetime | None:
    return None if ms is None else _EPOCH + timedelta(milliseconds=ms)


def _iso_ms(ms: int | None) -> str | None:
    return _iso(_at(ms))


def _minute_ms(text: bytes) -> int | None:
    """b"YYYY-MM-DD HH:MM" as the milliseconds its minute starts at; None if no such time."""
    try:
        return _ms(datetime(int(text[:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                            int(text[14:16])))
    except ValueError:
        return None


@dataclass(slots=True)
class Peak:
    value: float = 0.0
    at: int | None = None  # milliseconds (_EPOCH)

    def doc(self) -> dict:
        return {"value": self.value if self.at is not None else None, "at": _iso_ms(self.at)}


@dataclass(slots=True)
class Minute:
    prefill_batches: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    pending_peak: float = 0
    queue_peak: float = 0
    running_peak: float = 0
    full_token_peak: float = 0
    gen_throughput_sum: float = 0.0
    gen_throughput_count: int = 0
    retracted_requests: int = 0

    @property
    def pressured(self) -> bool:
        return self.queue_peak > 0 or self.pending_peak > 0


# The fields the fast path (BatchLayouts) reads of a batch line, in the order `feed_lines`
# unpacks them after the prefix's four groups.
FAST_FIELDS = ("queue_req", "running_req", "new_seq", "new_token", "cached_token",
               "pending_token", "num_token", "gen_throughput")


@dataclass
class Analysis:
    files: list[str] = field(default_factory=list)
    lines: int = 0
    parsed: dict[str, int] = field(default_factory=dict)
    # The earliest and the latest line, milliseconds (_EPOCH); _NO_FIRST and -1 before any.
    _first: int = _NO_FIRST
    _last: int = -1
    too_long: int = 0  # lines over MAX_LINE_BYTES, skipped unread (also in parsed["unparsed"])
    contexts: array = field(default_factory=lambda: array("q"))  # 8 bytes per request
    chunked_requests: int = 0  # of the contexts, prompts prefilled over several lines
    chunk_size: int | None = None  # the capacity line's chunked_prefill_size (None: not seen)
    _sized: bool = False  # a capacity line was seen: chunk_size holds
    _prompts: PromptRuns = field(default_factory=PromptRuns)
    # Prefill lines before any capacity line (rank, single, new, cached), 4 numbers each: their
    # chunk size is inferred from them once a capacity line or the end comes.
    _unsized: array = field(default_factory=lambda: array("q"))
    new_tokens: int = 0
    cached_tokens: int = 0
    pending: Peak = field(default_factory=Peak)
    queue: Peak = field(default_factory=Peak)
    running: Peak = field(default_factory=Peak)
    full_tokens: Peak = field(default_factory=Peak)
    retracted_requests: int = 0
    longest_queueing_seconds: float = 0.0
    longest_queueing_from: int | None = None  # milliseconds (_EPOCH)
    _queue_since: dict[int, int] = field(default_factory=dict)  # per DP rank, milliseconds
    minutes: dict[int, Minute] = field(default_factory=dict)  # by minute (ms // 60,000)
    # The fast path: batch lines in a layout seen before (sglang_log.BatchLayouts), at most
    # `learn_layouts` of them (0: every line takes parse_line).
    learn_layouts: int = 16
    layouts: BatchLayouts = field(init=False, repr=False)
    _dp_ranks: dict[bytes, int] = field(default_factory=dict)  # ranks' text -> DP rank

    def __post_init__(self) -> None:
        self.layouts = BatchLayouts(FAST_FIELDS, limit=self.learn_layouts)

    @property
    def first_ms(self) -> int | None:
        return None if self._first == _NO_FIRST else self._first

    @property
    def last_ms(self) -> int | None:
        return None if self._last < 0 else self._last

    @property
    def first(self) -> datetime | None:
        return _at(self.first_ms)

    @property
    def last(self) -> datetime | None:
        return _at(self.last_ms)

    def skipped(self, n: int) -> None:
        """`n` lines too long to read: counted, not parsed."""
        self.lines += n
        self.too_long += n
        self.parsed["unparsed"] = self.parsed.get("unparsed", 0) + n

    def feed_lines(self, lines: Iterable[bytes]) -> None:
        """Log lines (bytes, no newline), in order, each as parse_line reads it (after
        stripping its carriage returns), in a fraction of parse_line's time: a batch line in a
        layout seen before is read by that layout's regex (sglang_log.BatchLayouts), which gives
        exactly the numbers parse_line would; only those used here are converted, and no
        ParsedLine, dict or datetime is made. Any other line takes parse_line (and teaches
        BatchLayouts its layout, unless `learn_layouts` is 0). Both go on to the same code."""
        layouts = self.layouts
        match, where = layouts.regex.match, layouts.layouts
        minutes, ranks_of, since = self.minutes, self._dp_ranks, self._queue_since
        # The peaks: their value, -1 before any (no value is below 0), and when.
        qp, rp, pp, fp = self.queue, self.running, self.pending, self.full_tokens
        q_v, r_v, p_v, f_v = (-1 if peak.at is None else peak.value for peak in (qp, rp, pp, fp))
        q_at, r_at, p_at, f_at = qp.at, rp.at, pp.at, fp.at
        first, last = self._first, self._last
        new_total, cached_total = self.new_tokens, self.cached_tokens
        prompts, contexts = self._prompts.line, self.contexts
        sized, chunk, chunked = self._sized, self.chunk_size, self.chunked_requests
        prefills = decodes = 0
        key = base = minute = None  # the last line's b"YYYY-MM-DD HH:MM", its ms, its Minute
        try:
            for line in lines:
                m = match(line)
                if m is None and line[:1] != b"[":
                    m = layouts.wrapped(line)
                if m is not None:  # the fast path
                    prefill, groups = where[m.lastindex]
                    (hhmm, second, millis, ranks, queue, running, seq, new, cached, pending,
                     num_token, gen) = m.group(*groups)
                    if prefill:
                        prefills += 1
                    else:
                        decodes += 1
                    if hhmm != key:
                        key, base = hhmm, _minute_ms(hhmm)
                        if base is not None:
                            minute = minutes.get(base // _MINUTE_MS)
                            if minute is None:
                                minute = minutes[base // _MINUTE_MS] = Minute()
                    if base is None:  # no such date or time (parse_line: ts None): counted only
                        continue
                    t = base + int(second) * 1000 + (int(millis) if millis else 0)
                    if t < first:
                        first = t
                    if t > last:
                        last = t
                    in_minute = minute
                    if not ranks:
                        rank = 0
                    else:
                        rank = ranks_of.get(ranks)
                        if rank is None:
                            if len(ranks_of) > 1024:
                                ranks_of.clear()
                            rank = ranks_of[ranks] = BatchLayouts.dp_rank(ranks)
                    queue = int(queue)
                    if running is not None:
                        running = int(running)
                    if prefill:
                        single, new, cached = int(seq) == 1, int(new), int(cached)
                        if pending is not None:
                            pending = int(pending)
                    else:
                        if num_token is not None:
                            num_token = int(num_token)
                        if gen is not None:
                            gen = float(gen)
                else:
                    line = line.rstrip(b"\r")
                    parsed = parse_line(line)
                    self._first, self._last, self.chunked_requests = first, last, chunked
                    values = self._take(parsed)
                    first, last, chunked = self._first, self._last, self.chunked_requests
                    sized, chunk = self._sized, self.chunk_size
                    if layouts.learn(line, parsed):
                        match, where = layouts.regex.match, layouts.layouts
                    if values is None:
                        continue
                    (t, in_minute, rank, prefill, queue, running, single, new, cached, pending,
                     num_token, gen) = values
                # A prefill or decode line at t (ms), of DP rank `rank`, in `in_minute`.
                # (queue_req is required in both kinds, so never None.)
                if queue > q_v:
                    q_v, q_at = queue, t
                if running is not None:
                    if running > r_v:
                        r_v, r_at = running, t
                    if running > in_minute.running_peak:
                        in_minute.running_peak = running
                if queue > in_minute.queue_peak:
                    in_minute.queue_peak = queue
                # A queueing run lasts from a line with a queue to the rank's next one without.
                if queue > 0:
                    if rank not in since:
                        since[rank] = t
                elif rank in since:
                    self._close_run(since.pop(rank), t)
                if prefill:
                    new_total += new
                    cached_total += cached
                    in_minute.prefill_batches += 1
                    in_minute.new_tokens += new
                    in_minute.cached_tokens += cached
                    if sized:  # as _request
                        for tokens, whole in prompts(rank, single, new, cached, chunk):
                            contexts.append(tokens)
                            chunked += whole
                    else:
                        self._unsized.extend((rank, single, new, cached))
                    if pending is not None:
                        if pending > p_v:
                            p_v, p_at = pending, t
                        if pending > in_minute.pending_peak:
                            in_minute.pending_peak = pending
                else:
                    if num_token is not None:
                        if num_token > f_v:
                            f_v, f_at = num_token, t
                        if num_token > in_minute.full_token_peak:
                            in_minute.full_token_peak = num_token
                    if gen is not None:
                        in_minute.gen_throughput_sum += gen
                        in_minute.gen_throughput_count += 1
        finally:
            for peak, value, at in ((qp, q_v, q_at), (rp, r_v, r_at), (pp, p_v, p_at),
                                    (fp, f_v, f_at)):
                if at is not None:
                    peak.value, peak.at = value, at
            self._first, self._last, self.chunked_requests = first, last, chunked
            self.new_tokens, self.cached_tokens = new_total, cached_total
            for kind, n in (("prefill", prefills), ("decode", decodes)):
                if n:
                    self.parsed[kind] = self.parsed.get(kind, 0) + n
            self.lines += prefills + decodes

    def _take(self, parsed: ParsedLine | None) -> tuple | None:
        """A line parse_line read as `parsed` (None: not SGLang's), counted and taken in; for a
        prefill or decode line with a time, the values feed_lines goes on with."""
        self.lines += 1
        kind = parsed.kind if parsed else "unparsed"
        self.parsed[kind] = self.parsed.get(kind, 0) + 1
        if parsed is None or parsed.ts is None:
            return None
        t, f = _ms(parsed.ts), parsed.fields
        self._first, self._last = min(self._first, t), max(self._last, t)
        minute = self.minutes.get(t // _MINUTE_MS)
        if minute is None:
            minute = self.minutes[t // _MINUTE_MS] = Minute()
        if kind == "capacity":  # a (re)start: its chunk size from now on
            self._size_unsized()
            self._prompts.clear()  # a request chunked when the process died never finished
            size = int(f.get("chunked_prefill_size", -1))
            self.chunk_size, self._sized = (size if size > 0 else None), True
        if kind == "retraction":
            n = int(f.get("retracted_reqs", 0))
            self.retracted_requests += n
            minute.retracted_requests += n
        if kind not in ("prefill", "decode"):
            return None
        return (t, minute, parsed.ranks.get("DP", 0), kind == "prefill", f["queue_req"],
                f.get("running_req"), f.get("new_seq") == 1, int(f.get("new_token", 0)),
                int(f.get("cached_token", 0)), f.get("pending_token"), f.get("num_token"),
                f.get("gen_throughput"))

    def _request(self, rank: int, single: bool, new: int, cached: int,
                 chunk: int | None) -> None:
        """Follow one prefill line into the contexts of whole prompts (PromptRuns)."""
        for tokens, chunked in self._prompts.line(rank, single, new, cached, chunk):
            self._context(tokens, chunked)

    def _context(self, tokens: int, chunked: bool) -> None:
        self.contexts.append(tokens)
        self.chunked_requests += chunked

    def _size_unsized(self) -> None:
        """Replay the prefill lines seen before any capacity line, under their own chunk size:
        their largest #new-token, if a single-request line that large is followed on its rank
        by an uncached single-request one (a continuation); else no chunking."""
        buffered, self._unsized = self._unsized, array("q")
        lines = range(0, len(buffered), 4)
        largest = max((buffered[i + 2] for i in lines), default=0)
        last: dict[int, int] = {}  # rank -> its previous line's index
        chunk = None
        for i in lines:
            before = last.get(buffered[i])
            if (before is not None and buffered[before + 1] and buffered[before + 2] == largest
                    and buffered[i + 1] and buffered[i + 3] == 0):
                chunk = self.chunk_size = largest
                break
            last[buffered[i]] = i
        for i in lines:
            self._request(buffered[i], bool(buffered[i + 1]), buffered[i + 2], buffered[i + 3],
                          chunk)

    def _close_run(self, start: int, end: int) -> None:
        seconds = (end - start) / 1000  # == timedelta.total_seconds(): both correctly rounded
        if seconds > self.longest_queueing_seconds:
            self.longest_queueing_seconds, self.longest_queueing_from = seconds, start

    def finish(self) -> None:
        for start in self._queue_since.values():  # still queueing when the log ends
            self._close_run(start, self.last_ms)
        self._queue_since.clear()
        self._size_unsized()
        self._prompts.clear()  # a prompt still being chunked when the log ends: size unknown

    # -- outputs --------------------------------------------------------------------------
    def windows(self) -> list[dict]:
        """Runs of consecutive minutes with a queue or a backlog, biggest prefill load first."""
        runs, current = [], []
        for minute in sorted(self.minutes):
            if self.minutes[minute].pressured and (not current or minute - current[-1] == 1):
                current.append(minute)
                continue
            if current:
                runs.append(current)
            current = [minute] if self.minutes[minute].pressured else []
        if current:
            runs.append(current)
        docs = []
        for run in runs:
            ms = [self.minutes[m] for m in run]
            docs.append({
                "from": _iso_ms(run[0] * _MINUTE_MS), "to": _iso_ms((run[-1] + 1) * _MINUTE_MS),
                "minutes": len(run), "prefill_batches": sum(m.prefill_batches for m in ms),
                "new_tokens": sum(m.new_tokens for m in ms),
                "pending_peak": max(m.pending_peak for m in ms),
                "queue_peak": max(m.queue_peak for m in ms),
                "running_peak": max(m.running_peak for m in ms),
                "full_token_peak": max(m.full_token_peak for m in ms)})
        docs.sort(key=lambda d: (-d["new_tokens"], d["from"]))
        return docs[:TOP_WINDOWS]

    def document(self) -> dict:
        contexts = self.contexts
        total = self.new_tokens + self.cached_tokens
        return {
            "schema_version": SCHEMA_VERSION,
            "files": self.files,
            "lines": {"total": self.lines, **dict(sorted(self.parsed.items())),
                      "too_long": self.too_long},
            "time_range": {"from": _iso_ms(self.first_ms), "to": _iso_ms(self.last_ms)},
            "context_tokens": {
                "requests": len(contexts),
                "chunked": self.chunked_requests,
                "chunk_size": self.chunk_size,
                "mean": statistics.fmean(contexts) if contexts else None,
                "median": statistics.median(contexts) if contexts else None,
                "max": max(contexts) if contexts else None,
                "first": contexts[0] if contexts else None,
                "last": contexts[-1] if contexts else None,
            },
            "prefill_tokens": {"new": self.new_tokens, "cached": self.cached_tokens,
                               "cache_hit_ratio": self.cached_tokens / total if total else None},
            "peaks": {"pending_tokens": self.pending.doc(), "queue_requests": self.queue.doc(),
                      "running_requests": self.running.doc(),
                      "full_tokens": self.full_tokens.doc()},
            "longest_queueing": {"seconds": self.longest_queueing_seconds,
                                 "from": _iso_ms(self.longest_queueing_from)},
            "retracted_requests": self.retracted_requests,
            "pressure_windows": self.windows(),
        }

    def per_minute_rows(self) -> Iterator[list]:
        for minute in sorted(self.minutes):
            m = self.minutes[minute]
            gen = (m.gen_throughput_sum / m.gen_throughput_count if m.gen_throughput_count
                   else "")
            yield [_iso_ms(minute * _MINUTE_MS), m.prefill_batches, m.new_tokens,
                   m.cached_tokens, m.pending_peak, m.queue_peak, m.running_peak,
                   m.full_token_peak, round(gen, 2) if gen != "" else "",
                   m.retracted_requests]


class UnreadableLog(Exception):
    """A file that cannot be read to its end; str() is one line that names it."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")


class RefusedFile(UnreadableLog):
    """A file refused before a byte of it was read: gone, not a regular file or a pipe with a
    writer, or (found in a directory) a link out of it."""


def check_path(path: Path) -> str | None:
    """Why `path` cannot be analysed (None if it can): it must be a regular file or a pipe.
    A check by name for the messages; what open_input opens is checked again."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as err:
        return f"cannot stat: {err.strerror or type(err).__name__}"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        return "not a regular file"  # /dev/zero and the like would never end
    return None


def open_input(path: Path, within: Path | None = None) -> io.BufferedReader:
    """`path` opened without ever blocking in open() (sglang_obs.core.safe_files): a regular
    file, or, named by the user (`within` None), a pipe something writes to
    (`analyze-log <(kubectl logs ...)`, `... | analyze-log /dev/stdin`), read as it comes like
    `cat` reads it. A FIFO nothing writes to is refused at once (open() of it used to wait for a
    writer forever), so is a device, socket or directory. A file found in the directory `within`
    must be a regular file in it: a link out of it is refused unopened."""
    try:
        if within is not None:
            fd, st = open_within(within, path.name)
        else:
            fd, st = open_checked(path, allow_fifo=True)
        return stream(fd, st, CHUNK_BYTES)
    except Refused as err:
        hint = (" (name the file itself to read it)" if err.reason == SYMLINK_OUTSIDE else "")
        raise RefusedFile(path, f"{err}{hint}") from None
    except FileNotFoundError:
        raise RefusedFile(path, "no such file") from None
    except OSError as err:
        raise UnreadableLog(path, err.strerror or type(err).__name__) from None


def read_chunks(raw: io.BufferedReader, path: Path) -> Iterator[bytes]:
    """The bytes of an open_input file in chunks of at most CHUNK_BYTES, gunzipped as a stream
    if gzipped; closes it."""
    try:
        with raw:
            gz = raw.peek(2)[:2] == b"\x1f\x8b"
            fh = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            while chunk := fh.read(CHUNK_BYTES):
                yield chunk
    except EOFError:
        raise UnreadableLog(path, "truncated gzip file (it ends before its end-of-stream "
                                  "marker)") from None
    except (gzip.BadGzipFile, zlib.error):
        raise UnreadableLog(path, "corrupt gzip data") from None
    except OSError as err:
        raise UnreadableLog(path, err.strerror or type(err).__name__) from None


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes in chunks of at most CHUNK_BYTES, gunzipped as a stream if gzipped."""
    yield from read_chunks(open_input(path), path)


def analyze(paths: Iterable[Path], *, fast: bool = True) -> Analysis:
    """The analysis of the files, in order. `fast` False: every line read by parse_line (the
    reference the fast path is tested against); the same result, slower."""
    result = Analysis() if fast else Analysis(learn_layouts=0)
    for path in paths:
        result.files.append(str(path))
        reader = LineReader(MAX_LINE_BYTES)
        for chunk in _chunks(path):
            before = reader.too_long
            result.feed_lines(reader.feed(chunk))
            if reader.too_long != before:
                result.skipped(reader.too_long - before)
        last = reader.finish()  # a last line without a newline
        if last is not None:
            result.feed_lines([last])
    result.finish()
    return result


def text_report(doc: dict) -> str:
    c, p, t = doc["context_tokens"], doc["peaks"], doc["prefill_tokens"]

    def peak(name, unit=""):
        v = p[name]
        return "—" if v["value"] is None else f"{v['value']:,.0f}{unit} at {v['at']}"

    hit = t["cache_hit_ratio"]
    lines = [
        f"Log: {doc['lines']['total']:,} lines from {doc['time_range']['from']} to "
        f"{doc['time_range']['to']} ({', '.join(doc['files'])})"
        + (f"; {doc['lines']['too_long']:,} over {MAX_LINE_BYTES // 1024} KiB skipped"
           if doc["lines"]["too_long"] else ""),
        "",
        f"Effective context per request ({c['requests']:,} prompts"
        + (f", {c['chunked']:,} of them in {c['chunk_size']:,}-token chunks"
           if c["chunked"] else "") + "): "
        + ("—" if not c["requests"] else
           f"mean {c['mean']:,.0f} tokens, median {c['median']:,.0f}, max {c['max']:,.0f}; "
           f"first {c['first']:,.0f}, last {c['last']:,.0f}"),
        f"Prefix cache hit ratio: {'—' if hit is None else f'{hit:.1%}'} "
        f"({t['cached']:,} cached of {t['cached'] + t['new']:,} prompt tokens)",
        f"Pending prefill tokens, peak: {peak('pending_tokens')}",
        f"Queued requests, peak: {peak('queue_requests')}",
        f"Longest continuous queueing: {doc['longest_queueing']['seconds']:.0f} s from "
        f"{doc['longest_queueing']['from'] or '—'}",
        f"Running requests, peak: {peak('running_requests')}",
        f"Full-token (running batch KV) peak: {peak('full_tokens')}",
        f"Retracted requests: {doc['retracted_requests']:,}",
        "",
        "Sustained pressure (minutes with a queue or a backlog), most prefill work first:",
    ]
    for w in doc["pressure_windows"] or []:
        lines.append(
            f"  {w['from']} – {w['to']}: {w['prefill_batches']} prefill batches, "
            f"{w['new_tokens']:,} new tokens, pending peak {w['pending_peak']:,.0f}, queue peak "
            f"{w['queue_peak']:.0f}, running peak {w['running_peak']:.0f}, full-token peak "
            f"{w['full_token_peak']:,.0f}")
    if not doc["pressure_windows"]:
        lines.append("  none")
    return "\n".join(lines) + "\n"


def main(files: list[str], as_json: bool, csv_out: str | None) -> int:
    """The command: 0, or 1 with one line on stderr per file it cannot read (and nothing
    else)."""
    paths = [Path(f) for f in files]
    bad = [(p, why) for p in paths if (why := check_path(p)) is not None]
    if bad:
        for p, why in bad:
            print(f"sglang-obs analyze-log: {p}: {why}", file=sys.stderr)
        return 1
    try:
        csv_path = output_file("--csv-per-minute", csv_out) if csv_out else None
    except Failure as err:
        return report("sglang-obs analyze-log", err)
    try:
        result = analyze(paths)
    except UnreadableLog as err:
        print(f"sglang-obs analyze-log: cannot read {err}", file=sys.stderr)
        return 1
    doc = result.document()
    if result.first is None:
        skipped = (f" ({result.too_long:,} line{'s' if result.too_long > 1 else ''} over "
                   f"{MAX_LINE_BYTES // 1024} KiB skipped)" if result.too_long else "")
        print(f"sglang-obs analyze-log: no SGLang scheduler lines found in "
              f"{', '.join(map(str, paths))}{skipped}", file=sys.stderr)
        return 1
    if csv_path:
        try:
            with open_output(csv_path) as fh:
                writer = csv.writer(fh)
                writer.writerow(CSV_COLUMNS)
                writer.writerows(result.per_minute_rows())
        except (OSError, Refused) as err:
            why = err.strerror if isinstance(err, OSError) and err.strerror else err
            print(f"sglang-obs analyze-log: --csv-per-minute {csv_path}: cannot write it "
                  f"({why})", file=sys.stderr)
            return 1
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if as_json else text_report(doc))
    return 0
