"""`sglang-sim render`: a scenario's Prometheus series, faster than real time.

The simulation advances in simulated time. At every poll interval the real exporter code
(exporter.poller.TargetPoller) polls the simulator's HTTP app in-process, so derived series are
exactly what the exporter would produce. At every scrape step both /metrics are collected as
Prometheus would store them: SGLang's series under job "sglang", the exporter's under job
"sglang-obs" with `server` copied into `instance` (the relabelling of prometheus/prometheus.yml).

Writers: OpenMetrics with timestamps for `promtool tsdb create-blocks-from openmetrics`, and
`input_series` for `promtool test rules`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from sglang_obs.core import settings
from sglang_obs.core.sglang import EXPORTER_ADDRESS, SGLANG_PORT
from sglang_obs.exporter.collector import (
    ContainerCollector,
    GpuCollector,
    GuardedCollector,
    LogCollector,
    RequestCollector,
    SGLangCollector,
    model_of,
)
from sglang_obs.exporter.containers import ContainerReading
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.gpu_feed import FeedNvml, FeedTimeout
from sglang_obs.exporter.http_fetch import FetchError, Response
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.nvml import NvmlBackend
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.request_records import RequestStats
from sglang_obs.exporter.sglang_exposition import samples as exposition_samples
from sglang_obs.exporter.sglang_log import parse_line
from sglang_obs.exporter.xid import XidWatcher
from sglang_obs.simulator.logs import format_event
from sglang_obs.simulator.profiles import profile
from sglang_obs.simulator.records import RecordFiles, RecordSink, line
from sglang_obs.simulator.scenario import Scenario
from sglang_obs.simulator.server import make_app
from sglang_obs.simulator.simulation import Simulation

SGLANG_JOB = "sglang"
EXPORTER_JOB = "sglang-obs"
EXPORTER_INSTANCE = EXPORTER_ADDRESS

Labels = tuple[tuple[str, str], ...]


@dataclass
class Rendered:
    """Samples per series at each scrape step (missing steps: the series was absent)."""

    start: float  # unix time of step 0
    step: float
    steps: int
    series: dict[tuple[str, Labels], dict[int, float]] = field(default_factory=dict)
    # The truth behind the series: (seconds since step 0, prompt tokens, prefix-cached tokens,
    # of which loaded back from HiCache's host tier) of each request as it finished.
    finished: list[tuple[float, int, int, int]] = field(default_factory=list)

    def add(self, name: str, labels: dict[str, str], index: int, value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.series.setdefault(key, {})[index] = value

    def values(self, name: str, **match: str) -> list[float | None]:
        """One value per step (None where absent), summed over series matching `match`."""
        out: list[float | None] = [None] * self.steps
        for (n, labels), points in self.series.items():
            if n != name or any(dict(labels).get(k) != v for k, v in match.items()):
                continue
            for i, v in points.items():
                out[i] = (out[i] or 0.0) + v
        return out

    def time(self, index: int) -> float:
        return self.start + index * self.step


def in_process_fetcher(app, lock: threading.Lock, up: Callable[[], bool]):
    """A fetch() look-alike that calls the simulator's WSGI app directly."""

    def fetch(url: str, *, timeout: float, max_bytes: int, accept: str = "*/*",
              headers=None) -> Response:
        if not up():
            raise FetchError("connection_refused", "connection refused")
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": urllib.parse.urlsplit(url).path,
                   "QUERY_STRING": "",
                   "HTTP_ACCEPT": accept, "wsgi.input": io.BytesIO(), "SERVER_NAME": "sim",
                   "SERVER_PORT": str(SGLANG_PORT), "wsgi.url_scheme": "http"}
        status: dict = {}

        def start_response(code, headers):
            status["code"] = int(code.split()[0])
            status["headers"] = dict(headers)

        body = b"".join(app(environ, start_response))
        if status["code"] >= 400:
            raise FetchError("http_status", f"HTTP {status['code']}", status=status["code"])
        return Response(status["code"], status["headers"].get("Content-Type", ""), body)

    return fetch


class _SimLog:
    """The scheduler log the scenario writes, read by the exporter's own parser and stats."""

    kind = "file"
    up = True
    rotations = 0

    def __init__(self, server: str, release: str, tp_size: int, dp_size: int):
        self.server, self.stats = server, LogStats()
        self._format = (release, tp_size, dp_size)

    def __call__(self, event) -> None:
        release, tp, dp = self._format
        self.stats.feed(parse_line(format_event(event, release, tp_size=tp, dp_size=dp)))


class _SimRequests:
    """The request-record files the scenario writes, read by the exporter's own parser."""

    kind = "dir"
    up = True
    rotations = 0

    def __init__(self, server: str):
        self.server, self.stats = server, RequestStats(where="simulated records")

    def __call__(self, rec: dict) -> None:
        self.stats.feed_line(line(rec).encode())


class _SimContainer:
    """The SGLang container as the Docker API would describe it during the scenario."""

    up = True

    def __init__(self, sim: Simulation, server: str, start: float):
        self._sim, self._server, self._start = sim, server, start

    @property
    def readings(self) -> list[ContainerReading]:
        server = self._sim.server
        return [ContainerReading(
            name="sglang", server=self._server, image="lmsysorg/sglang:simulated",
            state="running" if server.up else "restarting", running=server.up,
            restart_count=server.restarts, oom_killed=False, oom_kills=0,
            exit_code=0 if not server.restarts else 137, health="healthy" if server.up else "",
            started_at=self._start + server.started_at)]


def render(scenario: Scenario, release: str | None = None, start: float = 0.0,
           step: float | None = None, poll_interval: float = 5.0, instance: str = "sglang:30000",
           on_event=None, on_poll=None, on_scrape=None,
           request_metrics_dir: Path | None = None) -> Rendered:
    """Every series the stack would store: SGLang's own, and the exporter's with all its
    sources — polls, the scheduler log, the request records (releases that write them; also
    into `request_metrics_dir` as SGLang's hourly files), the container, the scenario's GPUs.

    `on_poll(t, snapshot)` is given each poll cycle as the poller gives it to the glance page
    (exporter.status); `on_scrape(index, gpus)` is called at each scrape step, after the GPUs
    were sampled (`gpus`: the GpuSampler). `step`: the scrape interval (default: the shipped
    prometheus.yml's)."""
    step = step or settings.default().scrape_interval_s
    tp, dp = scenario.server.tp_size, scenario.server.dp_size
    prof = profile(release or scenario.release)
    sim_log = _SimLog(instance, prof.release, tp, dp)
    sim_requests = _SimRequests(instance) if prof.request_records else None
    files = RecordFiles(request_metrics_dir) if request_metrics_dir and sim_requests else None
    sink = RecordSink(prof, scenario.server, start, scenario.seed,
                      [t for t in (sim_requests, files and files.write) if t])

    def events(event) -> None:
        sim_log(event)
        if on_event:
            on_event(event)

    out = Rendered(start=start, step=step, steps=int(scenario.duration // step) + 1)

    def finished(req, t: float) -> None:
        out.finished.append((t, req.input_len, req.cached_len, req.host_cached_len))
        sink(req, t)

    sim = Simulation(scenario, release, start_ts=start, on_event=events, on_request=finished)
    lock = threading.Lock()
    app = make_app(sim, lock)
    poller = TargetPoller(
        f"http://{instance}", PollSettings(interval=poll_interval),
        clock=lambda: sim.t, wall_clock=lambda: start + sim.t,
        fetcher=in_process_fetcher(app, lock, lambda: sim.up),
        log_stats=sim_log.stats, on_poll=on_poll)
    nvml = FeedNvml(lambda: [r.__dict__ for r in sim.gpu_readings()])
    xids, xid_events = XidWatcher(nvml), nvml.nvmlEventSetCreate()
    gpus = GpuSampler(NvmlBackend(nvml), xids)
    exporter = CollectorRegistry()
    collectors = [SGLangCollector([poller]), LogCollector([sim_log])]
    if sim_requests is not None:
        collectors.append(RequestCollector([sim_requests], model_of([poller])))
    exporter.register(GuardedCollector([
        *collectors, ContainerCollector(_SimContainer(sim, instance, start)),
        GpuCollector(gpus)]))

    def scrape(index: int) -> None:
        gpus.sample()
        _deliver_xids(nvml, xid_events, xids)
        _collect_native(sim, app, out, index, instance)
        _collect_exporter(exporter, out, index)
        if on_scrape is not None:
            on_scrape(index, gpus)

    step_through(out, poll_interval, sim.advance, poller.poll_once, scrape)
    if files is not None:
        files.close()
    return out


def step_through(out: Rendered, poll_interval: float, advance: Callable[[float], None],
                 poll: Callable[[], object], scrape: Callable[[int], None]) -> None:
    """Simulated time from 0 to `out`'s last step: the exporter polls every `poll_interval`
    (several times per scrape), then Prometheus scrapes (`scrape(index)`) at each step."""
    t = 0.0
    # The scenario's own faults would make the exporter warn on every render; the level is
    # put back after, for the real pollers of the same process.
    with _quiet("sglang_obs.exporter.poller"):
        for index in range(out.steps):
            scrape_at = index * out.step
            while t <= scrape_at:
                advance(t)
                poll()
                t += poll_interval
            advance(scrape_at)
            scrape(index)


@contextlib.contextmanager
def _quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _deliver_xids(nvml: FeedNvml, events: set, xids: XidWatcher) -> None:
    """What the Xid watcher's thread does live, here in simulated time: book each new event,
    at the scenario's own time of it."""
    while True:
        try:
            event = nvml.nvmlEventSetWait(events, 0)
        except FeedTimeout:
            return
        xids.record(str(event.device), nvml.nvmlDeviceGetUUID(event.device), event.eventData,
                    at=event.timestamp / 1e6)


def _metrics_text(app) -> str:
    result: dict = {}
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
               "HTTP_ACCEPT": "text/plain", "wsgi.input": io.BytesIO(), "SERVER_NAME": "sim",
               "SERVER_PORT": str(SGLANG_PORT), "wsgi.url_scheme": "http"}
    body = b"".join(app(environ, lambda code, headers: result.setdefault("code", code)))
    return body.decode()


def _collect_native(sim: Simulation, app, out: Rendered, index: int, instance: str) -> None:
    target = {"job": SGLANG_JOB, "instance": instance}
    out.add("up", target, index, 1.0 if sim.up else 0.0)
    if not sim.up:
        return
    for name, labels, value in exposition_samples(_metrics_text(app)):
        out.add(name, {**labels, **target}, index, value)


def _collect_exporter(registry: CollectorRegistry, out: Rendered, index: int) -> None:
    out.add("up", {"job": EXPORTER_JOB, "instance": EXPORTER_INSTANCE}, index, 1.0)
    for family in registry.collect():
        for sample in family.samples:
            labels = {**sample.labels, "job": EXPORTER_JOB}
            labels["instance"] = labels.get("server") or EXPORTER_INSTANCE
            out.add(sample.name, labels, index, sample.value)


# -- writers ------------------------------------------------------------------------------
def _label_text(labels: Labels) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return ",".join(f'{k}="{esc(v)}"' for k, v in labels)


def _value_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def write_openmetrics(rendered: Rendered, path: Path) -> None:
    """Samples grouped by metric name, each series in time order, `# EOF` last."""
    by_name: dict[str, list] = {}
    for (name, labels), points in rendered.series.items():
        by_name.setdefault(name, []).append((labels, points))
    with path.open("w") as f:
        for name in sorted(by_name):
            for labels, points in sorted(by_name[name]):
                lab = _label_text(labels)
                for i in sorted(points):
                    f.write(f"{name}{{{lab}}} {_value_text(points[i])} "
                            f"{rendered.time(i):.3f}\n")
        f.write("# EOF\n")


def promtool_series(rendered: Rendered, names: Iterable[str] | None = None,
                    gone_at: Callable[[dict[str, str]], int | None] | None = None) -> list[dict]:
    """`input_series` for promtool test rules; '_' marks a step where the series was absent.
    With `gone_at(labels)`, the step its target left: 'stale' at the first absent step from
    there (Prometheus marks a vanished target's series stale at once)."""
    wanted = set(names) if names is not None else None
    series = []
    for (name, labels), points in sorted(rendered.series.items()):
        if wanted is not None and name not in wanted:
            continue
        gone = gone_at(dict(labels)) if gone_at is not None else None
        values = []
        for i in range(rendered.steps):
            if i in points:
                values.append(_value_text(points[i]))
            elif gone is not None and i >= gone and (i - 1 in points or i == gone):
                values.append("stale")
            else:
                values.append("_")
        series.append({"series": f"{name}{{{_label_text(labels)}}}", "values": " ".join(values)})
    return series


def write_promtool_series(rendered: Rendered, path: Path,
                          names: Iterable[str] | None = None) -> None:
    doc = {"interval": f"{int(rendered.step)}s",
           "input_series": promtool_series(rendered, names)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
