"""Follow the hourly request-record files SGLang writes into `--export-metrics-to-file-dir`.

SGLang appends one JSON line per finished request to `sglang-request-metrics-YYYYMMDD_HH.log`
and starts a new file every hour (local time of the server); it never rotates, truncates or
deletes one. The follower reads the newest file like `tail -F` (the scheduler-log follower's
FileFollower: rotation, truncation, a deleted file's last lines, a FIFO or device put in its
place, bounded reads per poll), and when a newer hourly file appears it finishes the old one and
reads the new one from its first line. At start the newest file is read from its end: records
written before the exporter started are not counted (a counter starts at 0, as after a restart).

The directory is listed only when its mtime changes, or every RESCAN_SECONDS in case the file
system's mtime is too coarse to show a new file; a directory of more than MAX_ENTRIES entries is
refused (prune old hourly files) rather than listed every time. Lines longer than
MAX_RECORD_BYTES are skipped whole and counted. The log has one line per change of the
directory's state, and one per reject reason the first time it is seen; no text of a record ever
reaches it.

Only files of the directory itself are read (sglang_obs.core.safe_files): a record file that is
a symbolic link out of the directory (to /etc/shadow, say), or into a subdirectory, is refused
unopened (its target is not even stat'ed through the link), and so is one that is a FIFO, device,
socket or directory; a refused file is left out of the choice of the newest file, so the hour
being written is still followed, and is counted once while it is there
(sglang_obs_request_files_rejected_total{reason}). A link to another file of the directory is
read, through its real path opened with O_NOFOLLOW. The followed file is checked again at every
open and poll, so a link retargeted out of the directory is dropped unread.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Callable

from sglang_obs.core.safe_files import (
    SYMLINK_OUTSIDE,
    Refused,
    not_regular,
    open_within,
    resolve_within,
)
from sglang_obs.exporter.log_follow import FileFollower, stat_problem
from sglang_obs.exporter.request_records import MAX_RECORD_BYTES, RecordReader, RequestStats

log = logging.getLogger(__name__)

FILE_NAME = re.compile(r"sglang-request-metrics-[0-9]{8}_[0-9]{2}\.log")
RESCAN_SECONDS = 10.0
MAX_ENTRIES = 100_000


class _RecordFile(FileFollower):
    """One hourly file: FileFollower's reading, records instead of log lines, and only ever a
    file of the directory itself (`refused(name, reason)` is told when it is not)."""

    def __init__(self, directory: str, name: str, stats: RequestStats, at_end: bool,
                 refused: Callable[[str, str], None]):
        super().__init__(os.path.join(directory, name), stats, read_history=False)
        self._directory, self._name, self._refused = directory, name, refused
        self._lines = RecordReader(MAX_RECORD_BYTES)  # cuts records without their prompts
        self._at_end_on_open = at_end

    def _path_problem(self) -> tuple[os.stat_result | None, str | None]:
        """FileFollower's check, of the file's real path: a link out of the directory is a
        problem (never stat'ed through), as a missing file is."""
        try:
            return stat_problem(resolve_within(self._directory, self._name))
        except Refused as err:
            self._refused(self._name, err.reason)
            return None, str(err)

    def _open_fd(self) -> int:
        try:
            fd, _ = open_within(self._directory, self._name)
        except Refused as err:
            self._refused(self._name, err.reason)
            raise
        return fd

    def _set(self, up: bool, state: str) -> bool:
        if state != self.state:  # the directory source logs what matters to the operator
            log.debug("request records %s: %s", self.path, state)
        self.up, self.state = up, state
        return up

    def _feed(self, chunk: bytes) -> int:
        before = self._lines.too_long
        lines = self._lines.feed(chunk)
        if self._lines.too_long != before:
            self.stats.reject("too_long", self._lines.too_long - before)
        n = 0
        for line in lines:
            if line and not line.isspace():  # blank lines are not records (nor rejected)
                self.stats.feed_line(line)
                n += 1
        return n


class RequestRecordDir:
    """Follows one directory of hourly record files. `poll()` reads what was appended since.

    `up` is whether the directory can be listed; `state` says why; `rotations` counts new hourly
    files and truncations; `file` is the file being read (None before the first one)."""

    kind = "dir"

    def __init__(self, directory: str, stats: RequestStats, server: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self.directory = directory
        self.stats = stats
        self.server = server
        self.up = False
        self.state = "not polled yet"
        self.rotations = 0
        self._clock = clock
        self._current: _RecordFile | None = None
        self._mtime: int | None = None
        self._scanned_at = -1e18
        self._newest: str | None = None
        self._polled = False
        self._refused: dict[str, str] = {}  # name -> reason, of refused files still there
        if not stats.where:
            stats.where = directory

    @property
    def file(self) -> str | None:
        return self._current.path if self._current else None

    def _set(self, up: bool, state: str) -> None:
        """One log line per change of state: the directory and why, never a record."""
        if state != self.state:
            if up:
                log.info("request records %s: %s", self.directory, state)
            else:
                log.warning("request records %s: %s; sglang_obs_request_source_up is 0 until "
                            "it is a readable directory", self.directory, state)
        self.up, self.state = up, state

    def poll(self) -> int:
        """Read new records (bounded per poll, as FileFollower); how many lines were fed."""
        try:
            fed = self._poll()
        except OSError as err:
            self._mtime = None
            self._set(False, f"cannot list ({type(err).__name__})")
            fed = self._drain_current()
        self._polled = True
        return fed  # FileFollower.poll told the stats' listeners

    def _drain_current(self) -> int:
        return self._current.poll() if self._current is not None else 0

    def _poll(self) -> int:
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            self._mtime = None
            self._set(False, "no such directory")
            return self._drain_current()
        if not stat.S_ISDIR(st.st_mode):
            self._mtime = None
            self._set(False, "not a directory")
            return self._drain_current()
        now = self._clock()
        if st.st_mtime_ns != self._mtime or now - self._scanned_at >= RESCAN_SECONDS:
            newest = self._scan()
            if newest is False:
                return self._drain_current()
            self._newest, self._mtime, self._scanned_at = newest, st.st_mtime_ns, now
        self._set(True, "following" if self._newest else "no record file yet")
        fed = 0
        newest = self._newest
        if newest is None:
            return self._drain_current()
        path = os.path.join(self.directory, newest)
        if self._current is None:
            # The newest file at start has history: begin at its end. Any later one (the first
            # to appear in an empty directory, the next hour's) is read from its first line.
            self._current = self._record_file(newest, at_end=not self._polled)
        elif path != self._current.path and newest > os.path.basename(self._current.path):
            capped = self._current.capped_polls
            fed += self._current.poll()  # the old hour's last records first
            if self._current.capped_polls != capped:
                return fed  # more of the old file to read: the new one waits for the next poll
            self._current.close()
            self.rotations += 1
            self._current = self._record_file(newest, at_end=False)
        rotations = self._current.rotations
        fed += self._current.poll()
        self.rotations += self._current.rotations - rotations
        return fed

    def _record_file(self, name: str, at_end: bool) -> _RecordFile:
        return _RecordFile(self.directory, name, self.stats, at_end, self._refuse)

    def _refuse(self, name: str, reason: str) -> None:
        """Count a refused file once while it is there (a rescan or a poll sees it again)."""
        if self._refused.get(name) != reason:
            self._refused[name] = reason
            self.stats.reject_file(reason, os.path.join(self.directory, name))

    def _readable(self, entry: os.DirEntry) -> bool:
        """Whether a file named like a record file may be followed: a regular file, or a link to
        one in the directory itself. A refused one is counted (once); it is never opened."""
        name = entry.name
        try:
            if entry.is_symlink():
                if self._refused.get(name) == SYMLINK_OUTSIDE:
                    return False  # resolved once, refused while it is there
                mode = os.stat(resolve_within(self.directory, name)).st_mode
                if not stat.S_ISREG(mode):
                    raise not_regular(mode)
                return True
            if entry.is_file(follow_symlinks=False):
                return True
            raise not_regular(entry.stat(follow_symlinks=False).st_mode)
        except Refused as err:
            self._refuse(name, err.reason)
        except OSError:  # gone since it was listed, or a link to nothing
            pass
        return False

    def _scan(self) -> str | None | bool:
        """The newest readable hourly file's name (None if none); False (state set) if the
        directory cannot be listed."""
        newest, entries, still = None, 0, {}
        try:
            with os.scandir(self.directory) as it:
                for entry in it:
                    entries += 1
                    if entries > MAX_ENTRIES:
                        self._set(False, f"over {MAX_ENTRIES:,} entries: prune old hourly "
                                  "files (SGLang never deletes them)")
                        return False
                    name = entry.name
                    if not FILE_NAME.fullmatch(name):
                        continue
                    if self._readable(entry):
                        if newest is None or name > newest:
                            newest = name
                    elif name in self._refused:
                        still[name] = self._refused[name]
        except PermissionError:
            self._set(False, "cannot list (PermissionError)")
            return False
        self._refused = still  # a refused file that goes and comes back counts again
        return newest

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
