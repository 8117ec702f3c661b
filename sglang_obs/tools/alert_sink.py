"""`sglang-obs alert-sink`: a webhook receiver that logs every alert Alertmanager sends.

POST /<receiver> takes Alertmanager's webhook payload and writes one JSON line per alert (time,
receiver, status, labels, annotations, startsAt) to stdout and optionally a file. GET /alerts
returns what was received (the tests read it); GET / a short summary. Only labels and
annotations are kept: payloads carry nothing else worth logging, and nothing secret.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO

log = logging.getLogger("sglang_obs.tools.alert_sink")
MAX_BODY = 4 * 1024 * 1024
KEEP = 10_000  # received alerts kept in memory for GET /alerts


class AlertSink:
    def __init__(self, host: str, port: int, streams: list[IO[str]]):
        self.received: list[dict] = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._streams = streams
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                receiver = self.path.strip("/").split("?")[0] or "default"
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > MAX_BODY:
                    sink.rejected += 1
                    self._answer(413 if length > MAX_BODY else 400, {"error": "bad length"})
                    return
                try:
                    payload = json.loads(self.rfile.read(length))
                    alerts = payload["alerts"]
                    if not isinstance(alerts, list):
                        raise TypeError("alerts is not a list")
                except (ValueError, KeyError, TypeError) as err:
                    sink.rejected += 1
                    self._answer(400, {"error": f"not an Alertmanager webhook payload: {err}"})
                    return
                sink.record(receiver, alerts)
                self._answer(200, {"received": len(alerts)})

            def do_GET(self):  # noqa: N802
                with sink._lock:
                    if self.path.startswith("/alerts"):
                        self._answer(200, sink.received)
                    else:
                        counts: dict[str, int] = {}
                        for a in sink.received:
                            counts[a["receiver"]] = counts.get(a["receiver"], 0) + 1
                        self._answer(200, {"received": counts, "rejected": sink.rejected})

            def _answer(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]

    def record(self, receiver: str, alerts: list) -> None:
        now = time.time()
        with self._lock:
            for alert in alerts:
                if not isinstance(alert, dict):
                    self.rejected += 1
                    continue
                entry = {
                    "time": now, "receiver": receiver, "status": str(alert.get("status", "")),
                    "labels": _strings(alert.get("labels")),
                    "annotations": _strings(alert.get("annotations")),
                    "startsAt": str(alert.get("startsAt", "")),
                }
                self.received.append(entry)
                line = json.dumps(entry, sort_keys=True)
                for stream in self._streams:
                    stream.write(line + "\n")
                    stream.flush()
            del self.received[:-KEEP]

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True, name="alert-sink").start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _strings(value) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k)[:200]: str(v)[:2000] for k, v in value.items()}
