"""Opening a file that a user names or that is found in a directory: never blocking, never
opening a device, never leaving the directory; and opening an output file without blocking.

`open()` of a FIFO nothing writes to blocks until a writer comes (forever), reading a device
(/dev/zero) never ends, and opening some devices does something (/dev/watchdog arms a timer).
So a file is stat'ed first and a FIFO, device, socket or directory refused unopened; then it is
opened O_NONBLOCK and the descriptor (not the path) checked with fstat, so that a file swapped
between the check and the open is seen and refused.

A file found in a directory (an hourly request-record file) must be in that directory: its path
is resolved (os.path.realpath) and must name a file directly in the directory's real path, and
that real path is opened with O_NOFOLLOW, so its last component cannot be swapped for a link in
between. A symbolic link to another file of the directory is read; a link out of it, or into a
subdirectory (which could be swapped for a link after the check), is refused unopened.

An output file (a CSV) is opened non-blocking too: a FIFO nothing reads from is refused at once
(open() for writing waits for a reader forever); a pipe something reads from (`>(gzip > x.gz)`)
and a device such as /dev/null are written to.
"""

from __future__ import annotations

import errno
import io
import os
import stat

OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
              | getattr(os, "O_CLOEXEC", 0))
# Why a file was refused; the text says it to a person.
NOT_REGULAR = "not_regular"
SYMLINK_OUTSIDE = "symlink_outside"
NO_WRITER = "no_writer"
NO_READER = "no_reader"
FIRST_READ_BYTES = 1024 * 1024


class Refused(Exception):
    """A file not opened (or closed again at once). `reason` is NOT_REGULAR, SYMLINK_OUTSIDE,
    NO_WRITER or NO_READER; str() says why in a few words, without the path."""

    def __init__(self, reason: str, text: str):
        super().__init__(text)
        self.reason = reason


def file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(mode: int) -> Refused:
    """The refusal of a file of this mode (FIFO, device, socket, directory)."""
    kind = file_type(mode)
    text = "not a regular file" + ("" if kind == "not a regular file" else f" ({kind})")
    return Refused(NOT_REGULAR, text)


def open_checked(path: str | os.PathLike, *, allow_fifo: bool = False,
                 follow: bool = True) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of `path` opened read-only and non-blocking: a regular file, or a
    FIFO when `allow_fifo`. Refused for anything else, before opening it when stat shows it and
    after when fstat does. With `follow` False a symbolic link as the last component is refused
    (SYMLINK_OUTSIDE) unfollowed. OSError (FileNotFoundError, PermissionError, ...) as os.open
    raises it."""

    def acceptable(mode: int) -> bool:
        return stat.S_ISREG(mode) or (allow_fifo and stat.S_ISFIFO(mode))

    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(SYMLINK_OUTSIDE, "a symbolic link to outside the directory")
    if not acceptable(st.st_mode):
        raise not_regular(st.st_mode)
    try:
        fd = os.open(path, OPEN_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:  # made a link since the lstat
            raise Refused(SYMLINK_OUTSIDE, "a symbolic link to outside the directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not acceptable(st.st_mode):  # what was opened is what counts
            raise not_regular(st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def resolve_within(directory: str | os.PathLike, name: str) -> str:
    """The real path of `directory`/`name`, which must be a file directly in the directory's real
    path; Refused (SYMLINK_OUTSIDE) otherwise. Nothing is opened."""
    real_dir = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(directory, name))
    if os.path.dirname(real) != real_dir or real == real_dir:
        raise Refused(SYMLINK_OUTSIDE, "a symbolic link to outside the directory")
    return real


def open_within(directory: str | os.PathLike, name: str) -> tuple[int, os.stat_result]:
    """open_checked of the file `name` found in `directory`, through its real path, which must be
    in the directory itself (resolve_within); the last component is opened with O_NOFOLLOW."""
    return open_checked(resolve_within(directory, name), follow=False)


class _Prefixed(io.RawIOBase):
    """A descriptor's bytes, after `prefix` (what a pipe's first read took); closes it."""

    def __init__(self, fd: int, prefix: bytes = b""):
        super().__init__()
        self._fd, self._prefix = fd, prefix

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return os.readv(self._fd, [buffer])

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def stream(fd: int, st: os.stat_result, buffer_size: int = io.DEFAULT_BUFFER_SIZE
           ) -> io.BufferedReader:
    """A reader of an open_checked descriptor (which it closes). A FIFO or pipe is read
    non-blocking once: data, or EAGAIN (a writer that has not written yet), is read on as `cat`
    reads, waiting for the writer; end of file at once (nothing writes to it, nothing was
    written) is Refused (NO_WRITER): open() of such a FIFO used to wait for a writer forever."""
    prefix = b""
    if stat.S_ISFIFO(st.st_mode):
        try:
            prefix = os.read(fd, FIRST_READ_BYTES)
        except BlockingIOError:
            pass
        except BaseException:
            os.close(fd)
            raise
        else:
            if not prefix:
                os.close(fd)
                raise Refused(NO_WRITER, "a FIFO or pipe that nothing writes to")
        os.set_blocking(fd, True)
    return io.BufferedReader(_Prefixed(fd, prefix), buffer_size)


def open_stream(path: str | os.PathLike, *, allow_pipe: bool = True,
                buffer_size: int = io.DEFAULT_BUFFER_SIZE) -> io.BufferedReader:
    """`path` named by a user, for reading to its end: a regular file or (`allow_pipe`) a pipe
    something writes to (`<(kubectl logs ...)`, `/dev/stdin`). Refused or OSError otherwise,
    without ever blocking in open()."""
    fd, st = open_checked(path, allow_fifo=allow_pipe)
    return stream(fd, st, buffer_size)


def read_input(path: str | os.PathLike, *, allow_pipe: bool = True) -> bytes:
    """The whole content of open_stream(path)."""
    with open_stream(path, allow_pipe=allow_pipe) as f:
        return f.read()


def open_output(path: str | os.PathLike, *, append: bool = False,
                regular: bool = False) -> io.TextIOWrapper:
    """`path` as a text file to (over)write, or to `append` to, CSV-ready (newline=""), created
    if missing: opened non-blocking, so a FIFO nothing reads from is Refused (NO_READER) at once;
    with `regular`, anything but a regular file (a FIFO with a reader, a device) is Refused
    (NOT_REGULAR) too; then written to blocking, as any file."""
    flags = (os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | os.O_NONBLOCK
             | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO without a reader
            raise Refused(NO_READER, "a FIFO that nothing reads from") from None
        raise
    mode = os.fstat(fd).st_mode
    if regular and not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(mode)
    os.set_blocking(fd, True)
    return open(fd, "a" if append else "w", newline="")  # the caller closes it
