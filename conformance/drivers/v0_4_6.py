"""SGLang 0.4.6.post5: collectors in sglang/srt/metrics/collector.py, created as its scheduler
(`Scheduler.init_metrics`, every TP rank) and tokenizer (`TokenizerManager.__init__`) create them.

What the release does, and so what this driver does:
- every scheduler rank creates a `SchedulerMetricsCollector` labelled {model_name, engine_type}
  (engine_type is always "unified", also in PD mode; no tp_rank label), but only attn_tp_rank 0
  calls `log_prefill_stats` / `log_decode_stats`, so only rank 0 has samples;
- the scheduler fills its one `SchedulerStats` object field by field before each `log_stats`:
  a prefill batch, then a decode batch (decode stats reset cache_hit_rate to 0.0; a PD prefill
  server logs prefill batches only, a PD decode server decode batches only). The PD queue
  gauges are never filled (always 0), `avg_request_queue_latency` is filled but never logged,
  and nothing calls `increment_bootstrap_failed_reqs` / `increment_transfer_failed_reqs`;
- the tokenizer's `TokenizerMetricsCollector` is labelled {model_name}; the HTTP server process
  (the tokenizer's) calls `enable_func_timer`, whose histogram nothing observes;
- there is no /get_load nor /v1/loads route, and no CPU monitor or HTTP request metrics.

The scheduler, tokenizer manager and HTTP server modules do not import without a GPU (their
quantization layers then import vllm), so the JSON bodies run the release's own functions from
its source (`_release_def`): the `/get_server_info` handler, `TokenizerManager.get_internal_state`,
`Scheduler.get_internal_state`, `ModelRunner.model_specific_adjustment` and the
`global_server_args_dict` it updates, and the pool limits (request slots, max_running_requests,
max_req_input_len, max_micro_batch_size) over a KV pool of MAX_TOTAL_TOKENS.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from drivers.common import (
    DECODE_GENERATED_TOKENS,
    FINISHED,
    LOG_GAP_S,
    MAX_TOTAL_TOKENS,
    MODEL,
    MODEL_CONFIG,
    PD_BOOTSTRAP,
    PD_INFLIGHT,
    PD_PREALLOCATED_TOKENS,
    PREFILL_CACHED_TOKENS,
    PREFILL_NEW_SEQS,
    PREFILL_NEW_TOKENS,
    RUNNING,
    SPEC_ACCEPTED,
    SPEC_FORWARDS,
    TP,
    USED_TOKENS,
    WAITING,
    capture_log,
    http_routes,
    logs_decode,
    logs_prefill,
    model_dir,
    print_defined,
    run_server,
)

GEN_THROUGHPUT = 1480.0
CACHE_HIT_RATE = 0.31
SPEC_TOTAL_FORWARD_CT, SPEC_TOTAL_ACCEPTED = 33_000, 89_100  # since start: accept length 2.7


def server_args(flags: dict):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model_dir(), served_model_name=MODEL, tp_size=TP,
                      enable_metrics=True, skip_tokenizer_init=True, device="cuda", random_seed=42,
                      **flags)


# -- the release's own code, read from its source ---------------------------------------------
def _tree(relpath: str) -> tuple[str, ast.Module]:
    import sglang

    path = Path(sglang.__file__).parent / relpath
    return str(path), ast.parse(path.read_text())


def _node(body: list, name: str):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return node
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    raise LookupError(name)


def _release_def(relpath: str, qualname: str, namespace: dict):
    """The function, class or module-level value `qualname` ("Class.method" for a method) of
    the release's `relpath`, compiled from its source into `namespace` (a route's decorator,
    which would register it on the server's app, is left off)."""
    filename, tree = _tree(relpath)
    body = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        body = _node(body, cls).body
    node = _node(body, name)
    if isinstance(node, ast.Assign):
        return eval(compile(ast.Expression(node.value), filename, "eval"), namespace)
    if not isinstance(node, ast.ClassDef):
        node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"), namespace)
    return namespace[name]


def _release_call_arg(relpath: str, qualname: str, callee: str, namespace: dict):
    """The first argument of the first `callee(...)` call inside `qualname`, evaluated."""
    filename, tree = _tree(relpath)
    body = tree.body
    for part in qualname.split("."):
        body = _node(body, part).body
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == callee:
                return eval(compile(ast.Expression(node.args[0]), filename, "eval"), namespace)
    raise LookupError(f"{qualname}: {callee}")


def _release_stmt(relpath: str, qualname: str, prefix: str, namespace: dict) -> dict:
    """Run the first statement inside `qualname` whose source starts with `prefix` in
    `namespace` (its locals: `self` and the like), and return the namespace."""
    filename, tree = _tree(relpath)
    body = tree.body
    for part in qualname.split("."):
        body = _node(body, part).body
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.stmt) and ast.unparse(node).startswith(prefix):
                exec(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"),
                     namespace)
                return namespace
    raise LookupError(f"{qualname}: {prefix}")


# -- the processes -----------------------------------------------------------------------------
def _scheduler_rank(rank: int, flags: dict) -> None:
    """One TP rank's scheduler process: `Scheduler.init_metrics` on every rank; the stats logs
    on attn_tp_rank 0 only (TP2 without DP attention: attn_tp_rank == tp_rank)."""
    from sglang.srt.metrics.collector import SchedulerMetricsCollector, SchedulerStats

    sa = server_args(flags)
    stats = SchedulerStats()
    collector = SchedulerMetricsCollector(labels={"model_name": sa.served_model_name,
                                                  "engine_type": "unified"})
    if rank != 0:
        return
    spec = bool(sa.speculative_algorithm)
    if sa.disaggregation_mode != "decode":
        # Scheduler.log_prefill_stats
        stats.num_running_reqs = RUNNING
        stats.num_used_tokens = USED_TOKENS
        stats.token_usage = round(USED_TOKENS / MAX_TOTAL_TOKENS, 2)
        stats.num_queue_reqs = WAITING
        stats.cache_hit_rate = CACHE_HIT_RATE
        stats.avg_request_queue_latency = 0.05
        collector.log_stats(stats)
    if sa.disaggregation_mode != "prefill":
        # Scheduler.log_decode_stats
        stats.num_running_reqs = RUNNING
        stats.num_used_tokens = USED_TOKENS
        stats.token_usage = USED_TOKENS / MAX_TOTAL_TOKENS
        stats.cache_hit_rate = 0.0
        stats.gen_throughput = GEN_THROUGHPUT
        stats.num_queue_reqs = WAITING
        stats.num_grammar_queue_reqs = 0
        stats.spec_accept_length = SPEC_TOTAL_ACCEPTED / SPEC_TOTAL_FORWARD_CT if spec else 0
        collector.log_stats(stats)


def _log_lines(flags: dict, out: Path) -> None:
    """The stats rank's batch lines: `Scheduler.log_prefill_stats` / `log_decode_stats` from
    the release's source, over the scheduler state they read, through its own logger set-up
    (`configure_logger`: sglang.srt.utils imports without a GPU)."""
    import logging
    from types import SimpleNamespace

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils import configure_logger

    sa = server_args(flags)
    stream = capture_log(configure_logger, sa)
    namespace = {"time": SimpleNamespace(perf_counter=lambda: 1000.0 + LOG_GAP_S),
                 "logger": logging.getLogger("sglang.srt.managers.scheduler"),
                 "DisaggregationMode": DisaggregationMode, "RECORD_STEP_TIME": False}
    log_prefill_stats = _release_def("srt/managers/scheduler.py", "Scheduler.log_prefill_stats",
                                     namespace)
    log_decode_stats = _release_def("srt/managers/scheduler.py", "Scheduler.log_decode_stats",
                                    namespace)
    free = MAX_TOTAL_TOKENS - USED_TOKENS - 20_000
    spec = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    scheduler = SimpleNamespace(
        server_args=sa, max_total_num_tokens=MAX_TOTAL_TOKENS, enable_metrics=False,
        token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: free),
        tree_cache=SimpleNamespace(evictable_size=lambda: 20_000),
        waiting_queue=[object()] * WAITING, grammar_queue=[],
        disaggregation_mode=DisaggregationMode(sa.disaggregation_mode),
        disagg_prefill_bootstrap_queue=SimpleNamespace(queue=[object()] * PD_BOOTSTRAP),
        disagg_prefill_inflight_queue=[object()] * PD_INFLIGHT,
        num_tokens_pre_allocated=PD_PREALLOCATED_TOKENS,
        running_batch=SimpleNamespace(reqs=[object()] * RUNNING), spec_algorithm=spec,
        last_prefill_stats_tic=1000.0, last_decode_stats_tic=1000.0,
        num_prefill_tokens=PREFILL_NEW_TOKENS, num_generated_tokens=DECODE_GENERATED_TOKENS,
        spec_num_total_accepted_tokens=SPEC_ACCEPTED, spec_num_total_forward_ct=SPEC_FORWARDS,
        cum_spec_accept_length=0, cum_spec_accept_count=0, _publish_kv_events=lambda: None)
    if logs_prefill(sa):
        adder = SimpleNamespace(log_input_tokens=PREFILL_NEW_TOKENS,
                                log_hit_tokens=PREFILL_CACHED_TOKENS)
        log_prefill_stats(scheduler, adder, [object()] * PREFILL_NEW_SEQS, RUNNING)
    if logs_decode(sa):
        log_decode_stats(scheduler, can_run_cuda_graph=True)
    (out / "scheduler.log").write_text(stream.getvalue())


def _tokenizer(flags: dict, grammar: bool) -> None:
    """The HTTP server's process, which holds the tokenizer manager: its collector as
    `TokenizerManager.__init__` creates it, fed as `collect_metrics` feeds it, and the function
    timer the server enables beside `add_prometheus_middleware`."""
    from sglang.srt.metrics.collector import TokenizerMetricsCollector
    from sglang.srt.metrics.func_timer import enable_func_timer

    sa = server_args(flags)
    c = TokenizerMetricsCollector(
        labels={"model_name": sa.served_model_name},
        bucket_time_to_first_token=sa.bucket_time_to_first_token,
        bucket_e2e_request_latency=sa.bucket_e2e_request_latency,
        bucket_inter_token_latency=sa.bucket_inter_token_latency,
        collect_tokens_histogram=sa.collect_tokens_histogram)
    enable_func_timer()
    for i, (prompt, gen, cached, e2e, ttft, itl) in enumerate(FINISHED):
        c.observe_time_to_first_token(ttft)
        c.observe_inter_token_latency(itl * (gen - 1), gen - 1)
        c.observe_one_finished_request(prompt, gen, cached, e2e, grammar and i % 5 == 0)


def _json_bodies(flags: dict, out: Path) -> None:
    """/get_server_info (the release's handler over its tokenizer's and scheduler's
    internal-state readback) and the HTTP routes."""
    import asyncio
    import copy
    import dataclasses
    import logging
    import typing
    from collections import defaultdict
    from types import SimpleNamespace

    import sglang.srt.utils as utils
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.version import __version__

    sa = server_args(flags)
    # The scheduler process's copy of the arguments, as its ModelRunner adjusts them (attention
    # backend chosen, chunked prefix cache off for an MHA model) and publishes them.
    sched_sa = copy.deepcopy(sa)
    model_config = SimpleNamespace(context_len=MODEL_CONFIG["max_position_embeddings"],
                                   hf_config=SimpleNamespace(**MODEL_CONFIG))
    runner = SimpleNamespace(
        server_args=sched_sa, model_config=model_config, max_total_num_tokens=MAX_TOTAL_TOKENS,
        use_mla_backend=False, is_multimodal=False,
        is_multimodal_chunked_prefill_supported=True,
        mem_fraction_static=sched_sa.mem_fraction_static, page_size=sched_sa.page_size)
    runner_ns = {**vars(utils), "logger": logging.getLogger("sglang.srt.model_executor"),
                 "_is_hip": utils.is_hip()}
    _release_def("srt/model_executor/model_runner.py", "ModelRunner.model_specific_adjustment",
                 runner_ns)(runner)
    global_server_args_dict = _release_def("srt/managers/schedule_batch.py",
                                           "global_server_args_dict", {"ServerArgs": ServerArgs})
    global_server_args_dict.update(_release_call_arg(
        "srt/model_executor/model_runner.py", "ModelRunner.__init__",
        "global_server_args_dict.update", {"server_args": sched_sa, "self": runner}))

    ns = {"dataclass": dataclasses.dataclass, "Any": typing.Any, "Dict": dict,
          "List": list, "get_bool_env_var": utils.get_bool_env_var,
          "global_server_args_dict": global_server_args_dict}
    for name in ("GetInternalStateReq", "GetInternalStateReqOutput"):
        _release_def("srt/managers/io_struct.py", name, ns)
    ns["RECORD_STEP_TIME"] = _release_def("srt/managers/scheduler.py", "RECORD_STEP_TIME", ns)
    sched_get_state = _release_def("srt/managers/scheduler.py", "Scheduler.get_internal_state",
                                   dict(ns))
    # The pool sizes: ModelRunner.init_memory_pool's request slots over a KV pool of
    # MAX_TOTAL_TOKENS, then the TpModelWorker's limits, then the Scheduler's micro batch.
    max_num_reqs = _release_stmt(
        "srt/model_executor/model_runner.py", "ModelRunner.init_memory_pool",
        "if max_num_reqs is None:", {"self": runner, "max_num_reqs":
                                     sched_sa.max_running_requests})["max_num_reqs"]
    worker = SimpleNamespace(max_total_num_tokens=MAX_TOTAL_TOKENS, model_config=model_config,
                             model_runner=SimpleNamespace(
                                 req_to_token_pool=SimpleNamespace(size=max_num_reqs + 1)))
    for prefix in ("self.max_running_requests = min(", "self.max_req_len = min(",
                   "self.max_req_input_len ="):
        _release_stmt("srt/managers/tp_worker.py", "TpModelWorker.__init__", prefix,
                      {"self": worker, "server_args": sched_sa})
    spec = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    scheduler = SimpleNamespace(
        last_gen_throughput=GEN_THROUGHPUT, spec_algorithm=spec,
        cum_spec_accept_length=0 if spec.is_none() else SPEC_TOTAL_ACCEPTED,
        cum_spec_accept_count=0 if spec.is_none() else SPEC_TOTAL_FORWARD_CT,
        step_time_dict=defaultdict(list), max_total_num_tokens=MAX_TOTAL_TOKENS,
        max_running_requests=worker.max_running_requests,
        max_req_input_len=worker.max_req_input_len)
    _release_stmt("srt/managers/scheduler.py", "Scheduler.__init__",
                  "if global_server_args_dict['max_micro_batch_size'] is None",
                  {"self": scheduler, "server_args": sched_sa,
                   "global_server_args_dict": global_server_args_dict})

    async def communicator(req):  # one DP rank answers
        return [sched_get_state(scheduler, req)]

    tm_get_state = _release_def("srt/managers/tokenizer_manager.py",
                                "TokenizerManager.get_internal_state", dict(ns))
    tokenizer_manager = SimpleNamespace(server_args=sa, get_internal_state_communicator=(
        communicator))
    tokenizer_manager.get_internal_state = lambda: tm_get_state(tokenizer_manager)
    # What the scheduler process sends through its pipe once ready (run_scheduler_process).
    scheduler_info = _release_call_arg("srt/managers/scheduler.py", "run_scheduler_process",
                                       "pipe_writer.send", {"scheduler": scheduler})
    handler = _release_def("srt/entrypoints/http_server.py", "get_server_info", {
        "_global_state": SimpleNamespace(tokenizer_manager=tokenizer_manager,
                                         scheduler_info=scheduler_info),
        "dataclasses": dataclasses, "__version__": __version__})
    info = asyncio.run(handler())
    (out / "server_info.json").write_text(json.dumps(info, indent=1, sort_keys=True,
                                                     default=str) + "\n")
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
    from sglang.srt.metrics.collector import SchedulerMetricsCollector, TokenizerMetricsCollector
    from sglang.srt.metrics.func_timer import enable_func_timer

    SchedulerMetricsCollector(labels={"model_name": MODEL, "engine_type": "unified"})
    TokenizerMetricsCollector(labels={"model_name": MODEL}, collect_tokens_histogram=True)
    enable_func_timer()
    print_defined()
