"""Run a real Prometheus on loopback for a test, and query it."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path

from sglang_obs.generate.backfill import prometheus

from conftest import require_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_prometheus(config_text: str, workdir: Path):
    """The project's own runner (sglang_obs.generate.backfill.prometheus) over `workdir/data`."""
    require_binary("prometheus")
    with prometheus(workdir / "data", config_text) as url:
        yield url


def query(url: str, expr: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_query(url: str, expr: str, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = query(url, expr)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.25)
