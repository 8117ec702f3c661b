"""Collectors: turn poller snapshots into metric families at scrape time, with no I/O.

Each scrape builds fresh families from the latest snapshots (no direct-instrumentation state),
so concurrent scrapes cannot race and a vanished label set never lingers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

from exporter import __version__
from exporter.catalogue import BY_NAME, CONFIG_INFO_LABELS, PREFIX
from exporter.poller import Snapshot, TargetPoller

log = logging.getLogger(__name__)


def _family(short_name: str):
    return BY_NAME[PREFIX + short_name].family()


class SGLangCollector:
    """Per-server health, derived load signals and effective configuration, e.g.

    sglang_obs_up{server="10.0.0.5:30000"} 1.0
    sglang_obs_kv_occupancy_ratio{model_name="qwen3-27b",server="10.0.0.5:30000"} 0.3086425
    """

    name = "sglang"

    def __init__(self, pollers: Iterable[TargetPoller]):
        self._pollers = list(pollers)

    def describe(self):
        return []  # registration must not poll

    def collect(self) -> Iterator:
        snapshots = [p.snapshot for p in self._pollers]
        yield from _health(snapshots)
        yield from _derived(snapshots)
        yield from _config(snapshots)


def _health(snapshots: list[Snapshot]):
    build = _family("exporter_build_info")
    build.add_metric([], {"version": __version__})
    up, last, duration, polls, errors, spelling, present = (
        _family(n)
        for n in (
            "up",
            "last_poll_success_timestamp_seconds",
            "poll_duration_seconds",
            "polls_total",
            "poll_errors_total",
            "native_metrics_info",
            "scheduler_metrics_present",
        )
    )
    for snap in snapshots:
        labels = [snap.server]
        up.add_metric(labels, 1.0 if snap.up else 0.0)
        polls.add_metric(labels, snap.polls)
        if snap.last_success_timestamp is not None:
            last.add_metric(labels, snap.last_success_timestamp)
        if snap.poll_duration_seconds is not None:
            duration.add_metric(labels, snap.poll_duration_seconds)
        for (endpoint, reason), count in sorted(snap.errors.items()):
            errors.add_metric([snap.server, endpoint, reason], count)
        if snap.native_spelling is not None:
            spelling.add_metric(labels, {"spelling": snap.native_spelling})
            present.add_metric(labels, 1.0 if snap.scheduler_metrics_present else 0.0)
    yield from (build, up, last, duration, polls, errors, spelling, present)


# Derived field -> metric short name.
_DERIVED_GAUGES = (
    ("kv_used_tokens", "kv_used_tokens"),
    ("kv_capacity_tokens", "kv_capacity_tokens"),
    ("kv_occupancy_ratio", "kv_occupancy_ratio"),
    ("running_requests", "running_requests"),
    ("waiting_requests", "waiting_requests"),
    ("max_running_requests", "max_running_requests"),
    ("running_requests_ratio", "running_requests_ratio"),
    ("decode_speed_per_request", "decode_speed_per_request_tokens_per_second"),
    ("prefill_backlog_tokens", "prefill_backlog_tokens"),
)


def _derived(snapshots: list[Snapshot]):
    gauges = [(field, _family(name)) for field, name in _DERIVED_GAUGES]
    current = _family("queue_nonempty_duration_seconds")
    runs = _family("queue_nonempty_run_duration_seconds")
    total = _family("queue_nonempty_seconds_total")
    for snap in snapshots:
        if snap.derived is None:
            continue
        labels = [snap.server, snap.derived.model_name]
        for field, family in gauges:
            value = getattr(snap.derived, field)
            if value is not None:
                family.add_metric(labels, value)
        if snap.queue_run is not None and snap.derived.waiting_requests is not None:
            q = snap.queue_run
            current.add_metric(labels, q.current_seconds)
            runs.add_metric(labels, q.cumulative_buckets(), q.runs_sum_seconds)
            total.add_metric(labels, q.nonempty_seconds_total)
    yield from (family for _, family in gauges)
    yield from (current, runs, total)


def _config(snapshots: list[Snapshot]):
    info = _family("server_config_info")
    numeric = {
        name: _family(name)
        for name in (
            "config_tp_size",
            "config_dp_size",
            "config_chunked_prefill_size_tokens",
            "config_max_prefill_tokens",
            "config_context_length_tokens",
            "config_mixed_chunk_enabled",
        )
    }
    for snap in snapshots:
        cfg = snap.config
        if cfg is None:
            continue
        model = cfg.model_name or (snap.derived.model_name if snap.derived else "")
        labels = [snap.server, model]
        values = {
            "version": cfg.version,
            "tp_size": _str(cfg.tp_size),
            "dp_size": _str(cfg.dp_size),
            "pp_size": _str(cfg.pp_size),
            "schedule_policy": cfg.schedule_policy,
            "kv_cache_dtype": cfg.kv_cache_dtype,
            "speculative_algorithm": cfg.speculative_algorithm,
            "mixed_chunk": _str(cfg.mixed_chunk).lower(),
            "disaggregation_mode": cfg.disaggregation_mode,
        }
        info.add_metric(labels, {k: values[k] for k in CONFIG_INFO_LABELS})
        context = snap.derived.context_length_tokens if snap.derived else None
        for name, value in (
            ("config_tp_size", cfg.tp_size),
            ("config_dp_size", cfg.dp_size),
            ("config_chunked_prefill_size_tokens", cfg.chunked_prefill_size),
            ("config_max_prefill_tokens", cfg.max_prefill_tokens),
            ("config_context_length_tokens", context or cfg.context_length),
            ("config_mixed_chunk_enabled", None if cfg.mixed_chunk is None else cfg.mixed_chunk),
        ):
            if value is not None:
                numeric[name].add_metric(labels, float(value))
    yield info
    yield from numeric.values()


def _str(value) -> str:
    return "" if value is None else str(value)


class GuardedCollector:
    """Wraps a collector so one that raises loses its own series, not the whole scrape."""

    def __init__(self, collectors):
        self._collectors = list(collectors)

    def describe(self):
        return []

    def collect(self):
        success, duration = _family("collector_success"), _family("collector_duration_seconds")
        for collector in self._collectors:
            started = time.perf_counter()
            try:
                families = [f for f in collector.collect() if f.samples]
                ok = True
            except Exception:
                log.exception("collector %s failed", collector.name)
                families, ok = [], False
            success.add_metric([collector.name], 1.0 if ok else 0.0)
            duration.add_metric([collector.name], time.perf_counter() - started)
            yield from families
        yield success
        yield duration
