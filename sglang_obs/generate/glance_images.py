"""docs/images/glance-*.png: the glance page in Chromium, for a simulated scenario replayed
faster than real time. `python -m sglang_obs.generate glance-images` redraws them (needs
chromium; not part of `make generate`, since a browser's pixels vary across releases).

Each scenario is rendered (simulator.render) with a StatusBoard fed by the render's own poller,
every 5 simulated seconds, exactly as the live exporter feeds it; at the chosen moment the
board's status is kept, served by the exporter's own web app (exporter/web.py with
status_page.GlancePages) on loopback, and photographed at 1366 px and at a 400 px phone width.
The clock is the scenario's, from START (shown in UTC).
"""

from __future__ import annotations

import copy
from pathlib import Path

from prometheus_client import CollectorRegistry

from sglang_obs.core import shown
from sglang_obs.core.settings import Settings
from sglang_obs.exporter.status import StatusBoard, load_classification
from sglang_obs.exporter.status_page import GlancePages
from sglang_obs.exporter.web import Exposition, make_app, serve
from sglang_obs.generate.browser import Browser
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import render

START = 1785239400.0  # 2026-07-28 11:50:00 UTC: seed 000's sustained pressure began at 11:50
POLL = 5.0
# (scenario, seconds into it, image name): the incident during its second prefill backlog, with
# the first backlog and decode contention in its trends; a healthy server after 25 minutes.
SHOTS = (("long-context-incident", 750, "incident"), ("healthy", 1500, "healthy"))
INSTANCE = "sglang:30000"


class _Frozen:
    """A StatusBoard's answer at one moment, answered again for every request."""

    def __init__(self, status: dict):
        self._status = status
        self.hidden = shown.Tally()  # the page counts what it leaves out (status_page.py)

    def status(self) -> dict:
        return copy.deepcopy(self._status)


def capture(name: str, at: float, s: Settings) -> dict:
    """The board's status `at` seconds into scenario `name`, replayed at the configuration's
    evaluation interval."""
    step = s.evaluation_interval_s
    now = [0.0]
    board = StatusBoard(load_classification(s.thresholds_file), poll_interval=POLL,
                        wall_clock=lambda: START + now[0], baseline_step=step)
    tracker = board.add(INSTANCE)
    kept: dict = {}

    def on_poll(t, snapshot):
        now[0] = t
        tracker.observe(t, snapshot)

    def on_scrape(index, gpus):
        # The GPUs' latest reading from the first scrape on, as the exporter's sampler gives
        # it: the page's energy per token needs a minute of their counters.
        board.set_gpus(lambda: gpus.reading)
        if index * step == at:
            kept["status"] = board.status()

    render(scenarios.load(name), step=step, poll_interval=POLL, start=START, instance=INSTANCE,
           on_poll=on_poll, on_scrape=on_scrape)
    return kept["status"]


def photograph(status: dict, stem: str, out: Path, browser: Browser) -> list[Path]:
    pages = GlancePages(_Frozen(status), "/metrics", [f"http://{INSTANCE}"])
    server = serve(make_app(Exposition(CollectorRegistry()), "/metrics", [f"http://{INSTANCE}"],
                            pages), "127.0.0.1:0")
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    written = []
    try:
        for suffix, width, height, mobile in (("wide", 1366, 768, False),
                                              ("phone", 400, 800, True)):
            page = browser.page(width=width, height=height, mobile=mobile)
            page.navigate(url)
            problems = page.problems
            if problems:
                raise RuntimeError(f"{stem} {suffix}: {problems}")
            path = out / f"glance-{stem}-{suffix}.png"
            page.screenshot(path)
            written.append(path)
    finally:
        server.shutdown()
        server.server_close()
    return written


def photograph_all(out: Path, s: Settings) -> list[Path]:
    """Every shot of SHOTS, wide and phone, into `out`."""
    written = []
    with Browser() as browser:
        for name, at, stem in SHOTS:
            written += photograph(capture(name, at, s), stem, out, browser)
    return written
