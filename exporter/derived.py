"""Signals SGLang does not give as such, computed from one poll cycle's answers.

Each server's answers come from four places: the load endpoint (/v1/loads, /get_load before
0.5.8: live, summed over DP ranks), the scheduler gauges on /metrics, the configuration
(/server_info and /v1/models, read on reconnect and every server-info interval) and the
scheduler log, where one is followed. Per signal, the first source that has it wins:

- KV used tokens: load `num_used_tokens` > /metrics `kv_used_tokens` > /metrics
  `num_used_tokens` (older spelling).
- KV capacity tokens: load `max_total_num_tokens` > /metrics `max_total_num_tokens` >
  /server_info token capacity > the log's start-up line (one DP rank's, times dp_size).
- KV occupancy ratio: used / capacity.
- Running and waiting requests: load > /metrics `num_running_reqs` / `num_queue_reqs`.
- Effective max running requests: load > the log's start-up line (times dp_size) >
  /server_info. Before 0.5.8 /server_info has only the command-line value, so the log beats it.
- Running requests ratio: running / effective max running requests.
- Decode speed per request: generation throughput (load > /metrics `gen_throughput`) / running.
- Prefill backlog tokens: load (waiting uncached prompt tokens) > the log's pending prefill
  tokens, the only source on releases without it in the load endpoint.
- Context length tokens: /metrics `context_len` > /v1/models `max_model_len` > /server_info.
- Model name: /server_info > the `model_name` label on /metrics.

A signal no source has stays None, and the collector exports no series for it.

Every value is checked against its domain before it is used or exported: counts and token
numbers must be finite and >= 0, ratios in [0, 1] (a value above 1 by at most RATIO_TOLERANCE
is read as 1), decode speed finite and >= 0. A source value outside its domain (a negative
running count, an infinite capacity) counts as not given, so the next source may give it; a
computed value outside its domain (a ratio over a 1e-308 denominator) is dropped. Each signal
that lost a value this way is named in `Derived.dropped`, which the poller counts in
sglang_obs_derived_values_dropped_total. Model names become label values through labels.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_obs.exporter import labels
from sglang_obs.exporter.log_stats import LogSnapshot
from sglang_obs.exporter.sglang_api import Load, ServerConfig
from sglang_obs.exporter.sglang_exposition import NativeMetrics


@dataclass(frozen=True)
class Derived:
    """Per-server signals computed from one cycle's answers. None means unknown: no series."""

    model_name: str = ""
    kv_used_tokens: float | None = None
    kv_capacity_tokens: float | None = None
    kv_occupancy_ratio: float | None = None
    running_requests: float | None = None
    waiting_requests: float | None = None
    max_running_requests: float | None = None
    running_requests_ratio: float | None = None
    decode_speed_per_request: float | None = None
    prefill_backlog_tokens: float | None = None
    context_length_tokens: float | None = None
    dropped: tuple[str, ...] = ()  # signals that had a value outside their domain


# The signals of Derived that carry a number (the `signal` label of the dropped counter).
SIGNALS = ("kv_used_tokens", "kv_capacity_tokens", "kv_occupancy_ratio", "running_requests",
           "waiting_requests", "max_running_requests", "running_requests_ratio",
           "decode_speed_per_request", "prefill_backlog_tokens", "context_length_tokens")
RATIO_TOLERANCE = 1e-3


def derive(
    native: NativeMetrics | None,
    load: Load | None,
    config: ServerConfig | None,
    models_context: float | None = None,
    log: LogSnapshot | None = None,
) -> Derived:
    """Combine one cycle's answers, each signal from the first source that has it (see the
    module docstring for the order)."""
    native = native or NativeMetrics()
    load = load or Load()
    config = config or ServerConfig()
    ranks = max(config.dp_size or 1, 1)
    capacity_line = log.capacity if log else {}
    dropped: dict[str, None] = {}

    def first(signal, *values):
        """The first value inside the domain (finite, >= 0); the others are dropped."""
        for value in values:
            if value is None:
                continue
            if math.isfinite(value) and value >= 0:
                return float(value)
            dropped[signal] = None
        return None

    def per_server(value):  # the start-up line is one DP rank's
        return None if value is None else value * ranks

    def ratio(signal, num, den, bounded=True):
        if num is None or den is None or den <= 0:
            return None
        value = num / den
        if bounded and 1 < value <= 1 + RATIO_TOLERANCE:
            value = 1.0
        if not math.isfinite(value) or value < 0 or (bounded and value > 1):
            dropped[signal] = None
            return None
        return value

    used = first("kv_used_tokens", load.used_tokens, native.get("kv_used_tokens"),
                 native.get("num_used_tokens"))
    capacity = first(
        "kv_capacity_tokens", load.capacity_tokens, native.get("max_total_num_tokens"),
        config.max_total_num_tokens, per_server(capacity_line.get("max_total_num_tokens")),
    )
    running = first("running_requests", load.running, native.get("num_running_reqs"))
    waiting = first("waiting_requests", load.waiting, native.get("num_queue_reqs"))
    # The start-up line carries the effective limit; before 0.5.8 /server_info has only the
    # command-line value, so the log beats it.
    max_running = first("max_running_requests", load.max_running_requests,
                        per_server(capacity_line.get("max_running_requests")),
                        config.max_running_requests)
    gen = first("decode_speed_per_request", load.gen_throughput, native.get("gen_throughput"))
    backlog = first("prefill_backlog_tokens", load.prefill_backlog_tokens,
                    log.pending_prefill_tokens if log else None)
    context = first("context_length_tokens", native.get("context_len"), models_context,
                    config.context_length)
    occupancy = ratio("kv_occupancy_ratio", used, capacity)
    running_ratio = ratio("running_requests_ratio", running, max_running)
    # Decode speed per request: nothing runs below one request.
    speed = ratio("decode_speed_per_request", gen,
                  running if running is not None and running >= 1 else None, bounded=False)
    return Derived(
        model_name=labels.model_name(config.model_name or native.model_name),
        kv_used_tokens=used,
        kv_capacity_tokens=capacity,
        kv_occupancy_ratio=occupancy,
        running_requests=running,
        waiting_requests=waiting,
        max_running_requests=max_running,
        running_requests_ratio=running_ratio,
        decode_speed_per_request=speed,
        prefill_backlog_tokens=backlog,
        context_length_tokens=context,
        dropped=tuple(dropped),
    )
