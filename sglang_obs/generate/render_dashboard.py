"""`sglang-obs render-dashboard`: a dashboard's panels as a PNG, for a simulator scenario.

Grafana cannot run everywhere (not in CI, not in a code review), so this draws the panels of a
generated dashboard JSON with matplotlib, from the same queries, against a real Prometheus
backfilled with the scenario: a reviewer sees what the on-call will see. Time axes are wall-clock
UTC over the scenario's whole window (every panel the same), units are Grafana's as a person
reads them, panels with value mappings (the server state) are coloured bands with their names
and a complete key, series of very different scale get axes of their own, instant queries
(bar gauges, single stats) show their value at the window's end, as Grafana does.

`--out FILE.png` writes one dashboard; `--out DIR` (an existing folder, or a path ending in /)
one PNG per dashboard, DIR/<uid>.png: every dashboard, or those named with --dashboard.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sglang_obs.core.cli_support import Failure, UsageError, folder, input_file, output_file
from sglang_obs.core.prometheus_api import Prometheus, PrometheusError
from sglang_obs.core.safe_files import Refused, open_checked
from sglang_obs.core.settings import Settings
from sglang_obs.core.states import STATE_COLOURS
from sglang_obs.generate.backfill import BackfillError, backfill, prometheus
from sglang_obs.tools import charts

DRAWN = ("timeseries", "state-timeline", "stat", "bargauge")
DEFAULT = "sglang-overview"


@dataclass
class Series:
    legend: str
    times: list[float]
    values: list[float]


def substitute(expr: str, window_seconds: float, step: int) -> str:
    """Grafana's variables, as Grafana would fill them for "all" over the whole window."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", f"{step}s")
    expr = expr.replace("$__range", f"{int(window_seconds)}s")
    expr = re.sub(r"\$\{?(cluster|host|job|instance|model_name|server|gpu|exporter)\}?", ".*", expr)
    return expr


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def query_range(url: str, expr: str, start: float, end: float, step: int) -> list[dict]:
    """Prometheus's range result for `expr` at the backfill's step (raises PrometheusError)."""
    return Prometheus(url, timeout=60).range_series(expr, start, end, step)


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard.get("panels", []):
        out += panel.get("panels", []) if panel.get("type") == "row" else [panel]
    return [p for p in out if p.get("targets")]


def panel_series(url: str, panel: dict, start: float, end: float, step: int) -> list[Series]:
    """Each target's series: over the window, or for an instant target its value at `end`."""
    series = []
    for target in panel["targets"]:
        expr = substitute(target.get("expr", ""), end - start, step)
        if not expr:
            continue
        if target.get("instant"):
            for result in Prometheus(url, timeout=60).query(expr, end):
                t, v = result["value"]
                series.append(Series(_legend(target.get("legendFormat", ""), result["metric"]),
                                     [float(t)], [float(v)]))
            continue
        for result in query_range(url, expr, start, end, step):
            values = [(float(t), float(v)) for t, v in result["values"]]
            series.append(Series(_legend(target.get("legendFormat", ""), result["metric"]),
                                 [t for t, _ in values], [v for _, v in values]))
    return series


# -- what a panel is drawn as ----------------------------------------------------------------
def value_mappings(panel: dict) -> dict[int, tuple[str, str]]:
    """{value: (text, colour)} of the panel's value mappings; colours of state names are the
    states' own (sglang_obs.core.states), others Grafana's named ones."""
    out = {}
    defaults = (panel.get("fieldConfig") or {}).get("defaults") or {}
    for mapping in defaults.get("mappings") or []:
        if mapping.get("type") != "value":
            continue
        for value, item in (mapping.get("options") or {}).items():
            text = item.get("text", str(value))
            colour = STATE_COLOURS.get(text) or charts.GRAFANA_COLOURS.get(
                item.get("color", ""), item.get("color") or charts.OTHER_COLOUR)
            try:
                out[int(float(value))] = (text, colour)
            except ValueError:
                continue
    return out


def kind(panel: dict) -> str:
    """states (a band per series), stat (one number), bars (bar gauge) or lines."""
    targets = panel.get("targets") or []
    instant = bool(targets) and all(t.get("instant") for t in targets)
    if panel.get("type") == "bargauge":
        return "bars"
    if panel.get("type") in ("state-timeline", "stat") and value_mappings(panel):
        return "states"
    if panel.get("type") == "stat" and instant:
        return "stat"
    return "lines"


def panel_unit(panel: dict) -> str:
    return ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "") or ""


def draw(panel_data: list[tuple[dict, list[Series]]], title: str, start: float, end: float,
         step: int):
    """The figure of `panel_data` over [start, end]: every time axis that window."""
    plt = charts.pyplot()

    cols = 3
    rows = max(math.ceil(len(panel_data) / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(panel_data):]:
        ax.axis("off")
    for ax, (panel, series) in zip(axes.flat, panel_data, strict=False):
        draw_panel(ax, panel, series, start, end, step)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return fig


def draw_panel(ax, panel: dict, series: list[Series], start: float, end: float,
               step: int) -> None:
    label, factor = charts.unit(panel_unit(panel))
    how = kind(panel)
    ax.set_title(panel.get("title", ""), fontsize=10, loc="left")
    ax.set_gid({"lines": "time", "states": "time"}.get(how, how))
    if how in ("lines", "states"):
        charts.time_axis(ax, start, end)
    if not series:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        if how not in ("lines", "states"):
            ax.set_xticks([])
        ax.set_yticks([])
        return
    if how == "states":
        mapping = value_mappings(panel)
        names = [mapping[k][0] for k in sorted(mapping)]
        colours = {text: colour for text, colour in mapping.values()}
        codes = sorted(mapping)
        rows = [(s.legend, s.times, [float(codes.index(int(v)))
                                     if not math.isnan(v) and int(v) in codes else -1.0
                                     for v in s.values]) for s in series]
        charts.state_band(ax, rows, step, names, colours)
    elif how == "bars":
        items = [(s.legend, s.values[-1] * factor) for s in series]
        charts.bars(ax, items, label, STATE_COLOURS)
        if label == "%":
            ax.set_xlim(0, 100)
    elif how == "stat":
        charts.big_value(ax, "\n".join(charts.format_value(s.values[-1] * factor, label)
                                       for s in series[:3]))
        ax.set_xlabel(f"at the window's end, {_hhmm(end)} {charts.TZ_NAME}", fontsize=7)
    else:
        lines = [charts.Line(s.legend, s.times, [v * factor for v in s.values])
                 for s in series[:8]]
        charts.plot_lines(ax, lines, label)


def _hhmm(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%H:%M")


# -- the command -----------------------------------------------------------------------------
def dashboard_files(s: Settings) -> dict[str, Path]:
    """{uid: JSON path} of the generated dashboards in the configuration folder."""
    out = {}
    for path in sorted(s.dashboards_dir.glob("*.json")):
        try:
            uid = json.loads(path.read_text()).get("uid") or path.stem
        except ValueError:
            continue
        out[uid] = path
    return out


def resolve_dashboard(text: str, s: Settings) -> Path:
    """A dashboard's uid (sglang-latency), its short name (latency) or a JSON file."""
    known = dashboard_files(s)
    for uid, path in known.items():
        if text in (uid, path.stem, uid.removeprefix("sglang-")):
            return path
    if text.endswith(".json") or "/" in text:
        path = input_file("--dashboard", text)
        try:  # read more than once: a regular file (a FIFO would block the read, or be spent)
            os.close(open_checked(path)[0])
        except Refused as err:
            raise Failure(f"--dashboard {path}: {err}") from None
        except OSError as err:
            raise Failure(f"--dashboard {path}: cannot read it ({err.strerror})") from None
        return path
    raise UsageError(f"--dashboard {text}: no such dashboard; one of "
                     f"{', '.join(known)} (or a JSON file)")


def render_command(scenario: str, dashboards: list[str] | None, out: str,
                   s: Settings) -> list[Path]:
    """What `sglang-obs render-dashboard` does: the PNGs written."""
    from sglang_obs.simulator import scenario as scenarios

    try:
        scenarios.load(scenario)
    except scenarios.ScenarioError as err:
        raise UsageError(f"--scenario: {err}") from None
    to_folder = out.endswith("/") or Path(out).is_dir()
    if to_folder:
        paths = ([resolve_dashboard(d, s) for d in dashboards] if dashboards
                 else list(dashboard_files(s).values()))
        target = folder("--out", out)
        outs = [target / f"{_uid(p)}.png" for p in paths]
    else:
        if len(dashboards or []) > 1:
            raise UsageError("--out: several dashboards need a folder (--out DIR/), one PNG "
                             "each")
        if Path(out).suffix.lower() != ".png":
            raise UsageError(f"--out {out}: give a .png file, or a folder (ending in /)")
        paths = [resolve_dashboard(dashboards[0] if dashboards else DEFAULT, s)]
        outs = [output_file("--out", out)]
    try:
        return render_pngs(scenario, list(zip(paths, outs, strict=True)), s=s)
    except (BackfillError, PrometheusError) as err:
        raise Failure(str(err)) from None


def _uid(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("uid") or path.stem
    except (OSError, ValueError):
        return path.stem


def render_pngs(scenario: str, jobs: list[tuple[Path, Path]], limit: int = 12,
                end: float | None = None, s: Settings | None = None) -> list[Path]:
    """Draw each (dashboard JSON, PNG) of `jobs` from one backfill of `scenario` (ending at
    `end`, default now)."""
    plt = charts.pyplot()
    dashboards = []
    for path, out in jobs:
        try:
            dashboards.append((json.loads(path.read_text()), out))
        except (OSError, ValueError) as err:
            raise Failure(f"--dashboard {path}: not a dashboard JSON ({err})") from None
    with tempfile.TemporaryDirectory() as tmp:
        b = backfill(scenario, Path(tmp) / "data", end=end, s=s)
        drawn = []
        with prometheus(b.data, retention="10y") as url:
            for dashboard, out in dashboards:
                data = [(p, panel_series(url, p, b.start, b.end, b.step))
                        for p in panels(dashboard) if p.get("type") in DRAWN][:limit]
                drawn.append((dashboard, data, out))
    written = []
    for dashboard, data, out in drawn:
        fig = draw(data, f"{dashboard.get('title', '')} — scenario {scenario}, "
                         f"{_hhmm(b.start)}–{_hhmm(b.end)} {charts.TZ_NAME}", b.start, b.end,
                   b.step)
        try:
            fig.savefig(out, dpi=90)
        except OSError as err:
            raise Failure(f"--out {out}: cannot write it ({err.strerror or err})") from None
        finally:
            plt.close(fig)
        written.append(out)
    return written


def render_png(scenario: str, dashboard_path: Path, out: Path, limit: int = 12,
               s: Settings | None = None) -> Path:
    """One dashboard to one PNG (the library form of the command)."""
    return render_pngs(scenario, [(dashboard_path, out)], limit, s=s)[0]
