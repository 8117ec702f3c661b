"""GPU collector benchmarks reported in docs/performance.md: the CPU time of one sampling
cycle for 8 fake H200 GPUs (every field supported, GPM on), and the scrape latency of the
exporter's /metrics serving them.

Run: .venv/bin/python bench/bench_gpu.py
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from prometheus_client import CollectorRegistry  # noqa: E402

from sglang_obs.exporter.collector import GpuCollector, GuardedCollector  # noqa: E402
from sglang_obs.exporter.gpu import GpuSampler  # noqa: E402
from sglang_obs.exporter.nvml import NvmlBackend  # noqa: E402
from sglang_obs.exporter.web import Exposition, make_app, serve  # noqa: E402
from sglang_obs.exporter.xid import XidWatcher  # noqa: E402
from sglang_obs.simulator.fake_nvml import h200_machine  # noqa: E402


def main() -> None:
    nvml = h200_machine()
    backend = NvmlBackend(nvml)
    sampler = GpuSampler(backend, XidWatcher(nvml))
    sampler.sample()  # first cycle: init and GPM seed
    cpu = []
    for _ in range(200):
        start = time.process_time()
        sampler.sample()
        cpu.append(time.process_time() - start)
    registry = CollectorRegistry()
    registry.register(GuardedCollector([GpuCollector(sampler)]))
    exposition = Exposition(registry)
    server = serve(make_app(exposition, "/metrics", []), "127.0.0.1:0")
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    text = urllib.request.urlopen(url).read().decode()
    wall = []
    for _ in range(300):
        exposition.changed()  # a new sample before every scrape: each one renders
        start = time.perf_counter()
        urllib.request.urlopen(url, timeout=5).read()
        wall.append(time.perf_counter() - start)
    server.shutdown()
    print(json.dumps({
        "gpus": len(sampler.reading.gpus),
        "series": sum(1 for ln in text.splitlines() if ln and not ln.startswith("#")),
        "sampling_cycle_cpu_ms_median": statistics.median(cpu) * 1e3,
        "scrape_ms_median": statistics.median(wall) * 1e3,
    }, indent=2))


if __name__ == "__main__":
    main()
