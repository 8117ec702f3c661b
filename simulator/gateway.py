"""The gateway of a simulated PD deployment (SGLang's model gateway, `smg`): worker selection,
circuit breakers, retries, and its `smg_*` exposition.

Families, types and label names follow docs/pd.md's gateway table (smg's
`model_gateway/src/observability/metrics.rs`); the text is written the way smg's Prometheus
recorder writes it (`# TYPE name_total counter`, labels in recording order). Durations use smg's
default buckets, 0.001 … 240 s. The deployment (simulator/pd.py) drives it: `attempt_started`,
`record_success`/`record_failure`, the `observe_*` calls; it never blocks on anything.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from sglang_obs.simulator.model import Histogram

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                    30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0)
POLICIES = ("round_robin", "power_of_two", "cache_aware")
CB_CODES = {"closed": 0.0, "open": 1.0, "half_open": 2.0}
ROUTER = {"router_type": "http", "backend_type": "pd", "connection_mode": "http"}
ENDPOINT = "chat"
HTTP_PATH = "/v1/chat/completions"
RUNTIME = "sglang"


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's routing and resilience settings (scenario key `gateway:`)."""

    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    max_retries: int = 3
    backoff_s: float = 0.05  # first retry's backoff; each next one x backoff_multiplier
    backoff_multiplier: float = 1.5
    cb_failure_threshold: int = 5  # consecutive failures that open a worker's breaker
    cb_success_threshold: int = 2  # consecutive successes that close a half-open one
    cb_timeout_s: float = 30.0  # open this long, then half open
    overhead_s: float = 0.001  # routing work per attempt, before the pair is sent
    error_latency_s: float = 0.01  # how fast a failing worker answers its 5xx
    load_poll_s: float = 5.0  # the gateway's poll of each engine's load (smg_engine_*)
    sessions: int = 64  # distinct prompt prefixes the cache-aware policy keys on
    balance_abs_threshold: int = 8  # cache-aware falls back to the least loaded beyond
    balance_rel_threshold: float = 1.5  # ... both this difference and this ratio


class Worker:
    """One engine as the gateway sees it: its URL, in-flight requests and circuit breaker."""

    def __init__(self, url: str, role: str):
        self.url, self.role = url, role
        self.active = 0  # requests the gateway has in flight on it
        self.state = "closed"
        self.failures = 0  # consecutive
        self.successes = 0  # consecutive, while half open
        self.opened_at = 0.0
        self.health = 1.0  # /health answers: a worker failing its requests still does
        self.engine_load = (0.0, 0.0, 0.0)  # running, waiting, token usage (last load poll)


class Gateway:
    def __init__(self, cfg: GatewayConfig, model: str, prefill: list[Worker],
                 decode: list[Worker], rng: random.Random):
        self.cfg, self.model, self.rng = cfg, model, rng
        self.prefill, self.decode = prefill, decode
        self._rr = {"prefill": 0, "decode": 0}
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.histograms: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram] = {}
        for w in prefill + decode:  # smg registers a worker's series when it adds the worker
            for outcome in ("success", "failure"):
                self._count("smg_worker_cb_outcomes_total", 0.0, worker=w.url, outcome=outcome)

    # -- series ----------------------------------------------------------------------------
    def _count(self, name: str, by: float = 1.0, **labels: str) -> None:
        key = (name, tuple(labels.items()))
        self.counters[key] = self.counters.get(key, 0.0) + by

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(labels.items()))
        if key not in self.histograms:
            self.histograms[key] = Histogram(DURATION_BUCKETS)
        self.histograms[key].observe(value)

    # -- selection ---------------------------------------------------------------------------
    def available(self, w: Worker, t: float) -> bool:
        if w.state == "open" and t >= w.opened_at + self.cfg.cb_timeout_s:
            self._transition(w, "half_open")
        return w.state != "open"

    def pick(self, role: str, t: float, exclude: set[str], session: int,
             forced: Worker | None = None) -> Worker | None:
        """A worker of `role` by its policy (`forced`: a routing skew's choice, if usable)."""
        pool = self.prefill if role == "prefill" else self.decode
        usable = [w for w in pool if self.available(w, t)]
        if not usable:
            return None
        preferred = [w for w in usable if w.url not in exclude] or usable
        policy = self.cfg.prefill_policy if role == "prefill" else self.cfg.decode_policy
        if forced is not None and forced in usable:
            chosen = forced
        elif policy == "round_robin":
            chosen = preferred[self._rr[role] % len(preferred)]
            self._rr[role] += 1
        elif policy == "power_of_two":
            pair = self.rng.sample(preferred, 2) if len(preferred) > 1 else preferred
            chosen = min(pair, key=lambda w: w.active)
        else:  # cache_aware: the prefix's worker, unless the load is too uneven
            low = min(preferred, key=lambda w: w.active)
            high = max(w.active for w in preferred)
            uneven = (high - low.active > self.cfg.balance_abs_threshold
                      and high > low.active * self.cfg.balance_rel_threshold)
            chosen = low if uneven else preferred[session % len(preferred)]
        self._count("smg_worker_selection_total", worker_type=role,
                    connection_mode=ROUTER["connection_mode"], model=self.model, policy=policy)
        return chosen

    # -- request accounting -------------------------------------------------------------------
    def request_arrived(self, streaming: bool) -> None:
        self._count("smg_http_requests_total", method="POST", path=HTTP_PATH)
        self._count("smg_router_requests_total", **ROUTER, model=self.model, endpoint=ENDPOINT,
                    streaming="true" if streaming else "false")

    def request_done(self, duration: float, status: int, error_type: str = "") -> None:
        self.observe("smg_router_request_duration_seconds", duration, **ROUTER, model=self.model,
                     endpoint=ENDPOINT)
        self._count("smg_http_responses_total", status_code=str(status), error_code=error_type)
        if error_type:
            self._count("smg_router_request_errors_total", **ROUTER, model=self.model,
                        endpoint=ENDPOINT, error_type=error_type)

    def first_token(self, since_attempt: float) -> None:
        # Both legs go out together (SGLang's PD): decode send and prefill start coincide.
        self.observe("smg_router_ttft_seconds", since_attempt, router_type=ROUTER["router_type"],
                     backend_type=ROUTER["backend_type"], model=self.model, endpoint=ENDPOINT)
        self.observe("smg_pd_ttft_seconds", since_attempt, **self._pd_labels())

    def prefill_leg_done(self, duration: float, transfer: float) -> None:
        self.observe("smg_pd_prefill_duration_seconds", duration, **self._pd_labels())
        self.observe("smg_pd_kv_transfer_duration_seconds", transfer, **self._pd_labels())

    def _pd_labels(self) -> dict[str, str]:
        return {"backend_type": ROUTER["backend_type"], "model": self.model, "runtime": RUNTIME}

    def bootstrap_failed(self) -> None:
        self._count("smg_pd_bootstrap_failures_total")

    def transfer_failed(self) -> None:
        self._count("smg_pd_kv_transfer_failures_total")

    def worker_error(self, w: Worker, error_type: str) -> None:
        self._count("smg_worker_errors_total", worker_type=w.role,
                    connection_mode=ROUTER["connection_mode"], error_type=error_type)

    def retried(self, role: str) -> None:
        self._count("smg_worker_retries_total", worker_type=role, endpoint=ENDPOINT)

    def retries_exhausted(self, role: str) -> None:
        self._count("smg_worker_retries_exhausted_total", worker_type=role, endpoint=ENDPOINT)

    def backoff(self, attempt: int) -> float:
        """Exponential, with smg's +-20 % jitter (drawn from the scenario's seed)."""
        base = self.cfg.backoff_s * self.cfg.backoff_multiplier ** max(attempt - 1, 0)
        return base * self.rng.uniform(0.8, 1.2)

    # -- circuit breakers ---------------------------------------------------------------------
    def _transition(self, w: Worker, to: str) -> None:
        self._count("smg_worker_cb_transitions_total", worker=w.url, **{"from": w.state, "to": to})
        w.state = to
        if to != "half_open":
            w.successes = 0

    def record_failure(self, w: Worker, t: float) -> None:
        self._count("smg_worker_cb_outcomes_total", worker=w.url, outcome="failure")
        w.failures += 1
        w.successes = 0
        if w.state == "half_open" or (w.state == "closed"
                                      and w.failures >= self.cfg.cb_failure_threshold):
            self._transition(w, "open")
            w.opened_at = t

    def record_success(self, w: Worker) -> None:
        self._count("smg_worker_cb_outcomes_total", worker=w.url, outcome="success")
        w.failures = 0
        w.successes += 1
        if w.state == "half_open" and w.successes >= self.cfg.cb_success_threshold:
            self._transition(w, "closed")

    # -- exposition ---------------------------------------------------------------------------
    def samples(self) -> Iterator[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """(family, type, help, [(sample name, labels, value)]) in a stable order."""
        workers = self.prefill + self.decode
        gauges = {
            "smg_worker_pool_size": [
                ({"worker_type": role, "connection_mode": ROUTER["connection_mode"],
                  "model": self.model}, float(len(pool)))
                for role, pool in (("prefill", self.prefill), ("decode", self.decode))],
            "smg_worker_requests_active": [({"worker": w.url}, float(w.active)) for w in workers],
            "smg_worker_health": [({"worker": w.url}, w.health) for w in workers],
            "smg_worker_cb_state": [({"worker": w.url}, CB_CODES[w.state]) for w in workers],
            "smg_worker_cb_consecutive_failures": [({"worker": w.url}, float(w.failures))
                                                   for w in workers],
        }
        for i, name in enumerate(("smg_engine_running_requests", "smg_engine_waiting_requests",
                                  "smg_engine_token_usage")):
            gauges[name] = [({"worker": w.url, "model": self.model, "dp_rank": "0"},
                             w.engine_load[i]) for w in workers]
        for name in COUNTERS:  # smg's recorder shows a counter from its first increment
            rows = [(name, dict(labels), v) for (n, labels), v in self.counters.items()
                    if n == name]
            if rows:
                yield name, "counter", HELP[name], rows
        for name, rows in gauges.items():
            yield name, "gauge", HELP[name], [(name, labels, v) for labels, v in rows]
        for name in HISTOGRAMS:
            out = []
            for (n, labels), hist in self.histograms.items():
                if n != name:
                    continue
                base = dict(labels)
                for bound, count in hist.cumulative():
                    le = "+Inf" if math.isinf(bound) else floatToGoString(bound)
                    out.append((name + "_bucket", {**base, "le": le}, count))
                out.append((name + "_sum", base, hist.sum))
                out.append((name + "_count", base, hist.count))
            if out:
                yield name, "histogram", HELP[name], out

    def text(self) -> str:
        lines = []
        for name, kind, help_, rows in self.samples():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            for sample, labels, value in rows:
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"{sample}{{{lab}}} {_number(value)}" if lab
                             else f"{sample} {_number(value)}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(value)


HELP = {
    "smg_http_requests_total": "HTTP requests received, by method and path",
    "smg_http_responses_total": "HTTP responses sent, by status code and error code",
    "smg_router_requests_total": "Requests routed, by router, backend, connection, model, "
                                 "endpoint and streaming",
    "smg_router_request_errors_total": "Routed requests that failed, by error type",
    "smg_router_request_duration_seconds": "Routed request duration, arrival to last byte",
    "smg_router_ttft_seconds": "Time to first token; for PD from the decode request's send",
    "smg_pd_ttft_seconds": "PD time to first token, from the prefill leg's start",
    "smg_pd_prefill_duration_seconds": "PD prefill leg duration, send to its answer",
    "smg_pd_kv_transfer_duration_seconds": "PD KV transfer window, prefill done to KV delivered",
    "smg_pd_bootstrap_failures_total": "PD requests whose bootstrap failed",
    "smg_pd_kv_transfer_failures_total": "PD requests whose KV transfer failed",
    "smg_worker_pool_size": "Workers in the pool, by worker type",
    "smg_worker_requests_active": "Requests in flight on the worker",
    "smg_worker_health": "Worker health check (1 healthy, 0 unhealthy)",
    "smg_worker_cb_state": "Circuit breaker state (0 closed, 1 open, 2 half open)",
    "smg_worker_cb_transitions_total": "Circuit breaker state changes, by from and to",
    "smg_worker_cb_outcomes_total": "Outcomes the circuit breaker counted, by outcome",
    "smg_worker_cb_consecutive_failures": "Consecutive failures the breaker has counted",
    "smg_worker_selection_total": "Worker selections, by worker type and policy",
    "smg_worker_errors_total": "Worker errors, by worker type and error type",
    "smg_worker_retries_total": "Retries, by worker type and endpoint",
    "smg_worker_retries_exhausted_total": "Requests that used up their retries",
    "smg_engine_running_requests": "Running requests the engine reported to the gateway",
    "smg_engine_waiting_requests": "Waiting requests the engine reported to the gateway",
    "smg_engine_token_usage": "KV token usage the engine reported to the gateway",
}
COUNTERS = tuple(n for n in HELP if n.endswith("_total"))
HISTOGRAMS = tuple(n for n in HELP if n.endswith("_seconds"))
