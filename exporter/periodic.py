"""The one periodic loop behind every background source: each SGLang poller, GPU sampling, each
followed log file and the Docker API.

Fixed rate: a cycle starts every `interval` seconds counted from the first, however long each
took, so a source is read at the configured rate. A cycle that overruns is followed at once by
the next, and the ticks it missed are skipped, not run in a burst to catch up. An exception in
a cycle does not end the loop (a bug must not end a source's thread) and the next cycle runs on
time. The log has one line per change, not one per cycle: the first failure of a streak is
logged with the loop's name and its traceback, later failures of the streak are not, and the
first cycle that succeeds again logs one line saying how many failed. Setting the stop Event
ends the wait at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls `cycle` every `interval` seconds in a daemon thread named `name` until stopped."""

    def __init__(self, name: str, cycle: Callable[[], object], interval: float,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.interval = interval
        self._cycle = cycle
        self._clock = clock
        self._thread: threading.Thread | None = None
        self.failures = 0  # cycles that raised, since start
        self._streak = 0  # consecutive failed cycles up to now

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread:
            self._thread.join(timeout)

    def run(self, stop: threading.Event) -> None:
        """The loop itself, in the calling thread; returns once `stop` is set."""
        next_at = self._clock()
        while not stop.is_set():
            try:
                self._cycle()
            except Exception:
                self.failures += 1
                self._streak += 1
                if self._streak == 1:
                    log.exception("%s: cycle failed; the next one runs on time (later failures "
                                  "are not logged until it recovers)", self.name)
            else:
                if self._streak:
                    log.warning("%s: recovered after %d failed cycle(s)", self.name,
                                self._streak)
                    self._streak = 0
            next_at += self.interval
            now = self._clock()
            if next_at < now:  # overran: skip the missed ticks instead of bursting
                next_at = now
            stop.wait(next_at - now)
