"""Which SGLang server a GPU process belongs to, by process tree, never by command line.

The server's HTTP port is listened on by its launch process; the scheduler processes that hold
the GPUs are its descendants. So: find the pid listening on the port (/proc/net/tcp*, socket
inodes in /proc/<pid>/fd), then walk a GPU process's parents. Needs the host's pid namespace
(compose: pid: host); where /proc is not readable every process is unmatched ("").
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class ProcessServers:
    def __init__(self, ports: dict[int, str], proc: Path = Path("/proc"), ttl: float = 30.0):
        self._ports = ports  # port -> server label
        self._proc = proc
        self._ttl = ttl
        self._listeners: dict[int, str] = {}  # pid -> server
        self._refreshed = 0.0

    def __call__(self, pid: int) -> str:
        if time.monotonic() - self._refreshed > self._ttl:
            self._listeners = self._find_listeners()
            self._refreshed = time.monotonic()
        seen = set()
        while pid > 1 and pid not in seen:
            if pid in self._listeners:
                return self._listeners[pid]
            seen.add(pid)
            pid = self._parent(pid)
        return ""

    def _parent(self, pid: int) -> int:
        try:
            stat = (self._proc / str(pid) / "stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def _find_listeners(self) -> dict[int, str]:
        inodes: dict[str, str] = {}
        for table in ("tcp", "tcp6"):
            try:
                lines = (self._proc / "net" / table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) > 9 and parts[3] == LISTEN:
                    port = int(parts[1].rsplit(":", 1)[1], 16)
                    if port in self._ports:
                        inodes[parts[9]] = self._ports[port]
        found: dict[int, str] = {}
        if not inodes:
            return found
        for entry in os.scandir(self._proc) if self._proc.is_dir() else ():
            if not entry.name.isdigit():
                continue
            try:
                for fd in os.scandir(Path(entry.path) / "fd"):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        found[int(entry.name)] = inodes[target[8:-1]]
                        break
            except OSError:
                continue
        return found
