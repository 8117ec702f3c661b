"""SGLang 0.5.23: collectors in sglang/srt/observability/metrics_collector.py, created after
`runtime_context.publish` (the process-wide configuration) as its scheduler and tokenizer do."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from drivers.common import (
    FINISHED,
    MAX_TOTAL_TOKENS,
    MODEL,
    PREFILL_CACHED_TOKENS,
    PREFILL_NEW_SEQS,
    PREFILL_NEW_TOKENS,
    RUNNING,
    SPEC_CORRECT_DRAFTS,
    STARTUP_TIME,
    TP,
    USED_TOKENS,
    VARIANTS,
    WAITING,
    capture_log,
    fixed_clock,
    http_routes,
    http_traffic,
    logs_decode,
    logs_prefill,
    model_dir,
    print_defined,
    request_records,
    run_server,
    stats_scheduler,
)


def server_args(flags: dict):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model_dir(), served_model_name=MODEL, tp_size=TP,
                      enable_metrics=True, skip_tokenizer_init=True, device="cuda", random_seed=42,
                      **flags)


def _scheduler_rank(rank: int, flags: dict) -> None:
    """One TP rank's scheduler process: its collectors as the scheduler creates them."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.observability import metrics_collector as mc

    sa = server_args(flags)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank, gpu_id=rank))
    ctx = mc.SchedulerMetricsCollector.init_new(
        server_args=sa, enable_priority_scheduling=bool(sa.enable_priority_scheduling),
        enable_lora=bool(sa.enable_lora), enable_hierarchical_cache=bool(
            sa.enable_hierarchical_cache))
    c = ctx.collector
    c.emit_constants(
        max_total_num_tokens=MAX_TOTAL_TOKENS, max_total_num_tokens_swa=None,
        weight_memory_usage_gb=8.2, kv_cache_memory_usage_gb=56.6,
        graph_memory_usage_gb={"decode": 1.4}, max_running_requests_under_SLO=None,
        page_size=1, num_pages=MAX_TOTAL_TOKENS, context_len=40960,
        startup_available_gpu_memory_gb=78.9)
    # The radix cache (default prefix cache) of every rank.
    cache = mc.RadixCacheMetricsCollector(labels=mc.radix_cache_metric_labels(
        "RadixCache", rc.get_parallel(), False))
    cache.increment_eviction_num_tokens(3072)
    cache.observe_eviction_duration(0.0021)
    if not ctx.current_scheduler_metrics_enabled:
        return
    by_priority = ({0: RUNNING - 4, 1: 4} if sa.enable_priority_scheduling else None)
    waiting_by = ({0: WAITING - 1, 1: 1} if sa.enable_priority_scheduling else None)
    spec = bool(sa.speculative_algorithm)
    pd = sa.disaggregation_mode
    stats = mc.SchedulerStats(
        num_running_reqs=mc.QueueCount(RUNNING, by_priority),
        num_queue_reqs=mc.QueueCount(WAITING, waiting_by),
        gen_throughput=1480.0, cache_hit_rate=0.31, decode_sum_seq_lens=USED_TOKENS,
        token_usage=USED_TOKENS / MAX_TOTAL_TOKENS,
        full_token_usage=USED_TOKENS / MAX_TOTAL_TOKENS, num_used_tokens=USED_TOKENS,
        kv_available_tokens=MAX_TOTAL_TOKENS - USED_TOKENS - 20_000,
        kv_evictable_tokens=20_000, kv_used_tokens=USED_TOKENS,
        spec_accept_length=2.7 if spec else 0.0, spec_accept_rate=0.57 if spec else 0.0,
        spec_num_steps=3 if spec else 0, spec_num_draft_tokens=4 if spec else 0,
        num_prefill_bootstrap_queue_reqs=mc.QueueCount(2 if pd == "prefill" else 0),
        num_prefill_inflight_queue_reqs=mc.QueueCount(3 if pd == "prefill" else 0),
        num_decode_prealloc_queue_reqs=mc.QueueCount(2 if pd == "decode" else 0),
        num_decode_transfer_queue_reqs=mc.QueueCount(1 if pd == "decode" else 0),
        kv_transfer_speed_gb_s=18.5 if pd else 0.0, kv_transfer_latency_ms=41.0 if pd else 0.0,
        utilization=0.83, fwd_occupancy=0.91, new_token_ratio=0.42, is_cuda_graph=1,
        lora_pool_slots_used=2 if sa.enable_lora else 0,
        lora_pool_slots_total=4 if sa.enable_lora else 0,
        lora_pool_utilization=0.5 if sa.enable_lora else 0.0,
        hicache_host_used_tokens=610_000 if sa.enable_hierarchical_cache else 0,
        hicache_host_total_tokens=1_648_000 if sa.enable_hierarchical_cache else 0)
    c.log_stats(stats)
    c.increment_realtime_tokens(None, prefill_compute_tokens=41_000,
                                prefill_cache_tokens=14_000, decode_tokens=88_000)
    c.increment_effective_prefill_tokens(55_000, 14_000, 0, 0)
    c.increment_forward_execution_seconds("prefill", 9.5)
    c.increment_forward_execution_seconds("decode", 41.2)
    c.increment_scheduler_idle_seconds(4.1)
    c.increment_scheduler_process_cpu_seconds(47.0)
    c.increment_scheduler_stage_seconds("forward", 50.7)
    for _ in range(30):
        c.increment_decode_cuda_graph_pass(True)
    c.increment_prefill_cuda_graph_pass(False)
    for i in range(len(FINISHED)):
        c.observe_queue_time(0.05 + 0.01 * i)
        c.observe_per_stage_req_latency("prefill_forward", 0.15 + 0.002 * i)
    c.increment_retracted_reqs(1, 9000, 300)
    if pd:
        c.observe_kv_transfer_metrics(latency_ms=41.0, total_mb=740.0, speed_gb_s=18.5)
        c.observe_kv_transfer_bootstrap(bootstrap_ms=3.1, alloc_ms=0.4)
        c.increment_bootstrap_failed_reqs()
        c.increment_transfer_failed_reqs()
    if sa.enable_hierarchical_cache:
        cache.increment_load_back_num_tokens(8192, "host")
        cache.observe_load_back_duration(0.004)
        cache.increment_backup_num_tokens(16384, "host")
        cache.observe_backup_duration(0.006)


def _tokenizer(flags: dict, grammar: bool) -> None:
    """The tokenizer process: the request metrics, HTTP metrics and startup times."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
    from sglang.srt.observability.func_timer import enable_func_timer
    from sglang.srt.observability.http_request_metrics import (
        add_http_request_metrics_middleware,
        init_http_request_metrics,
    )

    sa = server_args(flags)
    rc.publish(sa, role="tokenizer")
    enable_func_timer()
    init_http_request_metrics()
    start_cpu_monitor_thread("tokenizer", interval=0.05)
    http_traffic(add_http_request_metrics_middleware)
    c = mc.TokenizerMetricsCollector(server_args=sa, labels=mc.tokenizer_metric_labels())
    c.emit_startup_time({"load_weight": 21.4, "kv_cache_allocation": 2.2,
                         "scheduler_e2e": 61.0, "tokenizer_e2e": 3.1,
                         "cuda_graph": {"decode": 14.5}})
    labels = dict(c.labels)
    for i, (prompt, gen, cached, e2e, ttft, itl) in enumerate(FINISHED):
        c.observe_time_to_first_token(labels, ttft, stream=i % 4 != 0)
        c.observe_inter_token_latency(labels, itl * (gen - 1), gen - 1)
        c.observe_one_finished_request(
            labels, prompt, gen, cached, e2e, has_grammar=grammar and i % 5 == 0,
            cached_tokens_details={"device": cached, "host": 0} if cached else None,
            is_streaming=i % 4 != 0, time_per_output_token=itl,
            spec_verify_ct=gen // 3 if flags.get("speculative_algorithm") else 0)
    c.observe_one_aborted_request(labels)
    time.sleep(0.2)  # the CPU monitor's first readings


def _json_bodies(flags: dict, out: Path) -> None:
    """/server_info, /v1/loads and the HTTP routes, from the release's own builders."""
    from types import SimpleNamespace

    import sglang
    from sglang.srt import runtime_context as rc
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers import load_snapshot as ls
    from sglang.srt.managers.io_struct import GetInternalStateReq
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import build_server_info
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    sa = server_args(flags)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    mode = DisaggregationMode(sa.disaggregation_mode or "null")
    spec = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    scheduler = SimpleNamespace(
        startup_time=STARTUP_TIME, max_running_requests=256, max_total_num_tokens=MAX_TOTAL_TOKENS,
        swa_tokens_per_layer=None, startup_available_gpu_memory_gb=78.9, draft_worker=None,
        metrics_reporter=SimpleNamespace(last_gen_throughput=1480.0, step_time_dict={},
                                         spec_total_num_forward_ct=33_000,
                                         spec_total_num_accept_tokens=89_100),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=8.2),
                                  graph_memory_usage={"decode": 1.4},
                                  get_decode_cuda_graph_bs=lambda: [1, 2, 4, 8, 16, 32]),
        token_to_kv_pool_allocator=SimpleNamespace(
            get_kvcache=lambda: SimpleNamespace(mem_usage=56.6)),
        disaggregation_mode=mode, spec_algorithm=spec, rust_server=None)
    state = SchedulerInternalStateController(scheduler, record_step_time=False)
    internal = state.get_internal_state(GetInternalStateReq()).internal_state
    scheduler_info = {"status": "ready", "max_total_num_tokens": MAX_TOTAL_TOKENS,
                      "max_req_input_len": 40954, "startup_time": STARTUP_TIME}
    info = {**build_server_info(sa, scheduler_info), "startup_time": STARTUP_TIME,
            "internal_states": [internal], "version": sglang.__version__,
            "frontend": "python"}
    (out / "server_info.json").write_text(json.dumps(msgspec_to_builtins(info), indent=1,
                                                     sort_keys=True, default=str) + "\n")
    snapshot = ls.LoadSnapshot(
        dp_rank=0, timestamp=0.0, num_running_reqs=RUNNING, num_waiting_reqs=WAITING,
        num_waiting_uncached_tokens=9100, num_used_tokens=USED_TOKENS,
        num_total_tokens=USED_TOKENS + 9100, num_active_tokens=USED_TOKENS + 9100,
        max_total_num_tokens=MAX_TOTAL_TOKENS, max_running_requests=256,
        token_usage=round(USED_TOKENS / MAX_TOTAL_TOKENS, 4), gen_throughput=1480.0,
        cache_hit_rate=0.31, utilization=0.83,
        memory=ls.MemoryMetrics(weight_gb=8.2, kv_cache_gb=56.6, graph_gb=1.4,
                                token_capacity=MAX_TOTAL_TOKENS),
        disaggregation=ls.DisaggregationMetrics(mode=mode.value),
        queues=ls.QueueMetrics(waiting=WAITING, grammar=0, paused=0, retracted=0,
                               prealloc_ready=0),
        total_prefill_uncached_tokens=41_000, total_prefill_busy_us=9_500_000,
        decode_moments=[88_000.0, 41.2, 0.031])
    loads = {"timestamp": "2026-12-03T00:00:00+00:00", "version": sglang.__version__,
             "accelerator": "NVIDIA H200", "num_accelerators": TP,
             "loads": [snapshot.to_dict()]}
    (out / "v1_loads.json").write_text(json.dumps(loads, indent=1, sort_keys=True) + "\n")
    (out / "routes.json").write_text(json.dumps(http_routes(), indent=1) + "\n")


def _log_lines(flags: dict, out: Path) -> None:
    """The stats rank's prefill and decode lines, from SchedulerMetricsReporter's own
    report_prefill_stats / report_decode_stats over the scheduler state they read."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context as rc
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components import metrics_reporter as mr
    from sglang.srt.managers.scheduler_components.pool_stats_observer import PoolStats
    from sglang.srt.observability.metrics_collector import QueueCount
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import configure_logger

    sa = server_args(flags)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    stream = capture_log(configure_logger, sa)
    fixed_clock(mr)
    scheduler, batch = stats_scheduler(
        sa, DisaggregationMode, SpeculativeAlgorithm, PoolStats, draft_worker=None,
        enable_priority_scheduling=bool(sa.enable_priority_scheduling),
        kv_events_publisher=SimpleNamespace(publish_kv_events=lambda: None))
    scheduler.pool_stats_observer = SimpleNamespace(get_pool_stats=scheduler.get_pool_stats)
    # The reporter holds the scheduler and its own counters (the same names as the scheduler
    # held them in 0.5.12).
    r = mr.SchedulerMetricsReporter.__new__(mr.SchedulerMetricsReporter)
    r.__dict__.update(
        vars(scheduler), scheduler=scheduler, decode_log_interval=sa.decode_log_interval,
        spec_num_correct_drafts=SPEC_CORRECT_DRAFTS, spec_num_cap_tokens=0,
        spec_num_block_accept_tokens=0,
        _update_decode_queue_stats=lambda priority_enabled: None)
    if logs_prefill(sa):
        r.report_prefill_stats(batch, mr.PrefillStats(
            log_input_tokens=PREFILL_NEW_TOKENS, log_hit_tokens=PREFILL_CACHED_TOKENS,
            new_token_ratio=0.42, num_running_reqs=QueueCount(RUNNING),
            num_new_seqs=PREFILL_NEW_SEQS), can_run_cuda_graph=False)
    if logs_decode(sa):
        r.report_decode_stats(can_run_cuda_graph=True, running_batch=batch)
    (out / "scheduler.log").write_text(stream.getvalue())


def _request_records(flags: dict, grammar: bool, out: Path) -> None:
    """The records of `--export-metrics-to-file` (common.request_records)."""
    import tempfile

    from sglang.srt import runtime_context as rc
    from sglang.srt.managers import tokenizer_manager as tm
    from sglang.srt.managers.io_struct import BatchTokenIDOutput, GenerateReqInput
    from sglang.srt.observability import req_time_stats as rts

    folder = tempfile.mkdtemp(prefix="sglang-records-")
    sa = server_args({**flags, "export_metrics_to_file": True,
                      "export_metrics_to_file_dir": folder})
    rc.publish(sa, role="tokenizer")
    request_records(sa, tm, rts, BatchTokenIDOutput, GenerateReqInput, grammar, folder, out)


def _detokenizer(flags: dict) -> None:
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread

    start_cpu_monitor_thread("detokenizer", interval=0.05)
    time.sleep(0.2)


def drive(variant: str, flags: dict, out: Path) -> dict:
    def middleware():
        from sglang.srt.utils.common import add_prometheus_middleware

        return add_prometheus_middleware

    return run_server(variant, flags, out, scheduler_rank=_scheduler_rank, tokenizer=_tokenizer,
                      json_bodies=_json_bodies, middleware=middleware, detokenizer=_detokenizer,
                      log_lines=_log_lines, request_records=_request_records)


def define_all() -> None:
    """Every collector of the release, every feature on, in a plain registry (a fresh
    interpreter, no multiprocess directory): the families it defines, on stdout as JSON (a
    labelled family shows with no sample)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
    from sglang.srt.observability.http_request_metrics import init_http_request_metrics

    sa = server_args({**VARIANTS["priority"], **VARIANTS["lora"], **VARIANTS["hicache"]})
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    labels = {"model_name": MODEL, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
              "moe_ep_rank": 0, "priority": "", "dp_rank": 0}
    mc.SchedulerMetricsCollector(labels=labels, server_args=sa,
                                 enable_lora=True, enable_hierarchical_cache=True,
                                 enable_streaming_session=True)
    mc.TokenizerMetricsCollector(server_args=sa, labels=mc.tokenizer_metric_labels())
    mc.RadixCacheMetricsCollector(labels=mc.radix_cache_metric_labels(
        "RadixCache", rc.get_parallel(), False))
    mc.ExpertDispatchCollector(ep_size=2)
    for name in ("StorageMetricsCollector", "EncoderMetricsCollector"):
        cls = getattr(mc, name, None)
        if cls is not None:
            try:
                cls(labels={"model_name": MODEL}) if name == "EncoderMetricsCollector" else (
                    cls(labels={"model_name": MODEL}))
            except TypeError as err:
                print(f"{name}: {err}", file=sys.stderr)
    init_http_request_metrics()
    start_cpu_monitor_thread("tokenizer", interval=3600)
    print_defined()
