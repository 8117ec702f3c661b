"""How long the waiting queue has been continuously non-empty.

SGLang exports the queue length, but a gauge sampled every 15 s cannot tell one 89 s queueing
episode from six short ones. Polling every second, this tracker turns queue-length observations
into: the age of the current non-empty run, a histogram of completed runs, and the total time
spent with a non-empty queue (a counter, so `increase()` gives "seconds queued in the window").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

# Upper bounds in seconds: from "a blip" to "users gave up".
RUN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1800.0)


@dataclass(frozen=True)
class QueueRunState:
    current_seconds: float
    bucket_counts: tuple[int, ...]  # non-cumulative, len(RUN_BUCKETS) + 1 (last is +Inf)
    runs_sum_seconds: float
    runs_count: int
    nonempty_seconds_total: float

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*RUN_BUCKETS, float("inf")), self.bucket_counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class QueueRunTracker:
    """Feed it (monotonic time, queue length) at every poll; `lost()` when the server is gone."""

    def __init__(self) -> None:
        self._run_start: float | None = None
        self._last_time: float | None = None
        self._last_nonempty = False
        self._counts = [0] * (len(RUN_BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self._total = 0.0
        self._current = 0.0

    def observe(self, now: float, queue_length: float) -> None:
        if self._last_time is not None and self._last_nonempty and now > self._last_time:
            self._total += now - self._last_time
        if queue_length > 0:
            if self._run_start is None:
                self._run_start = now
            self._current = now - self._run_start
        else:
            self._finish(now)
        self._last_time = now
        self._last_nonempty = queue_length > 0

    def lost(self) -> None:
        """The server stopped answering: close the run at the last time it was seen queueing."""
        if self._last_time is not None:
            self._finish(self._last_time)
        self._last_time = None
        self._last_nonempty = False

    def state(self) -> QueueRunState:
        return QueueRunState(
            current_seconds=self._current,
            bucket_counts=tuple(self._counts),
            runs_sum_seconds=self._sum,
            runs_count=self._count,
            nonempty_seconds_total=self._total,
        )

    def _finish(self, end: float) -> None:
        if self._run_start is not None:
            duration = max(end - self._run_start, 0.0)
            self._counts[bisect.bisect_left(RUN_BUCKETS, duration)] += 1
            self._sum += duration
            self._count += 1
        self._run_start = None
        self._current = 0.0
