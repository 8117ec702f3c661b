"""Parse SGLang scheduler log lines (releases 0.4.6.post5 to 0.5.23) into numbers.

Log lines are the only source of some signals (retractions before they became a metric, the
effective capacity, health-check failures) and the fallback when /metrics is off, so the parser
has to be version tolerant (the prefix `[YYYY-MM-DD HH:MM:SS<.mmm with SGLANG_LOG_MS=1><ranks>]`,
ranks ` DP<n>` then ` PP<n>`, ` ATTN_CP<n>`, ` MOE_DP<n>`, ` TP<n>`, ` EP<n>` each only above size
1, no log level; batch fields whose set and order change between releases) and safe on whatever
a log stream holds: it never raises, and it only ever returns numbers and booleans, never text
from the line, so prompts or keys that end up in a log can't leak into metrics or labels.

Batch lines are read as `key: value` pairs rather than with one regex per release, so field order,
extra fields (PD, MFU, device timer, hybrid pools) and the trailing ", " of some releases don't
matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["KINDS", "MAX_LINE_BYTES", "MAX_MESSAGE_CHARS", "LineReader", "ParsedLine",
           "parse_line"]

KINDS = frozenset(
    {"prefill", "decode", "retraction", "capacity", "ready", "health_check_failed", "other"}
)

# Real batch lines stay well under 1 KB even with every optional field; anything much longer is
# not one, and skipping it bounds the work per line.
MAX_MESSAGE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One prefixed SGLang log line.

    `ts` is naive, as printed (SGLang logs local time; None if the printed date is impossible).
    `ranks` maps rank tags to indexes, e.g. {"DP": 1, "TP": 0}. `fields` holds only ints, floats
    and bools under normalised names (batch lines: see `_PREFILL` and `_DECODE`).
    """

    ts: datetime | None
    ranks: dict[str, int]
    kind: str
    fields: dict[str, float | int | bool]


_PREFIX = re.compile(
    r"\[([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{3}))?"
    r"((?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)[0-9]{1,6})*)\] ",
    re.ASCII,
)
_RANK = re.compile(r"([A-Z_]+?)([0-9]+)", re.ASCII)
_BATCH_HEAD = re.compile(r"(Prefill|Decode) batch(?: \[([0-9]{1,18})\])?[.,] +", re.ASCII)
_INT = re.compile(r"[0-9]{1,18}", re.ASCII)
_FLOAT = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,18})?", re.ASCII)
_RETRACT = re.compile(
    r"(?:KV cache pool is full\. Retract requests\.|Decode out of memory happened\.)"
    r" #retracted_reqs: ([0-9]{1,12})"
    r"(?:, #new_tokens_gained: (-?[0-9]{1,18}))?"
    r"(?:, #mamba_num_gained: (-?[0-9]{1,18}))?"
    r"(?:, #new_token_ratio: ([0-9]{1,9}\.[0-9]{1,9}) -> ([0-9]{1,9}\.[0-9]{1,9}))?",
    re.ASCII,
)
_CAPACITY = re.compile(
    r"max_total_num_tokens=([0-9]{1,18}), chunked_prefill_size=(-?[0-9]{1,18}|None), "
    r"max_prefill_tokens=([0-9]{1,18}), max_running_requests=([0-9]{1,18}), "
    r"context_len=([0-9]{1,18})(?:, available_(?:gpu|cpu)_mem=([0-9]{1,12}(?:\.[0-9]{1,9})?) GB)?",
    re.ASCII,
)
_HEALTH = re.compile(
    r"Health check failed\. Server couldn't get a response from detokenizer for last "
    r"([0-9]{1,12}(?:\.[0-9]{1,9})?) seconds",
    re.ASCII,
)
_READY = "The server is fired up and ready to roll!"

_I, _F, _B = 0, 1, 2  # value kinds
_GRAPH = {f"{backend} graph": ("cuda_graph", _B) for backend in ("cuda", "cpu", "npu", "musa")}

# Message key -> (field, value kind). Hybrid models: `token_usage`/`num_token` are the
# full-attention pool (§10), the SWA/SSM pools get their own fields. PD prefill's bootstrap queue
# was printed as #unbootstrapped-req (0.4.x), #prealloc-req (0.5.3-0.5.10) and
# #bootstrap-req (0.5.12+).
_PREFILL: dict[str, tuple[str, int]] = {
    "#new-seq": ("new_seq", _I),
    "#new-token": ("new_token", _I),
    "#cached-token": ("cached_token", _I),
    "token usage": ("token_usage", _F),
    "full token usage": ("token_usage", _F),
    "swa token usage": ("swa_token_usage", _F),
    "mamba usage": ("mamba_usage", _F),
    "#running-req": ("running_req", _I),
    "#queue-req": ("queue_req", _I),
    "#pending-token": ("pending_token", _I),
    "#replay-token": ("replay_token", _I),
    "#unbootstrapped-req": ("bootstrap_req", _I),
    "#prealloc-req": ("bootstrap_req", _I),
    "#bootstrap-req": ("bootstrap_req", _I),
    "#transferring-req": ("inflight_req", _I),
    "#inflight-req": ("inflight_req", _I),
    "#optimistic-req": ("optimistic_req", _I),
    "waiting-image-req": ("waiting_image_req", _I),
    "input throughput (token/s)": ("input_throughput", _F),
    **_GRAPH,
}
_DECODE: dict[str, tuple[str, int]] = {
    "#running-req": ("running_req", _I),
    "#token": ("num_token", _I),
    "#full token": ("num_token", _I),
    "token usage": ("token_usage", _F),
    "full token usage": ("token_usage", _F),
    "#swa token": ("swa_num_token", _I),
    "swa token usage": ("swa_token_usage", _F),
    "mamba num": ("mamba_num", _I),
    "mamba usage": ("mamba_usage", _F),
    "accept len": ("accept_len", _F),
    "accept rate": ("accept_rate", _F),
    "pre-allocated usage": ("prealloc_usage", _F),
    "#prealloc-req": ("prealloc_req", _I),
    "#transfer-req": ("transfer_req", _I),
    "#host-receive-req": ("host_receive_req", _I),
    "#retracted-req": ("pd_retracted_req", _I),
    "waiting-image-req": ("waiting_image_req", _I),
    "gen throughput (token/s)": ("gen_throughput", _F),
    "#queue-req": ("queue_req", _I),
    **_GRAPH,
}
_PREFILL_REQUIRED = ("new_seq", "new_token", "cached_token", "token_usage", "queue_req")
_DECODE_REQUIRED = ("running_req", "token_usage", "gen_throughput", "queue_req")


def _pairs(
    body: str, table: dict[str, tuple[str, int]], required: tuple[str, ...]
) -> dict[str, float | int | bool] | None:
    """Known `key: value` pairs of a batch line; None if one is malformed or a required one is
    missing. Unknown keys (and whatever text they carry) are ignored."""
    fields: dict[str, float | int | bool] = {}
    for part in body.split(", "):
        key, sep, value = part.partition(": ")
        if not sep:
            continue
        spec = table.get(key) or table.get(key.strip())
        if spec is None:
            continue
        name, kind = spec
        value = value.strip()
        if kind == _I:
            if not _INT.fullmatch(value):
                return None
            fields[name] = int(value)
        elif kind == _F:
            if not _FLOAT.fullmatch(value):
                return None
            fields[name] = float(value)
        elif value == "True":
            fields[name] = True
        elif value == "False":
            fields[name] = False
        else:
            return None
    for name in required:
        if name not in fields:
            return None
    return fields


def _message(msg: str) -> tuple[str, dict[str, float | int | bool]]:
    """Kind and fields of the message part of a line."""
    if len(msg) > MAX_MESSAGE_CHARS:
        return "other", {}
    head = _BATCH_HEAD.match(msg)
    if head is not None:
        prefill = head.group(1) == "Prefill"
        body = msg[head.end():]
        if prefill:
            fields = _pairs(body, _PREFILL, _PREFILL_REQUIRED)
        else:
            fields = _pairs(body, _DECODE, _DECODE_REQUIRED)
        if fields is None:
            return "other", {}
        if head.group(2) is not None:
            fields["iteration"] = int(head.group(2))
        return ("prefill" if prefill else "decode"), fields
    first = msg[:1]
    if first in ("K", "D"):
        m = _RETRACT.match(msg)
        if m is not None:
            fields = {"retracted_reqs": int(m.group(1))}
            if m.group(2) is not None:
                fields["new_tokens_gained"] = int(m.group(2))
            if m.group(3) is not None:
                fields["mamba_num_gained"] = int(m.group(3))
            if m.group(4) is not None:
                fields["new_token_ratio_before"] = float(m.group(4))
                fields["new_token_ratio_after"] = float(m.group(5))
            return "retraction", fields
    elif first == "m":
        m = _CAPACITY.match(msg)
        if m is not None:
            chunk = m.group(2)
            fields = {
                "max_total_num_tokens": int(m.group(1)),
                "chunked_prefill_size": -1 if chunk == "None" else int(chunk),
                "max_prefill_tokens": int(m.group(3)),
                "max_running_requests": int(m.group(4)),
                "context_len": int(m.group(5)),
            }
            if m.group(6) is not None:
                fields["available_gpu_mem_gb"] = float(m.group(6))
            return "capacity", fields
    elif first == "T":
        if msg.startswith(_READY):
            return "ready", {}
    elif first == "H":
        m = _HEALTH.match(msg)
        if m is not None:
            return "health_check_failed", {"seconds": float(m.group(1))}
    return "other", {}


# Another logger's wrapper in front of SGLang's line, the only text a line may start with:
# `docker compose logs` ("sglang-1  | "), a timestamp of `docker logs -t` or the CRI format
# ("2026-…Z stdout F "), journald/syslog ("Nov 29 11:51:14 host python[123]: "). Anything else
# before the prefix (a logged prompt that quotes a batch line, say) makes the line not SGLang's.
_WRAPPER = re.compile(
    r"[ \t]{0,8}"
    r"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,63} {1,32}\| )?"  # compose service
    r"(?:"
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})? (?:(?:stdout|stderr) [FP] )?"  # CRI, docker logs -t
    r"|"
    r"(?:[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.,]{8,18}(?:Z|[+-][0-9]{2}:?[0-9]{2})?)"
    r" \S{1,64} [^\s:\[\]]{1,64}(?:\[[0-9]{1,10}\])?: "  # journald, syslog
    r")?"
    r"[ \t]{0,8}(?=\[[0-9]{4}-[0-9]{2}-[0-9]{2} )",  # ...right before SGLang's prefix
    re.ASCII,
)
MAX_WRAPPER = 120

# The longest line read at all. SGLang's own lines are far shorter; a longer one (a logged
# prompt, a dump) is skipped whole by the readers (`LineReader`) and counted, never parsed.
MAX_LINE_BYTES = 64 * 1024


class LineReader:
    """Cuts a byte stream, fed in chunks of any size, into lines of at most `max_line` bytes
    (without the newline). A longer line is skipped whole, up to its newline however far that
    is, and counted in `too_long`: its bytes are never held, so memory stays within one chunk
    plus `max_line` whatever the stream holds, and no tail of it can pass for a line of its own.
    """

    __slots__ = ("max_line", "too_long", "_partial", "_skipping")

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self.max_line = max_line
        self.too_long = 0
        self._partial = bytearray()  # the start of a line whose newline has not come yet
        self._skipping = False  # inside a too-long line: drop everything to the next newline

    def reset(self) -> None:
        """Forget the unfinished line (the stream starts again, e.g. after a truncation)."""
        self._partial.clear()
        self._skipping = False

    def skip_to_newline(self) -> None:
        """The stream starts inside a line (a read began mid-file): drop up to its newline."""
        self._partial.clear()
        self._skipping = True

    def feed(self, chunk: bytes) -> list[bytes]:
        parts = chunk.split(b"\n")
        rest = parts.pop()
        lines: list[bytes] = []
        if parts:
            first = parts[0]
            if self._skipping:
                self._skipping = False
            elif len(self._partial) + len(first) > self.max_line:
                self.too_long += 1
            else:
                lines.append(bytes(self._partial) + first if self._partial else first)
            self._partial.clear()
            for i in range(1, len(parts)):
                if len(parts[i]) > self.max_line:
                    self.too_long += 1
                else:
                    lines.append(parts[i])
        if not self._skipping:
            if len(self._partial) + len(rest) > self.max_line:
                self._partial.clear()
                self._skipping = True
                self.too_long += 1
            else:
                self._partial += rest
        return lines

    def finish(self) -> bytes | None:
        """At the end of the stream: its last line if that had no newline, else None."""
        last = bytes(self._partial) if self._partial and not self._skipping else None
        self.reset()
        return last


def _parse(line: str) -> ParsedLine | None:
    m = _PREFIX.match(line)
    if m is None:
        wrapper = _WRAPPER.match(line)
        if wrapper is None or wrapper.end() > MAX_WRAPPER:
            return None
        m = _PREFIX.match(line, wrapper.end())
        if m is None:
            return None
    year, month, day, hour, minute, second, ms, rank_text = m.groups()
    try:
        ts: datetime | None = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            int(ms) * 1000 if ms else 0,
        )
    except ValueError:
        ts = None
    ranks = {tag: int(index) for tag, index in _RANK.findall(rank_text)} if rank_text else {}
    msg = line[m.end():].rstrip("\r\n")
    kind, fields = _message(msg)
    return ParsedLine(ts, ranks, kind, fields)


def parse_line(line: str) -> ParsedLine | None:
    """Parse one log line; None when it does not start with the `[YYYY-MM-DD HH:MM:SS…] `
    prefix (after one of the known wrappers). The readers (`LineReader`) never pass a line
    over `MAX_LINE_BYTES`; a longer one given here is at most kind "other".

    A prefixed line that is none of the known kinds (or is malformed) is kind "other".
    Never raises: bytes are decoded leniently, anything else yields None.
    """
    try:
        if not isinstance(line, str):
            if not isinstance(line, (bytes, bytearray)):
                return None
            line = bytes(line).decode("utf-8", errors="replace")
        return _parse(line)
    except Exception:  # a log parser must survive any input
        return None
