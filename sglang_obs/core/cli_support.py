"""What the three commands (sglang-obs, sglang-sim, sglang-exporter) share on their command line.

Every error is one line on stderr, never a traceback, and names the argument and the file, folder
or URL it is about:

- exit 2, a usage error: the command line itself is wrong (an argument missing or unknown, a
  value of the wrong type or out of range), printed `PROG: error: MESSAGE` by OneLineParser
  (argparse's own usage block is left out: `--help` shows it);
- exit 1, a failure: the command line is well formed but the world disagrees (a file that does
  not exist or is a folder, an output that exists or cannot be written, a URL that does not
  answer, a port in use), printed `PROG: MESSAGE` from a Failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import urllib.parse
from pathlib import Path

from sglang_obs.core import shown

USAGE = 2
FAILURE = 1
MAX_LINE = 300  # characters of one error message, at most


def one_line(text: object, limit: int = MAX_LINE) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), cut to
    `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors: `PROG: error: MESSAGE` on stderr, exit 2. Its
    subparsers are of the same class (argparse makes them with the parent's class)."""

    hint = ""  # appended to every message, e.g. " (see --help)"

    def error(self, message):
        self.exit(USAGE, f"{self.prog}: error: {one_line(message)}{self.hint}\n")


class Failure(Exception):
    """A command that cannot do its job; str() is the one line printed after `PROG: `."""

    code = FAILURE

    def __init__(self, message: str):
        super().__init__(one_line(message))


class UsageError(Failure):
    """A value the parser could not check by itself (two arguments that contradict each other,
    a time it cannot read): exit 2."""

    code = USAGE


def report(prog: str, err: Failure) -> int:
    """Print `err` as PROG's one error line; its exit status."""
    kind = "error: " if err.code == USAGE else ""
    print(f"{prog}: {kind}{err}", file=sys.stderr)
    return err.code


def quiet_broken_pipe() -> int:
    """After stdout's reader went away (`| head`): no traceback at exit; status 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return FAILURE


def reason(err: OSError) -> str:
    """An OSError's reason without its errno, path or decoration: 'Permission denied'."""
    return os.strerror(err.errno) if err.errno else (err.strerror or type(err).__name__)


# -- argument types --------------------------------------------------------------------------
def http_url(text: str) -> str:
    """argparse type: an http(s) URL with a host and no credentials, query or fragment (the
    clients append their own paths and queries; a secret there would show in every message),
    without a trailing slash. A refused URL is shown through shown.url, without them."""
    try:
        shown.plain_url(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    try:
        parsed = urllib.parse.urlsplit(text)
        ok = parsed.scheme in ("http", "https") and bool(parsed.hostname)
    except ValueError:  # not even a URL ("http://[::1")
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {one_line(shown.url(text), 80)!r} "
                                         "(e.g. http://127.0.0.1:9090)")
    return text.rstrip("/")


def positive(kind: type = float, minimum: float = 0, inclusive: bool = False):
    """argparse type: a number of `kind` above `minimum` (or at least it, with `inclusive`)."""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(
                f"must be {'at least' if inclusive else 'more than'} {minimum:g}, got {text}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


# -- paths -----------------------------------------------------------------------------------
def input_file(flag: str, path: str | os.PathLike) -> Path:
    """`path` as a file to read, or a Failure naming `flag` and the path."""
    path = Path(path)
    what = f"{flag} {path}" if flag else str(path)
    if path.is_dir():
        raise Failure(f"{what}: is a directory, not a file")
    if not path.exists():
        raise Failure(f"{what}: no such file")
    if not os.access(path, os.R_OK):
        raise Failure(f"{what}: cannot read it (permission denied)")
    return path


def output_file(flag: str, path: str | os.PathLike) -> Path:
    """`path` as a file to (over)write: not a folder, in a folder that exists. A Failure
    naming `flag` and the path otherwise."""
    path = Path(path)
    if path.is_dir():
        raise Failure(f"{flag} {path}: is a directory; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise Failure(f"{flag} {path}: {parent} is not a directory" if parent.exists()
                      else f"{flag} {path}: directory {parent} does not exist")
    return path


def new_folder(flag: str, path: str | os.PathLike) -> tuple[Path, bool]:
    """`path` as the folder a command writes its outputs into: created now when missing (with
    its parents); an existing one must be a folder and empty, so that no output of an earlier
    run is mixed in or overwritten. (path, created) or a Failure naming `flag`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise Failure(f"{flag} {path}: is a file, not a directory")
    if path.is_dir():
        if any(path.iterdir()):
            raise Failure(f"{flag} {path}: already exists and is not empty; give a new directory")
        return path, False
    try:
        path.mkdir(parents=True)
    except OSError as err:
        raise Failure(f"{flag} {path}: cannot create the directory ({reason(err)})") from None
    return path, True


def restore_folder(path: Path | None, created: bool) -> None:
    """Leave a new_folder() as the command found it after a failure: gone if the command made
    it, else empty again."""
    if path is None:
        return
    if created:
        shutil.rmtree(path, ignore_errors=True)
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def folder(flag: str, path: str | os.PathLike) -> Path:
    """`path` as a folder to write into, created when missing; a Failure naming `flag`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise Failure(f"{flag} {path}: is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise Failure(f"{flag} {path}: cannot create the directory ({reason(err)})") from None
    if not os.access(path, os.W_OK):
        raise Failure(f"{flag} {path}: cannot write into it (permission denied)")
    return path
