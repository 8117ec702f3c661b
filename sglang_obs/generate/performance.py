"""docs/performance.md's measured blocks, from the JSON each bench/ script writes into
bench/results/ (`make bench` runs the scripts, then this): no figure in that document is copied
by hand, and `generate --check` fails when a block no longer says what its JSON holds.

Each bench script has `doc_block(results) -> str`; it is loaded from the checkout's bench/ folder
(bench/ is not installed), so outside a checkout there is nothing to make.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from sglang_obs.core.doc_blocks import replace_blocks

DOC = "performance.md"
RESULTS = Path("bench") / "results"
# Block name -> (script in bench/, its JSON in bench/results/)
BENCHES = {
    "bench-exporter": ("bench_exporter.py", "exporter.json"),
    "bench-snapshot": ("bench_snapshot.py", "snapshot.json"),
    "bench-log": ("bench_log.py", "log.json"),
    "bench-request-records": ("bench_request_records.py", "request_records.json"),
    "bench-gpu": ("bench_gpu.py", "gpu.json"),
    "bench-status-page": ("bench_status_page.py", "status_page.json"),
    "bench-slow-clients": ("bench_slow_clients.py", "slow_clients.json"),
    "bench-fleet-capacity": ("fleet_capacity.py", "fleet_capacity.json"),
}


class PerformanceError(ValueError):
    """A block's JSON is missing or unreadable."""


def _script(path: Path):
    """The script as a module, with its folder importable as when it runs (its helpers)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def blocks(checkout: Path) -> dict[str, str]:
    out = {}
    for name, (script, results) in BENCHES.items():
        path = checkout / RESULTS / results
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise PerformanceError(f"{path}: {err} (run `make bench`)") from None
        out[name] = _script(checkout / "bench" / script).doc_block(data)
    return out


def render(doc_text: str, doc: Path, checkout: Path) -> str:
    return replace_blocks(doc_text, blocks(checkout), doc)
