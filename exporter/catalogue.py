"""Every metric the exporter emits: name, type, labels, help. The single source of truth.

The collector builds its families from these specs, docs/metrics.md is generated from them
(`python -m sglang_obs.generate metrics`, kept fresh by a test), and the
naming lint and the golden exposition test check them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from sglang_obs.core import shown
from sglang_obs.exporter import labels
from sglang_obs.exporter.request_records import (
    E2E_BOUNDS,
    FILE_REJECT_REASONS,
    FINISH_REASONS,
    MAX_RECORD_BYTES,
    PROMPT_CLASSES,
    QUEUE_BOUNDS,
    REJECT_REASONS,
    TPOT_BOUNDS,
    TTFT_BOUNDS,
)
from sglang_obs.exporter.sglang_exposition import (
    MAX_FULL_CHARS,
    MAX_FULL_LINES,
    MAX_LINE_CHARS,
    MAX_LINES,
)

PREFIX = "sglang_obs_"

# `server` is the SGLang target's host:port. The exporter's scrape job copies it into `instance`
# (see prometheus/prometheus.yml), so derived series join native ones on (instance, model_name).
SERVER = ("server",)
SERVER_MODEL = ("server", "model_name")
# Request-record series: per server, model and prompt-length class (a fixed set of values).
SERVER_MODEL_CLASS = ("server", "model_name", "prompt_class")
# Container series carry the server they run (empty when not mapped), so they join on instance.
CONTAINER = ("container", "server")
GPU = ("gpu", "uuid")

# Per-GPU constants NVML reports, as gpu_info labels in base units (Hz, lanes): no rule or ratio
# computes with them, so they need no series of their own (see SERIES_CHANGES below).
GPU_LIMITS = ("sm_clock_max_hertz", "memory_clock_max_hertz", "pcie_link_generation_max",
              "pcie_link_width_max")

CONFIG_INFO_LABELS = (
    "version",
    "tp_size",
    "dp_size",
    "pp_size",
    "schedule_policy",
    "kv_cache_dtype",
    "speculative_algorithm",
    "mixed_chunk",
    "disaggregation_mode",
)


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed (counters end in _total, info metrics in _info)
    kind: str  # gauge | counter | histogram | info
    labels: tuple[str, ...]
    help: str
    group: str

    def family(self, extra_labels: tuple[str, ...] = ()):
        labels = [*self.labels, *extra_labels]
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.help, labels=labels)
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=labels)
        if self.kind == "histogram":
            return HistogramMetricFamily(self.name, self.help, labels=labels)
        return InfoMetricFamily(self.name.removesuffix("_info"), self.help, labels=labels)


def _m(name, kind, labels, help_, group):
    return MetricSpec(PREFIX + name, kind, labels, help_, group)


HEALTH = "Exporter health"
LOG = "Scheduler log"
REQUESTS = "Request records"
CONTAINERS = "Containers"
GPUS = "GPUs"
LOAD = "Derived load signals"
CONFIG = "Effective server configuration"

METRICS: tuple[MetricSpec, ...] = (
    _m("exporter_build_info", "info", (), "Exporter version; value 1.", HEALTH),
    _m("collector_success", "gauge", ("collector",),
       "1 if the collector rendered its series in this scrape, else 0 (its series are then "
       "missing; the exporter log has the error).", HEALTH),
    _m("collector_duration_seconds", "gauge", ("collector",),
       "Time the collector took to render its series in this scrape.", HEALTH),
    _m("up", "gauge", SERVER,
       "1 if the last poll got a valid answer from the SGLang server (/metrics or the load "
       "endpoint), else 0; /server_info and /v1/models never change it.", HEALTH),
    _m("last_poll_success_timestamp_seconds", "gauge", SERVER,
       "Unix time of the last poll that got a valid answer.", HEALTH),
    _m("poll_duration_seconds", "gauge", SERVER,
       "Wall time of the last poll cycle (all endpoints).", HEALTH),
    _m("polls_total", "counter", SERVER, "Poll cycles run against the server.", HEALTH),
    _m("poll_errors_total", "counter", (*SERVER, "endpoint", "reason"),
       "Failed endpoint requests by endpoint (metrics, loads, server_info, models) and reason "
       "(connection_refused; timeout: no complete answer within --sglang.timeout; "
       "http_status: not 2xx, redirects included, none is followed; too_large: body, headers "
       "or trailers over their bounds; protocol: not HTTP/1.x framing; network; parse: not "
       "the expected payload, or a field of the wrong type, counted once per answer). A "
       "pair's series "
       "appears with its first failure (no zeros are pre-filled: no rule needs them), so "
       "rate()/increase() count from its second; the series' existence shows the first.",
       HEALTH),
    _m("native_lines_dropped_total", "counter", (*SERVER, "reason"),
       "Lines of the server's /metrics answers not used, by reason: malformed (not a readable "
       f"sample) or over_limit (a line over {MAX_LINE_CHARS:,} characters, or one after "
       f"the scan's bounds per answer: {MAX_LINES:,} lines, {MAX_FULL_LINES:,} or "
       f"{MAX_FULL_CHARS >> 20} Mi characters read in full). A reason's series appears with "
       "its first dropped line.", HEALTH),
    _m("derived_values_dropped_total", "counter", (*SERVER, "signal"),
       "Values of a derived signal (kv_used_tokens, kv_occupancy_ratio, running_requests, "
       "...) dropped because they were outside their domain: not finite, a negative count or "
       "token number, a ratio outside [0, 1]. The signal then has no series (or one from the "
       "next source); a signal's series appears with its first drop.", HEALTH),
    _m("glance_values_hidden_total", "counter", ("reason",),
       "Numbers the glance page (/, /api/v1/status's display strings) showed as — because "
       "they could not be shown, by reason: not_finite (NaN, ±Inf, e.g. a sum over a 1e-320 "
       "count), negative (a count, duration, rate or ratio below 0), too_large (a count over "
       f"{shown.MAX_COUNT:.0e}, a duration over {shown.MAX_SECONDS:.0e} s, a rate over "
       f"{shown.MAX_RATE:.0e}), not_a_ratio (outside [0, 1] by more than "
       f"{shown.RATIO_TOLERANCE:g}), not_a_number. Counted each time the page's status is "
       "computed (at most once a second, however many pages are open), so a value that stays "
       "absurd keeps counting; a reason's series appears with its first hidden value.",
       HEALTH),
    _m("native_metrics_info", "info", (*SERVER, "spelling"),
       "How the server's own /metrics names its series: spelling is colon (sglang:), "
       "underscore (sglang_), mixed, or none (no SGLang series: metrics off or not yet "
       "reported).", HEALTH),
    _m("scheduler_metrics_present", "gauge", SERVER,
       "1 if the last /metrics answer had SGLang scheduler series (num_running_reqs, "
       "num_queue_reqs), else 0.", HEALTH),
    _m("kv_used_tokens", "gauge", SERVER_MODEL,
       "KV pool tokens in use, excluding evictable radix-cache tokens, summed over DP ranks.",
       LOAD),
    _m("kv_capacity_tokens", "gauge", SERVER_MODEL,
       "KV pool capacity in tokens (effective max_total_num_tokens), summed over DP ranks.",
       LOAD),
    _m("kv_occupancy_ratio", "gauge", SERVER_MODEL,
       "KV pool used / capacity at full resolution (0-1); SGLang's token_usage is rounded to "
       "0.01.", LOAD),
    _m("running_requests", "gauge", SERVER_MODEL,
       "Requests in the running batch, summed over DP ranks (live, from the load endpoint "
       "where the release has it).", LOAD),
    _m("waiting_requests", "gauge", SERVER_MODEL,
       "Requests in the waiting queue, summed over DP ranks (live where the release has a load "
       "endpoint).", LOAD),
    _m("max_running_requests", "gauge", SERVER_MODEL,
       "Effective maximum of running requests, summed over DP ranks (not the CLI flag).", LOAD),
    _m("running_requests_ratio", "gauge", SERVER_MODEL,
       "Running requests / effective maximum (0-1).", LOAD),
    _m("decode_speed_per_request_tokens_per_second", "gauge", SERVER_MODEL,
       "Generation throughput divided by running requests: decode speed one user sees. "
       "Absent while nothing runs.", LOAD),
    _m("prefill_backlog_tokens", "gauge", SERVER_MODEL,
       "Prompt tokens waiting to be prefilled (uncached), summed over DP ranks. Absent on "
       "releases without it in the load endpoint.", LOAD),
    _m("pd_queue_requests", "gauge", (*SERVER_MODEL, "queue"),
       "Requests in a prefill/decode disaggregation queue, summed over DP ranks, live from the "
       "load endpoint's disaggregation block (0.5.8+). A prefill server has queue bootstrap "
       "(waiting for the handshake with the decode side and its KV preallocation) and inflight "
       "(prefilled, KV being sent); a decode server prealloc (waiting for bootstrap and a KV "
       "allocation), transfer (KV on its way from the prefill server) and retracted (taken out "
       "of the running batch when the KV pool ran out, waiting to resume). Only the queues of "
       "the server's role; absent on unified servers and on releases without the block.",
       LOAD),
    _m("queue_nonempty_duration_seconds", "gauge", SERVER_MODEL,
       "How long the waiting queue has been continuously non-empty, as of the last poll; 0 "
       "when empty.", LOAD),
    _m("queue_nonempty_run_duration_seconds", "histogram", SERVER_MODEL,
       "Durations of completed runs of a continuously non-empty waiting queue.", LOAD),
    _m("queue_nonempty_seconds_total", "counter", SERVER_MODEL,
       "Total seconds the waiting queue was observed non-empty.", LOAD),
    # -- scheduler log (exporter/log_stats.py) ---------------------------------------------------
    _m("log_source_up", "gauge", (*SERVER, "source"),
       "1 if the log source (file or container stream) is being read, else 0.", LOG),
    _m("log_lines_total", "counter", (*SERVER, "kind"),
       "Scheduler log lines read, by kind (prefill, decode, retraction, capacity, ready, "
       "health_check_failed, other, unparsed: garbled or not SGLang's); a kind's series appears "
       "with its first line.", LOG),
    _m("log_rotations_total", "counter", SERVER,
       "Times the followed log file was rotated or truncated.", LOG),
    _m("log_dropped_lines_total", "counter", (*SERVER, "reason"),
       "Log lines not parsed, by reason: too_long (over 64 KiB, skipped unread) or not_sglang "
       "(not starting with SGLang's log prefix after a known wrapper); also counted as "
       "log_lines_total{kind=\"unparsed\"}. A reason's series appears with its first line.",
       LOG),
    _m("log_prefill_batches_total", "counter", SERVER, "Prefill batch lines.", LOG),
    _m("log_prefill_new_tokens_total", "counter", SERVER,
       "Prompt tokens computed by prefill (#new-token).", LOG),
    _m("log_prefill_cached_tokens_total", "counter", SERVER,
       "Prompt tokens reused from the prefix cache (#cached-token).", LOG),
    _m("log_decode_reports_total", "counter", SERVER,
       "Decode batch lines (one per decode-log-interval iterations).", LOG),
    _m("log_retracted_requests_total", "counter", SERVER,
       "Requests retracted because the KV pool was full (retraction warnings).", LOG),
    _m("log_health_check_failures_total", "counter", SERVER,
       "Health check failures logged by SGLang.", LOG),
    _m("log_pending_prefill_tokens", "gauge", SERVER,
       "#pending-token of the last prefill line, summed over DP ranks (0.5.12+).", LOG),
    _m("log_queue_requests", "gauge", SERVER,
       "#queue-req of the last batch line, summed over DP ranks.", LOG),
    _m("log_running_requests", "gauge", SERVER,
       "#running-req of the last batch line, summed over DP ranks.", LOG),
    _m("log_running_batch_tokens", "gauge", SERVER,
       "#token of the last decode line: KV tokens of the running batch (the full-token working "
       "set), summed over DP ranks.", LOG),
    _m("log_input_throughput_tokens_per_second", "gauge", SERVER,
       "input throughput of the last prefill line, summed over DP ranks.", LOG),
    _m("log_gen_throughput_tokens_per_second", "gauge", SERVER,
       "gen throughput of the last decode line, summed over DP ranks.", LOG),
    _m("log_spec_accept_length", "gauge", SERVER,
       "accept len of the last decode line (speculative decoding only).", LOG),
    _m("log_prefill_context_tokens", "histogram", SERVER,
       "Context of each whole prompt: cached + new tokens of its single-request prefill, "
       "or of the run of chunks chunked prefill splits it into.", LOG),
    _m("log_capacity_tokens", "gauge", SERVER,
       "max_total_num_tokens from the start-up line: effective KV capacity of one DP rank.",
       LOG),
    _m("log_max_running_requests", "gauge", SERVER,
       "max_running_requests from the start-up line: the effective limit of one DP rank.", LOG),
    _m("log_ready_timestamp_seconds", "gauge", SERVER,
       "Time of the last 'ready to roll' line (the last start).", LOG),
    _m("log_last_line_timestamp_seconds", "gauge", SERVER,
       "Time printed on the last parsed line (SGLang's local time read as this host's).", LOG),
    # -- request records (exporter/request_follow.py, request_records.py) ---------------------
    _m("request_source_up", "gauge", SERVER,
       "1 if the --sglang.request-metrics-dir directory can be listed (with or without a record "
       "file yet), else 0.", REQUESTS),
    _m("request_records_total", "counter", SERVER,
       "Request records read and used (one per finished request SGLang wrote since the "
       "exporter started; records already in the newest file at start are not counted).",
       REQUESTS),
    _m("request_records_rejected_total", "counter", (*SERVER, "reason"),
       "Records skipped, by reason: " + "; ".join(f"{k} ({v})" for k, v in
                                                 REJECT_REASONS.items())
       + f". too_long is over {MAX_RECORD_BYTES >> 20} MiB. A reason's series appears with "
       "its first record.", REQUESTS),
    _m("request_files_rejected_total", "counter", (*SERVER, "reason"),
       "Files of the directory named like a record file but refused, never opened, each counted "
       "once while it is there, by reason: " + "; ".join(f"{k} ({v})" for k, v in
                                                         FILE_REJECT_REASONS.items())
       + ". A reason's series appears with its first file.", REQUESTS),
    _m("request_file_rotations_total", "counter", SERVER,
       "New hourly record files followed, and truncations or replacements of the followed "
       "one.", REQUESTS),
    _m("request_last_finished_timestamp_seconds", "gauge", SERVER,
       "Finish time of the latest record (request_finished_ts, decode_finished_ts, or "
       "request_received_ts + e2e_latency); absent without --enable-metrics timing fields.",
       REQUESTS),
    _m("request_finished_total", "counter", (*SERVER_MODEL_CLASS, "finish_reason"),
       "Finished requests by prompt-length class (" + ", ".join(PROMPT_CLASSES) + ") and "
       "finish reason (" + ", ".join(FINISH_REASONS) + ": finish_reason.type, any other "
       "value is other). model_name is the polled server's.", REQUESTS),
    _m("request_prompt_tokens_total", "counter", SERVER_MODEL_CLASS,
       "Prompt tokens of finished requests (prompt_tokens), by prompt-length class.", REQUESTS),
    _m("request_cached_tokens_total", "counter", SERVER_MODEL_CLASS,
       "Prompt tokens served from the prefix cache (cached_tokens), by prompt-length class: "
       "cached share = rate(this) / rate(request_prompt_tokens_total).", REQUESTS),
    _m("request_ttft_seconds", "histogram", SERVER_MODEL_CLASS,
       "Time to first token per request by prompt-length class: prefill_finished_ts (0.5.6-"
       "0.5.9) or prefill_finished_time (later) minus request_received_ts; records without "
       "--enable-metrics timing have none. Buckets "
       + ", ".join(f"{b:g}" for b in TTFT_BOUNDS) + " s.", REQUESTS),
    _m("request_queue_time_seconds", "histogram", SERVER_MODEL_CLASS,
       "Waiting-queue time per request (queue_time) by prompt-length class. Buckets "
       + ", ".join(f"{b:g}" for b in QUEUE_BOUNDS) + " s.", REQUESTS),
    _m("request_e2e_latency_seconds", "histogram", SERVER_MODEL_CLASS,
       "End-to-end latency per request (e2e_latency) by prompt-length class. Buckets "
       + ", ".join(f"{b:g}" for b in E2E_BOUNDS) + " s.", REQUESTS),
    _m("request_time_per_output_token_seconds", "histogram", SERVER_MODEL_CLASS,
       "Per request (e2e - TTFT) / (completion_tokens - 1), finish reason stop or length and "
       "more than one output token (SGLang's request TPOT), by prompt-length class. Buckets "
       + ", ".join(f"{b:g}" for b in TPOT_BOUNDS) + " s.", REQUESTS),
    # -- containers (exporter/containers.py) ---------------------------------------------------
    _m("container_source_up", "gauge", (),
       "1 if the last Docker API poll succeeded, else 0.", CONTAINERS),
    _m("container_info", "info", (*CONTAINER, "image", "state", "health"),
       "Container identity and state; value 1.", CONTAINERS),
    _m("container_running", "gauge", CONTAINER, "1 if the container is running.", CONTAINERS),
    _m("container_restarts_total", "counter", CONTAINER,
       "Restarts by the restart policy since the container was created (Docker RestartCount).",
       CONTAINERS),
    _m("container_oom_kills_total", "counter", CONTAINER,
       "Exits by the kernel's OOM killer seen since the exporter started.", CONTAINERS),
    _m("container_oom_killed", "gauge", CONTAINER,
       "1 if the container's last exit was an OOM kill.", CONTAINERS),
    _m("container_last_exit_code", "gauge", CONTAINER, "Exit code of the last exit.",
       CONTAINERS),
    _m("container_healthy", "gauge", CONTAINER,
       "1 healthy, 0 unhealthy or starting; absent without a healthcheck.", CONTAINERS),
    _m("container_start_time_seconds", "gauge", CONTAINER,
       "When the container last started (Unix time).", CONTAINERS),
    # -- GPUs (exporter/nvml.py); the NVML call is named in each help -------------------------
    _m("gpu_collector_up", "gauge", (),
       "1 if NVML answered and at least one GPU was read in the last cycle, else 0 (no "
       "library, no driver, no GPU, or all lost).", GPUS),
    _m("gpu_device_count", "gauge", (), "GPUs NVML reports (nvmlDeviceGetCount).", GPUS),
    _m("gpu_collection_duration_seconds", "gauge", (),
       "Time the last sampling cycle took.", GPUS),
    _m("gpu_last_collection_success_timestamp_seconds", "gauge", (),
       "Unix time of the last cycle that read a GPU.", GPUS),
    _m("gpu_collection_errors_total", "counter", ("reason",),
       "NVML failures by reason (gpu_lost, unknown, gpu_not_found, driver_not_loaded, "
       "version_mismatch, uninitialized, library_not_found, other); a reason's series appears "
       "with its first failure.", GPUS),
    _m("gpu_nvml_inits_total", "counter", (), "NVML initialisations (nvmlInit), re-inits "
       "after a lost GPU included.", GPUS),
    _m("gpu_info", "info", (*GPU, "name", "pci_bus_id", "driver_version", "cuda_driver_version",
                            "mig_mode", *GPU_LIMITS, "clock_event_reasons"),
       "GPU identity (nvmlDeviceGetName, GetPciInfo, SystemGetDriverVersion, "
       "SystemGetCudaDriverVersion, GetMigMode) and its constant maxima: sm_clock_max_hertz, "
       "memory_clock_max_hertz (GetMaxClockInfo SM, MEM; Hz), pcie_link_generation_max, "
       "pcie_link_width_max (GetMaxPcieLinkGeneration, GetMaxPcieLinkWidth); "
       "clock_event_reasons: the comma-separated clock-event reasons NVML reports for this GPU "
       "(GetSupportedClocksEventReasons), empty if none, so no clock_event_active series there "
       "means unknown, not idle; a label is empty where NVML does not answer; value 1.", GPUS),
    _m("gpu_device_up", "gauge", GPU,
       "1 if the GPU was read in the last cycle, 0 if it is lost (GpuIsLost, Unknown, ...); "
       "kept for every GPU seen since start.", GPUS),
    _m("gpu_utilization_ratio", "gauge", GPU,
       "Share of time a kernel ran (nvmlDeviceGetUtilizationRates.gpu / 100). Not saturation. "
       "Absent with MIG on.", GPUS),
    _m("gpu_memory_utilization_ratio", "gauge", GPU,
       "Share of time the memory controller was busy (GetUtilizationRates.memory / 100); not "
       "memory fullness.", GPUS),
    _m("gpu_memory_used_bytes", "gauge", GPU,
       "Memory used (nvmlDeviceGetMemoryInfo v2 .used: matches nvidia-smi). SGLang "
       "preallocates, so this is high even when idle.", GPUS),
    _m("gpu_memory_reserved_bytes", "gauge", GPU,
       "Memory reserved by the driver (GetMemoryInfo v2 .reserved).", GPUS),
    _m("gpu_memory_total_bytes", "gauge", GPU, "Memory total (GetMemoryInfo .total).", GPUS),
    _m("gpu_temperature_celsius", "gauge", GPU,
       "GPU temperature (nvmlDeviceGetTemperatureV, else GetTemperature).", GPUS),
    _m("gpu_memory_temperature_celsius", "gauge", GPU,
       "HBM temperature (field NVML_FI_DEV_MEMORY_TEMP); absent on consumer GPUs.", GPUS),
    _m("gpu_power_watts", "gauge", GPU, "Power draw (nvmlDeviceGetPowerUsage, mW / 1000).",
       GPUS),
    _m("gpu_power_limit_watts", "gauge", GPU,
       "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit, mW / 1000).", GPUS),
    _m("gpu_energy_joules_total", "counter", GPU,
       "Energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption, mJ / 1000).", GPUS),
    _m("gpu_sm_clock_hertz", "gauge", GPU, "SM clock (nvmlDeviceGetClockInfo SM, MHz x 1e6); its "
       "maximum is gpu_info's sm_clock_max_hertz.", GPUS),
    _m("gpu_memory_clock_hertz", "gauge", GPU, "Memory clock (GetClockInfo MEM).", GPUS),
    _m("gpu_clock_event_active", "gauge", (*GPU, "reason"),
       "1 while a clock event (throttle) reason is active: gpu_idle, sw_power_cap, "
       "hw_slowdown, sw_thermal, hw_thermal, hw_power_brake, ... "
       "(nvmlDeviceGetCurrentClocksEventReasons). Only active reasons have a series: absent = "
       "not active (never 0), so alert on `max by (instance, gpu, uuid) (...{reason=~...}) == 1` "
       "and read a cleared reason as its series ending; the reasons this GPU can report are "
       "gpu_info's clock_event_reasons.", GPUS),
    _m("gpu_pcie_link_generation", "gauge", GPU,
       "Current PCIe link generation (GetCurrPcieLinkGeneration); its maximum is gpu_info's "
       "pcie_link_generation_max.", GPUS),
    _m("gpu_pcie_link_width", "gauge", GPU, "Current PCIe link width in lanes "
       "(GetCurrPcieLinkWidth); its maximum is gpu_info's pcie_link_width_max.", GPUS),
    _m("gpu_pcie_link_downgraded", "gauge", GPU,
       "1 if the PCIe link runs below its maximum width or generation (current < "
       "GetMaxPcieLinkWidth, GetMaxPcieLinkGeneration, same NVML cycle), else 0; absent where "
       "NVML answers neither pair. Links may downshift at idle to save power.", GPUS),
    _m("gpu_pcie_replay_errors_total", "counter", GPU,
       "PCIe replays, a signal-integrity problem (nvmlDeviceGetPcieReplayCounter).", GPUS),
    _m("gpu_ecc_errors_volatile_total", "counter", (*GPU, "type"),
       "ECC errors since the driver loaded, type corrected|uncorrected "
       "(nvmlDeviceGetTotalEccErrors VOLATILE); absent without ECC.", GPUS),
    _m("gpu_ecc_errors_aggregate_total", "counter", (*GPU, "type"),
       "ECC errors over the GPU's lifetime (GetTotalEccErrors AGGREGATE).", GPUS),
    _m("gpu_remapped_rows_total", "counter", (*GPU, "type"),
       "Rows remapped, type correctable|uncorrectable (nvmlDeviceGetRemappedRows); Ampere+, "
       "absent with MIG on.", GPUS),
    _m("gpu_remapped_rows_pending", "gauge", GPU,
       "1 if a remap waits for a GPU reset (GetRemappedRows).", GPUS),
    _m("gpu_remapped_rows_failure", "gauge", GPU,
       "1 if row remapping failed: NVIDIA's RMA criterion (GetRemappedRows).", GPUS),
    _m("gpu_xid_errors_total", "counter", (*GPU, "xid"),
       "Xid events since the exporter started (nvmlEventSetWait; GpuIsLost counts as 79).",
       GPUS),
    _m("gpu_xid_last_timestamp_seconds", "gauge", (*GPU, "xid"),
       "When each Xid was last seen (Unix time): alert on this, not on the counter.", GPUS),
    _m("gpu_sm_active_ratio", "gauge", GPU, "SM activity (GPM SM_UTIL / 100); Hopper+.", GPUS),
    _m("gpu_sm_occupancy_ratio", "gauge", GPU, "SM occupancy (GPM SM_OCCUPANCY / 100).", GPUS),
    _m("gpu_tensor_active_ratio", "gauge", GPU, "Tensor core activity (GPM ANY_TENSOR_UTIL "
       "/ 100).", GPUS),
    _m("gpu_dram_bandwidth_ratio", "gauge", GPU, "DRAM bandwidth use (GPM DRAM_BW_UTIL / 100).",
       GPUS),
    _m("gpu_process_memory_bytes", "gauge", (*GPU, "server"),
       "GPU memory of compute processes summed per SGLang server, matched by process tree, "
       "never by command line; server \"\" when unmatched "
       "(nvmlDeviceGetComputeRunningProcesses; opt-in --collector.nvml.processes).", GPUS),
    _m("server_config_info", "info", (*SERVER_MODEL, *CONFIG_INFO_LABELS),
       "Effective server configuration from /server_info (changes only on restart); value 1.",
       CONFIG),
    _m("config_tp_size", "gauge", SERVER_MODEL, "Tensor-parallel size.", CONFIG),
    _m("config_dp_size", "gauge", SERVER_MODEL, "Data-parallel size.", CONFIG),
    _m("config_chunked_prefill_size_tokens", "gauge", SERVER_MODEL,
       "Resolved chunked_prefill_size (-1: chunking off).", CONFIG),
    _m("config_max_prefill_tokens", "gauge", SERVER_MODEL,
       "max_prefill_tokens: token budget of one prefill batch.", CONFIG),
    _m("config_context_length_tokens", "gauge", SERVER_MODEL,
       "Effective context length in tokens.", CONFIG),
    _m("config_mixed_chunk_enabled", "gauge", SERVER_MODEL,
       "1 if mixed chunked prefill is effectively on (speculative decoding turns it off).",
       CONFIG),
    _m("config_num_continuous_decode_steps", "gauge", SERVER_MODEL,
       "num_continuous_decode_steps: decode steps the scheduler runs in a row before it looks "
       "at the waiting queue again.", CONFIG),
)

BY_NAME = {spec.name: spec for spec in METRICS}

# Series removed, merged or changed to carry the same facts in fewer series, and the ones kept
# on purpose, with why: (series, comma-separated; change; why), listed in docs/metrics.md.
# Counted by bench/series_count.py.
SERIES_CHANGES: tuple[tuple[str, str, str], ...] = (
    ("sglang_obs_gpu_clock_event_active",
     "changed: a series only for an active reason (value 1); an inactive reason has none "
     "instead of a 0 (64 series to 2 on the 8-GPU H200 test machine)",
     "8 reasons per GPU were almost all 0. The alert GPUThermalThrottling "
     "(`max by (instance, gpu, uuid) (...{reason=~\"...\"}) == 1`) and the dashboard's "
     "reason timeline (`... > 0`) only ever read the 1s, and a cleared reason ends its series, "
     "which resolves the alert. Absent = not active. The reasons a GPU can report, which the "
     "zeros used to show, are gpu_info's clock_event_reasons label."),
    ("sglang_obs_gpu_sm_clock_max_hertz, sglang_obs_gpu_memory_clock_max_hertz",
     "removed: merged into sglang_obs_gpu_info labels sm_clock_max_hertz, "
     "memory_clock_max_hertz (Hz)",
     "Constant per GPU; no rule or ratio used them, only a dashed reference line. The GPUs "
     "dashboard shows them in its inventory table."),
    ("sglang_obs_gpu_pcie_link_generation_max, sglang_obs_gpu_pcie_link_width_max",
     "removed: merged into sglang_obs_gpu_info labels pcie_link_generation_max, "
     "pcie_link_width_max; the comparison GPUPCIeLinkDegraded made is the new "
     "sglang_obs_gpu_pcie_link_downgraded",
     "Constant per GPU. Their one numeric use, `pcie_link_width < pcie_link_width_max or "
     "pcie_link_generation < pcie_link_generation_max`, now happens in the exporter, on the same "
     "NVML cycle: one 0/1 series per GPU instead of two maxima. Query: "
     "`sglang_obs_gpu_pcie_link_downgraded == 1`."),
    ("sglang_obs_gpu_pcie_link_downgraded",
     "added: 1 if the link runs below its maximum width or generation, else 0",
     "Replaces the two maxima in the alert and the dashboard (see above)."),
    ("sglang_obs_gpu_info",
     "changed: new labels sm_clock_max_hertz, memory_clock_max_hertz, "
     "pcie_link_generation_max, pcie_link_width_max, clock_event_reasons",
     "Carries the constants above at no extra series; they change only with the hardware or "
     "driver."),
    ("sglang_obs_poll_errors_total",
     "changed: no pre-filled zeros; a (server, endpoint, reason) series appears with its first "
     "failure (24 zero series per server before)",
     "No rule reads it: the alerts use sglang_obs_up. rate()/increase() count failures from a "
     "pair's second one; the series' existence shows the first."),
    ("sglang_obs_gpu_collection_errors_total",
     "changed: no pre-filled zeros; a reason appears with its first NVML failure (8 zero "
     "series per host before)",
     "No rule reads it: GPULost uses sglang_obs_gpu_device_up and sglang_obs_gpu_collector_up."),
    ("sglang_obs_log_lines_total",
     "changed: no pre-filled zeros; a kind appears with its first line (8 kinds per followed "
     "log before)",
     "No rule reads it; the dashboard plots the rate by kind."),
    ("sglang_obs_gpu_memory_total_bytes, sglang_obs_gpu_power_limit_watts",
     "kept as gauges (constant, or nearly, per GPU)",
     "memory_total is the denominator of the memory-used ratio panels and of sglang-snapshot; "
     "the enforced power limit changes at runtime (nvidia-smi -pl, datacenter power capping) "
     "and the Power panel plots the draw against it."),
    ("sglang_obs_container_restarts_total, sglang_obs_container_oom_kills_total, "
     "sglang_obs_gpu_ecc_errors_volatile_total",
     "kept: present (at 0) before the first event",
     "Rules take increase() of them (SGLangContainerRestarting, SGLangOOMKilled, "
     "GPUUncorrectableECC): without a sample before the first event, increase() would miss it."),
)


def _listed(values, case=str) -> str:
    return ", ".join(f"`{case(v)}`" for v in sorted(values))


# How label values that come from an SGLang server are made safe (exporter/labels.py).
LABEL_VALUES_SECTION = [
    "## Label values that come from SGLang", "",
    "`model_name` and the `sglang_obs_server_config_info` labels are chosen by the server (or "
    "by something posing as one), so they are checked before they become label values:", "",
    "- **Length and characters.** A value of at most 128 printable characters is kept as it "
    "is. A longer one, or one holding a control or other non-printable character, becomes its "
    "first 100 characters (each non-printable one as `_`), `~` and the first 12 hex digits of "
    "the SHA-256 of the whole value, e.g. `aaaa…aaaa~3f9a0c1b2d4e`.",
    "- **Paths.** A `model_name` that is a local path (it starts with `/`, `~` or `.`, or holds "
    "`\\`, `://` or more than one `/`) is reduced to its last component: "
    "`/models/Qwen3.6-27B` becomes `Qwen3.6-27B`. A Hugging Face id (`Qwen/Qwen3-32B`, one `/`) "
    "is kept, so it still equals the `model_name` label of SGLang's own series; for a local "
    "path SGLang's own series carry the full path, so join those on `instance` alone.",
    "- **Credentials.** A value that looks like one (`token=`, `key=`, `password`, `secret`, "
    "`bearer`, a Hugging Face `hf_…`, `sk-…` or GitHub token, a JWT, URL userinfo "
    "`user:pw@`) is never exported, not even in part: it becomes `redacted`.",
    "- **Enumerated fields.** `version` must look like a release number (digits and dots, "
    "optionally `post`, `rc`, `dev`, `a`, `b` with a number: `0.4.6.post5`); "
    f"`schedule_policy` one of SGLang's policies ({_listed(labels.SCHEDULE_POLICIES)}); "
    f"`kv_cache_dtype` a known dtype ({_listed(labels.KV_CACHE_DTYPES)}); "
    f"`speculative_algorithm` a known algorithm "
    f"({_listed(labels.SPECULATIVE_ALGORITHMS, str.upper)}); `disaggregation_mode` "
    f"{_listed(labels.DISAGGREGATION_MODES)}. Any other value becomes `other`; an absent one "
    "is empty.",
    "",
]


def request_series_per_server() -> int:
    """Series one followed request-record directory adds (tests/test_request_records.py counts
    a real exposition against it)."""
    per_class = len(FINISH_REASONS) + 2  # finished by reason, prompt and cached tokens
    per_class += sum(len(b) + 3 for b in (TTFT_BOUNDS, QUEUE_BOUNDS, E2E_BOUNDS, TPOT_BOUNDS))
    return 4 + len(PROMPT_CLASSES) * per_class  # + up, records, rotations, last finished


def render_markdown() -> str:
    lines = [
        "# Exporter metrics",
        "",
        "Generated from `exporter/catalogue.py` by `make generate`; a test fails when this file",
        "is stale. Label `server` is the SGLang target's `host:port`;",
        "the exporter's scrape job copies it into `instance` so that derived series join SGLang's",
        "own series `on (instance, model_name)`.",
        "",
    ]
    for group in dict.fromkeys(spec.group for spec in METRICS):
        lines += [f"## {group}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for spec in (s for s in METRICS if s.group == group):
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
            lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.help} |")
        lines.append("")
    lines += [f"Request records are opt-in (`--sglang.request-metrics-dir`): "
              f"{request_series_per_server()} series per followed server (every prompt class "
              "and class x finish reason present from the start; the last-finished time from "
              "the first timed record), plus one per reject reason seen (of records, and of files "
              "refused). Fields, releases and "
              "privacy: [request-records.md](request-records.md).",
              ""]
    lines += LABEL_VALUES_SECTION
    lines += ["## Series removed or merged, and why", "",
              "Changes that carry the same facts in fewer series (each series is in the tables "
              "above as it is now), and the series kept on purpose. Counted with "
              "`bench/series_count.py` (tests/test_series_count.py checks the \"after\" "
              "figures): 8 H200 GPUs and one TP8 server, 410 series before, 293 after; with "
              "eight DP1 servers, 858 before, 580 after.", "",
              "| series | change | why |", "|---|---|---|"]
    for series, change, why in SERIES_CHANGES:
        names = ", ".join(f"`{n}`" for n in series.split(", "))
        lines.append(f"| {names} | {change} | {why} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
