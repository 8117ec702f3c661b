"""Exporter benchmarks reported in docs/performance.md.

1. Scrape latency: GET /metrics of the exporter vs a bare prometheus_client registry holding the
   same number of series, both over loopback HTTP (median of N scrapes). Target <= 1.3x.
2. Poll-cycle CPU: CPU time of one TargetPoller.poll_once() (HTTP client, parse, aggregation,
   load JSON, derivation, snapshot) vs the bare prometheus_client parse of the same exposition.
   The fake SGLang runs in another process so its CPU is not counted. Target <= 1.5x.
3. RSS of a running `sglang-exporter` process polling one server every second.

Run: `make bench` (or .venv/bin/python bench/bench_exporter.py [--servers N] [--scrapes N]).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent

from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector  # noqa: E402
from sglang_obs.exporter.poller import PollSettings, TargetPoller  # noqa: E402
from sglang_obs.exporter.web import make_app, serve  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "sglang"
STAGES = ("request_process", "prefill_forward", "chunked_prefill", "prefill_bootstrap",
          "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_waiting",
          "decode_transferred", "fake_output", "quick_finish")


def realistic_exposition() -> str:
    """The 0.5.23 TP4 fixture plus the big histogram families a real 0.5.23 server also has
    (per-stage latency: 11 stages x 30 buckets; token histograms: 40 buckets x streaming split)."""
    lines = [(FIXTURES / "metrics_0.5.23_tp4.prom").read_text().rstrip("\n")]
    base = 'model_name="qwen3-27b",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    lines.append("# HELP sglang:per_stage_req_latency_seconds Per-stage request latency.")
    lines.append("# TYPE sglang:per_stage_req_latency_seconds histogram")
    bounds = [0.001 * 1.62**i for i in range(30)]
    for stage in STAGES:
        for i, b in enumerate(bounds):
            lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{base},stage="{stage}",'
                         f'le="{b!r}"}} {float(i * 3)}')
        lines.append(f'sglang:per_stage_req_latency_seconds_bucket{{{base},stage="{stage}",'
                     f'le="+Inf"}} 100.0')
        lines.append(f'sglang:per_stage_req_latency_seconds_count{{{base},stage="{stage}"}} 100.0')
        lines.append(f'sglang:per_stage_req_latency_seconds_sum{{{base},stage="{stage}"}} 12.5')
    token_bounds = [100, 300, 500, 700, 1000, 1500, *range(2000, 10001, 1000),
                    *range(12500, 30001, 2500), 35000, 40000, 60000, 80000, 1e5, 2e5, 3e5, 4e5,
                    6e5, 8e5, 1e6, 1.1e6]
    for family in ("prompt_tokens_histogram", "generation_tokens_histogram",
                   "uncached_prompt_tokens_histogram"):
        lines.append(f"# HELP sglang:{family} Token histogram.")
        lines.append(f"# TYPE sglang:{family} histogram")
        for streaming in ("true", "false"):
            labels = f'model_name="qwen3-27b",engine_type="unified",is_streaming="{streaming}"'
            for i, b in enumerate(token_bounds):
                lines.append(f'sglang:{family}_bucket{{{labels},le="{float(b)!r}"}} {float(i)}')
            lines.append(f'sglang:{family}_bucket{{{labels},le="+Inf"}} 50.0')
            lines.append(f'sglang:{family}_count{{{labels}}} 50.0')
            lines.append(f'sglang:{family}_sum{{{labels}}} 123456.0')
    return "\n".join(lines) + "\n"


FAKE_SERVER = """
import sys, time
sys.path.insert(0, {tests!r})
from fake_sglang import FakeSGLang, Route
routes = {{"/metrics": Route(open({metrics!r}, "rb").read()),
          "/v1/loads": Route(open({loads!r}, "rb").read(), content_type="application/json"),
          "/server_info": Route(open({info!r}, "rb").read(), content_type="application/json")}}
server = FakeSGLang(routes)
print(server.url, flush=True)
time.sleep(3600)
"""


def start_fake_server(tmp: Path, exposition: str) -> tuple[subprocess.Popen, str]:
    metrics = tmp / "metrics.prom"
    metrics.write_text(exposition)
    code = FAKE_SERVER.format(tests=str(ROOT / "tests"), metrics=str(metrics),
                              loads=str(FIXTURES / "v1_loads_0.5.23.json"),
                              info=str(FIXTURES / "server_info_0.5.12_seed.json"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def cpu_median(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def bench_poll_cpu(url: str, exposition: str, repeats: int) -> dict:
    poller = TargetPoller(url, PollSettings(timeout=5))
    poller.poll_once()  # warm-up; also reads server_info once
    poll = cpu_median(poller.poll_once, repeats)
    parse = cpu_median(lambda: list(text_string_to_metric_families(exposition)), repeats)
    return {"exposition_lines": exposition.count("\n"), "poll_cpu_ms": poll * 1e3,
            "bare_parse_cpu_ms": parse * 1e3, "ratio": poll / parse}


def wall_median_scrape(url: str, scrapes: int) -> float:
    samples = []
    for _ in range(scrapes):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=5) as resp:
            resp.read()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_scrape(url: str, servers: int, scrapes: int) -> dict:
    pollers = [TargetPoller(url, PollSettings(timeout=5)) for _ in range(servers)]
    for i, p in enumerate(pollers):  # distinct server labels, same answers
        p.server = f"10.0.0.{i + 1}:30000"
        p.poll_once()
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector(pollers)]))
    ours = serve(make_app(registry, "/metrics", []), "127.0.0.1:0")
    text = urllib.request.urlopen(f"http://127.0.0.1:{ours.server_address[1]}/metrics").read()
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))

    bare_registry = CollectorRegistry()
    gauge = Gauge("bare_series", "Same number of series.", ["server", "n"], registry=bare_registry)
    for i in range(series):
        gauge.labels(f"10.0.0.{i % servers}:30000", str(i)).set(i)
    bare = serve(make_app(bare_registry, "/metrics", []), "127.0.0.1:0")

    ours_ms = wall_median_scrape(f"http://127.0.0.1:{ours.server_address[1]}/metrics", scrapes)
    bare_ms = wall_median_scrape(f"http://127.0.0.1:{bare.server_address[1]}/metrics", scrapes)
    ours.shutdown()
    bare.shutdown()
    return {"servers": servers, "series": series, "exporter_ms": ours_ms * 1e3,
            "bare_registry_ms": bare_ms * 1e3, "ratio": ours_ms / bare_ms}


def bench_rss(url: str, seconds: float) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "sglang-exporter"
    proc = subprocess.Popen([str(exe), "--sglang.url", url, "--web.listen-address",
                             f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # scrape it like Prometheus would, only faster
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            time.sleep(1)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kib = int(next(line for line in status.splitlines()
                           if line.startswith("VmRSS")).split()[1])
    finally:
        proc.terminate()
        proc.wait()
    return {"seconds": seconds, "rss_mib": rss_kib / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rss-seconds", type=float, default=30)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        exposition = realistic_exposition()
        fake, url = start_fake_server(Path(tmp), exposition)
        try:
            results = {
                "poll_cpu": bench_poll_cpu(url, exposition, args.repeats),
                "scrape": bench_scrape(url, args.servers, args.scrapes),
                "rss": bench_rss(url, args.rss_seconds),
            }
        finally:
            fake.terminate()
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
