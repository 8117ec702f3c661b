"""The glance page's model: each server's state in plain words, from the poller's snapshots.

Fed by the poller after every poll cycle (`ServerTracker.observe`, in the poll thread) and read
by the HTTP worker that serves `/` or `/api/v1/status` (`StatusBoard.status`): nothing here runs
on the /metrics scrape path, and nothing is written to disk.

**One classification.** The verdict is the recording rules' `instance:sglang_state:code`
(sglang_obs/render/rules.py `state_classes`): the same thresholds, read as data from the
`classification:` section of prometheus/thresholds.yml, and the same conditions in the same
priority order — unavailable, kv_capacity, prefill_backlog, decode_contention,
scheduling_bottleneck, idle, healthy. A value the exporter does not have makes its condition
false, as an absent series does in PromQL. The rules' two 1 h baselines (the p90 of decode speed
per request, the average running batch) are kept here as Prometheus keeps the recorded series:
one sample every evaluation interval (prometheus.yml's, passed in), an hour of them,
the current value included. Retractions within kv_retraction_window are the rules' `increase()`
over SGLang's counter, including its first appearance with a value (a series born counting).
tests/test_status_agreement.py checks the verdict against promtool's evaluation of the shipped
rules over every simulated scenario. Prefill/decode servers are also grouped into their pools
(`pool_statuses`), each with one of core/states.py's PD states over the pool's sums.

**Bounded memory.** Per server three fixed-size rings of floats (`array('d')`): the baseline
(241 samples × 3), the 30-minute trend (180 slots of TREND_SLOT seconds × 10 fields) and the last
minute at poll resolution. bench/bench_status_page.py measures the bytes per server.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from sglang_obs import __version__
from sglang_obs.core import config_dir, quantities, shown
from sglang_obs.core import settings as stack_settings
from sglang_obs.core.shown import count, percent, seconds, speed
from sglang_obs.core.states import (
    PD_POOLS,
    PD_PRIORITY,
    PD_STATE_COLOURS,
    PD_STATE_POOL,
    PD_STATES,
    STATE_COLOURS,
    STATES,
)
from sglang_obs.exporter.poller import Snapshot

log = logging.getLogger(__name__)

BASELINE_WINDOW = 3600.0  # the rules' [1h]
TREND_WINDOW = 1800.0  # the sparklines: the last 30 minutes
TREND_SLOT = quantities.SPARK_SLOT_SECONDS  # seconds per sparkline point (180 points)
MINUTE = 60.0  # "in the last minute"
# The reading patterns' GPU thresholds (seed 000 §8); the page's own, not the rules'.
GPU_BUSY_RATIO = 0.8
GPU_IDLE_RATIO = 0.1
GPU_MEMORY_FULL_RATIO = 0.8

# The tokenizer's counters: every supported release defines them (a test reads the conformance
# goldens), labelled, so prometheus_client creates each at its first request. A server that
# answers without them has finished none yet: they read 0, not "not reported".
COUNTED_FROM_FIRST_REQUEST = ("num_requests_total", "prompt_tokens_total",
                              "generation_tokens_total", "cached_tokens_total")

STATE_LABELS = {"unavailable": "Unavailable", "idle": "Idle", "healthy": "Healthy",
                "prefill_backlog": "Prefill backlog", "decode_contention": "Decode contention",
                "kv_capacity": "KV capacity", "scheduling_bottleneck": "Scheduling bottleneck"}
# The reading patterns: seed 000's four ways of reading the signals together, and one per
# classification branch the seed did not name (a batch grown past its usual size; a full KV
# pool), each with the state it points to. The page shows only those that point to its verdict
# (`readings`), so the badge and the readings cannot disagree. None: a pattern of a quiet server.
READINGS = {
    "gpu_busy_backlog_growing": ("prefill_backlog", "GPU utilisation high and prompt tokens "
                                 "waiting for prefill growing: input compute backlog."),
    "backlog_with_queue": ("prefill_backlog", "Prompt tokens waiting for prefill above the "
                           "threshold while requests queue: input compute backlog."),
    "queue_growing_kv_low": ("scheduling_bottleneck", "Queue growing while the KV cache is not "
                             "full: a compute or scheduling limit, not capacity exhausted."),
    "running_at_limit_speed_falling": ("decode_contention", "Running at the limit and generation "
                                       "speed falling: decode contention."),
    "batch_grown_speed_falling": ("decode_contention", "Running batch of long requests well "
                                  "past its usual size and generation speed falling: decode "
                                  "contention."),
    "kv_full": ("kv_capacity", "KV cache at its limit, or requests retracted: capacity "
                "exhausted."),
    "memory_full_gpu_idle": (None, "GPU memory full but GPU idle: static preallocation "
                             "(weights, KV pool, CUDA graphs), not load."),
}
QUIET_STATES = ("idle", "healthy")  # the states a pattern pointing to None may accompany


# -- the thresholds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Classification:
    """prometheus/thresholds.yml `classification:`, the numbers the rules were generated from."""

    prefill_backlog_tokens: float
    kv_occupancy_ratio: float
    decode_speed_collapse_ratio: float
    decode_speed_drop_ratio: float
    min_kv_for_contention: float
    min_kv_tokens_per_running_request: float
    running_ratio_at_limit: float
    running_growth_factor: float
    min_running_for_contention: float
    scheduling_queue_seconds: float
    scheduling_kv_ratio_below: float
    kv_retraction_window: float  # seconds; the file gives a duration ("1m")
    min_prealloc_queue_requests: float  # from the file's pd: section
    # from its features: section: when a feature is the reason a healthy server is slow
    spec_collapse_accept_length: float
    spec_min_verify_rps: float
    hicache_drop_ratio: float
    hicache_min_evicted_tps: float
    priority_starvation_ratio: float


# Classification's fields that the thresholds file keeps in other sections than
# classification:, by section.
OTHER_FIELDS = {"min_prealloc_queue_requests": "pd", "spec_collapse_accept_length": "features",
                "spec_min_verify_rps": "features", "hicache_drop_ratio": "features",
                "hicache_min_evicted_tps": "features", "priority_starvation_ratio": "features"}


class ThresholdsError(ValueError):
    """The thresholds file is unreadable or its classification: section is incomplete."""


def default_thresholds_file() -> Path:
    """The thresholds.yml the shipped rules come from: $SGLANG_OBS_CONFIG_DIR, else the
    checkout's, else the copy installed with the package (sglang_obs/core/config_dir.py)."""
    return config_dir.resolve() / stack_settings.THRESHOLDS_FILE


def load_classification(path: str | Path | None = None) -> Classification:
    path = Path(path) if path else default_thresholds_file()
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ThresholdsError(f"{path}: cannot read it ({err})") from None
    section = doc.get("classification") if isinstance(doc, dict) else None
    if not isinstance(section, dict):
        raise ThresholdsError(f"{path}: no classification: section")
    others = {}
    for name in sorted(set(OTHER_FIELDS.values())):
        others[name] = doc.get(name)
        if not isinstance(others[name], dict):
            raise ThresholdsError(f"{path}: no {name}: section")
    names = [f.name for f in fields(Classification) if f.name not in OTHER_FIELDS]
    missing = [f"classification.{n}" for n in names if n not in section]
    missing += [f"{sec}.{n}" for n, sec in OTHER_FIELDS.items() if n not in others[sec]]
    if missing:
        raise ThresholdsError(f"{path}: lacks {', '.join(missing)}")
    unknown = sorted(str(k) for k in section if k not in names)
    if unknown:
        log.warning("%s: classification: %s unknown to this exporter; the glance page's "
                    "verdict may differ from the rules'", path, ", ".join(unknown))
    values = {}
    for name in names + list(OTHER_FIELDS):
        section_name = OTHER_FIELDS.get(name, "classification")
        value = others[section_name][name] if name in OTHER_FIELDS else section[name]
        if name == "kv_retraction_window":
            value = _duration_seconds(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ThresholdsError(f"{path}: {section_name}.{name} is not a number")
        values[name] = float(value)
    return Classification(**values)


def _duration_seconds(value: object) -> float:
    """A Prometheus duration such as "1m" or "90s" (the rules' range) in seconds; NaN if not."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = str(value)
    if len(text) > 1 and text[-1] in units and text[:-1].isdigit():
        return float(int(text[:-1]) * units[text[-1]])
    return math.nan


# -- the classification --------------------------------------------------------------------------
@dataclass(frozen=True)
class Signals:
    """What the state classification reads, named after the recording rules' series; None where
    the series would be absent."""

    available: bool
    kv_occupancy: float | None = None  # instance:sglang_kv_occupancy:ratio
    retracted_recently: bool = False  # instance:sglang_retractions:increase<window> > 0
    prefill_backlog: float | None = None  # instance:sglang_prefill_backlog_tokens:max
    waiting: float | None = None  # instance:sglang_waiting_requests:max
    running: float | None = None  # instance:sglang_running_requests:max
    kv_used: float | None = None  # instance:sglang_kv_used_tokens:max
    running_ratio: float | None = None  # instance:sglang_running_requests_per_max:ratio
    speed: float | None = None  # instance:sglang_decode_speed_per_request:max
    speed_p90_1h: float | None = None  # instance:sglang_decode_speed_per_request:p90_1h
    running_avg_1h: float | None = None  # instance:sglang_running_requests:avg_1h
    queue_seconds: float | None = None  # instance:sglang_queue_nonempty_duration_seconds:max


def _ge(a, b) -> bool:
    return a is not None and b is not None and a >= b


def _lt(a, b) -> bool:
    return a is not None and b is not None and a < b


def _times(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value


def decode_branches(s: Signals, c: Classification) -> tuple[bool, bool]:
    """(collapse at the limit, drop with a grown batch of long requests): the two halves of
    decode contention."""
    collapse = (_lt(s.speed, _times(c.decode_speed_collapse_ratio, s.speed_p90_1h))
                and _ge(s.running_ratio, c.running_ratio_at_limit))
    drop = (_lt(s.speed, _times(c.decode_speed_drop_ratio, s.speed_p90_1h))
            and _ge(s.running, c.min_running_for_contention)
            and _ge(s.running, _times(c.running_growth_factor, s.running_avg_1h))
            and _ge(s.kv_used, _times(c.min_kv_tokens_per_running_request, s.running)))
    return collapse, drop


# The order classify() tries the states in: rules.py state_classes(), a test checks it.
PRIORITY = ("unavailable", "kv_capacity", "prefill_backlog", "decode_contention",
            "scheduling_bottleneck", "idle", "healthy")


def conditions(s: Signals, c: Classification) -> dict[str, bool]:
    """Each state's condition, as the rules' state_classes() write it."""
    collapse, drop = decode_branches(s, c)
    return {
        "unavailable": not s.available,
        "kv_capacity": _ge(s.kv_occupancy, c.kv_occupancy_ratio) or s.retracted_recently,
        "prefill_backlog": (_ge(s.prefill_backlog, c.prefill_backlog_tokens)
                            and _lt(0, s.waiting)
                            and not _ge(s.running_ratio, c.running_ratio_at_limit)),
        "decode_contention": (collapse or drop) and _ge(s.kv_occupancy, c.min_kv_for_contention),
        "scheduling_bottleneck": (_ge(s.queue_seconds, c.scheduling_queue_seconds)
                                  and _lt(s.kv_occupancy, c.scheduling_kv_ratio_below)),
        "idle": s.running == 0 and s.waiting == 0,
        "healthy": True,
    }


def classify(s: Signals, c: Classification) -> str:
    """The first state whose condition holds, in the rules' priority order (PRIORITY)."""
    held = conditions(s, c)
    return next(state for state in PRIORITY if held[state])


def quantile(q: float, values: Sequence[float]) -> float | None:
    """Prometheus's quantile_over_time: linear between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = max(int(math.floor(rank)), 0)
    high = min(low + 1, len(ordered) - 1)
    weight = rank - math.floor(rank)
    return ordered[low] * (1 - weight) + ordered[high] * weight


# -- fixed-size history ----------------------------------------------------------------------------
_NAN = float("nan")


class Ring:
    """At most `capacity` slots of floats, the oldest overwritten. A sample goes to the slot
    floor(t / slot) (every sample its own slot when slot is 0); one that falls into the newest
    slot merges into it by its field's rule: "first" keeps the slot's first value (an instant
    sample, as a rule evaluation takes), "last" the newest, "max" the largest. NaN is absent."""

    __slots__ = ("fields", "_merge", "_slot", "_keys", "_cols", "_next", "_len", "_capacity")

    def __init__(self, fields_merge: Mapping[str, str], capacity: int, slot: float):
        self.fields = tuple(fields_merge)
        self._merge = tuple(fields_merge[f] for f in self.fields)
        self._slot = slot
        self._capacity = capacity
        self._keys = array("d", [_NAN]) * capacity  # slot number of each entry
        self._cols = tuple(array("d", [_NAN]) * capacity for _ in self.fields)
        self._next = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def offer(self, t: float, values: Mapping[str, float | None]) -> None:
        key = math.floor(t / self._slot) if self._slot > 0 else None
        newest = (self._next - 1) % self._capacity
        if key is not None and self._len and self._keys[newest] == key:
            for col, field, merge in zip(self._cols, self.fields, self._merge, strict=True):
                value = values.get(field)
                if value is None or merge == "first":  # "first": absent is a value too
                    continue
                old = col[newest]
                if merge == "last" or math.isnan(old) or (merge == "max" and value > old):
                    col[newest] = value
            return
        i = self._next
        self._keys[i] = key if key is not None else t
        for col, field in zip(self._cols, self.fields, strict=True):
            value = values.get(field)
            col[i] = _NAN if value is None else value
        self._next = (i + 1) % self._capacity
        self._len = min(self._len + 1, self._capacity)

    def columns(self) -> tuple[list[float], dict[str, list[float | None]]]:
        """(slot numbers, or times when slot is 0; field -> values), oldest first, None for
        absent."""
        start = (self._next - self._len) % self._capacity
        order = [(start + k) % self._capacity for k in range(self._len)]
        keys = [self._keys[i] for i in order]
        cols = {}
        for field, col in zip(self.fields, self._cols, strict=True):
            values = [col[i] for i in order]
            cols[field] = [None if v != v else v for v in values]  # NaN is absent
        return keys, cols

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self._keys, *self._cols))


# -- per server ------------------------------------------------------------------------------------
_TREND_FIELDS = {"t": "last", "requests": "last", "inflight": "last", "ttft_sum": "last",
                 "ttft_count": "last", "waiting": "max", "running": "max", "backlog": "max",
                 "kv": "max", "speed": "last"}


class ServerTracker:
    """One server's history, fed after every poll cycle; `status()` reads it on request."""

    def __init__(self, server: str, classification: Classification, poll_interval: float = 1.0,
                 current: Callable[[], Snapshot] | None = None,
                 wall_clock: Callable[[], float] = time.time, *, baseline_step: float,
                 energy: Callable[[], float | None] | None = None):
        self.server = server
        # () -> the joules its GPUs' energy counters hold now (None without NVML's counter)
        self._energy = energy
        self.classification = classification
        self._current = current  # the poller's latest snapshot (a log line may refresh it)
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._baseline = Ring({"speed": "first", "running": "first", "t": "first"},
                              int(BASELINE_WINDOW / baseline_step) + 1, baseline_step)
        self._trend = Ring(_TREND_FIELDS, int(TREND_WINDOW / TREND_SLOT), TREND_SLOT)
        self._minute = Ring({"requests": "last", "inflight": "last", "backlog": "last",
                             "energy": "last", **dict.fromkeys(FEATURE_COUNTERS, "last")},
                            int(math.ceil(MINUTE / max(poll_interval, 0.05))) + 3, 0.0)
        self._last: tuple[float, float, Snapshot] | None = None  # (t, wall time, snapshot)
        self._prev_t: float | None = None
        self._retracted: float | None = None
        self._retraction_at: float | None = None  # time of the poll before the last rise
        self._up_polls = 0
        self._errors: dict[tuple[str, str], int] = {}
        self._reasons: tuple[str, ...] = ()  # why the last poll failed
        self._last_up_wall: float | None = None

    # -- the poll thread ---------------------------------------------------------------------
    def observe(self, t: float, snap: Snapshot) -> None:
        """After a poll cycle that started at `t` (the poller's monotonic clock)."""
        with self._lock:
            wall = self._wall()
            self._reasons = () if snap.up else tuple(sorted(
                {reason for key, n in snap.errors.items() if n > self._errors.get(key, 0)
                 for reason in (key[1],)}))
            self._errors = dict(snap.errors)
            self._last = (t, wall, snap)
            if not snap.up or snap.derived is None:
                self._prev_t = t
                return
            self._last_up_wall = wall
            d, nv = snap.derived, counted(snap.native_values)
            self._track_retractions(t, nv.get("num_retracted_requests_total"))
            self._up_polls += 1
            self._baseline.offer(t, {"speed": d.decode_speed_per_request,
                                     "running": d.running_requests, "t": t})
            inflight = (None if d.running_requests is None or d.waiting_requests is None
                        else d.running_requests + d.waiting_requests)
            requests = nv.get("num_requests_total")
            self._minute.offer(t, {"requests": requests, "inflight": inflight,
                                   "backlog": d.prefill_backlog_tokens,
                                   "energy": self._energy() if self._energy else None,
                                   **{k: nv.get(name) for k, name in FEATURE_COUNTERS.items()}})
            self._trend.offer(t, {
                "t": t, "requests": requests, "inflight": inflight,
                "ttft_sum": nv.get("time_to_first_token_seconds_sum"),
                "ttft_count": nv.get("time_to_first_token_seconds_count"),
                "waiting": d.waiting_requests, "running": d.running_requests,
                "backlog": d.prefill_backlog_tokens, "kv": d.kv_occupancy_ratio,
                "speed": d.decode_speed_per_request})
            self._prev_t = t

    def _track_retractions(self, t: float, value: float | None) -> None:
        """When the retraction counter last went up: a rise, a rise after a reset, or its first
        appearance with a value once the server had been seen without it (SGLang creates it at
        the first retraction, already counting it)."""
        before = self._prev_t if self._prev_t is not None else t
        if value is not None:
            old = self._retracted
            rose = old is not None and (value > old or 0 < value < old)  # a rise, a reset
            born = old is None and value > 0 and self._up_polls > 0
            if rose or born:
                self._retraction_at = before
        self._retracted = value

    def follow(self, current: Callable[[], Snapshot]) -> None:
        """Read the latest snapshot from `current` too (the poller's, which a scheduler-log line
        may refresh between polls)."""
        self._current = current

    def nbytes(self) -> int:
        """Bytes of the history rings (the part that grows with time, here bounded)."""
        return self._baseline.nbytes() + self._trend.nbytes() + self._minute.nbytes()

    # -- the HTTP worker ---------------------------------------------------------------------
    def signals(self) -> tuple[Signals, dict[str, Any]]:
        """The classification's inputs as of the last poll, and the other numbers the page shows
        (the baselines, the last minute, the trend rows)."""
        with self._lock:
            last = self._last
            _, baseline = self._baseline.columns()
            minute = self._minute.columns()
            trend = self._trend.columns()
            retraction_at = self._retraction_at
            reasons = self._reasons
            last_up_wall = self._last_up_wall
        extra: dict[str, Any] = {"trend": trend, "reasons": reasons, "last_up_wall": last_up_wall}
        if last is None:
            return Signals(available=False), {**extra, "t": None, "wall": None, "snapshot": None}
        t, wall, snap = last
        if self._current is not None:
            current = self._current()
            if current.polls == snap.polls:  # the same cycle, maybe refreshed from the log
                snap = current
        extra.update(t=t, wall=wall, snapshot=snap)
        d = snap.derived
        if not snap.up or d is None:
            return Signals(available=False), extra
        start = t - BASELINE_WINDOW
        times = baseline["t"]
        inside = [i for i, ts in enumerate(times) if ts is not None and ts >= start]
        speeds = [v for i in inside if (v := baseline["speed"][i]) is not None]
        runnings = [v for i in inside if (v := baseline["running"][i]) is not None]
        if not inside or times[inside[-1]] < t:  # the rules' window ends at the current value
            if d.decode_speed_per_request is not None:
                speeds.append(d.decode_speed_per_request)
            if d.running_requests is not None:
                runnings.append(d.running_requests)
        queue = (snap.queue_run.current_seconds
                 if snap.queue_run is not None and d.waiting_requests is not None else None)
        s = Signals(
            available=True,
            kv_occupancy=d.kv_occupancy_ratio,
            retracted_recently=(retraction_at is not None
                                and t - retraction_at <= self.classification.kv_retraction_window),
            prefill_backlog=d.prefill_backlog_tokens,
            waiting=d.waiting_requests,
            running=d.running_requests,
            kv_used=d.kv_used_tokens,
            running_ratio=d.running_requests_ratio,
            speed=d.decode_speed_per_request,
            speed_p90_1h=quantile(0.9, speeds),
            running_avg_1h=sum(runnings) / len(runnings) if runnings else None,
            queue_seconds=queue,
        )
        extra["minute"] = _minute_window(minute, t)
        return s, extra

    def verdict(self) -> str:
        return classify(self.signals()[0], self.classification)


def counted(native: Mapping[str, float]) -> Mapping[str, float]:
    """SGLang's values with the counters not created yet (COUNTED_FROM_FIRST_REQUEST) at 0."""
    if all(name in native for name in COUNTED_FROM_FIRST_REQUEST):
        return native
    return {**dict.fromkeys(COUNTED_FROM_FIRST_REQUEST, 0.0), **native}


# SGLang counters whose last-minute increases the page reads: tokens per verify step
# (speculative decoding) and the share of evicted device tokens HiCache dropped, as the rules'
# 1-minute ratios read them (render/feature_rules.py), and the tokens computed that its GPUs'
# energy is split over (energy_per_output_token).
FEATURE_COUNTERS = {"generated": "generation_tokens_total",
                    "prompt": "prompt_tokens_total", "cached": "cached_tokens_total",
                    "verifies": "spec_verify_calls_total",
                    "dropped": "hicache_dropped_tokens_total", "evicted": "evicted_tokens_total"}


def _increase(now: float | None, then: float | None) -> float | None:
    """A counter's increase; None where either end is missing or the counter began again."""
    if now is None or then is None or now < then:
        return None
    return now - then


def _minute_window(minute, t: float) -> dict[str, Any]:
    """Requests finished and received over the last minute (or since the first poll, when the
    exporter is younger), the prefill backlog a minute ago, and the feature counters'
    increases."""
    times, cols = minute
    if not times:
        return {}
    earlier = [i for i, ts in enumerate(times) if ts <= t - MINUTE]
    j = earlier[-1] if earlier else 0
    then_t = times[j]
    then = {field: values[j] for field, values in cols.items()}
    now = {field: values[-1] for field, values in cols.items()}
    out: dict[str, Any] = {"window_seconds": t - then_t, "backlog_then": then["backlog"]}
    if now["requests"] is not None and then["requests"] is not None:
        finished = now["requests"] - then["requests"]
        if finished < 0:  # the server restarted: its counter began again
            finished = now["requests"]
        out["finished"] = finished
        if now["inflight"] is not None and then["inflight"] is not None:
            out["received"] = max(finished + now["inflight"] - then["inflight"], 0.0)
    for field in (*FEATURE_COUNTERS, "energy"):
        out[field] = _increase(now[field], then[field])
    return out


def energy_per_output_token(minute: Mapping[str, Any]) -> float | None:
    """The energy records' J per output token (energy_rules.ENERGY_PER_TOKEN{mode="decode"})
    over the last minute: its GPUs' energy split between prefill and decode by the tokens each
    computed, decode's share over the output tokens, i.e. E / (computed prompt + output)."""
    energy, generated = minute.get("energy"), minute.get("generated")
    prompt, cached = minute.get("prompt"), minute.get("cached")
    if energy is None or generated is None or prompt is None or cached is None:
        return None
    computed = max(prompt - cached, 0.0) + generated
    return energy / computed if generated > 0 else None


# -- the board -------------------------------------------------------------------------------------
class StatusBoard:
    """Every server's tracker, and the GPUs; `status()` is the JSON model of the page."""

    def __init__(self, classification: Classification, poll_interval: float = 1.0,
                 gpus: Callable[[], Any] | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 baseline_step: float | None = None):
        self.classification = classification
        self.poll_interval = poll_interval
        # One recorded sample per evaluation interval, as the rules' baselines have.
        self.baseline_step = (baseline_step if baseline_step is not None
                              else stack_settings.default().evaluation_interval_s)
        self._gpus = gpus  # () -> exporter.nvml.NvmlReading, when the NVML collector runs
        self._wall = wall_clock
        self.trackers: list[ServerTracker] = []
        # Values the page's words hid (sglang_obs.core.shown), by reason: counted while the
        # status and its display are computed, exported as glance_values_hidden_total.
        self.hidden = shown.Tally()

    def add(self, server: str, current: Callable[[], Snapshot] | None = None) -> ServerTracker:
        tracker = ServerTracker(server, self.classification, self.poll_interval, current,
                                self._wall, baseline_step=self.baseline_step,
                                energy=lambda: self._energy_of(server))
        self.trackers.append(tracker)
        return tracker

    def set_gpus(self, gpus: Callable[[], Any] | None) -> None:
        self._gpus = gpus

    def _energy_of(self, server: str) -> float | None:
        """The joules the energy counters of `server`'s GPUs hold now, from the latest NVML
        reading: its GPUs by process (--collector.nvml.processes), else every GPU of the host
        when it runs this one server; None when that is unknown or a counter is missing."""
        reading = self._gpus() if self._gpus else None
        if reading is None or not reading.ok:
            return None
        if any(s for g in reading.gpus for s in g.process_memory):
            gpus = [g for g in reading.gpus if server in g.process_memory]
        else:
            gpus = reading.gpus if len(self.trackers) == 1 else []
        values = [g.values.get("energy_joules_total") if g.up else None for g in gpus]
        return sum(values) if values and None not in values else None

    def status(self) -> dict[str, Any]:
        with shown.counting(self.hidden):
            return self._status()

    def _status(self) -> dict[str, Any]:
        reading = self._gpus() if self._gpus else None
        host_gpus = [_gpu(g) for g in reading.gpus] if reading is not None and reading.ok else []
        attributed = any(g["servers"] for g in host_gpus)
        servers = []
        for tracker in self.trackers:
            if attributed:
                gpus = [g for g in host_gpus if tracker.server in g["servers"]]
            else:
                gpus = host_gpus if len(self.trackers) == 1 else []
            servers.append(server_status(tracker, gpus))
        return {
            "version": __version__,
            "generated_at": self._wall(),
            "poll_interval_seconds": self.poll_interval,
            "baseline_step_seconds": self.baseline_step,
            "trend_slot_seconds": TREND_SLOT,
            "states": list(STATES),
            "pd_states": list(PD_STATES),
            "host_gpus": host_gpus if not attributed and len(self.trackers) > 1 else [],
            "gpu_collector": reading is not None,
            "servers": servers,
            "pools": pool_statuses(servers, self.classification),
        }


def _gpu(g) -> dict[str, Any]:
    v = g.values if g.up else {}
    return {"index": g.index, "name": g.name, "up": g.up,
            "utilization_ratio": v.get("utilization_ratio"),
            "power_watts": v.get("power_watts"),
            "memory_used_bytes": v.get("memory_used_bytes"),
            "memory_total_bytes": v.get("memory_total_bytes"),
            "servers": sorted(s for s in g.process_memory if s)}


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def server_status(tracker: ServerTracker, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's part of /api/v1/status (docs/glance.md lists the fields)."""
    c = tracker.classification
    s, extra = tracker.signals()
    state = classify(s, c)
    snap: Snapshot | None = extra["snapshot"]
    d = snap.derived if snap is not None else None
    nv = counted(snap.native_values) if snap is not None and snap.up else {}
    by_priority = snap.native_by_priority if nv else {}
    minute = extra.get("minute", {})
    model = (d.model_name if d is not None else "") or (
        snap.config.model_name if snap is not None and snap.config is not None else "")

    prompt, generated = nv.get("prompt_tokens_total"), nv.get("generation_tokens_total")
    cached = nv.get("cached_tokens_total")
    ttft_sum, ttft_count = (nv.get("time_to_first_token_seconds_sum"),
                            nv.get("time_to_first_token_seconds_count"))
    e2e_sum, e2e_count = (nv.get("e2e_request_latency_seconds_sum"),
                          nv.get("e2e_request_latency_seconds_count"))
    queue_sum = nv.get("queue_time_seconds_sum")
    uncached = None if prompt is None or cached is None else max(prompt - cached, 0.0)
    prefill_time = None
    if ttft_sum is not None:
        prefill_time = ttft_sum - queue_sum if queue_sum is not None and queue_sum < ttft_sum \
            else ttft_sum
    decode_time = None if e2e_sum is None or ttft_sum is None else e2e_sum - ttft_sum
    resources = [nv[k] for k in ("num_grammar_queue_reqs", "num_paused_reqs",
                                 "num_prefill_bootstrap_queue_reqs",
                                 "num_decode_prealloc_queue_reqs",
                                 "num_decode_transfer_queue_reqs") if k in nv]
    collapse, drop = decode_branches(s, c)
    mode = (snap.config.disaggregation_mode.lower()
            if snap is not None and snap.config is not None else "")
    out: dict[str, Any] = {
        "server": tracker.server,
        "model_name": model,
        "role": mode if mode in PD_POOL_STATE else "",
        "pd_queues": dict(snap.pd.queues) if snap is not None and snap.up and snap.pd else {},
        "up": s.available,
        "as_of": extra["wall"],
        "last_up": extra["last_up_wall"],
        "polls": snap.polls if snap is not None else 0,
        "state": state,
        "state_code": STATES.index(state),
        "state_label": STATE_LABELS[state],
        "colour": STATE_COLOURS[state],
        "reason": "",
        "failing": list(extra["reasons"]),
        "pressure": {
            "running": s.running,
            "waiting": s.waiting,
            "max_running": d.max_running_requests if d is not None else None,
            "running_ratio": s.running_ratio,
            "received_last_minute": minute.get("received"),
            "finished_last_minute": minute.get("finished"),
            "minute_window_seconds": minute.get("window_seconds"),
            "queue_nonempty_seconds": s.queue_seconds,
            # why a queue waits with the KV pool free: the LoRA adapter pool, and the queue
            # and batch per priority (--enable-priority-scheduling); None / {} without them
            # structured requests waiting for their grammar (not in the waiting queue)
            "grammar_waiting": nv.get("num_grammar_queue_reqs"),
            "lora_slots_used": nv.get("lora_pool_slots_used"),
            "lora_slots_total": nv.get("lora_pool_slots_total"),
            "waiting_by_priority": dict(
                by_priority.get("num_queue_reqs", {})) if nv else {},
            "running_by_priority": dict(
                by_priority.get("num_running_reqs", {})) if nv else {},
        },
        "baseline": {
            "prompt_tokens": prompt,
            "generated_tokens": generated,
            "cached_tokens": cached,
            "total_tokens": None if prompt is None or generated is None else prompt + generated,
            "requests": nv.get("num_requests_total"),
            "prefill_tokens_per_second": _div(uncached, prefill_time),
            "prefill_time_includes_queueing": queue_sum is None,
            "generation_tokens_per_second": _div(generated, decode_time),
            "ttft_seconds": _div(ttft_sum, ttft_count),
            "request_seconds": _div(e2e_sum, e2e_count),
            "cache_hit_ratio": _div(cached, prompt),
        },
        "stages": {
            "waiting_to_start": s.waiting,
            "waiting_for_resources": sum(resources) if resources else None,
            "processing_input_tokens": s.prefill_backlog,
            "generating": s.running,
        },
        "tokens": {
            "kv_used": d.kv_used_tokens if d is not None else None,
            "kv_capacity": d.kv_capacity_tokens if d is not None else None,
            "kv_occupancy_ratio": s.kv_occupancy,
            "prefill_backlog": s.prefill_backlog,
        },
        "decode": {
            "speed_per_request": s.speed,
            "speed_p90_1h": s.speed_p90_1h,
            "running_avg_1h": s.running_avg_1h,
            "collapse": collapse,
            "drop": drop,
        },
        "features": feature_minute(minute),
        "retracted_recently": s.retracted_recently,
        "trends": trends(extra["trend"], extra["t"]),
        "gpus": gpus,
        "energy": {
            "power_watts": (sum(g["power_watts"] for g in gpus)
                            if gpus and all(g["power_watts"] is not None for g in gpus)
                            else None),
            "joules_per_output_token_last_minute": energy_per_output_token(minute),
            "output_tokens_last_minute": minute.get("generated"),
        },
        "patterns": [],
    }
    out["reason"] = reason(state, s, c, out)
    out["patterns"] = readings(state, s, c, gpus, minute)
    return out


# -- words -----------------------------------------------------------------------------------------
# Every number in them goes through sglang_obs.core.shown (count, percent, seconds, speed,
# shown.number): "—" for one that is not finite or out of its range, the reason counted.
def _times_text(value: float | None) -> str:
    """A factor such as 2.4 (the batch against its usual size); None reads 0."""
    return shown.number(0.0 if value is None else value, ".1f", "rate")


def reason(state: str, s: Signals, c: Classification, out: dict[str, Any]) -> str:
    """One sentence: why the server is in `state`, with the numbers that put it there."""
    p = out["pressure"]
    if state == "unavailable":
        why = ", ".join(r.replace("_", " ") for r in out["failing"])
        why = f" ({why})" if why else ""
        if out["last_up"] is None:
            return f"The exporter has had no answer from this server yet{why}."
        ago = (out["as_of"] or out["last_up"]) - out["last_up"]
        clock = time.strftime("%H:%M:%S", time.localtime(out["last_up"]))
        return (f"No answer from /metrics or the load endpoint since {clock} "
                f"({seconds(max(ago, 0.0))} ago){why}.")
    if state == "kv_capacity":
        if _ge(s.kv_occupancy, c.kv_occupancy_ratio):
            return (f"The KV cache is {percent(s.kv_occupancy)} full (the limit is "
                    f"{percent(c.kv_occupancy_ratio)}): new requests wait for memory and running "
                    "ones may be retracted.")
        return (f"Requests were retracted in the last "
                f"{shown.number(c.kv_retraction_window, '.0f', 'seconds')} s: the KV "
                "pool ran out during decode and their work is redone.")
    if state == "prefill_backlog":
        return (f"{count(s.prefill_backlog)} prompt tokens are waiting to be prefilled; new "
                f"requests wait for their first token ({count(s.waiting)} queued).")
    if state == "decode_contention":
        slots = (f"{count(s.running)} of {count(p['max_running'])} slots running"
                 if p["max_running"] is not None else f"{count(s.running)} running")
        if out["decode"]["collapse"]:
            return (f"Each request generates {speed(s.speed)}, under "
                    f"{percent(c.decode_speed_collapse_ratio)} of its usual "
                    f"{speed(s.speed_p90_1h)} (1 h p90), with {slots}.")
        grown = _div(s.running, s.running_avg_1h)
        return (f"Each request generates {speed(s.speed)}, "
                f"{percent(_div(s.speed, s.speed_p90_1h))} of its usual "
                f"{speed(s.speed_p90_1h)} (1 h p90), with {slots}: "
                f"{_times_text(grown)}× the usual batch of {_times_text(s.running_avg_1h)}, "
                f"{count(_div(s.kv_used, s.running))} KV tokens each.")
    if state == "scheduling_bottleneck":
        return (f"Requests have waited {seconds(s.queue_seconds)} continuously while the KV "
                f"cache is only {percent(s.kv_occupancy)} full: they wait for a running slot or "
                "an admission decision, not for memory or compute." + queue_cause(p, c))
    if state == "idle":
        return "Nothing running, nothing waiting."
    limit = f" of {count(p['max_running'])}" if p["max_running"] is not None else ""
    grammar = p["grammar_waiting"]
    beside = (f" {count(grammar)} structured-output requests wait for their grammar to compile, "
              "outside the waiting queue." if grammar else "")
    return (f"{count(s.running)} running{limit}, {count(s.waiting)} waiting; no backlog, "
            "contention or capacity limit." + beside + feature_reasons(out["features"], c))


def feature_minute(minute: Mapping[str, Any]) -> dict[str, float | None]:
    """The features' last-minute ratios and their traffic (None without the counters)."""
    window = minute.get("window_seconds") or None
    verifies, evicted = minute.get("verifies"), minute.get("evicted")
    return {
        "spec_accept_length_last_minute": _div(minute.get("generated"), verifies),
        "spec_verifies_per_second": _div(verifies, window),
        "hicache_dropped_ratio_last_minute": _div(minute.get("dropped"), evicted),
        "evicted_tokens_per_second": _div(evicted, window),
    }


def feature_reasons(f: Mapping[str, float | None], c: Classification) -> str:
    """A feature that stopped paying on a server otherwise healthy, as the feature alerts
    judge it over the last minute (their sustain is the rules'): "" when none shows."""
    out = ""
    accept = f["spec_accept_length_last_minute"]
    if _lt(accept, c.spec_collapse_accept_length) and _ge(f["spec_verifies_per_second"],
                                                          c.spec_min_verify_rps):
        out += (f" Speculative decoding yields {shown.number(accept, '.2f', 'rate')} tokens per "
                "verify step over the last minute, under "
                f"{shown.number(c.spec_collapse_accept_length, 'g', 'rate')}: the draft model's "
                "guesses are rejected, and each step still pays for them.")
    dropped = f["hicache_dropped_ratio_last_minute"]
    if (dropped is not None and dropped > c.hicache_drop_ratio
            and _ge(f["evicted_tokens_per_second"], c.hicache_min_evicted_tps)):
        out += (f" HiCache dropped {percent(min(dropped, 1.0))} of the tokens the device cache "
                "evicted over the last minute (no host copy yet): those prefixes are computed "
                "again.")
    return out


def _priority_text(value: str) -> str:
    """A priority label as SGLang writes it (an integer, or "None" for requests without one);
    anything else from a server's answer is not repeated."""
    return value if re.fullmatch(r"-?\d{1,12}|None", value) else "(unreadable)"


def queue_cause(p: Mapping[str, Any], c: Classification) -> str:
    """The feature that holds a queue back with the KV pool free, as one more sentence (the
    alerts' `cause:`, feature_rules.queue_causes): every LoRA adapter slot in use, or one
    priority holding nearly all the waiting requests (all but 1 / priority_starvation_ratio of
    them) while other priorities run. The rules weigh 2-minute means of queue and batch; a
    poll's batch swings as slots free, so the page reads the queue's make-up. "" when neither
    shows."""
    used, total = p["lora_slots_used"], p["lora_slots_total"]
    if used is not None and total and used >= total:
        return (f" Every LoRA adapter slot is in use ({count(used)} of {count(total)}): the "
                "request at the head of the queue waits for its adapter, and the queue behind "
                "it (--max-loras-per-batch).")
    waiting, running = p["waiting_by_priority"], p["running_by_priority"]
    queued = sum(waiting.values())
    if len(waiting) < 2 or queued <= 0:
        return ""
    most = max(waiting, key=lambda k: waiting[k])
    others = sum(v for k, v in running.items() if k != most)
    if waiting[most] / queued < 1 - 1 / c.priority_starvation_ratio or not others:
        return ""
    return (f" Priority scheduling: priority {_priority_text(most)} holds "
            f"{count(waiting[most])} of the {count(queued)} waiting requests while other "
            f"priorities run {count(others)}: it is served last.")

def readings(state: str, s: Signals, c: Classification, gpus: Sequence[Mapping[str, Any]],
             minute: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The reading patterns (READINGS) that apply now and point to the verdict `state`, in its
    numbers. Each saturation state's own condition is one of them, so a badge never stands
    without its reading, and a pattern of another state is never shown beside it."""
    found = []
    util, memory = _gpu_means(gpus)
    if state == "prefill_backlog":
        then = minute.get("backlog_then")
        if (_ge(util, GPU_BUSY_RATIO) and then is not None and s.prefill_backlog is not None
                and s.prefill_backlog > then):
            found.append(("gpu_busy_backlog_growing",
                          f"GPUs {percent(util)} busy and prompt tokens waiting for prefill up "
                          f"from {count(then)} to {count(s.prefill_backlog)} in a minute: input "
                          "compute backlog."))
        found.append(("backlog_with_queue",
                      f"{count(s.prefill_backlog)} prompt tokens waiting for prefill (the "
                      f"threshold is {count(c.prefill_backlog_tokens)}) while {count(s.waiting)} "
                      "requests queue: input compute backlog."))
    elif state == "scheduling_bottleneck":
        found.append(("queue_growing_kv_low",
                      f"{count(s.waiting)} waiting (queued continuously for "
                      f"{seconds(s.queue_seconds)}) while the KV cache is "
                      f"{percent(s.kv_occupancy)} full: a compute or scheduling limit, not "
                      "capacity exhausted."))
    elif state == "decode_contention":
        collapse, drop = decode_branches(s, c)
        usual = f"each request down to {speed(s.speed)} from its usual {speed(s.speed_p90_1h)}"
        if collapse:
            found.append(("running_at_limit_speed_falling",
                          f"Running at {percent(s.running_ratio)} of the limit and {usual}: "
                          "decode contention."))
        if drop:
            grown = _div(s.running, s.running_avg_1h)
            found.append(("batch_grown_speed_falling",
                          f"{count(s.running)} running, {_times_text(grown)}× the usual batch of "
                          f"{_times_text(s.running_avg_1h)}, "
                          f"{count(_div(s.kv_used, s.running))} KV "
                          f"tokens each, and {usual}: decode contention."))
    elif state == "kv_capacity":
        found.append(("kv_full",
                      f"KV cache {percent(s.kv_occupancy)} full (the limit is "
                      f"{percent(c.kv_occupancy_ratio)})"
                      + (", and requests retracted in the last "
                         f"{shown.number(c.kv_retraction_window, '.0f', 'seconds')} s"
                         if s.retracted_recently else "")
                      + ": capacity exhausted."))
    elif (state in QUIET_STATES and _ge(memory, GPU_MEMORY_FULL_RATIO) and util is not None
          and util <= GPU_IDLE_RATIO):
        found.append(("memory_full_gpu_idle",
                      f"GPU memory {percent(memory)} used but GPUs {percent(util)} busy: static "
                      "preallocation (weights, KV pool, CUDA graphs), not load."))
    return [{"id": key, "state": READINGS[key][0], "text": text} for key, text in found]


def _gpu_means(gpus: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Mean utilisation and mean memory share of the GPUs that answered."""
    up = [g for g in gpus if g["up"] and g["utilization_ratio"] is not None]
    util = sum(g["utilization_ratio"] for g in up) / len(up) if up else None
    mems = [g["memory_used_bytes"] / g["memory_total_bytes"] for g in up
            if g["memory_used_bytes"] is not None and g["memory_total_bytes"]]
    return util, (sum(mems) / len(mems) if mems else None)


# -- trends ----------------------------------------------------------------------------------------
TREND_SERIES = ("arrivals_per_minute", "completions_per_minute", "waiting", "running",
                "prefill_backlog_tokens", "ttft_seconds")


def trends(trend, t: float | None) -> dict[str, Any]:
    """Per TREND_SLOT slot of the last 30 minutes, oldest first, None where nothing was seen:
    arrivals and completions per minute (counter differences between neighbouring slots), the
    largest queue, running batch and prefill backlog, the average TTFT of the requests that got
    their first token in the slot."""
    points = int(TREND_WINDOW / TREND_SLOT)
    series: dict[str, list[float | None]] = {name: [None] * points for name in TREND_SERIES}
    keys, c = trend
    if t is None or not keys:
        return {"slot_seconds": TREND_SLOT, "points": points, **series}
    newest = math.floor(t / TREND_SLOT)
    for k, key in enumerate(keys):
        i = points - 1 - int(newest - key)
        if not 0 <= i < points:
            continue
        series["waiting"][i] = c["waiting"][k]
        series["running"][i] = c["running"][k]
        series["prefill_backlog_tokens"][i] = c["backlog"][k]
        if k == 0 or keys[k - 1] != key - 1:
            continue  # a rate needs the slot before
        dt = _sub(c["t"][k], c["t"][k - 1])
        done = _sub(c["requests"][k], c["requests"][k - 1])
        if done is not None and done < 0:  # the server restarted
            done = c["requests"][k]
        if dt and done is not None:
            series["completions_per_minute"][i] = done / dt * 60
            grown = _sub(c["inflight"][k], c["inflight"][k - 1])
            if grown is not None:
                series["arrivals_per_minute"][i] = max(done + grown, 0.0) / dt * 60
        n = _sub(c["ttft_count"][k], c["ttft_count"][k - 1])
        total = _sub(c["ttft_sum"][k], c["ttft_sum"][k - 1])
        if n and n > 0 and total is not None and total >= 0:
            series["ttft_seconds"][i] = total / n
    return {"slot_seconds": TREND_SLOT, "points": points, **series}


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# -- prefill/decode pools --------------------------------------------------------------------------
# A PD deployment read as the PD recording rules read it: the servers of one role form a pool,
# its role from /server_info's disaggregation_mode (never configured). The exporter sees the
# prefill and decode pools, not the gateway or the transfer; each pool's own state is the
# PD_STATES one PD_STATE_POOL gives it.
PD_POOL_STATE = {pool: state for state, pool in PD_STATE_POOL.items()
                 if pool in ("prefill", "decode")}
POOL_STATE_LABELS = {"unavailable": "Unavailable", "idle": "Idle", "healthy": "Healthy",
                     "prefill_pool_backlog": "Prefill pool backlog",
                     "decode_pool_contention": "Decode pool contention"}


@dataclass(frozen=True)
class PoolSignals:
    """A pool's inputs, each summed (or maxed) over the members that report it, as the rules'
    `pool:sglang_pd_*` series are; None where no member does."""

    servers: int
    up: int
    running: float | None
    waiting: float | None
    max_running: float | None
    running_ratio: float | None  # running / max_running, both summed
    prefill_backlog: float | None
    kv_occupancy_max: float | None  # the fullest member's KV pool
    queues: Mapping[str, float]  # PD queue -> requests
    finished_last_minute: float | None = None


def _sum(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def pool_signals(members: Sequence[Mapping[str, Any]]) -> PoolSignals:
    """From the members' entries of /api/v1/status (server_status)."""
    up = [m for m in members if m["up"]]
    running = _sum(m["pressure"]["running"] for m in up)
    max_running = _sum(m["pressure"]["max_running"] for m in up)
    occupancies = [v for m in up if (v := m["tokens"]["kv_occupancy_ratio"]) is not None]
    queues: dict[str, float] = {}
    for m in up:
        for queue, value in m["pd_queues"].items():
            queues[queue] = queues.get(queue, 0.0) + value
    return PoolSignals(
        servers=len(members), up=len(up), running=running,
        waiting=_sum(m["pressure"]["waiting"] for m in up), max_running=max_running,
        running_ratio=_div(running, max_running),
        prefill_backlog=_sum(m["tokens"]["prefill_backlog"] for m in up),
        kv_occupancy_max=max(occupancies) if occupancies else None, queues=queues,
        finished_last_minute=_sum(m["pressure"]["finished_last_minute"] for m in up))


def pool_conditions(pool: str, p: PoolSignals, c: Classification) -> dict[str, bool]:
    """The pool's states' conditions, as the PD recording rules' pool states write them."""
    held = {"unavailable": p.up == 0}
    if pool == "prefill":
        held["prefill_pool_backlog"] = (_ge(p.prefill_backlog, c.prefill_backlog_tokens)
                                        and _lt(0, p.waiting))
    else:  # requests wait for decode KV while the pool is at its limit or a KV pool is full
        held["decode_pool_contention"] = (_ge(p.queues.get("prealloc"),
                                              c.min_prealloc_queue_requests)
                                          and (_ge(p.running_ratio, c.running_ratio_at_limit)
                                               or _ge(p.kv_occupancy_max,
                                                      c.kv_occupancy_ratio)))
    # Idle as the rules' pool:sglang_pd_busy:sum: nothing held, nothing finished lately (a
    # prefill server's requests pass through in about a second).
    held["idle"] = (p.running == 0 and p.waiting == 0 and not any(p.queues.values())
                    and not p.finished_last_minute)
    held["healthy"] = p.up > 0
    return held


def classify_pool(pool: str, p: PoolSignals, c: Classification) -> str:
    """The first of the pool's states, in PD_PRIORITY, whose condition holds."""
    held = pool_conditions(pool, p, c)
    return next(state for state in PD_PRIORITY if held.get(state))


def pool_statuses(servers: Sequence[Mapping[str, Any]],
                  c: Classification) -> list[dict[str, Any]]:
    """One verdict per pool that has a member among the polled servers; [] without PD
    servers."""
    out = []
    for pool in (p for p in PD_POOLS if p in PD_POOL_STATE):
        members = [srv for srv in servers if srv["role"] == pool]
        if not members:
            continue
        p = pool_signals(members)
        state = classify_pool(pool, p, c)
        out.append({
            "pool": pool,
            "servers": [m["server"] for m in members],
            "servers_up": p.up,
            "state": state,
            "state_code": PD_STATES.index(state),
            "state_label": POOL_STATE_LABELS[state],
            "colour": PD_STATE_COLOURS[state],
            "reason": pool_reason(pool, state, p, c),
            "running": p.running,
            "waiting": p.waiting,
            "max_running": p.max_running,
            "running_ratio": p.running_ratio,
            "prefill_backlog": p.prefill_backlog,
            "kv_occupancy_max": p.kv_occupancy_max,
            "queues": dict(p.queues),
        })
    return out


def pool_reason(pool: str, state: str, p: PoolSignals, c: Classification) -> str:
    """One sentence: why the pool is in `state`, with the numbers that put it there."""
    down = (f" {count(p.servers - p.up)} of its {count(p.servers)} servers do not answer."
            if 0 < p.up < p.servers else "")
    slots = (f"{count(p.running)} of {count(p.max_running)} slots running "
             f"({percent(p.running_ratio)})" if p.max_running is not None
             else f"{count(p.running)} running")
    if state == "unavailable":
        return f"None of the pool's {count(p.servers)} servers answers."
    if state == "prefill_pool_backlog":
        return (f"{count(p.prefill_backlog)} prompt tokens are waiting to be prefilled across "
                f"the pool (the threshold is {count(c.prefill_backlog_tokens)}) while "
                f"{count(p.waiting)} requests queue.{down}")
    if state == "decode_pool_contention":
        full = (f"; the fullest KV pool is {percent(p.kv_occupancy_max)} full"
                if _ge(p.kv_occupancy_max, c.kv_occupancy_ratio) else "")
        return (f"{count(p.queues.get('prealloc'))} requests wait for decode KV (the prealloc "
                f"queue) with {slots}{full}.{down}")
    if state == "idle":
        return f"Nothing running, nothing waiting on the pool's servers.{down}"
    what = ("backlog" if pool == "prefill" else "contention")
    return (f"{slots}, {count(p.waiting)} waiting across the pool; no {what}.{down}")
