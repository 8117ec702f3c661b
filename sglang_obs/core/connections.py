"""Which connection an HTTP server drops when too many are open.

A client that opens connections and sends nothing, or a byte every few seconds (slowloris), must
not take the places a scraper or Alertmanager needs. The servers (the exporter's, the alert
sink's) read every request on one event loop, so a waiting connection costs a socket, not a
worker; they still cap how many are open, overall and per client address. At a cap the oldest
connection that has not finished sending its request head is closed to make room: a
well-behaved client sends its head at once, so it is the newest, never the oldest, one waiting.
Only when every open connection is past its head (being answered) is the newcomer refused.
"""

from __future__ import annotations

import itertools
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

FD_MARGIN = 64  # descriptors kept for everything else a process opens (files, polls, logs)


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft limit on open descriptors towards `wanted` + FD_MARGIN (never above the
    hard limit); returns how many connections fit under it now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < target:
        new = target if hard == resource.RLIM_INFINITY else min(target, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(min(wanted, soft - FD_MARGIN), 16)


@dataclass
class _Entry:
    peer: str
    close: Callable[[], None]
    waiting: bool = True  # still sending its request head


@dataclass
class ConnectionTable:
    """Open connections in arrival order. `admit` a new one (it may close older ones waiting for
    their head), `answering` once its head is read, `release` when it ends."""

    max_total: int
    max_per_client: int
    evicted: int = 0  # connections closed to make room
    refused: int = 0  # newcomers closed because nothing could make room
    _open: OrderedDict = field(default_factory=OrderedDict)
    _per_peer: dict = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def sized(cls, max_total: int, max_per_client: int) -> ConnectionTable:
        """A table of at most `max_total` connections (fewer when the descriptor limit cannot
        be raised that far) and `max_per_client` from one address."""
        fit = raise_fd_limit(max_total)
        return cls(fit, min(max_per_client, fit))

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, peer: str, close: Callable[[], None]) -> int | None:
        """A key for the new connection, or None when it must be closed (everything open is
        being answered)."""
        if self._per_peer.get(peer, 0) >= self.max_per_client and not self._evict(peer):
            self.refused += 1
            return None
        if len(self._open) >= self.max_total and not self._evict(None):
            self.refused += 1
            return None
        key = next(self._ids)
        self._open[key] = _Entry(peer, close)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return key

    def answering(self, key: int) -> None:
        entry = self._open.get(key)
        if entry is not None:
            entry.waiting = False

    def release(self, key: int) -> None:
        entry = self._open.pop(key, None)
        if entry is not None:
            left = self._per_peer[entry.peer] - 1
            if left:
                self._per_peer[entry.peer] = left
            else:
                del self._per_peer[entry.peer]

    def _evict(self, peer: str | None) -> bool:
        """Close the oldest connection still waiting for its head (of `peer`, or of anyone)."""
        for key, entry in self._open.items():
            if entry.waiting and (peer is None or entry.peer == peer):
                self.release(key)
                self.evicted += 1
                entry.close()
                return True
        return False
