"""`sglang-obs snapshot`: "the model felt slow ten minutes ago" as a shareable evidence pack.

Queries Prometheus over a window and writes, into one folder:
- series.csv   per-step key series per server, one stable column set (COLUMNS);
- summary.json the window, the servers, time in each state and the longest episode of each,
               peaks with their times, alerts that fired, the effective configuration and
               its changes (schema in docs/snapshot.md);
- report.md    a one-page summary in seed 000's order: faults first, then prefill vs decode,
               then the cause; plus PNG charts;
- windows.json, load.json, capacity.json  what `sglang-obs compare --before-pack`,
               `sglang-sim what-if --pack` and `sglang-obs capacity --pack` read instead of
               Prometheus (sglang_obs.core.pack).
Queries use the recording rules (the same state classification as alerts and dashboards) and
are split into chunks under Prometheus's 11,000-points-per-series limit by the project's one
query client, sglang_obs.core.prometheus_api. No prompt or request text exists in Prometheus, so
none can reach the pack.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_obs.core import pack, quantities, shown
from sglang_obs.core.cli_support import Failure, UsageError, new_folder, restore_folder
from sglang_obs.core.prometheus_api import Prometheus, PrometheusError
from sglang_obs.core.settings import Settings, default
from sglang_obs.core.states import STATE_COLOURS, STATES
from sglang_obs.core.times import iso, parse_time
from sglang_obs.tools import alert_delivery as delivery
from sglang_obs.tools import capacity, compare

SCHEMA_VERSION = 1
BOTTLENECKS = capacity.SATURATION
# CSV column -> the quantity it holds (sglang_obs/core/quantities.py): the report and the chart
# name each by its label, as every other surface does.
QUANTITY_OF = {"running": "running", "queue": "waiting", "queue_nonempty_seconds":
               "queue_continuous", "pending_prefill_tokens": "prefill_backlog",
               "kv_occupancy": "kv_occupancy", "ttft_p95_seconds": "time_to_first_token_p95_5m",
               "itl_p95_seconds": "inter_token_latency_p95_5m",
               "e2e_p95_seconds": "e2e_request_latency_p95_5m",
               "decode_speed_per_request": "decode_speed"}


def label(column: str) -> str:
    """The column's quantity label; an instant value's "now" is dropped (a pack spans a window)."""
    return quantities.q(QUANTITY_OF[column]).label.removesuffix(" now")


def _per_instance(column: str) -> str:
    record = quantities.q(QUANTITY_OF[column]).record
    return record if record.startswith("instance:") else f"max by (instance) ({record})"


# CSV column -> PromQL giving one series per instance.
COLUMNS: dict[str, str] = {
    "state": "instance:sglang_state:code",
    "request_rate": "sum by (instance) (instance_model:sglang_num_requests:rate5m)",
    **{c: _per_instance(c) for c in ("running", "queue", "queue_nonempty_seconds",
                                     "pending_prefill_tokens", "kv_occupancy")},
    "cache_hit_ratio": "max by (instance) (instance_model:sglang_cache_hit:ratio_rate5m)",
    **{c: _per_instance(c) for c in ("ttft_p95_seconds", "itl_p95_seconds", "e2e_p95_seconds")},
    "input_tokens_per_second": "sum by (instance) (instance_model:sglang_prompt_tokens:rate5m)",
    "output_tokens_per_second": "sum by (instance) (instance_model:sglang_generation_tokens:rate5m)",  # noqa: E501
    "decode_speed_per_request": _per_instance("decode_speed_per_request"),
}
# GPU series are per exporter host, not per server: one value for the whole window per step.
GPU_COLUMNS = {
    "gpu_utilization": "avg(sglang_obs_gpu_utilization_ratio)",
    "gpu_memory_used_ratio": "sum(sglang_obs_gpu_memory_used_bytes) / "
                             "(sum(sglang_obs_gpu_memory_total_bytes) > 0)",
}
CSV_HEADER = ["timestamp", "time", "instance", *COLUMNS, *GPU_COLUMNS]


class SnapshotError(Failure):
    """A snapshot that cannot be taken (exit 1); the message says why and names the argument.
    A Prometheus that cannot be asked (sglang_obs.core.prometheus_api.PrometheusError) reaches the
    CLI as one of these."""


class SnapshotUsageError(SnapshotError, UsageError):
    """The window given cannot be read or is empty (exit 2)."""


# -- the pack -------------------------------------------------------------------------------
@dataclass
class Window:
    start: float
    end: float
    step: float


def _episodes(points: dict[float, float], code: int, step: float) -> list[tuple[float, float]]:
    """Runs of consecutive steps in state `code`: (start, end) with end exclusive."""
    runs, start, last = [], None, None
    for ts in sorted(points):
        if points[ts] == code and (start is None or ts - last <= step * 1.5):
            start = ts if start is None else start
        elif points[ts] == code:
            runs.append((start, last + step))
            start = ts
        elif start is not None:
            runs.append((start, last + step))
            start = None
        last = ts if points[ts] == code else last
    if start is not None:
        runs.append((start, last + step))
    return runs


def _instance(key: tuple) -> str:
    return dict(key).get("instance", "")


def collect(prom: Prometheus, window: Window, instances: list[str] | None,
            progress=None) -> dict:
    w = window
    retention = prom.retention_seconds()
    if retention is not None and w.end < time.time() - retention:
        raise SnapshotError(f"--from/--to: the window ends before Prometheus's retention "
                            f"({retention / 86400:g} days): that data is gone")
    states = prom.query_range(COLUMNS["state"], w.start, w.end, w.step, progress)
    servers = sorted({_instance(k) for k in states})
    if not servers:
        raw = prom.query_range("count by (instance) (sglang_obs_up)", w.start, w.end,
                               max(w.step, (w.end - w.start) / 100))
        if not raw:
            raise SnapshotError(f"--from/--to: no data between {iso(w.start)} and {iso(w.end)} "
                                f"in --prometheus {shown.url(prom.url)}: the window "
                                "is empty, beyond retention, or the recording rules are not "
                                "loaded (prometheus/rules/sglang.rules.yml)")
        servers = sorted({_instance(k) for k in raw})
    if instances:
        unknown = sorted(set(instances) - set(servers))
        if unknown:
            raise SnapshotError(f"--instance: unknown instance {', '.join(unknown)}; servers in "
                                f"this window: {', '.join(servers) or 'none'}")
        servers = list(instances)
    columns = {name: prom.query_range(expr, w.start, w.end, w.step)
               for name, expr in COLUMNS.items() if name != "state"}
    columns["state"] = states
    gpu = {name: prom.query_range(expr, w.start, w.end, w.step)
           for name, expr in GPU_COLUMNS.items()}
    return {"servers": servers, "columns": columns, "gpu": gpu}


def write_csv(data: dict, path: Path) -> None:
    steps = sorted({ts for series in data["columns"]["state"].values() for ts in series} |
                   {ts for col in data["columns"].values() for s in col.values() for ts in s})
    gpu = {name: next(iter(series.values()), {}) for name, series in data["gpu"].items()}
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_HEADER)
        for server in data["servers"]:
            by_col = {name: next((v for k, v in col.items() if _instance(k) == server), {})
                      for name, col in data["columns"].items()}
            for ts in steps:
                row = [int(ts), iso(ts), server]
                for name in COLUMNS:
                    value = by_col[name].get(ts)
                    if name == "state" and value is not None:
                        value = STATES[int(value)]
                    row.append("" if value is None else _fmt(value))
                row += ["" if gpu[n].get(ts) is None else _fmt(gpu[n][ts]) for n in GPU_COLUMNS]
                writer.writerow(row)


def _fmt(value) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _peak(series: dict[float, float]) -> dict | None:
    if not series:
        return None
    ts = max(series, key=lambda t: (series[t], -t))  # the first time of the highest value
    return {"value": series[ts], "at": iso(ts)}


def summarize(prom: Prometheus, data: dict, window: Window, *, alertmanager: str | None = None,
              alerts_log: Path | None = None) -> dict:
    w = window
    servers = {}
    for server in data["servers"]:
        codes = next((v for k, v in data["columns"]["state"].items()
                      if _instance(k) == server), {})
        states = {}
        for code, name in enumerate(STATES):
            runs = _episodes(codes, code, w.step)
            if runs:
                longest = max(runs, key=lambda r: r[1] - r[0])
                states[name] = {
                    "seconds": sum(1 for v in codes.values() if v == code) * w.step,
                    "episodes": len(runs),
                    "first_at": iso(runs[0][0]),
                    "longest": {"seconds": longest[1] - longest[0], "from": iso(longest[0]),
                                "to": iso(longest[1])}}
        peaks = {}
        for name in ("queue", "queue_nonempty_seconds", "pending_prefill_tokens", "running",
                     "kv_occupancy", "ttft_p95_seconds", "itl_p95_seconds"):
            series = next((v for k, v in data["columns"][name].items()
                           if _instance(k) == server), {})
            peaks[name] = _peak(series)
        servers[server] = {"states": states, "peaks": peaks,
                           "dominant": dominant(states),
                           "config": config_changes(prom, server, w)}
    return {
        "schema_version": SCHEMA_VERSION,
        "window": {"from": iso(w.start), "to": iso(w.end), "step_seconds": w.step},
        "servers": servers,
        "alerts": alerts(prom, w, alertmanager=alertmanager, alerts_log=alerts_log),
    }


def dominant(states: dict) -> list[str]:
    """Bottleneck classes with time in them, in order of onset (seed 000: backlog first)."""
    found = [s for s in BOTTLENECKS if s in states]
    return sorted(found, key=lambda s: states[s]["first_at"])


def alerts(prom: Prometheus, w: Window, *, alertmanager: str | None = None,
           alerts_log: Path | None = None) -> list[dict]:
    """The alerts that fired in the window (ALERTS series; Watchdog left out), each with its
    firing episodes and whether it reached a receiver (sglang_obs.tools.alert_delivery)."""
    series = prom.query_range('ALERTS{alertstate="firing"}', w.start, w.end, w.step)
    out = []
    for key, points in series.items():
        labels = {k: v for k, v in key if k not in ("__name__", "alertstate")}
        if labels.get("alertname") == "Watchdog":
            continue
        rest = dict(labels)
        runs = _episodes(dict.fromkeys(points, 1), 1, w.step)
        out.append({"alertname": rest.pop("alertname", ""),
                    "severity": rest.pop("severity", ""), "labels": rest,
                    "first_firing": iso(min(points)), "last_firing": iso(max(points)),
                    "all_labels": labels,
                    "_episodes": [{"start": a, "end": b} for a, b in runs]})
    if out:
        if alertmanager:
            config, held = delivery.alertmanager_state(alertmanager)
        else:
            config, held = delivery.AlertmanagerConfig.shipped(), None
        log = delivery.read_alerts_log(alerts_log) if alerts_log else None
        delivery.judge(out, config, w.start, w.end, log, held)
    for a in out:
        a["description"] = delivery.describe(a)
        d = a["delivery"]
        if d.get("first_notified_at") is not None:
            d["first_notified_at"] = iso(d["first_notified_at"])
        a["episodes"] = [{"from": iso(e["start"]), "to": iso(e["end"]), "seconds": e["seconds"],
                          "verdict": e["verdict"]} for e in a.pop("_episodes")]
        del a["all_labels"]
    return sorted(out, key=lambda a: (a["first_firing"], a["alertname"]))


def config_changes(prom: Prometheus, server: str, w: Window) -> dict:
    series = prom.query_range(f'sglang_obs_server_config_info{{instance="{server}"}}',
                              w.start, w.end, max(w.step, 60))
    versions = []
    for key, points in sorted(series.items(), key=lambda kv: min(kv[1])):
        labels = {k: v for k, v in key if k not in ("__name__", "job", "instance", "server")}
        versions.append({"from": iso(min(points)), "to": iso(max(points)), "config": labels})
    return {"effective": versions[-1]["config"] if versions else None,
            "changed": len(versions) > 1, "versions": versions}


# -- the human side ------------------------------------------------------------------------
def report(summary: dict, charts: list[str] | None) -> str:
    w = summary["window"]
    lines = [f"# SGLang snapshot {w['from']} – {w['to']}", ""]
    firing = summary["alerts"]
    faults = [a for a in firing if a["alertname"] in (
        "SGLangServerDown", "SGLangContainerRestarting", "SGLangOOMKilled", "GPULost",
        "GPUXidCritical", "GPUUncorrectableECC", "GPURowRemapFailure", "SGLangExporterDown")]
    for server, s in summary["servers"].items():
        states, peaks = s["states"], s["peaks"]
        lines += [f"## {server}", ""]
        # 1. Faults first: a crash or a sick GPU explains everything after it.
        down = states.get("unavailable")
        server_faults = [a for a in faults if a["labels"].get("instance") in (server, None)
                         or a["alertname"].startswith("GPU")]
        if down or server_faults:
            lines.append("**1. Faults:** " + "; ".join(
                ([f"unavailable for {shown.number(down['seconds'], '.0f', 'seconds', ' s')} "
                  "(longest from "
                  f"{down['longest']['from']})"] if down else [])
                + [f"{a['alertname']} from {a['first_firing']}" for a in server_faults]) + ".")
        else:
            lines.append("**1. Faults:** none — the server answered throughout, no crash, no "
                         "GPU error alert.")
        # 2. Prefill versus decode, in order of onset.
        order = s["dominant"]
        if order:
            parts = []
            for name in order:
                st = states[name]
                parts.append(f"**{name}** from {st['first_at']} "
                             f"({shown.number(st['seconds'], '.0f', 'seconds', ' s')} in "
                             f"{st['episodes']} episode(s), longest "
                             f"{shown.number(st['longest']['seconds'], '.0f', 'seconds', ' s')}"
                             f" from {st['longest']['from']})")
            lines.append("**2. Where requests waited:** " + ", then ".join(parts) + ".")
        else:
            lines.append("**2. Where requests waited:** nowhere — no bottleneck state in this "
                         "window.")
        # 3. The evidence behind it.
        evidence = []
        for key, unit in (("pending_prefill_tokens", ""), ("queue", ""),
                          ("queue_nonempty_seconds", " s"), ("running", ""),
                          ("kv_occupancy", ""), ("ttft_p95_seconds", " s"),
                          ("itl_p95_seconds", " s")):
            p = peaks.get(key)
            if p:
                # Through sglang_obs.core.shown: "—" for NaN, ±Inf or an absurd peak.
                kind = "ratio" if key == "kv_occupancy" else "seconds" if unit else "count"
                v = shown.checked(p["value"], kind)
                value = (shown.DASH if v is None else f"{v:.0%}" if kind == "ratio"
                         else f"{v:,.0f}{unit}" if v >= 100 else f"{v:.3g}{unit}")
                evidence.append(f"{label(key)} peaked at {value} at {p['at']}")
        lines.append("**3. Evidence:** " + "; ".join(evidence) + "." if evidence else
                     "**3. Evidence:** no data.")
        config = s["config"]
        if config["effective"]:
            args = ", ".join(f"{k}={v}" for k, v in sorted(config["effective"].items()) if v)
            lines.append(f"**Configuration:** {args}"
                         + (" (it changed in this window: see summary.json)."
                            if config["changed"] else "."))
        if s.get("energy"):
            lines.append(energy_paragraph(s["energy"]))
        lines.append("")
    # One paragraph per point: blank lines between them, so Markdown keeps them apart.
    lines = [ln for line in lines for ln in ((line, "") if line.startswith("**") else (line,))]
    lines += ["## Alerts that fired", ""]
    if not firing:
        lines += ["- none (read from the ALERTS series: a Prometheus that evaluated the rules "
                  "has it)"]
    reached = [a for a in firing if a["delivery"]["verdict"] == "notified"]
    stopped = [a for a in firing if a["delivery"]["verdict"] != "notified"]
    for title, group in (("Reached a receiver", reached),
                         ("Fired in Prometheus, reached no receiver", stopped)):
        if group:
            lines += [f"**{title}:**", ""]
            lines += [f"- {a['alertname']} ({a['severity']}) firing {_episodes_text(a)}"
                      + (f" on {a['labels']['instance']}" if a["labels"].get("instance") else "")
                      + f": {a['description']}." for a in group]
            lines += [""]
    lines += ["", "## Charts", ""] + ([f"![{c}]({c})" for c in charts] if charts is not None
                                      else ["Not drawn (`--no-charts`)."])
    lines += ["", "Files: `series.csv` (per step and server), `summary.json`; `windows.json`, "
              "`load.json` and `capacity.json`, which `sglang-obs compare --before-pack`, "
              "`sglang-sim what-if --pack` and `sglang-obs capacity --pack` read "
              "(docs/snapshot.md).", ""]
    return "\n".join(lines)


def energy_paragraph(e: dict) -> str:
    """The report's "Energy and cost" point: the server's host's GPUs over the window
    (sglang_obs.tools.capacity's figures and labels), and what was not recorded."""
    host = f"host {e['host']}'s GPUs" if e.get("host") else "its host's GPUs"
    text = (f"**Energy and cost** ({host}): " + "; ".join(capacity.energy_lines(e)) + ".")
    missing = capacity.missing_line(e)
    return text + (" " + missing if missing else "")


def _episodes_text(alert: dict) -> str:
    """Each firing episode as summary.json has it, in order; one whose fate differs from the
    alert's verdict says its own."""
    verdict = alert["delivery"]["verdict"]
    return ", ".join(f"{e['from']} – {e['to']}" + (
        f" ({e['verdict'].replace('_', ' ')})" if e["verdict"] != verdict else "")
        for e in alert["episodes"])


# (title, unit, ((column, legend, factor), ...)) of the snapshot chart's line panels.
PANELS = (
    ("Requests", "requests", (("queue", label("queue"), 1.0),
                              ("running", label("running"), 1.0))),
    ("Prompt tokens waiting for prefill", "tokens",
     (("pending_prefill_tokens", label("pending_prefill_tokens"), 1.0),)),
    ("Time to first token", "s", (("ttft_p95_seconds", label("ttft_p95_seconds"), 1.0),)),
    ("Inter-token latency", "s", (("itl_p95_seconds", label("itl_p95_seconds"), 1.0),)),
    ("KV cache", "%", (("kv_occupancy", label("kv_occupancy"), 100.0),
                      ("cache_hit_ratio", "prefix cache hit ratio", 100.0))),
)


def _series(data: dict, column: str, server: str) -> dict[float, float]:
    return next((v for k, v in data["columns"][column].items() if _instance(k) == server), {})


def alert_spans(alerts: list[dict], server: str) -> list[dict]:
    """The summary's alerts that concern `server` (its own, and those of no server: GPUs),
    as charts.alert_band rows."""
    rows = []
    for a in alerts:
        if a["labels"].get("instance") not in (server, None):
            continue
        rows.append({"name": a["alertname"], "severity": a["severity"],
                     "spans": [{"start": parse_time(e["from"]), "end": parse_time(e["to"]),
                                "verdict": e["verdict"]} for e in a["episodes"]]})
    return rows


def figure(data: dict, server: str, window: Window, alerts: list[dict]):
    """The one chart of `server`: its state, the alerts that fired, then the evidence, on one
    wall-clock time axis over the window."""
    from sglang_obs.tools import charts as c

    plt = c.pyplot()

    spans = alert_spans(alerts, server)
    ratios = [0.9, max(0.8, 0.3 * len(spans) + 0.3)] + [1.6] * len(PANELS)
    fig, axes = plt.subplots(len(ratios), 1, figsize=(10, sum(ratios) * 1.25 + 0.6),
                             sharex=True, gridspec_kw={"height_ratios": ratios})
    codes = _series(data, "state", server)
    times = sorted(codes)
    axes[0].set_title(f"{server}: state (the recording rule instance:sglang_state:code)",
                      fontsize=8, loc="left")
    axes[0].set_gid("time")
    c.state_band(axes[0], [("state", times, [codes[t] for t in times])], window.step,
                 STATES, STATE_COLOURS)
    axes[1].set_title("Alerts that fired (hatched: reached no receiver)", fontsize=8,
                      loc="left")
    axes[1].set_gid("time")
    c.alert_band(axes[1], spans, window.start, window.end)
    for ax, (title, unit, columns) in zip(axes[2:], PANELS, strict=True):
        ax.set_title(title, fontsize=8, loc="left")
        ax.set_gid("time")
        lines = []
        for column, legend, factor in columns:
            points = _series(data, column, server)
            ts = sorted(points)
            lines.append(c.Line(legend, ts, [points[t] * factor for t in ts]))
        c.plot_lines(ax, lines, unit)
    for ax in axes:
        c.time_axis(ax, window.start, window.end, label=ax is axes[-1])
    fig.tight_layout()
    return fig


def charts(data: dict, out: Path, window: Window, alerts: list[dict]) -> list[str]:
    from sglang_obs.tools.charts import pyplot

    plt = pyplot()
    written = []
    for server in data["servers"]:
        fig = figure(data, server, window, alerts)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", server) + ".png"
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
        written.append(name)
    return written


def requests_section(directory: str, window: Window, top: int = 10) -> dict:
    """The request records of `directory` that finished in the window: the by-class table and
    the slowest `top` (sglang_obs.tools.analyze_requests; numbers and safe ids only)."""
    from sglang_obs.tools import analyze_requests

    try:
        result = analyze_requests.analyze([directory], top=top, start=window.start,
                                          end=window.end)
    except analyze_requests.UnreadableLog as err:
        raise SnapshotError(f"--request-metrics-dir {err}") from None
    doc = result.document()
    return {"directory": directory, "records": doc["records"], "rejected": doc["rejected"],
            "outside_window": result.outside, "classes": doc["classes"],
            "slowest": doc["slowest"]}


def requests_report(section: dict) -> list[str]:
    from sglang_obs.tools import analyze_requests

    lines = ["## Slowest requests in this window", "",
             f"{section['records']:,} request records finished in the window "
             f"(`{section['directory']}`); prefill = TTFT - queue, decode = e2e - TTFT.", ""]
    if not section["records"]:
        return [*lines, "None: no record of the directory finished in this window.", ""]
    doc = {"classes": section["classes"]}
    return [*lines, "```", *analyze_requests.class_table(doc), "",
            *analyze_requests.slowest_table(section["slowest"]), "```", ""]


def written(out: Path) -> list[Path]:
    """The files of the pack in `out`, in reading order: the report, the summary, the series,
    what compare and what-if read, then the charts. All of them: --out was new or empty."""
    first = ["report.md", "summary.json", "series.csv", pack.WINDOWS, pack.LOAD, pack.CAPACITY]
    names = {p.name for p in Path(out).iterdir()}
    return [Path(out) / n for n in [*(n for n in first if n in names),
                                    *sorted(names - set(first))]]


def take(prometheus_url: str, start: str, end: str, out: Path,
         instances: list[str] | None = None, step: float | None = None, *,
         alertmanager: str | None = None, alerts_log: Path | None = None,
         request_metrics_dir: str | None = None, charts: bool = True,
         s: Settings | None = None) -> dict:
    """Write the pack into `out` (a new or empty folder) and return its summary, sampled every
    `step` seconds (default: the evaluation interval of `s`). On failure `out` is left as it
    was found (removed when this call created it)."""
    s = s or default()
    step = step or s.evaluation_interval_s
    now = time.time()
    window = Window(parse_time(start, now, "--from", SnapshotUsageError),
                    parse_time(end, now, "--to", SnapshotUsageError), step)
    if window.end > now:
        raise SnapshotUsageError(f"--to: in the future ({iso(window.end)}, now {iso(now)}): a "
                                 "snapshot covers what Prometheus has recorded")
    if window.end <= window.start:
        raise SnapshotUsageError(f"empty window: --from {iso(window.start)} is not before --to "
                                 f"{iso(window.end)}")
    out, created = new_folder("--out", out)
    try:
        return _take(prometheus_url, window, out, instances, alertmanager, alerts_log,
                     request_metrics_dir, charts, s)
    except PrometheusError as err:
        restore_folder(out, created)
        raise SnapshotError(f"--prometheus: {err}") from None
    except delivery.DeliveryError as err:
        restore_folder(out, created)
        raise SnapshotError(str(err)) from None
    except OSError as err:
        restore_folder(out, created)
        raise SnapshotError(f"--out {out}: cannot write the pack ({err.strerror or err})") \
            from None
    except BaseException:
        restore_folder(out, created)
        raise


def _take(prometheus_url: str, window: Window, out: Path, instances: list[str] | None,
          alertmanager: str | None, alerts_log: Path | None,
          request_metrics_dir: str | None, draw: bool, s: Settings) -> dict:
    prom = Prometheus(prometheus_url)
    step = window.step
    total = max(window.end - window.start, 1)
    long = total / step > 2000 and sys.stderr.isatty()  # a progress bar, for a person only

    def progress(t: float) -> None:
        if long:
            done = min((t - window.start) / total, 1.0)
            sys.stderr.write(f"\rquerying [{'#' * int(done * 30):30}] {done:4.0%}")
            sys.stderr.flush()

    try:
        data = collect(prom, window, instances, progress)
    finally:
        if long:  # the bar goes: an error, if any, stays the only line
            sys.stderr.write("\r" + " " * 50 + "\r")
    write_csv(data, out / "series.csv")
    summary = summarize(prom, data, window, alertmanager=alertmanager, alerts_log=alerts_log)
    # What `sglang-obs capacity --pack` reads; the energy and cost of each server's host.
    held = capacity.collect(prom, window.start, window.end, window.step, s, data["servers"],
                            check=False)
    found = capacity.figures(held, price=capacity.price_of(s), currency=capacity.currency_of(s))
    for server, f in found["servers"].items():
        summary["servers"][server]["energy"] = {"host": f["host"]["host"], **f["energy"]}
    if request_metrics_dir:
        summary["requests"] = requests_section(request_metrics_dir, window)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    # What `compare --before-pack` and `sglang-sim what-if --pack` read instead of Prometheus.
    pack.write(out, pack.WINDOWS, compare.pack_windows(prom, window.start, window.end,
                                                       data["servers"], s))
    pack.write(out, pack.LOAD, pack.load_document(prom, data["servers"], window.start,
                                                  window.end, window.step))
    pack.write(out, pack.CAPACITY, held)
    names = charts(data, out, window, summary["alerts"]) if draw else None
    text = report(summary, names)
    if request_metrics_dir:
        text += "\n" + "\n".join(requests_report(summary["requests"]))
    (out / "report.md").write_text(text)
    return summary
