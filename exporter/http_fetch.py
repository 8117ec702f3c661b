"""Bounded HTTP GET for polling SGLang, on raw sockets.

SGLang is polled every second from a background thread, so one slow or hostile answer must
never stall the loop, spin the CPU or eat memory. One deadline (`timeout`) covers the whole
exchange: connect, TLS handshake, the request, the status line, the headers, chunked framing
(chunk-size lines and trailers included) and the body. Before every read the socket timeout is
set to the time left, so a server that drips one byte a second is cut off at the deadline
wherever it drips; a `timeout` of zero or less (a poll cycle with no time left) fails at once,
before the name is resolved. The status line, each header line, the number of header lines and
their total size, chunk-size lines and trailers are bounded, and so is the body (`max_bytes`),
which is copied once out of the read buffer (twice its size at the peak, not three times).

No redirect is followed: a 3xx is an `http_status` error like any other non-2xx answer, so a
request only ever goes to the scheme, host and port it was given. The request asks for an
uncompressed body and closes the connection after one exchange.

Failures are raised as FetchError with a short, fixed `reason` that becomes a metric label, so
the label set stays bounded, and a `detail` that says what was wrong and where, never the
bytes the server sent (a status or exposition line may hold a secret).

Name resolution is the system resolver's (getaddrinfo), bounded by its own timeouts, not by
this deadline: configure targets by IP address or by a name the local resolver answers fast. An
IP address is never resolved; a name's addresses are kept for RESOLVE_TTL_S (a poll a second
would otherwise ask the resolver every second, 7 % of the CPU of 256 polls) and asked again at
once after a connection to them fails (the name may point elsewhere now).
"""

from __future__ import annotations

import ipaddress
import select
import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

# Reasons are metric label values: keep this list closed.
FETCH_ERROR_REASONS = (
    "connection_refused",
    "timeout",
    "http_status",
    "too_large",
    "protocol",  # not HTTP/1.x as RFC 9112 frames it (status line, headers, chunks)
    "network",
)

# Ask for the classic text format: prometheus_client >= 0.23 then keeps the `sglang:` colons.
METRICS_ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"

# Bounds on everything but the body (the body is bounded by the caller's max_bytes).
MAX_LINE_BYTES = 8 * 1024  # status line, one header or trailer line, one chunk-size line
MAX_HEADER_LINES = 100  # header lines, trailers counted separately with the same bound
MAX_HEADER_BYTES = 64 * 1024  # all header lines together; the same again for all trailers
MAX_CHUNK_SIZE_DIGITS = 16  # hex digits of one chunk size (16: up to 2**64 - 1)

_RECV = 64 * 1024


class FetchError(Exception):
    """A poll that produced no usable body; `reason` is one of FETCH_ERROR_REASONS or 'parse'."""

    def __init__(self, reason: str, detail: str, status: int | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


def fetch(url: str, *, timeout: float, max_bytes: int, accept: str = "*/*",
          headers: Mapping[str, str] | None = None) -> Response:
    """GET `url`; return a 2xx response or raise FetchError. Never raises anything else.

    `headers` are added to the request (e.g. Authorization); they are never logged or echoed.
    """
    deadline = time.monotonic() + timeout
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("network", "not an http(s) URL")
    if timeout <= 0:
        raise FetchError("timeout", "no time left before the deadline")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise FetchError("network", "bad port in URL") from None
    request = _request(parts, accept, headers or {})
    sock = None
    try:
        sock = _connect(parts.hostname, port, deadline)
        if parts.scheme == "https":
            sock = _tls(sock, parts.hostname, deadline)
        reader = _Reader(sock, deadline)
        reader.send(request)
        return _response(reader, max_bytes)
    except FetchError:
        raise
    except ConnectionRefusedError:
        raise FetchError("connection_refused", "connection refused") from None
    except TimeoutError:
        raise FetchError("timeout", "no complete answer before the deadline") from None
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError; never echo its text
        raise FetchError("network", type(err).__name__) from None
    finally:
        if sock is not None:
            sock.close()


def _request(parts: urllib.parse.SplitResult, accept: str, extra: Mapping[str, str]) -> bytes:
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if parts.port:
        host += f":{parts.port}"
    fields = {"Host": host, "Accept": accept, "Accept-Encoding": "identity",
              "User-Agent": "sglang-obs", "Connection": "close", **extra}
    lines = [f"GET {path} HTTP/1.1"]
    for name, value in fields.items():
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise FetchError("network", f"request header {name} holds a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchError("timeout", "no complete answer before the deadline")
    return left


RESOLVE_TTL_S = 30.0
# (host, port) -> (when resolved, getaddrinfo's answer); only names, only answers that worked.
_resolved: dict[tuple[str, int], tuple[float, list]] = {}
_RESOLVED_MAX = 4096


def _addresses(host: str, port: int) -> list:
    """getaddrinfo's answer for a TCP connection to host:port, without asking it for an IP."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and not getattr(ip, "scope_id", None):
        if ip.version == 4:
            return [(socket.AF_INET, socket.SOCK_STREAM, 0, "", (host, port))]
        return [(socket.AF_INET6, socket.SOCK_STREAM, 0, "", (host, port, 0, 0))]
    key = (host, port)
    cached = _resolved.get(key)
    if cached is not None and time.monotonic() - cached[0] < RESOLVE_TTL_S:
        return cached[1]
    answer = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if len(_resolved) >= _RESOLVED_MAX:
        _resolved.clear()
    _resolved[key] = (time.monotonic(), answer)
    return answer


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    error: OSError | None = None
    for family, kind, proto, _, address in _addresses(host, port):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except ConnectionRefusedError as err:
            error = err
        except FetchError:
            sock.close()
            raise
        except OSError as err:
            error = err
        sock.close()
    _resolved.pop((host, port), None)  # none answered: resolve again next time
    raise error or OSError("no address")


def _tls(sock: socket.socket, host: str, deadline: float) -> ssl.SSLSocket:
    """TLS handshake under the deadline: non-blocking, so a dripping handshake cannot stretch
    it (a blocking handshake would give every read its own timeout)."""
    context = ssl.create_default_context()
    tls = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            ready = select.select([tls], [], [], _left(deadline))[0]
        except ssl.SSLWantWriteError:
            ready = select.select([], [tls], [], _left(deadline))[1]
        if not ready:
            raise FetchError("timeout", "TLS handshake not done before the deadline")
    tls.setblocking(True)
    return tls


class _Reader:
    """Buffered reads from one socket, each under what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock = sock
        self.deadline = deadline
        self._buf = bytearray()
        self.eof = False

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._sock.settimeout(_left(self.deadline))
            sent = self._sock.send(view)
            view = view[sent:]

    def _fill(self) -> bool:
        """Read once more into the buffer; False at end of stream."""
        if self.eof:
            return False
        self._sock.settimeout(_left(self.deadline))
        data = self._sock.recv(_RECV)
        if not data:
            self.eof = True
            return False
        self._buf += data
        return True

    def line(self, limit: int, what: str) -> bytes:
        """One line without its CRLF (or bare LF); FetchError past `limit` bytes or at EOF."""
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                if end + 1 > limit:
                    break
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buf) > limit:
                break
            start = len(self._buf)
            if not self._fill():
                raise FetchError("protocol", f"connection closed inside the {what}")
        raise FetchError("too_large", f"{what} longer than {limit} bytes")

    def exactly(self, n: int, what: str) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise FetchError("protocol", f"connection closed inside the {what}")
        with memoryview(self._buf) as view, view[:n] as part:
            data = bytes(part)  # one copy (a slice of the bytearray would be a second)
        del self._buf[:n]
        return data

    def rest(self, max_bytes: int) -> bytes:
        """Everything up to end of stream, at most `max_bytes`."""
        while len(self._buf) <= max_bytes and self._fill():
            pass
        if len(self._buf) > max_bytes:
            raise FetchError("too_large", f"body larger than {max_bytes} bytes")
        return bytes(self._buf)


def _response(reader: _Reader, max_bytes: int) -> Response:
    status = _status_line(reader.line(MAX_LINE_BYTES, "status line"))
    fields = _fields(reader, "header")
    if not 200 <= status < 300:  # 1xx, 3xx (no redirect is followed), 4xx, 5xx
        raise FetchError("http_status", f"HTTP {status}", status=status)
    content_type = fields.get("content-type", "")
    coding = fields.get("transfer-encoding")
    if coding is not None:
        if coding.lower().replace(" ", "") != "chunked":
            raise FetchError("protocol", "Transfer-Encoding other than chunked")
        body = _chunked(reader, max_bytes)
    elif status == 204:
        body = b""
    elif "content-length" in fields:
        length = fields["content-length"]
        if not length.isdigit() or len(length) > 19:
            raise FetchError("protocol", "Content-Length is not a number")
        if int(length) > max_bytes:
            raise FetchError("too_large", f"Content-Length {int(length)} > {max_bytes} bytes")
        body = reader.exactly(int(length), "body")
    else:
        body = reader.rest(max_bytes)  # Connection: close delimits it
    return Response(status, content_type, body)


def _status_line(line: bytes) -> int:
    """The status code of `HTTP/1.x NNN reason`; the reason phrase is never read."""
    parts = line.split(b" ", 2)
    if (len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
            or len(parts[1]) != 3 or not parts[1].isdigit()):
        raise FetchError("protocol", "status line is not HTTP/1.x")
    return int(parts[1])


def _fields(reader: _Reader, what: str) -> dict[str, str]:
    """Header (or trailer) fields up to the empty line, names lower-cased; a repeated
    Content-Length must agree, other repeats join with ', '. Bounded in count and size."""
    fields: dict[str, str] = {}
    total = 0
    for _ in range(MAX_HEADER_LINES + 1):
        line = reader.line(MAX_LINE_BYTES, f"{what} line")
        if not line:
            return fields
        total += len(line) + 2
        if total > MAX_HEADER_BYTES:
            break
        if line[:1] in (b" ", b"\t"):
            raise FetchError("protocol", f"folded {what} line")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise FetchError("protocol", f"{what} line without a name")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        if key in fields:
            if key == "content-length" and fields[key] != text:
                raise FetchError("protocol", "conflicting Content-Length headers")
            if key != "content-length":
                fields[key] += ", " + text
        else:
            fields[key] = text
    raise FetchError("too_large", f"more than {MAX_HEADER_LINES} {what} lines or "
                                  f"{MAX_HEADER_BYTES} bytes of them")


def _chunked(reader: _Reader, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        _left(reader.deadline)  # many tiny chunks already buffered still end at the deadline
        line = reader.line(MAX_LINE_BYTES, "chunk-size line")
        digits = line.split(b";", 1)[0].strip()
        if (not digits or len(digits) > MAX_CHUNK_SIZE_DIGITS
                or not all(c in b"0123456789abcdefABCDEF" for c in digits)):
            raise FetchError("protocol", "chunk-size line is not hexadecimal")
        n = int(digits, 16)
        if n == 0:
            _fields(reader, "trailer")  # read and dropped, bounded like headers
            return b"".join(chunks)
        size += n
        if size > max_bytes:
            raise FetchError("too_large", f"body larger than {max_bytes} bytes")
        chunks.append(reader.exactly(n, "chunk"))
        if reader.exactly(2, "chunk") != b"\r\n":
            raise FetchError("protocol", "chunk not followed by CRLF")
