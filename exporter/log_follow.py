"""Follow an SGLang log like `tail -F`: from a file (rotation and truncation survive) or from a
container's log stream (docker SDK), feeding each line to the parser and LogStats.

A background thread per source; the scrape path only reads LogStats snapshots. Lines over
MAX_LINE_BYTES are skipped whole and counted, never kept; nothing of a line's text is logged.

A followed path is only ever read as a regular file: it is opened non-blocking and checked with
fstat, so a FIFO, a device (/dev/zero), a socket or a directory put in its place can neither
block the thread nor feed it forever; the source is down (`up` False) while the path is missing
or not a regular file, with one log line per change. One poll reads at most MAX_BYTES_PER_POLL;
the rest waits for the next.

The path is the operator's (--sglang.log-file): a symbolic link there is followed wherever it
points (/var/log/sglang.log -> a dated file, Kubernetes' /var/log/containers/*.log ->
/var/log/pods/...), as long as what it reaches is a regular file. Files found in a directory
rather than named by the operator (the hourly request-record files, exporter/request_follow.py)
are kept to that directory by the subclass there (`_path_problem`, `_open_fd`).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Iterable

from sglang_obs.core.safe_files import OPEN_FLAGS, Refused, file_type
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.sglang_log import MAX_LINE_BYTES, LineReader, parse_line

log = logging.getLogger(__name__)
MAX_LINE = MAX_LINE_BYTES
HISTORY_BYTES = 4 * 1024 * 1024  # read at start to set gauges (capacity line, last batch)
MAX_BYTES_PER_POLL = 8 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024
# What a poll compares to tell a file truncated and refilled past our offset from one that grew:
# its first bytes and the last bytes we read, both as we read them.
HEAD_BYTES = 256
TAIL_BYTES = 4096
_OPEN_FLAGS = OPEN_FLAGS
_file_type = file_type


def stat_problem(path: str) -> tuple[os.stat_result | None, str | None]:
    """(stat of `path`, None) for a regular file, else (stat or None, why not)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, "no such file"
    except OSError as err:
        return None, f"cannot stat ({type(err).__name__})"
    if not stat.S_ISREG(st.st_mode):
        return st, _file_type(st.st_mode)
    return st, None


class FileFollower:
    """Follows one path. `poll()` reads what was appended since the last call.

    `state` says why `up` is what it is ("following", "no such file", "a FIFO", ...);
    `rotations` counts new files and truncations, `bytes_read` what was read, `capped_polls`
    the polls that stopped at MAX_BYTES_PER_POLL with more to read.
    """

    kind = "file"

    def __init__(self, path: str, stats: LogStats, read_history: bool = True, server: str = ""):
        self.path = path
        self.stats = stats
        self.server = server
        self.rotations = 0
        self.up = False
        self.state = "not polled yet"
        self.bytes_read = 0
        self.capped_polls = 0
        self._fd: int | None = None
        self._id: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._offset = 0
        self._head = b""  # the file's first bytes, as read
        self._tail = b""  # the last bytes read, ending at _offset
        self._lines = LineReader(MAX_LINE)
        self._read_history = read_history
        # A file that exists when we start has history: begin at its end. One that appears
        # later (or after a rotation) is read from its first line.
        self._at_end_on_open = True

    # -- state -------------------------------------------------------------------------------
    def _set(self, up: bool, state: str) -> bool:
        """One log line per change of state; the path is the operator's, never a line's text."""
        if state != self.state:
            if up:
                log.info("log file %s: following", self.path)
            else:
                log.warning("log file %s: %s; log_source_up is 0 until it is a regular file",
                            self.path, state)
        self.up, self.state = up, state
        return up

    def _path_problem(self) -> tuple[os.stat_result | None, str | None]:
        return stat_problem(self.path)

    # -- opening -----------------------------------------------------------------------------
    def _open(self, from_start: bool) -> bool:
        at_end, self._at_end_on_open = not from_start, False
        _, problem = self._path_problem()  # refuse a FIFO or a device before opening it...
        if problem is not None:
            return self._set(False, problem)
        try:
            fd = self._open_fd()  # ...and never block if one was swapped in
        except Refused as err:
            return self._set(False, str(err))
        except OSError as err:
            return self._set(False, f"cannot open ({type(err).__name__})")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # what was opened is what counts
                os.close(fd)
                return self._set(False, _file_type(st.st_mode))
            self._fd, self._id = fd, (st.st_dev, st.st_ino)
            self._lines.reset()
            self._offset, self._head, self._tail = 0, b"", b""
            if at_end:
                self._start_at_end(st.st_size)
        except OSError as err:
            self.close()
            return self._set(False, f"cannot read ({type(err).__name__})")
        return self._set(True, "following")

    def _open_fd(self) -> int:
        """The descriptor to read the path through (checked with fstat by the caller)."""
        return os.open(self.path, _OPEN_FLAGS)

    def _start_at_end(self, size: int) -> None:
        """Begin after the last complete line; the history before it only sets gauges."""
        start = max(size - HISTORY_BYTES, 0)
        data = os.pread(self._fd, HISTORY_BYTES, start)
        cut = data.rfind(b"\n") + 1
        if self._read_history:
            reader = LineReader(MAX_LINE)
            if start:
                reader.skip_to_newline()  # the first line is cut
            for line in reader.feed(data[:cut]):
                self.stats.feed(parse_line(line), count=False)  # gauges only: not counted
        if start and not cut:  # inside one long line: follow from its end
            self._offset = start + len(data)
            self._lines.skip_to_newline()
        else:
            self._offset = start + cut
            self._tail = data[max(cut - TAIL_BYTES, 0):cut]
        self._head = os.pread(self._fd, min(HEAD_BYTES, self._offset), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- polling -----------------------------------------------------------------------------
    def poll(self) -> int:
        """Read new lines, MAX_BYTES_PER_POLL at most; returns how many were fed."""
        fed = [0]
        try:
            self._poll(fed)
        except OSError as err:  # EIO and the like: reopen at the end on the next poll
            self.close()
            self._at_end_on_open = True
            self._set(False, f"cannot read ({type(err).__name__})")
        if fed[0]:
            self.stats.batch_fed()
        return fed[0]

    def _poll(self, fed: list[int]) -> None:
        if self._fd is None:
            if self._open(from_start=not self._at_end_on_open):
                self._drain(MAX_BYTES_PER_POLL, fed)
            return
        st, problem = self._path_problem()
        if problem == "no such file" or st is None:
            self._drain(MAX_BYTES_PER_POLL, fed)  # deleted or rotated away: its last words
            self._set(False, problem)
            return
        if problem is not None:  # a FIFO or a device in its place: finish the file, drop it
            self._drain(MAX_BYTES_PER_POLL, fed)
            self.close()
            self._set(False, problem)
            return
        if (st.st_dev, st.st_ino) != self._id:  # rotated: finish the old file, then the new
            used, at_eof = self._drain(MAX_BYTES_PER_POLL, fed)
            if not at_eof:
                return  # the old file still has lines: the new one waits for the next poll
            self.close()
            self.rotations += 1
            if self._open(from_start=True):
                self._drain(MAX_BYTES_PER_POLL - used, fed)
            return
        if st.st_size < self._offset or self._rewritten():  # truncated in place (copytruncate)
            self._offset, self._head, self._tail = 0, b"", b""
            self._lines.reset()
            self.rotations += 1
        self._set(True, "following")
        self._drain(MAX_BYTES_PER_POLL, fed)

    def _rewritten(self) -> bool:
        """Truncated and refilled past our offset between two polls: the last bytes we read, or
        the first bytes of the file, are not where they were."""
        if self._tail and os.pread(self._fd, len(self._tail),
                                   self._offset - len(self._tail)) != self._tail:
            return True
        return bool(self._head) and os.pread(self._fd, len(self._head), 0) != self._head

    def _drain(self, limit: int, fed: list[int]) -> tuple[int, bool]:
        """Read up to `limit` bytes; returns (bytes read, whether the end was reached)."""
        used = 0
        while used < limit:
            chunk = os.pread(self._fd, min(CHUNK_BYTES, limit - used), self._offset)
            if not chunk:
                return used, True
            if self._offset < HEAD_BYTES:  # _head holds bytes [0, min(_offset, HEAD_BYTES))
                self._head += chunk[:HEAD_BYTES - self._offset]
            self._offset += len(chunk)
            used += len(chunk)
            self.bytes_read += len(chunk)
            self._tail = (chunk[-TAIL_BYTES:] if len(chunk) >= TAIL_BYTES
                          else (self._tail + chunk)[-TAIL_BYTES:])
            fed[0] += self._feed(chunk)
        self.capped_polls += 1
        return used, False

    def _feed(self, chunk: bytes) -> int:
        before = self._lines.too_long
        lines = self._lines.feed(chunk)
        if self._lines.too_long != before:
            self.stats.dropped_line("too_long", self._lines.too_long - before)
        return feed_lines(lines, self.stats, notify=False)


def feed_lines(lines: Iterable[bytes | str], stats: LogStats, notify: bool = True) -> int:
    n = 0
    for line in lines:
        if len(line) > MAX_LINE:
            stats.dropped_line("too_long")
            continue
        stats.feed(parse_line(line))
        n += 1
    if n and notify:
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
                self.up, backoff, reader = True, 1.0, LineReader(MAX_LINE)
                for chunk in stream:
                    before = reader.too_long
                    lines = reader.feed(chunk)
                    if reader.too_long != before:
                        self.stats.dropped_line("too_long", reader.too_long - before)
                    feed_lines(lines, self.stats)
                    if stop.is_set():
                        return
            except Exception as err:  # container gone, daemon restarted, socket closed
                log.warning("log stream of %s: %s", self.container, type(err).__name__)
            self.up = False
            self.rotations += 1
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
