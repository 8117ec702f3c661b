"""GPU collector benchmarks reported in docs/performance.md: the CPU time of one sampling
cycle for 8 fake H200 GPUs (every field supported, GPM on), and the scrape latency of the
exporter's /metrics serving them.

Run: .venv/bin/python bench/bench_gpu.py [--json bench/results/gpu.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from prometheus_client import CollectorRegistry  # noqa: E402
from results_file import emit, machine  # noqa: E402

from sglang_obs.exporter.collector import GpuCollector, GuardedCollector  # noqa: E402
from sglang_obs.exporter.gpu import GpuSampler  # noqa: E402
from sglang_obs.exporter.nvml import NvmlBackend  # noqa: E402
from sglang_obs.exporter.web import Exposition, make_app, serve  # noqa: E402
from sglang_obs.exporter.xid import XidWatcher  # noqa: E402
from sglang_obs.simulator.fake_nvml import h200_machine  # noqa: E402


def run() -> dict:
    load_at_start = os.getloadavg()
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
    return {
        "gpus": len(sampler.reading.gpus),
        "series": sum(1 for ln in text.splitlines() if ln and not ln.startswith("#")),
        "cycles": len(cpu), "scrapes": len(wall),
        "sampling_cycle_cpu_ms": {"min": min(cpu) * 1e3, "median": statistics.median(cpu) * 1e3},
        "scrape_ms": {"min": min(wall) * 1e3, "median": statistics.median(wall) * 1e3},
        "sample_interval_s": sampler.interval,
        "machine": machine(load_at_start),
    }


def doc_block(r: dict) -> str:
    m, cycle, scrape = r["machine"], r["sampling_cycle_cpu_ms"], r["scrape_ms"]
    share = cycle["median"] / 1e3 / r["sample_interval_s"] * 100
    return (f"Measured by `bench/bench_gpu.py {' '.join(m['argv'])}` on {m['date']}: "
            f"{m['cpus']} CPUs, Python {m['python']}, 1-minute load average "
            f"{m['loadavg_at_start'][0]:.1f} at the start and {m['loadavg'][0]:.1f} at the end; "
            f"the fake NVML's {r['gpus']} H200 GPUs, every field supported (GPM on).\n\n"
            "| what | min | median |\n|---|---|---|\n"
            f"| CPU of one sampling cycle ({r['cycles']} cycles), ms | {cycle['min']:.2f} | "
            f"{cycle['median']:.2f} (every {r['sample_interval_s']:g} s by default: "
            f"{share:.2f} % of a core) |\n"
            f"| `/metrics` serving the {r['gpus']} GPUs ({r['series']} series), a render before "
            f"each of {r['scrapes']} loopback GETs, ms | {scrape['min']:.2f} | "
            f"{scrape['median']:.2f} |\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    emit(run(), args.json, doc_block)


if __name__ == "__main__":
    main()
