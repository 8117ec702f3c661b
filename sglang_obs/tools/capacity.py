"""`sglang-obs capacity`: how many tokens per second a GPU gives at the SLO observed, what a token
costs in joules and money, and how much load a server carried before it first saturated.

Per server of a window, from Prometheus or from a snapshot pack (its capacity.json, which the
snapshot writes with collect() below, so both give the same figures):
- tokens per second per GPU by mode (prefill computed, prefill from the prefix cache, decode),
  mean and peak 5 min rate, next to the TTFT and ITL SLO attainment over the window (the share
  of requests, of output tokens, within thresholds.yml's `slo:` thresholds);
- the energy and cost figures of its host's GPUs (energy_figures(): J per prompt token and per
  output token, mean power, idle share, the power the prefix cache saves, cost per million
  tokens at thresholds.yml's `cost.gpu_hour_price`);
- the headroom: the highest load (requests/s, tokens/s, 5 min rates) reached while the server
  was healthy, against the load at which it first entered a saturation state.

collect() is the only part that asks Prometheus; the figures are pure functions of its document.
The records it reads are named by sglang_obs/render/energy_rules.py and sglang_obs/core/scaling.py,
never typed here; docs/capacity.md explains each figure and its limits.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from sglang_obs.core import pack, scaling, shown
from sglang_obs.core.cli_support import Failure, UsageError
from sglang_obs.core.prometheus_api import Prometheus, PrometheusError
from sglang_obs.core.quantities import TOKEN_MODES, q
from sglang_obs.core.settings import Settings, default
from sglang_obs.core.states import STATES
from sglang_obs.core.times import iso, parse_time
from sglang_obs.render import energy_rules as energy

SCHEMA_VERSION = 1
MINUTE = 60.0
SATURATION = ("prefill_backlog", "decode_contention", "kv_capacity", "scheduling_bottleneck")
HEALTHY = ("idle", "healthy")  # answering and not saturated
PROMPT_MODES = ("prefill_compute", "prefill_cache")  # TOKENS' modes of prompt tokens
# The per-host records a pack keeps (each by (cluster, host), some by mode too).
HOST_RECORDS = (energy.POWER, energy.GPUS, energy.TOKENS, energy.ENERGY_PER_TOKEN,
                energy.IDLE_SHARE, energy.CACHE_SAVED_POWER, energy.COST_PER_TOKEN)
ENERGY_RECORDS = (energy.POWER, energy.ENERGY_PER_TOKEN, energy.IDLE_SHARE,
                  energy.CACHE_SAVED_POWER)  # what the energy figures need (no cost, no GPUs)
POOL_RECORDS = (scaling.SERVERS, scaling.LOAD, scaling.DESIRED, scaling.RECOMMENDED)
POOL_WORDS = {scaling.SERVERS: "servers answering", scaling.LOAD: "load in servers at target",
              scaling.DESIRED: "desired", scaling.RECOMMENDED: "recommended"}
# Per-server series at the window's step: name -> PromQL, one series per instance.
SERVER_SERIES = {
    "state": "max by (instance) (instance:sglang_state:code)",
    "request_rate": "sum by (instance) (instance_model:sglang_num_requests:rate5m)",
    "token_rate": "sum by (instance) (instance_model:sglang_prompt_tokens:rate5m) + "
                  "sum by (instance) (instance_model:sglang_generation_tokens:rate5m)",
}
# The SLO's histograms (thresholds.yml slo: <key>): counted per minute, within the threshold
# (its bucket) and in all.
SLO_HISTOGRAMS = {"ttft": "sglang:time_to_first_token_seconds",
                  "itl": "sglang:inter_token_latency_seconds"}
SLO_COUNTED = {"ttft": "requests", "itl": "output tokens"}
PRICE_HINT = ("no price set: put the price of one GPU-hour in prometheus/thresholds.yml "
              "`cost.gpu_hour_price` (currency `cost.currency`), then regenerate the rules "
              "(`sglang-obs rules`)")


class CapacityError(Failure):
    """Capacity that cannot be read (exit 1): no data, an unknown server, no Prometheus."""


class CapacityUsageError(CapacityError, UsageError):
    """A window that cannot be read or is empty (exit 2)."""


# -- Prometheus: the one place this command asks it ----------------------------------------
def _points(series: dict[float, float]) -> list[list[float]]:
    return [[t, v] for t, v in sorted(series.items())]


def host_key(cluster: str, host: str) -> str:
    return f"{cluster}/{host}" if cluster else host


def _hosts_of(prom: Prometheus, start: float, end: float, s: Settings) -> dict[str, tuple]:
    """instance -> (cluster, host) of SGLang's own series in the window (empty labels where
    the scrape names none, as in a backfill)."""
    job = s.selectors["sglang_job"]
    span = max(int(end - start), 1)
    found = prom.query(f'group by (cluster, host, instance) (count_over_time('
                       f'sglang:num_requests_total{{job="{job}"}}[{span}s]))', end)
    return {r["metric"].get("instance", ""): (r["metric"].get("cluster", ""),
                                              r["metric"].get("host", "")) for r in found}


def _by_labels(prom: Prometheus, record: str, labels: Sequence[str], start: float, end: float,
               step: float, where: str = "") -> dict[tuple, dict[str, list]]:
    """`record`'s series grouped by `labels`: {(label values): {mode or "": points}}."""
    out: dict[tuple, dict[str, list]] = {}
    for key, points in prom.query_range(f"{record}{where}", start, end, step).items():
        d = dict(key)
        out.setdefault(tuple(d.get(x, "") for x in labels), {})[d.get("mode", "")] = \
            _points(points)
    return out


def _minute_grid(start: float, end: float) -> list[float]:
    n = int((end - start) // MINUTE)
    return [round(start + MINUTE * (k + 1), 3) for k in range(n)]


def host_records(prom: Prometheus, hosts: Sequence[tuple], start: float, end: float,
                 step: float) -> dict[str, dict]:
    """Every HOST_RECORDS series of `hosts` ((cluster, host) pairs), per host key."""
    out = {host_key(c, h): {"cluster": c, "host": h, "records": {}} for c, h in hosts}
    for record in HOST_RECORDS:
        for (c, h), modes in _by_labels(prom, record, ("cluster", "host"), start, end,
                                        step).items():
            if (c, h) in hosts:
                out[host_key(c, h)]["records"][record] = modes
    return out


def collect(prom: Prometheus, start: float, end: float, step: float, s: Settings,
            servers: Sequence[str] | None = None, check: bool = True) -> dict:
    """capacity.json: the window's servers (all, or `servers`), their state, load and SLO
    counts, the records of their hosts and the replica records of their clusters. With
    `check`, a window without servers, or a server of `servers` not in it, is a CapacityError
    (the snapshot, which found its servers itself, passes False)."""
    series = {name: {dict(k).get("instance", ""): v for k, v in
                     prom.query_range(expr, start, end, step).items()}
              for name, expr in SERVER_SERIES.items()}
    found = sorted(series["state"])
    if check and not found:
        raise CapacityError(f"--from/--to: no data between {iso(start)} and {iso(end)} in "
                            f"--prometheus {shown.url(prom.url)}: the window is empty, beyond "
                            "retention, or the recording rules are not loaded "
                            "(prometheus/rules/sglang.rules.yml)")
    for name in servers or () if check else ():
        if name not in found:
            raise CapacityError(f"--server: unknown instance {name}; servers in this window: "
                                f"{', '.join(found)}")
    chosen = list(servers) if servers else found
    hosts_of = _hosts_of(prom, start, end, s)
    host_of = {i: hosts_of.get(i, ("", "")) for i in chosen}
    job = s.selectors["sglang_job"]
    grid = _minute_grid(start, end)
    slo_minutes: dict[str, dict] = {}
    for key, hist in SLO_HISTOGRAMS.items():
        threshold = s.thresholds["slo"][key]["threshold_seconds"]
        for part, expr in (("within", f'{hist}_bucket{{job="{job}", le="{threshold}"}}'),
                           ("total", f'{hist}_count{{job="{job}"}}')):
            got = (prom.query_range(f"sum by (instance) (increase({expr}[1m]))", grid[0],
                                    grid[-1], MINUTE) if grid else {})
            slo_minutes[f"{key}_{part}"] = {dict(k).get("instance", ""): v
                                            for k, v in got.items()}
    clusters = {c for c, _ in host_of.values()}
    pools: dict[str, dict] = {}
    for record in POOL_RECORDS:
        for (c, p), modes in _by_labels(prom, record, ("cluster", "pool"), start, end,
                                        step).items():
            if c in clusters:
                pools.setdefault(host_key(c, p), {"cluster": c, "pool": p, "records": {}})[
                    "records"][record] = modes.get("", [])
    return {
        "schema_version": SCHEMA_VERSION,
        "window": {"start": start, "end": end, "step_seconds": step},
        "slo": {k: dict(s.thresholds["slo"][k]) for k in SLO_HISTOGRAMS},
        "cost": dict(s.thresholds.get("cost") or {}),
        "servers": {i: {"host": host_key(*host_of[i]),
                        "series": {name: _points(series[name].get(i, {}))
                                   for name in SERVER_SERIES},
                        "slo_minutes": {name: _points(v.get(i, {}))
                                        for name, v in slo_minutes.items()}}
                    for i in chosen},
        "hosts": host_records(prom, sorted(set(host_of.values())), start, end, step),
        "pools": {k: pools[k] for k in sorted(pools)},
    }


def server_energy(prom: Prometheus, server: str, start: float, end: float, step: float,
                  s: Settings) -> dict:
    """energy_figures() of `server`'s host over a window (what compare shows)."""
    hosts_of = _hosts_of(prom, start, end, s)
    host = hosts_of.get(server, ("", ""))
    records = host_records(prom, [host], start, end, step)[host_key(*host)]["records"]
    return energy_figures(records, start, end, price_of(s), currency_of(s))


def price_of(s: Settings) -> float | None:
    """thresholds.yml's cost.gpu_hour_price, read as the cost rules read it."""
    return energy.price(s.thresholds)


def currency_of(s: Settings) -> str:
    return energy.currency(s.thresholds)


# -- the figures: pure functions of the document --------------------------------------------
def _within(points: Sequence, start: float, end: float) -> dict[float, float]:
    return {t: v for t, v in points if start - 1e-6 <= t <= end + 1e-6 and math.isfinite(v)}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _weighted(ratio: dict[float, float], weight: dict[float, float]) -> float | None:
    """Σ ratio·weight / Σ weight over the times both have: a window's J per token from the
    5 min ratios, each counted by the tokens it covered."""
    both = [t for t in ratio if t in weight and weight[t] > 0]
    total = sum(weight[t] for t in both)
    return sum(ratio[t] * weight[t] for t in both) / total if total > 0 else None


def _sum_modes(modes: dict[str, dict[float, float]], names: Sequence[str]) -> dict:
    """The sum of the modes `names` at the times all of them have."""
    present = [modes[m] for m in names if m in modes]
    if len(present) != len(names):
        return {}
    times = set.intersection(*(set(p) for p in present))
    return {t: sum(p[t] for p in present) for t in times}


def energy_figures(records: dict, start: float, end: float, price: float | None = None,
                   currency: str = "") -> dict:
    """The energy and cost of one host over [start, end], from its HOST_RECORDS samples
    ({record: {mode or "": [[t, v], ...]}}): mean power (W), J per prompt token and per output
    token (each 5 min ratio weighted by the tokens it covered), mean idle share and cache-saved
    power, cost per million prompt and output tokens (from the cost record where Prometheus
    recorded it, else at `price` per GPU-hour, else None), and the records that had no data."""
    got = {r: {m: _within(p, start, end) for m, p in modes.items()}
           for r, modes in records.items()}
    got = {r: {m: p for m, p in modes.items() if p} for r, modes in got.items()}

    def one(record):
        return got.get(record, {}).get("", {})

    tokens = got.get(energy.TOKENS, {})
    prompt = _sum_modes(tokens, PROMPT_MODES)
    output = tokens.get("decode", {})
    per_token = got.get(energy.ENERGY_PER_TOKEN, {})
    power = _mean(list(one(energy.POWER).values()))
    gpus = max(one(energy.GPUS).values(), default=None)
    j_prompt = _weighted(per_token.get("prefill", {}), prompt)
    j_output = _weighted(per_token.get("decode", {}), output)
    recorded = got.get(energy.COST_PER_TOKEN, {})
    cost_source, cost = None, {"prompt": None, "output": None}
    if recorded:
        cost = {"prompt": _weighted(recorded.get("prefill", {}), prompt),
                "output": _weighted(recorded.get("decode", {}), output)}
        cost_source = "recorded"
    elif price is not None and power and gpus:
        # The GPU-hours of the window split as the energy is: per token, J/token × GPUs ×
        # price per GPU-second / W.
        cost = {k: None if j is None else j * gpus * price / 3600 / power
                for k, j in (("prompt", j_prompt), ("output", j_output))}
        cost_source = "price"
    return {
        "power_watts": power, "gpus": gpus,
        "joules_per_prompt_token": j_prompt, "joules_per_output_token": j_output,
        "idle_share": _mean(list(one(energy.IDLE_SHARE).values())),
        "cache_saved_watts": _mean(list(one(energy.CACHE_SAVED_POWER).values())),
        "cost_per_million_prompt_tokens": None if cost["prompt"] is None
        else cost["prompt"] * 1e6,
        "cost_per_million_output_tokens": None if cost["output"] is None
        else cost["output"] * 1e6,
        "cost_source": cost_source, "currency": currency,
        "price_per_gpu_hour": price if cost_source == "price" else None,
        "missing": [r for r in (*ENERGY_RECORDS, energy.TOKENS, energy.GPUS) if not got.get(r)],
    }


def throughput(records: dict, start: float, end: float) -> dict:
    """Tokens per second per GPU by mode over [start, end]: {gpus, per_gpu: {mode: {mean,
    peak}}} (per_gpu None without a GPU count; the host's tokens/s in `per_host` either way)."""
    tokens = {m: _within(p, start, end) for m, p in records.get(energy.TOKENS, {}).items()}
    gpus_series = _within(records.get(energy.GPUS, {}).get("", []), start, end)
    gpus = max(gpus_series.values(), default=None)
    per_host = {m: {"mean": _mean(list(tokens[m].values())),
                    "peak": max(tokens[m].values(), default=None)}
                for m in TOKEN_MODES if tokens.get(m)}
    per_gpu = None
    if gpus:
        per_gpu = {}
        for m in TOKEN_MODES:
            if not tokens.get(m):
                continue
            # each sample over the GPUs the host had then (the last count known before it)
            ratios = [v / g for t, v in sorted(tokens[m].items())
                      if (g := _at(gpus_series, t) or gpus)]
            per_gpu[m] = {"mean": _mean(ratios), "peak": max(ratios, default=None)}
    return {"gpus": gpus, "per_host": per_host, "per_gpu": per_gpu}


def _at(series: dict[float, float], t: float) -> float | None:
    before = [x for x in series if x <= t + 1e-6]
    return series[max(before)] if before else None


def slo_attainment(doc: dict, server: dict, start: float, end: float) -> dict:
    """{ttft, itl}: {threshold_seconds, objective, attainment (share within), total counted}
    over the whole minutes of [start, end]."""
    out = {}
    for key in SLO_HISTOGRAMS:
        minutes = server["slo_minutes"]
        within = _within(minutes.get(f"{key}_within", []), start + MINUTE, end)
        total = _within(minutes.get(f"{key}_total", []), start + MINUTE, end)
        times = [t for t in total if t in within]
        n = sum(total[t] for t in times)
        ok = sum(within[t] for t in times)
        out[key] = {"threshold_seconds": float(doc["slo"][key]["threshold_seconds"]),
                    "objective": doc["slo"][key].get("objective"),
                    "counted": SLO_COUNTED[key], "total": n if times else None,
                    "attainment": min(ok / n, 1.0) if n > 0 else None}
    return out


def headroom(server: dict, start: float, end: float) -> dict:
    """The load (5 min rates) the server carried: its mean, the highest while it was healthy,
    the load when it first entered a saturation state, and the peak."""
    series = {n: _within(server["series"].get(n, []), start, end) for n in SERVER_SERIES}
    states = {t: STATES[int(v)] if 0 <= int(v) < len(STATES) else "unknown"
              for t, v in series["state"].items()}
    load = ("request_rate", "token_rate")

    def best(times):
        out = {}
        for name in load:
            vals = {t: series[name][t] for t in times if t in series[name]}
            t = max(vals, key=lambda x: (vals[x], -x)) if vals else None
            out[name] = None if t is None else {"value": vals[t], "at": iso(t)}
        return out

    saturated = sorted(t for t, st in states.items() if st in SATURATION)
    first = None
    if saturated:
        t = saturated[0]
        first = {"state": states[t], "at": iso(t),
                 **{n: series[n].get(t) for n in load}}
    healthy_times = [t for t, st in states.items() if st in HEALTHY]
    return {
        "mean": {n: _mean(list(series[n].values())) for n in load},
        "peak_healthy": best(healthy_times),
        "peak": best(list(series["state"]) or list(series["request_rate"])),
        "first_saturation": first,
        "states_seen": sorted({st for st in states.values()}, key=_state_order),
    }


def _state_order(state: str) -> int:
    return STATES.index(state) if state in STATES else len(STATES)


def figures(doc: dict, start: float | None = None, end: float | None = None,
            price: float | None = None, currency: str | None = None) -> dict:
    """Every server's capacity figures over [start, end] (default: the document's window),
    the JSON of `sglang-obs capacity --json`."""
    w = doc["window"]
    start = w["start"] if start is None else start
    end = w["end"] if end is None else end
    cost = doc.get("cost") or {}
    if price is None:
        price = cost.get("gpu_hour_price") if isinstance(cost.get("gpu_hour_price"),
                                                         int | float) else None
    currency = currency if currency is not None else str(cost.get("currency") or "")
    servers = {}
    for name, server in doc["servers"].items():
        host = doc["hosts"].get(server["host"], {"cluster": "", "host": "", "records": {}})
        records = host["records"]
        on_host = sorted(n for n, x in doc["servers"].items() if x["host"] == server["host"])
        servers[name] = {
            "host": {"cluster": host.get("cluster", ""), "host": host.get("host", ""),
                     "servers": on_host},
            "slo": slo_attainment(doc, server, start, end),
            "throughput": throughput(records, start, end),
            "energy": energy_figures(records, start, end, price, currency),
            "headroom": headroom(server, start, end),
        }
    pools = {}
    for key, pool in doc.get("pools", {}).items():
        got = {r: _within(p, start, end) for r, p in pool["records"].items()}
        pools[key] = {"cluster": pool["cluster"], "pool": pool["pool"],
                      **{r: {"mean": _mean(list(v.values())),
                             "last": v[max(v)] if v else None} for r, v in got.items()}}
    return {"schema_version": SCHEMA_VERSION,
            "window": {"from": iso(start), "to": iso(end)},
            "servers": servers, "pools": pools}


# -- the human side --------------------------------------------------------------------------
# Every number through sglang_obs.core.shown: "—" for one that is not finite or out of range.
watts, joules = shown.watts, shown.joules


def rate(v, unit: str) -> str:
    x = shown.checked(v, "rate")
    if x is None:
        return shown.DASH
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.3g} {unit}"


def money(v, currency: str) -> str:
    x = shown.checked(v, "rate")
    return shown.DASH if x is None else f"{x:,.2f} {currency}" if x >= 1 else \
        f"{x:.3g} {currency}"


def ratio(v) -> str:
    x = shown.checked(v, "ratio")
    return shown.DASH if x is None else f"{x:.1%}" if x < 0.999 or x == 1 else f"{x:.2%}"


def energy_lines(e: dict) -> list[str]:
    """The energy and cost of one host as "label: value" lines, and what is missing: the
    snapshot report and the capacity output print them."""
    lines = [f"{q('gpu_power_window').label}: {watts(e['power_watts'])}",
             f"{q('energy_per_prompt_token_window').label}: "
             f"{joules(e['joules_per_prompt_token'])}",
             f"{q('energy_per_output_token_window').label}: "
             f"{joules(e['joules_per_output_token'])}",
             f"{q('idle_energy_share_window').label}: {ratio(e['idle_share'])}",
             f"{q('cache_saved_power_window').label}: {watts(e['cache_saved_watts'])}"]
    lines += cost_lines(e)
    return lines


def cost_lines(e: dict) -> list[str]:
    if e["cost_source"] is None:
        return [f"{q('cost_per_million_prompt_tokens_window').label}: {PRICE_HINT}"]
    how = ("recorded by Prometheus" if e["cost_source"] == "recorded" else
           f"at {e['price_per_gpu_hour']:g} {e['currency']} per GPU-hour")
    return [f"{q('cost_per_million_prompt_tokens_window').label}: "
            f"{money(e['cost_per_million_prompt_tokens'], e['currency'])} ({how})",
            f"{q('cost_per_million_output_tokens_window').label}: "
            f"{money(e['cost_per_million_output_tokens'], e['currency'])} ({how})"]


def missing_line(e: dict) -> str | None:
    if not e["missing"]:
        return None
    return ("Not recorded in this window: " + ", ".join(e["missing"]) + " (the energy rules "
            "need the exporter's GPU energy counters, NVML, and SGLang 0.5.7+'s "
            "sglang:realtime_tokens_total: docs/capacity.md).")


def _slo_text(slo: dict) -> str:
    parts = []
    for key, label in (("ttft", "ttft_slo_attainment_window"),
                       ("itl", "itl_slo_attainment_window")):
        x = slo[key]
        objective = (f" (objective {shown.number(x['objective'], '.0%', 'ratio')})"
                     if x["objective"] is not None else "")
        if x["attainment"] is None:
            parts.append(f"{q(label).label}: no {x['counted']} counted")
            continue
        parts.append(f"{q(label).label}: {ratio(x['attainment'])} of "
                     f"{shown.number(x['total'], ',.0f')} {x['counted']} within "
                     f"{x['threshold_seconds']:g} s{objective}")
    return "; ".join(parts)


def _load(point: dict | None, name: str) -> str:
    unit = "req/s" if name == "request_rate" else "tokens/s"
    if point is None:
        return shown.DASH
    return f"{rate(point['value'], unit)} at {point['at']}"


def report(result: dict) -> str:
    w = result["window"]
    lines = [f"# SGLang capacity {w['from']} – {w['to']}", ""]
    for name, x in result["servers"].items():
        h, t, e, room = x["host"], x["throughput"], x["energy"], x["headroom"]
        where = (f"Host {h['host']}" + (f" of cluster {h['cluster']}" if h["cluster"] else "")
                 if h["host"] else "Its host (its series carry no host label)")
        shared = [o for o in h["servers"] if o != name]
        gpus = (f"{shown.number(t['gpus'], ',.0f')} GPUs" if t["gpus"] else
                "GPU count not recorded")
        lines += [f"## {name}", "",
                  f"{where}: {gpus}"
                  + (f"; shared with {', '.join(shared)}: host figures are theirs together"
                     if shared else "") + ".", ""]
        lines += ["**Throughput at the SLO observed.** " + _slo_text(x["slo"]) + ".", ""]
        if t["per_gpu"] or t["per_host"]:
            per = t["per_gpu"] or t["per_host"]
            unit = ("per second per GPU" if t["per_gpu"] else
                    "per second on the host (no GPU count)")
            lines += [f"| tokens {unit} | mean over the window | peak 5 min rate |",
                      "|---|---|---|"]
            for mode, subject in TOKEN_MODES.items():
                if mode in per:
                    lines.append(f"| {subject} | {rate(per[mode]['mean'], 'tokens/s')} | "
                                 f"{rate(per[mode]['peak'], 'tokens/s')} |")
            lines.append("")
        else:
            lines += [f"Tokens by mode not recorded ({energy.TOKENS}: SGLang 0.5.7+ and the "
                      "energy rules).", ""]
        lines += ["**Energy and cost** (the host's GPUs):", ""]
        lines += [f"- {line}" for line in energy_lines(e)]
        missing = missing_line(e)
        lines += ["", missing, ""] if missing else [""]
        lines += ["**Headroom** (load as 5 min rates):", ""]
        mean = room["mean"]
        lines.append(f"- {q('request_rate_window').label}: "
                     f"{rate(mean['request_rate'], 'req/s')}; "
                     f"{q('token_rate_window').label}: {rate(mean['token_rate'], 'tokens/s')}")
        ph = room["peak_healthy"]
        lines.append(f"- highest while healthy: {q('request_rate_5m').label} "
                     f"{_load(ph['request_rate'], 'request_rate')}; "
                     f"{q('token_rate_5m').label} {_load(ph['token_rate'], 'token_rate')}")
        first = room["first_saturation"]
        if first is None:
            peak = room["peak"]
            lines.append(f"- never saturated in this window: the server carries at least its "
                         f"peak, {_load(peak['request_rate'], 'request_rate')} and "
                         f"{_load(peak['token_rate'], 'token_rate')} (a lower bound)"
                         + _times(peak, mean) + ".")
        else:
            lines.append(f"- first saturation: **{first['state']}** at {first['at']}, under "
                         f"{rate(first['request_rate'], 'req/s')} and "
                         f"{rate(first['token_rate'], 'tokens/s')}"
                         + _times({n: {"value": first[n]} if first[n] is not None else None
                                   for n in ("request_rate", "token_rate")}, mean)
                         + "." + _below(first, ph))
        lines.append("")
    if result["pools"]:
        lines += ["**Replicas** (the replica records at the window's end, docs/scaling.md):",
                  ""]
        for p in result["pools"].values():
            parts = [f"{words} {shown.number((p.get(r) or {}).get('last'), '.3g')}"
                     for r, words in POOL_WORDS.items() if p.get(r)]
            lines.append(f"- pool {p['pool']}" + (f" ({p['cluster']})" if p["cluster"] else "")
                         + ": " + "; ".join(parts))
        lines.append("")
    return "\n".join(lines)


def _times(point: dict, mean: dict) -> str:
    """", N× the window's mean request rate" where both are known."""
    p, m = point.get("request_rate"), mean.get("request_rate")
    if not p or not m:
        return ""
    return f", {shown.number(p['value'] / m, '.2g', 'rate')}× the window's mean request rate"


def _below(first: dict, peak_healthy: dict) -> str:
    """A saturation under less load than the server carried healthy: the rate alone did not
    cause it."""
    ph = peak_healthy.get("request_rate")
    if ph and first["request_rate"] is not None and first["request_rate"] < ph["value"]:
        return (" It saturated under less load than it carried healthy: what saturated it was "
                "the work per request (prompt lengths, the mix), not the request rate.")
    return ""


# -- the command -----------------------------------------------------------------------------
def run(start: str | None, end: str | None, prometheus_url: str | None = None,
        pack_dir: Path | None = None, servers: Sequence[str] | None = None,
        s: Settings | None = None) -> tuple[dict, str]:
    """The capacity of the window's servers from Prometheus or from a snapshot pack (its
    capacity.json; then --from/--to, when given, narrow the pack's window). (JSON, report)."""
    s = s or default()
    now = time.time()
    window = [parse_time(t, now, flag, CapacityUsageError) if t is not None else None
              for t, flag in ((start, "--from"), (end, "--to"))]
    if pack_dir is None and window[0] is None:
        raise CapacityUsageError("--from: needed with --prometheus (or give --pack DIR)")
    if window[0] is not None and window[1] is not None and window[1] <= window[0]:
        raise CapacityUsageError(f"empty window: --from {iso(window[0])} is not before --to "
                                 f"{iso(window[1])}")
    if pack_dir is not None:
        doc = pack.read("--pack", pack_dir, pack.CAPACITY)
        w = doc["window"]
        lo = w["start"] if window[0] is None else max(window[0], w["start"])
        hi = w["end"] if window[1] is None else min(window[1], w["end"])
        if hi <= lo:
            raise CapacityError(f"--from/--to: outside the pack --pack {pack_dir}, which covers "
                                f"{iso(w['start'])} – {iso(w['end'])}")
        for name in servers or ():
            pack.pick_server(sorted(doc["servers"]), name, "--server",
                             f"the pack --pack {pack_dir}", pack.PackError)
        if servers:
            doc = {**doc, "servers": {n: doc["servers"][n] for n in servers}}
        result = figures(doc, lo, hi, price_of(s), currency_of(s) or None)
        result["source"] = f"snapshot pack {pack_dir}"
        return result, report(result)
    hi = window[1] if window[1] is not None else now
    if hi > now:
        raise CapacityUsageError(f"--to: in the future ({iso(hi)}, now {iso(now)})")
    try:
        doc = collect(Prometheus(prometheus_url), window[0], hi, s.evaluation_interval_s, s,
                      servers)
    except PrometheusError as err:
        raise CapacityError(f"--prometheus: {err}") from None
    result = figures(doc, price=price_of(s), currency=currency_of(s))
    result["source"] = "Prometheus"
    return result, report(result)


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, sort_keys=True) + "\n"
