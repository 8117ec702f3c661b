"""Drives a Server through a Scenario: arrivals, faults, and the GPU state they imply.

`advance(t)` moves simulated time forward; the HTTP server calls it with wall time (times a
speed factor), `sglang-sim render` with a fixed step, faster than real time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_obs.simulator.model import Histogram, Request, Server
from sglang_obs.simulator.profiles import (
    ITL_BUCKETS,
    PER_STAGE_BUCKETS,
    TOKEN_BUCKETS,
    Profile,
    profile,
)
from sglang_obs.simulator.scenario import Fault, Scenario


@dataclass(frozen=True)
class GpuReading:
    """What NVML would report for one GPU (base units)."""

    index: int
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    power_limit_watts: float
    energy_joules: float
    temperature_celsius: float
    sm_clock_hertz: float
    sm_clock_max_hertz: float
    thermal_throttle: bool
    xid_events: tuple[tuple[float, int], ...]  # (unix time, xid)
    lost: bool = False  # fallen off the bus: NVML answers GpuIsLost for it


# Each simulated GPU's power: idle with nothing to do, the limit when busy all the time, linear
# between (a thermal slowdown draws 70 % of the way).
GPU_IDLE_POWER_W = 60.0
GPU_POWER_LIMIT_W = 275.0


class Looping:
    """A timeline that repeats when served with --loop: each round has the same shape and new
    random draws. The class keeps `scenario`, `loop` and `_round`; `_next_round(offset)` queues
    the round that starts at `offset` seconds."""

    def _maybe_loop(self, until: float) -> None:
        duration = self.scenario.duration
        if not self.loop or until < (self._round + 1) * duration:
            return
        self._round += 1
        self._next_round(self._round * duration)

    def _next_round(self, offset: float) -> None:
        raise NotImplementedError


class Simulation(Looping):
    def __init__(self, scenario: Scenario, release: str | None = None, start_ts: float = 0.0,
                 on_event: Callable[[object], None] | None = None, loop: bool = False,
                 on_request: Callable[[Request, float], None] | None = None):
        self.scenario = scenario
        self.profile: Profile = profile(release or scenario.release)
        self.start_ts = start_ts
        self.loop = loop
        self.server = Server(
            scenario.server, scenario.perf, self._histogram,
            self.profile.decode_report_zeroes_cache_hit_rate, start_ts,
            on_event or (lambda e: None), warm_cache_ratio=scenario.warm_cache,
            on_request=on_request)
        self.t = 0.0
        self._round = 0
        self._arrivals = scenario.arrivals()
        self._next_arrival = 0
        self._faults: list[tuple[float, str, Fault]] = sorted(self._fault_actions(0.0),
                                                              key=lambda a: a[0])
        self._speed = 1.0
        self._xids: list[tuple[float, int, int]] = []  # (unix time, gpu, xid)
        self._lost: set[int] = set()  # GPUs off the bus
        self._gpu_sample = (0.0, 0.0)  # (sim time, busy seconds) at the last GPU reading
        self._energy = [0.0] * scenario.server.tp_size

    def _histogram(self, name: str) -> Histogram:
        p = self.profile
        bounds = {
            "ttft": p.ttft_buckets, "e2e": p.e2e_buckets, "itl": ITL_BUCKETS,
            "request_tpot": ITL_BUCKETS, "queue_time": p.queue_buckets,
            "per_stage": PER_STAGE_BUCKETS, "prompt_tokens": TOKEN_BUCKETS,
            "generation_tokens": TOKEN_BUCKETS, "uncached_prompt_tokens": TOKEN_BUCKETS,
        }[name]
        return Histogram(bounds)

    def _fault_actions(self, offset: float):
        for f in self.scenario.faults:
            if f.kind == "crash":
                yield (offset + f.at, "crash", f)
                yield (offset + f.at + f.downtime, "restart", f)
            elif f.kind == "gpu_slowdown":
                yield (offset + f.at, "slow", f)
                if f.duration is not None:
                    yield (offset + f.at + f.duration, "fast", f)
            elif f.kind == "xid":
                yield (offset + f.at, "xid", f)
            elif f.kind == "gpu_lost":
                yield (offset + f.at, "gpu_lost", f)

    @property
    def up(self) -> bool:
        return self.server.up

    def unix(self, t: float | None = None) -> float:
        return self.start_ts + (self.t if t is None else t)

    def advance(self, until: float) -> None:
        while True:
            self._maybe_loop(until)
            next_arrival = (self._arrivals[self._next_arrival].arrival
                            if self._next_arrival < len(self._arrivals) else float("inf"))
            next_fault = self._faults[0][0] if self._faults else float("inf")
            step_to = min(next_arrival, next_fault, until)
            if self.server.up:
                self.server.advance(step_to)
            else:
                self.server.now = step_to
            self.t = step_to
            if step_to >= until and next_arrival > until and next_fault > until:
                return
            if next_fault <= step_to:
                self._apply(*self._faults.pop(0)[1:])
            elif next_arrival <= step_to:
                self.server.submit(self._arrivals[self._next_arrival])
                self._next_arrival += 1

    def _next_round(self, offset: float) -> None:
        shifted = self.scenario.arrivals()
        for req in shifted:
            req.arrival += offset
            req.rid += self._round * 1_000_000
        self._arrivals = self._arrivals[self._next_arrival:] + shifted
        self._next_arrival = 0
        self._faults = sorted(self._faults + list(self._fault_actions(offset)),
                              key=lambda a: a[0])

    def _apply(self, action: str, fault: Fault) -> None:
        if action == "crash":
            self.server.crash()
        elif action == "restart":
            self.server.restart()
            self.server.set_speed(self._speed)
        elif action == "slow":
            self._speed = fault.factor
            self.server.set_speed(fault.factor)
        elif action == "fast":
            self._speed = 1.0
            self.server.set_speed(1.0)
        elif action == "xid":
            self._xids.append((self.unix(), fault.gpu, fault.xid))
        elif action == "gpu_lost":
            # Xid 79, and the TP group cannot go on without the rank: the process dies and, with
            # the GPU gone, cannot come back until the host is serviced.
            self._xids.append((self.unix(), fault.gpu, 79))
            self._lost.add(fault.gpu)
            self.server.crash()

    # -- GPU feed ------------------------------------------------------------------------
    def gpu_readings(self) -> list[GpuReading]:
        """NVML-like readings since the previous call (utilisation is averaged over it)."""
        cfg = self.scenario.server
        last_t, last_busy = self._gpu_sample
        busy = self.server.busy_seconds() if self.server.up else last_busy
        elapsed = self.t - last_t
        ranks = max(len(self.server.schedulers), 1)
        util = min(max((busy - last_busy) / (elapsed * ranks), 0.0), 1.0) if elapsed > 0 else 0.0
        self._gpu_sample = (self.t, busy)
        total = int(cfg.gpu_memory_total_gb * 1024**3)
        # SGLang preallocates weights, KV pool and CUDA graphs at start: "full" even when idle.
        used = int(total * (cfg.mem_fraction_static + 0.06)) if self.server.up else int(0.01 *
                                                                                      total)
        throttled = self._speed < 1.0
        limit = GPU_POWER_LIMIT_W
        power = GPU_IDLE_POWER_W + (limit - GPU_IDLE_POWER_W) * util * (0.7 if throttled else 1.0)
        readings = []
        for i in range(cfg.tp_size):
            self._energy[i] += power * elapsed
            readings.append(GpuReading(
                index=i, utilization_ratio=util, memory_used_bytes=used,
                memory_total_bytes=total, power_watts=power, power_limit_watts=limit,
                energy_joules=self._energy[i],
                temperature_celsius=(88.0 if throttled else 45.0 + 30.0 * util),
                sm_clock_hertz=(1.98e9 * (self._speed if throttled else 1.0)),
                sm_clock_max_hertz=2.52e9, thermal_throttle=throttled,
                xid_events=tuple((ts, x) for ts, g, x in self._xids if g == i),
                lost=i in self._lost))
        return readings
