"""`sglang-obs alert-sink`: a webhook receiver that logs every alert Alertmanager sends.

POST /<receiver> takes Alertmanager's webhook payload and writes one JSON line per alert (time,
receiver, status, labels, annotations, startsAt) to stdout and optionally a file. GET /alerts
returns the last alerts received (the tests read it); GET / a short summary. Only labels and
annotations are kept: payloads carry nothing else worth logging, and nothing secret.

Alertmanager sends a group's whole state each time, and Prometheus re-sends a resolved alert for
15 minutes, so a group's later notification carries alerts the receiver already had (a
"resolved" again, alongside the news). Such a line says `"duplicate": true`: the same alert
(labels, startsAt) in the same status as the group last sent it. A reader counting events counts
the lines without it.

Whatever a sender does, the sink's cost stays bounded (docs/security.md, "Alert sink bounds"):
a request is read within a deadline and up to a size, answered 400/408/411/413/414 otherwise
with one log line; every alert becomes one line of at most LINE_MAX bytes; the log file
rotates; GET /alerts returns the last KEEP alerts; past MAX_CONNECTIONS (or MAX_PER_CLIENT from
one address) the oldest connection still sending its request is closed to make room
(sglang_obs.core.connections), and at most MAX_BODIES request bodies are read at a time.

The server is one asyncio event loop (in its own thread with `start()`): a client that drips
its request costs a buffer, not a thread, until its deadline closes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO

from sglang_obs.core import safe_files
from sglang_obs.core.connections import ConnectionTable
from sglang_obs.core.log_budget import LogBudget

log = logging.getLogger("sglang_obs.tools.alert_sink")

MAX_BODY = 1024 * 1024          # bytes of one request body; 413 beyond
MAX_LINE = 8 * 1024             # bytes of the request line or of one header line; 414/400
MAX_HEADERS = 64                # header lines of one request; 400 beyond
TIMEOUT = 10.0                  # seconds for a connection, request to answer; 408/closed after
MAX_CONNECTIONS = 1024          # open at once; then the oldest still sending its request goes
MAX_PER_CLIENT = 512            # open at once from one address, the same way
MAX_BODIES = 8                  # request bodies read at once (the "workers"); others wait
MAX_ALERTS = 1_000              # alerts logged from one request; the rest are counted rejected
KEEP = 1_000                    # alerts kept in memory for GET /alerts
SEEN_MAX = 10_000               # last status of this many (group, alert) kept for `duplicate`
LINE_MAX = 4 * 1024             # bytes of one logged line, newline included
RECEIVER_MAX = 64               # characters of the receiver (the request path)
NAME_MAX = 128                  # characters of a label or annotation name
LABEL_VALUE_MAX = 256           # characters of a label value
ANNOTATION_VALUE_MAX = 1024     # characters of an annotation value
FIELD_MAX = 40                  # characters of status and startsAt
MAX_KEYS = 64                   # labels (and annotations) looked at per alert
LOG_MAX_BYTES = 10 * 1024 * 1024  # the log file rotates past this size...
LOG_BACKUPS = 2                 # ...keeping this many old files (FILE.1, FILE.2)
LINGER = 1.0                    # seconds (and up to MAX_BODY bytes) read and dropped after an
                                # answer, so that a refused client reads it before the close
MAX_INT_DIGITS = 100            # an integer in the JSON longer than this is a 400
REJECT_LOG_BURST = 20           # rejection log lines per REJECT_LOG_WINDOW; then one summary
REJECT_LOG_WINDOW = 10.0

# Annotations a line keeps first, in this order (_by_priority).
ANNOTATION_ORDER = ("summary", "runbook_url", "dashboard", "description")
REASONS = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           414: "URI Too Long"}


class Reject(Exception):  # an answer, not a failure of the sink
    """Answer `code` with `reason` (one log line, no traceback)."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _open_log(path: Path):
    """`path` opened to append, a regular file only (it is renamed when it rotates), without
    blocking on a FIFO; OSError (the caller's) when it cannot be."""
    try:
        return safe_files.open_output(path, append=True, regular=True)
    except safe_files.Refused as err:
        raise OSError(None, str(err)) from None


class RotatingFile:
    """Appends lines to `path`; past `max_bytes` renames it to PATH.1 (PATH.1 to PATH.2, ...,
    keeping `backups` old files) and starts a new one. A write that fails is logged once and
    dropped: a full disk does not stop the sink."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = LOG_MAX_BYTES,
                 backups: int = LOG_BACKUPS):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._file = _open_log(self.path)  # OSError here is the caller's (a bad --log-file)
        self._size = self._file.tell()
        self._failed = False

    def write(self, text: str) -> None:
        try:
            if self._size and self._size + len(text) > self.max_bytes:
                self._rotate()
            self._file.write(text)
            self._size += len(text)  # lines are ASCII (json.dumps' ensure_ascii)
            self._failed = False
        except OSError as err:
            if not self._failed:
                log.error("cannot write %s: %s (alerts go to stdout only until it works)",
                          self.path, err)
            self._failed = True

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._file.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("w")
        self._size = 0


class AlertSink:
    def __init__(self, host: str, port: int, streams: list[IO[str]], *,
                 log_file: RotatingFile | str | os.PathLike | None = None,
                 log_max_bytes: int = LOG_MAX_BYTES, log_backups: int = LOG_BACKUPS,
                 timeout: float = TIMEOUT):
        self._received: collections.deque[dict] = collections.deque(maxlen=KEEP)
        # (group, alert digest) -> (status, startsAt, notification) last logged, oldest first
        self._seen: collections.OrderedDict[tuple[str, str], tuple[str, str, int]] = \
            collections.OrderedDict()
        self.rejected = 0
        self.notifications = 0  # requests recorded (one per Alertmanager notification)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._streams: list = list(streams)
        if isinstance(log_file, RotatingFile):
            self._streams.append(log_file)
        elif log_file is not None:
            self._streams.append(RotatingFile(log_file, log_max_bytes, log_backups))
        self._sock = socket.create_server((host, port), backlog=1024)  # OSError: the caller's
        self.port = self._sock.getsockname()[1]
        self.connections = ConnectionTable.sized(MAX_CONNECTIONS, MAX_PER_CLIENT)
        self._bodies: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._reject_budget = LogBudget(REJECT_LOG_BURST, REJECT_LOG_WINDOW)

    @property
    def received(self) -> list[dict]:
        """The last KEEP alerts received, oldest first (a copy)."""
        with self._lock:
            return list(self._received)

    # -- recording ------------------------------------------------------------------------
    def record(self, receiver: str, alerts: list, group_key: object = "") -> int:
        """Log `alerts` (an Alertmanager payload's list) for `receiver`: how many were kept.
        Each entry names its notification (one per request, numbered from 1) and the group's
        key, so a reader can count notifications per incident, not only alerts."""
        now = time.time()
        lines = []
        # A digest: distinct per group and bounded, without echoing the key's label values.
        group = hashlib.sha256(_scalar(group_key).encode()).hexdigest()[:16]
        with self._lock:
            self.notifications += 1
            notification = self.notifications
            for i, alert in enumerate(alerts):
                if i >= MAX_ALERTS:
                    self.rejected += len(alerts) - MAX_ALERTS
                    self._note_reject(f"/{receiver[:RECEIVER_MAX]}: {len(alerts) - MAX_ALERTS} "
                                      f"alerts past the first {MAX_ALERTS} of one request "
                                      "not logged")
                    break
                entry = bounded_entry(now, receiver, alert, notification, group)
                if entry is None:
                    self.rejected += 1
                    continue
                if self._repeats(entry):
                    entry["duplicate"] = True
                self._received.append(entry)
                lines.append(json.dumps(entry, sort_keys=True) + "\n")
            text = "".join(lines)
            for stream in self._streams:
                try:
                    stream.write(text)
                    stream.flush()
                except (OSError, ValueError) as err:  # a closed stdout, a full disk
                    self._note_reject(f"cannot write an alert line: {err}")
        return len(lines)

    def _repeats(self, entry: dict) -> bool:
        """Whether an earlier notification of the entry's group last sent its alert in this
        same status (and startsAt); records this one as the last either way. Alertmanager
        never lists an alert twice in one notification, so a sender's copies within one
        request are not compared (nor lengthened)."""
        alert = hashlib.sha256(json.dumps(entry["labels"], sort_keys=True).encode()).hexdigest()
        key = (entry["group"], alert[:16])
        state = (entry["status"], entry["startsAt"])
        before = self._seen.pop(key, None)
        self._seen[key] = (*state, entry["notification"])
        if len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)
        return before is not None and before[:2] == state and before[2] != entry["notification"]

    def summary(self) -> dict:
        counts: dict[str, int] = {}
        for a in self.received:
            counts[a["receiver"]] = counts.get(a["receiver"], 0) + 1
        return {"received": counts, "rejected": self.rejected,
                "connections_closed_to_make_room": self.connections.evicted}

    def _note_reject(self, message: str) -> None:
        """One log line per rejection, at most REJECT_LOG_BURST per REJECT_LOG_WINDOW; then
        one line saying how many were not logged."""
        emit, left_out = self._reject_budget.take()
        if left_out:
            log.warning("%d more rejections in the last %.0f s not logged", left_out,
                        REJECT_LOG_WINDOW)
        if emit:
            log.warning("rejected: %s", message[:300])

    # -- serving --------------------------------------------------------------------------
    def serve_forever(self) -> None:
        asyncio.run(self._serve())

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(ready)),
                                        daemon=True, name="alert-sink")
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        with contextlib.suppress(OSError):
            self._sock.close()
        for stream in self._streams:
            if isinstance(stream, RotatingFile):
                stream.close()

    async def _serve(self, ready: threading.Event | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet_exception_handler)
        self._stop = asyncio.Event()
        self._bodies = asyncio.Semaphore(MAX_BODIES)
        server = await asyncio.start_server(self._connection, sock=self._sock,
                                            limit=MAX_LINE)
        if ready is not None:
            ready.set()
        async with server:
            await self._stop.wait()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        key = self.connections.admit(peer[0] if isinstance(peer, tuple) else "?",
                                     writer.transport.abort)
        if key is None:  # every open connection is being answered
            writer.transport.abort()
            return
        try:
            await asyncio.wait_for(self._exchange(reader, writer, key), self.timeout)
            await _linger(reader, writer)
        except asyncio.TimeoutError:
            self.rejected += 1
            self._note_reject(f"{_peer(writer)}: no complete request in {self.timeout:g} s")
            with contextlib.suppress(Exception):
                writer.write(_response(408, {"error": "request timeout"}))
                await _linger(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # the client went away
        except Exception as err:  # one line, never a traceback, keep serving
            log.error("alert sink: %s from %s: %s", type(err).__name__, _peer(writer), err)
        finally:
            self.connections.release(key)
            writer.close()
            try:  # a client that reads nothing does not hold the connection either
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            except Exception:
                writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, key: int) -> None:
        try:
            code, body = await self._handle(reader, writer)
            self.connections.answering(key)  # its whole request is in: not one to drop
        except Reject as err:
            self.rejected += 1
            self._note_reject(f"{_peer(writer)}: {err.code} {err.reason}")
            code, body = err.code, {"error": err.reason}
        writer.write(_response(code, body))
        await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> tuple[int, object]:
        method, target, headers = await _read_head(reader)
        path = target.split("?", 1)[0]
        if method == "GET":
            if path.startswith("/alerts"):
                return 200, self.received
            return 200, self.summary()
        if method != "POST":
            raise Reject(405, f"method {method[:16]!r} not allowed")
        receiver = path.strip("/") or "default"  # cut to RECEIVER_MAX in each entry
        if "transfer-encoding" in headers:
            raise Reject(411, "a Content-Length is required (no chunked bodies)")
        length = _content_length(headers)
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        async with self._bodies:
            raw = await reader.readexactly(length)
        try:
            payload = json.loads(raw, parse_int=_bounded_int)
        except RecursionError:
            raise Reject(400, "JSON nested too deep") from None
        except ValueError as err:
            raise Reject(400, f"not JSON: {str(err)[:100]}") from None
        alerts = payload.get("alerts") if isinstance(payload, dict) else None
        if not isinstance(alerts, list):
            raise Reject(400, "not an Alertmanager webhook payload: no list of alerts")
        return 200, {"received": self.record(receiver, alerts, payload.get("groupKey", ""))}


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After the answer: say so (half-close), then read and drop what the client still sends,
    for up to LINGER seconds and MAX_BODY bytes. Closing with unread data would reset the
    connection, and a client still sending would lose its 400/413/414."""
    with contextlib.suppress(Exception):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        deadline = time.monotonic() + LINGER
        dropped = 0
        while dropped < MAX_BODY and (left := deadline - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                break
            dropped += len(chunk)


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """Request line and headers, each line at most MAX_LINE, at most MAX_HEADERS of them."""
    line = await _read_line(reader, 414, "request line too long")
    if not line:
        raise asyncio.IncompleteReadError(b"", None)
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Reject(400, "not an HTTP/1.x request line")
    method, target, _ = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = await _read_line(reader, 400, "header line too long")
        if line in (b"\r\n", b"\n"):
            return method, target, headers
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise Reject(400, "malformed header line")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length" and headers.get(name, value) != value:
            raise Reject(400, "conflicting Content-Length headers")
        headers[name] = value
    raise Reject(400, f"more than {MAX_HEADERS} header lines")


async def _read_line(reader: asyncio.StreamReader, code: int, reason: str) -> bytes:
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise Reject(code, reason) from None
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise Reject(400, "incomplete request line or header") from None
        return b""


def _content_length(headers: dict[str, str]) -> int:
    value = headers.get("content-length")
    if value is None:
        raise Reject(411, "a Content-Length is required")
    if not value.isdigit() or len(value) > 12:
        raise Reject(400, f"bad Content-Length {value[:20]!r}")
    length = int(value)
    if length == 0:
        raise Reject(400, "empty body")
    if length > MAX_BODY:
        raise Reject(413, f"body of {length} bytes is over the {MAX_BODY} byte limit")
    return length


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:  # int() of a long one is slow, and no alert has one
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _response(code: int, body: object) -> bytes:
    data = json.dumps(body).encode()
    head = (f"HTTP/1.1 {code} {REASONS.get(code, 'OK')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


def _quiet_exception_handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    err = context.get("exception")
    log.error("alert sink: %s", f"{type(err).__name__}: {err}" if err else context["message"])


# -- one bounded line per alert ----------------------------------------------------------------
def bounded_entry(now: float, receiver: str, alert: object, notification: int = 0,
                  group: str = "") -> dict | None:
    """The logged form of one alert: at most LINE_MAX bytes as a JSON line (newline included);
    names and values cut to their limits, then kept while the line has room in the order of
    _by_priority. `truncated: true` says something was cut or left out. None for an alert
    without labels (not Alertmanager's)."""
    if not isinstance(alert, dict):
        return None
    labels = _cut(alert.get("labels"), LABEL_VALUE_MAX)
    if not labels:
        return None
    annotations = _cut(alert.get("annotations"), ANNOTATION_VALUE_MAX)
    status, starts_at = _scalar(alert.get("status", "")), _scalar(alert.get("startsAt", ""))
    cut = (labels.pop(None, False) | annotations.pop(None, False)
           | (len(receiver) > RECEIVER_MAX) | (max(len(status), len(starts_at)) > FIELD_MAX))
    entry = {"time": now, "receiver": receiver[:RECEIVER_MAX], "status": status[:FIELD_MAX],
             "labels": {}, "annotations": {}, "startsAt": starts_at[:FIELD_MAX],
             "notification": notification, "group": group[:FIELD_MAX], "truncated": True,
             "duplicate": True}  # room kept for it: record() sets it after
    room = LINE_MAX - 1 - len(json.dumps(entry))
    del entry["duplicate"]
    for where, name, value in _by_priority(labels, annotations):
        cost = len(json.dumps(name)) + len(json.dumps(value)) + 4  # ": " and ", "
        if cost <= room:
            entry[where][name] = value
            room -= cost
        else:
            cut = True
    if not cut:
        del entry["truncated"]
    return entry


def _cut(value: object, value_max: int) -> dict:
    """A dict's first MAX_KEYS items as str -> str, cut to NAME_MAX and `value_max`; key None
    is True when anything was cut or left out."""
    if not isinstance(value, dict):
        return {}
    out: dict = {}
    cut = len(value) > MAX_KEYS
    for i, (k, v) in enumerate(value.items()):
        if i >= MAX_KEYS:
            break
        name, text = str(k), _scalar(v)
        cut |= len(name) > NAME_MAX or len(text) > value_max
        out[name[:NAME_MAX]] = text[:value_max]
    if cut:
        out[None] = True
    return out


def _scalar(value: object) -> str:
    """A JSON scalar as text; a list or object (never Alertmanager's) as its type's name."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)[:64]
    return f"<{type(value).__name__}>"


def _by_priority(labels: dict, annotations: dict) -> list[tuple[str, str, str]]:
    """What a line keeps first while it has room: the labels that name the alert, its summary,
    the other labels, then runbook_url, dashboard, description and the other annotations."""
    first = [k for k in ("alertname", "severity", "instance") if k in labels]
    order = [("labels", k) for k in first]
    order += [("annotations", "summary")] if "summary" in annotations else []
    order += [("labels", k) for k in labels if k not in first]
    order += [("annotations", k) for k in ANNOTATION_ORDER[1:] if k in annotations]
    order += [("annotations", k) for k in annotations if k not in ANNOTATION_ORDER]
    return [(where, k, (labels if where == "labels" else annotations)[k]) for where, k in order]
