"""Regenerates docs/capacity.md's examples (`python -m sglang_obs.generate capacity-example`;
tests/test_capacity.py fails when they are stale).

The seed 000 incident (`long-context-incident`) and `healthy` are backfilled into one Prometheus,
hours apart (as docs/compare.md's examples), each is taken as a snapshot pack, and `sglang-obs
capacity --pack` reads each pack: what a capacity planner gets from a pack with no Prometheus.
Every backfill ends at a fixed time, so the examples' times and numbers stay put.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sglang_obs.core.doc_blocks import replace_blocks
from sglang_obs.core.settings import Settings
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.generate.compare_example import ENDS
from sglang_obs.tools import capacity
from sglang_obs.tools.snapshot import take

DOC = "capacity.md"  # in docs/
SCENARIOS = {"incident": "long-context-incident", "healthy": "healthy"}


@contextlib.contextmanager
def packs(s: Settings) -> Iterator[dict[str, Path]]:
    """{example: snapshot pack folder} of each SCENARIOS backfill, Prometheus stopped."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "data", {}
        windows = {name: backfill(scenario, data, end=ENDS[scenario], alerts=True, s=s)
                   for name, scenario in SCENARIOS.items()}
        with prometheus(data, retention="10y") as url:
            for name, b in windows.items():
                out[name] = Path(tmp) / name
                take(url, str(b.start), str(b.end), out[name], charts=False, s=s)
        yield out


def blocks(folders: dict[str, Path], s: Settings) -> dict[str, str]:
    out = {}
    for name, folder in folders.items():
        _, text = capacity.run(None, None, pack_dir=folder, s=s)
        body = text.replace("\n## ", "\n#### ").replace("# SGLang capacity", "### SGLang capacity",
                                                          1)
        out[f"example-{name}"] = (f"```sh\nsglang-obs capacity --pack {name}/\n```\n\n"
                                  + body.rstrip("\n") + "\n")
    return out


def render(text: str, folders: dict[str, Path], s: Settings) -> str:
    return replace_blocks(text, blocks(folders, s), s.docs_dir / DOC)
