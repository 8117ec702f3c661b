"""`sglang-obs compare`: did the change help? Two windows of one server (or two servers), side by
side, from Prometheus or from snapshot packs (their windows.json: sglang_obs.core.pack).

- the effective configuration of each window (the exporter's sglang_obs_server_config_info
  labels and sglang_obs_config_* gauges) and which arguments changed, and when;
- the load: request rate, prompt and generated tokens/s, the prompt-length mix, cache hits;
- the outcome: TTFT p50/p95, queue time p95, the time with requests queued, decode speed per
  request p10/p50, ITL p95, time in each state, the alerts that fired;
- the energy and cost of the server's host (sglang_obs.tools.capacity energy_figures: power,
  J per prompt and per output token, idle share, cache-saved power, cost per million tokens);
- a verdict only when the loads are comparable (prometheus/thresholds.yml `compare:`): every
  outcome's relative change comes with a 95 % interval from a seeded bootstrap over the
  windows' minutes, and is an improvement or a regression only when the interval excludes 0.

The statistics (per-minute units, bootstrap, comparability, configuration diff, report) are pure
functions of plain data; fetch_window() is the only part that asks Prometheus (a snapshot keeps
what it found, WindowData.to_dict(), for read_pack()). docs/compare.md explains the method.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_obs.core import pack, shown
from sglang_obs.core.cli_support import Failure, UsageError, new_folder, restore_folder
from sglang_obs.core.prometheus_api import Prometheus, PrometheusError
from sglang_obs.core.quantities import q
from sglang_obs.core.settings import Settings, default
from sglang_obs.core.states import STATE_COLOURS, STATES
from sglang_obs.core.times import iso, parse_time
from sglang_obs.exporter.request_records import PROMPT_CLASSES  # shortest first
from sglang_obs.tools import capacity

SCHEMA_VERSION = 1
MINUTE = 60.0
MIN_MINUTES = 2
# The exporter's configuration series: argument -> (series, label of the info metric or None).
CONFIG_INFO = "sglang_obs_server_config_info"
CONFIG_INFO_ARGS = ("model_name", "version", "tp_size", "dp_size", "pp_size", "schedule_policy",
                    "kv_cache_dtype", "speculative_algorithm", "mixed_chunk",
                    "disaggregation_mode")
CONFIG_GAUGES = {
    "max_running_requests": "sglang_obs_max_running_requests",
    "chunked_prefill_size": "sglang_obs_config_chunked_prefill_size_tokens",
    "max_prefill_tokens": "sglang_obs_config_max_prefill_tokens",
    "context_length": "sglang_obs_config_context_length_tokens",
    "num_continuous_decode_steps": "sglang_obs_config_num_continuous_decode_steps",
}


class CompareError(Failure):
    """A comparison that cannot be made (exit 1): no data, an unknown server, no Prometheus."""


class CompareUsageError(CompareError, UsageError):
    """A window that cannot be read or is empty (exit 2)."""


# -- statistics over per-minute units ------------------------------------------------------
# A window is cut into whole minutes; each metric has one unit per minute (None: no data):
# - "ratio": (numerator, denominator), the statistic is sum(num) / sum(den): a rate (den 60 s),
#   a share of time (den 60 s), the cache hit ratio (den: prompt tokens);
# - "hist": the minute's histogram increase, cumulative counts per bucket bound; the statistic
#   is a quantile of the summed histogram (interpolated as Prometheus's histogram_quantile);
# - "samples": the gauge's samples in the minute; the statistic is a quantile of all of them.
Unit = object


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]
                       ) -> float | None:
    """Prometheus's histogram_quantile over one histogram (bounds ascending, the last may be
    +Inf), capped at the top finite bound; None without observations."""
    counts, top = [], 0.0
    for c in cumulative:  # increase() per bucket may be slightly non-monotonic
        top = max(top, c)
        counts.append(top)
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    for i, (bound, c) in enumerate(zip(bounds, counts, strict=True)):
        if c >= rank:
            if math.isinf(bound):
                return bounds[i - 1] if i else None
            lower = bounds[i - 1] if i else 0.0
            below = counts[i - 1] if i else 0.0
            inside = c - below
            return bound if inside <= 0 else lower + (bound - lower) * (rank - below) / inside
    return None


def sample_quantile(q: float, values: Sequence[float]) -> float | None:
    """The q-quantile of `values`, linear between order statistics; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    kind: str  # ratio, hist, samples
    unit: str  # req/s, tokens/s, ratio, s, tok/s, share
    better: str | None  # lower, higher; None for a load figure (no verdict)
    q: float | None = None

    def statistic(self, units: Sequence[Unit | None], bounds: Sequence[float] = ()
                  ) -> float | None:
        present = [u for u in units if u is not None]
        if self.kind == "ratio":
            num = sum(u[0] for u in present)
            den = sum(u[1] for u in present)
            return num / den if den > 0 else None
        if self.kind == "hist":
            if not present:
                return None
            summed = [sum(col) for col in zip(*present, strict=True)]
            return histogram_quantile(self.q, bounds, summed)
        return sample_quantile(self.q, [v for u in present for v in u])


LOAD = (
    Metric("request_rate", "request rate", "ratio", "req/s", None),
    Metric("prompt_tokens_per_second", "prompt tokens/s", "ratio", "tokens/s", None),
    Metric("generation_tokens_per_second", "generated tokens/s", "ratio", "tokens/s", None),
    Metric("cache_hit_ratio", "prefix cache hit ratio", "ratio", "ratio", None),
)
# (key, quantity over the window (core/quantities.py), kind, unit, better, q); and one share.
_OUTCOME = (
    ("ttft_p50_seconds", "time_to_first_token_p50", "hist", "s", "lower", 0.5),
    ("ttft_p95_seconds", "time_to_first_token_p95", "hist", "s", "lower", 0.95),
    ("queue_time_p95_seconds", "queue_time_p95", "hist", "s", "lower", 0.95),
    ("decode_speed_p10", "decode_speed_p10", "samples", "tok/s", "higher", 0.1),
    ("decode_speed_p50", "decode_speed_p50", "samples", "tok/s", "higher", 0.5),
    ("itl_p95_seconds", "inter_token_latency_p95", "hist", "s", "lower", 0.95),
)
OUTCOME = (
    *(Metric(key, q(f"{quantity}_window").label, kind, unit, better, level)
      for key, quantity, kind, unit, better, level in _OUTCOME[:3]),
    Metric("queued_share", "time with requests queued", "ratio", "share", "lower"),
    *(Metric(key, q(f"{quantity}_window").label, kind, unit, better, level)
      for key, quantity, kind, unit, better, level in _OUTCOME[3:]),
)
METRICS = {m.key: m for m in (*LOAD, *OUTCOME)}
# The histogram each hist metric reads (its bounds are the window's `bounds[<histogram>]`).
HISTOGRAM_OF = {"ttft_p50_seconds": "ttft", "ttft_p95_seconds": "ttft",
                "queue_time_p95_seconds": "queue_time", "itl_p95_seconds": "itl"}


@dataclass
class WindowData:
    """What compare reads of one window: plain data, from Prometheus or built by a test."""

    server: str
    start: float
    end: float
    units: dict[str, list]  # metric key -> one unit per minute (None: no data)
    bounds: dict[str, list[float]] = field(default_factory=dict)  # histogram -> bucket bounds
    prompt_mix: dict[str, float] = field(default_factory=dict)  # bucket -> requests
    prompt_mix_source: str = ""
    state_seconds: dict[str, float] = field(default_factory=dict)
    longest_queueing_seconds: float | None = None
    alerts: list[dict] = field(default_factory=list)  # {alertname, severity, episodes, seconds}
    config: dict[str, list[dict]] = field(default_factory=dict)  # arg -> [{value, from, to}]
    energy: dict = field(default_factory=dict)  # capacity.energy_figures of the server's host
    source: str = ""  # where it was read: "Prometheus", "snapshot pack DIR" (not in to_dict)

    @property
    def minutes(self) -> int:
        return max((len(v) for v in self.units.values()), default=0)

    def to_dict(self) -> dict:
        """Plain JSON (a snapshot pack's windows.json): bucket bounds as Prometheus's `le`
        strings ("+Inf"), so no non-finite number is written."""
        doc = dataclasses.asdict(self)
        del doc["source"]
        doc["bounds"] = {h: [_le(b) for b in bounds] for h, bounds in self.bounds.items()}
        return doc

    @classmethod
    def from_dict(cls, doc: dict, source: str = "") -> WindowData:
        """The WindowData to_dict() wrote: a ratio unit is a tuple again."""
        doc = dict(doc)
        doc["bounds"] = {h: [float(b) for b in bounds] for h, bounds in doc["bounds"].items()}
        doc["units"] = {k: [tuple(u) if u is not None and METRICS[k].kind == "ratio" else u
                            for u in units] for k, units in doc["units"].items()}
        return cls(**doc, source=source)


def _le(bound: float) -> str | float:
    return "+Inf" if math.isinf(bound) else bound


def resample_indices(n: int, resamples: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(n) for _ in range(n)] for _ in range(resamples)]


def _stat(metric: Metric, w: WindowData, idx: Sequence[int] | None = None) -> float | None:
    units = w.units.get(metric.key, [])
    if idx is not None:
        units = [units[i] for i in idx if i < len(units)]
    return metric.statistic(units, w.bounds.get(HISTOGRAM_OF.get(metric.key, ""), ()))


@dataclass(frozen=True)
class Change:
    before: float | None
    after: float | None
    relative: float | None  # after / before - 1
    low: float | None  # 95 % bootstrap interval of `relative`
    high: float | None
    reading: str  # improvement, regression, no clear change, "" (a load figure or no data)


def reading(metric: Metric, low: float | None, high: float | None) -> str:
    """improvement / regression only when the interval excludes 0, else no clear change."""
    if metric.better is None:
        return ""
    if low is None or high is None:
        return "no clear change"
    if high < 0:
        return "improvement" if metric.better == "lower" else "regression"
    if low > 0:
        return "regression" if metric.better == "lower" else "improvement"
    return "no clear change"


def compare_metrics(before: WindowData, after: WindowData, resamples: int = 2000,
                    seed: int = 0, paired: bool = False) -> dict[str, Change]:
    """Every metric's point values, relative change and 95 % interval. The minutes of each
    window are resampled with replacement, the same draws for every metric (seeded: the same
    data give the same report); a draw where the before value is 0 or missing is left out, and
    with more than 5 % of them left out there is no interval."""
    rng = random.Random(seed)
    draws_b = resample_indices(before.minutes, resamples, rng) if before.minutes else []
    draws_a = (draws_b if paired else
               resample_indices(after.minutes, resamples, rng) if after.minutes else [])
    out = {}
    for metric in METRICS.values():
        b, a = _stat(metric, before), _stat(metric, after)
        relative = a / b - 1 if a is not None and b else None
        low = high = None
        if relative is not None and draws_b and draws_a:
            changes = []
            for ib, ia in zip(draws_b, draws_a, strict=True):
                rb, ra = _stat(metric, before, ib), _stat(metric, after, ia)
                if rb and ra is not None:
                    changes.append(ra / rb - 1)
            if len(changes) >= 0.95 * resamples:
                low, high = sample_quantile(0.025, changes), sample_quantile(0.975, changes)
        if a is not None and b is not None and a == b == 0:
            low = high = 0.0  # nothing either side (no queueing at all): no change
        out[metric.key] = Change(b, a, relative, low, high,
                                 reading(metric, low, high) if a is not None and b is not None
                                 else "")
    return out


# -- comparability -------------------------------------------------------------------------
def total_variation(p: dict[str, float], q: dict[str, float]) -> float | None:
    """Half the L1 distance between the two normalised distributions (0 equal, 1 disjoint)."""
    sp, sq = sum(p.values()), sum(q.values())
    if sp <= 0 or sq <= 0:
        return None
    return 0.5 * sum(abs(p.get(k, 0) / sp - q.get(k, 0) / sq) for k in set(p) | set(q))


def comparability(changes: dict[str, Change], before: WindowData, after: WindowData,
                  limits: dict) -> dict:
    """{comparable, checks: [{figure, value, limit, ok, text}]}: the load figures against the
    tolerances of thresholds.yml `compare:`. A figure that cannot be measured (no requests,
    no prompt-length series in one window) fails its check: no verdict without evidence."""
    checks = []
    for key, limit_key in (("request_rate", "request_rate_tolerance"),
                           ("prompt_tokens_per_second", "prompt_tokens_per_second_tolerance")):
        c, limit = changes[key], limits[limit_key]
        ok = c.relative is not None and abs(c.relative) <= limit
        text = (f"{METRICS[key].label} {_pct(c.relative)} (tolerance ±{limit:.0%})"
                if c.relative is not None else f"{METRICS[key].label}: not measured in both")
        checks.append({"figure": key, "value": c.relative, "limit": limit, "ok": ok,
                       "text": text})
    limit = limits["prompt_length_max_tvd"]
    same_source = before.prompt_mix_source == after.prompt_mix_source != ""
    tvd = total_variation(before.prompt_mix, after.prompt_mix) if same_source else None
    text = (f"prompt-length mix: total-variation distance "
            f"{shown.number(tvd, '.2f', 'ratio')} (at most {limit:g})"
            if tvd is not None else "prompt-length mix: not measured in both windows")
    checks.append({"figure": "prompt_length_tvd", "value": tvd, "limit": limit,
                   "ok": tvd is not None and tvd <= limit, "text": text})
    return {"comparable": all(c["ok"] for c in checks), "checks": checks}


# -- configuration -------------------------------------------------------------------------
def timeline(points: dict[float, str]) -> list[dict]:
    """Runs of equal values in time order: [{value, from, to}] (unix seconds)."""
    runs: list[dict] = []
    for ts in sorted(points):
        if runs and runs[-1]["value"] == points[ts]:
            runs[-1]["to"] = ts
        else:
            runs.append({"value": points[ts], "from": ts, "to": ts})
    return runs


def config_diff(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> list[dict]:
    """One row per argument seen in either window: {arg, before, after, changed, when}.
    `when` says where a change happened: within a window (at the first time of its new value)
    or between the two windows."""
    rows = []
    for arg in sorted(set(before) | set(after)):
        b, a = before.get(arg, []), after.get(arg, [])
        when = []
        for name, runs in (("before", b), ("after", a)):
            when += [f"within the {name} window at {iso(r['from'])}" for r in runs[1:]]
        if b and a and b[-1]["value"] != a[0]["value"]:
            when.append("between the windows")
        if bool(b) != bool(a):
            when.append("only reported in the " + ("before" if b else "after") + " window")
        rows.append({"arg": arg, "before": " → ".join(r["value"] for r in b) or None,
                     "after": " → ".join(r["value"] for r in a) or None,
                     "changed": bool(when), "when": "; ".join(when)})
    return rows


# -- the result ----------------------------------------------------------------------------
def compare(before: WindowData, after: WindowData, limits: dict,
            resamples: int | None = None, seed: int | None = None,
            paired: bool = False) -> dict:
    """The comparison document (compare.json; schema in docs/compare.md); `limits` is
    thresholds.yml's `compare:` block."""
    resamples = limits["bootstrap_resamples"] if resamples is None else resamples
    seed = limits["bootstrap_seed"] if seed is None else seed
    if paired and before.minutes != after.minutes:
        raise CompareUsageError(f"--paired: the windows must have as many minutes (before "
                                f"{before.minutes}, after {after.minutes})")
    changes = compare_metrics(before, after, resamples, seed, paired)
    judged = comparability(changes, before, after, limits)
    outcome = {m.key: changes[m.key] for m in OUTCOME}
    verdict = {"comparable": judged["comparable"], "checks": judged["checks"]}
    if judged["comparable"]:
        for kind in ("improvement", "regression", "no clear change"):
            verdict[kind.replace(" ", "_")] = [k for k, c in outcome.items()
                                               if c.reading == kind]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "bootstrap": {"resamples": resamples, "seed": seed, "interval": 0.95,
                      "unit": "minute pair" if paired else "minute", "paired": paired},
        "windows": {name: {"server": w.server, "from": iso(w.start), "to": iso(w.end),
                           "minutes": w.minutes, "source": w.source}
                    for name, w in (("before", before), ("after", after))},
        "verdict": verdict,
        "config": config_diff(before.config, after.config),
        "metrics": {k: {"label": METRICS[k].label, "unit": METRICS[k].unit,
                        "side": "load" if METRICS[k].better is None else "outcome",
                        "before": c.before, "after": c.after, "relative_change": c.relative,
                        "interval": None if c.low is None else [c.low, c.high],
                        "reading": c.reading if judged["comparable"] else ""}
                    for k, c in changes.items()},
        "prompt_mix": {"source": before.prompt_mix_source or after.prompt_mix_source,
                       "before": before.prompt_mix, "after": after.prompt_mix},
        "longest_queueing_seconds": {"before": before.longest_queueing_seconds,
                                     "after": after.longest_queueing_seconds},
        "states": {"before": before.state_seconds, "after": after.state_seconds},
        "alerts": {"before": before.alerts, "after": after.alerts},
        "energy": {"before": before.energy, "after": after.energy},
    }
    doc["pages"] = {name: {sev: sum(1 for a in doc["alerts"][name] if a["severity"] == sev)
                           for sev in ("critical", "warning")} for name in ("before", "after")}
    return doc


# -- the human side ------------------------------------------------------------------------
# Every number below is shown through sglang_obs.core.shown: "—" for one that is not finite or
# out of its range (Prometheus answers NaN and ±Inf as values).
def _pct(x: float | None) -> str:
    x = shown.checked(x, "change")
    if x is None:
        return shown.DASH
    text = f"{x:+.1%}" if abs(x) < 0.1 else f"{x:+.0%}"
    return text.replace("-", "−")


def fmt(value: float | None, unit: str) -> str:
    if unit in ("ratio", "share"):
        return shown.number(value, ".1%", "ratio")
    if unit == "s":
        v = shown.checked(value, "seconds")
        return shown.DASH if v is None else f"{v:.2f} s" if v < 10 else f"{v:.1f} s"
    if unit == "req/s":
        return shown.number(value, ".3g", "rate", " req/s")
    if unit == "tok/s":
        return shown.number(value, ".1f", "rate", " tok/s")
    return shown.number(value, ",.0f", "count", f" {unit}")


def _interval(m: dict) -> str:
    if m["relative_change"] is None:
        return "—"
    if m["interval"] is None:
        return f"{_pct(m['relative_change'])} (no interval)"
    lo, hi = m["interval"]
    return f"{_pct(m['relative_change'])} [{_pct(lo)}, {_pct(hi)}]"


def report(doc: dict) -> str:
    w, v = doc["windows"], doc["verdict"]
    b, a = w["before"], w["after"]
    lines = ["# SGLang compare: before and after", "",
             "| | before | after |", "|---|---|---|",
             f"| window | {b['from']} – {b['to']} ({b['minutes']} min) | "
             f"{a['from']} – {a['to']} ({a['minutes']} min) |",
             f"| server | {b['server']} | {a['server']} |", "", "## Verdict", ""]
    checks = "; ".join(c["text"] for c in v["checks"])
    if v["comparable"]:
        lines.append(f"**Comparable load**: {checks}.")
        lines.append("")
        for kind, title in (("improvement", "Improved"), ("regression", "Regressed"),
                            ("no_clear_change", "No clear change")):
            keys = v[kind]
            if keys:
                parts = [f"{doc['metrics'][k]['label']} {_interval(doc['metrics'][k])}"
                         if kind != "no_clear_change" else doc["metrics"][k]["label"]
                         for k in keys]
                lines += [f"- **{title}:** " + "; ".join(parts), ""]
        boot = doc["bootstrap"]
        how = ("paired: minute k of one window with minute k of the other, "
               if boot["paired"] else "")
        lines.append("Changes are after / before − 1 with a 95 % interval from a bootstrap over "
                     f"the windows' minutes ({how}{boot['resamples']} resamples, seed "
                     f"{boot['seed']}); a change is called only when its interval excludes 0.")
    else:
        failed = "; ".join(c["text"] for c in v["checks"] if not c["ok"])
        lines.append(f"**Not comparable**: {failed}. The loads differ, so no improvement or "
                     "regression is called: the numbers below are shown as they are.")
    lines += ["", "## Configuration", ""]
    changed = [r for r in doc["config"] if r["changed"]]
    if changed:
        lines += ["| argument | before | after | changed |", "|---|---|---|---|"]
        lines += [f"| {r['arg']} | {r['before'] or '—'} | {r['after'] or '—'} | {r['when']} |"
                  for r in changed]
    else:
        lines.append("No argument changed (of those the exporter reports).")
    same = [f"{r['arg']}={r['before']}" for r in doc["config"] if not r["changed"]]
    if same:
        lines += ["", "Unchanged: " + ", ".join(same) + "."]
    for side, title in (("load", "Load"), ("outcome", "Outcome")):
        lines += ["", f"## {title}", "", "| | before | after | change [95 % interval] |"
                  + (" reading |" if side == "outcome" else ""),
                  "|---|---|---|---|" + ("---|" if side == "outcome" else "")]
        for m in doc["metrics"].values():
            if m["side"] != side:
                continue
            row = (f"| {m['label']} | {fmt(m['before'], m['unit'])} | "
                   f"{fmt(m['after'], m['unit'])} | {_interval(m)} |")
            lines.append(row + (f" {m['reading'] or '—'} |" if side == "outcome" else ""))
        if side == "load":
            mix = doc["prompt_mix"]
            if mix["source"]:
                lines += ["", f"Prompt-length mix ({mix['source']}): before "
                          f"{_mix(mix['before'])}; after {_mix(mix['after'])}."]
        else:
            lq = doc["longest_queueing_seconds"]
            lines += ["", "Longest continuous queueing (the exporter's "
                      "sglang_obs_queue_nonempty_duration_seconds): before "
                      f"{fmt(lq['before'], 's')}, after {fmt(lq['after'], 's')}."]
    lines += energy_report(doc["energy"])
    lines += ["", "## Time in each state", "", "| state | before | after |", "|---|---|---|"]
    for state in STATES:
        sb, sa = doc["states"]["before"].get(state, 0), doc["states"]["after"].get(state, 0)
        if sb or sa:
            lines.append(f"| {state} | {_share(sb, doc['states']['before'])} | "
                         f"{_share(sa, doc['states']['after'])} |")
    lines += ["", "## Alerts that fired", "", "| | before | after |", "|---|---|---|"]
    for sev in ("critical", "warning"):
        lines.append(f"| {sev} (pages) | {doc['pages']['before'][sev]} | "
                     f"{doc['pages']['after'][sev]} |" if sev == "critical" else
                     f"| {sev} | {doc['pages']['before'][sev]} | {doc['pages']['after'][sev]} |")
    for name in ("before", "after"):
        fired = doc["alerts"][name]
        if fired:
            lines.append("")
            lines.append(f"{name.capitalize()}: " + ", ".join(
                f"{x['alertname']} ({x['severity']}, "
                f"{shown.number(x['seconds'], '.0f', 'seconds', ' s')})" for x in fired) + ".")
    return "\n".join(lines) + "\n"


# (quantity, figure of capacity.energy_figures, cost): the energy and cost rows.
ENERGY_ROWS = (
    ("gpu_power_window", "power_watts", False),
    ("energy_per_prompt_token_window", "joules_per_prompt_token", False),
    ("energy_per_output_token_window", "joules_per_output_token", False),
    ("idle_energy_share_window", "idle_share", False),
    ("cache_saved_power_window", "cache_saved_watts", False),
    ("cost_per_million_prompt_tokens_window", "cost_per_million_prompt_tokens", True),
    ("cost_per_million_output_tokens_window", "cost_per_million_output_tokens", True),
)


def _energy_cell(figure: str, side: dict) -> str:
    value = side.get(figure)
    if figure.startswith("cost_"):
        return capacity.money(value, side.get("currency", ""))
    if figure.startswith("joules_"):
        return capacity.joules(value)
    return capacity.ratio(value) if figure == "idle_share" else capacity.watts(value)


def energy_report(energy: dict) -> list[str]:
    """The "Energy and cost" section: each figure of the servers' hosts before and after, its
    change (no interval: the records are 5 min ratios, not minutes), and what is missing."""
    b, a = energy["before"] or {}, energy["after"] or {}
    lines = ["", "## Energy and cost", "", "| | before | after | change |", "|---|---|---|---|"]
    for key, figure, cost in ENERGY_ROWS:
        x, y = b.get(figure), a.get(figure)
        if cost and x is None and y is None:
            continue  # no price: the line below says how to set one
        change = _pct(y / x - 1) if x and y is not None else shown.DASH
        lines.append(f"| {q(key).label} | {_energy_cell(figure, b)} | {_energy_cell(figure, a)}"
                     f" | {change} |")
    if all(side.get("cost_source") is None for side in (b, a)):
        lines += ["", f"{q('cost_per_million_prompt_tokens_window').label}: "
                  f"{capacity.PRICE_HINT}."]
    for name, side in (("before", b), ("after", a)):
        missing = capacity.missing_line(side) if side else (
            "Not recorded: this window was read by an older release.")
        if missing:
            lines += ["", f"{name.capitalize()}: {missing}"]
    return lines


def _mix(mix: dict[str, float]) -> str:
    total = sum(mix.values())
    if total <= 0:
        return "no requests"
    return ", ".join(f"{k} {shown.number(v / total, '.0%', 'ratio')}"
                     for k, v in mix.items() if v)


def _share(seconds: float, all_states: dict[str, float]) -> str:
    total = sum(all_states.values())
    if not total:
        return shown.DASH
    return (f"{shown.number(seconds / total, '.0%', 'ratio')} "
            f"({shown.number(seconds / 60, '.1f', 'seconds', ' min')})")


def figure(doc: dict, before: WindowData, after: WindowData):
    """compare.png: the prompt-length mix, the TTFT distribution and the time in each state,
    before and after side by side."""
    from sglang_obs.tools.charts import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    colours = {"before": "#7f7f7f", "after": "#1f77b4"}

    def grouped(ax, title, names, series, unit="% of requests"):
        width = 0.4
        for i, (label, values) in enumerate(series.items()):
            ax.bar([x + (i - 0.5) * width for x in range(len(names))], values, width,
                   label=label, color=colours[label])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylabel(unit, fontsize=8)
        ax.legend(fontsize=7)

    mix = doc["prompt_mix"]
    names = list(dict.fromkeys([*mix["before"], *mix["after"]]))
    grouped(axes[0], f"Prompt-length mix ({mix['source'] or 'no data'})", names,
            {n: [100 * x for x in _shares([mix[n].get(k, 0) for k in names])]
             for n in ("before", "after")})
    bounds = before.bounds.get("ttft") or after.bounds.get("ttft") or []
    per = {}
    for name, w in (("before", before), ("after", after)):
        units = [u for u in w.units.get("ttft_p95_seconds", []) if u is not None]
        cum = [sum(c) for c in zip(*units, strict=True)] if units else [0] * len(bounds)
        counts = [c - (cum[i - 1] if i else 0) for i, c in enumerate(cum)]
        per[name] = [100 * x for x in _shares(counts)]
    labels = [f"≤{b:g} s" if not math.isinf(b) else ">" + f"{bounds[-2]:g} s" for b in bounds]
    grouped(axes[1], "Time to first token (SGLang's histogram)", labels, per)
    states = [s for s in STATES if before.state_seconds.get(s) or after.state_seconds.get(s)]
    grouped(axes[2], "Time in each state", states,
            {n: [100 * x for x in _shares([w.state_seconds.get(s, 0) for s in states])]
             for n, w in (("before", before), ("after", after))}, "% of the window")
    for tick, state in zip(axes[2].get_xticklabels(), states, strict=True):
        tick.set_color(STATE_COLOURS.get(state, "#333333"))
    fig.suptitle(f"before {doc['windows']['before']['from']} ({before.server})  vs  after "
                 f"{doc['windows']['after']['from']} ({after.server})", fontsize=9)
    fig.tight_layout()
    return fig


def _shares(values: Sequence[float]) -> list[float]:
    total = sum(values)
    return [v / total if total else 0.0 for v in values]


# -- Prometheus ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    flag: str
    start: float
    end: float


def parse_window(flag: str, pair: Sequence[str], now: float | None = None) -> Window:
    start, end = (parse_time(t, now, flag, CompareUsageError) for t in pair)
    if end <= start:
        raise CompareUsageError(f"{flag}: empty window: {iso(start)} is not before {iso(end)}")
    if end - start < MIN_MINUTES * MINUTE:
        raise CompareUsageError(f"{flag}: the window is {end - start:.0f} s; compare needs at "
                                f"least {MIN_MINUTES} whole minutes")
    return Window(flag, start, end)


# -- snapshot packs ------------------------------------------------------------------------
def pack_windows(prom: Prometheus, start: float, end: float, servers: Sequence[str],
                 s: Settings) -> dict:
    """A snapshot pack's windows.json: fetch_window over the pack's window for each server
    (none when the window is shorter than compare's minimum)."""
    w = Window("--from/--to", start, end)
    long_enough = end - start >= MIN_MINUTES * MINUTE
    return {"schema_version": pack.SCHEMA_VERSION, "window": {"start": start, "end": end},
            "servers": {server: fetch_window(prom, w, server, s).to_dict()
                        for server in servers}
            if long_enough else {}}


def read_pack(flag: str, path: Path, instance: str | None, instance_flag: str) -> WindowData:
    """One side of the comparison from a snapshot pack's windows.json (a PackError, exit 1,
    for a folder that is no pack, an older pack, an unknown server)."""
    doc = pack.read(flag, path, pack.WINDOWS)
    start, end = doc["window"]["start"], doc["window"]["end"]
    if end - start < MIN_MINUTES * MINUTE:
        raise CompareUsageError(f"{flag} {path}: the pack's window is {end - start:.0f} s; "
                                f"compare needs at least {MIN_MINUTES} whole minutes")
    server = pack.pick_server(sorted(doc["servers"]), instance, instance_flag,
                                     f"the pack {flag} {path}", pack.PackError)
    return WindowData.from_dict(doc["servers"][server], source=f"snapshot pack {path}")


def servers_in(prom: Prometheus, w: Window, s: Settings) -> list[str]:
    span = f"{int(w.end - w.start)}s"
    found = prom.query(f"count by (instance) (count_over_time(instance:sglang_state:code"
                       f"[{span}]))", w.end)
    if not found:
        exporter = s.selectors["exporter_job"]
        found = prom.query(f'count by (instance) (count_over_time(sglang_obs_up{{job='
                           f'"{exporter}"}}[{span}]))', w.end)
    return sorted(r["metric"].get("instance", "") for r in found)


def pick_server(prom: Prometheus, w: Window, instance: str | None, flag: str,
                s: Settings) -> str:
    servers = servers_in(prom, w, s)
    if not servers:
        raise CompareError(f"{w.flag}: no data between {iso(w.start)} and {iso(w.end)} in "
                           f"--prometheus {shown.url(prom.url)}: the window is empty, beyond "
                           "retention, or the recording rules are not loaded "
                           "(prometheus/rules/sglang.rules.yml)")
    return pack.pick_server(servers, instance, flag, f"the {w.flag} window",
                                   CompareError)


def _minute_grid(w: Window) -> list[float]:
    """The window's minute ends, at the millisecond Prometheus answers its timestamps in
    (query_range rounds them the same way): a start of 1796222970.1234 still meets its data."""
    n = int((w.end - w.start) // MINUTE)
    return [round(w.start + MINUTE * (k + 1), 3) for k in range(n)]


def _by_minute(prom: Prometheus, expr: str, w: Window) -> dict[tuple, dict[float, float]]:
    grid = _minute_grid(w)
    return prom.query_range(expr, grid[0], grid[-1], MINUTE)


def _first(series: dict[tuple, dict[float, float]]) -> dict[float, float]:
    return next(iter(series.values()), {})


def fetch_window(prom: Prometheus, w: Window, server: str, s: Settings | None = None
                 ) -> WindowData:
    """One window's minutes, distributions, states, alerts and configuration for `server`,
    state and gauge samples at the recording rules' evaluation interval."""
    s = s or default()
    sglang_job, exporter_job = s.selectors["sglang_job"], s.selectors["exporter_job"]
    step = s.evaluation_interval_s
    native = f'job="{sglang_job}", instance="{server}"'
    exporter = f'job="{exporter_job}", instance="{server}"'
    grid = _minute_grid(w)

    def increase(name: str, sel: str, by: str = "") -> dict[tuple, dict[float, float]]:
        return _by_minute(prom, f"sum{f' by ({by})' if by else ''} (increase({name}{{{sel}}}"
                                f"[1m]))", w)

    def ratio_units(num: dict[float, float], den: dict[float, float] | float) -> list:
        return [None if t not in num or (not isinstance(den, float) and t not in den)
                else (num[t], den if isinstance(den, float) else den[t]) for t in grid]

    units: dict[str, list] = {}
    requests = _first(increase("sglang:num_requests_total", native))
    prompt = _first(increase("sglang:prompt_tokens_total", native))
    units["request_rate"] = ratio_units(requests, MINUTE)
    units["prompt_tokens_per_second"] = ratio_units(prompt, MINUTE)
    units["generation_tokens_per_second"] = ratio_units(
        _first(increase("sglang:generation_tokens_total", native)), MINUTE)
    units["cache_hit_ratio"] = ratio_units(_first(increase("sglang:cached_tokens_total", native)),
                                           prompt)
    units["queued_share"] = ratio_units(
        _first(increase("sglang_obs_queue_nonempty_seconds_total", exporter)), MINUTE)
    bounds: dict[str, list[float]] = {}
    for hist, name in (("ttft", "sglang:time_to_first_token_seconds"),
                       ("queue_time", "sglang:queue_time_seconds"),
                       ("itl", "sglang:inter_token_latency_seconds")):
        bounds[hist], minutes = _histogram(increase(name + "_bucket", native, "le"), grid)
        for key, of in HISTOGRAM_OF.items():
            if of == hist:
                units[key] = minutes
    speed = _first(prom.query_range(f'instance:sglang_decode_speed_per_request:max{{instance='
                                    f'"{server}"}}', w.start, w.end, step))
    speed_minutes = [[v for ts, v in speed.items() if t - MINUTE < ts <= t] or None
                     for t in grid]
    units["decode_speed_p10"] = units["decode_speed_p50"] = speed_minutes
    mix, source = _prompt_mix(prom, w, native, exporter)
    states = _first(prom.query_range(f'instance:sglang_state:code{{instance="{server}"}}',
                                     w.start, w.end, step))
    state_seconds: dict[str, float] = {}
    for code in states.values():
        name = STATES[int(code)] if 0 <= int(code) < len(STATES) else "unknown"
        state_seconds[name] = state_seconds.get(name, 0.0) + step
    longest = prom.query(f"max(max_over_time(instance:sglang_queue_nonempty_duration_seconds:"
                         f'max{{instance="{server}"}}[{int(w.end - w.start)}s]))', w.end)
    return WindowData(
        server=server, start=w.start, end=w.end, units=units, bounds=bounds, prompt_mix=mix,
        prompt_mix_source=source, state_seconds=state_seconds,
        longest_queueing_seconds=float(longest[0]["value"][1]) if longest else None,
        alerts=_alerts(prom, w, server, step), config=_config(prom, w, server, exporter_job),
        energy=capacity.server_energy(prom, server, w.start, w.end, step, s))


def _histogram(series: dict[tuple, dict[float, float]], grid: list[float]
               ) -> tuple[list[float], list]:
    """(bounds ascending, one cumulative-count list per minute or None)."""
    by_le = {float(dict(k)["le"]): v for k, v in series.items() if "le" in dict(k)}
    bounds = sorted(by_le)
    minutes = []
    for t in grid:
        if bounds and all(t in by_le[b] for b in bounds):
            minutes.append([by_le[b][t] for b in bounds])
        else:
            minutes.append(None)
    return bounds, minutes


def _window_increase(prom: Prometheus, w: Window, expr: str) -> dict[tuple, float]:
    span = int(w.end - w.start)
    return {tuple(sorted(r["metric"].items())): float(r["value"][1])
            for r in prom.query(f"sum by (le, prompt_class) (increase({expr}[{span}s]))", w.end)}


def _prompt_mix(prom: Prometheus, w: Window, native: str, exporter: str
                ) -> tuple[dict[str, float], str]:
    """Requests per prompt-length bucket: the request records' classes where the exporter
    follows them, else SGLang's prompt-token histogram."""
    classes = _window_increase(prom, w, f"sglang_obs_request_finished_total{{{exporter}}}")
    by_class = {dict(k).get("prompt_class", ""): v for k, v in classes.items()}
    if sum(by_class.values()) > 0:
        order = [c for c in PROMPT_CLASSES if c in by_class] + sorted(
            set(by_class) - set(PROMPT_CLASSES))
        return {c: by_class[c] for c in order}, "request records"
    hist = _window_increase(prom, w, f"sglang:prompt_tokens_histogram_bucket{{{native}}}")
    cumulative = sorted((float(dict(k)["le"]), v) for k, v in hist.items() if "le" in dict(k))
    if not cumulative or cumulative[-1][1] <= 0:
        return {}, ""
    mix, below = {}, 0.0
    for bound, c in cumulative:
        mix[f"≤{bound:g}" if not math.isinf(bound) else "more"] = max(c - below, 0.0)
        below = max(below, c)
    return mix, "SGLang prompt-token histogram"


def _alerts(prom: Prometheus, w: Window, server: str, step: float) -> list[dict]:
    series = prom.query_range('ALERTS{alertstate="firing"}', w.start, w.end, step)
    out = []
    for key, points in series.items():
        labels = dict(key)
        if labels.get("alertname") == "Watchdog" or labels.get("instance") not in (server,
                                                                                   None):
            continue
        times = sorted(points)
        episodes = 1 + sum(1 for x, y in zip(times, times[1:], strict=False)
                           if y - x > 1.5 * step)
        out.append({"alertname": labels.get("alertname", ""),
                    "severity": labels.get("severity", ""), "episodes": episodes,
                    "seconds": len(times) * step, "first_firing": iso(times[0])})
    return sorted(out, key=lambda a: (a["first_firing"], a["alertname"]))


def _config(prom: Prometheus, w: Window, server: str, exporter_job: str) -> dict[str, list]:
    sel = f'job="{exporter_job}", instance="{server}"'
    out: dict[str, list] = {}
    info = prom.query_range(f"{CONFIG_INFO}{{{sel}}}", w.start, w.end, MINUTE)
    for arg in CONFIG_INFO_ARGS:
        points = {ts: dict(k)[arg] for k, pts in info.items() if arg in dict(k) for ts in pts}
        if points:
            out[arg] = timeline(points)
    for arg, name in CONFIG_GAUGES.items():
        points = _first(prom.query_range(f"max({name}{{{sel}}})", w.start, w.end, MINUTE))
        if points:
            out[arg] = timeline({ts: f"{v:g}" for ts, v in points.items()})
    for runs in out.values():
        for r in runs:
            r["from_iso"], r["to_iso"] = iso(r["from"]), iso(r["to"])
    return out


# -- the command ---------------------------------------------------------------------------
def run(prometheus_url: str, before: Sequence[str] | None, after: Sequence[str] | None,
        instance: str | None = None, after_instance: str | None = None,
        out: Path | None = None, resamples: int | None = None, seed: int | None = None,
        paired: bool = False, before_pack: Path | None = None,
        after_pack: Path | None = None, s: Settings | None = None) -> tuple[dict, str]:
    """Compare the two windows, each from Prometheus (`before`, `after`: two times) or from a
    snapshot pack (`before_pack`, `after_pack`); with `out`, write report.md, compare.json and
    compare.png there (a new or empty folder, left as found on failure). (document, report)."""
    s = s or default()
    now = time.time()
    after_flag = "--after-instance" if after_instance else "--instance"
    sides = (("--before", before, before_pack, instance, "--instance"),
             ("--after", after, after_pack, after_instance or instance, after_flag))
    for name, pair, path, *_ in sides:  # the command line first, then the packs
        if (pair is None) == (path is None):
            raise CompareUsageError(f"give one of {name} START END and {name}-pack DIR")
    windows = [parse_window(name, pair, now) if pair is not None else None
               for name, pair, *_ in sides]
    data = [read_pack(f"{name}-pack", path, server, flag) if path is not None else None
            for name, _, path, server, flag in sides]
    created = False
    if out is not None:
        out, created = new_folder("--out", out)
    try:
        prom = Prometheus(prometheus_url) if None in data else None
        servers = [pick_server(prom, w, server, flag, s) if w else None
                   for w, (*_, server, flag) in zip(windows, sides, strict=True)]
        for i, w in enumerate(windows):
            if w is not None:
                data[i] = dataclasses.replace(fetch_window(prom, w, servers[i], s),
                                              source="Prometheus")
        data_b, data_a = data
        doc = compare(data_b, data_a, s.thresholds["compare"], resamples=resamples, seed=seed,
                      paired=paired)
        text = report(doc)
        if out is not None:
            (out / "compare.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            (out / "report.md").write_text(text + "\n![compare.png](compare.png)\n")
            fig = figure(doc, data_b, data_a)
            fig.savefig(out / "compare.png", dpi=80)
            from sglang_obs.tools.charts import pyplot

            pyplot().close(fig)
        return doc, text
    except PrometheusError as err:
        restore_folder(out, created)
        raise CompareError(f"--prometheus: {err}") from None
    except OSError as err:
        restore_folder(out, created)
        raise CompareError(f"--out {out}: cannot write ({err.strerror or err})") from None
    except BaseException:
        restore_folder(out, created)
        raise
