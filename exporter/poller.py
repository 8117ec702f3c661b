"""One background poller per SGLang server; each cycle ends in an immutable snapshot.

The scrape path only reads `TargetPoller.snapshot` (a reference swapped atomically at the end of
a cycle), so a scrape never waits on SGLang and never sees a half-updated state.

Per cycle: /metrics and the load endpoint (/v1/loads, else /get_load) every poll interval;
/server_info (else /get_server_info) and /v1/models every server-info interval and after the
server comes back, since they change only on restart. derived.py turns those answers into the
signals the exporter adds; periodic.py runs the cycles.

`up` is whether /metrics or the load endpoint gave a valid answer; /server_info and /v1/models
never change it. No answer can raise out of a cycle: a fetch failure, a payload of no release,
a field of the wrong type and even a bug in a reader count as that endpoint's error (one per
endpoint per cycle) and leave the other endpoints' values standing.

One deadline (--sglang.timeout, 800 ms by default) covers all of a cycle's requests together:
each request gets what is left of it, so a hang on one endpoint cannot stretch the cycle past
it. With the deadline below the poll interval a server that stops answering reads down within
two intervals of the moment it stopped: the cycle in flight ends by its deadline, and the next,
which starts on time, fails by its own. JSON answers are held to json_bounds.py's bounds (at
most MAX_JSON_BYTES are read; an answer that could decode into too much memory is refused
undecoded, a `parse` error).

The log says when the server becomes reachable or unreachable, when an endpoint starts failing
(with the reason, and what was wrong and where, never the bytes the server sent) and when it
answers again: one line per change, not one per cycle, and per server at most LOG_BURST lines
per LOG_WINDOW; then one line says how many changes were not logged and what the server is now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sglang_obs.core.log_budget import LogBudget
from sglang_obs.exporter import json_bounds
from sglang_obs.exporter.derived import Derived, derive
from sglang_obs.exporter.http_fetch import (
    METRICS_ACCEPT,
    FetchError,
    Response,
    fetch,
)
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.periodic import Periodic
from sglang_obs.exporter.queue_run import QueueRunState, QueueRunTracker
from sglang_obs.exporter.sglang_api import (
    Load,
    PayloadError,
    PdLoad,
    ServerConfig,
    parse_loads,
    parse_models,
    parse_server_info,
)
from sglang_obs.exporter.sglang_exposition import ExpositionError, NativeMetrics, parse_exposition
from sglang_obs.exporter.targets import server_label

log = logging.getLogger(__name__)

# Tried in order; the first that is not 404/405 is kept until the server restarts.
LOAD_PATHS = ("/v1/loads", "/get_load")
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")

# Per server: state-change lines per window, then one line saying how many were not logged.
# A server flapping up and down every second logged ~60 lines a minute.
LOG_BURST = 10
LOG_WINDOW = 60.0


@dataclass(frozen=True)
class PollSettings:
    interval: float = 1.0
    server_info_interval: float = 30.0
    # For all of one cycle's requests together; below `interval`, so a hung server reads down
    # within two intervals.
    timeout: float = 0.8
    max_response_bytes: int = 16 * 1024 * 1024
    # Sent as `Authorization: Bearer ...` (SGLang's --api-key); never shown, logged or exported.
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Snapshot:
    server: str
    up: bool = False
    last_success_timestamp: float | None = None
    poll_duration_seconds: float | None = None
    polls: int = 0
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    lines_dropped: dict[str, int] = field(default_factory=dict)  # reason -> /metrics lines
    derived_dropped: dict[str, int] = field(default_factory=dict)  # signal -> values
    native_spelling: str | None = None  # None: /metrics not parsed this cycle
    scheduler_metrics_present: bool = False
    derived: Derived | None = None  # None while the server is unreachable
    config: ServerConfig | None = None  # last known; kept while the server is down
    queue_run: QueueRunState | None = None
    # This cycle's aggregated /metrics values (sglang_exposition.WANTED), {} when /metrics gave
    # none: the counters and queues the glance page (status.py) reads besides `derived`.
    native_values: Mapping[str, float] = field(default_factory=dict)
    # ...and the queue gauges per priority (NativeMetrics.by_priority), {} without priorities.
    native_by_priority: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # This cycle's PD queues from the load endpoint; None for a unified server, a release
    # without them, or a cycle without a load answer.
    pd: PdLoad | None = None


class TargetPoller:
    def __init__(
        self,
        base_url: str,
        settings: PollSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fetcher: Callable[..., Response] = fetch,
        log_stats: LogStats | None = None,
        on_change: Callable[[], None] = lambda: None,
        on_poll: Callable[[float, Snapshot], None] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.server = server_label(self.base_url)
        self.settings = settings
        self._clock = clock
        self._wall = wall_clock
        self._fetch = fetcher  # the simulator's renderer polls it in-process, in simulated time
        self.log_stats = log_stats  # the server's scheduler log, where one is followed
        self._on_change = on_change  # told after each new snapshot (the exposition re-renders)
        # Given (cycle start, snapshot) after each poll cycle, in the poll thread: the glance
        # page's history (status.py) is fed here, never on the scrape path.
        self._on_poll = on_poll
        self._on_poll_failed = False
        self._queue = QueueRunTracker()
        # (endpoint, reason) -> failures, from the first one: no rule needs a zero before it
        self._errors: dict[tuple[str, str], int] = {}
        self._lines_dropped: dict[str, int] = {}  # malformed | over_limit -> lines
        self._derived_dropped: dict[str, int] = {}  # signal -> values out of their domain
        self._failing: dict[str, str] = {}  # endpoint -> reason of its current failure streak
        self._log_budget = LogBudget(LOG_BURST, LOG_WINDOW, clock)
        self._deadline = 0.0  # time.monotonic() by which this cycle's requests must end
        self._last_dropped: tuple[str, ...] = ()
        self._headers: Mapping[str, str] = (
            {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {})
        self._polls = 0
        self._load_path: str | None = LOAD_PATHS[0]
        self._info_path = SERVER_INFO_PATHS[0]
        self._next_info_at = 0.0
        self._was_up = False
        self._last_success: float | None = None
        self._config: ServerConfig | None = None
        self._models_context: float | None = None
        self.snapshot = Snapshot(server=self.server, errors=dict(self._errors))
        self._answers: tuple[NativeMetrics | None, Load | None] | None = None  # last up cycle's
        self._lock = threading.Lock()  # the poll and the log follower both replace snapshot
        self._loop = Periodic(f"poll {self.server}", self.poll_once, settings.interval, clock)
        if log_stats is not None:
            log_stats.subscribe(self.refresh_from_log)

    # -- background loop -------------------------------------------------------------------
    def start(self, stop: threading.Event) -> None:
        self._loop.start(stop)

    def join(self, timeout: float | None = None) -> None:
        self._loop.join(timeout)

    # -- one cycle ----------------------------------------------------------------------------
    def poll_once(self) -> Snapshot:
        started = self._clock()
        # Real time, whatever `clock` is: the requests take real time.
        self._deadline = time.monotonic() + self.settings.timeout
        self._polls += 1
        self._say_left_out(self._log_budget.flush())
        native, reachable = self._poll_metrics()
        # An unreachable server would make the load request wait out its timeout too.
        load = self._poll_loads() if reachable else None
        up = native is not None or load is not None
        if up and (not self._was_up or started >= self._next_info_at):
            self._poll_server_info()
            self._next_info_at = started + self.settings.server_info_interval
        if not up:
            # On return the server may be another release: probe the paths again.
            self._load_path = LOAD_PATHS[0]
            self._info_path = SERVER_INFO_PATHS[0]
        if up != self._was_up:  # log transitions only: a dead server must not flood the log
            self._log(logging.INFO if up else logging.WARNING, "SGLang server %s is %s",
                      self.server, "reachable" if up else "unreachable (see poll_errors_total)")
        self._was_up = up

        with self._lock:
            derived = None
            if up:
                self._last_success = self._wall()
                self._answers = (native, load)
                derived = self._derive()
                self._count_dropped(derived.dropped)
                if derived.waiting_requests is not None:
                    self._queue.observe(started, derived.waiting_requests)
            else:
                self._answers = None
                self._queue.lost()

            self.snapshot = Snapshot(
                server=self.server,
                up=up,
                last_success_timestamp=self._last_success,
                poll_duration_seconds=self._clock() - started,
                polls=self._polls,
                errors=dict(self._errors),
                lines_dropped=dict(self._lines_dropped),
                derived_dropped=dict(self._derived_dropped),
                native_spelling=native.spelling if native else None,
                scheduler_metrics_present=bool(native and native.has_scheduler_series),
                derived=derived,
                config=self._config,
                queue_run=self._queue.state(),
                native_values=native.values if native else {},
                native_by_priority=native.by_priority if native else {},
                pd=load.pd if load is not None else None,
            )
            snapshot = self.snapshot
        if self._on_poll is not None:
            try:
                self._on_poll(started, snapshot)
            except Exception:  # the page's history must not cost the metrics
                if not self._on_poll_failed:
                    log.exception("%s: the glance page's history failed to take this poll "
                                  "(the metrics are not affected; later failures are not "
                                  "logged)", self.server)
                self._on_poll_failed = True
        self._on_change()
        return snapshot

    def refresh_from_log(self) -> None:
        """New scheduler-log lines: fold them in now, from the last poll's answers and with no
        request, so a logged backlog shows one log read after its line, not a log read plus a
        server poll later."""
        with self._lock:
            if self._answers is not None:
                self.snapshot = replace(self.snapshot, derived=self._derive())
        self._on_change()

    def _derive(self) -> Derived:
        native, load = self._answers
        log_snapshot = self.log_stats.snapshot() if self.log_stats else None
        return derive(native, load, self._config, self._models_context, log_snapshot)

    def _count_dropped(self, dropped: tuple[str, ...]) -> None:
        for signal in dropped:
            self._derived_dropped[signal] = self._derived_dropped.get(signal, 0) + 1
        if dropped != self._last_dropped:
            if dropped:
                self._log(logging.DEBUG, "%s: values outside their domain dropped: %s",
                          self.server, ", ".join(dropped))
            self._last_dropped = dropped

    def _log(self, level: int, msg: str, *args, exc_info: bool = False) -> None:
        """A state-change line, within the server's budget (LOG_BURST per LOG_WINDOW)."""
        if not log.isEnabledFor(level):
            return  # a line the log would drop must not spend the budget
        emit, left_out = self._log_budget.take()
        self._say_left_out(left_out)
        if emit:
            log.log(level, msg, *args, exc_info=exc_info)

    def _say_left_out(self, left_out: int) -> None:
        if left_out:
            log.warning("SGLang server %s: %d more state changes not logged in the last %.0f s "
                        "(at most %d lines per server per %.0f s); it is now %s", self.server,
                        left_out, LOG_WINDOW, LOG_BURST, LOG_WINDOW,
                        "reachable" if self._was_up else "unreachable")

    def _get(self, endpoint: str, path: str, accept: str = "*/*", max_bytes: int | None = None):
        try:
            return self._fetch(
                self.base_url + path,
                # what is left of the cycle's deadline (fetch fails at once when nothing is)
                timeout=self._deadline - time.monotonic(),
                max_bytes=max_bytes or self.settings.max_response_bytes,
                accept=accept,
                headers=self._headers,
            )
        except FetchError as err:
            if err.status not in (404, 405):
                self._failed(endpoint, err.reason, f"{path}: {err.detail}")
            raise

    def _count_error(self, endpoint: str, reason: str) -> None:
        self._errors[(endpoint, reason)] = self._errors.get((endpoint, reason), 0) + 1

    def _failed(self, endpoint: str, reason: str, detail: str, bug: bool = False) -> None:
        """Count one failure of `endpoint`; log it if the endpoint was not failing so already.
        `detail` says what was wrong and where, in the exporter's words (never response bytes)."""
        self._count_error(endpoint, reason)
        if self._failing.get(endpoint) == reason:
            return
        self._failing[endpoint] = reason
        if bug:  # a reader raised: a traceback once per streak, the answer counted as parse
            self._log(logging.ERROR, "%s %s: reading the answer failed (counted as parse)",
                      self.server, endpoint, exc_info=True)
        else:
            self._log(logging.DEBUG, "%s %s failing (%s): %s", self.server, endpoint, reason,
                      detail)

    def _answered(self, endpoint: str) -> None:
        if self._failing.pop(endpoint, None) is not None:
            self._log(logging.DEBUG, "%s %s: answering again", self.server, endpoint)

    def _read(self, endpoint: str, reader: Callable, payload):
        """reader(payload), or None with the failure counted; never raises."""
        try:
            result = reader(payload)
        except PayloadError as err:
            self._failed(endpoint, "parse", str(err))
            return None
        except Exception:  # a reader bug must cost this answer, not the cycle
            self._failed(endpoint, "parse", "reader failed", bug=True)
            return None
        bad = getattr(result, "bad_fields", ())
        if bad:
            self._failed(endpoint, "parse", "fields of the wrong type, read as unknown: "
                         + ", ".join(bad))
        else:
            self._answered(endpoint)
        return result

    def _poll_metrics(self) -> tuple[NativeMetrics | None, bool]:
        """The parsed answer (None on failure) and whether the server answered at all."""
        try:
            resp = self._get("metrics", "/metrics", METRICS_ACCEPT)
        except FetchError as err:
            if err.status in (404, 405):  # --enable-metrics is off: count it, it is a finding
                self._failed("metrics", err.reason, f"/metrics: {err.detail}")
            return None, err.reason in ("http_status", "too_large", "protocol")
        try:
            native = parse_exposition(resp.body.decode("utf-8", "replace"), resp.content_type)
        except ExpositionError as err:
            self._drop_lines("malformed", err.malformed_lines, err.first_malformed)
            self._failed("metrics", "parse", f"/metrics: {err}")
            return None, True
        except Exception:  # as in _read
            self._failed("metrics", "parse", "reader failed", bug=True)
            return None, True
        self._drop_lines("malformed", native.malformed_lines, native.first_malformed)
        self._drop_lines("over_limit", native.lines_over_limit, None)
        self._answered("metrics")
        return native, True

    def _drop_lines(self, reason: str, lines: int, first: int | None) -> None:
        if not lines:
            self._failing.pop("lines " + reason, None)
            return
        self._lines_dropped[reason] = self._lines_dropped.get(reason, 0) + lines
        if "lines " + reason not in self._failing:
            self._failing["lines " + reason] = reason
            where = f"; the first is line {first}" if first else ""
            self._log(logging.DEBUG, "%s /metrics: %d lines dropped (%s)%s", self.server, lines,
                      reason, where)

    def _poll_loads(self) -> Load | None:
        paths = LOAD_PATHS[LOAD_PATHS.index(self._load_path):] if self._load_path else ()
        for path in paths:
            payload = self._get_json("loads", path)
            if payload is _NOT_FOUND:
                continue
            self._load_path = path
            if payload is None:
                return None
            return self._read("loads", parse_loads, payload)
        self._load_path = None  # this release has no load endpoint (before 0.4.7)
        return None

    def _poll_server_info(self) -> None:
        for path in SERVER_INFO_PATHS[SERVER_INFO_PATHS.index(self._info_path):]:
            payload = self._get_json("server_info", path)
            if payload is _NOT_FOUND:
                continue
            self._info_path = path
            if payload is not None:
                config = self._read("server_info", parse_server_info, payload)
                if config is not None:
                    self._config = config
            break
        payload = self._get_json("models", "/v1/models")
        if payload not in (None, _NOT_FOUND):
            models = self._read("models", parse_models, payload)
            if models is not None:
                self._models_context = models.context_length

    def _get_json(self, endpoint: str, path: str):
        """Decoded JSON; _NOT_FOUND on 404/405; None on any other failure (already counted)."""
        try:
            resp = self._get(endpoint, path, "application/json", max_bytes=min(
                self.settings.max_response_bytes, json_bounds.MAX_JSON_BYTES))
        except FetchError as err:
            return _NOT_FOUND if err.status in (404, 405) else None
        try:
            return json_bounds.loads(resp.body)
        except json_bounds.JSONBoundsError as err:  # refused before it is decoded (or too deep)
            self._failed(endpoint, "parse", f"{path}: JSON over its bounds: {err}")
            return None
        except (ValueError, RecursionError):  # junk, bad UTF-8, absurd nesting, huge integers
            self._failed(endpoint, "parse", f"{path}: not JSON")
            return None


_NOT_FOUND = object()
