"""HTTP side: the glance page at / (or a plain landing page), the exposition at the telemetry
path, and /sd/sglang.

The exposition is rendered once per change of what it shows (at most once per
RENDER_INTERVAL_S in the exporter), not once per scrape: sources call
`Exposition.changed()` after each cycle, and the next scrape renders the families once and keeps
the bytes (text 0.0.4 and OpenMetrics, each plain and gzip-encoded on first request), by
exposition_format.py's renderer (prometheus_client's bytes, a label set's text made once).
Concurrent scrapes of the same state then cost a memory copy, and no scrape waits for a poll.
The server (http_server.py) reads requests on one event loop and answers them from worker
threads, the telemetry path from workers of its own, so slow or idle clients cannot starve a scrape.
Every answer says `nosniff`; the HTML ones carry a Content-Security-Policy.
/sd/sglang lists the SGLang servers in Prometheus HTTP service-discovery format (built in
targets.py), so the `sglang` scrape job targets exactly the servers the exporter polls: the URLs
are configured once. The glance page's routes (/, /api/v1/status and its stylesheet and script)
are answered by exporter/status_page.py, on request, from the pollers' history: nothing of it
runs on the scrape path.
"""

from __future__ import annotations

import gzip
import html
import itertools
import logging
import math
import threading
import time

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.exposition import generate_latest as render_text
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OM
from prometheus_client.openmetrics.exposition import generate_latest as render_openmetrics

from sglang_obs import __version__
from sglang_obs.exporter.exposition_format import Renderer, Unsupported
from sglang_obs.exporter.http_server import Server
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


# The landing page has no script, style or image; text answers need none either.
LANDING_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


def parse_listen_address(value: str) -> tuple[str, int]:
    """':9840', '127.0.0.1:9840', '[::1]:9840' -> (host, port).

    An empty host means all interfaces; port 0 means any free port.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"listen address must be [host]:port, got {value!r}")
    return host.strip("[]"), int(port)


GZIP_LEVEL = 6  # ~the size of level 9 at a third of the CPU
# With many servers the state changes at every poll, hundreds of times a second, and scrapers
# back to back would render at every scrape, taking the interpreter from the polls: the exporter
# renders at most this often, so what a scrape shows is at most this much older than the pollers.
RENDER_INTERVAL_S = 0.25


class _Families:
    """A collected list of families, as the collector object prometheus_client's renderers take."""

    def __init__(self, families):
        self._families = families

    def collect(self):
        return self._families


class Exposition:
    """The registry's exposition as bytes, rendered at most once per `changed()`."""

    def __init__(self, registry: CollectorRegistry, min_render_interval: float = 0.0):
        self._registry = registry
        # Renders at most this often: a scrape within it of the last render takes those bytes
        # though a poll changed the state since (the exporter's own: RENDER_INTERVAL_S).
        self._min_interval = min_render_interval
        self._rendered_at = -math.inf
        self._lock = threading.Lock()
        self._changes = itertools.count(1)
        self._generation = 0
        self._rendered: int | None = None
        self._bytes: dict[tuple[bool, bool], bytes] = {}
        self._families: _Families | None = None
        self._renderer = Renderer()
        self.fallback_renders = 0  # renders left to prometheus_client (Unsupported)

    def changed(self) -> None:
        """A source has new state. Cheap: the render happens at the next scrape."""
        self._generation = next(self._changes)  # atomic: several sources call it at once

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        arrived = self._generation
        with self._lock:  # concurrent scrapes of a new state wait for one render, not each own
            # A scrape that waited behind a render of a state at least as new as the one it
            # arrived to takes those bytes: with many pollers the state changes many times a
            # second, and re-rendering for each waiting scrape would queue them up.
            now = time.monotonic()
            if self._rendered is None or (self._rendered < arrived and
                                          now - self._rendered_at >= self._min_interval):
                self._rendered, self._rendered_at = self._generation, now
                self._bytes.clear()
                self._families = _Families(list(self._registry.collect()))
            key = (openmetrics, gzipped)
            if key not in self._bytes:
                if gzipped:
                    plain = self._bytes.get((openmetrics, False)) or self._render(openmetrics)
                    self._bytes[(openmetrics, False)] = plain
                    self._bytes[key] = gzip.compress(plain, GZIP_LEVEL, mtime=0)
                else:
                    self._bytes[key] = self._render(openmetrics)
            return self._bytes[key]

    def _render(self, openmetrics: bool) -> bytes:
        families = self._families.collect()
        try:
            if openmetrics:
                return self._renderer.openmetrics(families)
            return self._renderer.text(families)
        except Unsupported as err:
            if not self.fallback_renders:
                log.info("exposition: rendered by prometheus_client (%s)", err)
            self.fallback_renders += 1
            render = render_openmetrics if openmetrics else render_text
            return render(self._families)


def negotiate(accept: str, accept_encoding: str) -> tuple[bool, bool]:
    """(OpenMetrics?, gzip?) for a scraper's Accept and Accept-Encoding headers."""
    openmetrics = "application/openmetrics-text" in accept
    gzipped = any(part.split(";")[0].strip() == "gzip" for part in accept_encoding.split(","))
    return openmetrics, gzipped


def make_app(exposition: Exposition, telemetry_path: str, targets: list[str], glance=None):
    """The WSGI app. `glance`: a status_page.GlancePages answering its own paths (/ among them);
    without it / is the plain landing page."""
    page = LANDING.format(
        version=html.escape(__version__),
        path=html.escape(telemetry_path),
        targets="".join(f"<li>{html.escape(t)}</li>" for t in targets),
    ).encode()
    sd = service_discovery(targets)

    def app(environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"),
                                                      ("Content-Type", "text/plain")])
            return [b"GET or HEAD only\n"]
        path = environ.get("PATH_INFO", "/")
        headers: list[tuple[str, str]] = []
        if path == telemetry_path:
            openmetrics, gzipped = negotiate(environ.get("HTTP_ACCEPT", ""),
                                             environ.get("HTTP_ACCEPT_ENCODING", ""))
            body = exposition.body(openmetrics, gzipped)
            headers.append(("Content-Type",
                            CONTENT_TYPE_OM if openmetrics else CONTENT_TYPE_PLAIN_0_0_4))
            if gzipped:
                headers.append(("Content-Encoding", "gzip"))
            status = "200 OK"
        elif path == "/sd/sglang":
            status, body = "200 OK", sd
            headers.append(("Content-Type", "application/json"))
        elif glance is not None and (answer := glance.answer(path)) is not None:
            status, glance_headers, body = answer
            headers.extend(glance_headers)
        elif path == "/":
            status, body = "200 OK", page
            headers.append(("Content-Type", "text/html; charset=utf-8"))
        else:
            status = "404 Not Found"
            body = b"Not found. Metrics are at " + telemetry_path.encode() + b"\n"
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        names = {name.lower() for name, _ in headers}
        if "x-content-type-options" not in names:
            headers.append(("X-Content-Type-Options", "nosniff"))
        if "content-security-policy" not in names:
            headers.append(("Content-Security-Policy", LANDING_CSP))
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [] if method == "HEAD" else [body]

    return app


def serve(app, listen_address: str, priority_path: str | None = None) -> Server:
    """Start serving in a daemon thread; returns the server (its .server_address has the port).
    Requests for `priority_path` (the telemetry path) have workers of their own."""
    host, port = parse_listen_address(listen_address)
    return Server(app, host, port, priority_path).start()
