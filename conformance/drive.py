"""Drive one SGLang release's own observability code and write what its server would answer.

Run by conformance/generate.py with the interpreter of a throwaway virtualenv holding
`sglang==X` (installed without its dependencies, plus the packages its observability modules
import): nothing here imports sglang_obs, and nothing starts a GPU. The release's real metric
collectors are created as its scheduler and tokenizer processes create them (one OS process per
TP rank, prometheus_client in multiprocess mode), fed through their own `log_stats`,
`observe_*` and `increment_*` methods with the numbers of a loaded server, and the registry is
answered by the release's own `/metrics` app (`add_prometheus_middleware`), once for a
Prometheus text scraper and once for an OpenMetrics one. The JSON bodies come from the
release's own structures (`LoadSnapshot.to_dict`, `build_server_info`, the scheduler's internal
state readback), the log lines from its scheduler's logging functions and the request records
from its `FileRequestMetricsExporter`.

    python drive.py --variant default --out DIR

writes DIR/metrics.prom, metrics.openmetrics.txt (+ .content-type), server_info.json,
v1_loads.json, get_load.json (or get_load.status: the route's HTTP status when it has none),
scheduler.log, request_records.log and manifest.json (the release, prometheus_client's
version, the variant's flags, the families the collectors define and the ones exposed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "Qwen/Qwen3-8B"
TP = 2
# The variants: server flags (ServerArgs fields) beyond --enable-metrics and --tp 2, and the
# traffic the tokenizer sees. "default" is a server started with default flags.
VARIANTS = {
    "default": {},
    "priority": {"enable_priority_scheduling": True, "default_priority_value": 0},
    "spec": {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
             "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
    "hicache": {"enable_hierarchical_cache": True},
    "pd-prefill": {"disaggregation_mode": "prefill"},
    "pd-decode": {"disaggregation_mode": "decode"},
    "lora": {"enable_lora": True, "max_loras_per_batch": 4},
    "grammar": {},  # default flags; structured-output requests in the traffic
}


def release() -> str:
    import sglang

    return sglang.__version__


def families(text: str) -> list[str]:
    """The family names of a text exposition (its TYPE lines), in order."""
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]


def asgi_get(app, path: str, accept: str | None, method: str = "GET"
             ) -> tuple[int, dict[str, str], bytes]:
    """One request through an ASGI app, as a client with this Accept header sends it."""
    headers = [(b"host", b"sglang:30000")]
    if accept:
        headers.append((b"accept", accept.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": headers, "server": ("sglang", 30000),
             "client": ("prometheus", 40000)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


# -- what a loaded TP2 server does between two scrapes -------------------------------------
# One minute of a Qwen3-8B server at TP2 under chat traffic: 40 requests finished, 16 running,
# 3 waiting. The numbers are chosen once and are the same for every release.
MAX_TOTAL_TOKENS = 412_000
RUNNING, WAITING = 16, 3
USED_TOKENS = 171_000
FINISHED = [  # (prompt, generation, cached, e2e s, ttft s, itl s)
    (1200 + 97 * i, 180 + 11 * i, 512 if i % 3 else 0, 2.5 + 0.11 * i, 0.21 + 0.01 * i,
     0.012 + 0.0004 * i) for i in range(40)]


# Qwen3-8B's published architecture: what ServerArgs resolves the model's shape from (there is
# no network here, and no weights are needed).
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645}


def _model_dir() -> str:
    path = Path(tempfile.gettempdir()) / "sglang-conformance-model"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return str(path)


def _server_args(flags: dict):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=_model_dir(), served_model_name=MODEL, tp_size=TP,
                      enable_metrics=True, skip_tokenizer_init=True, device="cuda", random_seed=42,
                      **flags)


def _scheduler_rank(rank: int, flags: dict) -> None:
    """One TP rank's scheduler process: its collectors as the scheduler creates them."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.observability import metrics_collector as mc

    sa = _server_args(flags)
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
    from sglang.srt.observability.func_timer import enable_func_timer
    from sglang.srt.observability.http_request_metrics import init_http_request_metrics

    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
    from sglang.srt.observability.http_request_metrics import (
        add_http_request_metrics_middleware,
    )
    from fastapi import FastAPI
    from starlette.responses import JSONResponse

    sa = _server_args(flags)
    rc.publish(sa, role="tokenizer")
    enable_func_timer()
    init_http_request_metrics()
    start_cpu_monitor_thread("tokenizer", interval=0.05)
    # The HTTP middleware as the server installs it, over the routes clients call.
    app = FastAPI()
    for route in ("/generate", "/v1/chat/completions", "/health", "/v1/models"):
        app.add_api_route(route, lambda: JSONResponse({}), methods=["GET", "POST"])
    add_http_request_metrics_middleware(app)
    for i in range(len(FINISHED)):
        asgi_get(app, "/v1/chat/completions" if i % 2 else "/generate", None, method="POST")
    for _ in range(4):
        asgi_get(app, "/health", None)
    asgi_get(app, "/v1/models", None)
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


STARTUP_TIME = {"load_weight": 21.4, "kv_cache_allocation": 2.2, "scheduler_e2e": 61.0,
                "tokenizer_e2e": 3.1, "cuda_graph": {"decode": 14.5}}


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

    sa = _server_args(flags)
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


def http_routes() -> list[str]:
    """The GET routes the release's HTTP server declares (`@app.get(...)`, `@router.get`,
    `@app.api_route(..., methods=[...GET...])`), read from its source: importing the server
    would pull in every model runtime."""
    import ast

    import sglang

    found = set()
    for path in sorted((Path(sglang.__file__).parent / "srt" / "entrypoints").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            route = node.args[0].value
            if not isinstance(route, str) or not route.startswith("/"):
                continue
            if node.func.attr == "get":
                found.add(route)
            elif node.func.attr == "api_route":
                methods = next((k.value for k in node.keywords if k.arg == "methods"), None)
                names = [e.value for e in getattr(methods, "elts", [])]
                if methods is None or "GET" in names:
                    found.add(route)
    return sorted(found)


def _detokenizer(flags: dict) -> None:
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread

    start_cpu_monitor_thread("detokenizer", interval=0.05)
    time.sleep(0.2)


def drive(variant: str, flags: dict, out: Path) -> dict:
    ranks = [multiprocessing.Process(target=_scheduler_rank, args=(r, flags))
             for r in range(TP)]
    for p in ranks:
        p.start()
        p.join()
        if p.exitcode:
            raise SystemExit(f"scheduler rank exited {p.exitcode}")
    for target, extra in ((_tokenizer, (variant == "grammar",)), (_detokenizer, ())):
        p = multiprocessing.Process(target=target, args=(flags, *extra))
        p.start()
        p.join()
        if p.exitcode:
            raise SystemExit(f"{target.__name__} exited {p.exitcode}")
    p = multiprocessing.Process(target=_json_bodies, args=(flags, out))
    p.start()
    p.join()
    if p.exitcode:
        raise SystemExit(f"_json_bodies exited {p.exitcode}")
    manifest = answer(out)
    manifest["families_defined"] = defined_families()
    return manifest


def define_all() -> None:
    """Every collector of the release, every feature on, in a plain registry (a fresh
    interpreter, no multiprocess directory): the families it defines, on stdout as JSON (a
    labelled family shows with no sample)."""
    from prometheus_client import REGISTRY

    from sglang.srt import runtime_context as rc
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
    from sglang.srt.observability.http_request_metrics import init_http_request_metrics

    sa = _server_args({**VARIANTS["priority"], **VARIANTS["lora"], **VARIANTS["hicache"]})
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
    # A family as /metrics names it (counters with _total), not the _created companions a
    # plain registry adds.
    print(json.dumps(sorted({m.name + ("_total" if m.type == "counter" else "")
                             for m in REGISTRY.collect()})))


def defined_families() -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    result = subprocess.run([sys.executable, __file__, "--define"], capture_output=True,
                            text=True, env=env, check=False, timeout=600)
    if result.returncode:
        raise SystemExit(f"--define: {result.stderr[-3000:]}")
    return [f for f in json.loads(result.stdout.splitlines()[-1]) if f.startswith("sglang")]


def answer(out: Path) -> dict:
    """What the release's /metrics app answers, to a Prometheus and an OpenMetrics scraper."""
    from starlette.applications import Starlette

    from sglang.srt.utils.common import add_prometheus_middleware

    app = Starlette()
    add_prometheus_middleware(app)
    status, headers, body = asgi_get(app, "/metrics", "text/plain")
    (out / "metrics.prom").write_bytes(body)
    om_accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    status, om_headers, om_body = asgi_get(app, "/metrics", om_accept)
    (out / "metrics.openmetrics.txt").write_bytes(om_body)
    (out / "metrics.openmetrics.content-type").write_text(om_headers["content-type"] + "\n")
    return {"text_content_type": headers["content-type"],
            "families_exposed": sorted(set(families(body.decode())))}


def main() -> int:
    if sys.argv[1:] == ["--define"]:
        define_all()
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="sglang-prom-")
    os.environ.setdefault("SGLANG_ROLE_NAMESPACES", "off")
    args.out.mkdir(parents=True, exist_ok=True)
    version = release()
    try:
        _server_args(VARIANTS[args.variant])
    except TypeError as err:  # a flag this release does not have
        print(f"not in {version}: {err}", file=sys.stderr)
        return 3
    manifest = drive(args.variant, VARIANTS[args.variant], args.out)
    from importlib.metadata import version as installed

    manifest.update({"release": version, "variant": args.variant,
                     "flags": VARIANTS[args.variant],
                     "prometheus_client": installed("prometheus_client"),
                     "python": sys.version.split()[0]})
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True)
                                            + "\n")
    return 0


if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    raise SystemExit(main())
