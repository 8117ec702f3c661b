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

For readers of many lines (`sglang-obs analyze-log`), `BatchLayouts` learns the layouts of the
batch lines parse_line has read and reads later lines in one of them with a single strict regex:
the same numbers, in a fraction of the time; any other line is left to parse_line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["KINDS", "MAX_LINE_BYTES", "MAX_MESSAGE_CHARS", "BatchLayouts", "LineReader",
           "ParsedLine", "parse_line"]

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


# -- A fast path for reading many lines of one release (`sglang-obs analyze-log`) -------------
# Values exactly as _pairs accepts them, with no blank around them (the longest each can be).
# (`(?:X|)` is `(?:X)?` for re, only faster.)
_VALUE = {_I: ("[0-9]{1,18}", 18), _F: (r"[0-9]{1,18}(?:\.[0-9]{1,18}|)", 37),
          _B: ("(?:True|False)", 5)}
_VALUE_CHECK = {kind: re.compile(pattern, re.ASCII) for kind, (pattern, _) in _VALUE.items()}
# A pair _pairs ignores whatever it holds (MFU, device-timer, newer fields): its key is printable
# ASCII, none of the table's (the lookahead), with no ":" or "," and no blank at either end (so
# it is the whole key, stripped); its value is printable ASCII with no ",".
_OTHER_PAIR = {prefill: "(?!(?:" + "|".join(map(re.escape, table)) + "): )"
               r"[\x21-\x2b\x2d-\x39\x3b-\x7e](?:[\x20-\x2b\x2d-\x39\x3b-\x7e]{0,62}"
               r"[\x21-\x2b\x2d-\x39\x3b-\x7e])?: [\x20-\x2b\x2d-\x7e]{0,64}"
               for prefill, table in ((True, _PREFILL), (False, _DECODE))}
_OTHER_CHECK = {prefill: re.compile(pattern) for prefill, pattern in _OTHER_PAIR.items()}
_OTHER_MAX = 64 + 2 + 64
# _PREFIX with the date and the hour:minute in one group, then the second (00-59 only: a line
# with no such time takes parse_line), the milliseconds and the ranks; then _BATCH_HEAD with at
# most 8 blanks after it.
# (The ranks are followed by "]", so giving none back (*+) changes nothing.)
_FAST_PREFIX = (r"\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}):([0-5][0-9])(?:\.([0-9]{3})|)"
                r"((?: (?:TP|DP|PP|EP|ATTN_CP|MOE_DP)[0-9]{1,6})*+)\] ")
_FAST_HEAD, _FAST_HEAD_MAX = r" batch(?: \[[0-9]{1,18}\]|)[.,] {1,8}", len(" batch [] ,") + 18 + 8
_WRAPPER_BYTES = re.compile(_WRAPPER.pattern.encode("ascii"))  # on ASCII lines only
_NEVER = re.compile(rb"(?!)")


class BatchLayouts:
    """Prefill and decode lines in a layout seen before, each read by one strict regex: the
    fast path of a reader of many lines (`sglang-obs analyze-log`), which gives exactly the
    numbers parse_line gives for the line, or nothing (then parse_line reads it).

    A layout is the keys of a batch line in the order a release prints them. One is learned
    (`learn`) from a line parse_line read as a prefill or decode line when each of the line's
    `key: value` pairs either has a key of `_PREFILL`/`_DECODE` as it is there and its value in
    the form _pairs accepts with no blank around it, or is one _pairs ignores whatever it holds
    (_OTHER_PAIR: printable ASCII, a key none of the table's), the last pair perhaps followed by
    ", " (some releases) -- so a layout, and the regex built from it, hold only this module's
    own text, never the line's. The regex is _PREFIX, then _BATCH_HEAD (at most 8 blanks after
    it), then exactly those pairs (each ignored one as _OTHER_PAIR) and the end of the line
    (carriage returns aside, as the readers strip them): no part of a line it matches holds
    ", ", so the line splits into the same pairs, each known one valid, and parse_line would
    read the same kind and the same values; its message is never over MAX_MESSAGE_CHARS (a
    longer layout is not learned). Anything else -- another kind, a malformed pair, blanks, a
    non-ASCII line after a wrapper -- does not match. A line after one of the wrappers parse_line
    knows matches from where the wrapper ends, if the line is ASCII.

    `regex` holds every layout learned, one alternative each; a match's `lastindex` keys
    `layouts`: (prefill?, the group numbers of the date and hour:minute, the second, the
    milliseconds, the ranks' text, then of each of `fields` -- a group that never takes part,
    so None, where the layout has no such field). At most `limit` layouts are learned, and at
    most `tries` lines are looked at to learn them.
    """

    def __init__(self, fields: tuple[str, ...], limit: int = 16, tries: int = 1024):
        self.fields = fields
        self.regex: re.Pattern[bytes] = _NEVER
        self.layouts: dict[int, tuple[bool, tuple[int, ...]]] = {}
        # prefill?, the keys (None: a pair read as _OTHER_PAIR), a trailing ", "?
        self._known: list[tuple[bool, tuple[str | None, ...], bool]] = []
        self._limit, self._tries = limit, tries

    def match(self, line: bytes) -> re.Match[bytes] | None:
        """The match of a line (bytes, without its newline) in a known layout, else None."""
        m = self.regex.match(line)
        if m is None and line[:1] != b"[":
            return self.wrapped(line)
        return m

    def wrapped(self, line: bytes) -> re.Match[bytes] | None:
        """The match of a line after a wrapper (_WRAPPER); only an ASCII line is matched, where
        the bytes pattern and parse_line's str pattern read the same."""
        if not line.isascii():
            return None
        wrapper = _WRAPPER_BYTES.match(line)
        if wrapper is None or wrapper.end() > MAX_WRAPPER:
            return None
        return self.regex.match(line, wrapper.end())

    def read(self, line: bytes) -> tuple[bool, tuple[bytes | None, ...]] | None:
        """(prefill?, the groups listed in `layouts`) of a line in a known layout, else None."""
        m = self.match(line)
        if m is None:
            return None
        prefill, groups = self.layouts[m.lastindex]
        return prefill, m.group(*groups)

    @staticmethod
    def dp_rank(ranks: bytes) -> int:
        """The DP rank in the ranks' text of a match (b" DP1 TP0"), as parse_line's
        `ranks.get("DP", 0)` gives it."""
        return {tag: int(i) for tag, i in _RANK.findall(ranks.decode("ascii"))}.get("DP", 0)

    def learn(self, line: bytes, parsed: ParsedLine | None) -> bool:
        """Learn the layout of `line`, which parse_line read as `parsed`; True if it is a new
        one (`regex` and `layouts` then include it)."""
        if (parsed is None or parsed.kind not in ("prefill", "decode") or self._tries <= 0
                or len(self._known) >= self._limit):
            return False
        self._tries -= 1
        try:
            layout = self._layout(line, parsed)
        except Exception:  # never: a reader must survive any line
            return False
        if layout is None or layout in self._known:
            return False
        self._known.append(layout)
        self._compile()
        return True

    def _layout(self, line: bytes,
                parsed: ParsedLine) -> tuple[bool, tuple[str | None, ...], bool] | None:
        if not line.isascii():
            return None
        text = line.decode("ascii").rstrip("\r")
        m = _PREFIX.match(text)
        if m is None:
            wrapper = _WRAPPER.match(text)
            if wrapper is None or wrapper.end() > MAX_WRAPPER:
                return None
            m = _PREFIX.match(text, wrapper.end())
            if m is None:
                return None
        head = _BATCH_HEAD.match(text, m.end())
        if head is None:
            return None
        prefill = head.group(1) == "Prefill"
        table = _PREFILL if prefill else _DECODE
        parts = text[head.end():].split(", ")
        trailing = len(parts) > 1 and parts[-1] == ""
        if trailing:
            parts.pop()
        keys: list[str | None] = []  # None: a pair _pairs ignores (_OTHER_PAIR)
        longest = len("Prefill") + _FAST_HEAD_MAX + 2 * len(parts)
        for part in parts:
            key, sep, value = part.partition(": ")
            spec = table.get(key)
            if sep and spec is not None and _VALUE_CHECK[spec[1]].fullmatch(value):
                keys.append(key)
                longest += len(key) + 2 + _VALUE[spec[1]][1]
            elif (sep and table.get(key.strip()) is None
                  and _OTHER_CHECK[prefill].fullmatch(part)):
                keys.append(None)
                longest += _OTHER_MAX
            else:
                return None
        if longest > MAX_MESSAGE_CHARS:
            return None
        layout = (prefill, tuple(keys), trailing)
        # The regex of this layout alone, every value captured, must read this line as parse_line
        # did (it always does: a check that the two stay one).
        pattern = _FAST_PREFIX + self._alternative(layout, {n for n, _ in table.values()})[0]
        m = re.compile(pattern.encode("ascii") + rb"\r*\Z").match(line, m.start())
        if m is None:
            return None
        fields: dict[str, float | int | bool] = {}
        for key, value in zip([k for k in keys if k is not None], m.groups()[4:], strict=True):
            name, kind = table[key]
            fields[name] = (int(value) if kind == _I else float(value) if kind == _F
                            else value == b"True")
        rest = {k: v for k, v in parsed.fields.items() if k != "iteration"}
        return layout if fields == rest and all(
            type(fields[k]) is type(rest[k]) for k in rest) else None

    @staticmethod
    def _alternative(layout: tuple[bool, tuple[str | None, ...], bool],
                     wanted: set[str]) -> tuple[str, list[str]]:
        """The regex of one layout after the prefix, and the fields it captures, in order."""
        prefill, keys, trailing = layout
        table = _PREFILL if prefill else _DECODE
        pairs, captured = [], []
        for key in keys:
            if key is None:
                pairs.append(_OTHER_PAIR[prefill])
                continue
            name, kind = table[key]
            value = _VALUE[kind][0]
            if name in wanted:
                pairs.append(f"{re.escape(key)}: ({value})")
                captured.append(name)
            else:
                pairs.append(f"{re.escape(key)}: (?:{value})")
        body = ", ".join(pairs) + (", " if trailing else "")
        return ("Prefill" if prefill else "Decode") + _FAST_HEAD + body, captured

    def _compile(self) -> None:
        alternatives, where, group = [], [], 5  # groups 1-4: the prefix's
        wanted = set(self.fields)
        for layout in self._known:
            pattern, captured = self._alternative(layout, wanted)
            at: dict[str, int] = {}
            for name in captured:
                at[name] = group  # a key twice: the later one, as in _pairs
                group += 1
            alternatives.append(pattern + "()")  # the marker: the last group of a match
            where.append((layout[0], group, at))
            group += 1
        never = group  # (?:|()) never takes its second branch: group `never` stays None
        self.regex = re.compile(
            (_FAST_PREFIX + "(?:" + "|".join(alternatives) + r")\r*\Z(?:|())").encode("ascii"))
        self.layouts = {marker: (prefill, (1, 2, 3, 4, *(at.get(n, never) for n in self.fields)))
                        for prefill, marker, at in where}
