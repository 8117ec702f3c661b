"""How many servers each pool needs: the replica recommendation (docs/scaling.md).

Names first: the recording rules (sglang_obs/render/scaling_rules.py), the KEDA ScaledObject
and HPA objects (deploy/kubernetes), the dashboards, `sglang-obs capacity` and the simulator's
autoscaled replay read these constants, never a typed copy.

Every pool record is per (cluster, pool): pool is "unified" for servers that are not
disaggregated, else the PD role ("prefill", "decode") as the PD records name it.

The policy, in words (the PromQL in scaling_rules.py and `Recommender` below are its two
spellings; tests/test_scaling.py holds them equal, step by step, on the simulator's ramp):
- A server's load is its busiest leading signal over that signal's target: requests in the
  server (running + waiting) over max_running_requests, the KV pool's occupancy, and the
  prefill backlog over classification.prefill_backlog_tokens. 1 is a server at its target;
  a queue makes it grow without bound, so a saturated pool asks for enough servers at once.
- The pool's load (LOAD) is the sum over its servers of each one's mean over LOAD_WINDOW.
- DESIRED is LOAD rounded up, between scaling.min_replicas and scaling.max_replicas.
- RECOMMENDED follows DESIRED up at once. It goes down one server at a time, and only when
  LOAD stayed at or below scale_down_fill_ratio of one server fewer for all of
  scaling.scale_down_window and it has not changed within that window: a ramp-down changes it
  at most once per window, and a dip never. The margin is there because the signals grow
  faster than the traffic near a server's limit (a batch that fills slows every request in
  it, so each stays longer): a pool's load read on N servers understates what N - 1 carry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

BY = "cluster, pool"
POOLS = ("unified", "prefill", "decode")
POOL_INFO = "instance:sglang_pool:info"  # each server's pool, as a label
INSTANCE_LOAD = "instance:sglang_load_server_equivalents:max"  # one server's load, now
SERVERS = "pool:sglang_replicas:count"  # servers of the pool that answer
LOAD = "pool:sglang_load_server_equivalents:avg2m"  # the pool's load, in servers at target
DESIRED = "pool:sglang_replicas:desired"  # ceil(LOAD), within min and max replicas
RECOMMENDED = "pool:sglang_replicas:recommended"  # DESIRED with hysteresis: what to run
LOAD_WINDOW_S = 120  # LOAD's averaging window (the "2m" of its name)


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


@dataclass(frozen=True)
class Policy:
    running_target_ratio: float
    kv_target_ratio: float
    backlog_target_ratio: float
    scale_down_fill_ratio: float
    backlog_tokens: float  # classification.prefill_backlog_tokens
    scale_down_window_s: float
    scale_down_window: str
    min_replicas: int
    max_replicas: int

    @classmethod
    def from_thresholds(cls, t: Mapping) -> Policy:
        s = t["scaling"]
        return cls(float(s["running_target_ratio"]), float(s["kv_target_ratio"]),
                   float(s["backlog_target_ratio"]), float(s["scale_down_fill_ratio"]),
                   float(t["classification"]["prefill_backlog_tokens"]),
                   _seconds(str(s["scale_down_window"])), str(s["scale_down_window"]),
                   int(s["min_replicas"]), int(s["max_replicas"]))

    def server_load(self, running: float | None, waiting: float | None,
                    max_running: float | None, kv_occupancy: float | None,
                    backlog_tokens: float | None) -> float | None:
        """One server's load now (INSTANCE_LOAD): its busiest signal over its target. A signal
        whose series is missing is left out, as PromQL leaves it out; None without any."""
        signals = []
        if None not in (running, waiting, max_running) and max_running > 0:
            signals.append((running + waiting) / max_running / self.running_target_ratio)
        if kv_occupancy is not None:
            signals.append(kv_occupancy / self.kv_target_ratio)
        if backlog_tokens is not None:
            signals.append(backlog_tokens / (self.backlog_tokens * self.backlog_target_ratio))
        return max(signals) if signals else None

    def desired(self, load: float) -> int:
        return int(min(max(math.ceil(load), self.min_replicas), self.max_replicas))


class Recommender:
    """The policy evaluated in Python, one pool, one call per rule evaluation, with Prometheus
    2.x's window semantics (a range [t - w, t] holds the samples at both ends): the simulator's
    autoscaled replay applies it in the loop, where no Prometheus can run."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._loads: dict[str, deque[tuple[float, float]]] = {}
        self._pool_loads: deque[tuple[float, float]] = deque()
        self._recommended: deque[tuple[float, int]] = deque()
        self.load = 0.0
        self.desired = 0
        self.recommended: int | None = None

    @staticmethod
    def _trim(window: deque, since: float) -> None:
        while window and window[0][0] < since:
            window.popleft()

    def step(self, t: float, server_loads: Mapping[str, float]) -> int:
        """The recommendation at `t` from each answering server's load now."""
        p = self.policy
        # A server counts while it is in the pool now (its pool label is there), with the mean
        # of its loads over the window; a server that left is forgotten.
        for instance in set(self._loads) - set(server_loads):
            del self._loads[instance]
        total = 0.0
        for instance, value in server_loads.items():
            window = self._loads.setdefault(instance, deque())
            window.append((t, value))
            self._trim(window, t - LOAD_WINDOW_S)
            total += sum(v for _, v in window) / len(window)
        self.load = total
        self.desired = p.desired(total)
        self._pool_loads.append((t, total))
        self._trim(self._pool_loads, t - p.scale_down_window_s)
        previous = self.recommended
        self._trim(self._recommended, t - p.scale_down_window_s)
        if previous is None or self.desired > previous:
            rec = self.desired
        elif (max(v for _, v in self._pool_loads) <= (previous - 1) * p.scale_down_fill_ratio
              and all(r == previous for _, r in self._recommended)):
            rec = previous - 1
        else:
            rec = previous
        self._recommended.append((t, rec))
        self.recommended = rec
        return rec
