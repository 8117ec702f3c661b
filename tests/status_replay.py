"""Replays of shipped scenarios for the glance page's tests: the page's verdict (exporter.status)
at every scrape step of a simulator render, and the recording rules' state at the same steps as
promtool evaluates the shipped prometheus/rules/*.yml over that render."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sglang_obs.core.settings import default as _settings
from sglang_obs.core.states import STATES
from sglang_obs.exporter.status import Classification, StatusBoard, load_classification
from sglang_obs.generate import promtool_eval
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import Rendered, render

from conftest import require_binary

S = _settings()  # the checkout's configuration, read once
STEP = S.evaluation_interval_s  # the shipped scrape and evaluation interval
POLL = 5.0  # the renders' exporter poll interval (as docs/detection.md's)
STATE_EXPR = "instance:sglang_state:code + 0 * {index}"  # one distinct expression per step
_GOT = re.compile(r'expr: "instance:sglang_state:code \+ 0 \* (\d+)", time: [^\n]*\n'
                  r"\s*exp: [^\n]*\n\s*got: ([^\n]*)")
_SAMPLE = re.compile(r"\{([^}]*)\} ([-+0-9.eE]+|NaN)")


@dataclass
class Replay:
    scenario: str
    rendered: Rendered
    page: list[str] = field(default_factory=list)  # the page's verdict per scrape step
    board: StatusBoard | None = None


def replay(name: str, classification: Classification | None = None,
           until: float | None = None) -> Replay:
    """Render scenario `name` (step STEP, poll POLL, start 0) with a StatusBoard fed by the
    render's own poller; the page's verdict is read at each scrape step, as a browser asking at
    that moment would get it. `until`: stop the page's readings there (the render goes on)."""
    sc = scenarios.load(name)
    board = StatusBoard(classification or load_classification(), poll_interval=POLL,
                        baseline_step=STEP)
    tracker = board.add("sglang:30000")
    page: list[str] = []

    def on_scrape(index, gpus):
        if until is None or index * STEP <= until:
            page.append(tracker.verdict())

    rendered = render(sc, step=STEP, poll_interval=POLL, start=0.0, on_poll=tracker.observe,
                      on_scrape=on_scrape)
    return Replay(name, rendered, page, board)


def input_series(rendered: Rendered) -> list[dict]:
    """promtool input series as Prometheus would store the render: a series missing from a
    scrape after it was present gets a staleness marker, as a real scrape writes one."""
    out = []
    for (name, labels), points in sorted(rendered.series.items()):
        values, present = [], False
        for i in range(rendered.steps):
            if i in points:
                values.append(repr(float(points[i])))
                present = True
            else:
                values.append("stale" if present else "_")
                present = False
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        out.append({"series": f"{name}{{{label_text}}}", "values": " ".join(values)})
    return out


def rules_states(rendered: Rendered, workdir: Path) -> list[str | None]:
    """instance:sglang_state:code at every scrape step as promtool evaluates the shipped rule
    files (recording rules first) over the render; None where no state was recorded."""
    require_binary("promtool")
    output = promtool_eval.evaluate(
        input_series(rendered), [(STATE_EXPR.format(index=i), i * STEP)
                                 for i in range(rendered.steps)], STEP, workdir, S, "state",
        timeout=600)
    states: list[str | None] = [None] * rendered.steps
    for index, got in _GOT.findall(output):
        samples = _SAMPLE.findall(got)
        assert len(samples) == 1, f"one server, one state per step: {got}"
        states[int(index)] = STATES[int(float(samples[0][1]))]
    return states
