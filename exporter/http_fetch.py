"""Bounded HTTP GET for polling SGLang.

SGLang is polled every second from a background thread, so one slow or hostile answer must
never stall the loop or eat memory: every request has a connect/read timeout, an overall
deadline (a server that drips one byte per second defeats a socket timeout alone) and a cap
on the body size. Failures are raised as FetchError with a short, fixed `reason` that becomes
a metric label, so the label set stays bounded.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

# Reasons are metric label values: keep this list closed (collector pre-initialises them).
FETCH_ERROR_REASONS = (
    "connection_refused",
    "timeout",
    "http_status",
    "too_large",
    "network",
)

# Ask for the classic text format: prometheus_client >= 0.23 then keeps the `sglang:` colons.
METRICS_ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"

_CHUNK = 64 * 1024


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


def fetch(url: str, *, timeout: float, max_bytes: int, accept: str = "*/*") -> Response:
    """GET `url`; return a 2xx response or raise FetchError. Never raises anything else."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "sglang-obs"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 (http only)
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise FetchError("too_large", f"Content-Length {length} > {max_bytes} bytes")
            body = _read_bounded(resp, deadline, max_bytes)
            return Response(resp.status, resp.headers.get("Content-Type", ""), body)
    except FetchError:
        raise
    except urllib.error.HTTPError as err:
        raise FetchError("http_status", f"HTTP {err.code}", status=err.code) from None
    except urllib.error.URLError as err:
        raise _classify(err.reason) from None
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise _classify(err) from None


def _read_bounded(resp, deadline: float, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise FetchError("timeout", "response not complete before the deadline")
        chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError("too_large", f"body larger than {max_bytes} bytes")
        chunks.append(chunk)


def _classify(err: object) -> FetchError:
    if isinstance(err, ConnectionRefusedError):
        return FetchError("connection_refused", "connection refused")
    if isinstance(err, socket.timeout | TimeoutError):
        return FetchError("timeout", "timed out")
    return FetchError("network", f"{type(err).__name__}: {err}"[:200])
