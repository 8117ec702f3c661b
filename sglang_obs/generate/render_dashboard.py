"""`sglang-obs render-dashboard`: a dashboard's panels as a PNG, for a simulator scenario.

Grafana cannot run everywhere (not in CI, not in a code review), so this draws the panels of a
generated dashboard JSON with matplotlib, from the same queries, against a real Prometheus
backfilled with the scenario: a reviewer sees what the on-call will see.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sglang_obs import config_dir
from sglang_obs.charts import pyplot
from sglang_obs.generate.backfill import STEP, backfill, prometheus
from sglang_obs.prometheus_api import Prometheus
from sglang_obs.states import STATE_COLOURS, STATES

ROOT = config_dir.resolve()  # prometheus/, alertmanager/, grafana/
DASHBOARDS = ROOT / "grafana" / "dashboards"
DRAWN = ("timeseries", "state-timeline", "stat", "bargauge")


@dataclass
class Series:
    legend: str
    times: list[float]
    values: list[float]


def substitute(expr: str, window_seconds: float) -> str:
    """Grafana's variables, as Grafana would fill them for "all" over the whole window."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", f"{STEP}s")
    expr = expr.replace("$__range", f"{int(window_seconds)}s")
    expr = re.sub(r"\$\{?(cluster|host|job|instance|model_name|server|gpu|exporter)\}?", ".*", expr)
    return expr


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def query_range(url: str, expr: str, start: float, end: float) -> list[dict]:
    """Prometheus's range result for `expr` at the backfill's step (raises PrometheusError)."""
    return Prometheus(url, timeout=60).range_series(expr, start, end, STEP)


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard.get("panels", []):
        out += panel.get("panels", []) if panel.get("type") == "row" else [panel]
    return [p for p in out if p.get("targets")]


def panel_series(url: str, panel: dict, start: float, end: float) -> list[Series]:
    series = []
    for target in panel["targets"]:
        expr = substitute(target.get("expr", ""), end - start)
        if not expr:
            continue
        for result in query_range(url, expr, start, end):
            values = [(float(t), float(v)) for t, v in result["values"]]
            series.append(Series(_legend(target.get("legendFormat", ""), result["metric"]),
                                 [t for t, _ in values], [v for _, v in values]))
    return series


def draw(panel_data: list[tuple[dict, list[Series]]], title: str, path: Path,
         start: float) -> None:
    plt = pyplot()

    cols = 3
    rows = math.ceil(len(panel_data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(panel_data):]:
        ax.axis("off")
    for ax, (panel, series) in zip(axes.flat, panel_data, strict=False):
        unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "")
        ax.set_title(panel.get("title", ""), fontsize=10, loc="left")
        if not series:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        if panel.get("type") == "state-timeline" and "state" in " ".join(
                t.get("expr", "") for t in panel["targets"]):
            _draw_states(ax, series, start)
        else:
            for s in series[:8]:
                ax.plot([(t - start) / 60 for t in s.times], s.values, label=s.legend[:40],
                        linewidth=1.2)
            if len(series) > 1:
                ax.legend(fontsize=6, loc="upper left")
        ax.set_xlabel("minutes", fontsize=7)
        ax.set_ylabel(unit, fontsize=7)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw_states(ax, series: list[Series], start: float) -> None:
    """One coloured band per server: the state classification over time."""
    for row, s in enumerate(series):
        for t, v in zip(s.times, s.values, strict=True):
            code = int(v)
            state = STATES[code] if 0 <= code < len(STATES) else "unavailable"
            ax.barh(row, STEP / 60, left=(t - start) / 60, color=STATE_COLOURS[state],
                    height=0.8)
    ax.set_yticks(range(len(series)), [s.legend[:20] for s in series], fontsize=7)
    from matplotlib.patches import Patch  # noqa: PLC0415

    handles = [Patch(color=c, label=n) for n, c in STATE_COLOURS.items()]
    ax.legend(handles=handles, fontsize=6, ncol=4, loc="upper right")


def render_png(scenario: str, dashboard_path: Path, out: Path, limit: int = 12) -> Path:
    dashboard = json.loads(dashboard_path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        b = backfill(scenario, Path(tmp) / "data")
        with prometheus(b.data) as url:
            data = [(p, panel_series(url, p, b.start, b.end))
                    for p in panels(dashboard) if p.get("type") in DRAWN][:limit]
    when = datetime.fromtimestamp(b.start, tz=timezone.utc).strftime("%H:%M")
    draw(data, f"{dashboard.get('title', '')} — scenario {scenario} (from {when} UTC)", out,
         b.start)
    return out
