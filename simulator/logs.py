"""Render scheduler events as the log lines a given SGLang release prints.

The formats follow SGLang's scheduler logger (the prefix `[YYYY-MM-DD HH:MM:SS<ranks>] `, with
`.mmm` after the seconds only under SGLANG_LOG_MS=1; `Prefill batch` and `Decode batch` lines
from the stats rank only), so that the
exporter's log parser, alert rehearsals and demos see the same bytes a real server writes, per
release family. Only what a stock server prints with default logging is produced (no PD, no MFU,
no SGLANG_LOG_FORWARD_ITERS).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sglang_obs.simulator.events import (
    DecodeBatch,
    Event,
    HealthCheckFailed,
    PrefillBatch,
    Ready,
    Retraction,
    StartupCapacity,
)

__all__ = ["RELEASES", "format_event", "prefix"]


@dataclass(frozen=True)
class _Style:
    """What differs between release families (reference §10, per-release table)."""

    header_sep: str  # after "Prefill batch" / "Decode batch": ". " or ", "
    trailing_sep: bool  # the line keeps its final ", " (0.4.10.post2-0.5.8)
    rank_order: tuple[str, ...]  # order of the rank tags in the prefix
    prefill_tail: tuple[str, ...]  # fields after #queue-req, in order: "pending", "graph", "tput"
    accept_rate: bool  # spec decoding prints "accept rate" after "accept len" (0.5.5+)
    retract_v5: bool  # "KV cache pool is full. Retract requests." with #new_tokens_gained
    capacity_mem: bool  # capacity line ends with available_gpu_mem=X.XX GB (0.5.5+)


_STYLE_0_4_6 = _Style(
    header_sep=". ",
    trailing_sep=False,
    rank_order=("DP", "TP", "PP"),
    prefill_tail=(),
    accept_rate=False,
    retract_v5=False,
    capacity_mem=False,
)
_STYLE_0_5_5 = _Style(
    header_sep=", ",
    trailing_sep=True,
    rank_order=("DP", "TP", "EP", "PP"),
    prefill_tail=(),
    accept_rate=True,
    retract_v5=True,
    capacity_mem=True,
)
# 0.5.12+: #pending-token, graph before input throughput, no trailing ", ". The rank order is the
# one §10 gives for the current release (DP, PP, [ATTN_CP, MOE_DP,] TP, EP).
_STYLE_0_5_12 = _Style(
    header_sep=", ",
    trailing_sep=False,
    rank_order=("DP", "PP", "TP", "EP"),
    prefill_tail=("pending", "graph", "tput"),
    accept_rate=True,
    retract_v5=True,
    capacity_mem=True,
)

_STYLES: dict[str, _Style] = {
    "0.4.6.post5": _STYLE_0_4_6,
    "0.4.6": _STYLE_0_4_6,
    "0.5.5": _STYLE_0_5_5,
    "0.5.12": _STYLE_0_5_12,
    "0.5.23": _STYLE_0_5_12,
}

RELEASES: tuple[str, ...] = ("0.4.6.post5", "0.5.5", "0.5.12", "0.5.23")

_READY = "The server is fired up and ready to roll!"


def _style(release: str) -> _Style:
    try:
        return _STYLES[release]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown SGLang release {release!r}; supported: {', '.join(RELEASES)}"
        ) from None


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def prefix(
    ts: float,
    release: str,
    *,
    dp_rank: int | None = None,
    tp_size: int = 1,
    dp_size: int = 1,
    pp_size: int = 1,
    ep_size: int = 1,
    log_ms: bool = False,
    scheduler: bool = True,
) -> str:
    """`[YYYY-MM-DD HH:MM:SS(.mmm)<ranks>] ` as the stats rank (TP0, PP0, EP0) prints it.

    `scheduler=False` is for lines of the main process (ready, health check), which carry no
    ranks. Milliseconds are truncated, like logging's `%(msecs)03d`.
    """
    style = _style(release)
    when = _utc(ts)
    stamp = when.strftime("%Y-%m-%d %H:%M:%S")
    if log_ms:
        stamp += f".{when.microsecond // 1000:03d}"
    ranks = ""
    if scheduler:
        sizes = {"TP": tp_size, "PP": pp_size, "EP": ep_size}
        for tag in style.rank_order:
            if tag == "DP":
                if dp_size > 1:
                    ranks += f" DP{dp_rank if dp_rank is not None else 0}"
            elif sizes[tag] > 1:
                ranks += f" {tag}0"
    return f"[{stamp}{ranks}] "


def _join(parts: list[str], style: _Style) -> str:
    return ", ".join(parts) + (", " if style.trailing_sep else "")


def _prefill(e: PrefillBatch, style: _Style) -> str:
    parts = [
        f"#new-seq: {e.new_seq}",
        f"#new-token: {e.new_token}",
        f"#cached-token: {e.cached_token}",
        f"token usage: {e.token_usage:.2f}",
        f"#running-req: {e.running_req}",
        f"#queue-req: {e.queue_req}",
    ]
    for item in style.prefill_tail:
        if item == "pending":
            parts.append(f"#pending-token: {e.pending_token}")
        elif item == "graph":
            parts.append(f"cuda graph: {bool(e.cuda_graph)}")
        elif item == "tput":
            parts.append(f"input throughput (token/s): {e.input_throughput:.2f}")
    return "Prefill batch" + style.header_sep + _join(parts, style)


def _decode(e: DecodeBatch, style: _Style) -> str:
    parts = [
        f"#running-req: {e.running_req}",
        f"#token: {e.num_token}",
        f"token usage: {e.token_usage:.2f}",
    ]
    if e.accept_len is not None:
        parts.append(f"accept len: {e.accept_len:.2f}")
        if style.accept_rate:
            rate = e.accept_rate if e.accept_rate is not None else 0.0
            parts.append(f"accept rate: {rate:.2f}")
    parts += [
        f"cuda graph: {bool(e.cuda_graph)}",
        f"gen throughput (token/s): {e.gen_throughput:.2f}",
        f"#queue-req: {e.queue_req}",
    ]
    return "Decode batch" + style.header_sep + _join(parts, style)


def _retraction(e: Retraction, style: _Style) -> str:
    ratio = f"#new_token_ratio: {e.new_token_ratio_before:.4f} -> {e.new_token_ratio_after:.4f}"
    if style.retract_v5:
        return (
            "KV cache pool is full. Retract requests. "
            f"#retracted_reqs: {e.retracted_reqs}, "
            f"#new_tokens_gained: {e.new_tokens_gained}, {ratio}"
        )
    return f"Decode out of memory happened. #retracted_reqs: {e.retracted_reqs}, {ratio}"


def _capacity(e: StartupCapacity, style: _Style) -> str:
    msg = (
        f"max_total_num_tokens={e.max_total_num_tokens}, "
        f"chunked_prefill_size={e.chunked_prefill_size}, "
        f"max_prefill_tokens={e.max_prefill_tokens}, "
        f"max_running_requests={e.max_running_requests}, "
        f"context_len={e.context_len}"
    )
    if style.capacity_mem:
        msg += f", available_gpu_mem={e.available_gpu_mem_gb:.2f} GB"
    return msg


def _seconds(value: float) -> str:
    """SGLANG_HEALTH_CHECK_TIMEOUT is an int upstream; keep a fraction only if there is one."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _health(e: HealthCheckFailed) -> str:
    tic = _utc(e.tic).strftime("%H:%M:%S")
    beat = _utc(e.last_heartbeat).strftime("%H:%M:%S")
    return (
        "Health check failed. Server couldn't get a response from detokenizer for last "
        f"{_seconds(e.seconds)} seconds. tic start time: {tic}. last_heartbeat time: {beat}"
    )


def format_event(
    event: Event,
    release: str,
    *,
    tp_size: int = 1,
    dp_size: int = 1,
    pp_size: int = 1,
    ep_size: int = 1,
    log_ms: bool = False,
) -> str:
    """One log line (no newline) for `event` exactly as `release` prints it.

    Raises ValueError for an unknown release and TypeError for an unknown event type.
    """
    style = _style(release)
    scheduler = True
    dp_rank: int | None = None
    if isinstance(event, PrefillBatch):
        msg, dp_rank = _prefill(event, style), event.dp_rank
    elif isinstance(event, DecodeBatch):
        msg, dp_rank = _decode(event, style), event.dp_rank
    elif isinstance(event, Retraction):
        msg, dp_rank = _retraction(event, style), event.dp_rank
    elif isinstance(event, StartupCapacity):
        msg = _capacity(event, style)  # printed by every DP rank's TP0; DP0 stands for them
    elif isinstance(event, Ready):
        msg, scheduler = _READY, False
    elif isinstance(event, HealthCheckFailed):
        msg, scheduler = _health(event), False
    else:
        raise TypeError(f"not a scheduler event: {type(event).__name__}")
    head = prefix(
        event.ts,
        release,
        dp_rank=dp_rank,
        tp_size=tp_size,
        dp_size=dp_size,
        pp_size=pp_size,
        ep_size=ep_size,
        log_ms=log_ms,
        scheduler=scheduler,
    )
    return head + msg
