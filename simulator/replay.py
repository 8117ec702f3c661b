"""A fake SGLang server on loopback that replays recorded responses: answers each path with a
canned or hostile response (the tests' and benches' stand-in for a real server).

Routes map a path to a Route; callers swap routes while the server runs to play a release, an
outage or an attack. `stop()` closes the socket, so the next poll sees connection refused.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay_seconds: float = 0.0  # before the headers
    drip_seconds: float = 0.0  # between 1-byte writes of the body
    declared_length: int | None = None  # a lying Content-Length; -1: none (read to close)


def text_route(path: Path, **kw) -> Route:
    """A recorded exposition (SGLang's /metrics) from a file."""
    return Route(path.read_bytes(), **kw)


def json_route(path: Path, **kw) -> Route:
    """A recorded JSON answer (/server_info, /v1/loads) from a file."""
    return Route(path.read_bytes(), content_type="application/json", **kw)


class FakeSGLang:
    def __init__(self, routes: dict[str, Route] | None = None, port: int = 0):
        self.routes: dict[str, Route] = dict(routes or {})
        self.hits: dict[str, int] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                fake.hits[path] = fake.hits.get(path, 0) + 1
                route = fake.routes.get(path)
                if route is None:
                    self.send_error(404)
                    return
                time.sleep(route.delay_seconds)
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", route.content_type)
                    length = route.declared_length
                    if length != -1:
                        self.send_header("Content-Length",
                                         str(len(route.body) if length is None else length))
                    self.end_headers()
                    if route.drip_seconds:
                        for i in range(len(route.body)):
                            self.wfile.write(route.body[i:i + 1])
                            self.wfile.flush()
                            time.sleep(route.drip_seconds)
                    else:
                        self.wfile.write(route.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # A short poll interval: stop() (shutdown) waits up to one interval.
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
