"""What every release's driver shares: the variants, the traffic, the model, and the ways
of asking an ASGI app and reading an exposition (stdlib only: it runs in SGLang's virtualenv)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
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


FINISHED = [  # (prompt, generation, cached, e2e s, ttft s, itl s)
    (1200 + 97 * i, 180 + 11 * i, 512 if i % 3 else 0, 2.5 + 0.11 * i, 0.21 + 0.01 * i,
     0.012 + 0.0004 * i) for i in range(40)]


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


def run_server(variant: str, flags: dict, out: Path, *, scheduler_rank, tokenizer,
               json_bodies, middleware, detokenizer=None) -> dict:
    """A release's server, process by process (each TP rank's scheduler, the tokenizer, the
    detokenizer where the release monitors it, the JSON bodies), then its /metrics answers and
    the manifest. `middleware()` imports the release's add_prometheus_middleware, after the
    processes ran."""
    for rank in range(TP):
        run_process(scheduler_rank, rank, flags)
    run_process(tokenizer, flags, variant == "grammar")
    if detokenizer is not None:
        run_process(detokenizer, flags)
    run_process(json_bodies, flags, out)
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
