"""Regenerates docs/compare.md's examples (`make generate`; tests/test_compare.py fails when
they are stale).

The seed 000 incident (`long-context-incident`), its tuned configuration
(`long-context-incident-tuned`) and `healthy` are backfilled into one Prometheus as three
windows of the same server, hours apart so that no 1 h recording rule of one reaches another.
Every backfill ends at a fixed time, so the examples' times and numbers stay put from one run to
the next (the bootstrap is seeded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sglang_obs.core.doc_blocks import replace_blocks
from sglang_obs.core.settings import Settings
from sglang_obs.core.times import parse_time
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.tools.compare import run

DOC = "compare.md"  # in docs/
INCIDENT_END = parse_time("2026-11-29T11:00:00Z")
ENDS = {"healthy": INCIDENT_END - 3 * 3600, "long-context-incident": INCIDENT_END,
        "long-context-incident-tuned": INCIDENT_END + 3 * 3600}


@contextlib.contextmanager
def served(data: Path, s: Settings) -> Iterator[tuple[str, dict[str, tuple[str, str]]]]:
    """(Prometheus URL, {scenario: (start, end) as Unix-time strings}) over `data`."""
    windows = {}
    for name, end in ENDS.items():
        b = backfill(name, data, end=end, alerts=True, s=s)
        windows[name] = (f"{b.start:.0f}", f"{b.end:.0f}")
    with prometheus(data, retention="10y") as url:
        yield url, windows


def _verdict(text: str) -> str:
    """The report's verdict section, its heading left out."""
    body = text.split("## Verdict\n", 1)[1].split("\n## ", 1)[0]
    return body.strip("\n") + "\n"


def blocks(url: str, windows: dict[str, tuple[str, str]], s: Settings) -> dict[str, str]:
    before, after = windows["long-context-incident"], windows["long-context-incident-tuned"]
    _, example = run(url, before, after, s=s)
    _, paired = run(url, before, after, paired=True, s=s)
    _, apart = run(url, windows["healthy"], before, s=s)
    command = ("sglang-obs compare --prometheus http://127.0.0.1:9090 \\\n"
               f"    --before {before[0]} {before[1]} --after {after[0]} {after[1]}")
    return {"example": f"```sh\n{command}\n```\n\n" + example.replace("\n# ", "\n### ")
            .replace("\n## ", "\n#### ").replace("# SGLang compare", "### SGLang compare", 1),
            "example-paired": "```\n" + _verdict(paired) + "```\n",
            "not-comparable": "```\n" + _verdict(apart) + "```\n"}


def render(text: str, url: str, windows: dict[str, tuple[str, str]], s: Settings) -> str:
    return replace_blocks(text, blocks(url, windows, s), s.docs_dir / DOC)
