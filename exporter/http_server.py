"""The exporter's HTTP server: one event loop reads every request, worker threads answer them.

A thread per connection let 16 clients that send one byte every 5 s take every worker, and
each read's timeout restarted with every byte: `/metrics` stopped answering and, on
Kubernetes, the liveness probe would restart the exporter. Here a connection costs a socket
until its request head has arrived whole, within HEAD_DEADLINE from its first byte's wait (not
per read); only then does it reach a worker. Scrapes of the telemetry path have workers of
their own (SCRAPE_WORKERS), so a burst of glance page requests cannot delay one. Open
connections are capped overall and per client address; at a cap the oldest connection still
sending its head is closed (sglang_obs.core.connections).

HTTP/1.0 and 1.1 GET and HEAD, no request bodies, one request per connection
(`Connection: close`), as the WSGI app expects: the same app wsgiref served.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import sys
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from sglang_obs.core.connections import ConnectionTable

log = logging.getLogger(__name__)

HEAD_DEADLINE = 5.0  # seconds for a connection to deliver its whole request line and headers
WRITE_DEADLINE = 10.0  # seconds for a client to take the answer
MAX_HEAD = 16 * 1024  # bytes of request line and headers together; 431 beyond
MAX_CONNECTIONS = 2048  # open at once (lowered to what the descriptor limit allows)
MAX_PER_CLIENT = 512  # open at once from one address
WORKERS = 8  # threads answering the glance page, /sd/sglang and the rest
SCRAPE_WORKERS = 4  # threads answering the telemetry path only
LISTEN_BACKLOG = 1024

_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


class Server:
    """Serves `app` (WSGI) on `host:port` from a daemon thread until `shutdown()`.
    `server_address` is the bound (host, port); binding happens in the constructor, so a taken
    port raises OSError there."""

    def __init__(self, app, host: str, port: int, priority_path: str | None = None):
        self.app = app
        self.priority_path = priority_path
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(LISTEN_BACKLOG)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.server_address = self._sock.getsockname()
        self.connections = ConnectionTable.sized(MAX_CONNECTIONS, MAX_PER_CLIENT)
        self.timeouts = 0  # connections closed at HEAD_DEADLINE or WRITE_DEADLINE
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="http")
        self._scrapes = ThreadPoolExecutor(SCRAPE_WORKERS, thread_name_prefix="http-scrape")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def start(self) -> Server:
        self._thread.start()
        self._ready.wait(10)
        return self

    def shutdown(self) -> None:
        if self._loop is not None and self._stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)

    def server_close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        self._pool.shutdown(wait=False)
        self._scrapes.shutdown(wait=False)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet)
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self._sock, limit=MAX_HEAD)
        self._ready.set()
        async with server:
            await self._stopped.wait()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else "?"
        key = self.connections.admit(address, writer.transport.abort)
        if key is None:
            writer.transport.abort()
            return
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_DEADLINE)
            except asyncio.TimeoutError:
                self.timeouts += 1
                writer.write(_plain(408))
                return
            except asyncio.LimitOverrunError:
                writer.write(_plain(431))
                return
            except asyncio.IncompleteReadError:
                return  # closed before a whole head: nothing to answer
            self.connections.answering(key)
            environ = _environ(head, address, self.server_address)
            if environ is None:
                writer.write(_plain(400))
                return
            pool = (self._scrapes if self.priority_path is not None
                    and environ["PATH_INFO"] == self.priority_path else self._pool)
            response = await self._loop.run_in_executor(pool, _call, self.app, environ)
            writer.transport.set_write_buffer_limits(high=0)  # drain() waits for all of it
            writer.write(response)
            try:
                await asyncio.wait_for(writer.drain(), WRITE_DEADLINE)
            except asyncio.TimeoutError:
                self.timeouts += 1
                writer.transport.abort()
        except (ConnectionError, OSError):
            pass  # the client went away, or was closed to make room
        except Exception as err:  # one line, never a traceback, keep serving
            log.error("http: %s from %s: %s", type(err).__name__, address, err)
        finally:
            self.connections.release(key)
            writer.close()


def _environ(head: bytes, address: str, server_address) -> dict | None:
    """The WSGI environ of a request head; None when it is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, version = parts
    path, _, query = target.partition("?")
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
        "QUERY_STRING": query, "SERVER_PROTOCOL": version, "REMOTE_ADDR": address,
        "SERVER_NAME": str(server_address[0]), "SERVER_PORT": str(server_address[1]),
        "SCRIPT_NAME": "", "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
        "wsgi.multiprocess": False, "wsgi.run_once": False,
    }
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip().upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            environ[key] = value.strip()
    return environ


def _call(app, environ: dict) -> bytes:
    """The app's whole answer as bytes: status line, headers, body."""
    started: list = []

    def start_response(status, headers, exc_info=None):
        started[:] = [status, headers]

    try:
        body = b"".join(app(environ, start_response))
    except Exception as err:  # the app's failure answers this request alone
        log.error("http: answering %s failed: %s: %s", environ["PATH_INFO"][:100],
                  type(err).__name__, err)
        return _plain(500)
    status, headers = started
    head = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers] + ["Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _plain(code: int) -> bytes:
    body = f"{_REASONS[code]}\n".encode()
    return (f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"X-Content-Type-Options: nosniff\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _quiet(loop, context) -> None:
    log.debug("http: %s", context.get("message"), exc_info=context.get("exception"))
