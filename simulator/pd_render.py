"""`render_pd`: a PD scenario's series as the stack would store them, faster than real time.

As simulator/render.py does for one server: the deployment advances in simulated time; at
every poll interval one in-process exporter (SGLangCollector, one TargetPoller per engine)
polls each engine's HTTP app; at every scrape step each engine's /metrics is stored under job
"sglang" (instance `pd-prefill-0:30000`, …), the exporter's under job "sglang-obs" with its
`server` copied into `instance`, and the gateway's under job "smg" (instance `smg:29000`,
worker URLs `http://pd-prefill-0:30000`, …). No GPUs, containers, logs or request records.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from sglang_obs.core import settings
from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.simulator.pd import Deployment
from sglang_obs.simulator.pd_exposition import PdCollector, engine_app
from sglang_obs.simulator.pd_scenario import PdScenario
from sglang_obs.simulator.render import (
    SGLANG_JOB,
    Rendered,
    _collect_exporter,
    in_process_fetcher,
    step_through,
)

SMG_JOB = "smg"
GATEWAY_PORT = 29000  # smg's default Prometheus port
GATEWAY_INSTANCE = f"smg:{GATEWAY_PORT}"


def render_pd(scenario: PdScenario, step: float | None = None, start: float = 0.0,
              poll_interval: float = 5.0, deployment: list | None = None) -> Rendered:
    """Every series of the deployment at each scrape step (`step`: default the shipped
    prometheus.yml's scrape interval). `deployment`, if given, receives the Deployment (its
    requests carry the exact TTFT split)."""
    step = step or settings.default().scrape_interval_s
    dep = Deployment(scenario, start_ts=start)
    if deployment is not None:
        deployment.append(dep)
    lock = threading.Lock()
    apps = {e.name: engine_app(dep, e, lock, negotiate=False) for e in dep.engines}
    pollers = [TargetPoller(f"http://{e.instance}", PollSettings(interval=poll_interval),
                            clock=lambda: dep.t, wall_clock=lambda: start + dep.t,
                            fetcher=in_process_fetcher(apps[e.name], lock, lambda: True))
               for e in dep.engines]
    exporter = CollectorRegistry()
    exporter.register(GuardedCollector([SGLangCollector(pollers)]))
    native = {e.name: _Native(apps[e.name].collector, e.instance) for e in dep.engines}

    out = Rendered(start=start, step=step, steps=int(scenario.duration // step) + 1)

    def poll() -> None:
        for poller in pollers:
            poller.poll_once()

    def scrape(index: int) -> None:
        for e in dep.engines:
            native[e.name].collect(out, index)
        _collect_gateway(dep, out, index)
        _collect_exporter(exporter, out, index)

    step_through(out, poll_interval, dep.advance, poll, scrape)
    return out


class _Native:
    """An engine's own /metrics as Prometheus stores it: the families straight from the
    collector (the same samples its text carries), constant ones keyed once."""

    def __init__(self, collector: PdCollector, instance: str):
        self.collector = collector
        self.target = {"job": SGLANG_JOB, "instance": instance}
        self._keys: dict[int, list] = {}

    def collect(self, out: Rendered, index: int) -> None:
        out.add("up", self.target, index, 1.0)
        for family in self.collector.collect():
            key = id(family)
            if key in self.collector.constant:
                if key not in self._keys:
                    self._keys[key] = [
                        ((s.name, tuple(sorted({**s.labels, **self.target}.items()))), s.value)
                        for s in family.samples]
                for series, value in self._keys[key]:
                    out.series.setdefault(series, {})[index] = value
                continue
            for s in family.samples:
                out.add(s.name, {**s.labels, **self.target}, index, s.value)


def _collect_gateway(dep: Deployment, out: Rendered, index: int) -> None:
    target = {"job": SMG_JOB, "instance": GATEWAY_INSTANCE}
    out.add("up", target, index, 1.0)
    for _, _, _, rows in dep.gateway.samples():
        for name, labels, value in rows:
            out.add(name, {**labels, **target}, index, value)
