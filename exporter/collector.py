"""Collectors: turn poller snapshots into metric families at scrape time, with no I/O.

Each scrape builds fresh families from the latest snapshots (no direct-instrumentation state),
so concurrent scrapes cannot race and a vanished label set never lingers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

from sglang_obs import __version__
from sglang_obs.exporter.catalogue import BY_NAME, CONFIG_INFO_LABELS, GPU_LIMITS, PREFIX
from sglang_obs.exporter.log_stats import CONTEXT_BUCKETS
from sglang_obs.exporter.poller import Snapshot, TargetPoller
from sglang_obs.exporter.request_records import FINISH_REASONS, PROMPT_CLASSES
from sglang_obs.exporter.status import StatusBoard

log = logging.getLogger(__name__)


def _family(short_name: str):
    return BY_NAME[PREFIX + short_name].family()


class SGLangCollector:
    """Per-server health, derived load signals and effective configuration, e.g.

    sglang_obs_up{server="10.0.0.5:30000"} 1.0
    sglang_obs_kv_occupancy_ratio{model_name="qwen3-27b",server="10.0.0.5:30000"} 0.3086425
    """

    name = "sglang"

    def __init__(self, pollers: Iterable[TargetPoller], board: StatusBoard | None = None):
        self._pollers = list(pollers)
        self._board = board  # the glance page's, whose hidden values are counted here

    def describe(self):
        return []  # registration must not poll

    def collect(self) -> Iterator:
        snapshots = [p.snapshot for p in self._pollers]
        yield from _health(snapshots)
        yield _glance_hidden(self._board)
        yield from _derived(snapshots)
        yield _pd_queues(snapshots)
        yield from _config(snapshots)


def _health(snapshots: list[Snapshot]):
    build = _family("exporter_build_info")
    build.add_metric([], {"version": __version__})
    up, last, duration, polls, errors, spelling, present, lines, dropped = (
        _family(n)
        for n in (
            "up",
            "last_poll_success_timestamp_seconds",
            "poll_duration_seconds",
            "polls_total",
            "poll_errors_total",
            "native_metrics_info",
            "scheduler_metrics_present",
            "native_lines_dropped_total",
            "derived_values_dropped_total",
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
        for reason, count in sorted(snap.lines_dropped.items()):
            lines.add_metric([snap.server, reason], count)
        for signal, count in sorted(snap.derived_dropped.items()):
            dropped.add_metric([snap.server, signal], count)
        if snap.native_spelling is not None:
            spelling.add_metric(labels, {"spelling": snap.native_spelling})
            present.add_metric(labels, 1.0 if snap.scheduler_metrics_present else 0.0)
    yield from (build, up, last, duration, polls, errors, spelling, present, lines, dropped)


def _glance_hidden(board: StatusBoard | None):
    """The glance page's hidden values by reason (sglang_obs.core.shown); no series before
    the first."""
    hidden = _family("glance_values_hidden_total")
    for reason, count in sorted(board.hidden.counts().items() if board is not None else ()):
        hidden.add_metric([reason], count)
    return hidden


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


def _pd_queues(snapshots: list[Snapshot]):
    """The PD queues of prefill and decode servers (the parser keeps only the role's own)."""
    family = _family("pd_queue_requests")
    for snap in snapshots:
        if snap.pd is None or snap.derived is None:
            continue
        for queue, value in snap.pd.queues.items():
            family.add_metric([snap.server, snap.derived.model_name, queue], value)
    return family


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
            "config_num_continuous_decode_steps",
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
            ("config_num_continuous_decode_steps", cfg.num_continuous_decode_steps),
        ):
            if value is not None:
                numeric[name].add_metric(labels, float(value))
    yield info
    yield from numeric.values()


def _str(value) -> str:
    return "" if value is None else str(value)


def _integer(value: float | None) -> str:
    """A gpu_info label value: "1980000000", "" when NVML did not answer."""
    return "" if value is None else f"{value:.0f}"


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


class LogCollector:
    """Scheduler-log series per server, from LogStats snapshots, e.g.

    sglang_obs_log_pending_prefill_tokens{server="10.0.0.5:30000"} 292965.0
    """

    name = "log"

    def __init__(self, sources):
        self._sources = list(sources)  # objects with .server, .kind, .stats, .up, .rotations

    def describe(self):
        return []

    def collect(self) -> Iterator:
        fam = {n: _family(n) for n in (
            "log_source_up", "log_lines_total", "log_rotations_total", "log_dropped_lines_total",
            "log_prefill_batches_total", "log_prefill_new_tokens_total",
            "log_prefill_cached_tokens_total", "log_decode_reports_total",
            "log_retracted_requests_total", "log_health_check_failures_total",
            "log_pending_prefill_tokens", "log_queue_requests", "log_running_requests",
            "log_running_batch_tokens", "log_input_throughput_tokens_per_second",
            "log_gen_throughput_tokens_per_second", "log_spec_accept_length",
            "log_prefill_context_tokens", "log_capacity_tokens", "log_max_running_requests",
            "log_ready_timestamp_seconds", "log_last_line_timestamp_seconds")}
        for source in self._sources:
            snap = source.stats.snapshot()
            server = [source.server]
            fam["log_source_up"].add_metric([source.server, source.kind],
                                            1.0 if source.up else 0.0)
            for kind, count in sorted(snap.lines.items()):
                fam["log_lines_total"].add_metric([source.server, kind], count)
            for reason, count in sorted(snap.dropped.items()):
                fam["log_dropped_lines_total"].add_metric([source.server, reason], count)
            for name, value in (
                ("log_rotations_total", source.rotations),
                ("log_prefill_batches_total", snap.prefill_batches),
                ("log_prefill_new_tokens_total", snap.prefill_new_tokens),
                ("log_prefill_cached_tokens_total", snap.prefill_cached_tokens),
                ("log_decode_reports_total", snap.decode_reports),
                ("log_retracted_requests_total", snap.retracted_requests),
                ("log_health_check_failures_total", snap.health_check_failures),
                ("log_pending_prefill_tokens", snap.pending_prefill_tokens),
                ("log_queue_requests", snap.queue_requests),
                ("log_running_requests", snap.running_requests),
                ("log_running_batch_tokens", snap.running_batch_tokens),
                ("log_input_throughput_tokens_per_second", snap.input_throughput),
                ("log_gen_throughput_tokens_per_second", snap.gen_throughput),
                ("log_spec_accept_length", snap.spec_accept_length),
                ("log_capacity_tokens", snap.capacity.get("max_total_num_tokens")),
                ("log_max_running_requests", snap.capacity.get("max_running_requests")),
                ("log_ready_timestamp_seconds", snap.ready_timestamp),
                ("log_last_line_timestamp_seconds", snap.last_line_timestamp),
            ):
                if value is not None:
                    fam[name].add_metric(server, float(value))
            buckets, running = [], 0
            for bound, count in zip((*CONTEXT_BUCKETS, float("inf")), snap.context_buckets,
                                    strict=True):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            fam["log_prefill_context_tokens"].add_metric(server, buckets, snap.context_sum)
        yield from fam.values()


class RequestCollector:
    """Request-record series per server, from RequestStats snapshots, e.g.

    sglang_obs_request_ttft_seconds_bucket{le="2.0",model_name="qwen3-27b",
        prompt_class="32k_128k",server="10.0.0.5:30000"} 41.0

    Every class (and class x finish reason) is present from the start, at 0, so rate() and
    increase() see a class's first request. `model_name` is the polled server's, from
    `model_of(server)`: the records do not say which model served them.
    """

    name = "requests"
    _HISTOGRAMS = (("ttft", "request_ttft_seconds"), ("queue", "request_queue_time_seconds"),
                   ("e2e", "request_e2e_latency_seconds"),
                   ("tpot", "request_time_per_output_token_seconds"))

    def __init__(self, sources, model_of=lambda server: ""):
        self._sources = list(sources)  # objects with .server, .stats, .up, .rotations
        self._model_of = model_of

    def describe(self):
        return []

    def collect(self) -> Iterator:
        fam = {n: _family(n) for n in (
            "request_source_up", "request_records_total", "request_records_rejected_total",
            "request_files_rejected_total", "request_file_rotations_total",
            "request_last_finished_timestamp_seconds",
            "request_finished_total", "request_prompt_tokens_total",
            "request_cached_tokens_total", *(name for _, name in self._HISTOGRAMS))}
        for source in self._sources:
            snap = source.stats.snapshot()
            server = source.server
            model = self._model_of(server) or ""
            fam["request_source_up"].add_metric([server], 1.0 if source.up else 0.0)
            fam["request_records_total"].add_metric([server], snap.records)
            fam["request_file_rotations_total"].add_metric([server], source.rotations)
            for reason, count in sorted(snap.rejected.items()):
                fam["request_records_rejected_total"].add_metric([server, reason], count)
            for reason, count in sorted(snap.rejected_files.items()):
                fam["request_files_rejected_total"].add_metric([server, reason], count)
            if snap.last_finished_at is not None:
                fam["request_last_finished_timestamp_seconds"].add_metric(
                    [server], snap.last_finished_at)
            for cls in PROMPT_CLASSES:
                labels = [server, model, cls]
                for reason in FINISH_REASONS:
                    fam["request_finished_total"].add_metric([*labels, reason],
                                                             snap.finished[(cls, reason)])
                fam["request_prompt_tokens_total"].add_metric(labels, snap.prompt_tokens[cls])
                fam["request_cached_tokens_total"].add_metric(labels, snap.cached_tokens[cls])
                for key, name in self._HISTOGRAMS:
                    buckets, total = snap.histograms[(cls, key)]
                    fam[name].add_metric(labels, buckets, total)
        yield from fam.values()


def model_of(pollers):
    """server -> the model name its poller last saw (the config's while it is down), or ""."""
    by_server = {p.server: p for p in pollers}

    def lookup(server: str) -> str:
        poller = by_server.get(server)
        if poller is None:
            return ""
        snap = poller.snapshot
        if snap.derived is not None and snap.derived.model_name:
            return snap.derived.model_name
        return (snap.config.model_name if snap.config is not None else "") or ""

    return lookup


class ContainerCollector:
    """Container state from the last Docker API poll, e.g.

    sglang_obs_container_restarts_total{container="sglang",server="10.0.0.5:30000"} 3.0
    """

    name = "docker"

    def __init__(self, source):
        self._source = source

    def describe(self):
        return []

    def collect(self) -> Iterator:
        up = _family("container_source_up")
        up.add_metric([], 1.0 if self._source.up else 0.0)
        names = ("container_info", "container_running", "container_restarts_total",
                 "container_oom_kills_total", "container_oom_killed",
                 "container_last_exit_code", "container_healthy",
                 "container_start_time_seconds")
        fam = {n: _family(n) for n in names}
        for r in self._source.readings:
            labels = [r.name, r.server]
            fam["container_info"].add_metric(
                labels, {"image": r.image, "state": r.state, "health": r.health})
            fam["container_running"].add_metric(labels, 1.0 if r.running else 0.0)
            fam["container_restarts_total"].add_metric(labels, r.restart_count)
            fam["container_oom_kills_total"].add_metric(labels, r.oom_kills)
            fam["container_oom_killed"].add_metric(labels, 1.0 if r.oom_killed else 0.0)
            fam["container_last_exit_code"].add_metric(labels, r.exit_code)
            if r.health:
                fam["container_healthy"].add_metric(labels, 1.0 if r.health == "healthy"
                                                    else 0.0)
            if r.started_at is not None:
                fam["container_start_time_seconds"].add_metric(labels, r.started_at)
        yield up
        yield from fam.values()


class GpuCollector:
    """GPU series from the last NVML sampling cycle, e.g.

    sglang_obs_gpu_power_watts{gpu="0",uuid="GPU-5d3c..."} 412.5
    """

    name = "nvml"
    _PER_GPU = ("utilization_ratio", "memory_utilization_ratio", "memory_used_bytes",
                "memory_reserved_bytes", "memory_total_bytes", "temperature_celsius",
                "memory_temperature_celsius", "power_watts", "power_limit_watts",
                "energy_joules_total", "sm_clock_hertz", "memory_clock_hertz",
                "pcie_link_generation", "pcie_link_width", "pcie_link_downgraded",
                "pcie_replay_errors_total", "remapped_rows_pending", "remapped_rows_failure",
                "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
                "dram_bandwidth_ratio")

    def __init__(self, sampler):
        self._sampler = sampler

    def describe(self):
        return []

    def collect(self) -> Iterator:
        sampler = self._sampler
        reading = sampler.reading
        backend = sampler.backend
        up, count, duration, last, errors, inits = (_family(f"gpu_{n}") for n in (
            "collector_up", "device_count", "collection_duration_seconds",
            "last_collection_success_timestamp_seconds", "collection_errors_total",
            "nvml_inits_total"))
        up.add_metric([], 1.0 if reading.ok else 0.0)
        if sampler.unavailable_reason is None:
            count.add_metric([], len(reading.gpus))
            duration.add_metric([], reading.duration_seconds)
        if sampler.last_success is not None:
            last.add_metric([], sampler.last_success)
        for reason, n in sorted(backend.errors.items()):
            errors.add_metric([reason], n)
        inits.add_metric([], backend.inits)
        yield from (up, count, duration, last, errors, inits)

        info, device_up = _family("gpu_info"), _family("gpu_device_up")
        values = {n: _family(f"gpu_{n}") for n in self._PER_GPU}
        events, ecc_vol, ecc_agg, rows, procs = (_family(f"gpu_{n}") for n in (
            "clock_event_active", "ecc_errors_volatile_total", "ecc_errors_aggregate_total",
            "remapped_rows_total", "process_memory_bytes"))
        for g in reading.gpus:
            labels = [str(g.index), g.uuid]
            device_up.add_metric(labels, 1.0 if g.up else 0.0)
            if not g.up:
                continue  # a lost GPU has no values: stale ones would lie
            info.add_metric(labels, {"name": g.name, "pci_bus_id": g.pci_bus_id,
                                     "driver_version": reading.driver_version,
                                     "cuda_driver_version": reading.cuda_driver_version,
                                     "mig_mode": g.mig_mode,
                                     **{k: _integer(g.limits.get(k)) for k in GPU_LIMITS},
                                     "clock_event_reasons": ",".join(g.clock_events)})
            for name, value in g.values.items():
                values[name].add_metric(labels, value)
            for reason, active in sorted(g.clock_events.items()):
                if active:  # absent = not active: one series per active reason
                    events.add_metric([*labels, reason], active)
            for (counter, error), n in sorted(g.ecc.items()):
                (ecc_vol if counter == "volatile" else ecc_agg).add_metric([*labels, error], n)
            for kind, n in sorted(g.remapped_rows.items()):
                rows.add_metric([*labels, kind], n)
            for server, used in sorted(g.process_memory.items()):
                procs.add_metric([*labels, server], used)
        yield from (info, device_up, *values.values(), events, ecc_vol, ecc_agg, rows, procs)
        if sampler.xid is not None:
            counts, seen = sampler.xid.snapshot()
            total, last_seen = _family("gpu_xid_errors_total"), _family(
                "gpu_xid_last_timestamp_seconds")
            for key in sorted(counts):
                total.add_metric(list(key), counts[key])
                last_seen.add_metric(list(key), seen[key])
            yield total
            yield last_seen
