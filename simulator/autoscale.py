"""`render_fleet`: a pool of unified servers behind a load balancer, sized by the replica
recommendation as KEDA or an HPA would size it, faster than real time (docs/scaling.md).

The scenario's traffic arrives at the pool; each request goes to the ready server holding the
fewest requests (running and waiting), as a least-load gateway sends it. Every server is the
simulator's own (simulator/simulation.py) with the real exporter code polling it in-process, as
simulator/render.py does for one; each server's series carry its own `instance`
(`sglang-0:30000`, …) and `host` (`node-0`, …: one server per node, as on Kubernetes). The
nodes stay when their server leaves (no cluster autoscaler here): the node's exporter (the GPU
DaemonSet's) keeps answering its scrapes (`up`), so the host keeps reporting while its server's
series, and here its GPUs', end.

At each rule evaluation (the scrape step) the recommendation is computed from the series just
scraped by sglang_obs/core/scaling.py's `Recommender`, the Python spelling of the recording
rules, and applied: a server asked for is ready `startup_s` later (the pod scheduled, the
weights loaded, the CUDA graphs captured); a server no longer needed stops taking requests at
once and leaves when its last request finishes. Without a recommender the pool keeps its
`initial` servers: the same traffic, unscaled. The rules themselves are not evaluated here:
tests/test_scaling.py runs them in promtool over the rendered series and requires, step by
step, the recommendation this loop applied.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sglang_obs.core import settings
from sglang_obs.core.scaling import Recommender
from sglang_obs.core.sglang import EXPORTER_PORT, SGLANG_PORT
from sglang_obs.exporter.collector import GpuCollector, GuardedCollector, SGLangCollector
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.gpu_feed import FeedNvml
from sglang_obs.exporter.nvml import NvmlBackend
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.sglang_exposition import samples as exposition_samples
from sglang_obs.exporter.xid import XidWatcher
from sglang_obs.simulator.render import (
    EXPORTER_JOB,
    SGLANG_JOB,
    Rendered,
    _metrics_text,
    _quiet,
    in_process_fetcher,
)
from sglang_obs.simulator.render import promtool_series as render_series
from sglang_obs.simulator.scenario import Scenario
from sglang_obs.simulator.server import make_app
from sglang_obs.simulator.simulation import Simulation

# From the decision to a server taking requests: the pod scheduled on a node that has the
# image, the weights read from local disk (tens of GB), the CUDA graphs captured, a warm-up.
# SGLang's own start on a warm node takes one to three minutes for a model of this size.
STARTUP_S = 180.0
# The exporter's series the recommendation reads, per server (scaling_rules.py).
LOAD_SERIES = {
    "running": "sglang_obs_running_requests", "waiting": "sglang_obs_waiting_requests",
    "max_running": "sglang_obs_max_running_requests", "kv": "sglang_obs_kv_occupancy_ratio",
    "backlog": "sglang_obs_prefill_backlog_tokens",
}
POOL_SERIES = "sglang_obs_server_config_info"


@dataclass
class Replica:
    index: int
    sim: Simulation
    app: object
    poller: TargetPoller
    registry: CollectorRegistry
    gpus: GpuSampler
    asked_at: float
    ready_at: float
    draining_since: float | None = None
    gone_at: float | None = None
    scraped: bool = False

    @property
    def instance(self) -> str:
        return f"sglang-{self.index}:{SGLANG_PORT}"

    @property
    def host(self) -> str:
        return f"node-{self.index}"

    @property
    def ready(self) -> bool:
        return self.sim.server.up

    @property
    def outstanding(self) -> int:
        return sum(len(s.running) + len(s.waiting) + (1 if s.chunked else 0)
                   for s in self.sim.server.schedulers)


@dataclass
class Decision:
    """One evaluation: the recommender's figures and the pool it left."""
    t: float
    load: float
    desired: int
    recommended: int
    serving: int  # ready servers taking requests after the decision
    asked: int  # servers asked for (ready, starting) after the decision


@dataclass
class Fleet:
    rendered: Rendered
    replicas: list[Replica]
    decisions: list[Decision] = field(default_factory=list)
    stale: dict[str, int] = field(default_factory=dict)  # instance -> first step it is gone
    requests: list = field(default_factory=list)  # every arrival (first_token_at: None if not)
    lost: int = 0  # arrivals no server could take


def render_fleet(scenario: Scenario, recommender: Recommender | None = None, initial: int = 1,
                 startup_s: float = STARTUP_S, step: float | None = None,
                 poll_interval: float = 5.0, start: float = 0.0) -> Fleet:
    """The pool's series at every scrape step, and the recommendation applied at each."""
    step = step or settings.default().scrape_interval_s
    quiet = dataclasses.replace(scenario, phases=[], faults=[])
    out = Rendered(start=start, step=step, steps=int(scenario.duration // step) + 1)
    fleet = Fleet(out, [])
    lock = threading.Lock()

    def add_replica(now: float, ready_at: float) -> Replica:
        sim = Simulation(quiet, start_ts=start)
        sim.server.crash()  # not there yet: it boots, empty-cached, at ready_at
        app = make_app(sim, lock)
        poller = TargetPoller(
            f"http://sglang-{len(fleet.replicas)}:{SGLANG_PORT}",
            PollSettings(interval=poll_interval),
            clock=lambda: sim.t, wall_clock=lambda: start + sim.t,
            fetcher=in_process_fetcher(app, lock, lambda: sim.up))
        nvml = FeedNvml(lambda: [r.__dict__ for r in sim.gpu_readings()])
        gpus = GpuSampler(NvmlBackend(nvml), XidWatcher(nvml))
        registry = CollectorRegistry()
        registry.register(GuardedCollector([SGLangCollector([poller]), GpuCollector(gpus)]))
        replica = Replica(len(fleet.replicas), sim, app, poller, registry, gpus, now, ready_at)
        fleet.replicas.append(replica)
        return replica

    for _ in range(initial):
        add_replica(0.0, 0.0)
    arrivals = scenario.arrivals()
    fleet.requests = arrivals
    next_arrival = 0

    def living() -> list[Replica]:
        return [r for r in fleet.replicas if r.gone_at is None]

    def advance(until: float) -> None:
        nonlocal next_arrival
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrival <= until:
            req = arrivals[next_arrival]
            next_arrival += 1
            for r in living():
                r.sim.advance(req.arrival)
            takers = [r for r in living() if r.ready and r.draining_since is None]
            if takers:
                min(takers, key=lambda r: (r.outstanding, r.index)).sim.server.submit(req)
            else:  # the gateway answers 503: the request is lost
                fleet.lost += 1
        for r in living():
            r.sim.advance(until)
            if not r.ready and r.draining_since is None and r.ready_at <= until:
                r.sim.server.restart()
            if r.draining_since is not None and r.outstanding == 0:
                r.gone_at = until

    def scrape(index: int) -> dict[str, dict[str, float]]:
        seen: dict[str, dict[str, float]] = {}
        for r in fleet.replicas:
            if r.gone_at is not None or not r.ready:
                if r.scraped:  # it left; its node stays, and the node's exporter answers
                    fleet.stale.setdefault(r.instance, index)
                    out.add("up", {"job": EXPORTER_JOB, "host": r.host,
                                   "instance": f"{r.host}:{EXPORTER_PORT}"}, index, 1.0)
                continue
            r.scraped = True
            r.gpus.sample()
            target = {"job": SGLANG_JOB, "instance": r.instance, "host": r.host}
            out.add("up", target, index, 1.0)
            for name, labels, value in exposition_samples(_metrics_text(r.app)):
                out.add(name, {**labels, **target}, index, value)
            exporter = {"job": EXPORTER_JOB, "instance": f"{r.host}:{EXPORTER_PORT}",
                        "host": r.host}
            out.add("up", exporter, index, 1.0)
            mine: dict[str, float] = {}
            for family in r.registry.collect():
                for s in family.samples:
                    labels = {**s.labels, "job": EXPORTER_JOB, "host": r.host}
                    labels["instance"] = labels.get("server") or f"{r.host}:{EXPORTER_PORT}"
                    out.add(s.name, labels, index, s.value)
                    if labels["instance"] == r.instance:
                        mine[s.name] = max(mine.get(s.name, s.value), s.value)
            seen[r.instance] = mine
        return seen

    def apply(now: float, wanted: int) -> None:
        asked = [r for r in living() if r.draining_since is None]
        for _ in range(wanted - len(asked)):
            add_replica(now, now + startup_s)
        extra = len(asked) - wanted
        # Cancel servers still starting first, then drain the least busy ready ones.
        for r in sorted(asked, key=lambda r: (r.ready, r.outstanding, -r.index))[:max(extra, 0)]:
            r.draining_since = now
            if not r.ready:
                r.gone_at = now

    t = 0.0
    with _quiet("sglang_obs.exporter.poller"):
        for index in range(out.steps):
            at = index * step
            while t <= at:
                advance(t)
                for r in living():
                    if r.ready:
                        r.poller.poll_once()
                t += poll_interval
            advance(at)
            seen = scrape(index)
            if recommender is None:
                continue
            loads = {i: server_load(recommender, v) for i, v in seen.items()
                     if POOL_SERIES in v}
            rec = recommender.step(at, {i: v for i, v in loads.items() if v is not None})
            apply(at, rec)
            fleet.decisions.append(Decision(
                at, recommender.load, recommender.desired, rec,
                sum(1 for r in living() if r.ready and r.draining_since is None),
                sum(1 for r in living() if r.draining_since is None)))
    return fleet


def server_load(recommender: Recommender, v: dict[str, float]) -> float | None:
    """A server's load from its exporter series as the recording rules read them."""
    return recommender.policy.server_load(*(v.get(LOAD_SERIES[k]) for k in (
        "running", "waiting", "max_running", "kv", "backlog")))


def promtool_series(fleet: Fleet, names: Iterable[str] | None = None) -> list[dict]:
    """render.promtool_series with 'stale' where a server left: its own series, and its
    exporter's that carry no server (the GPUs')."""
    def gone_at(labels: dict[str, str]) -> int | None:
        instance = labels.get("instance", "")
        if instance.endswith(f":{EXPORTER_PORT}"):
            instance = f"sglang-{labels.get('host', '').removeprefix('node-')}:{SGLANG_PORT}"
        return fleet.stale.get(instance)

    return render_series(fleet.rendered, names, gone_at)
