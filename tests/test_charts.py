"""Pictures that read at a glance: the figures render-dashboard and snapshot draw, inspected as
matplotlib objects (no Prometheus needed: the panels are fed synthetic series).

Every time axis is wall-clock time (a date formatter in UTC, labelled "time (UTC)") over the
figure's whole window; y labels are units a person reads, never Grafana's unit ids; a state
panel names its states in their colours with a key of every state; series whose peaks differ by
more than 100x never share an axis; alert firing periods are marked with the alert's name."""

import json
import math

import pytest

pytest.importorskip("matplotlib")

from matplotlib import dates
from matplotlib.patches import Patch

from sglang_obs.core.states import STATE_COLOURS, STATES
from sglang_obs.core.times import iso
from sglang_obs.generate import render_dashboard as rd
from sglang_obs.tools import (
    charts,
    snapshot,
)

from conftest import ROOT

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC
END = T0 + 1200
STEP = 15  # seconds between the made-up samples (a backfill's step)
TIMES = [T0 + STEP * i for i in range(81)]
GRAFANA_IDS = {"short", "none", "percentunit", "reqps", "ops", "count:tok", "count:tok/s",
               "bytes", "hertz", "celsius", "watt"}


def overview_panels():
    dashboard = json.loads((ROOT / "grafana/dashboards/sglang-overview.json").read_text())
    return {p["title"]: p for p in rd.panels(dashboard)}


def series(legend, values, times=TIMES):
    return rd.Series(legend, list(times), [float(v) for v in values])


def wave(peak, start=0):
    return [peak * (0.5 + 0.5 * math.sin(i / 6)) if i >= start else 0.0
            for i in range(len(TIMES))]


@pytest.fixture(scope="module")
def render_figure():
    p = overview_panels()
    codes = [(i // 10) % 4 + 1 for i in range(len(TIMES))]  # idle .. decode_contention
    late = TIMES[28:]  # a series that starts 7 minutes into the window
    data = [
        (p["State now"], [series("sglang:30000", codes)]),
        (p["Server state over time"], [series("sglang:30000", codes),
                                       series("sglang:30001", [2] * len(TIMES))]),
        (p["Time in each state"], [rd.Series(s, [END], [v]) for s, v in
                                   (("healthy", 0.4), ("idle", 0.3), ("prefill_backlog", 0.2),
                                    ("decode_contention", 0.1))]),
        (p["TTFT SLO attainment (≤ 2.0 s)"], [rd.Series("TTFT ≤ 2.0 s", [END], [0.767])]),
        (p["Time to first token"], [series("p95", wave(90)), series("p50", wave(40)),
                                    series("someone's ITL", wave(0.05))]),
        (p["KV cache occupancy"], [series("sglang:30000", wave(0.6))]),
        (p["Pending prefill tokens"], [series("sglang:30000", wave(370_000)[28:], late)]),
        (p["Requests finished"], [series("sglang:30000", wave(0.1))]),
        (p["Waiting queue"], []),
    ]
    fig = rd.draw(data, "overview", T0, END, STEP)
    yield fig
    charts.pyplot().close(fig)


@pytest.fixture(scope="module")
def snapshot_figure():
    server = "sglang:30000"
    key = (("instance", server),)
    codes = {t: float((i // 8) % 5) for i, t in enumerate(TIMES)}  # unavailable .. decode
    columns = {name: {key: {t: v for t, v in zip(TIMES, wave(peak), strict=True)}}
               for name, peak in (("queue", 4), ("running", 10),
                                  ("pending_prefill_tokens", 370_000),
                                  ("ttft_p95_seconds", 90), ("itl_p95_seconds", 0.05),
                                  ("kv_occupancy", 0.6), ("cache_hit_ratio", 0.97))}
    columns["state"] = {key: codes}
    data = {"servers": [server], "columns": columns, "gpu": {}}
    alerts = [
        {"alertname": "SGLangPrefillBacklog", "severity": "warning",
         "labels": {"instance": server},
         "episodes": [{"from": iso(T0 + 200), "to": iso(T0 + 500),
                       "seconds": 300, "verdict": "notified"}]},
        {"alertname": "SGLangLongQueueing", "severity": "warning",
         "labels": {"instance": server},
         "episodes": [{"from": iso(T0 + 600), "to": iso(T0 + 615),
                       "seconds": 15, "verdict": "flickered"}]},
        {"alertname": "SGLangServerDown", "severity": "critical",
         "labels": {"instance": "another:1"},
         "episodes": [{"from": iso(T0), "to": iso(END), "seconds": 1200,
                       "verdict": "notified"}]},
    ]
    fig = snapshot.figure(data, server, snapshot.Window(T0, END, 15), alerts)
    yield fig
    charts.pyplot().close(fig)


def time_axes(fig):
    return [ax for ax in fig.axes if ax.get_gid() == "time"]


def titled(fig, title):
    return next(ax for ax in fig.axes if ax.get_title(loc="left") == title)


@pytest.mark.parametrize("which", ["render_figure", "snapshot_figure"])
def test_every_time_axis_is_wall_clock_utc_over_the_whole_window(which, request):
    fig = request.getfixturevalue(which)
    axes = time_axes(fig)
    assert len(axes) >= 7
    for ax in axes:
        formatter = ax.xaxis.get_major_formatter()
        assert isinstance(formatter, dates.DateFormatter), ax.get_title()
        assert formatter.tz.utcoffset(None).total_seconds() == 0
        assert ax.get_xlim() == pytest.approx((charts.x(T0), charts.x(END))), ax.get_title()
    labels = {ax.get_xlabel() for ax in axes} - {""}
    assert labels == {"time (UTC)"}
    assert "minutes" not in " ".join(ax.get_xlabel() for ax in fig.axes)


@pytest.mark.parametrize("which", ["render_figure", "snapshot_figure"])
def test_units_are_human_and_ratios_are_percent(which, request):
    fig = request.getfixturevalue(which)
    ylabels = {ax.get_ylabel() for ax in fig.axes}
    assert ylabels <= charts.HUMAN_UNITS, ylabels
    assert not ylabels & GRAFANA_IDS
    assert "%" in ylabels
    for ax in fig.axes:
        if ax.get_ylabel() == "%":
            assert all(max(line.get_ydata()) <= 100 for line in ax.get_lines())
            assert any(max(line.get_ydata()) > 1 for line in ax.get_lines())


@pytest.mark.parametrize("which", ["render_figure", "snapshot_figure"])
def test_series_of_very_different_scale_never_share_an_axis(which, request):
    fig = request.getfixturevalue(which)
    for ax in fig.axes:
        peaks = [max(abs(v) for v in line.get_ydata()) for line in ax.get_lines()]
        peaks = [p for p in peaks if p > 0]
        if len(peaks) > 1:
            assert max(peaks) / min(peaks) <= charts.MAX_RATIO, (ax.get_title(), peaks)


def test_ttft_and_itl_get_axes_of_their_own(render_figure):
    ttft = titled(render_figure, "Time to first token")
    twins = [ax for ax in render_figure.axes if ax is not ttft
             and ax.get_shared_x_axes().joined(ax, ttft)]
    assert twins, "the small series needs its own axis"
    small = [line.get_label() for ax in twins for line in ax.get_lines()]
    assert small == ["someone's ITL"]
    assert {line.get_label() for line in ttft.get_lines()} == {"p95", "p50"}


def legend_names(ax):
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


@pytest.mark.parametrize("title", ["State now", "Server state over time"])
def test_state_panels_show_state_names_and_colours_with_a_complete_key(render_figure, title):
    ax = titled(render_figure, title)
    assert legend_names(ax) == list(STATES)  # idle and unavailable too, never codes
    handles = ax.get_legend().legend_handles
    assert [h.get_facecolor() for h in handles] == [
        pytest.approx(_rgba(STATE_COLOURS[s])) for s in STATES]
    assert ax.get_ylabel() == ""
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "sglang:30000"
    bars = [c for c in ax.collections]
    assert bars
    used = {tuple(round(v, 3) for v in colour) for c in bars for colour in c.get_facecolors()}
    for state in ("idle", "healthy", "prefill_backlog", "decode_contention"):
        assert tuple(round(v, 3) for v in _rgba(STATE_COLOURS[state])) in used, state


def _rgba(colour):
    from matplotlib.colors import to_rgba

    return to_rgba(colour)


def test_the_snapshot_state_band_has_a_complete_key(snapshot_figure):
    ax = snapshot_figure.axes[0]
    assert legend_names(ax) == list(STATES)


def test_instant_panels_show_their_value_not_a_line(render_figure):
    stat = titled(render_figure, "TTFT SLO attainment (≤ 2.0 s)")
    assert [t.get_text() for t in stat.texts] == ["76.7 %"]
    assert not stat.get_lines()
    gauge = titled(render_figure, "Time in each state")
    assert [t.get_text() for t in gauge.get_yticklabels()] == [
        "healthy", "idle", "prefill_backlog", "decode_contention"]
    assert gauge.get_xlabel() == "%"


def test_alert_firing_periods_are_marked_with_their_names(snapshot_figure):
    ax = next(a for a in snapshot_figure.axes if a.get_title(loc="left").startswith("Alerts"))
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == ["SGLangPrefillBacklog", "SGLangLongQueueing"]  # not another server's
    assert {t.get_text().strip() for t in ax.texts} == set(names)
    spans = [c for c in ax.collections]
    assert len(spans) == 2
    hatched = [c.get_hatch() for c in spans]
    assert hatched == [None, "////"]  # the flicker reached no receiver
    legend = legend_names(ax)
    assert "reached no receiver" in legend
    assert all(isinstance(h, Patch) for h in ax.get_legend().legend_handles)


def test_large_numbers_are_written_compactly():
    assert charts.compact(370_000) == "370k"
    assert charts.compact(2_300_000) == "2.3M"
    assert charts.compact(0.05) == "0.05"
    assert charts.unit("percentunit") == ("%", 100.0)
    assert charts.unit("made-up-id") == ("", 1.0)


def test_no_axis_repeats_a_tick_label():
    """A nearly flat series (ITL p95 within a few microseconds of 1.5 ms) on an axis of its
    own: its ticks differ past the third digit, and each label must still say which is which."""
    p = overview_panels()
    flat = [0.0015 + 4e-6 * math.sin(i / 6) for i in range(len(TIMES))]
    fig = rd.draw([(p["Time to first token"], [series("p95", wave(90)), series("ITL", flat)]),
                   (p["Pending prefill tokens"], [series("sglang:30000",
                                                         [370_000 + i for i in range(81)])])],
                  "overview", T0, END, STEP)
    fig.canvas.draw()
    try:
        shown = [[t.get_text() for t in ax.get_yticklabels() if t.get_text()]
                 for ax in fig.axes if ax.get_lines()]
        print(shown)
        assert len(shown) == 3  # p95, ITL on its own axis, pending tokens
        for labels in shown:
            assert len(labels) >= 2
            assert len(set(labels)) == len(labels), labels
    finally:
        charts.pyplot().close(fig)


@pytest.mark.slow  # backfills a scenario
def test_render_dashboard_to_a_folder_writes_one_png_per_dashboard_inside_it(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from conftest import require_binary

    require_binary("promtool")
    require_binary("prometheus")
    out = tmp_path / "pngs"
    out.mkdir()
    result = subprocess.run(
        [str(Path(sys.executable).parent / "sglang-obs"), "render-dashboard", "--scenario",
         "healthy", "--dashboard", "latency", "--dashboard", "sglang-kv", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["sglang-kv.png", "sglang-latency.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pngs"]  # nothing beside it
    assert result.stdout.split() == [str(out / "sglang-latency.png"),
                                     str(out / "sglang-kv.png")]
    assert all(p.stat().st_size > 20_000 for p in out.iterdir())


def test_grafana_and_the_renders_colour_each_state_alike():
    p = overview_panels()
    for title in ("State now", "Server state over time"):
        mapping = rd.value_mappings(p[title])
        assert {text: colour for text, colour in mapping.values()} == STATE_COLOURS, title
        raw = p[title]["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert {item["text"]: item["color"] for item in raw.values()} == STATE_COLOURS
