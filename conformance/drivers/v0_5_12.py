"""SGLang 0.5.12: collectors in sglang/srt/observability/metrics_collector.py, created as the
release creates them: the scheduler's `SchedulerMetricsMixin.init_metrics` (its labels: model,
engine type, TP/PP/MoE-EP rank, priority), the radix cache's
`BasePrefixCache.init_metrics_collector` (cache_type) and the tokenizer manager's
`init_metric_collector_watchdog`; requests reach the tokenizer's collector through its own
`collect_metrics`.

The modules that hold the scheduler, the tokenizer manager, the engine and the HTTP server
(managers/scheduler.py, tokenizer_manager.py, entrypoints/engine.py, http_server.py) import GPU
kernels (`sgl_kernel`) when imported, so the few methods needed from them are compiled one by one
from the release's own source file (`_release_function`) against the release's importable
objects, and run on stand-ins that hold only the state those methods read. The mixins that hold
the rest (SchedulerMetricsMixin, SchedulerRuntimeCheckerMixin, TokenizerControlMixin) and
/v1/loads (entrypoints/v1_loads.py) are the release's modules as they are."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

from drivers.common import (
    FINISHED,
    MAX_TOTAL_TOKENS,
    MODEL,
    PREFILL_CACHED_TOKENS,
    PREFILL_NEW_SEQS,
    PREFILL_NEW_TOKENS,
    RUNNING,
    TP,
    USED_TOKENS,
    VARIANTS,
    WAITING,
    capture_log,
    fixed_clock,
    http_routes,
    http_traffic,
    import_stand_ins,
    logs_decode,
    logs_prefill,
    model_dir,
    print_defined,
    request_records,
    run_server,
    stats_scheduler,
)

EVICTABLE_TOKENS = 20_000
WAITING_SEQLENS = (3000, 3000, 3100)  # the waiting requests' prompt lengths: 9,100 tokens
MAX_RUNNING_REQUESTS = 256
FIXED_TIMESTAMP = "2026-12-03T00:00:00+00:00"


def server_args(flags: dict):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model_dir(), served_model_name=MODEL, tp_size=TP,
                      enable_metrics=True, skip_tokenizer_init=True, device="cuda", random_seed=42,
                      **flags)


def _release_function(relpath: str, name: str, owner: str | None = None, **names):
    """Function `name` (a method of class `owner`) of sglang/<relpath>, compiled from the
    release's source without importing its module; `names` are the module globals it reads."""
    import __future__

    import ast

    import sglang

    path = Path(sglang.__file__).parent / relpath
    body = ast.parse(path.read_text()).body
    if owner:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                and n.name == name)
    node.decorator_list = []  # routes (@app.get) and auth wrappers: not the body
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace = dict(names)
    exec(code, namespace)
    return namespace[name]


# -- the scheduler -------------------------------------------------------------------------
def _scheduler(sa, tp_rank: int, metrics: bool):
    """One TP rank's scheduler: Scheduler.__init__'s rank arithmetic, then (metrics) its
    `init_metrics`, then the state its load and internal-state readers look at."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler_runtime_checker_mixin import (
        SchedulerRuntimeCheckerMixin,
    )
    from sglang.srt.observability import scheduler_metrics_mixin as smm
    from sglang.srt.server_args import (
        get_global_server_args,
        set_global_server_args_for_scheduler,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    set_global_server_args_for_scheduler(sa)
    names = {"get_global_server_args": get_global_server_args,
             "RECORD_STEP_TIME": smm.RECORD_STEP_TIME,
             "GetInternalStateReqOutput": GetInternalStateReqOutput}
    methods = {n: _release_function("srt/managers/scheduler.py", n, "Scheduler", **names)
               for n in ("get_internal_state", "get_init_info")}
    cls = type("Scheduler", (smm.SchedulerMetricsMixin, SchedulerRuntimeCheckerMixin), methods)
    s = cls.__new__(cls)
    # The engine's rank layout (entrypoints/engine.py) and Scheduler.__init__'s "Parse args".
    ranks = _release_function("srt/entrypoints/engine.py", "_compute_parallelism_ranks")
    s.attn_cp_rank, s.moe_dp_rank, s.moe_ep_rank = ranks(sa, tp_rank)
    s.server_args, s.tp_rank, s.tp_size = sa, tp_rank, sa.tp_size
    s.pp_rank, s.pp_size = 0, sa.pp_size
    s.dp_rank, s.dp_size, s.device, s.page_size = None, sa.dp_size, sa.device, sa.page_size
    s.enable_priority_scheduling = sa.enable_priority_scheduling
    s.enable_lora = sa.enable_lora
    s.enable_hierarchical_cache = sa.enable_hierarchical_cache
    s.enable_hisparse = sa.enable_hisparse
    s.spec_algorithm = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    s.attn_tp_rank, s.attn_tp_size, s.attn_dp_rank = compute_dp_attention_world_info(
        sa.enable_dp_attention, tp_rank, sa.tp_size, sa.dp_size, sa.attn_cp_size)
    s.disaggregation_mode = DisaggregationMode(sa.disaggregation_mode)
    if metrics:
        s.init_metrics(tp_rank, s.pp_rank, s.dp_rank)
    else:  # what init_metrics sets that the readers use
        s.step_time_dict, s.spec_num_accept_tokens, s.spec_num_forward_ct = {}, 0, 0
    # A loaded server: the pool, the queues, the memory, the decode statistics.
    s.max_total_num_tokens = MAX_TOTAL_TOKENS
    s.max_running_requests = MAX_RUNNING_REQUESTS
    s.max_req_input_len = 40954  # TpModelWorker: min(context - 1, pool - 1) - 5
    s.is_hybrid_swa = s.is_hybrid_ssm = False
    s.token_to_kv_pool_allocator = SimpleNamespace(
        available_size=lambda: MAX_TOTAL_TOKENS - USED_TOKENS - EVICTABLE_TOKENS,
        get_kvcache=lambda: SimpleNamespace(mem_usage=56.6))
    s.tree_cache = SimpleNamespace(evictable_size=lambda: EVICTABLE_TOKENS)
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=8.2,
                                                               graph_mem_usage=1.4))
    s.running_batch = SimpleNamespace(reqs=[SimpleNamespace(seqlen=0)] * RUNNING)
    s.waiting_queue = [SimpleNamespace(seqlen=n) for n in WAITING_SEQLENS]
    pd = sa.disaggregation_mode
    queued = SimpleNamespace(seqlen=1500)
    s.disagg_prefill_bootstrap_queue = SimpleNamespace(queue=[queued] * 2)
    s.disagg_prefill_inflight_queue = [queued] * 3
    s.disagg_decode_prealloc_queue = SimpleNamespace(queue=[queued] * 2, retracted_queue=[])
    s.disagg_decode_transfer_queue = SimpleNamespace(queue=[queued] * 1)
    s.last_gen_throughput = 1480.0
    spec = bool(sa.speculative_algorithm)
    s.spec_total_num_forward_ct = 33_000 if spec else 0
    s.spec_total_num_accept_tokens = 89_100 if spec else 0
    s.stats = _stats(sa, pd)
    return s


def _stats(sa, pd: str):
    """What the scheduler's last log interval measured (the numbers of every release)."""
    from sglang.srt.observability import metrics_collector as mc

    by_priority = {0: RUNNING - 4, 1: 4} if sa.enable_priority_scheduling else None
    waiting_by = {0: WAITING - 1, 1: 1} if sa.enable_priority_scheduling else None
    spec = bool(sa.speculative_algorithm)
    pd = pd if pd in ("prefill", "decode") else ""
    return mc.SchedulerStats(
        num_running_reqs=mc.QueueCount(RUNNING, by_priority),
        num_queue_reqs=mc.QueueCount(WAITING, waiting_by),
        gen_throughput=1480.0, cache_hit_rate=0.31, decode_sum_seq_lens=USED_TOKENS,
        token_usage=USED_TOKENS / MAX_TOTAL_TOKENS,
        full_token_usage=USED_TOKENS / MAX_TOTAL_TOKENS, num_used_tokens=USED_TOKENS,
        kv_available_tokens=MAX_TOTAL_TOKENS - USED_TOKENS - EVICTABLE_TOKENS,
        kv_evictable_tokens=EVICTABLE_TOKENS, kv_used_tokens=USED_TOKENS,
        spec_accept_length=2.7 if spec else 0.0, spec_accept_rate=0.57 if spec else 0.0,
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


def _prefix_cache(sa):
    """The prefix cache Scheduler.init_cache_with_memory_pool picks for Qwen3-8B (a plain KV
    pool), with the collector its constructor creates (None for ChunkCache, which has none)."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    if sa.chunked_prefill_size is not None and sa.disable_radix_cache:
        return None  # ChunkCache (a PD decode server without decode radix cache)
    cls = RadixCache
    if sa.enable_hierarchical_cache:
        # HiRadixCache (a RadixCache) lives in a module that imports GPU kernels; its collector
        # is the inherited one, labelled with the class's name: a subclass of that name.
        cls = type("HiRadixCache", (RadixCache,), {})
    cache = cls.__new__(cls)
    cache.init_metrics_collector()  # RadixCache.__init__ does this when metrics are on
    return cache.metrics_collector


def _scheduler_rank(rank: int, flags: dict) -> None:
    """One TP rank's scheduler process: its collectors as the scheduler creates them, fed
    through their own methods."""
    sa = server_args(flags)
    s = _scheduler(sa, rank, metrics=True)
    c = s.metrics_collector
    # Scheduler.init_memory_pool_and_cache: every rank, startup times passed as 0.0 by 0.5.12.
    c.emit_constants(
        max_total_num_tokens=MAX_TOTAL_TOKENS,
        max_running_requests_under_SLO=getattr(s, "max_running_requests_under_SLO", None),
        engine_startup_time=0.0, engine_load_weights_time=0.0, page_size=sa.page_size,
        num_pages=MAX_TOTAL_TOKENS // sa.page_size, context_len=40960,
        startup_available_gpu_memory_gb=78.9)
    cache = _prefix_cache(sa)
    if cache is not None:
        cache.increment_eviction_num_tokens(3072)
        cache.observe_eviction_duration(0.0021)
    if not s.current_scheduler_metrics_enabled:
        return
    pd = sa.disaggregation_mode
    c.log_stats(s.stats)
    c.increment_realtime_tokens(None, prefill_compute_tokens=41_000,
                                prefill_cache_tokens=14_000, decode_tokens=88_000)
    c.increment_forward_execution_seconds("prefill", 9.5)
    c.increment_forward_execution_seconds("decode", 41.2)
    for _ in range(30):
        c.increment_decode_cuda_graph_pass(True)
    c.increment_prefill_cuda_graph_pass(False)
    for i in range(len(FINISHED)):
        c.observe_queue_time(0.05 + 0.01 * i)
        c.observe_per_stage_req_latency("prefill_forward", 0.15 + 0.002 * i)
    c.increment_retracted_reqs(1, 9000, 300)
    if pd in ("prefill", "decode"):
        c.observe_kv_transfer_metrics(latency_ms=41.0, total_mb=740.0, speed_gb_s=18.5)
        c.observe_kv_transfer_bootstrap(bootstrap_ms=3.1, alloc_ms=0.4)
        c.increment_bootstrap_failed_reqs()
        c.increment_transfer_failed_reqs()
    if sa.enable_hierarchical_cache and cache is not None:
        cache.increment_load_back_num_tokens(8192)
        cache.observe_load_back_duration(0.004)


# -- the tokenizer -------------------------------------------------------------------------
class _TimeStats:
    """APIServerReqTimeStats' readings for one request (its clock is the traffic's)."""

    def __init__(self, ttft: float, e2e: float):
        self.ttft, self.e2e, self.interval = ttft, e2e, 0.0

    def get_first_token_latency(self) -> float:
        return self.ttft

    def get_interval(self) -> float:
        return self.interval

    def get_e2e_latency(self) -> float:
        return self.e2e

    def set_last_time(self) -> None:
        pass


def _tokenizer_manager(sa):
    """A TokenizerManager with the release's metric methods (tokenizer_manager.py) over its
    TokenizerControlMixin (get_loads, get_internal_state)."""
    from functools import partial

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.environ import envs
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
    from sglang.srt.observability.metrics_collector import TokenizerMetricsCollector
    from sglang.srt.utils import configure_gc_warning
    from sglang.srt.utils.watchdog import Watchdog

    names = {"DisaggregationMode": DisaggregationMode, "envs": envs, "Watchdog": Watchdog,
             "TokenizerMetricsCollector": TokenizerMetricsCollector,
             # the monitor's first reading after 50 ms instead of 5 s
             "start_cpu_monitor_thread": partial(start_cpu_monitor_thread, interval=0.05),
             "configure_gc_warning": configure_gc_warning}
    methods = {n: _release_function("srt/managers/tokenizer_manager.py", n, "TokenizerManager",
                                    **names)
               for n in ("init_metric_collector_watchdog", "collect_metrics",
                         "_request_has_grammar", "_set_default_priority")}
    methods["auto_create_handle_loop"] = lambda self: None
    cls = type("TokenizerManager", (TokenizerControlMixin,), methods)
    tm = cls.__new__(cls)
    tm.server_args, tm.enable_metrics = sa, sa.enable_metrics
    tm.enable_priority_scheduling = sa.enable_priority_scheduling
    tm.default_priority_value = sa.default_priority_value
    tm.disaggregation_mode = DisaggregationMode(sa.disaggregation_mode)
    tm.metrics_collector = None
    return tm


def _tokenizer(flags: dict, grammar: bool) -> None:
    """The tokenizer process: its collector, the 40 finished requests (a first chunk and a
    last one each, through `collect_metrics`) and one aborted request."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.observability.func_timer import enable_func_timer

    sa = server_args(flags)
    enable_func_timer()  # http_server's lifespan, with --enable-metrics
    tm = _tokenizer_manager(sa)
    tm.init_metric_collector_watchdog()
    for i, (prompt, gen, cached, e2e, ttft, itl) in enumerate(FINISHED):
        params = {"max_new_tokens": 512}
        if grammar and i % 5 == 0:
            params["json_schema"] = '{"type": "object"}'
        obj = GenerateReqInput(text="hi", sampling_params=params, stream=i % 4 != 0)
        tm._set_default_priority(obj)
        state = SimpleNamespace(obj=obj, finished=False, time_stats=_TimeStats(ttft, e2e),
                                last_completion_tokens=1, ttft_observed=False)
        for completion, finished in ((1, False), (gen, True)):
            state.finished = finished
            state.time_stats.interval = itl * (completion - state.last_completion_tokens)
            out = SimpleNamespace(
                completion_tokens=[completion], prompt_tokens=[prompt], cached_tokens=[cached],
                cached_tokens_details=[{"device": cached, "host": 0} if cached else None])
            tm.collect_metrics(state, out, 0)
    tm.metrics_collector.observe_one_aborted_request(tm.metrics_collector.labels)
    from sglang.srt.utils.common import add_prometheus_track_response_middleware

    http_traffic(add_prometheus_track_response_middleware)
    time.sleep(0.2)  # the CPU monitor's first readings


def _log_lines(flags: dict, out: Path) -> None:
    """The stats rank's prefill and decode lines, from the scheduler's own
    report_prefill_stats / report_decode_stats (SchedulerMetricsMixin) over the state they
    read."""

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_runtime_checker_mixin import PoolStats
    from sglang.srt.observability import scheduler_metrics_mixin as mixin
    from sglang.srt.observability.metrics_collector import QueueCount
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import configure_logger

    sa = server_args(flags)
    stream = capture_log(configure_logger, sa)
    fixed_clock(mixin)
    scheduler, batch = stats_scheduler(sa, DisaggregationMode, SpeculativeAlgorithm, PoolStats)
    cls = mixin.SchedulerMetricsMixin
    if logs_prefill(sa):
        cls.report_prefill_stats(scheduler, batch, mixin.PrefillStats(
            log_input_tokens=PREFILL_NEW_TOKENS, log_hit_tokens=PREFILL_CACHED_TOKENS,
            new_token_ratio=0.42, num_running_reqs=QueueCount(RUNNING),
            num_new_seqs=PREFILL_NEW_SEQS), can_run_cuda_graph=False)
    if logs_decode(sa):
        cls.report_decode_stats(scheduler, can_run_cuda_graph=True, running_batch=batch)
    (out / "scheduler.log").write_text(stream.getvalue())


def _request_records(flags: dict, grammar: bool, out: Path) -> None:
    """The records of `--export-metrics-to-file` (common.request_records). The tokenizer
    manager's module imports sgl_kernel: import_stand_ins."""
    import tempfile

    import_stand_ins()
    from sglang.srt.managers import tokenizer_manager as tm
    from sglang.srt.managers.io_struct import BatchTokenIDOutput, GenerateReqInput
    from sglang.srt.observability import req_time_stats as rts

    folder = tempfile.mkdtemp(prefix="sglang-records-")
    sa = server_args({**flags, "export_metrics_to_file": True,
                      "export_metrics_to_file_dir": folder})
    request_records(sa, tm, rts, BatchTokenIDOutput, GenerateReqInput, grammar, folder, out)


def _detokenizer(flags: dict) -> None:
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread

    start_cpu_monitor_thread("detokenizer", interval=0.05)
    time.sleep(0.2)


# -- the JSON bodies -----------------------------------------------------------------------
def _json_bodies(flags: dict, out: Path) -> None:
    """/server_info, /v1/loads, /get_load and the HTTP routes: http_server's handlers over the
    tokenizer's TokenizerControlMixin, asking rank 0's scheduler (the only DP rank)."""
    import dataclasses
    import logging

    import sglang
    from fastapi.encoders import jsonable_encoder
    from sglang.srt.entrypoints import v1_loads

    sa = server_args(flags)
    scheduler = _scheduler(sa, 0, metrics=False)
    tm = _tokenizer_manager(sa)

    async def internal_state(req):
        return [scheduler.get_internal_state(req)]

    async def loads(req):
        return [scheduler.get_loads(req)]

    tm.get_internal_state_communicator = internal_state
    tm.get_loads_communicator = loads
    state = SimpleNamespace(tokenizer_manager=tm, scheduler_info=scheduler.get_init_info())
    handlers = {"dataclasses": dataclasses, "__version__": sglang.__version__, "time": time,
                "_global_state": state, "logger": logging.getLogger("sglang.http_server")}
    server_info = _release_function("srt/entrypoints/http_server.py", "server_info", **handlers)
    get_load = _release_function("srt/entrypoints/http_server.py", "get_load", **handlers)
    info = jsonable_encoder(asyncio.run(server_info()))
    (out / "server_info.json").write_text(json.dumps(info, indent=1, sort_keys=True,
                                                     default=str) + "\n")
    body = asyncio.run(v1_loads.get_loads(dp_rank=None, include=None, format=None,
                                          tokenizer_manager=tm))
    body["timestamp"] = FIXED_TIMESTAMP  # datetime.now(): fixed so runs agree
    (out / "v1_loads.json").write_text(json.dumps(jsonable_encoder(body), indent=1,
                                                  sort_keys=True) + "\n")
    legacy = asyncio.run(get_load())
    for entry in legacy:
        entry["ts_tic"] = 0.0  # time.perf_counter(): fixed so runs agree
    (out / "get_load.json").write_text(json.dumps(jsonable_encoder(legacy), indent=1,
                                                  sort_keys=True) + "\n")
    (out / "routes.json").write_text(json.dumps(http_routes(), indent=1) + "\n")


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
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread

    sa = server_args({**VARIANTS["priority"], **VARIANTS["lora"], **VARIANTS["hicache"]})
    labels = {"model_name": MODEL, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
              "moe_ep_rank": 0, "priority": "", "dp_rank": 0}
    mc.SchedulerMetricsCollector(labels=labels, enable_lora=True, enable_hierarchical_cache=True,
                                 enable_streaming_session=True, server_args=sa)
    mc.TokenizerMetricsCollector(server_args=sa, labels={"model_name": MODEL,
                                                         "engine_type": "unified",
                                                         "priority": ""})
    mc.RadixCacheMetricsCollector(labels={"cache_type": "RadixCache"})
    mc.ExpertDispatchCollector(ep_size=2)
    mc.StorageMetricsCollector(labels={"storage_backend": "file", "tp_rank": 0, "dp_rank": 0,
                                       "pp_rank": 0, "pp_size": 1, "attn_cp_rank": 0,
                                       "attn_cp_size": 1})
    start_cpu_monitor_thread("tokenizer", interval=3600)
    from fastapi import FastAPI
    from sglang.srt.utils.common import add_prometheus_track_response_middleware

    add_prometheus_track_response_middleware(FastAPI())
    print_defined()
