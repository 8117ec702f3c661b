"""What SGLang's scheduler log says that /metrics does not: aggregated from parsed lines.

Fed one `exporter.sglang_log.ParsedLine` at a time (from a followed file, a container's log
stream, or a saved log for `sglang-obs analyze-log`). Only numbers are kept: no line text ever
reaches a metric or the exporter's own log.

Per DP rank the last prefill and decode lines are kept, so gauges sum over DP ranks the way
SGLang's load does; counters simply add up.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_obs.exporter.sglang_log import ParsedLine

# Context size of whole prompts (cached + new tokens; PromptRuns), from 1K to 1M tokens.
CONTEXT_BUCKETS = (1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 98304.0,
                   131072.0, 196608.0, 262144.0, 524288.0, 1048576.0)


class PromptRuns:
    """Whole prompts out of the prefill lines: one request's context (cached + new tokens), the
    one definition `sglang-obs analyze-log` and the exporter's context histogram share.

    Chunked prefill logs a long prompt as single-request lines (#new-seq: 1) of `chunk` new
    tokens, the first with the prompt's cached tokens, the others with none (SGLang's
    PrefillAdder counts a continuation as uncached), closed by a shorter one: the run adds up to
    one prompt, not one per chunk. A chunk that shares its batch with other requests hides its
    size: that prompt is left out. Per DP rank; `chunk` None means no chunking."""

    def __init__(self) -> None:
        # rank -> (first chunk's cached tokens, or None when the run is unreadable, new, lines)
        self._runs: dict[int, tuple[int | None, int, int]] = {}

    def clear(self) -> None:
        """A (re)start, or the end: a prompt still being chunked never finished."""
        self._runs.clear()

    def line(self, rank: int, single: bool, new: int, cached: int,
             chunk: int | None) -> list[tuple[int, bool]]:
        """The prompts this prefill line completes: (context tokens, chunked), oldest first."""
        done = []
        run = self._runs.pop(rank, None)
        if run is not None:
            first, total, lines = run
            if single and cached == 0:  # the chunked request goes on
                if chunk is not None and new >= chunk:
                    self._runs[rank] = (first, total + new, lines + 1)
                elif first is not None:
                    done.append((first + total + new, True))
                return done
            if single and first is not None:  # a new request: that one ended on a whole chunk
                done.append((first + total, lines > 1))
        if chunk is not None and new >= chunk:  # a full chunk: its last request may go on
            self._runs[rank] = (cached, new, 1) if single else (None, 0, 1)
        elif single:
            done.append((new + cached, False))
        return done


@dataclass
class LogSnapshot:
    """An immutable copy for the collector (no locking on the scrape path beyond the copy)."""

    lines: dict[str, int]
    prefill_batches: int
    prefill_new_tokens: int
    prefill_cached_tokens: int
    decode_reports: int
    retracted_requests: int
    health_check_failures: int
    pending_prefill_tokens: float | None
    queue_requests: float | None
    running_requests: float | None
    running_batch_tokens: float | None
    input_throughput: float | None
    gen_throughput: float | None
    spec_accept_length: float | None
    capacity: dict[str, float]
    ready_timestamp: float | None
    last_line_timestamp: float | None
    context_buckets: tuple[int, ...]
    context_sum: float
    context_count: int
    # Lines not parsed, by why: "too_long" (over MAX_LINE_BYTES, skipped unread) and
    # "not_sglang" (not starting with SGLang's prefix). Both are in lines["unparsed"] too.
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class LogStats:
    lines: dict[str, int] = field(default_factory=dict)  # kind -> lines, from the first one
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> unparsed lines
    prefill_batches: int = 0
    prefill_new_tokens: int = 0
    prefill_cached_tokens: int = 0
    decode_reports: int = 0
    retracted_requests: int = 0
    health_check_failures: int = 0
    capacity: dict[str, float] = field(default_factory=dict)
    ready_timestamp: float | None = None
    last_line_timestamp: float | None = None
    _prefill: dict[int, dict] = field(default_factory=dict)  # dp rank -> fields of last line
    _decode: dict[int, dict] = field(default_factory=dict)
    _last: dict[int, dict] = field(default_factory=dict)  # last batch line of either kind
    _context_counts: list[int] = field(default_factory=lambda: [0] * (len(CONTEXT_BUCKETS) + 1))
    _context_sum: float = 0.0
    _context_count: int = 0
    _chunk: int | None = None  # the start-up line's chunked_prefill_size
    _prompts: PromptRuns = field(default_factory=PromptRuns, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _listeners: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` after each batch of new lines (the poller re-derives from them)."""
        self._listeners.append(listener)

    def batch_fed(self) -> None:
        for listener in self._listeners:
            listener()

    def feed(self, parsed: ParsedLine | None, *, count: bool = True) -> None:
        """Account one line; `count=False` only refreshes gauges (the history read at start)."""
        with self._lock:
            self._feed(parsed, count)

    def dropped_line(self, reason: str, n: int = 1) -> None:
        """Account `n` lines that were not parsed at all, e.g. "too_long"."""
        with self._lock:
            self._drop(reason, n)

    def _drop(self, reason: str, n: int) -> None:
        self.lines["unparsed"] = self.lines.get("unparsed", 0) + n
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def _feed(self, parsed: ParsedLine | None, count: bool) -> None:
        if parsed is None:
            if count:
                self._drop("not_sglang", 1)
            return
        if count:
            self.lines[parsed.kind] = self.lines.get(parsed.kind, 0) + 1
        if parsed.ts is not None:
            self.last_line_timestamp = parsed.ts.timestamp()
        f, dp = parsed.fields, parsed.ranks.get("DP", 0)
        if parsed.kind in ("prefill", "decode"):
            self._last[dp] = f
        if parsed.kind == "prefill":
            self._prefill[dp] = f
            if count:
                self.prefill_batches += 1
                self.prefill_new_tokens += int(f.get("new_token", 0))
                self.prefill_cached_tokens += int(f.get("cached_token", 0))
                for context, _ in self._prompts.line(dp, f.get("new_seq") == 1,
                                                     int(f.get("new_token", 0)),
                                                     int(f.get("cached_token", 0)), self._chunk):
                    self._context_counts[bisect.bisect_left(CONTEXT_BUCKETS, context)] += 1
                    self._context_sum += context
                    self._context_count += 1
        elif parsed.kind == "decode":
            self._decode[dp] = f
            if count:
                self.decode_reports += 1
        elif parsed.kind == "retraction" and count:
            self.retracted_requests += int(f.get("retracted_reqs", 0))
        elif parsed.kind == "health_check_failed" and count:
            self.health_check_failures += 1
        elif parsed.kind == "capacity":  # a (re)start: its chunk size from now on
            self.capacity = {k: float(v) for k, v in f.items()}
            size = int(f.get("chunked_prefill_size", -1))
            self._chunk = size if size > 0 else None
            self._prompts.clear()
        elif parsed.kind == "ready" and parsed.ts is not None:
            self.ready_timestamp = parsed.ts.timestamp()

    def snapshot(self) -> LogSnapshot:
        with self._lock:
            return LogSnapshot(
                lines=dict(self.lines), prefill_batches=self.prefill_batches,
                prefill_new_tokens=self.prefill_new_tokens,
                prefill_cached_tokens=self.prefill_cached_tokens,
                decode_reports=self.decode_reports, retracted_requests=self.retracted_requests,
                health_check_failures=self.health_check_failures,
                pending_prefill_tokens=_sum(self._prefill, "pending_token"),
                # The latest batch line of either kind tells the queue and the running batch.
                queue_requests=_sum(self._last, "queue_req"),
                running_requests=_sum(self._last, "running_req"),
                running_batch_tokens=_sum(self._decode, "num_token"),
                input_throughput=_sum(self._prefill, "input_throughput"),
                gen_throughput=_sum(self._decode, "gen_throughput"),
                spec_accept_length=_max(self._decode, "accept_len"),
                capacity=dict(self.capacity), ready_timestamp=self.ready_timestamp,
                last_line_timestamp=self.last_line_timestamp,
                context_buckets=tuple(self._context_counts), context_sum=self._context_sum,
                context_count=self._context_count, dropped=dict(self.dropped))


def _sum(per_rank: dict[int, dict], key: str) -> float | None:
    values = [f[key] for f in per_rank.values() if key in f]
    return float(sum(values)) if values else None


def _max(per_rank: dict[int, dict], key: str) -> float | None:
    values = [f[key] for f in per_rank.values() if key in f]
    return float(max(values)) if values else None
