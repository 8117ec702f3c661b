"""Real-hardware check: run the GPU collector once against the real NVML and print what it
exports, with timings. Run on a GPU host (or the device tool's machine):

    python bench/nvml_smoke.py [--cycles 3] [--processes]

Exits 1 if NVML is unavailable, after saying why.
"""

from __future__ import annotations

import argparse
import time

from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.collector import GpuCollector, GuardedCollector
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.nvml import NvmlBackend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--processes", action="store_true")
    args = parser.parse_args()
    sampler = GpuSampler(NvmlBackend(processes=args.processes))
    cycles = []
    for _ in range(args.cycles):
        start = time.perf_counter()
        reading = sampler.sample()
        cycles.append(time.perf_counter() - start)
        time.sleep(1.0)  # GPM needs two samples at least a second apart
    if sampler.unavailable_reason:
        print(f"NVML unavailable: {sampler.unavailable_reason}")
        return 1
    registry = CollectorRegistry()
    registry.register(GuardedCollector([GpuCollector(sampler)]))
    start = time.perf_counter()
    text = generate_latest(registry).decode()
    render = time.perf_counter() - start
    print(text)
    print(f"# GPUs: {len(reading.gpus)}, driver {reading.driver_version}, "
          f"CUDA {reading.cuda_driver_version}")
    print("# sampling cycles (s): " + ", ".join(f"{c:.4f}" for c in cycles))
    print(f"# render (s): {render:.4f}, series: "
          f"{sum(1 for ln in text.splitlines() if ln and not ln.startswith('#'))}")
    unsupported = sorted({f for _, f in sampler.backend._unsupported})
    print(f"# fields not supported here: {', '.join(unsupported) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
