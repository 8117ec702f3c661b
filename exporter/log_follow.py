"""Follow an SGLang log like `tail -F`: from a file (rotation and truncation survive) or from a
container's log stream (docker SDK), feeding each line to the parser and LogStats.

A background thread per source; the scrape path only reads LogStats snapshots. Over-long lines
are cut and counted, never kept; nothing of a line's text is logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable

from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.sglang_log import parse_line

log = logging.getLogger(__name__)
MAX_LINE = 64 * 1024
HISTORY_BYTES = 4 * 1024 * 1024  # read at start to set gauges (capacity line, last batch)


class FileFollower:
    """Follows one path. `poll()` reads what was appended since the last call."""

    kind = "file"

    def __init__(self, path: str, stats: LogStats, read_history: bool = True, server: str = ""):
        self.path = path
        self.stats = stats
        self.server = server
        self.rotations = 0
        self.up = False
        self._fh = None
        self._inode = None
        self._buffer = b""
        self._read_history = read_history
        # A file that exists when we start has history: begin at its end. One that appears
        # later (or after a rotation) is read from its first line.
        self._at_end_on_open = True

    def _open(self, from_start: bool) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open while following
        except OSError:
            self.up = False
            self._at_end_on_open = False
            return False
        st = os.fstat(fh.fileno())
        if not from_start:
            fh.seek(max(st.st_size - HISTORY_BYTES, 0))
            lines = fh.read(HISTORY_BYTES).split(b"\n")
            partial = lines.pop()  # not finished yet: it will be read when it is
            if self._read_history:  # gauges only: history is not counted
                for line in lines[1 if st.st_size > HISTORY_BYTES else 0:]:
                    self.stats.feed(parse_line(line[:MAX_LINE]), count=False)
            fh.seek(st.st_size - len(partial))
        self._fh, self._inode, self._buffer, self.up = fh, st.st_ino, b"", True
        return True

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def poll(self) -> int:
        """Read new lines; returns how many were fed."""
        if self._fh is None and not self._open(from_start=not self._at_end_on_open):
            return 0
        fed = self._drain()
        try:
            st = os.stat(self.path)
        except OSError:  # rotated away and not recreated yet: keep the old handle
            return fed
        if st.st_ino != self._inode:  # rotated: finish the old file, start the new one
            fed += self._drain()
            self.close()
            self.rotations += 1
            if self._open(from_start=True):
                fed += self._drain()
        elif st.st_size < self._fh.tell():  # truncated in place (copytruncate)
            self._fh.seek(0)
            self._buffer = b""
            self.rotations += 1
            fed += self._drain()
        return fed

    def _drain(self) -> int:
        fed = 0
        while True:
            chunk = self._fh.read(1 << 20)
            if not chunk:
                return fed
            data = self._buffer + chunk
            lines = data.split(b"\n")
            self._buffer = lines.pop()
            if len(self._buffer) > MAX_LINE:  # a runaway line: drop what we have of it
                self._buffer = b""
                self.stats.feed(None)
            fed += feed_lines(lines, self.stats)


def feed_lines(lines: Iterable[bytes | str], stats: LogStats) -> int:
    n = 0
    for line in lines:
        stats.feed(parse_line(line[:MAX_LINE]))
        n += 1
    if n:
        stats.batch_fed()
    return n


class DockerLogFollower:
    """Follows a container's log stream from now on; reconnects with backoff."""

    kind = "docker"

    def __init__(self, client, container: str, stats: LogStats, server: str = ""):
        self._client, self.container, self.stats, self.server = client, container, stats, server
        self.up = False
        self.rotations = 0  # restarts of the stream (the file follower's rotations)

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._run, args=(stop,), name=f"logs {self.container}",
                         daemon=True).start()

    def _run(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                stream = self._client.containers.get(self.container).logs(
                    stream=True, follow=True, since=int(time.time()))
                self.up, backoff, buffer = True, 1.0, b""
                for chunk in stream:
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()[-MAX_LINE:]
                    feed_lines(lines, self.stats)
                    if stop.is_set():
                        return
            except Exception as err:  # container gone, daemon restarted, socket closed
                log.warning("log stream of %s: %s", self.container, type(err).__name__)
            self.up = False
            self.rotations += 1
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
