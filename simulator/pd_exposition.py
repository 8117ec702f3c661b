"""What each process of a simulated PD deployment serves, and `sglang-sim pd` serving it.

An engine serves everything a unified server serves (simulator/exposition.py's SimCollector,
`engine_type` set to its role) with its PD series driven: the PD queue gauges, preallocated
KV, the bootstrap and transfer failure counters, the KV transfer histograms (the prefill side
observes them), the PD stages of `per_stage_req_latency_seconds`, and no TTFT on a prefill
server (SGLang's tokenizer skips it there). `/server_info` says its `disaggregation_mode`,
`/v1/loads` carries the `disaggregation` block. The gateway serves its `smg_*` text
(simulator/gateway.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from sglang_obs.simulator import endpoints, shapes
from sglang_obs.simulator.exposition import P, SimCollector, _add_histogram
from sglang_obs.simulator.model import Histogram
from sglang_obs.simulator.pd import KV_HISTOGRAMS, Deployment, Engine
from sglang_obs.simulator.plain_text import family_text, metrics_route
from sglang_obs.simulator.profiles import Profile

log = logging.getLogger("sglang_obs.simulator")

# Live queue lengths and pool shares (SGLang writes them with its stats; the model does not
# delay them).
PD_GAUGES: dict[str, Callable[[Engine], float]] = {
    P + "num_prefill_bootstrap_queue_reqs": lambda e: float(len(e.bootstrap)),
    P + "num_prefill_inflight_queue_reqs": lambda e: float(len(e.inflight)),
    P + "num_decode_prealloc_queue_reqs": lambda e: float(len(e.prealloc)),
    P + "num_decode_transfer_queue_reqs": lambda e: float(len(e.transfer)),
    P + "pending_prealloc_token_usage":
        lambda e: e.pending_prealloc_tokens / e.server.cfg.max_total_num_tokens,
}
PREALLOC_SHARE = P + "prealloc_full_token_usage"
COUNTERS = {P + "num_bootstrap_failed_reqs_total": "bootstrap_failed",
            P + "num_transfer_failed_reqs_total": "transfer_failed"}
TIMEOUTS = P + "kv_transfer_timeouts_total"  # its own process-wide counter: `stage` only
# Catalogue families (shapes) this module drives instead of leaving at zero.
DRIVEN = frozenset({*KV_HISTOGRAMS.values(), *COUNTERS, PREALLOC_SHARE})
TTFT = P + "time_to_first_token_seconds"
PER_STAGE = P + "per_stage_req_latency_seconds"


def _key(family) -> str:
    return family.name + ("_total" if family.type == "counter" else "")


class PdCollector(SimCollector):
    """An engine's families: the unified exposition, its PD series driven."""

    def __init__(self, engine: Engine, profile: Profile, pid: int | None = None,
                 stamp: Callable[[], object] | None = None):
        super().__init__(lambda: engine.server, profile, pid=pid, engine_type=engine.role)
        self.engine = engine
        self._catalogue: list | None = None
        self.constant: set[int] = set()  # ids of families whose text never changes
        # `stamp()` changes whenever the deployment may have: the families are collected
        # again only then (a render reads them for the poll and the scrape of one instant).
        self._stamp = stamp
        self._last: tuple[object, list] | None = None

    def _unmodelled_families(self, server):
        # The catalogue's families are constant (zeros, startup values): built once.
        if self._catalogue is None:
            self._catalogue = [f for f in super()._unmodelled_families(server)
                               if _key(f) not in DRIVEN]
            self.constant = {id(f) for f in self._catalogue}
        return self._catalogue

    def collect(self) -> Iterator:
        if self._stamp is None:
            yield from self._collect()
            return
        stamp = self._stamp()
        if self._last is None or self._last[0] != stamp:
            self._last = (stamp, list(self._collect()))
        yield from self._last[1]

    def _collect(self) -> Iterator:
        server = self.engine.server
        if not server.up:
            return
        for family in super().collect():
            name = _key(family)
            if name in PD_GAUGES:
                yield _gauge_like(family, PD_GAUGES[name](self.engine))
            elif name == PER_STAGE or (name == TTFT and self.engine.role == "prefill"):
                continue
            else:
                yield family
        timeouts = CounterMetricFamily(TIMEOUTS.removesuffix("_total"),
                                       "KV transfer timeouts, by stage.", labels=["stage"])
        for stage, value in self.engine.timeouts.items():
            timeouts.add_metric([stage], value)
        yield timeouts
        if any(s.has_reported for s in server.schedulers):
            yield from self._pd_families(server)

    def _pd_families(self, server) -> Iterator:
        e, catalogue = self.engine, shapes.load(self.profile.release)
        labels = self._rank_labels(server, None, 0)
        names, values = list(labels), list(labels.values())
        stage = HistogramMetricFamily(PER_STAGE, "Per-stage request latency.",
                                      labels=[*names, "stage"])
        for name, hist in self._stages():
            if hist.count:
                _add_histogram(stage, [*values, name], hist)
        if stage.samples:
            yield stage
        for key, name in KV_HISTOGRAMS.items():
            family = HistogramMetricFamily(name, catalogue[name]["help"], labels=names)
            _add_histogram(family, values, e.kv[key])
            yield family
        for name, attr in COUNTERS.items():
            family = CounterMetricFamily(name.removesuffix("_total"), catalogue[name]["help"],
                                         labels=names)
            family.add_metric(values, getattr(e, attr))
            yield family
        share = GaugeMetricFamily(PREALLOC_SHARE, catalogue[PREALLOC_SHARE]["help"],
                                  labels=names)
        held = e.sched.held_tokens if e.role == "decode" else 0
        share.add_metric(values, held / server.cfg.max_total_num_tokens)
        yield share

    def _stages(self) -> Iterable[tuple[str, Histogram]]:
        own, sched = self.engine.stages, self.engine.sched.per_stage
        if self.engine.role == "prefill":
            return [("prefill_bootstrap", own["prefill_bootstrap"]),
                    ("prefill_forward", sched["prefill_forward"]),
                    ("chunked_prefill", sched["chunked_prefill"]),
                    ("prefill_transfer_kv_cache", own["prefill_transfer_kv_cache"])]
        # The decode server's "prefill" of a transferred request is SGLang's prebuilt batch.
        return [*own.items(), ("fake_output", sched["prefill_forward"])]


def _gauge_like(family, value: float) -> GaugeMetricFamily:
    out = GaugeMetricFamily(family.name, family.documentation,
                            labels=list(family.samples[0].labels) if family.samples else [])
    for sample in family.samples:
        out.add_metric(list(sample.labels.values()), value)
    return out


# -- the text of /metrics -----------------------------------------------------------------------
class MetricsText:
    """An engine's /metrics text, its constant families written once."""

    def __init__(self, collector: PdCollector):
        self.collector = collector
        self._cache: dict[int, str] = {}

    def __call__(self) -> bytes:
        parts = []
        for family in self.collector.collect():
            key = id(family)
            if key in self.collector.constant:
                if key not in self._cache:
                    self._cache[key] = family_text(family)
                parts.append(self._cache[key])
            else:
                parts.append(family_text(family))
        return "".join(parts).encode()


# -- status endpoints ---------------------------------------------------------------------------
def server_info(engine: Engine, profile: Profile) -> dict[str, Any]:
    info = endpoints.server_info(engine.server, profile)
    info["disaggregation_mode"] = engine.role
    info["disaggregation_transfer_backend"] = "mooncake"
    return info


def loads(engine: Engine, profile: Profile) -> dict[str, Any]:
    payload = endpoints.loads(engine.server, profile)
    assert isinstance(payload, dict)  # 0.5.8+: PD scenarios are 0.5.23
    latency, speed = engine.last_transfer if engine.role == "prefill" else (0.0, 0.0)
    for entry in payload["loads"]:
        entry["disaggregation"] = {
            "mode": engine.role,
            "prefill_bootstrap_queue_reqs": len(engine.bootstrap),
            "prefill_inflight_queue_reqs": len(engine.inflight),
            "decode_prealloc_queue_reqs": len(engine.prealloc),
            "decode_transfer_queue_reqs": len(engine.transfer),
            "decode_retracted_queue_reqs": 0,  # the model retracts into the waiting queue
            "kv_transfer_speed_gb_s": speed,
            "kv_transfer_latency_ms": latency,
        }
    return payload


def engine_app(dep: Deployment, engine: Engine, lock: threading.Lock,
               negotiate: bool = True) -> Callable:
    """The engine's HTTP surface. `negotiate`: /metrics by prometheus_client's own WSGI app
    (content negotiation, gzip); otherwise the plain text of MetricsText (render: faster)."""
    profile = dep.profile
    collector = PdCollector(engine, profile, stamp=None if negotiate else lambda: dep.changes)
    registry = CollectorRegistry()
    registry.register(collector)
    metrics_app = make_wsgi_app(registry)
    metrics = metrics_app if negotiate else metrics_route(MetricsText(collector), metrics_app)
    cfg = engine.server.cfg
    routes: dict[str, Callable[[], Any]] = {
        "/server_info": lambda: server_info(engine, profile),
        "/get_server_info": lambda: server_info(engine, profile),
        "/model_info": lambda: {"model_path": cfg.model_path, "tokenizer_path": cfg.model_path,
                                "is_generation": True},
        "/get_model_info": lambda: {"model_path": cfg.model_path,
                                    "tokenizer_path": cfg.model_path, "is_generation": True},
        "/v1/models": lambda: endpoints.models(engine.server),
        "/v1/loads": lambda: loads(engine, profile),
        "/sim/state": lambda: {"scenario": dep.scenario.name, "release": profile.release,
                               "sim_seconds": dep.t, "up": True, "role": engine.role,
                               "engine": engine.name},
    }
    health = {"/health", "/health_generate", "/ready"}

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        with lock:
            if path == "/metrics":
                return metrics(environ, start_response)
            if path in health:
                start_response("200 OK", [("Content-Length", "0")])
                return [b""]
            if path in routes:
                return _json(start_response, routes[path]())
        return _json(start_response, {"detail": "Not Found"}, "404 Not Found")

    app.collector = collector  # the render reads families straight from it
    return app


def gateway_app(dep: Deployment, lock: threading.Lock) -> Callable:
    def app(environ, start_response):
        if environ.get("PATH_INFO", "/") != "/metrics":
            return _json(start_response, {"detail": "Not Found"}, "404 Not Found")
        with lock:
            body = dep.gateway.text().encode()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return app


def _json(start_response, payload, status: str = "200 OK"):
    body = json.dumps(payload).encode()
    start_response(status, [("Content-Type", "application/json"),
                             ("Content-Length", str(len(body)))])
    return [body]


# -- serving ------------------------------------------------------------------------------------
class PdServer:
    """Every engine on its port and the gateway's metrics on another, one ticker advancing the
    deployment with the wall clock (times `speed`). `bind()` first (the ports, so that worker
    URLs name them; OSError with `.port` if one is taken, nothing left listening), then
    `start(deployment)`."""

    def __init__(self, host: str, ports: list[int], gateway_port: int, speed: float = 1.0,
                 tick_seconds: float = 0.1):
        self.host, self.speed, self.tick = host, speed, tick_seconds
        self._wanted = [*ports, gateway_port]
        self.lock = threading.Lock()
        self.dep: Deployment | None = None
        self._httpds: list = []
        self.ports: list[int] = []  # bound: the engines' in order, then the gateway's
        self._stop = threading.Event()

    def bind(self) -> list[int]:
        from wsgiref.simple_server import make_server

        from sglang_obs.simulator.server import _QuietHandler, _Server

        for port in self._wanted:
            try:
                self._httpds.append(make_server(self.host, port, _not_yet, _Server,
                                                handler_class=_QuietHandler))
            except OSError as err:
                for httpd in self._httpds:  # none serves yet: close, do not shut down
                    httpd.server_close()
                self._httpds = []
                err.port = port  # the one that failed, for the caller's message
                raise
        self.ports = [h.server_address[1] for h in self._httpds]
        return self.ports

    def start(self, dep: Deployment) -> None:
        self.dep = dep
        apps = [engine_app(dep, e, self.lock) for e in dep.engines]
        apps.append(gateway_app(dep, self.lock))
        for httpd, app in zip(self._httpds, apps, strict=True):
            httpd.set_app(app)
            threading.Thread(target=httpd.serve_forever, daemon=True, name="http").start()
        threading.Thread(target=self._tick_loop, daemon=True, name="ticker").start()

    def _tick_loop(self) -> None:
        wall0, sim0 = time.monotonic(), self.dep.t
        while not self._stop.wait(self.tick):
            with self.lock:
                self.dep.advance(sim0 + (time.monotonic() - wall0) * self.speed)

    def stop(self) -> None:
        self._stop.set()
        for httpd in self._httpds:
            if self.dep is not None:
                httpd.shutdown()
            httpd.server_close()
        self._httpds = []


def _not_yet(environ, start_response):
    start_response("503 Service Unavailable", [("Content-Length", "0")])
    return [b""]
