"""What every release's driver shares: the variants, the traffic, the model, and the ways
of asking an ASGI app and reading an exposition (stdlib only: it runs in SGLang's virtualenv)."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import io
import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import types
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


# -- what a loaded TP2 server does between two scrapes -------------------------------------
# One minute of a Qwen3-8B server at TP2 under chat traffic: 40 requests finished, 16 running,
# 3 waiting. The numbers are chosen once and are the same for every release.
MAX_TOTAL_TOKENS = 412_000


RUNNING, WAITING = 16, 3


USED_TOKENS = 171_000
EVICTABLE_TOKENS = 20_000  # of the used ones: cached prefixes no running request holds


FINISHED = [  # (prompt, generation, cached, e2e s, ttft s, itl s)
    (1200 + 97 * i, 180 + 11 * i, 512 if i % 3 else 0, 2.5 + 0.11 * i, 0.21 + 0.01 * i,
     0.012 + 0.0004 * i) for i in range(40)]


# What the stats rank logs (the decode line every `decode_log_interval` forwards): one prefill
# batch of 3 new requests and one decode interval of the same server, LOG_GAP_S after the last
# line of each kind (the throughput figures are tokens over that gap).
LOG_GAP_S = 10.0
PREFILL_NEW_SEQS, PREFILL_NEW_TOKENS, PREFILL_CACHED_TOKENS = 3, 9100, 1536
DECODE_GENERATED_TOKENS = 14_800  # over LOG_GAP_S: 1480 token/s
SPEC_FORWARDS, SPEC_ACCEPTED, SPEC_CORRECT_DRAFTS = 1000, 2700, 1710  # accept len 2.70
PD_BOOTSTRAP, PD_INFLIGHT, PD_PREALLOC, PD_TRANSFER = 2, 3, 2, 1
PD_PREALLOCATED_TOKENS = 20_600
# The per-request records (--export-metrics-to-file): the first RECORDED requests of FINISHED,
# on the variants whose request path is a unified server's (a PD prefill server hands each
# request on after its first token; what its tokenizer records is not modelled here).
RECORDED = 6
RECORD_VARIANTS = ("default", "priority", "spec", "hicache", "lora", "grammar")
PROMPT_MARKER = "CONFORMANCE-PROMPT-9c1e"  # in every prompt: no reader may let it through
RECORD_EPOCH = 1_796_292_000.0  # 2026-12-03 10:00:00 UTC: wall time at perf_counter() == 0


def request_id(i: int) -> str:
    """A uuid4-hex-like request id (SGLang's default rid), the same on every run."""
    import hashlib

    return hashlib.sha256(f"conformance:{i}".encode()).hexdigest()[:32]


def request_input(i: int, grammar: bool) -> dict:
    """GenerateReqInput's arguments for request i of FINISHED."""
    sampling = {"max_new_tokens": 1024, "temperature": 0.7, "top_p": 0.95}
    if grammar and i % 5 == 0:
        sampling["json_schema"] = '{"type": "object"}'
    return {"text": f"{PROMPT_MARKER} request {i}", "sampling_params": sampling,
            "rid": request_id(i), "stream": i % 4 != 0}


# The rank prefix of TP rank 0 of a TP2 server (every release adds " TP<rank>" when tp_size > 1
# and no DP/PP/EP tag at size 1).
LOG_PREFIX = " TP0"


STARTUP_TIME = {"load_weight": 21.4, "kv_cache_allocation": 2.2, "scheduler_e2e": 61.0,
                "tokenizer_e2e": 3.1, "cuda_graph": {"decode": 14.5}}


# Qwen3-8B's published architecture: what ServerArgs resolves the model's shape from (there is
# no network here, and no weights are needed).
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645}


def model_dir() -> str:
    path = Path(tempfile.gettempdir()) / "sglang-conformance-model"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return str(path)


# -- the release's imports ------------------------------------------------------------------
class _KernelMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _Kernel(metaclass=_KernelMeta):
    """Whatever a module takes from sgl_kernel at import time (a function, a class, a scalar
    type): nothing here calls a kernel."""


class _KernelModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Kernel


class _KernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "sgl_kernel":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _KernelModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_stand_ins() -> None:
    """An import-only sgl_kernel (CUDA only), for the modules that import it at import time
    (0.5.5's model config, 0.5.12's tokenizer manager): no kernel is ever called."""
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        if not any(isinstance(f, _KernelFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _KernelFinder())


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


def defined_families() -> list[str]:
    """The families the release's collectors define: its driver's define_all() in a fresh
    interpreter without a multiprocess directory."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    drive = Path(__file__).resolve().parent.parent / "drive.py"
    result = subprocess.run([sys.executable, str(drive), "--define"], capture_output=True,
                            text=True, env=env, check=False, timeout=600)
    if result.returncode:
        raise SystemExit(f"--define: {result.stderr[-3000:]}")
    return [f for f in json.loads(result.stdout.splitlines()[-1]) if f.startswith("sglang")]


def run_process(target, *args) -> None:
    """`target(*args)` in a forked process of its own (a scheduler rank, the tokenizer...):
    prometheus_client keeps one file set per process id, as on a real server."""
    p = multiprocessing.Process(target=target, args=args)
    p.start()
    p.join()
    if p.exitcode:
        raise SystemExit(f"{target.__name__} exited {p.exitcode}")


def answer(out: Path, add_prometheus_middleware) -> dict:
    """What the release's /metrics app (`add_prometheus_middleware`, the release's own) answers,
    to a Prometheus and an OpenMetrics scraper."""
    from starlette.applications import Starlette

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


def print_defined() -> None:
    """define_all()'s answer on stdout: every family in prometheus_client's default registry
    as /metrics names it (counters with _total), not the _created companions it adds."""
    from prometheus_client import REGISTRY

    print(json.dumps(sorted({m.name + ("_total" if m.type == "counter" else "")
                             for m in REGISTRY.collect()})))


def capture_log(configure_logger, server_args) -> io.StringIO:
    """The release's own logging set-up (`configure_logger`, as its scheduler calls it with the
    rank prefix), writing into the returned buffer instead of stderr."""
    configure_logger(server_args, prefix=LOG_PREFIX)
    stream = io.StringIO()
    for handler in logging.getLogger().handlers:
        handler.setStream(stream)
    return stream


def logs_prefill(server_args) -> bool:
    """A PD decode server receives its KV cache: it logs no prefill batch."""
    return server_args.disaggregation_mode != "decode"


def logs_decode(server_args) -> bool:
    """A PD prefill server hands each request on after its first token: no decode batch."""
    return server_args.disaggregation_mode != "prefill"


def _clock(now: float):
    import time as real
    from types import SimpleNamespace

    return SimpleNamespace(perf_counter=lambda: now, time=real.time, monotonic=real.monotonic,
                           sleep=real.sleep)


def fixed_clock(module, now: float = 1000.0 + LOG_GAP_S):
    """Make `module.time.perf_counter()` answer `now`, so the throughput a log line prints is
    tokens / LOG_GAP_S (the tics are set to 1000.0) and not the speed of this machine."""
    module.time = _clock(now)


def stats_scheduler(server_args, disaggregation_mode, speculative_algorithm, pool_stats,
                    **extra):
    """(scheduler, running batch): the state the stats-reporting functions of 0.5.12+ read
    (`report_prefill_stats` / `report_decode_stats`), for the numbers above. The release's
    DisaggregationMode and SpeculativeAlgorithm classes and its PoolStats for the KV pool are
    passed in; `extra` adds what only one release reads."""
    from types import SimpleNamespace

    sa = server_args
    reqs = [SimpleNamespace(pending_bootstrap=False) for _ in range(RUNNING)]
    batch = SimpleNamespace(forward_iter=None, reqs=reqs, dp_cooperation_info=None)
    scheduler = SimpleNamespace(
        server_args=sa, waiting_queue=[object()] * WAITING, forward_ct=1234, forward_ct_decode=0,
        disaggregation_mode=disaggregation_mode(sa.disaggregation_mode or "null"),
        disagg_prefill_bootstrap_queue=SimpleNamespace(queue=[object()] * PD_BOOTSTRAP),
        disagg_prefill_inflight_queue=[object()] * PD_INFLIGHT,
        disagg_decode_prealloc_queue=SimpleNamespace(
            num_tokens_pre_allocated=PD_PREALLOCATED_TOKENS, queue=[object()] * PD_PREALLOC,
            retracted_queue=[]),
        disagg_decode_transfer_queue=SimpleNamespace(queue=[object()] * PD_TRANSFER),
        max_total_num_tokens=MAX_TOTAL_TOKENS, running_batch=batch,
        spec_algorithm=speculative_algorithm.from_string(sa.speculative_algorithm),
        is_stats_logging_rank=True, current_scheduler_metrics_enabled=False,
        last_prefill_stats_tic=1000.0, last_decode_stats_tic=1000.0,
        _graph_backend_label="cuda graph", enable_mfu_metrics=False,
        num_generated_tokens=DECODE_GENERATED_TOKENS, spec_num_accept_tokens=SPEC_ACCEPTED,
        spec_num_forward_ct=SPEC_FORWARDS, spec_total_num_accept_tokens=0,
        spec_total_num_forward_ct=0, scheduler_status_logger=None, stats=SimpleNamespace(),
        get_pool_stats=lambda: pool_stats(
            full_num_used=USED_TOKENS, full_token_usage=USED_TOKENS / MAX_TOTAL_TOKENS,
            full_available_size=MAX_TOTAL_TOKENS - USED_TOKENS - EVICTABLE_TOKENS,
            full_evictable_size=EVICTABLE_TOKENS),
        _publish_kv_events=lambda: None, **extra)
    return scheduler, batch


def request_records(server_args, tm, rts, batch_output, request, grammar: bool, folder: str,
                    out: Path) -> None:
    """The records of `--export-metrics-to-file`, for the first RECORDED requests of FINISHED:
    each request's output as the release's own TokenizerManager._handle_batch_output (module
    `tm`) builds it from the scheduler's batch output (`batch_output`, with the release's
    SchedulerReqTimeStats from `rts`), plus the response-sent time its _wait_one_response
    adds, written by the release's FileRequestMetricsExporter into `folder` with the skip
    names of its RequestLogger; the files' lines end up in out/request_records.log. The clocks
    are fixed: perf_counter() runs from 1000.0, wall time is RECORD_EPOCH + perf_counter()."""
    import asyncio
    import dataclasses

    sa = server_args
    names = set(getattr(batch_output, "__struct_fields__", None) or  # msgspec (0.5.23)
                (f.name for f in dataclasses.fields(batch_output)))
    rts.global_diff_realtime_monotonic = RECORD_EPOCH
    m = tm.TokenizerManager.__new__(tm.TokenizerManager)
    m.__dict__.update(server_args=sa, enable_metrics=True, skip_tokenizer_init=True,
                      incremental_streaming_output=False, dump_requests_folder=None,
                      crash_dump_folder=None, enable_lora=False, rid_to_state={},
                      config_value=lambda key: "default",
                      collect_metrics=lambda *args: None)  # the Prometheus side: not recorded
    m.init_request_logging_and_dumping()

    async def one(i: int) -> None:
        prompt, gen, cached, e2e, ttft, _itl = FINISHED[i]
        start = 1000.0 + 10.0 * i
        obj = request(**request_input(i, grammar))
        api = rts.APIServerReqTimeStats()
        api.set_created_time(start)
        api.set_api_server_dispatch_finish_time(start + 0.002)
        sched = rts.SchedulerReqTimeStats()
        sched.set_wait_queue_entry_time(start + 0.003)
        sched.set_forward_entry_time(start + 0.053 + 0.01 * i)
        sched.set_prefill_finished_time(start + ttft)
        state = tm.ReqState(out_list=[], finished=False, event=asyncio.Event(), obj=obj,
                            time_stats=api)
        m.rid_to_state[obj.rid] = state
        # A streaming request's first token comes back in a batch of its own; a non-streaming
        # one's output only when it finishes (the scheduler's stream_output).
        batches = [(start + ttft, None, 1), (start + e2e, {"type": "stop", "matched": 151645},
                                             gen)]
        for now, finished, tokens in batches[0 if obj.stream else 1:]:
            fields = dict.fromkeys(names)
            fields.update(
                rids=[obj.rid], finished_reasons=[finished], decoded_texts=[""],
                decode_ids=[[]], read_offsets=[0], output_ids=[[]], skip_special_tokens=[True],
                spaces_between_special_tokens=[True], no_stop_trim=[False],
                prompt_tokens=[prompt], reasoning_tokens=[0], completion_tokens=[tokens],
                cached_tokens=[cached], retraction_counts=[0], time_stats=[sched],
                spec_verify_ct=[tokens // 3], spec_num_correct_drafts=[tokens // 3 * 17 // 10],
                spec_num_cap_tokens=[0], spec_num_block_accept_tokens=[0])
            fixed_clock(tm, now)
            fixed_clock(rts, now)
            await m._handle_batch_output(batch_output(**{
                k: v for k, v in fields.items() if k in names}))
        result = state.out_list[-1]
        fixed_clock(rts, start + e2e + 0.001)
        state.time_stats.set_response_sent_to_client_time()
        result["meta_info"]["response_sent_to_client_ts"] = (
            state.time_stats.get_response_sent_to_client_realtime())
        await m.request_metrics_exporter_manager.write_record(obj, result)

    async def traffic() -> None:
        for i in range(RECORDED):
            await one(i)

    asyncio.run(traffic())
    lines = [path.read_text() for path in sorted(Path(folder).iterdir())]
    (out / "request_records.log").write_text("".join(lines))
    shutil.rmtree(folder)


def run_server(variant: str, flags: dict, out: Path, *, scheduler_rank, tokenizer,
               json_bodies, middleware, detokenizer=None, log_lines=None,
               request_records=None) -> dict:
    """A release's server, process by process (each TP rank's scheduler, the tokenizer, the
    detokenizer where the release monitors it, the JSON bodies, the stats rank's log lines, the
    request records where the release writes them), then its /metrics answers and the manifest.
    `middleware()` imports the release's add_prometheus_middleware, after the processes ran."""
    for rank in range(TP):
        run_process(scheduler_rank, rank, flags)
    run_process(tokenizer, flags, variant == "grammar")
    if detokenizer is not None:
        run_process(detokenizer, flags)
    run_process(json_bodies, flags, out)
    if log_lines is not None:
        run_process(log_lines, flags, out)
    if request_records is not None and variant in RECORD_VARIANTS:
        run_process(request_records, flags, variant == "grammar", out)
    manifest = answer(out, middleware())
    manifest["families_defined"] = defined_families()
    return manifest


def http_traffic(add_middleware) -> None:
    """The release's HTTP metrics middleware (`add_middleware`, installed as its server installs
    it) over the routes clients call, and the requests of the traffic: one per finished
    request, four health checks and a model listing."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse

    app = FastAPI()
    for route in ("/generate", "/v1/chat/completions", "/health", "/v1/models"):
        app.add_api_route(route, lambda: JSONResponse({}), methods=["GET", "POST"])
    add_middleware(app)
    for i in range(len(FINISHED)):
        asgi_get(app, "/v1/chat/completions" if i % 2 else "/generate", None, method="POST")
    for _ in range(4):
        asgi_get(app, "/health", None)
    asgi_get(app, "/v1/models", None)
