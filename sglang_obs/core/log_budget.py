"""A budget of log lines for one source: at most `burst` lines per `window` seconds, then one
line saying how many were left out.

A source that changes state every second (an SGLang server flapping up and down, a client
sending bad requests) must not flood the log, and the log must still say that something
happened and how much. The window opens with the first line taken and closes `window` seconds
later; lines past the burst are counted instead of logged, and the first take() or flush()
after the window closed returns that count, once, for the caller to word one summary line.
Call flush() now and then (every poll cycle) so the summary comes even when the source has gone
quiet. Used per server by the exporter's pollers (exporter/poller.py) and for the alert sink's
rejection log (REJECT_LOG_BURST per REJECT_LOG_WINDOW). One thread per budget: it holds no
lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogBudget:
    def __init__(self, burst: int, window: float, clock: Callable[[], float] = time.monotonic):
        self.burst = burst
        self.window = window
        self._clock = clock
        self._opened: float | None = None  # when the current window opened; None: no window
        self._logged = 0
        self._left_out = 0

    def take(self) -> tuple[bool, int]:
        """(whether to log this line, lines left out of the window that has just closed): when
        the second is not 0, log one line saying so before this one."""
        left_out = self.flush()
        if self._opened is None:
            self._opened = self._clock()
        if self._logged < self.burst:
            self._logged += 1
            return True, left_out
        self._left_out += 1
        return False, left_out

    def flush(self) -> int:
        """Lines left out of a window that has closed, returned once; 0 while the window is open,
        and when nothing was left out."""
        if self._opened is None or self._clock() - self._opened < self.window:
            return 0
        left_out = self._left_out
        self._opened, self._logged, self._left_out = None, 0, 0
        return left_out
