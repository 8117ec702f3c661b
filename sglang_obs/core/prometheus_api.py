"""The project's one client for Prometheus's HTTP query API.

`sglang-obs snapshot`, `sglang-obs render-dashboard` and the tests all ask Prometheus through
this: an instant query at a time, a range query split into chunks under Prometheus's
11,000-points-per-series limit, and the retention Prometheus runs with. Every failure is a
PrometheusError whose message names the Prometheus and says why, with at most a short excerpt
of what it answered.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from sglang_obs.core import shown

MAX_POINTS = 11_000  # Prometheus refuses a range query with more points per series
EXCERPT = 500  # characters of an answer quoted in an error message, at most


class PrometheusError(RuntimeError):
    """Prometheus could not be reached, or refused or failed the query; the message says which,
    at which URL."""


def _excerpt(text: object, limit: int = EXCERPT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


class Prometheus:
    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.shown_url = shown.url(self.url)  # what messages say: no userinfo, query, fragment
        self.timeout = timeout

    def _get(self, path: str, params: dict) -> dict:
        try:  # a query or fragment would swallow the path appended; userinfo is not sent
            shown.plain_url(self.url)
        except ValueError as err:
            raise PrometheusError(f"Prometheus at {self.shown_url}: {err}") from None
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            detail = err.read(EXCERPT).decode("utf-8", "replace")
            raise PrometheusError(f"Prometheus at {self.shown_url} answered {err.code}"
                                  f"{self._to(params)}: {_excerpt(detail)}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise PrometheusError(f"Prometheus at {self.shown_url} is unreachable: "
                                  f"{_excerpt(getattr(err, 'reason', err))}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", body) if isinstance(body, dict) else body
            raise PrometheusError(f"Prometheus at {self.shown_url}: query failed"
                                  f"{self._to(params)}: {_excerpt(error)}")
        return body["data"]

    @staticmethod
    def _to(params: dict) -> str:
        return f" (query {_excerpt(params['query'], 200)})" if "query" in params else ""

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query at `at` (default: Prometheus's now); Prometheus's result list."""
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        return self._get("/api/v1/query", params)["result"]

    def range_series(self, expr: str, start: float, end: float, step: float,
                     progress: Callable[[float], None] | None = None) -> list[dict]:
        """Range query as Prometheus answers it ([{"metric": ..., "values": [[t, "v"], ...]}]),
        asked in chunks under the points limit and joined per series, in time order."""
        out: dict[tuple, dict] = {}
        chunk = step * (MAX_POINTS - 1)
        t = start
        while t <= end:
            stop = min(t + chunk, end)
            data = self._get("/api/v1/query_range",
                             {"query": expr, "start": t, "end": stop, "step": step})
            for series in data["result"]:
                key = tuple(sorted(series["metric"].items()))
                joined = out.setdefault(key, {"metric": series["metric"], "values": []})
                joined["values"] += series["values"]
            if progress:
                progress(stop)
            t = stop + step
        return list(out.values())

    def query_range(self, expr: str, start: float, end: float, step: float,
                    progress: Callable[[float], None] | None = None
                    ) -> dict[tuple, dict[float, float]]:
        """{label tuple: {timestamp: value}} without NaN samples, in chunks under the points
        limit. Timestamps are rounded to the millisecond Prometheus resolves them to, so that
        a caller's own `round(t, 3)` finds them."""
        out: dict[tuple, dict[float, float]] = {}
        for series in self.range_series(expr, start, end, step, progress):
            points = out.setdefault(tuple(sorted(series["metric"].items())), {})
            for ts, value in series["values"]:
                v = float(value)
                if not math.isnan(v):
                    points[round(float(ts), 3)] = v
        return out

    def retention_seconds(self) -> float | None:
        """The time retention Prometheus runs with (None when it does not say)."""
        try:
            text = self._get("/api/v1/status/runtimeinfo", {}).get("storageRetention", "")
        except PrometheusError:
            return None
        m = re.match(r"\s*(\d+)(y|w|d|h|m)\b", text)
        units = {"y": 31536000, "w": 604800, "d": 86400, "h": 3600, "m": 60}
        return int(m.group(1)) * units[m.group(2)] if m else None
