"""`sglang-sim` serving: SGLang's HTTP surface over a simulation advancing in real time.

A ticker thread advances the simulation with the wall clock (times --speed). While the scenario
has the server crashed the listening socket is closed, so clients see connection refused, as
with a dead SGLang process; it reopens on the same port at the restart. The GPU feed can have a
port of its own (`--gpu-feed-port`) that stays open through a crash, as NVML outlives SGLang.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import IO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from sglang_obs.simulator import endpoints
from sglang_obs.simulator.exposition import SimCollector
from sglang_obs.simulator.logs import format_event
from sglang_obs.simulator.plain_text import families_text, metrics_route
from sglang_obs.simulator.simulation import Simulation

log = logging.getLogger("sglang_obs.simulator")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        log.debug("%s %s", self.address_string(), format % args)


class LogSink:
    """Writes scheduler events as the release's log lines to stdout and/or a file."""

    def __init__(self, release: str, tp_size: int, dp_size: int, streams: list[IO[str]]):
        self.release, self.tp_size, self.dp_size = release, tp_size, dp_size
        self.streams = streams

    def __call__(self, event) -> None:
        line = format_event(event, self.release, tp_size=self.tp_size, dp_size=self.dp_size)
        for stream in list(self.streams):
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError) as err:  # a closed pipe (`| head`), a full disk
                self.streams.remove(stream)
                log.warning("scheduler log lines no longer written to %s: %s",
                            getattr(stream, "name", "a stream"), err)


def make_app(sim: Simulation, lock: threading.Lock, metrics_escaping: str = "negotiate",
             gpu_feed: bool = False) -> Callable:
    profile = sim.profile
    registry = CollectorRegistry()
    registry.register(SimCollector(lambda: sim.server, profile))
    metrics_app = metrics_route(families_text(registry.collect), make_wsgi_app(registry))

    def json_response(start_response, payload, status="200 OK"):
        body = json.dumps(payload).encode()
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(body)))])
        return [body]

    def empty(start_response, status):
        start_response(status, [("Content-Length", "0")])
        return [b""]

    routes: dict[str, Callable] = {
        "/get_server_info": lambda: endpoints.server_info(sim.server, profile),
        "/get_model_info": lambda: {"model_path": sim.scenario.server.model_path,
                                    "tokenizer_path": sim.scenario.server.model_path,
                                    "is_generation": True},
        "/v1/models": lambda: endpoints.models(sim.server),
        "/sim/state": lambda: {"scenario": sim.scenario.name, "release": profile.release,
                               "sim_seconds": sim.t, "up": sim.up,
                               "restarts": sim.server.restarts},
    }
    if profile.has_server_info_route:
        routes["/server_info"] = routes["/get_server_info"]
        routes["/model_info"] = routes["/get_model_info"]
    if profile.load_endpoint == "v1_loads":
        routes["/v1/loads"] = lambda: endpoints.loads(sim.server, profile)
    if profile.has_get_load:
        routes["/get_load"] = (
            (lambda: endpoints.get_load_shim(sim.server, profile))
            if profile.at_least("0.5.12") else (lambda: endpoints.loads(sim.server, profile)))
    if gpu_feed:
        routes["/sim/gpu"] = lambda: [r.__dict__ for r in sim.gpu_readings()]
    health = {"/health", "/health_generate"} | ({"/ready"} if profile.has_ready_route else set())

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        with lock:
            if path == "/metrics":
                if metrics_escaping == "colon":  # prometheus_client < 0.23: never escapes
                    environ = {**environ, "HTTP_ACCEPT": "text/plain"}
                return metrics_app(environ, start_response)
            if path in health:
                return empty(start_response, "200 OK")
            if path in routes:
                return json_response(start_response, routes[path]())
        return json_response(start_response, {"detail": "Not Found"}, "404 Not Found")

    return app


class SimServer:
    """Owns the listening socket and the ticker; `run()` blocks until `stop()`."""

    def __init__(self, sim: Simulation, host: str, port: int, speed: float = 1.0,
                 metrics_escaping: str = "negotiate", gpu_feed: bool = False,
                 tick_seconds: float = 0.1, gpu_feed_port: int | None = None):
        self.sim, self.host, self.port = sim, host, port
        self.speed, self.tick = speed, tick_seconds
        self.lock = threading.Lock()
        self.app = make_app(sim, self.lock, metrics_escaping, gpu_feed)
        self._httpd: _Server | None = None
        self.gpu_feed_port = gpu_feed_port
        self._feed_httpd: _Server | None = None
        self._stop = threading.Event()

    def _listen(self) -> None:
        self._httpd = make_server(self.host, self.port, self.app, _Server,
                                  handler_class=_QuietHandler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True, name="http").start()

    def _close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def start(self) -> None:
        self._listen()
        if self.gpu_feed_port is not None:
            self._listen_gpu_feed()
        threading.Thread(target=self._tick_loop, daemon=True, name="ticker").start()

    def _listen_gpu_feed(self) -> None:
        sim, lock = self.sim, self.lock

        def feed(environ, start_response):
            if environ.get("PATH_INFO") != "/sim/gpu":
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found\n"]
            with lock:
                body = json.dumps([r.__dict__ for r in sim.gpu_readings()]).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]

        self._feed_httpd = make_server(self.host, self.gpu_feed_port, feed, _Server,
                                       handler_class=_QuietHandler)
        self.gpu_feed_port = self._feed_httpd.server_address[1]
        threading.Thread(target=self._feed_httpd.serve_forever, daemon=True,
                         name="gpu-feed").start()

    def _tick_loop(self) -> None:
        wall0, sim0 = time.monotonic(), self.sim.t
        while not self._stop.wait(self.tick):
            with self.lock:
                was_up = self.sim.up
                self.sim.advance(sim0 + (time.monotonic() - wall0) * self.speed)
                now_up = self.sim.up
            if was_up and not now_up:
                log.warning("scenario: server crashed; refusing connections")
                self._close()
            elif now_up and not was_up:
                log.warning("scenario: server restarted")
                self._listen()

    def stop(self) -> None:
        self._stop.set()
        self._close()
        if self._feed_httpd is not None:
            self._feed_httpd.shutdown()
            self._feed_httpd.server_close()
            self._feed_httpd = None

    def run(self) -> None:
        self.start()
        try:
            self._stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
