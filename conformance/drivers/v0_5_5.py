"""SGLang 0.5.5: collectors in sglang/srt/metrics/collector.py, created and fed by the release's
own Scheduler and TokenizerManager methods (`init_metrics`, `log_decode_stats`,
`log_prefill_stats`, `collect_metrics`, `abort_request`, `get_load`, `get_internal_state`) on
instances whose GPU-bound `__init__` is skipped and whose state is a loaded server's. Their
clocks (the modules' `time`) are stepped by the driver, so the rates and latencies they compute
are the same on every run.

Two things the release needs that this environment cannot give it: `sgl_kernel` (CUDA kernels,
imported by the model-config modules ServerArgs resolves the model with: an import-only stand-in
is installed, no kernel is ever called) and `python-multipart` (imported by the HTTP server's
form routes: a pure-Python package, put on the path beside the release)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from drivers.common import (
    FINISHED,
    MAX_TOTAL_TOKENS,
    MODEL,
    RUNNING,
    TP,
    USED_TOKENS,
    VARIANTS,
    WAITING,
    asgi_get,
    capture_log,
    http_routes,
    import_stand_ins,
    model_dir,
    print_defined,
    run_server,
)

# The loaded server's cache and queues, beyond the shared traffic numbers.
EVICTABLE_TOKENS = 20_000
WAITING_INPUT_LENS = [3000, 3000, 3100]  # the 3 waiting requests: 9100 uncached tokens
PREFILL_BOOTSTRAP_LENS = [1500, 1700]  # PD prefill: 2 requests bootstrapping
PREFILL_INFLIGHT = 3  # PD prefill: 3 requests transferring their KV cache
DECODE_PREALLOC_LENS = [1500, 1700]  # PD decode: 2 requests preallocating
DECODE_TRANSFER = 1  # PD decode: 1 request receiving its KV cache
DECODE_LOG_SECONDS = 40.0  # between two decode logs: 59 200 tokens = 1480 tok/s
GENERATED_TOKENS = 59_200
SPEC_FORWARD_CT, SPEC_ACCEPTED = 1000, 2700  # accept length 2.7 (EAGLE, 3 steps)


class _Clock:
    """A module's `time`, stepped by the driver."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    perf_counter = monotonic = time


def server_args(flags: dict):
    import_stand_ins()
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model_dir(), served_model_name=MODEL, tp_size=TP,
                      enable_metrics=True, skip_tokenizer_init=True, device="cuda", random_seed=42,
                      **flags)


# -- the scheduler --------------------------------------------------------------------------
def _req(input_len: int):
    return SimpleNamespace(origin_input_ids=[0] * input_len)


def _scheduler(sa, rank: int):
    """The release's Scheduler with a loaded TP rank's state (its __init__ needs a GPU)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = Scheduler.__new__(Scheduler)
    s.server_args = sa
    s.tp_rank, s.pp_rank, s.moe_ep_rank = rank, 0, 0
    s.dp_rank = None  # dp_size 1: the launcher passes none
    s.tp_size, s.pp_size, s.dp_size = sa.tp_size, sa.pp_size, sa.dp_size
    s.attn_tp_rank, s.attn_tp_size, s.attn_dp_rank = compute_dp_attention_world_info(
        sa.enable_dp_attention, rank, sa.tp_size, sa.dp_size)
    s.enable_metrics = sa.enable_metrics
    s.enable_metrics_for_all_schedulers = sa.enable_metrics_for_all_schedulers
    s.enable_kv_cache_events = bool(sa.kv_events_config and rank == 0)
    s.spec_algorithm = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    s.disaggregation_mode = DisaggregationMode(sa.disaggregation_mode)
    s.device = sa.device
    s.is_hybrid = s.is_hybrid_gdn = False
    s.max_total_num_tokens = MAX_TOTAL_TOKENS
    s.max_running_requests = 256
    s.token_to_kv_pool_allocator = SimpleNamespace(
        available_size=lambda: MAX_TOTAL_TOKENS - USED_TOKENS - EVICTABLE_TOKENS,
        get_kvcache=lambda: SimpleNamespace(mem_usage=56.6))
    s.tree_cache = SimpleNamespace(evictable_size=lambda: EVICTABLE_TOKENS)
    s.waiting_queue = [_req(n) for n in WAITING_INPUT_LENS[:WAITING]]
    s.grammar_queue = []
    s.running_batch = SimpleNamespace(reqs=[_req(1200) for _ in range(RUNNING)])
    s.disagg_prefill_bootstrap_queue = SimpleNamespace(
        queue=[_req(n) for n in PREFILL_BOOTSTRAP_LENS])
    s.disagg_prefill_inflight_queue = [_req(1200) for _ in range(PREFILL_INFLIGHT)]
    s.disagg_decode_prealloc_queue = SimpleNamespace(
        queue=[SimpleNamespace(req=_req(n)) for n in DECODE_PREALLOC_LENS],
        num_tokens_pre_allocated=sum(DECODE_PREALLOC_LENS), retracted_queue=[])
    s.disagg_decode_transfer_queue = SimpleNamespace(
        queue=[SimpleNamespace(req=_req(1200)) for _ in range(DECODE_TRANSFER)])
    s.forward_ct = 0
    s.num_generated_tokens = 0
    s.last_prefill_tokens = 0
    s.num_retracted_reqs = s.num_paused_reqs = 0
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=8.2,
                                                               graph_mem_usage=1.4))
    return s


def _stages(mode) -> list[tuple[str, float]]:
    """The per-stage latencies the release's request path observes (`Req.add_latency`) in
    this disaggregation mode, and a base latency for each."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_batch import RequestStage as S

    if mode == DisaggregationMode.PREFILL:
        return [(S.PREFILL_PREPARE, 0.002), (S.PREFILL_BOOTSTRAP, 0.0031),
                (S.PREFILL_WAITING, 0.05), (S.PREFILL_FORWARD, 0.15),
                (S.PREFILL_TRANSFER_KV_CACHE, 0.041)]
    if mode == DisaggregationMode.DECODE:
        return [(S.DECODE_PREPARE, 0.002), (S.DECODE_BOOTSTRAP, 0.0031),
                (S.DECODE_TRANSFERRED, 0.041), (S.DECODE_WAITING, 0.01)]
    return [(S.PREFILL_WAITING, 0.05)]


def _scheduler_rank(rank: int, flags: dict) -> None:
    """One TP rank's scheduler process: its collector as `init_metrics` creates it, fed by the
    scheduler's own logging functions."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers import scheduler  # noqa: F401  (before its mixins: their cycle)
    from sglang.srt.managers import scheduler_metrics_mixin as mixin
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    sa = server_args(flags)
    set_global_server_args_for_scheduler(sa)
    clock = _Clock()
    mixin.time = clock
    s = _scheduler(sa, rank)
    s.init_metrics(s.tp_rank, s.pp_rank, s.dp_rank)
    c = s.metrics_collector
    mode = s.disaggregation_mode
    # Every rank's requests: their stage latencies, and (where the prefill batch is built
    # from the waiting queue: not on a decode server) their queueing time.
    for i in range(len(FINISHED)):
        for stage, base in _stages(mode):
            c.observe_per_stage_req_latency(stage.value, base + 0.002 * i)
        if mode != DisaggregationMode.DECODE:
            c.observe_queue_time(0.05 + 0.01 * i)
    if mode != DisaggregationMode.NULL:
        c.increment_bootstrap_failed_reqs()
        c.increment_transfer_failed_reqs()
    if s.current_scheduler_metrics_enabled():
        _stats_logs(s, clock)


def _stats_logs(s, clock) -> None:
    """A decode log (not on a prefill server), then a prefill log (not on a decode server):
    the scheduler's own log_decode_stats / log_prefill_stats, which log the batch line and
    (with metrics on) fill the collector."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    mode = s.disaggregation_mode
    if mode != DisaggregationMode.PREFILL:
        s.num_generated_tokens = GENERATED_TOKENS
        if not s.spec_algorithm.is_none():
            s.spec_num_forward_ct, s.spec_num_accepted_tokens = SPEC_FORWARD_CT, SPEC_ACCEPTED
        s.num_retracted_reqs = 1
        clock.now = DECODE_LOG_SECONDS
        s.log_decode_stats(can_run_cuda_graph=True)
    if mode != DisaggregationMode.DECODE:
        if mode == DisaggregationMode.NULL:
            s.num_retracted_reqs = 1
        clock.now = DECODE_LOG_SECONDS + 1.0
        adder = SimpleNamespace(log_input_tokens=6_900, log_hit_tokens=3_100)
        s.log_prefill_stats(adder, [_req(n) for n in (2300, 2300, 2300)], RUNNING, 0)


def _log_lines(flags: dict, out: Path) -> None:
    """The stats rank's batch lines, through the release's own logger set-up (the same calls
    as rank 0 of _scheduler_rank, metrics off)."""
    from sglang.srt.managers import scheduler  # noqa: F401  (before its mixins: their cycle)
    from sglang.srt.managers import scheduler_metrics_mixin as mixin
    from sglang.srt.server_args import set_global_server_args_for_scheduler
    from sglang.srt.utils import configure_logger

    sa = server_args(flags)
    set_global_server_args_for_scheduler(sa)
    stream = capture_log(configure_logger, sa)
    clock = _Clock()
    mixin.time = clock
    s = _scheduler(sa, 0)
    s.enable_metrics = False  # init_metrics then creates no collector
    s.init_metrics(s.tp_rank, s.pp_rank, s.dp_rank)
    _stats_logs(s, clock)
    (out / "scheduler.log").write_text(stream.getvalue())


# -- the tokenizer --------------------------------------------------------------------------
def _tokenizer(flags: dict, grammar: bool) -> None:
    """The tokenizer (HTTP server) process: its collector as TokenizerManager creates it, fed by
    its own `collect_metrics` and `abort_request`, and the function timer the HTTP server
    enables."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers import tokenizer_manager as tm_mod
    from sglang.srt.metrics.collector import TokenizerMetricsCollector
    from sglang.srt.metrics.func_timer import enable_func_timer

    sa = server_args(flags)
    enable_func_timer()  # http_server's lifespan, with --enable-metrics
    tm = tm_mod.TokenizerManager.__new__(tm_mod.TokenizerManager)
    tm.server_args = sa
    tm.enable_metrics = sa.enable_metrics
    tm.disaggregation_mode = DisaggregationMode(sa.disaggregation_mode)
    # TokenizerManager.__init__'s labels and collector
    labels = {"model_name": sa.served_model_name}
    for label in sa.tokenizer_metrics_allowed_custom_labels or []:
        labels[label] = ""
    tm.metrics_collector = TokenizerMetricsCollector(
        server_args=sa, labels=labels,
        bucket_time_to_first_token=sa.bucket_time_to_first_token,
        bucket_e2e_request_latency=sa.bucket_e2e_request_latency,
        bucket_inter_token_latency=sa.bucket_inter_token_latency,
        collect_tokens_histogram=sa.collect_tokens_histogram)
    clock = _Clock()
    tm_mod.time = clock
    prefill = tm.disaggregation_mode == DisaggregationMode.PREFILL
    for i, (prompt, gen, cached, e2e, ttft, itl) in enumerate(FINISHED):
        params = {"json_schema": '{"type": "object"}'} if grammar and i % 5 == 0 else {}
        state = tm_mod.ReqState(out_list=[], finished=False, event=None,
                                obj=SimpleNamespace(sampling_params=params, custom_labels=None),
                                created_time=0.0)

        def output(completion: int, retractions: int = 0, prompt=prompt, cached=cached):
            return SimpleNamespace(completion_tokens=[completion], prompt_tokens=[prompt],
                                   cached_tokens=[cached], retraction_counts=[retractions])

        retractions = 1 if i == 0 else 0
        if prefill:  # a prefill server generates one token (max_new_tokens = 1)
            clock.now = ttft
            state.finished, state.finished_time = True, ttft
            tm.collect_metrics(state, output(1, retractions), 0)
            continue
        clock.now = ttft
        tm.collect_metrics(state, output(1), 0)
        clock.now = ttft + itl * (gen - 1)
        state.finished, state.finished_time = True, e2e
        tm.collect_metrics(state, output(gen, retractions), 0)
    tm.rid_to_state = {"aborted": None}
    tm.send_to_scheduler = SimpleNamespace(send_pyobj=lambda obj: None)
    tm.abort_request("aborted")


# -- the JSON routes ------------------------------------------------------------------------
def _json_bodies(flags: dict, out: Path) -> None:
    """/get_server_info and /get_load as the release's HTTP app answers them (its routes, its
    TokenizerManager's fan-out, its Scheduler's replies), and the HTTP routes."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    # The scheduler process (rank 0) with its own copy of the server args.
    scheduler_sa = server_args(flags)
    set_global_server_args_for_scheduler(scheduler_sa)
    s = _scheduler(scheduler_sa, 0)
    s.last_gen_throughput = GENERATED_TOKENS / DECODE_LOG_SECONDS
    s.spec_total_num_forward_ct = SPEC_FORWARD_CT if scheduler_sa.speculative_algorithm else 0
    s.spec_total_num_accepted_tokens = SPEC_ACCEPTED if scheduler_sa.speculative_algorithm else 0

    async def internal_state(req):
        return [s.get_internal_state(req)]

    async def load(req):
        return [s.get_load(req)]

    tm = TokenizerManager.__new__(TokenizerManager)
    tm.server_args = server_args(flags)
    tm.get_internal_state_communicator = internal_state
    tm.get_load_communicator = load
    # What the scheduler sends the launcher when it is ready (run_scheduler_process).
    scheduler_info = {"status": "ready", "max_total_num_tokens": MAX_TOTAL_TOKENS,
                      "max_req_input_len": 40954}
    http_server.set_global_state(http_server._GlobalState(
        tokenizer_manager=tm, template_manager=None, scheduler_info=scheduler_info))
    for route, name in (("/get_server_info", "server_info.json"), ("/get_load", "get_load.json")):
        status, _, body = asgi_get(http_server.app, route, "application/json")
        if status != 200:
            raise SystemExit(f"{route}: HTTP {status}: {body[-2000:]!r}")
        (out / name).write_text(json.dumps(json.loads(body), indent=1, sort_keys=True) + "\n")
    (out / "routes.json").write_text(json.dumps(http_routes(), indent=1) + "\n")


def drive(variant: str, flags: dict, out: Path) -> dict:
    def middleware():
        from sglang.srt.utils import add_prometheus_middleware

        return add_prometheus_middleware

    return run_server(variant, flags, out, scheduler_rank=_scheduler_rank, tokenizer=_tokenizer,
                      json_bodies=_json_bodies, middleware=middleware,
                      log_lines=_log_lines)


def define_all() -> None:
    """Every collector of the release, every feature on, in a plain registry (a fresh
    interpreter, no multiprocess directory): the families it defines, on stdout as JSON (a
    labelled family shows with no sample)."""
    sa = server_args({**VARIANTS["lora"], **VARIANTS["hicache"]})
    from sglang.srt.metrics import collector as mc
    from sglang.srt.metrics.func_timer import enable_func_timer

    labels = {"model_name": MODEL, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
              "dp_rank": 0}
    mc.SchedulerMetricsCollector(labels=labels)
    mc.TokenizerMetricsCollector(server_args=sa, labels={"model_name": MODEL},
                                 collect_tokens_histogram=True)
    mc.StorageMetricsCollector(labels={"storage_backend": "file", "tp_rank": 0, "dp_rank": 0})
    mc.ExpertDispatchCollector(ep_size=2)
    enable_func_timer()
    print_defined()

