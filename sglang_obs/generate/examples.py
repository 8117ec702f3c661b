"""Regenerates the README's pictures and the example snapshot pack (`make generate`).

- docs/images/overview-long-context-incident.png and overview-healthy.png: the overview
  dashboard drawn by render-dashboard for the seed 000 incident and a healthy server;
- docs/examples/snapshot-long-context-incident/: `sglang-obs snapshot` of the incident (report,
  CSV, JSON and its chart), backfilled with its ALERTS series.

Every backfill ends at END, so the example's times (which the README quotes) stay put from one
run to the next.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from sglang_obs import config_dir
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.generate.render_dashboard import DASHBOARDS, render_pngs
from sglang_obs.times import parse_time
from sglang_obs.tools.snapshot import take

DOCS = (config_dir.checkout() or Path.cwd()) / "docs"
END = parse_time("2026-11-29T11:00:00Z")
INCIDENT = "long-context-incident"
SNAPSHOT = DOCS / "examples" / f"snapshot-{INCIDENT}"


def overviews() -> list[Path]:
    overview = DASHBOARDS / "sglang-overview.json"
    return [render_pngs(name, [(overview, DOCS / "images" / f"overview-{name}.png")],
                        end=END)[0] for name in (INCIDENT, "healthy")]


def snapshot_pack() -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        b = backfill(INCIDENT, Path(tmp) / "data", end=END, alerts=True)
        pack = Path(tmp) / "pack"
        with prometheus(b.data, retention="10y") as url:
            take(url, str(b.start), str(b.end), pack)
        shutil.rmtree(SNAPSHOT, ignore_errors=True)
        shutil.copytree(pack, SNAPSHOT)
    return sorted(SNAPSHOT.iterdir())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    written = ([] if "--snapshot-only" in argv else overviews()) + snapshot_pack()
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
