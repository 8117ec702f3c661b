"""HTTP side: a landing page at /, the registry at the telemetry path, and /sd/sglang.

prometheus_client's WSGI app renders the exposition (and negotiates OpenMetrics and gzip).
/sd/sglang lists the SGLang servers in Prometheus HTTP service-discovery format (built in
targets.py), so the `sglang` scrape job targets exactly the servers the exporter polls: the URLs
are configured once.
"""

from __future__ import annotations

import html
import logging
import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from sglang_obs import __version__
from sglang_obs.exporter.targets import service_discovery

log = logging.getLogger(__name__)

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>SGLang observability exporter</title></head>
<body><h1>SGLang observability exporter</h1>
<p>Version {version}. Derived signals for SGLang servers: KV occupancy, continuous queueing time,
prefill backlog, effective configuration, and the exporter's own health.</p>
<p><a href="{path}">Metrics</a> · <a href="/sd/sglang">SGLang targets (Prometheus HTTP SD)</a></p>
<h2>Targets</h2><ul>{targets}</ul>
</body></html>
"""


def parse_listen_address(value: str) -> tuple[str, int]:
    """':9840', '127.0.0.1:9840', '[::1]:9840' -> (host, port).

    An empty host means all interfaces; port 0 means any free port.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"listen address must be [host]:port, got {value!r}")
    return host.strip("[]"), int(port)


def make_app(registry: CollectorRegistry, telemetry_path: str, targets: list[str]):
    metrics_app = make_wsgi_app(registry)
    page = LANDING.format(
        version=html.escape(__version__),
        path=html.escape(telemetry_path),
        targets="".join(f"<li>{html.escape(t)}</li>" for t in targets),
    ).encode()
    sd = service_discovery(targets)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == telemetry_path:
            return metrics_app(environ, start_response)
        if path == "/sd/sglang":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [sd]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"Not found. Metrics are at " + telemetry_path.encode() + b"\n"]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _IPv6Server(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - one access line per scrape is noise
        log.debug("%s %s", self.address_string(), format % args)


def serve(app, listen_address: str):
    """Start serving in a daemon thread; returns the server (its .server_address has the port)."""
    host, port = parse_listen_address(listen_address)
    server_class = _IPv6Server if ":" in host else _ThreadingServer
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server
