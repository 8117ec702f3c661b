"""`sglang-sim what-if`: what would this window have looked like under other server arguments?

Before a configuration change reaches production: read a window of a real server's series,
estimate the load it carried, and replay that load through the simulator's scheduler model
(simulator/model.py) twice — under the server's current arguments and under proposed ones —
over several random draws of the load. The result is a **model prediction**, not a measurement:
seed 000's authors insist that a gain is verified under the same load; this only says which
way the model expects each figure to move, and by how much.

Two halves, kept apart:
- estimate(source) reads the window (a Source: Prometheus, a snapshot pack's load.json, or a
  rendered scenario) into an Estimate: arrivals per minute, prompt/output/uncached length
  distributions, the cache hit ratio, the warm radix cache at the start, and the server
  arguments the series show.
- replay(estimate, current, proposed) draws requests from the Estimate (one draw per seed),
  runs both configurations on the same draw through compare.summarize, and returns per-seed
  figures and paired deltas.

How the load is estimated (docs/simulator.md, "What-if"):
- arrivals: requests entering the running batch per scrape interval
  (sglang:queue_time_seconds_count, observed when a request is first scheduled), moved back by
  that interval's mean queue time to their arrival, counted per minute; in the replay each
  minute's count arrives at uniform random times within the minute (a Poisson process given
  the count). Before 0.5.3 (no queue-time histogram): finished requests moved back by the
  mean end-to-end latency.
- lengths: SGLang's native per-request histograms (sglang:prompt_tokens_histogram,
  generation_tokens_histogram, uncached_prompt_tokens_histogram; observed at finish), per
  5-minute segment so a drift (growing agent contexts) survives; uniform within a bucket, then
  scaled so each segment's mean matches its _sum/_count. Without them: the means from the token
  counters, +-20 %. The request-record series (sglang_obs_request_*) carry only four prompt
  classes and no output lengths, so the native histograms are preferred.
- cached share: per request 1 - uncached / prompt, both drawn from their histograms; without the
  uncached histogram every request gets the window's hit ratio (cached / prompt counters).
- server arguments: the exporter's config series and SGLang's constants; what no series carries
  (the hardware's timings; an argument an older exporter did not report) comes from --current
  and --perf, else the model's defaults, and the report says which is which.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_obs.core import pack, settings, shown
from sglang_obs.core.cli_support import Failure, UsageError
from sglang_obs.core.pack import pick_server
from sglang_obs.core.quantities import q
from sglang_obs.core.times import iso
from sglang_obs.simulator import compare
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.model import PerfModel, ServerConfig

SEGMENT_SECONDS = 300.0  # length distributions are estimated per segment of the window
BIN_SECONDS = 60.0  # arrivals are counted per minute
MIN_SEGMENT_REQUESTS = 5  # fewer finished requests in a segment: use the whole window's
DEFAULT_SEEDS = 5

# Server arguments --set and --current may change: those the scheduler model acts on.
SCHEDULER_ARGS = ("max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
                  "schedule_policy", "num_continuous_decode_steps", "max_total_num_tokens",
                  "context_length", "dp_size", "speculative_algorithm", "spec_accept_length",
                  "speculative_num_steps", "decode_log_interval", "enable_hierarchical_cache",
                  "hicache_ratio", "hicache_write_policy")
POLICIES = ("fcfs", "lpm")
# Seed 000's change: the proposal its authors deployed and asked to verify.
SEED_000 = {"max_running_requests": 10, "chunked_prefill_size": 8192, "schedule_policy": "lpm",
            "num_continuous_decode_steps": 1}

P = "sglang:"


# -- sources -------------------------------------------------------------------------------
class Source(Protocol):
    """A window of one server's series."""

    where: str  # for the report: "Prometheus http://…", "rendered scenario …"
    instance: str
    start: float
    end: float

    def series(self, name: str, agg: str = "sum", by: str | None = None
               ) -> dict[str, list[tuple[float, float]]]:
        """Samples of `name` aggregated (sum or max) over its label sets, one series per value
        of label `by` (key '' when `by` is None), each in time order."""

    def info(self, name: str) -> dict[str, str] | None:
        """The labels of an info metric's latest series in the window."""


class RenderedSource:
    """A scenario rendered by simulator/render.py (what a backfilled Prometheus would hold)."""

    def __init__(self, rendered, instance: str = "sglang:30000", where: str = ""):
        self.rendered, self.instance = rendered, instance
        self.where = where or "rendered scenario"
        self.start = rendered.start
        self.end = rendered.time(rendered.steps - 1)

    def _matching(self, name: str):
        for (n, labels), points in self.rendered.series.items():
            lab = dict(labels)
            if n == name and lab.get("instance") == self.instance:
                yield lab, points

    def series(self, name, agg="sum", by=None):
        grouped: dict[str, dict[int, list[float]]] = {}
        for lab, points in self._matching(name):
            group = grouped.setdefault(lab.get(by, "") if by else "", {})
            for i, v in points.items():
                group.setdefault(i, []).append(v)
        combine = sum if agg == "sum" else max
        return {key: [(self.rendered.time(i), float(combine(vs))) for i, vs in sorted(g.items())]
                for key, g in grouped.items()}

    def info(self, name):
        latest = None
        for lab, points in self._matching(name):
            if points and (latest is None or max(points) >= latest[0]):
                latest = (max(points), lab)
        return latest[1] if latest else None


class PrometheusSource:
    """A window of a real Prometheus (sglang_obs.core.prometheus_api), one instance."""

    def __init__(self, prom, start: float, end: float, instance: str | None = None,
                 step: float | None = None):
        step = step or settings.default().scrape_interval_s  # prometheus.yml's
        self.prom, self.start, self.end, self.step = prom, start, end, step
        self.where = f"Prometheus {shown.url(prom.url)}"
        found = sorted({dict(k).get("instance", "") for k in prom.query_range(
            f"count by (instance) ({P}num_requests_total)", start, end,
            max(step, (end - start) / 100))})
        if not found:  # the window is the problem, whatever --instance says
            raise Failure(self._empty_window(prom, start, end))
        self.instance = pick_server(found, instance, "--instance", "this window")

    @staticmethod
    def _empty_window(prom, start: float, end: float) -> str:
        text = (f"--start/--end: no SGLang server in this window: {shown.url(prom.url)} holds no "
                f"{P}num_requests_total from {iso(start)} to {iso(end)}")
        retention = prom.retention_seconds()
        kept_from = time.time() - retention if retention else None
        if kept_from is not None and start < kept_from:
            days = retention / 86400
            return (f"{text}, and the window starts before Prometheus's retention ({days:g} "
                    f"day{'s' if days != 1 else ''}: nothing before {iso(kept_from)} is kept)")
        return f"{text} (no SGLang server was scraped then)"

    def series(self, name, agg="sum", by=None):
        return pack.query_series(self.prom, name, agg, by, self.instance, self.start, self.end,
                                 self.step)

    def info(self, name):
        return pack.query_info(self.prom, name, self.instance, self.start, self.end, self.step)


class PackSource:
    """A `sglang-obs snapshot` pack's load.json (sglang_obs.core.pack): the series PrometheusSource
    would read over the pack's window, one instance."""

    def __init__(self, path, instance: str | None = None, flag: str = "--pack"):
        doc = pack.read(flag, path, pack.LOAD)
        self.instance = pick_server(sorted(doc["servers"]), instance, "--instance",
                                    f"the pack {flag} {path}", pack.PackError)
        self.where = f"snapshot pack {path}"
        window = doc["window"]
        self.start, self.end, self.step = window["start"], window["end"], window["step_seconds"]
        held = doc["servers"][self.instance]
        self._series = {(s["name"], s["agg"], s["by"]): s["values"] for s in held["series"]}
        self._info = held["info"]

    def _missing(self, what: str) -> EstimateError:
        return EstimateError(f"{self.where}: {pack.LOAD} has no {what}: the pack was taken by "
                             "another release; take it again with this one")

    def series(self, name, agg="sum", by=None):
        if (name, agg, by) not in self._series:
            raise self._missing(f"{agg} by ({by or ''}) of {name}")
        return {key: [(t, v) for t, v in points]
                for key, points in self._series[(name, agg, by)].items()}

    def info(self, name):
        if name not in self._info:
            raise self._missing(f"info metric {name}")
        return self._info[name]


# -- the estimate ----------------------------------------------------------------------------
@dataclass
class Distribution:
    """Per-request token counts: histogram bins (lower, upper, count) and the exact mean."""

    bins: list[tuple[float, float, float]]
    mean: float

    @property
    def count(self) -> float:
        return sum(c for _, _, c in self.bins)

    def _raw_mean(self) -> float:
        return sum((lo + hi) / 2 * c for lo, hi, c in self.bins) / self.count

    def draw(self, rng: random.Random) -> float:
        """Uniform within a bucket picked by its count, scaled so the mean is the exact one."""
        pick = rng.uniform(0, self.count)
        chosen = self.bins[-1]
        for b in self.bins:
            pick -= b[2]
            if pick <= 0:
                chosen = b
                break
        return rng.uniform(chosen[0], chosen[1]) * self.mean / self._raw_mean()

    def quantile(self, q: float) -> float:
        """Interpolated within the bucket (as histogram_quantile), scaled like draw()."""
        rank, seen = q * self.count, 0.0
        for lo, hi, c in self.bins:
            if seen + c >= rank:
                return (lo + (hi - lo) * ((rank - seen) / c if c else 1.0)) * (
                    self.mean / self._raw_mean())
            seen += c
        return self.bins[-1][1]


@dataclass
class Lengths:
    """A length distribution per segment of the window, and the whole window's."""

    source: str  # the series it came from
    overall: Distribution
    segments: list[Distribution | None] = field(default_factory=list)

    def at(self, offset: float) -> Distribution:
        i = int(offset // SEGMENT_SECONDS)
        seg = self.segments[i] if 0 <= i < len(self.segments) else None
        return seg if seg is not None and seg.count >= MIN_SEGMENT_REQUESTS else self.overall


@dataclass
class Estimate:
    where: str
    instance: str
    start: float
    end: float
    arrivals: list[int]  # per minute of the window
    arrivals_from: str
    finished: int  # requests that finished in the window
    prompt: Lengths
    output: Lengths
    uncached: Lengths | None
    cache_hit_ratio: float | None  # cached / prompt tokens over the window
    warm_cache: float  # radix-cache share of the KV pool at the start (evictable tokens)
    release: str
    args: dict[str, Any]  # ServerConfig fields the series show
    args_from: dict[str, str]  # field -> the series it came from
    notes: list[str] = field(default_factory=list)
    # Speculative decoding: tokens per verify step per minute of the window (None where the
    # minute finished no request), from the counters; each drawn request gets its minute's.
    spec_accept: list[float | None] = field(default_factory=list)
    # HiCache: the reusable prefix tokens per minute (the working set), read from the split of
    # the hits between the device cache and the host tier; a lower bound (see _working_sets).
    working_set: list[float | None] = field(default_factory=list)

    def spec_accept_at(self, offset: float) -> float | None:
        i = int(offset // BIN_SECONDS)
        return self.spec_accept[i] if 0 <= i < len(self.spec_accept) else None

    def working_set_at(self, offset: float) -> float | None:
        i = int(offset // BIN_SECONDS)
        return self.working_set[i] if 0 <= i < len(self.working_set) else None

    @property
    def duration(self) -> float:
        return self.end - self.start

    def document(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["duration_seconds"] = self.duration
        return doc


class EstimateError(Failure):
    """The window does not hold what the estimate needs (exit 1)."""


def _increments(points: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(from, to, increase) between consecutive samples of a counter; a reset (value down)
    counts the new value as the increase."""
    out = []
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        out.append((t0, t1, v1 - v0 if v1 >= v0 else v1))
    return out


def _increase(points: list[tuple[float, float]], lo: float = -math.inf,
              hi: float = math.inf) -> float:
    return sum(inc for _, t1, inc in _increments(points) if lo < t1 <= hi)


def _one(source: Source, name: str, agg: str = "sum") -> list[tuple[float, float]]:
    return source.series(name, agg).get("", [])


def _histogram(source: Source, name: str, lo: float, hi: float) -> Distribution | None:
    """The increase of histogram `name` (without _bucket) over (lo, hi] as bins and mean."""
    buckets = source.series(name + "_bucket", by="le")
    if not buckets:
        return None
    cumulative = sorted((float(le), _increase(points, lo, hi)) for le, points in buckets.items())
    count = _increase(_one(source, name + "_count"), lo, hi)
    total = _increase(_one(source, name + "_sum"), lo, hi)
    if count <= 0:
        return None
    bins, lower, below = [], 0.0, 0.0
    for bound, cum in cumulative:
        if cum - below > 0:  # the +Inf bucket: up to a quarter above the last bound
            upper = bound if math.isfinite(bound) else max(lower * 1.25, 1.0)
            bins.append((lower, upper, cum - below))
        below = max(cum, below)
        lower = bound if math.isfinite(bound) else lower
    return Distribution(bins, total / count) if bins else None


def _lengths(source: Source, name: str, counter: str, requests: list) -> Lengths | None:
    """Per-segment distributions from histogram `name`; without it, the counter's mean +-20 %."""
    overall = _histogram(source, name, -math.inf, math.inf)
    if overall is None:
        if not counter:
            return None
        tokens = _increase(_one(source, counter))
        n = _increase(requests)
        if n <= 0 or tokens <= 0:
            return None
        mean = tokens / n
        return Lengths(f"{counter} / {P}num_requests_total (mean +-20 %)",
                       Distribution([(0.8 * mean, 1.2 * mean, n)], mean))
    edges = [source.start + i * SEGMENT_SECONDS
             for i in range(math.ceil((source.end - source.start) / SEGMENT_SECONDS) + 1)]
    segments = [_histogram(source, name, a, b) for a, b in zip(edges, edges[1:], strict=False)]
    return Lengths(name, overall, segments)


def _arrivals(source: Source) -> tuple[list[int], str]:
    """Requests per minute, from when they were first scheduled (or finished) moved back by
    the interval's mean queue time (or end-to-end latency)."""
    minutes = [0] * max(math.ceil((source.end - source.start) / BIN_SECONDS), 1)
    for base, how in (("queue_time_seconds", "first scheduled (queue_time_seconds_count) "
                                             "minus the mean queue time"),
                      ("e2e_request_latency_seconds", "finished (e2e_request_latency_seconds_"
                                                      "count) minus the mean e2e latency")):
        counts = _increments(_one(source, f"{P}{base}_count"))
        if not any(inc for *_, inc in counts):
            continue
        sums = {t1: inc for _, t1, inc in _increments(_one(source, f"{P}{base}_sum"))}
        for t0, t1, n in counts:
            if n <= 0:
                continue
            back = sums.get(t1, 0.0) / n
            at = (t0 + t1) / 2 - back - source.start
            minutes[min(max(int(at // BIN_SECONDS), 0), len(minutes) - 1)] += round(n)
        return minutes, how
    raise EstimateError(f"{source.where}: no requests in the window on {source.instance} "
                        f"({P}queue_time_seconds_count and e2e_request_latency_seconds_count "
                        "do not rise)")


# (ServerConfig field, series, aggregation) in order of preference.
ARG_SERIES = {
    "max_running_requests": ("sglang_obs_max_running_requests",
                             "sglang_obs_log_max_running_requests"),
    "max_total_num_tokens": (f"{P}max_total_num_tokens", "sglang_obs_kv_capacity_tokens",
                             "sglang_obs_log_capacity_tokens"),
    "chunked_prefill_size": ("sglang_obs_config_chunked_prefill_size_tokens",),
    "max_prefill_tokens": ("sglang_obs_config_max_prefill_tokens",),
    "context_length": ("sglang_obs_config_context_length_tokens", f"{P}context_len"),
    "tp_size": ("sglang_obs_config_tp_size",),
    "dp_size": ("sglang_obs_config_dp_size",),
    "num_continuous_decode_steps": ("sglang_obs_config_num_continuous_decode_steps",),
    "speculative_num_steps": (f"{P}spec_num_steps",),  # 0.5.13+; 0 without a draft model
}


def _args(source: Source) -> tuple[dict[str, Any], dict[str, str]]:
    args: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, candidates in ARG_SERIES.items():
        for series in candidates:
            points = _one(source, series, "max")
            if points and (points[-1][1] > 0 or name != "speculative_num_steps"):
                args[name], origin[name] = int(points[-1][1]), series
                break
    info = source.info("sglang_obs_server_config_info") or {}
    for name in ("schedule_policy", "speculative_algorithm"):
        value = info.get(name)
        if value not in (None, ""):
            args[name] = None if value in ("null", "None") else value
            origin[name] = "sglang_obs_server_config_info"
    if args.get("schedule_policy") not in (None, *POLICIES):
        args["schedule_policy"] = "fcfs"  # the model knows fcfs and lpm; others are reported
        origin["schedule_policy"] += " (not modelled: fcfs)"
    if args.get("speculative_algorithm"):
        # The recording rule's definition first: generated tokens over verify steps, both
        # counted as requests finish (0.5.13+); the last report's gauge covers one interval.
        verifies = _increase(_one(source, f"{P}spec_verify_calls_total"))
        generated = _increase(_one(source, f"{P}generation_tokens_total"))
        if verifies > 0 and generated > 0:
            args["spec_accept_length"] = round(generated / verifies, 3)
            origin["spec_accept_length"] = (f"{P}generation_tokens_total over "
                                            f"{P}spec_verify_calls_total (increase over the "
                                            "window)")
            return args, origin
        for series in (f"{P}spec_accept_length", "sglang_obs_log_spec_accept_length"):
            values = [v for _, v in _one(source, series, "max") if v > 0]
            if values:
                args["spec_accept_length"] = round(statistics.fmean(values), 3)
                origin["spec_accept_length"] = f"{series} (mean over the window)"
                break
    return args, origin


def estimate(source: Source) -> Estimate:
    """The load and the configuration a window shows (the module docstring says how)."""
    requests = _one(source, f"{P}num_requests_total")
    arrivals, how = _arrivals(source)
    prompt = _lengths(source, f"{P}prompt_tokens_histogram", f"{P}prompt_tokens_total",
                      requests)
    output = _lengths(source, f"{P}generation_tokens_histogram",
                      f"{P}generation_tokens_total", requests)
    if prompt is None or output is None:
        raise EstimateError(f"{source.where}: no finished request in the window on "
                            f"{source.instance}: no prompt or output lengths to estimate")
    uncached = _lengths(source, f"{P}uncached_prompt_tokens_histogram", "", [])
    prompt_tokens = _increase(_one(source, f"{P}prompt_tokens_total"))
    cached = _increase(_one(source, f"{P}cached_tokens_total"))
    hit = cached / prompt_tokens if prompt_tokens > 0 else None
    args, origin = _args(source)
    spec = _spec_segments(source) if args.get("speculative_algorithm") else []
    working = _working_sets(source, args, origin)
    capacity = args.get("max_total_num_tokens")
    evictable = _one(source, f"{P}kv_evictable_tokens", "max")
    warm = min(evictable[0][1] / capacity, 1.0) if evictable and capacity else 0.0
    info = source.info("sglang_obs_server_config_info") or {}
    notes = []
    if uncached is None:
        notes.append("no uncached-prompt histogram: every request gets the window's cache hit "
                     "ratio")
    if not evictable:
        notes.append("no kv_evictable_tokens: the radix cache starts empty")
    return Estimate(
        where=source.where, instance=source.instance, start=source.start, end=source.end,
        arrivals=arrivals, arrivals_from=how, finished=round(_increase(requests)),
        prompt=prompt, output=output, uncached=uncached, cache_hit_ratio=hit,
        warm_cache=round(warm, 3), release=info.get("version") or "0.5.23", args=args,
        args_from=origin, notes=notes + (
            ["HiCache: the working set is read from how the hits split between the device and "
             "the host tier, a lower bound where the host tier is full: what a larger host "
             "pool would add there is not in the series"] if working else []),
        spec_accept=spec, working_set=working)


def _minutes(source: Source) -> list[tuple[float, float]]:
    """(start, end) of each minute of the window (BIN_SECONDS, as the arrivals are counted)."""
    return [(source.start + i * BIN_SECONDS, source.start + (i + 1) * BIN_SECONDS)
            for i in range(math.ceil((source.end - source.start) / BIN_SECONDS))]


def _working_sets(source: Source, args: dict[str, Any], origin: dict[str, str]
                  ) -> list[float | None]:
    """HiCache (host pool series present): its arguments into `args`, and the working set of
    each minute. The model finds a prefix on the device with the chance D / W (D: the device
    cache's reusable tokens, W: the working set) and the rest in the host tier with the chance
    H / (W - D) (H: its host-only tokens), so host hits over device hits read (W - D) / D while
    the host tier holds the rest, and H / D once it is full: W = D x (1 + host / device) is the
    working set, or the device and host tiers' size when the host tier is full (a lower bound),
    or the device cache's size when every hit is on the device (the working set fits there).
    The write policy is not in the series: SGLang's default, write-through, unless given."""
    total = _one(source, f"{P}hicache_host_total_tokens", "max")
    capacity = args.get("max_total_num_tokens")
    if not total or not capacity:
        return []
    args["enable_hierarchical_cache"] = True
    origin["enable_hierarchical_cache"] = f"{P}hicache_host_total_tokens (present)"
    args["hicache_ratio"] = round(total[-1][1] / capacity, 3)
    origin["hicache_ratio"] = f"{P}hicache_host_total_tokens over max_total_num_tokens"
    hits = source.series(f"{P}cached_tokens_total", "sum", by="cache_source")
    device, host = hits.get("device", []), hits.get("host", [])
    evictable = _one(source, f"{P}kv_evictable_tokens", "max")
    out: list[float | None] = []
    for lo, hi in _minutes(source):
        d, h = _increase(device, lo, hi), _increase(host, lo, hi)
        cache = [v for t, v in evictable if lo < t <= hi]
        mean = statistics.fmean(cache) if cache else 0.0
        out.append(round(mean * (1 + h / d)) if d > 0 and mean > 0 else None)
    return out


def _spec_segments(source: Source) -> list[float | None]:
    """Tokens per verify step in each minute: generated tokens over verify steps, both counted
    as requests finish (0.5.13+; [] without the verify counter). A minute, not a length
    segment: a change of the traffic mix moves acceptance at once."""
    verifies = _one(source, f"{P}spec_verify_calls_total")
    if not verifies:
        return []
    generated = _one(source, f"{P}generation_tokens_total")
    out: list[float | None] = []
    for lo, hi in _minutes(source):
        n, tokens = _increase(verifies, lo, hi), _increase(generated, lo, hi)
        out.append(round(max(tokens / n, 1.0), 3) if n > 0 and tokens > 0 else None)
    return out


# -- the replay ------------------------------------------------------------------------------
def draw_load(est: Estimate, seed: int, context_length: int) -> list[dict]:
    """One draw of the estimated load as scenario load phases (one request each)."""
    rng = random.Random(seed)
    phases = []
    for minute, n in enumerate(est.arrivals):
        for _ in range(n):
            offset = min((minute + rng.random()) * BIN_SECONDS, est.duration)
            prompt = min(max(est.prompt.at(offset).draw(rng), 1.0), context_length - 1)
            output = max(est.output.at(offset).draw(rng), 1.0)
            if est.uncached is not None:
                uncached = est.uncached.at(offset).draw(rng)
                cached = min(max(1 - uncached / prompt, 0.0), 1.0)
            else:
                cached = est.cache_hit_ratio or 0.0
            phases.append({"at": round(offset, 3), "burst": 1, "input_tokens": int(prompt),
                           "cached_fraction": round(cached, 4), "output_tokens": int(output),
                           "streaming": 1})
            accept = est.spec_accept_at(offset)
            if accept is not None:  # the minute's, at the current steps
                phases[-1]["spec_accept_length"] = accept
            working = est.working_set_at(offset)
            if working is not None:  # HiCache: the minute's working set
                phases[-1]["working_set_tokens"] = working
    return phases


def scenario_of(est: Estimate, args: dict[str, Any], perf: dict[str, float], load: list[dict],
                name: str) -> scenarios.Scenario:
    return scenarios.from_dict({
        "name": name, "description": f"what-if load estimated from {est.where}",
        "duration": est.duration, "seed": 1, "release": est.release,
        "warm_cache": est.warm_cache, "server": args, "perf": perf, "load": load},
        f"what-if {name}")


# (Summary field, label, unit, the better direction: -1 lower, +1 higher, 0 neither)
FIGURES = (
    ("ttft_p50_seconds", q("time_to_first_token_p50_window").label, "s", -1),
    ("ttft_p95_seconds", q("time_to_first_token_p95_window").label, "s", -1),
    ("ttft_mean_seconds", q("time_to_first_token_mean_window").label, "s", -1),
    ("queue_time_mean_seconds", q("queue_time_mean_window").label, "s", -1),
    ("queue_time_p95_seconds", q("queue_time_p95_window").label, "s", -1),
    ("longest_queueing_seconds", "longest continuous queueing", "s", -1),
    ("queued_seconds", "time with requests queued", "s", -1),
    ("queue_peak", "queue peak", "requests", -1),
    ("pending_peak_tokens", "pending prefill tokens, peak", "tokens", -1),
    ("running_peak", "running requests, peak", "requests", 0),
    ("decode_speed_p10", q("decode_speed_p10_window").label, "tok/s", 1),
    ("decode_speed_median", q("decode_speed_p50_window").label, "tok/s", 1),
    ("itl_mean_seconds", q("inter_token_latency_mean_window").label, "ms", -1),
    ("itl_p95_seconds", q("inter_token_latency_p95_window").label, "ms", -1),
    ("kv_peak_ratio", "KV pool use, peak", "%", 0),
    ("e2e_mean_seconds", q("e2e_request_latency_mean_window").label, "s", -1),
    ("requests", "requests finished", "requests", 0),
)
# Figures the feature calibrations read besides: the prefix cache's share of prompt tokens.
CACHE_FIGURE = ("cache_hit_ratio", q("cache_hit_ratio_window").label, "%", 1)


@dataclass
class Replay:
    current: dict[str, Any]  # the full ServerConfig arguments the model ran with
    proposed: dict[str, Any]
    perf: dict[str, float]
    seeds: list[int]
    before: list[compare.Summary]  # one per seed
    after: list[compare.Summary]

    def values(self, attr: str) -> tuple[list[float], list[float], list[float]]:
        cur = [float(getattr(s, attr)) for s in self.before]
        new = [float(getattr(s, attr)) for s in self.after]
        return cur, new, [b - a for a, b in zip(cur, new, strict=True)]


def server_args(est: Estimate, given: dict[str, Any]) -> dict[str, Any]:
    """The current arguments: the series', then what --current gives (which wins)."""
    return {**est.args, **given}


def replay(est: Estimate, current: dict[str, Any], proposed: dict[str, Any],
           perf: dict[str, float] | None = None, seeds: int = DEFAULT_SEEDS) -> Replay:
    """Both configurations on the same draws of the load, one draw per seed."""
    perf = dict(perf or {})
    now = server_args(est, current)
    new = {**now, **proposed}
    steps = now.get("speculative_num_steps", ServerConfig.speculative_num_steps)
    if new.get("speculative_num_steps", steps) != steps and "spec_accept_steps" not in new:
        new["spec_accept_steps"] = steps  # the accept length was measured at the current steps
    context = int(now.get("context_length", ServerConfig.context_length))
    before, after = [], []
    for seed in range(1, seeds + 1):
        load = draw_load(est, seed, context)
        before.append(compare.summarize(scenario_of(est, now, perf, load, f"current-{seed}")))
        after.append(compare.summarize(scenario_of(est, new, perf, load, f"proposed-{seed}")))
    full = {f.name: getattr(ServerConfig(**now), f.name) for f in dataclasses.fields(
        ServerConfig)}
    return Replay({k: full[k] for k in SCHEDULER_ARGS},
                  {k: {**full, **new}[k] for k in SCHEDULER_ARGS}, perf,
                  list(range(1, seeds + 1)), before, after)


# -- arguments -------------------------------------------------------------------------------
def parse_assignments(flag: str, items: list[str], cls=ServerConfig,
                      known: tuple[str, ...] = SCHEDULER_ARGS) -> dict[str, Any]:
    """KEY=VALUE strings into typed values of `cls`'s fields; a UsageError names the flag."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected NAME=VALUE")
        if key not in known:
            close = difflib.get_close_matches(key, known, 1)
            raise UsageError(f"{flag}: unknown argument {key!r}"
                             + (f" (did you mean {close[0]}?)" if close else "")
                             + f"; the model knows: {', '.join(known)}")
        out[key] = _typed(flag, key, text.strip(), defaults[key])
    return out


def _typed(flag: str, key: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        kind = {bool: "true or false", int: "an integer", float: "a number"}[type(default)]
        raise UsageError(f"{flag} {key}={text!r}: expected {kind}") from None
    if key == "schedule_policy" and text not in POLICIES:
        raise UsageError(f"{flag} {key}={text!r}: the model knows {', '.join(POLICIES)}")
    if key == "speculative_algorithm" and text.lower() in ("", "none", "null"):
        return None
    return text


def check_args(flag: str, args: dict[str, Any]) -> None:
    """Values the model cannot run with: a UsageError naming the flag."""
    for key in ("max_running_requests", "max_prefill_tokens", "num_continuous_decode_steps",
                "max_total_num_tokens", "context_length", "dp_size", "decode_log_interval",
                "speculative_num_steps"):
        if key in args and args[key] < 1:
            raise UsageError(f"{flag} {key}={args[key]}: must be at least 1")
    if "chunked_prefill_size" in args and args["chunked_prefill_size"] == 0:
        raise UsageError(f"{flag} chunked_prefill_size=0: a positive size, or -1 for off")
    if "hicache_ratio" in args and not args["hicache_ratio"] > 0:
        raise UsageError(f"{flag} hicache_ratio={args['hicache_ratio']}: must be positive")
    if args.get("hicache_write_policy", "write_through") not in ("write_through", "write_back"):
        raise UsageError(f"{flag} hicache_write_policy={args['hicache_write_policy']!r}: the "
                         "model knows write_through and write_back")
    if "spec_accept_length" in args and args["spec_accept_length"] < 1:
        raise UsageError(f"{flag} spec_accept_length={args['spec_accept_length']}: at least 1")


# -- output ----------------------------------------------------------------------------------
def _fmt(value: float, unit: str) -> str:
    """`value` in `unit`, through sglang_obs.core.shown: "—" for one that is not finite or out
    of its range (a model run gone wrong must not print 400 digits or "nan")."""
    kind = {"s": "seconds", "ms": "seconds", "%": "ratio", "tok/s": "rate"}.get(unit, "count")
    v = shown.checked(value, kind)
    if v is None:
        return shown.DASH
    if unit == "s":
        return f"{v:.2f} s" if abs(v) < 10 else f"{v:.0f} s"
    if unit == "ms":
        return f"{v * 1000:.1f} ms"
    if unit == "%":
        return f"{v:.0%}" if abs(v) >= 0.005 or v == 0 else f"{v:.1%}"
    if unit == "tok/s":
        return f"{v:.1f} tok/s"
    return f"{v:,.0f}"


def _signed(value: float, unit: str) -> str:
    text = _fmt(abs(value), unit)
    if text == shown.DASH:
        return text
    return ("+" if value > 0 else "−" if value < 0 else "±") + text


def _spread(values: list[float], unit: str, signed: bool = False) -> str:
    f = _signed if signed else _fmt
    median = statistics.median(values)
    if min(values) == max(values):
        return f(median, unit)
    return f"{f(median, unit)} ({f(min(values), unit)} … {f(max(values), unit)})"


def verdict(deltas: list[float], better: int) -> str:
    ups = sum(d > 0 for d in deltas)
    downs = sum(d < 0 for d in deltas)
    n = len(deltas)
    if not ups and not downs:
        return "no change"
    if better:
        good = ups if better > 0 else downs
        bad = downs if better > 0 else ups
        return (f"better in {good}/{n}" if good >= bad else f"worse in {bad}/{n}")
    return f"up in {ups}/{n}" if ups >= downs else f"down in {downs}/{n}"


def describe_load(est: Estimate) -> list[str]:
    n = sum(est.arrivals)
    minutes = len(est.arrivals)
    p, o = est.prompt.overall, est.output.overall
    lines = [
        f"- arrivals: {n} requests in {minutes} min "
        f"({shown.number(n / minutes, '.1f', 'rate')}/min, busiest minute "
        f"{max(est.arrivals)}), estimated from requests {est.arrivals_from}; in the replay "
        "each minute's count arrives at uniform random times within the minute (Poisson "
        "given the count)",
        f"- prompt tokens: mean {_fmt(p.mean, '')}, p50 {_fmt(p.quantile(0.5), '')}, p95 "
        f"{_fmt(p.quantile(0.95), '')} ({est.prompt.source}, per "
        f"{SEGMENT_SECONDS / 60:.0f}-min segment)",
        f"- output tokens: mean {_fmt(o.mean, '')}, p50 {_fmt(o.quantile(0.5), '')}, p95 "
        f"{_fmt(o.quantile(0.95), '')} ({est.output.source})",
    ]
    if est.cache_hit_ratio is not None:
        lines.append(f"- prefix-cache hit ratio "
                     f"{shown.number(est.cache_hit_ratio, '.1%', 'ratio')} over the window"
                     + (f"; per request 1 − uncached/prompt ({est.uncached.source})"
                        if est.uncached else "; given to every request"))
    lines.append(f"- radix cache at the start: {shown.number(est.warm_cache, '.0%', 'ratio')} "
                 "of the KV pool "
                 "(kv_evictable_tokens)")
    return lines + [f"- note: {note}" for note in est.notes]


def describe_args(est: Estimate, rep: Replay, given: dict[str, Any],
                  proposed: dict[str, Any]) -> list[str]:
    def origin(key: str) -> str:
        if key in given:
            return "--current"
        return est.args_from.get(key, "model default")

    current = ", ".join(f"{k}={rep.current[k]} ({origin(k)})" for k in SCHEDULER_ARGS)
    changed = ", ".join(f"{k}={v}" for k, v in proposed.items())
    perf = ", ".join(f"{k}={v:g}" for k, v in rep.perf.items()) or "the model's defaults"
    return [f"- current: {current}", f"- proposed (--set): {changed}",
            f"- hardware timings (--perf): {perf}"]


def markdown(est: Estimate, rep: Replay, given: dict[str, Any], proposed: dict[str, Any]
             ) -> str:
    n = len(rep.seeds)
    lines = [
        "# What-if: model prediction", "",
        "Predicted by the simulator's scheduler model (simulator/model.py) for the load "
        "estimated below, not measured. Verify a change under the same load before trusting "
        "it.", "",
        f"Window {iso(est.start)} – {iso(est.end)} ({est.duration / 60:.0f} min) on "
        f"`{est.instance}`, read from {est.where}; {est.finished} requests finished in it.", "",
        "**Estimated load**", "", *describe_load(est), "",
        "**Arguments**", "", *describe_args(est, rep, given, proposed), "",
        f"**Predicted figures** (median over {n} draws of the load, seeds "
        f"{rep.seeds[0]}–{rep.seeds[-1]}; min … max in brackets; both configurations on "
        "the same draws)", "",
        "| figure (model prediction) | current | proposed | change | |",
        "|---|---|---|---|---|",
    ]
    for attr, label, unit, better in FIGURES:
        cur, new, delta = rep.values(attr)
        lines.append(f"| {label} | {_spread(cur, unit)} | {_spread(new, unit)} | "
                     f"{_spread(delta, unit, signed=True)} | {verdict(delta, better)} |")
    lines += ["", "Time in each state (prefill_backlog, decode_contention, …) is not predicted: "
              "the states come from the recording rules over the live series, which the model "
              "does not produce here; queueing time and peaks stand in for them.", ""]
    return "\n".join(lines)


def document(est: Estimate, rep: Replay, given: dict[str, Any], proposed: dict[str, Any]
             ) -> dict:
    figures = {}
    for attr, label, unit, better in FIGURES:
        cur, new, delta = rep.values(attr)
        figures[attr] = {"label": label, "unit": unit, "better": better, "current": cur,
                         "proposed": new, "delta": delta,
                         "median_delta": statistics.median(delta),
                         "verdict": verdict(delta, better)}
    return {"kind": "model prediction", "estimate": est.document(),
            "current": rep.current, "current_given": given, "proposed_given": proposed,
            "proposed": rep.proposed, "perf": rep.perf, "seeds": rep.seeds,
            "figures": figures,
            "not_predicted": ["time in each state: the recording rules classify live series, "
                              "the model does not produce them here"]}


# -- calibration -----------------------------------------------------------------------------
CALIBRATION_START = 1_700_000_000.0  # any fixed time: the render is deterministic
# Seed 000's effective arguments no series carries: none since the exporter reports
# num_continuous_decode_steps (its value, 2, now comes from the rendered series).
CALIBRATION_CURRENT: dict[str, Any] = {}


def calibration() -> tuple[Estimate, Replay, compare.Summary, compare.Summary]:
    """What-if on the incident's rendered series with seed 000's change, and the shipped
    incident and tuned scenarios simulated directly."""
    from sglang_obs.simulator.render import render

    incident = scenarios.load("long-context-incident")
    rendered = render(incident, start=CALIBRATION_START)
    est = estimate(RenderedSource(rendered, where="the rendered long-context-incident"))
    # The hardware (4x L20) is not in any series: the scenario's timings, as an operator would
    # give them with --perf.
    perf = {k: v for k, v in dataclasses.asdict(incident.perf).items()
            if v != getattr(PerfModel, k)}
    rep = replay(est, CALIBRATION_CURRENT, SEED_000, perf)
    return (est, rep, compare.summarize("long-context-incident"),
            compare.summarize("long-context-incident-tuned"))


# Speculative steps: the collapse scenario estimated from its rendered series, replayed with
# one draft step instead of three, against the scenario simulated directly with one step.
SPEC_SCENARIO = "spec-decoding-collapse"
SPEC_CHANGE = {"speculative_num_steps": 1}
SPEC_FIGURES = ("decode_speed_median", "decode_speed_p10", "itl_mean_seconds", "itl_p95_seconds",
                "e2e_mean_seconds", "ttft_mean_seconds")


def spec_calibration() -> tuple[Estimate, Replay, compare.Summary, compare.Summary]:
    """What-if on the speculative collapse's rendered series with SPEC_CHANGE, and the scenario
    simulated directly with and without it (its accept lengths given at its own steps)."""
    from sglang_obs.simulator.render import render

    sc = scenarios.load(SPEC_SCENARIO)
    est = estimate(RenderedSource(render(sc, start=CALIBRATION_START),
                                  where=f"the rendered {SPEC_SCENARIO}"))
    perf = {k: v for k, v in dataclasses.asdict(sc.perf).items() if v != getattr(PerfModel, k)}
    rep = replay(est, {}, SPEC_CHANGE, perf)
    changed = dataclasses.replace(sc, server=dataclasses.replace(
        sc.server, spec_accept_steps=sc.server.speculative_num_steps, **SPEC_CHANGE))
    return est, rep, compare.summarize(sc), compare.summarize(changed)


# Host pool size: the HiCache scenario estimated from its rendered series, replayed with a
# host pool twice the size, against the scenario simulated directly with it.
HICACHE_SCENARIO = "hicache-host-drops"
HICACHE_CHANGE = {"hicache_ratio": 5.0}
HICACHE_FIGURES = ("cache_hit_ratio", "ttft_p50_seconds", "ttft_p95_seconds",
                   "ttft_mean_seconds", "pending_peak_tokens", "e2e_mean_seconds")


def hicache_calibration() -> tuple[Estimate, Replay, compare.Summary, compare.Summary]:
    from sglang_obs.simulator.render import render

    sc = scenarios.load(HICACHE_SCENARIO)
    est = estimate(RenderedSource(render(sc, start=CALIBRATION_START),
                                  where=f"the rendered {HICACHE_SCENARIO}"))
    perf = {k: v for k, v in dataclasses.asdict(sc.perf).items() if v != getattr(PerfModel, k)}
    rep = replay(est, {}, HICACHE_CHANGE, perf)
    changed = dataclasses.replace(sc, server=dataclasses.replace(sc.server, **HICACHE_CHANGE))
    return est, rep, compare.summarize(sc), compare.summarize(changed)


def direction(simulated: float, predicted: list[float], unit: str) -> str:
    tiny = {"s": 0.05, "ms": 0.0005, "%": 0.005, "tok/s": 0.1}.get(unit, 0.5)
    median = statistics.median(predicted)
    sim_sign = 0 if abs(simulated) < tiny else (1 if simulated > 0 else -1)
    pred_sign = 0 if abs(median) < tiny else (1 if median > 0 else -1)
    if sim_sign == pred_sign:
        return "agrees" if sim_sign else "agrees (no change)"
    return "**disagrees**"


def calibration_table() -> str:
    return _calibration_rows(*calibration(), [attr for attr, *_ in FIGURES],
                             ("incident", "tuned"))


def hicache_calibration_table() -> str:
    return _calibration_rows(*hicache_calibration(), list(HICACHE_FIGURES),
                             ("host pool 2.5x", "host pool 5x"))


def spec_calibration_table() -> str:
    return _calibration_rows(*spec_calibration(), list(SPEC_FIGURES),
                             ("3 steps", "1 step"))


def _calibration_rows(est: Estimate, rep: Replay, before: compare.Summary,
                      after: compare.Summary, attrs: list[str], names: tuple[str, str]) -> str:
    first, second = names
    lines = [
        f"| figure | {first}, simulated | what-if, current | {second}, simulated | what-if, "
        "proposed | change, simulated | change, predicted | error of the change | direction |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for attr, label, unit, _ in (f for f in (*FIGURES, CACHE_FIGURE) if f[0] in attrs):
        cur, new, delta = rep.values(attr)
        sim_before, sim_after = float(getattr(before, attr)), float(getattr(after, attr))
        change = sim_after - sim_before
        error = statistics.median(delta) - change
        lines.append(
            f"| {label} | {_fmt(sim_before, unit)} | {_spread(cur, unit)} | "
            f"{_fmt(sim_after, unit)} | {_spread(new, unit)} | {_signed(change, unit)} | "
            f"{_spread(delta, unit, signed=True)} | {_signed(error, unit)} | "
            f"{direction(change, delta, unit)} |")
    return "\n".join(lines) + "\n"


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"


def _main(argv: list[str]) -> int:
    tables = {"--calibration": calibration_table, "--spec-calibration": spec_calibration_table,
              "--hicache-calibration": hicache_calibration_table}
    if len(argv) != 1 or argv[0] not in tables:
        sys.stderr.write("usage: python -m sglang_obs.simulator.what_if "
                         "--calibration | --spec-calibration | --hicache-calibration\n")
        return 2
    sys.stdout.write(tables[argv[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
