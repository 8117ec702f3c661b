"""The glance page: `/` as server-rendered HTML, `/api/v1/status` as JSON, and the page's own
stylesheet and script (served by the exporter: no external asset, no CDN).

The HTML works with JavaScript off (a `<meta http-equiv=refresh>` inside `<noscript>` reloads it)
and is better with it on: /glance.js polls /api/v1/status every few seconds and writes the
`display` strings of the answer into the elements that carry their key (`data-f` text,
`data-p` sparkline paths, `data-l` lists) with textContent and setAttribute only, never as HTML.
Both the page and the script take those strings from `display()` here, so the two cannot show
different words.

Every value is HTML-escaped where it is written; the JSON escapes <, > and & as well. Each answer
carries a Content-Security-Policy that allows this origin only (no inline script or style), and
X-Content-Type-Options: nosniff. The status is computed on request from the trackers
(exporter/status.py): serving the page costs the /metrics scrape path nothing.
"""

from __future__ import annotations

import html
import json
import logging
import math
import threading
import time
from typing import Any

from sglang_obs import __version__
from sglang_obs.core import quantities, shown
from sglang_obs.core.shown import count, percent, seconds, speed
from sglang_obs.core.states import PD_STATE_COLOURS, STATE_COLOURS
from sglang_obs.exporter.status import (
    READINGS,
    STATE_LABELS,
    TREND_SERIES,
    TREND_SLOT,
    StatusBoard,
)

log = logging.getLogger(__name__)

NOT_REPORTED = "not reported by this release"
NONE_YET = "none yet"  # an average or rate of requests, before the server has finished any
CACHE_SECONDS = 1.0  # the status is computed at most this often, however many pages are open
REFRESH_SECONDS = 10  # the page's reload with JavaScript off
POLL_SECONDS = 5  # the script's fetch of /api/v1/status
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = (("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
                    ("Referrer-Policy", "no-referrer"))
SPARK_H = 64  # a sparkline's viewBox height; its width is the trend's points less one
_SLOT = f"per {TREND_SLOT:g} s"
# Each sparkline's title and what one point is. Arrivals and completions are per minute, their
# "now" is the last minute's (the same figure as Received / finished); the others' "now" is
# their newest point.
TREND_TITLES = {
    "arrivals_per_minute": ("Arrivals", f"per min, {TREND_SLOT:g} s points"),
    "completions_per_minute": ("Completions", f"per min, {TREND_SLOT:g} s points"),
    "waiting": ("Queue", f"waiting, max {_SLOT}"),
    "running": ("Running", f"requests, max {_SLOT}"),
    "prefill_backlog_tokens": ("Prefill backlog", f"tokens, max {_SLOT}"),
    "ttft_seconds": (quantities.q("ttft_mean_slot").subject,
                     quantities.q("ttft_mean_slot").qualifier),
}
MINUTE_RATES = {"arrivals_per_minute": "received_last_minute",
                "completions_per_minute": "finished_last_minute"}


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# -- the strings shown ---------------------------------------------------------------------------
def _or_nr(up: bool, value: Any, text: str, fresh: bool = False) -> str:
    """`text`, or why there is none: down (—), no request finished yet (`fresh`: a figure of
    finished requests), or a signal this release does not give."""
    if value is not None:
        return text
    if not up:
        return "—"
    return NONE_YET if fresh else NOT_REPORTED


def _trend_kind(name: str) -> str:
    """The sglang_obs.core.shown kind of a trend's values."""
    return ("seconds" if name == "ttft_seconds" else "rate" if name.endswith("per_minute")
            else "count")


def _trend_value(name: str, value: float | None) -> str:
    if name == "ttft_seconds":
        return seconds(value)
    if name.endswith("per_minute"):
        return shown.number(value, ",.1f", "rate")
    return count(value)


def spark_path(values: list[float | None], kind: str = "count") -> str:
    """An SVG path, one x unit per point, y in SPARK_H units scaled to the largest value (0 at
    the bottom); gaps where None, and where a value cannot be shown as a `kind`
    (sglang_obs.core.shown: not finite, negative, absurd)."""
    values = shown.checked_all(values, kind)
    top = max((v for v in values if v is not None), default=0.0)
    scale = (SPARK_H - 4) / (top if top > 0 else 1.0)
    bottom = SPARK_H - 2
    parts = []
    move = "M"
    for i, v in enumerate(values):
        if v is None:
            move = "M"
            continue
        parts.append(f"{move}{i} {bottom - v * scale if v > 0 else bottom:.0f}")
        move = "L"
    return "".join(parts) or "M0 0"


def _gpu_line(g: dict[str, Any]) -> str:
    name = g["name"] or "GPU"
    if not g["up"]:
        return f"GPU {g['index']} · {name} · lost (no answer from NVML)"
    used, total = g["memory_used_bytes"], g["memory_total_bytes"]
    mem = (f"{shown.number(used / 2**30, ',.1f')} / {shown.number(total / 2**30, ',.1f')} GiB "
           f"({percent(used / total)})" if used is not None and total else "memory not reported")
    return f"GPU {g['index']} {name}: {percent(g['utilization_ratio'])} busy, memory {mem}"


def display(srv: dict[str, Any], board_status: dict[str, Any]) -> dict[str, Any]:
    """The strings the page shows for one server, keyed as the page's elements are."""
    up = srv["up"]
    p, b, st, tk, dec = (srv["pressure"], srv["baseline"], srv["stages"], srv["tokens"],
                         srv["decode"])
    if p["max_running"] is not None and p["running"] is not None:
        running = (f"{count(p['running'])} of {count(p['max_running'])} "
                   f"({percent(p['running_ratio'])})")
    else:
        running = _or_nr(up, p["running"], f"{count(p['running'])} (limit not reported)")
    window = p["minute_window_seconds"]
    minute = "last minute" if window is None or window >= 59 else f"last {seconds(window)}"
    queue = p["queue_nonempty_seconds"]
    fresh = b["requests"] == 0  # figures of finished requests: none yet, not "not reported"
    text = {
        "state_label": srv["state_label"],
        "reason": srv["reason"],
        "as_of": ("as of " + time.strftime("%H:%M:%S", time.localtime(srv["as_of"]))
                  if srv["as_of"] else "not polled yet"),
        "p.running": running,
        "p.waiting": _or_nr(up, p["waiting"], count(p["waiting"])),
        "p.minute": minute,
        "p.received": _or_nr(up, p["received_last_minute"], count(p["received_last_minute"])),
        "p.finished": _or_nr(up, p["finished_last_minute"], count(p["finished_last_minute"])),
        "p.queue": _or_nr(up, queue, "no queue" if queue == 0 else seconds(queue)),
        "b.prompt": _or_nr(up, b["prompt_tokens"], count(b["prompt_tokens"])),
        "b.generated": _or_nr(up, b["generated_tokens"], count(b["generated_tokens"])),
        "b.cached": _or_nr(up, b["cached_tokens"], count(b["cached_tokens"])),
        "b.total": _or_nr(up, b["total_tokens"], count(b["total_tokens"])),
        "b.requests": _or_nr(up, b["requests"], count(b["requests"])),
        "b.prefill_speed": _or_nr(up, b["prefill_tokens_per_second"],
                                  speed(b["prefill_tokens_per_second"])
                                  + (" (queueing included)"
                                     if b["prefill_time_includes_queueing"] else ""), fresh),
        "b.gen_speed": _or_nr(up, b["generation_tokens_per_second"],
                              speed(b["generation_tokens_per_second"]), fresh),
        "b.ttft": _or_nr(up, b["ttft_seconds"], seconds(b["ttft_seconds"]), fresh),
        "b.request": _or_nr(up, b["request_seconds"], seconds(b["request_seconds"]), fresh),
        "b.cache_hit": _or_nr(up, b["cache_hit_ratio"], percent(b["cache_hit_ratio"]), fresh),
        "s.waiting": _or_nr(up, st["waiting_to_start"], count(st["waiting_to_start"])),
        "s.resources": _or_nr(up, st["waiting_for_resources"],
                              count(st["waiting_for_resources"])),
        "s.input": _or_nr(up, st["processing_input_tokens"],
                          shown.number(st["processing_input_tokens"], ",.0f", "count",
                                       " tokens")),
        "s.generating": _or_nr(up, st["generating"], count(st["generating"])),
        "t.kv_used": _or_nr(up, tk["kv_used"], count(tk["kv_used"])),
        "t.kv_capacity": _or_nr(up, tk["kv_capacity"], count(tk["kv_capacity"])),
        "t.kv_occupancy": _or_nr(up, tk["kv_occupancy_ratio"], percent(tk["kv_occupancy_ratio"])),
        "t.backlog": _or_nr(up, tk["prefill_backlog"], count(tk["prefill_backlog"])),
        "t.speed": ("— (nothing generating)" if up and dec["speed_per_request"] is None
                    and p["running"] == 0 else
                    _or_nr(up, dec["speed_per_request"], speed(dec["speed_per_request"]))),
        "t.speed_p90": ("—" if dec["speed_p90_1h"] is None else speed(dec["speed_p90_1h"])),
        "g.power": shown.watts(srv["energy"]["power_watts"]),
        "g.energy_per_token": (
            "— (no output tokens)" if srv["energy"]["output_tokens_last_minute"] == 0 else
            shown.joules(srv["energy"]["joules_per_output_token_last_minute"])),
    }
    paths = {}
    for name in TREND_SERIES:
        values = srv["trends"][name]
        kind = _trend_kind(name)
        seen = [v for v in shown.checked_all(values, kind) if v is not None]
        paths[name] = spark_path(values, kind)
        peak = f"max {_trend_value(name, max(seen) if seen else None)}"
        if name in MINUTE_RATES:
            count_ = p[MINUTE_RATES[name]]
            rate = None if count_ is None or not window else count_ / min(window, 60.0) * 60.0
            text["tr." + name] = f"{minute} {_trend_value(name, rate)} · {peak}"
        else:
            last = next((v for v in reversed(values) if v is not None), None)
            text["tr." + name] = f"newest {_trend_value(name, last)} · {peak}"
    lists = {
        "patterns": [pt["text"] for pt in srv["patterns"]]
        or [f"None applies: {srv['state_label'].lower()}, no saturation pattern."],
        "gpus": [_gpu_line(g) for g in srv["gpus"]] or [_no_gpus(board_status)],
    }
    return {"text": text, "paths": paths, "lists": lists}


def _no_gpus(board_status: dict[str, Any]) -> str:
    if not board_status["gpu_collector"]:
        return "GPU collector off (--collector.nvml)."
    if board_status["host_gpus"]:
        return ("Listed below for the whole host: not attributed to a server "
                "(--collector.nvml.processes does).")
    return "No GPU readings: NVML found no GPU, or none runs this server."


POOL_TITLES = {"prefill": "Prefill pool", "decode": "Decode pool"}


def pool_display(pool: dict[str, Any], board_status: dict[str, Any]) -> dict[str, Any]:
    """The strings the page shows for one PD pool: its verdict and its members with theirs."""
    by_server = {srv["server"]: srv for srv in board_status["servers"]}
    members = []
    for name in pool["servers"]:
        srv = by_server.get(name)
        members.append(f"{name}: {srv['state_label']}" if srv is not None else name)
    return {"text": {"state_label": pool["state_label"], "reason": pool["reason"],
                     "members": f"{count(pool['servers_up'])} of {count(len(pool['servers']))} "
                                "answering"},
            "paths": {}, "lists": {"servers": members}}


def board_display(board_status: dict[str, Any]) -> dict[str, Any]:
    return {"text": {"updated": "updated " + time.strftime(
        "%H:%M:%S", time.localtime(board_status["generated_at"]))},
        "lists": {"host_gpus": [_gpu_line(g) for g in board_status["host_gpus"]]}}


def status_with_display(board: StatusBoard) -> dict[str, Any]:
    """The board's status with the page's strings; what they hide is counted in board.hidden."""
    with shown.counting(board.hidden):
        status = board.status()
        for srv in status["servers"]:
            srv["display"] = display(srv, status)
        for pool in status["pools"]:
            pool["display"] = pool_display(pool, status)
        status["display"] = board_display(status)
    return status


def status_json(board: StatusBoard) -> bytes:
    return json_bytes(status_with_display(board))


def json_bytes(status: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(status, allow_nan=False, default=str, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity somewhere: JSON has neither
        text = json.dumps(_clean(status), allow_nan=False, default=str, separators=(",", ":"))
    # Markup characters never travel raw, even in JSON served as JSON.
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .encode())


def _clean(status: Any) -> Any:
    """NaN and infinities as null (JSON has neither)."""
    if isinstance(status, float):
        return status if math.isfinite(status) else None
    if isinstance(status, dict):
        return {k: _clean(v) for k, v in status.items()}
    if isinstance(status, list):
        return [_clean(v) for v in status]
    return status


# -- the page ------------------------------------------------------------------------------------
def _row(label: str, key: str, text: dict[str, str], note: str = "") -> str:
    note_html = f' <span class="note">{esc(note)}</span>' if note else ""
    return (f'<div class="row"><dt>{esc(label)}{note_html}</dt>'
            f'<dd data-f="{esc(key)}">{esc(text[key])}</dd></div>')


def _qrow(quantity: str, key: str, text: dict[str, str]) -> str:
    """A row under its quantity's label (sglang_obs/core/quantities.py): statistic and window
    beside the subject, as every other surface prints them."""
    x = quantities.q(quantity)
    return _row(" ".join(p for p in (x.subject, x.statistic) if p), key, text, x.window)


def _list(key: str, items: list[str], cls: str = "") -> str:
    inner = "".join(f"<li>{esc(item)}</li>" for item in items)
    return f'<ul class="{esc(cls)}" data-l="{esc(key)}">{inner}</ul>'


def _spark(name: str, disp: dict[str, Any], points: int) -> str:
    title, unit = TREND_TITLES[name]
    width = max(points - 1, 1)
    return (f'<figure class="spark"><figcaption>{esc(title)} <span class="note">{esc(unit)}'
            f'</span> <span class="now" data-f="tr.{esc(name)}">{esc(disp["text"]["tr." + name])}'
            f'</span></figcaption><svg viewBox="0 0 {width} {SPARK_H}" '
            f'preserveAspectRatio="none" role="img" aria-label="{esc(title)}, last 30 minutes">'
            f'<path class="line" data-p="{esc(name)}" d="{esc(disp["paths"][name])}"/></svg>'
            "</figure>")


def server_section(i: int, srv: dict[str, Any]) -> str:
    disp = srv["display"]
    t = disp["text"]
    model = (f' <span class="model">{esc(srv["model_name"])}</span>'
             if srv["model_name"] else "")
    if srv["role"]:
        model += f' <span class="role">{esc(srv["role"])}</span>'
    pressure = "".join((
        _row("Running", "p.running", t, "of the effective max_running_requests"),
        _row("Waiting", "p.waiting", t),
        '<div class="row"><dt>Received / finished, <span data-f="p.minute">'
        f'{esc(t["p.minute"])}</span></dt><dd><span data-f="p.received">'
        f'{esc(t["p.received"])}</span> / <span data-f="p.finished">{esc(t["p.finished"])}'
        "</span></dd></div>",
        _qrow("queue_continuous", "p.queue", t),
    ))
    baseline = "".join((
        _row("Prompt tokens", "b.prompt", t),
        _row("Generated tokens", "b.generated", t),
        _row("Cached tokens", "b.cached", t),
        _row("Total tokens", "b.total", t),
        _row("Requests finished", "b.requests", t),
        _row("Prefill speed", "b.prefill_speed", t, "per request, uncached input"),
        _row("Generation speed", "b.gen_speed", t, "per request"),
        _qrow("ttft_mean_since_start", "b.ttft", t),
        _qrow("e2e_request_latency_mean_since_start", "b.request", t),
        _row("Cache hit ratio", "b.cache_hit", t),
    ))
    stages = "".join((
        _row("Waiting to start", "s.waiting", t, "in the queue"),
        _row("Waiting for resources", "s.resources", t, "grammar, paused, KV transfer"),
        _row("Processing input", "s.input", t, "prompt tokens to prefill"),
        _row("Generating", "s.generating", t),
    ))
    tokens = "".join((
        _row("KV used", "t.kv_used", t, "tokens"),
        _row("KV capacity", "t.kv_capacity", t, "tokens"),
        _qrow("kv_occupancy", "t.kv_occupancy", t),
        _qrow("prefill_backlog", "t.backlog", t),
        _qrow("decode_speed", "t.speed", t),
        _qrow("decode_speed_usual", "t.speed_p90", t),
    ))
    energy = "".join((
        _qrow("gpu_power_now", "g.power", t),
        _qrow("energy_per_output_token_last_minute", "g.energy_per_token", t),
    ))
    sparks = "".join(_spark(name, disp, srv["trends"]["points"]) for name in TREND_SERIES)
    patterns = "".join(
        f'<li>{esc(text)} <span class="note">({esc(STATE_LABELS.get(state, "a quiet server"))})'
        "</span></li>" for state, text in READINGS.values())
    return f"""<section class="server" id="server-{i}" data-server="{esc(srv['server'])}" \
data-state="{esc(srv['state'])}">
<header><h2><span class="name">{esc(srv['server'])}</span>{model}</h2>
<p class="verdict"><span class="badge" data-f="state_label">{esc(t['state_label'])}</span>
<span class="reason" data-f="reason">{esc(t['reason'])}</span></p>
<p class="asof" data-f="as_of">{esc(t['as_of'])}</p>
<p class="down note">The four blocks come back with the server's first answer.</p></header>
<div class="blocks">
<article class="block"><h3>Pressure now</h3><dl>{pressure}</dl></article>
<article class="block"><h3>Baseline since start</h3><dl>{baseline}</dl>
<p class="note">Cumulative counters since the server started; averages over all its requests.</p>
</article>
<article class="block"><h3>Where requests are</h3><dl>{stages}</dl></article>
<article class="block"><h3>Tokens, trends and GPUs</h3><dl>{tokens}</dl>
<div class="sparks">{sparks}</div>
<h4>GPUs</h4><dl>{energy}</dl>{_list("gpus", disp["lists"]["gpus"], "gpus")}
<h4>Reading the signals</h4>{_list("patterns", disp["lists"]["patterns"], "patterns")}
<details><summary>The reading patterns, and the state each points to</summary>
<ul>{patterns}</ul></details>
</article>
</div></section>"""


def pools_section(pools: list[dict[str, Any]]) -> str:
    """The PD pools above the servers: one verdict per pool, and which servers form it."""
    if not pools:
        return ""
    cards = "".join(
        f'<div class="pool" id="pool-{i}" data-pool="{esc(pool["pool"])}" '
        f'data-state="{esc(pool["state"])}"><h3>{esc(POOL_TITLES[pool["pool"]])} '
        f'<span class="note" data-f="members">{esc(pool["display"]["text"]["members"])}</span>'
        f'</h3><p class="verdict"><span class="badge" data-f="state_label">'
        f'{esc(pool["display"]["text"]["state_label"])}</span> <span class="reason" '
        f'data-f="reason">{esc(pool["display"]["text"]["reason"])}</span></p>'
        f'{_list("servers", pool["display"]["lists"]["servers"], "members")}</div>'
        for i, pool in enumerate(pools))
    return ('<section class="pools"><h2>Prefill/decode pools</h2>'
            '<p class="note">Each server\'s pool is its role, the disaggregation_mode its '
            "/server_info reports; the verdicts are the recording rules' pool states, over the "
            f"servers this exporter polls.</p>{cards}</section>")


def page(board: StatusBoard, telemetry_path: str, targets: list[str]) -> bytes:
    return page_bytes(status_with_display(board), telemetry_path, targets)


def page_bytes(status: dict[str, Any], telemetry_path: str, targets: list[str]) -> bytes:
    sections = "\n".join(server_section(i, srv) for i, srv in enumerate(status["servers"]))
    if not status["servers"]:
        sections = "<p>No SGLang server is polled (--no-collector.sglang).</p>"
    host = status["display"]["lists"]["host_gpus"]
    host_html = (f'<section class="host"><h2>GPUs of this host</h2>{_list("host_gpus", host)}'
                 "</section>" if host else "")
    interval = shown.number(status["poll_interval_seconds"], "g", "seconds")
    # Each target through shown.url: no userinfo, query or fragment ever shows (the CLI refuses
    # them; a caller that did not is covered too).
    target_items = "".join(f"<li>{esc(shown.url(t))}</li>" for t in targets)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>SGLang at a glance</title>
<link rel="stylesheet" href="/glance.css?v={esc(__version__)}">
<link rel="icon" href="/favicon.svg" type="image/svg+xml">
<noscript><meta http-equiv="refresh" content="{REFRESH_SECONDS}"></noscript>
<script src="/glance.js?v={esc(__version__)}" defer></script>
</head><body>
<header class="top"><h1>SGLang at a glance</h1>
<p class="meta">{len(status['servers'])} server(s), polled every {esc(interval)} s by the
exporter · <span data-g="updated">{esc(status['display']['text']['updated'])}</span> ·
<span class="live-off">reloads every {REFRESH_SECONDS} s</span><span class="live-on">live,
every {POLL_SECONDS} s</span><span class="stale" data-g="stale"></span></p></header>
<main>
{pools_section(status["pools"])}
{sections}
{host_html}
</main>
<footer>
<h2>SGLang observability exporter</h2>
<p>Version {esc(__version__)}. Derived signals for SGLang servers: KV occupancy, continuous
queueing time, prefill backlog, effective configuration, and the exporter's own health. The
verdict above is the recording rules' state classification (prometheus/thresholds.yml), computed
here from the exporter's own polls: no Prometheus, no Grafana.</p>
<p><a href="{esc(telemetry_path)}">Metrics</a> · <a href="/sd/sglang">SGLang targets (Prometheus
HTTP SD)</a> · <a href="/api/v1/status">Status as JSON</a></p>
<h3>Targets</h3><ul>{target_items}</ul>
</footer>
</body></html>
""".encode()


def stylesheet() -> bytes:
    states = "\n".join(
        [f'.server[data-state="{name}"] {{ --state: {colour}; }}'
         for name, colour in STATE_COLOURS.items()]
        + [f'.pool[data-state="{name}"] {{ --state: {colour}; }}'
           for name, colour in PD_STATE_COLOURS.items()])
    return (_CSS + states + "\n").encode()


_CSS = """:root { color-scheme: light; --ink: #1d232b; --muted: #5b6470; --line: #d9dee5;
  --card: #ffffff; --bg: #f3f5f8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--ink); background: var(--bg); }
header.top, main, footer { padding: 0 16px; max-width: 1600px; margin: 0 auto; }
header.top h1 { font-size: 20px; margin: 12px 0 2px; }
.meta, .asof, .note { color: var(--muted); font-size: 12px; }
.meta { margin: 0 0 10px; }
.live-on { display: none; }
html[data-live] .live-on { display: inline; }
html[data-live] .live-off { display: none; }
.stale { color: #b00020; margin-left: 6px; }
.server { background: var(--card); border: 1px solid var(--line);
  border-left: 6px solid var(--state, #999); border-radius: 6px; margin: 0 0 14px;
  padding: 10px 12px; }
.server h2 { font-size: 16px; margin: 0; overflow-wrap: anywhere; }
.server .model { color: var(--muted); font-weight: normal; margin-left: 8px; }
.verdict { margin: 6px 0 0; font-size: 15px; }
.badge { display: inline-block; background: var(--state, #999); color: #fff; font-weight: 600;
  border-radius: 4px; padding: 1px 8px; margin-right: 6px; }
.server[data-state="idle"] .badge, .pool[data-state="idle"] .badge { color: var(--ink); }
.pools { margin: 0 0 14px; }
.pools h2 { font-size: 15px; margin: 0 0 2px; }
.pool { background: var(--card); border: 1px solid var(--line);
  border-left: 6px solid var(--state, #999); border-radius: 6px; margin: 6px 0 0;
  padding: 8px 12px; }
.pool h3 { font-size: 15px; margin: 0; }
ul.members { margin-top: 4px; }
.role { display: inline-block; border: 1px solid var(--line); border-radius: 4px;
  padding: 0 6px; margin-left: 8px; font-size: 12px; font-weight: normal; }
.asof { margin: 2px 0 0; }
.server[data-state="unavailable"] .blocks { display: none; }
.server .down { display: none; }
.server[data-state="unavailable"] .down { display: block; }
.blocks { display: grid; grid-template-columns: minmax(0, 1fr); gap: 10px; margin-top: 10px; }
@media (min-width: 720px) { .blocks { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
@media (min-width: 1200px) {
  .blocks { grid-template-columns: repeat(3, minmax(0, 1fr)) minmax(0, 1.7fr); }
}
.block { border: 1px solid var(--line); border-radius: 5px; padding: 8px 10px; min-width: 0; }
.block h3 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em;
  color: var(--muted); margin: 0 0 6px; }
.block h4 { font-size: 12px; margin: 10px 0 4px; }
dl { margin: 0; }
.row { display: flex; justify-content: space-between; gap: 8px;
  border-bottom: 1px dotted var(--line); padding: 2px 0; }
dt { color: var(--ink); flex: 1 1 0; }
dd { margin: 0; font-variant-numeric: tabular-nums; text-align: right; font-weight: 600;
  flex: 0 1 auto; max-width: 60%; overflow-wrap: anywhere; }
.sparks { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 6px 10px;
  margin-top: 8px; }
.spark { margin: 0; min-width: 0; }
.spark figcaption { font-size: 12px; }
.spark .now { display: block; color: var(--muted); font-variant-numeric: tabular-nums; }
.spark svg { display: block; width: 100%; height: 32px; background: #f7f8fa;
  border-radius: 3px; }
.spark .line { fill: none; stroke: var(--state, #555); stroke-width: 1.5;
  vector-effect: non-scaling-stroke; }
ul { margin: 0; padding-left: 18px; }
ul.patterns li, ul.gpus li { margin: 2px 0; }
details { margin-top: 6px; color: var(--muted); font-size: 12px; }
.host { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 12px; margin-bottom: 14px; }
.host h2 { font-size: 15px; margin: 0 0 6px; }
footer { color: var(--muted); font-size: 12px; padding-bottom: 24px; }
footer h2 { font-size: 14px; color: var(--ink); }
@media (min-width: 1200px) { .sparks { grid-template-columns: repeat(3, minmax(0, 1fr)); } }
@media (max-width: 480px) {
  header.top, main, footer { padding: 0 8px; }
  .sparks { grid-template-columns: 1fr; }
}
"""

SCRIPT = f"""// The glance page, live: /api/v1/status every {POLL_SECONDS} s, written into the
// page's elements as text (textContent, setAttribute), never as HTML.
(function () {{
  "use strict";
  var INTERVAL = {POLL_SECONDS * 1000};
  document.documentElement.setAttribute("data-live", "");
  function own(object, key) {{
    return Object.prototype.hasOwnProperty.call(object, key);
  }}
  function fill(root, display) {{
    root.querySelectorAll("[data-f]").forEach(function (el) {{
      var key = el.getAttribute("data-f");
      if (own(display.text, key)) el.textContent = display.text[key];
    }});
    root.querySelectorAll("[data-p]").forEach(function (el) {{
      var key = el.getAttribute("data-p");
      if (own(display.paths, key)) el.setAttribute("d", display.paths[key]);
    }});
    root.querySelectorAll("[data-l]").forEach(function (el) {{
      var key = el.getAttribute("data-l");
      if (!own(display.lists, key)) return;
      while (el.firstChild) el.removeChild(el.firstChild);
      display.lists[key].forEach(function (text) {{
        var li = document.createElement("li");
        li.textContent = text;
        el.appendChild(li);
      }});
    }});
  }}
  function apply(status) {{
    status.servers.forEach(function (server, i) {{
      var section = document.getElementById("server-" + i);
      if (!section || section.getAttribute("data-server") !== server.server) return;
      section.setAttribute("data-state", server.state);
      fill(section, server.display);
    }});
    (status.pools || []).forEach(function (pool, i) {{
      var section = document.getElementById("pool-" + i);
      if (!section || section.getAttribute("data-pool") !== pool.pool) return;
      section.setAttribute("data-state", pool.state);
      fill(section, pool.display);
    }});
    document.querySelectorAll("[data-g]").forEach(function (el) {{
      var key = el.getAttribute("data-g");
      el.textContent = own(status.display.text, key) ? status.display.text[key] : "";
    }});
    var host = document.querySelector("[data-l=host_gpus]");
    if (host) fill(host.parentNode, {{text: {{}}, paths: {{}}, lists: status.display.lists}});
    document.documentElement.setAttribute("data-live", String(status.generated_at));
  }}
  function stale() {{
    var el = document.querySelector("[data-g=stale]");
    if (el) el.textContent = "the exporter did not answer; retrying";
  }}
  function poll() {{
    fetch("/api/v1/status", {{cache: "no-store", credentials: "same-origin"}})
      .then(function (r) {{ return r.ok ? r.json() : Promise.reject(r.status); }})
      .then(apply, stale)
      .then(function () {{ window.setTimeout(poll, INTERVAL); }});
  }}
  window.setTimeout(poll, INTERVAL);
}})();
"""

FAVICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
           b'<rect width="16" height="16" rx="3" fill="#2ca02c"/></svg>')


class GlancePages:
    """The glance page's routes, for web.make_app: path -> (status, headers, body) or None.

    The status is computed at most once per `cache_seconds` (the poll interval's order): any
    number of open pages cost one computation a second, done by the HTTP worker that asks first
    while the others wait for it."""

    def __init__(self, board: StatusBoard, telemetry_path: str, targets: list[str],
                 cache_seconds: float = CACHE_SECONDS, clock=time.monotonic):
        self.board = board
        self.telemetry_path = telemetry_path
        self.targets = list(targets)
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._computed_at: float | None = None
        self._bodies: dict[str, bytes] = {}
        self._css = stylesheet()
        self._js = SCRIPT.encode()

    def _body(self, kind: str) -> bytes:
        with self._lock:
            now = self._clock()
            if self._computed_at is None or now - self._computed_at >= self.cache_seconds:
                self._status = status_with_display(self.board)
                self._computed_at = now
                self._bodies = {}
            if kind not in self._bodies:
                self._bodies[kind] = (json_bytes(self._status) if kind == "json" else
                                      page_bytes(self._status, self.telemetry_path,
                                                 self.targets))
            return self._bodies[kind]

    def answer(self, path: str) -> tuple[str, list[tuple[str, str]], bytes] | None:
        if path in ("/", "/api/v1/status"):
            try:
                body = self._body("page" if path == "/" else "json")
            except Exception:  # a bug here costs the page, never the exporter
                log.exception("the glance page failed")
                return ("500 Internal Server Error",
                        [("Content-Type", "text/plain; charset=utf-8"), *SECURITY_HEADERS],
                        b"The status could not be computed; /metrics is not affected.\n")
            return self._ok("text/html; charset=utf-8" if path == "/" else "application/json",
                            body)
        if path == "/glance.css":
            return self._ok("text/css; charset=utf-8", self._css, cache=True)
        if path == "/glance.js":
            return self._ok("text/javascript; charset=utf-8", self._js, cache=True)
        if path == "/favicon.svg":
            return self._ok("image/svg+xml", FAVICON, cache=True)
        return None

    @staticmethod
    def _ok(content_type: str, body: bytes, cache: bool = False):
        headers = [("Content-Type", content_type), *SECURITY_HEADERS,
                   ("Cache-Control", "max-age=300" if cache else "no-store")]
        return "200 OK", headers, body
