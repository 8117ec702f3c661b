"""Regenerates the README's pictures and the example snapshot pack (`make generate`).

- docs/images/overview-long-context-incident.png and overview-healthy.png: the overview
  dashboard drawn by render-dashboard for the seed 000 incident and a healthy server;
- docs/images/pd-overview-kv-transfer-bottleneck.png and pd-gateway-circuit-open.png: the PD
  deployment's dashboards on the incidents they explain (docs/pd.md);
- docs/examples/snapshot-long-context-incident/: `sglang-obs snapshot` of the incident (report,
  CSV, JSON and its chart), backfilled with its ALERTS series.

Every backfill ends at END, so the example's times (which the README quotes) stay put from one
run to the next.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sglang_obs.core.settings import Settings
from sglang_obs.core.times import parse_time
from sglang_obs.generate.backfill import backfill, prometheus
from sglang_obs.generate.render_dashboard import render_pngs
from sglang_obs.tools.snapshot import take

END = parse_time("2026-11-29T11:00:00Z")
INCIDENT = "long-context-incident"


def overviews(images: Path, s: Settings) -> list[Path]:
    """overview-<scenario>.png for the incident and a healthy server, into `images`."""
    overview = s.dashboards_dir / "sglang-overview.json"
    return [render_pngs(name, [(overview, images / f"overview-{name}.png")], end=END, s=s)[0]
            for name in (INCIDENT, "healthy")]


# (dashboard, scenario, picture): the PD dashboards on the incidents they explain.
PD_PICTURES = (("sglang-pd", "pd-kv-transfer-bottleneck", "pd-overview-kv-transfer-bottleneck.png"),
               ("sglang-gateway", "pd-circuit-open", "pd-gateway-circuit-open.png"))


def pd_dashboards(images: Path, s: Settings) -> list[Path]:
    """Each PD_PICTURES picture, into `images`."""
    return [render_pngs(scenario, [(s.dashboards_dir / f"{uid}.json", images / name)],
                        end=END, s=s)[0]
            for uid, scenario, name in PD_PICTURES]


def snapshot_pack(out: Path, s: Settings) -> None:
    """`sglang-obs snapshot` of the incident's backfill (with its ALERTS), into `out` (new)."""
    with tempfile.TemporaryDirectory() as tmp:
        b = backfill(INCIDENT, Path(tmp) / "data", end=END, alerts=True, s=s)
        with prometheus(b.data, retention="10y") as url:
            take(url, str(b.start), str(b.end), out, s=s)
