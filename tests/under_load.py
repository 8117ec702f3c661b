"""Run a command with every core kept busy: `python tests/under_load.py CMD...` (`make
test-under-load` runs the whole suite this way).

One busy-looping process per core, at the command's own priority, for as long as the command
runs: the clock-bound tests must hold their budgets on a machine that is not theirs alone.
Prints the load average before and after; exits with the command's status."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys


def _spin() -> None:
    while True:
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: under_load.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for hog in hogs:
        hog.start()
    print(f"under_load: {len(hogs)} busy processes; load average {os.getloadavg()}", flush=True)
    try:
        return subprocess.call(argv)
    finally:
        for hog in hogs:
            hog.kill()
        print(f"under_load: done; load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
