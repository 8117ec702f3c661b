"""One truth on every surface: a quantity shown in two places has one label and one value.

Seed 000's incident is rendered once; at a moment of its prefill backlog and one of its decode
contention, the glance page (exporter/status.py, fed by the render's own polls), the recording
rules and the alerts' descriptions (promtool over the shipped rule files and the same render)
are read side by side. Every number the alert quotes stands under its quantity's label
(sglang_obs/core/quantities.py) and equals the recording rule's value; every one the glance page
shows too stands there under the same label with the same value (within the rounding each
surface prints). The dashboards' latency legends name the same statistic and window, read from
the same recording rules. Before this, the same moment read "TTFT p95 over 5 minutes is 53s" in
the alert, "TTFT average now 28 s" on the page's sparkline and "Average TTFT 4.3 s" in its
baseline, with nothing saying which was which.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from sglang_obs.core import quantities
from sglang_obs.core.quantities import q
from sglang_obs.exporter.status import StatusBoard, load_classification
from sglang_obs.exporter.status_page import page_bytes, status_with_display
from sglang_obs.generate import promtool_eval
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import render

from conftest import ROOT, require_binary
from status_replay import POLL, STEP, S, input_series

pytestmark = pytest.mark.slow

SCENARIO = "long-context-incident"
SERVER = "sglang:30000"
# (seconds into the scenario, the alert that fires then, the quantities its description quotes)
MOMENTS = (
    (210, "SGLangPrefillBacklog", ("prefill_backlog", "queue_continuous",
                                   "time_to_first_token_p95_5m")),
    (285, "SGLangDecodeContention", ("decode_speed", "decode_speed_usual",
                                     "inter_token_latency_p95_5m")),
)
# The glance page's element for each quantity it shows: (display key, JSON path).
ON_THE_PAGE = {
    "prefill_backlog": ("t.backlog", ("tokens", "prefill_backlog")),
    "queue_continuous": ("p.queue", ("pressure", "queue_nonempty_seconds")),
    "decode_speed": ("t.speed", ("decode", "speed_per_request")),
    "decode_speed_usual": ("t.speed_p90", ("decode", "speed_p90_1h")),
    "kv_occupancy": ("t.kv_occupancy", ("tokens", "kv_occupancy_ratio")),
}
_GOT = re.compile(r"alertname: (\w+), time: ([^,]+),.*?got:\[(.*?)\n\s*\]", re.S)
_DESCRIPTION = re.compile(r'description="((?:[^"\\]|\\.)*)"')
_RECORD = re.compile(r'expr: "(\S+) \+ 0 \* (\d+)", time: [^\n]*\n\s*exp: [^\n]*\n\s*got: ([^\n]*)')
_SAMPLE = re.compile(r"\{([^}]*)\} ([-+0-9.eE]+|NaN)")
SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


# -- reading the numbers as each surface prints them ---------------------------------------------
def go_number(text: str) -> float:
    """Prometheus's humanize, humanizeDuration and humanizePercentage, read back."""
    text = text.strip()
    if m := re.fullmatch(r"([-\d.e+]+)%", text):
        return float(m.group(1)) / 100
    if re.fullmatch(r"(\d+d ?)?(\d+h ?)?(\d+m ?)?([\d.]+s)?", text) and text:
        units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
        return sum(float(v) * units[u] for v, u in re.findall(r"([\d.]+)([dhms])", text))
    if m := re.fullmatch(r"([\d.]+)ms", text):
        return float(m.group(1)) / 1000
    m = re.fullmatch(r"([-\d.e+]+)\s?([kMGT]?)", text)
    assert m, f"not a number Prometheus prints: {text!r}"
    return float(m.group(1)) * SI[m.group(2)]


def page_number(text: str) -> float:
    """The glance page's count, seconds, percent and speed formats, read back."""
    text = text.replace(",", "").strip()
    if text == "no queue":
        return 0.0
    if m := re.fullmatch(r"([\d.]+) %", text):
        return float(m.group(1)) / 100
    if m := re.fullmatch(r"([\d.]+) tok/s", text):
        return float(m.group(1))
    if m := re.fullmatch(r"(?:(\d+) h )?(?:(\d+) min )?([\d.]+) s", text):
        h, mins, s = m.groups()
        return int(h or 0) * 3600 + int(mins or 0) * 60 + float(s)
    if m := re.fullmatch(r"(\d+) (h|min)(?: (\d+) (min|s))?", text):
        big = int(m.group(1)) * (3600 if m.group(2) == "h" else 60)
        return big + int(m.group(3) or 0) * (60 if m.group(4) == "min" else 1)
    return float(text)


def close(shown: float, truth: float, rel: float = 0.006, quantum: float = 0.0) -> bool:
    """Equal within what the surface prints: 4 significant digits (Prometheus's humanize) or the
    page's last digit."""
    return abs(shown - truth) <= max(rel * abs(truth), quantum / 2 + 1e-9)


# -- one render, every surface -------------------------------------------------------------------
@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    require_binary("promtool")
    sc = scenarios.load(SCENARIO)
    board = StatusBoard(load_classification(), poll_interval=POLL, baseline_step=STEP)
    tracker = board.add(SERVER)
    at = {t for t, _, _ in MOMENTS}
    page, html = {}, {}

    def on_scrape(index, gpus):
        if index * STEP in at:
            status = status_with_display(board)
            page[index * STEP] = status["servers"][0]
            html[index * STEP] = page_bytes(status, "/metrics", ["http://sglang:30000"]).decode()

    rendered = render(sc, step=STEP, poll_interval=POLL, start=0.0, on_poll=tracker.observe,
                      on_scrape=on_scrape)
    # promtool: every quantity's recording rule and every alert, at each moment.
    records = sorted({x.record for x in quantities.QUANTITIES.values() if x.record})
    exprs = [f"{record} + 0 * {t}" for t in sorted(at) for record in records]
    test = {
        "rule_files": [str(p) for p in promtool_eval.rule_files(S)],
        "evaluation_interval": f"{STEP:.0f}s",
        "group_eval_order": promtool_eval.group_eval_order(S),
        "tests": [{
            "interval": f"{STEP:.0f}s", "input_series": input_series(rendered),
            "promql_expr_test": [{"expr": e, "eval_time": f"{int(e.rsplit(' ', 1)[1])}s",
                                  "exp_samples": []} for e in exprs],
            "alert_rule_test": [{"eval_time": f"{t}s", "alertname": alert, "exp_alerts": []}
                                for t, alert, _ in MOMENTS],
        }],
    }
    work = tmp_path_factory.mktemp("truth")
    (work / "truth_test.yml").write_text(yaml.safe_dump(test, width=1_000_000, sort_keys=False))
    out = subprocess.run([shutil.which("promtool"), "test", "rules", str(work / "truth_test.yml")],
                         capture_output=True, text=True, timeout=600)
    output = out.stdout + out.stderr
    values: dict[tuple[int, str], float] = {}
    for record, t, got in _RECORD.findall(output):
        samples = _SAMPLE.findall(got)
        if samples:
            values[(int(t), record)] = float(samples[0][1])
    alerts = {}
    for name, _, got in _GOT.findall(output):
        for description in _DESCRIPTION.findall(got):
            alerts[name] = description.encode().decode("unicode_escape")
    return page, html, values, alerts


@pytest.mark.parametrize(("t", "alert", "quoted"), MOMENTS)
def test_the_alert_quotes_each_quantity_under_its_label_with_the_rules_value(surfaces, t, alert,
                                                                              quoted):
    _, _, values, alerts = surfaces
    assert alert in alerts, f"{alert} does not fire at {t} s: {sorted(alerts)}"
    description = alerts[alert]
    print(f"{t} s {alert}: {description}")
    for key in quoted:
        x = q(key)
        m = re.search(re.escape(x.label) + r": ([^;.]*(?:\.\d+[^;.]*)?)(?:;|\.$)", description)
        assert m, f"{alert} does not quote {x.label!r}: {description}"
        shown = go_number(m.group(1).removesuffix(" tokens/s"))
        assert close(shown, values[(t, x.record)]), (x.label, m.group(1), values[(t, x.record)])


@pytest.mark.parametrize(("t", "alert", "quoted"), MOMENTS)
def test_the_glance_page_shows_the_same_quantity_with_the_same_label_and_value(surfaces, t,
                                                                               alert, quoted):
    page, html, values, _ = surfaces
    srv = page[t]
    assert srv["state"] == {"SGLangPrefillBacklog": "prefill_backlog",
                            "SGLangDecodeContention": "decode_contention"}[alert]
    for key, (field, path) in ON_THE_PAGE.items():
        x = q(key)
        truth = values[(t, x.record)]
        raw = srv[path[0]][path[1]]
        assert raw is not None, x.label
        assert close(raw, truth, rel=1e-6, quantum=1e-9), (x.label, raw, truth)
        text = srv["display"]["text"][field]
        quantum = {"t.backlog": 1, "p.queue": 1, "t.speed": 0.1, "t.speed_p90": 0.1,
                   "t.kv_occupancy": 0.01}[field]
        assert close(page_number(text), truth, rel=0, quantum=quantum), (x.label, text, truth)
        # the row reads as the quantity's label: subject and statistic, then the window
        dt = f'{" ".join(p for p in (x.subject, x.statistic) if p)} <span class="note">' \
             f'{x.window}</span></dt><dd data-f="{field}">'
        assert dt in html[t], f"the page does not show {x.label!r} as its label"


def test_ttft_on_every_surface_says_which_ttft(surfaces):
    """Three TTFT quantities at one moment, each under its own label: the alerts' and the
    dashboards' p95 over 5 min, the page's mean per sparkline point and mean since start."""
    page, html, _, alerts = surfaces
    t = MOMENTS[0][0]
    labels = {x.label for x in quantities.QUANTITIES.values() if x.subject == "TTFT"}
    said = [m.group(0) for text in (alerts["SGLangPrefillBacklog"], re.sub(r"<[^>]+>", "",
                                                                           html[t]))
            for m in re.finditer(r"TTFT[^;:·\n<]*", text)]
    assert said, "no TTFT on the surfaces"
    for phrase in said:
        assert any(phrase.strip().startswith(label) for label in labels), phrase
    for name in ("sglang-overview", "sglang-latency"):
        board = json.loads((ROOT / "grafana/dashboards" / f"{name}.json").read_text())
        legends = {t["expr"].split("{")[0]: t["legendFormat"] for p in _panels(board)
                   for t in p.get("targets", [])}
        for x in quantities.QUANTITIES.values():
            if x.statistic and x.record in legends:  # a time series of a statistic names it
                assert legends[x.record].endswith(" " + x.qualifier), (name, x.record,
                                                                       legends[x.record])


def _panels(board):
    for p in board.get("panels", []):
        yield p
        yield from _panels(p)
