"""Series the exporter serves with its default collectors (SGLang + NVML), counted per family.

Two setups, built the way the golden-exposition tests build their registries (fake SGLang
servers answering recorded fixtures, simulator/fake_nvml.py's 8-GPU H200 machine):

  tp8  one 8-GPU host, one TP8 SGLang server
  dp1  one 8-GPU host, eight DP1 SGLang servers (one per GPU)

Counting only, no timing. Run: .venv/bin/python bench/series_count.py [--families]
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "sglang"  # recorded SGLang answers (data)

from prometheus_client import CollectorRegistry  # noqa: E402

from sglang_obs.core.sglang import SGLANG_PORT  # noqa: E402
from sglang_obs.exporter.catalogue import METRICS, PREFIX  # noqa: E402
from sglang_obs.exporter.collector import GpuCollector, GuardedCollector, SGLangCollector  # noqa: E402
from sglang_obs.exporter.gpu import GpuSampler  # noqa: E402
from sglang_obs.exporter.nvml import NvmlBackend  # noqa: E402
from sglang_obs.exporter.poller import PollSettings, TargetPoller  # noqa: E402
from sglang_obs.exporter.xid import XidWatcher  # noqa: E402
from sglang_obs.simulator.fake_nvml import h200_machine  # noqa: E402
from sglang_obs.simulator.replay import FakeSGLang, Route, json_route, text_route  # noqa: E402

GROUP = {spec.name: spec.group for spec in METRICS}


def server_routes(tp_size: int) -> dict[str, Route]:
    """A 0.5.23 server (the newest recorded release) announcing the given TP size, DP1."""
    info = json.loads((FIXTURES / "server_info_0.5.12_seed.json").read_text())
    info.update(tp_size=tp_size, dp_size=1, version="0.5.23")
    return {
        "/metrics": text_route(FIXTURES / "metrics_0.5.23_tp4.prom"),
        "/v1/loads": json_route(FIXTURES / "v1_loads_0.5.23.json"),
        "/server_info": Route(json.dumps(info).encode(), content_type="application/json"),
        "/v1/models": json_route(FIXTURES / "v1_models_qwen3.json"),
    }


def registry_for(tp_sizes: list[int]) -> tuple[CollectorRegistry, list[FakeSGLang]]:
    servers, pollers = [], []
    for i, tp in enumerate(tp_sizes):
        server = FakeSGLang(server_routes(tp))
        servers.append(server)
        poller = TargetPoller(server.url, PollSettings(timeout=2.0),
                              clock=itertools.count(1000.0, 1.0).__next__)
        poller.server = f"10.0.0.5:{SGLANG_PORT + i}"
        pollers.append(poller)
    for _ in range(3):
        for poller in pollers:
            poller.poll_once()
    nvml = h200_machine()
    sampler = GpuSampler(NvmlBackend(nvml), XidWatcher(nvml))
    sampler.sample()
    sampler.sample()  # the second cycle has the GPM ratios
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector(pollers), GpuCollector(sampler)]))
    return registry, servers


def count(registry: CollectorRegistry) -> Counter:
    """Series per family (a histogram's buckets, _sum and _count are series of its family)."""
    per_family: Counter = Counter()
    for family in registry.collect():
        name = family.name
        if family.type == "counter":
            name += "_total"
        elif family.type == "info":
            name += "_info"
        per_family[name] += len(family.samples)
    return per_family


def group_of(family: str) -> str:
    if family.startswith(PREFIX + "gpu_"):
        return "GPU"
    return GROUP.get(family, "other")


def report(title: str, per_family: Counter, families: bool) -> int:
    total = sum(per_family.values())
    print(f"== {title}: {total} series")
    groups: Counter = Counter()
    for family, n in per_family.items():
        groups[group_of(family)] += n
    for group, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {group:32s} {n:4d}")
        if families:
            for family, m in sorted(per_family.items()):
                if group_of(family) == group:
                    print(f"      {family.removeprefix(PREFIX):54s} {m:4d}")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", action="store_true", help="list every family")
    args = parser.parse_args()
    for title, tp_sizes in (("tp8: 8 x H200 + one TP8 server", [8]),
                            ("dp1: 8 x H200 + eight DP1 servers", [1] * 8)):
        registry, servers = registry_for(tp_sizes)
        try:
            report(title, count(registry), args.families)
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
