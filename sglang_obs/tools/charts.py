"""Drawing for the commands that draw (snapshot, render-dashboard), so that a picture reads at a
glance: wall-clock time axes in one timezone (UTC, as the reports' times), units a person reads
(%, s, tokens, req/s; never Grafana's unit ids), state bands with their names, colours and a
complete key, values of very different scale on axes of their own, alert firing periods marked,
and every time axis of one figure over the same window.

matplotlib is an optional extra, so the exporter and the rest install without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from sglang_obs.core.states import STATE_COLOURS

EXTRA = "charts"
TZ = timezone.utc
TZ_NAME = "UTC"
TIME_LABEL = f"time ({TZ_NAME})"
MAX_RATIO = 100.0  # series whose peaks differ by more than this never share an axis

# Grafana unit id -> (what the axis says, factor applied to the values).
UNITS: dict[str, tuple[str, float]] = {
    "": ("", 1.0), "none": ("", 1.0), "short": ("", 1.0),
    "percentunit": ("%", 100.0), "percent": ("%", 1.0),
    "s": ("s", 1.0), "ms": ("ms", 1.0),
    "reqps": ("req/s", 1.0), "ops": ("per s", 1.0),
    "count:tok": ("tokens", 1.0), "count:tok/s": ("tokens/s", 1.0),
    "bytes": ("GiB", 1.0 / 2**30), "hertz": ("MHz", 1e-6), "celsius": ("°C", 1.0),
    "watt": ("W", 1.0),
}
HUMAN_UNITS = frozenset({label for label, _ in UNITS.values()} | {"requests"})
# Grafana's named colours, for value mappings that are not states.
GRAFANA_COLOURS = {"green": "#2ca02c", "red": "#d62728", "dark-red": "#8b0000",
                   "orange": "#ff7f0e", "yellow": "#e6b800", "blue": "#1f77b4",
                   "purple": "#9467bd", "text": "#7f7f7f", "transparent": "#ffffff"}
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e"}
OTHER_COLOUR = "#7f7f7f"


class MissingExtra(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def pyplot():
    try:
        import matplotlib  # optional
    except ImportError:
        raise MissingExtra(f"drawing needs matplotlib: pip install 'sglang-obs[{EXTRA}]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def unit(grafana_unit: str | None) -> tuple[str, float]:
    """(axis label, factor) for a Grafana unit id; an id without a reading says nothing."""
    return UNITS.get(grafana_unit or "", ("", 1.0))


@dataclass
class Line:
    label: str
    times: Sequence[float]  # Unix seconds
    values: Sequence[float]  # already in the axis unit

    @property
    def peak(self) -> float:
        finite = [abs(v) for v in self.values if not math.isnan(v)]
        return max(finite, default=0.0)


# -- time ------------------------------------------------------------------------------------
def x(ts: float) -> float:
    """Unix seconds as matplotlib's date number."""
    from matplotlib import dates

    return dates.date2num(datetime.fromtimestamp(ts, tz=TZ))


def xs(times: Sequence[float]) -> list[float]:
    return [x(t) for t in times]


def time_axis(ax, start: float, end: float, label: bool = True) -> None:
    """Wall-clock time in TZ over [start, end] on `ax`'s x axis."""
    from matplotlib import dates

    ax.set_xlim(x(start), x(end))
    locator = dates.AutoDateLocator(tz=TZ, minticks=4, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.DateFormatter("%H:%M", tz=TZ))
    ax.tick_params(axis="x", labelsize=7)
    if label:
        ax.set_xlabel(TIME_LABEL, fontsize=7)


# -- lines -----------------------------------------------------------------------------------
def scale_groups(peaks: Sequence[float], ratio: float = MAX_RATIO) -> list[list[int]]:
    """Indexes of `peaks` grouped so that within a group no two non-zero peaks differ by more
    than `ratio`; largest first. Series that never leave zero join the first group."""
    order = sorted((i for i, p in enumerate(peaks) if p > 0), key=lambda i: -peaks[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and peaks[groups[-1][0]] <= peaks[i] * ratio:
            groups[-1].append(i)
        else:
            groups.append([i])
    zeros = [i for i, p in enumerate(peaks) if p <= 0]
    if groups:
        groups[0] += zeros
    elif zeros:
        groups.append(zeros)
    return groups


def plot_lines(ax, lines: Sequence[Line], unit_label: str, legend: bool = True) -> list:
    """`lines` on `ax`, with a further y axis (on the right) for each group of a different
    scale; the axes used, `ax` first."""
    groups = scale_groups([line.peak for line in lines])
    axes = [ax]
    handles: dict[int, object] = {}
    for n, group in enumerate(groups):
        target = ax
        if n:
            target = ax.twinx()
            target.set_gid(ax.get_gid())
            if n > 1:
                target.spines["right"].set_position(("axes", 1 + 0.12 * (n - 1)))
            axes.append(target)
        for i in group:
            line = lines[i]
            handles[i] = target.plot(xs(line.times), line.values, label=line.label[:40],
                                     linewidth=1.2, color=f"C{i % 10}")[0]
        if unit_label:
            target.set_ylabel(unit_label, fontsize=7)
        compact_numbers(target.yaxis)
        target.tick_params(labelsize=7)
        if unit_label == "%":
            target.set_ylim(bottom=0)
    if legend and (len(lines) > 1 or len(groups) > 1):
        ax.legend(handles=[handles[i] for i in sorted(handles)], fontsize=6, loc="upper left")
    return axes


def compact(value: float, _pos=None, digits: int = 3) -> str:
    """350000 -> 350k, 2300000 -> 2.3M: tick labels without scientific offsets."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def distinct_labels(values: Sequence[float]) -> list[str]:
    """compact() labels for ticks, with as many digits as it takes for no two to read alike
    (the ticks of a nearly flat series differ past the third)."""
    for digits in range(3, 16):
        labels = [compact(v, digits=digits) for v in values]
        if len(set(labels)) == len(labels):
            break
    return labels


def compact_numbers(axis) -> None:
    from matplotlib.ticker import Formatter

    class Compact(Formatter):
        def __call__(self, value, pos=None):
            return compact(value)

        def format_ticks(self, values):
            return distinct_labels(values)

    axis.set_major_formatter(Compact())


# -- states and alerts -----------------------------------------------------------------------
def runs(times: Sequence[float], values: Sequence[float], step: float):
    """(start, end, value) runs of equal consecutive values; a gap over 1.5 steps ends one."""
    out: list[list] = []
    for t, v in zip(times, values, strict=True):
        if out and out[-1][2] == v and t - out[-1][1] <= step * 0.5 + 1e-6:
            out[-1][1] = t + step
        else:
            out.append([t, t + step, v])
    return [tuple(r) for r in out]


def state_band(ax, rows: Sequence[tuple[str, Sequence[float], Sequence[float]]], step: float,
               names: Sequence[str], colours: dict[str, str]) -> None:
    """One band per row (label, times, codes): code i drawn as names[i] in its colour, with a
    key of every name (whether it occurs or not)."""
    from matplotlib.patches import Patch

    for row, (_, times, codes) in enumerate(rows):
        spans = runs(times, codes, step)
        ax.broken_barh([(x(a), x(b) - x(a)) for a, b, _ in spans], (row - 0.4, 0.8),
                       facecolors=[colours.get(_name(names, c), OTHER_COLOUR)
                                   for _, _, c in spans], linewidth=0)
    ax.set_yticks(range(len(rows)), [label[:22] for label, _, _ in rows], fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4 + 0.9)  # room above the bands for the key
    handles = [Patch(color=colours.get(n, OTHER_COLOUR), label=n) for n in names]
    ax.legend(handles=handles, fontsize=6, ncol=min(len(names), 4), loc="upper left",
              bbox_to_anchor=(0, 1.0), borderaxespad=0.2, handlelength=1.0,
              columnspacing=0.8, frameon=False)


def _name(names: Sequence[str], code: float) -> str:
    i = int(code) if not math.isnan(code) else -1
    return names[i] if 0 <= i < len(names) else "?"


def alert_band(ax, alerts: Sequence[dict], start: float, end: float) -> None:
    """One row per alert: its firing periods as spans labelled with its name, solid when it
    reached a receiver, hatched when it stopped at Alertmanager (flickered, inhibited...)."""
    from matplotlib.patches import Patch

    if not alerts:
        ax.text(0.5, 0.5, "no alert fired in this window", ha="center", va="center",
                transform=ax.transAxes, fontsize=8)
        ax.set_yticks([])
        return
    for row, alert in enumerate(alerts):
        colour = SEVERITY_COLOURS.get(alert.get("severity", ""), OTHER_COLOUR)
        for e in alert["spans"]:
            notified = e.get("verdict", "notified") == "notified"
            ax.broken_barh([(x(e["start"]), x(e["end"]) - x(e["start"]))], (row - 0.4, 0.8),
                           facecolors=colour if notified else "none", edgecolor=colour,
                           hatch=None if notified else "////", linewidth=0.8)
        first = alert["spans"][0]["start"]
        ax.text(x(max(first, start)), row, " " + alert["name"], va="center", ha="left",
                fontsize=6)
    ax.set_yticks(range(len(alerts)), [a["name"][:22] for a in alerts], fontsize=6)
    ax.set_ylim(len(alerts) - 0.5, -0.5)
    handles = [Patch(color=c, label=s) for s, c in SEVERITY_COLOURS.items()]
    handles.append(Patch(facecolor="none", edgecolor=OTHER_COLOUR, hatch="////",
                         label="reached no receiver"))
    ax.legend(handles=handles, fontsize=6, loc="lower right", ncol=3, frameon=False,
              bbox_to_anchor=(1.0, 1.0), borderaxespad=0.1)


def bars(ax, items: Sequence[tuple[str, float]], unit_label: str,
         colours: dict[str, str] | None = None) -> None:
    """Horizontal bars: a bar gauge's last values."""
    labels = [label for label, _ in items]
    ax.barh(range(len(items)), [v for _, v in items],
            color=[(colours or {}).get(label, "C0") for label in labels])
    for i, (_, v) in enumerate(items):
        ax.text(v, i, " " + format_value(v, unit_label), va="center", fontsize=7)
    ax.set_yticks(range(len(items)), [label[:22] for label in labels], fontsize=7)
    ax.invert_yaxis()
    if unit_label:
        ax.set_xlabel(unit_label, fontsize=7)
    ax.tick_params(labelsize=7)


def big_value(ax, text: str, colour: str = "#333333") -> None:
    """A stat panel's one number."""
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=22, color=colour,
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def format_value(value: float, unit_label: str) -> str:
    if math.isnan(value):
        return "no data"
    if unit_label == "%":
        return f"{value:.1f} %"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit_label}".strip()


STATE_PALETTE = STATE_COLOURS  # the states' colours, for callers that draw state bands
