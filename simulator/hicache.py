"""HiCache's host tier (`--enable-hierarchical-cache`), as token counts of one DP rank.

The device radix cache is the scheduler's evictable pool (simulator/model.py); this is the
host pool behind it. Under the default write-through policy every token the device cache takes
in is queued for a copy to host memory; the copies drain at the device-to-host bandwidth. A
device eviction turns a finished copy into a host-only entry (a later request can load it back
instead of computing it) and destroys a token whose copy was still queued: SGLang counts those
in `hicache_dropped_tokens_total{reason="write_through_unbacked_eviction"}`. Under write-back
the copy is made at eviction and fails only when the host pool has no room (`host_pressure`).
The host pool frees host-only entries (oldest first) to make room; copies of tokens still on
the device stay. Counts are kept as floats: the aggregate model shares evictions out over
tokens by their proportions, as the scheduler's evictable pool does.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HostTier:
    total: float  # host pool capacity in tokens (--hicache-ratio x the device pool)
    backup_tokens_per_s: float  # device-to-host copy throughput
    write_back: bool = False  # --hicache-write-policy write_back (default: write_through)
    copies: float = 0.0  # device-resident tokens with a finished host copy
    pending: float = 0.0  # device-resident tokens whose copy is queued (write-through)
    only: float = 0.0  # host-only tokens: evicted from the device, reusable by a load-back
    counters: dict[str, float] = field(default_factory=lambda: {
        "backup": 0.0, "load_back": 0.0, "evicted": 0.0, "load_back_seconds": 0.0,
        "dropped_write_through_unbacked_eviction": 0.0, "dropped_host_pressure": 0.0})

    @property
    def used(self) -> float:
        return self.copies + self.only

    def _room(self, wanted: float) -> float:
        """Free host room for `wanted` tokens, dropping host-only entries as needed."""
        short = self.copies + self.only + wanted - self.total
        if short > 0:
            self.only -= min(self.only, short)
        return max(min(wanted, self.total - self.copies - self.only), 0.0)

    def warm(self, tokens: float) -> None:
        """A warm device cache at start: its copies were made before the run."""
        self.copies = min(tokens, self.total)

    def insert(self, tokens: float) -> None:
        """Tokens the device cache takes in (a prefill's new tokens, a finished output)."""
        if not self.write_back:
            self.pending += tokens

    def drain(self, seconds: float) -> None:
        """Queued copies made over `seconds` of the copy engine's time."""
        if self.pending <= 0:
            return
        done = self._room(min(self.pending, self.backup_tokens_per_s * seconds))
        self.pending -= done
        self.copies += done
        self.counters["backup"] += done

    def evict(self, tokens: float, resident: float) -> None:
        """The device evicts `tokens` of the `resident` tokens it holds."""
        if tokens <= 0:
            return
        self.counters["evicted"] += tokens
        if self.write_back:
            saved = self._room(tokens)
            self.only += saved
            self.counters["backup"] += saved
            self.counters["dropped_host_pressure"] += tokens - saved
            return
        resident = max(resident, self.copies + self.pending, tokens)
        backed = tokens * self.copies / resident
        queued = tokens * self.pending / resident
        self.copies -= backed
        self.only += backed
        self.pending -= queued
        # Evicted before its copy finished (or never queued): gone from every tier.
        self.counters["dropped_write_through_unbacked_eviction"] += tokens - backed

    def release(self, resident: float) -> None:
        """Device tokens freed without an eviction (a retraction): copies of what is gone
        leave the host pool."""
        over = self.copies + self.pending - resident
        if over > 0:
            share = over / (self.copies + self.pending)
            self.copies -= self.copies * share
            self.pending -= self.pending * share

    def load_back(self, wanted: float, s_per_token: float) -> tuple[float, float]:
        """Up to `wanted` prefix tokens found in the host tier: (tokens, seconds to load)."""
        hit = min(wanted, self.only)
        if hit <= 0:
            return 0.0, 0.0
        self.only -= hit
        self.copies += hit  # back on the device, and still in host memory
        seconds = hit * s_per_token
        self.counters["load_back"] += hit
        self.counters["load_back_seconds"] += seconds
        return hit, seconds
