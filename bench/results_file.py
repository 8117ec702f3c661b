"""What every bench script records beside its figures, and how it writes them: the machine, the
date and the load (docs/performance.md's blocks name them), the JSON for bench/results/, then
the block printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path


def machine(load_at_start: tuple[float, float, float]) -> dict:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0],
            "date": datetime.now(timezone.utc).strftime("%a %b %d %Y, %H:%M UTC"),
            "loadavg_at_start": load_at_start, "loadavg": os.getloadavg(), "argv": sys.argv[1:]}


def emit(results: dict, path: Path | None, doc_block: Callable[[dict], str]) -> None:
    """Writes `results` to `path` (if given) as JSON, prints it and its block."""
    text = json.dumps(results, indent=2)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    print(text)
    print()
    print(doc_block(results))
