"""SGLang's per-request records (`--export-metrics-to-file`) read as numbers, and their stats.

One JSON object per finished request, `{"request_parameters": "<JSON string>", **meta_info}`
(docs/request-records.md has the fields per release, verified in SGLang's source). Only numbers
are read: `request_parameters` holds the prompt and is not decoded (bar `max_new_tokens`, for
the analyzer's slowest records: `read_params`, `request_parameters`); of a line in SGLang's
layout only its meta_info is (`_meta`). The finish reason becomes one of FINISH_REASONS, and
nothing else of a record's text is kept. `parse_record` and `parse_numbers` never raise: a
record they cannot use is a reason from REJECT_REASONS.

The prompt-length classes (PROMPT_CLASS_BOUNDS, the `request_classes` section of
prometheus/thresholds.yml: a test keeps the two equal) are the only label these records add, a
fixed set whatever the records hold.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_obs.core.safe_files import NOT_REGULAR, SYMLINK_OUTSIDE
from sglang_obs.exporter.sglang_log import LineReader

log = logging.getLogger(__name__)

# Prompt tokens: < 8K, 8K-32K, 32K-128K, >= 128K (prometheus/thresholds.yml request_classes).
PROMPT_CLASS_BOUNDS = (8192, 32768, 131072)
PROMPT_CLASSES = ("lt_8k", "8k_32k", "32k_128k", "ge_128k")
FINISH_REASONS = ("stop", "length", "abort", "other")
# Why a record was skipped (sglang_obs_request_records_rejected_total{reason}).
REJECT_REASONS = {
    "too_long": "a line over MAX_RECORD_BYTES, skipped unread",
    "not_json": "not one JSON object (garbage, a cut line, invalid UTF-8, nesting too deep)",
    "unknown_release": "no request_parameters string, or timing fields of two releases at once",
    "missing_field": "no prompt_tokens or e2e_latency",
    "wrong_type": "a field read here is not a number of the right kind (a bool is not one)",
    "not_finite": "NaN or infinity",
    "negative": "a negative duration or token count, or a first token before the request",
    "out_of_range": "beyond any real request (over 2^31 tokens, a duration over 30 days, a "
                    "timestamp outside 1970-2514, more cached than prompt tokens, TTFT > e2e)",
}
# Why a file found in the directory was refused, never opened
# (sglang_obs_request_files_rejected_total{reason}; sglang_obs.core.safe_files).
FILE_REJECT_REASONS = {
    SYMLINK_OUTSIDE: "a symbolic link to a file not in the directory itself: out of it, or in "
                     "a subdirectory",
    NOT_REGULAR: "named like a record file but a FIFO, device, socket or directory",
}

# Long-context records are large (the prompt text and, without --log-requests, its input ids
# are in request_parameters: some 3 MB for a 262K-token prompt); a longer line is skipped whole.
MAX_RECORD_BYTES = 8 * 1024 * 1024
# The analyzer reads max_new_tokens from request_parameters only when it is at most this long.
MAX_PARAMS_CHARS = 256 * 1024
MAX_TOKENS = 2**31
MAX_SECONDS = 30 * 86400.0
MAX_TIMESTAMP = 2.0**34  # unix seconds: the year 2514

# Histogram bounds (seconds): coarse on purpose, each series is per server x class.
TTFT_BOUNDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
QUEUE_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
E2E_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
TPOT_BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.5, 1.0)
HISTOGRAMS = {"ttft": TTFT_BOUNDS, "queue": QUEUE_BOUNDS, "e2e": E2E_BOUNDS, "tpot": TPOT_BOUNDS}

# Timing fields by the tokenizer manager that wrote them (docs/request-records.md):
# 0.5.6-0.5.9 (managers/tokenizer_manager.py `_calculate_timing_metrics`) and the later
# observability/req_time_stats.py `convert_to_output_meta_info`. Both need --enable-metrics.
TIMING_0_5_6 = ("request_sent_to_scheduler_ts", "prefill_finished_ts", "decode_finished_ts",
                "prefill_launch_delay")
TIMING_LATER = ("api_server_dispatch_finish_ts", "request_finished_ts", "forward_entry_time",
                "prefill_finished_time", "prefill_waiting_latency")

# json's own scanner, without json.loads' wrapping (a third of the cost), that leaves a JSON
# float as its text in bytes (no other JSON value becomes bytes): float() of it is what json
# gives, for the few fields read, and the others cost no conversion (half of the scan).
_SCAN = json.JSONDecoder(parse_float=str.encode).scan_once
_scanstring = json.decoder.scanstring
_bisect_right = bisect.bisect_right
_PREFIX = b'{"request_parameters": "'
_ID_KEY = b'", "id": '
_SGLANG_RID = re.compile(r"[0-9a-f]{32}"
                         r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Rejected(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def prompt_class(prompt_tokens: int) -> str:
    return PROMPT_CLASSES[bisect.bisect_right(PROMPT_CLASS_BOUNDS, prompt_tokens)]


def safe_request_id(value: object) -> str | None:
    """SGLang's own request ids (a uuid4, hex or dashed) as they are; any other id (a client
    may set its own, and it could hold anything) as `h:` and 16 hex digits of its SHA-256."""
    if not isinstance(value, str) or not value:
        return None
    if _SGLANG_RID.fullmatch(value):
        return value
    return "h:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 5x as much to build, per record
class Record:
    """One finished request, numbers only (times in seconds, unix time for *_at)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_seconds: float
    ttft_seconds: float | None
    queue_seconds: float | None
    tpot_seconds: float | None
    finish_reason: str
    prompt_class: str
    received_at: float | None
    finished_at: float | None
    release: str  # "0.5.6" (0.5.6-0.5.9), "later" (0.5.10+), or "untimed" (no timing fields)
    request_id: str | None = None  # only with keep_id (local reports), made safe
    max_new_tokens: int | None = None  # only with read_params (local reports)

    @property
    def prefill_seconds(self) -> float | None:
        """TTFT minus queueing: the prefill of this request and the batches it waited on."""
        if self.ttft_seconds is None or self.queue_seconds is None:
            return None
        return max(self.ttft_seconds - self.queue_seconds, 0.0)

    @property
    def decode_seconds(self) -> float | None:
        return None if self.ttft_seconds is None else max(self.e2e_seconds - self.ttft_seconds,
                                                          0.0)


_INF = math.inf


def _missing(required: bool) -> None:
    if required:
        raise Rejected("missing_field")


def _tokens(value: object, required: bool = False) -> int | None:
    """A token count: an int (a bool or a float is not one), 0 to MAX_TOKENS."""
    if value is None:
        return _missing(required)
    if type(value) is not int:
        raise Rejected("wrong_type")
    if value < 0:
        raise Rejected("negative")
    if value > MAX_TOKENS:
        raise Rejected("out_of_range")
    return value


def _real(value: object) -> float:
    kind = type(value)
    if kind is not float and kind is not int:  # a bool, a string, a list: not a number
        raise Rejected("wrong_type")
    if value != value or value == _INF or value == -_INF:
        raise Rejected("not_finite")
    return value


def _duration(value: object, required: bool = False) -> float | None:
    """Seconds: a finite number, 0 to MAX_SECONDS."""
    if value is None:
        return _missing(required)
    value = _real(value)
    if value < 0:
        raise Rejected("negative")
    if value > MAX_SECONDS:
        raise Rejected("out_of_range")
    return float(value)


def _timestamp(value: object) -> float | None:
    """Unix seconds, 0 to MAX_TIMESTAMP."""
    if value is None:
        return None
    value = _real(value)
    if not 0 <= value <= MAX_TIMESTAMP:
        raise Rejected("out_of_range")
    return float(value)


_KNOWN_REASONS = frozenset(FINISH_REASONS[:3])


def _meta(line: bytes) -> dict | None:
    """The meta_info of a line laid out as SGLang writes it, decoded alone, or None when the
    line must be parsed whole. Its meta_info starts at the last `", "id": ` (a `"` after a
    space cannot be inside a JSON string, so the prompt cannot fake it); what comes before is
    the request_parameters string, not read. The result is what json.loads of the whole line
    gives, less request_parameters, for every line whose request_parameters is a well-formed
    JSON string: anything else is left to the whole-line parse (a meta_info that is not exactly
    one JSON object to the end of the line, a second request_parameters key in it, or a record
    cut off by another written after it on the same line)."""
    if not line.startswith(_PREFIX):
        return None
    return _meta_at(line, 0, len(line))


def _meta_at(buf: bytes, start: int, end: int) -> dict | None:
    """_meta of buf[start:end], which starts with _PREFIX. Its floats are bytes (_SCAN)."""
    cut = buf.rfind(_ID_KEY, start + len(_PREFIX), end)
    if cut < 0:
        return None
    try:
        text = "{" + buf[cut + 3:end].decode()
        obj, stop = _SCAN(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return None
    if (stop != len(text) or type(obj) is not dict or "request_parameters" in obj
            or buf.find(_PREFIX, start + len(_PREFIX), cut) >= 0):  # a cut record, then another
        return None
    return obj


def _load(line: bytes) -> dict:
    """The record's meta_info (and whether request_parameters is a string), without decoding
    request_parameters when the line is laid out as SGLang writes it (`_meta`). Anything else
    is parsed whole."""
    obj = _meta(line)
    if obj is not None:
        obj["request_parameters"] = ""  # a string, left unread
        return obj
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise Rejected("not_json") from None
    if not isinstance(obj, dict):
        raise Rejected("not_json")
    return obj


class RecordReader(LineReader):
    """Cuts a byte stream, fed in chunks of any size, into records, as the scheduler log's
    LineReader cuts lines (same methods; a line over `max_line` is skipped whole, up to its
    newline however far, and counted in `too_long`), but without copying what the exporter
    never reads: of a line in SGLang's layout only `{"request_parameters": "` and its
    meta_info (from the last `", "id": `) are handed out, as a record whose request_parameters
    is empty. The prompt's bytes stay in the chunk they were read into; a long-context record
    costs no more to cut than a short one. A line split across two chunks is kept whole until
    its newline (at most `max_line` bytes).

    `feed_spans` hands out where each line is instead, (buffer, start, end), for `parse_span`
    (the analyzer), copying nothing."""

    __slots__ = ()

    def __init__(self, max_line: int = MAX_RECORD_BYTES):
        super().__init__(max_line)  # reset() and skip_to_newline() are the LineReader's

    @staticmethod
    def _compact(buf: bytes, start: int, end: int) -> bytes:
        if buf.startswith(_PREFIX, start):
            cut = buf.rfind(_ID_KEY, start + len(_PREFIX), end)
            # Not a record cut off by another written after it on the same line (a writer that
            # died mid-record, then the next one appending): that line is parsed whole.
            if cut >= 0 and buf.find(_PREFIX, start + len(_PREFIX), cut) < 0:
                return _PREFIX + buf[cut:end]
        return buf[start:end]

    def feed(self, chunk: bytes) -> list[bytes]:
        compact = self._compact
        return [compact(buf, start, end) for buf, start, end in self.feed_spans(chunk)]

    def feed_spans(self, chunk: bytes) -> list[tuple[bytes, int, int]]:
        """The chunk's complete lines (not empty, at most max_line bytes) as (buffer, start,
        end): buffer[start:end], without its newline. The buffer is the chunk, or for a line
        begun in an earlier chunk, that line."""
        out: list[tuple[bytes, int, int]] = []
        start, size = 0, len(chunk)
        if self._skipping or self._partial:
            newline = chunk.find(b"\n")
            if newline < 0:  # the whole chunk continues the unfinished line
                if not self._skipping:
                    if len(self._partial) + size > self.max_line:
                        self._partial.clear()
                        self._skipping = True
                        self.too_long += 1
                    else:
                        self._partial += chunk
                return out
            if self._skipping:
                self._skipping = False
            elif len(self._partial) + newline > self.max_line:
                self.too_long += 1
            else:
                line = bytes(self._partial) + chunk[:newline]
                out.append((line, 0, len(line)))
            self._partial.clear()
            start = newline + 1
        find, max_line, append = chunk.find, self.max_line, out.append
        while (newline := find(b"\n", start)) >= 0:
            if newline - start > max_line:
                self.too_long += 1
            elif newline > start:
                append((chunk, start, newline))
            start = newline + 1
        if start < size:
            if size - start > max_line:
                self._skipping = True
                self.too_long += 1
            else:
                self._partial += chunk[start:]
        return out


def parse_record(line: bytes | str, *, keep_id: bool = False,
                 read_params: bool = False) -> Record | str:
    """A Record, or the reason (a key of REJECT_REASONS) it cannot be used. Never raises.

    keep_id: keep the request id (made safe by `safe_request_id`), for local reports only.
    read_params: read the numeric `sampling_params.max_new_tokens` out of request_parameters
    (decoded only when at most MAX_PARAMS_CHARS long; nothing else of it is kept)."""
    try:
        if isinstance(line, str):
            line = line.encode("utf-8", "surrogatepass")
        if len(line) > MAX_RECORD_BYTES:
            return "too_long"
        if line[:1].isspace() or line[-1:].isspace():  # a copy only when there is any
            line = line.strip()
        return _parse(line, keep_id, read_params)
    except Rejected as r:
        return r.reason
    except Exception:  # a reader of hostile input must survive anything
        return "not_json"


def _parse(line: bytes, keep_id: bool, read_params: bool) -> Record:
    obj = json.loads(line) if read_params else _load(line)
    if not isinstance(obj, dict):
        raise Rejected("not_json")
    params = obj.get("request_parameters")
    if type(params) is not str:
        raise Rejected("unknown_release")
    n = _numbers(obj, params)
    return Record(*n[:12], safe_request_id(n[12]) if keep_id else None,
                  max_new_tokens(params) if read_params else None)


# The tuple parse_numbers gives (the fields of Record, then the raw id and request_parameters).
NUMBERS = ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_seconds", "ttft_seconds",
           "queue_seconds", "tpot_seconds", "finish_reason", "prompt_class", "received_at",
           "finished_at", "release", "id", "request_parameters")


def parse_numbers(line: bytes) -> tuple | str:
    """parse_record for a reader of many records (the analyzer): the same checks and numbers,
    as a tuple in NUMBERS order instead of a Record, or the reason it cannot be used. Never
    raises. `id` is the record's id as decoded (not made safe: `safe_request_id`);
    `request_parameters` is None where the line is in SGLang's layout and it was left unread
    (`_meta`; `request_parameters` reads it from the line), else the decoded string."""
    try:
        if len(line) > MAX_RECORD_BYTES:
            return "too_long"
        if line[:1].isspace() or line[-1:].isspace():  # a copy only when there is any
            line = line.strip()
        obj = _meta(line)
        if obj is not None:
            return _numbers(obj, None)
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return "not_json"
        if not isinstance(obj, dict):
            return "not_json"
        params = obj.get("request_parameters")
        if type(params) is not str:
            return "unknown_release"
        return _numbers(obj, params)
    except Rejected as r:
        return r.reason
    except Exception:  # a reader of hostile input must survive anything
        return "not_json"


def parse_span(buf: bytes, start: int, end: int) -> tuple | str:
    """parse_numbers(buf[start:end]) (a span of RecordReader.feed_spans), without copying the
    line: only its meta_info is decoded, from where it lies."""
    if end - start <= MAX_RECORD_BYTES and buf.startswith(_PREFIX, start):
        # _meta_at, inline: one call less per record (a tenth of the analyzer's time on short
        # records)
        cut = buf.rfind(_ID_KEY, start + len(_PREFIX), end)
        if cut >= 0:
            try:
                text = "{" + buf[cut + 3:end].decode()
                obj, stop = _SCAN(text, 0)
            except (ValueError, StopIteration, RecursionError):
                obj = None
            if (obj is not None and stop == len(text) and type(obj) is dict
                    and "request_parameters" not in obj
                    and buf.find(_PREFIX, start + len(_PREFIX), cut) < 0):
                try:
                    return _numbers(obj, None)
                except Rejected as r:
                    return r.reason
                except Exception:  # a reader of hostile input must survive anything
                    return "not_json"
    return parse_numbers(buf[start:end])  # stripped, parsed whole where it must be


def _numbers(obj: dict, params: str | None) -> tuple:
    """The checks and numbers of a decoded record whose request_parameters is a string (NUMBERS
    order); raises Rejected. The common case of each field (a number of the right type in
    range) is tested inline; anything else goes to the field's own check, which raises the
    reason, so the first failing check, in this order, names it."""
    get = obj.get
    old = ("prefill_finished_ts" in obj or "decode_finished_ts" in obj
           or "request_sent_to_scheduler_ts" in obj or "prefill_launch_delay" in obj)
    later = ("prefill_finished_time" in obj or "request_finished_ts" in obj
             or "forward_entry_time" in obj or "api_server_dispatch_finish_ts" in obj
             or "prefill_waiting_latency" in obj)
    if old and later:
        raise Rejected("unknown_release")
    release = "0.5.6" if old else "later" if later else "untimed"
    prompt = get("prompt_tokens")
    if type(prompt) is not int or prompt < 0 or prompt > MAX_TOKENS:
        prompt = _tokens(prompt, required=True)
    e2e = get("e2e_latency")
    if type(e2e) is bytes:  # a JSON float, as _SCAN leaves it
        e2e = float(e2e)
        if not 0.0 <= e2e <= MAX_SECONDS:  # NaN fails both
            e2e = _duration(e2e, required=True)
    elif type(e2e) is not float or not 0.0 <= e2e <= MAX_SECONDS:
        e2e = _duration(e2e, required=True)
    completion = get("completion_tokens")
    if type(completion) is not int or completion < 0 or completion > MAX_TOKENS:
        completion = _tokens(completion) or 0
    cached = get("cached_tokens")
    if type(cached) is not int or cached < 0 or cached > MAX_TOKENS:
        cached = _tokens(cached) or 0
    if cached > prompt:
        raise Rejected("out_of_range")
    queue = get("queue_time")
    if type(queue) is bytes:
        queue = float(queue)
        if not 0.0 <= queue <= MAX_SECONDS:
            queue = _duration(queue)
    elif queue is not None and (type(queue) is not float or not 0.0 <= queue <= MAX_SECONDS):
        queue = _duration(queue)
    received = get("request_received_ts")
    if type(received) is bytes:
        received = float(received)
        if not 0.0 <= received <= MAX_TIMESTAMP:
            received = _timestamp(received)
    elif received is not None and (type(received) is not float
                                   or not 0.0 <= received <= MAX_TIMESTAMP):
        received = _timestamp(received)
    if old:
        first, finished = get("prefill_finished_ts"), get("decode_finished_ts")
    else:
        first, finished = get("prefill_finished_time"), get("request_finished_ts")
    if type(first) is bytes:
        first = float(first)
        if not 0.0 <= first <= MAX_TIMESTAMP:
            first = _timestamp(first)
    elif first is not None and (type(first) is not float
                                or not 0.0 <= first <= MAX_TIMESTAMP):
        first = _timestamp(first)
    if type(finished) is bytes:
        finished = float(finished)
        if not 0.0 <= finished <= MAX_TIMESTAMP:
            finished = _timestamp(finished)
    elif finished is not None and (type(finished) is not float
                                   or not 0.0 <= finished <= MAX_TIMESTAMP):
        finished = _timestamp(finished)
    ttft = None
    if received is not None and first is not None:
        ttft = first - received
        if ttft < 0:
            raise Rejected("negative")
        if ttft > e2e * 1.01 + 0.05:
            raise Rejected("out_of_range")
        if ttft > e2e:
            ttft = e2e
    if queue is not None and ttft is not None and queue > ttft * 1.01 + 0.05:
        raise Rejected("out_of_range")
    reason = get("finish_reason")
    if type(reason) is dict:
        reason = reason.get("type")
    if type(reason) is not str or reason not in _KNOWN_REASONS:
        reason = "other"
    tpot = None
    if ttft is not None and completion > 1 and (reason == "stop" or reason == "length"):
        tpot = (e2e - ttft) / (completion - 1)
    if finished is None and received is not None:
        finished = received + e2e
    return (prompt, completion, cached, e2e, ttft, queue, tpot, reason,
            PROMPT_CLASSES[_bisect_right(PROMPT_CLASS_BOUNDS, prompt)], received,
            finished, release, get("id"), params)


def request_parameters(line: bytes, max_chars: int | None = None) -> str | None:
    """The request_parameters string of a record line that parse_numbers read in SGLang's
    layout (everything between `{"request_parameters": "` and the last `", "id": `), decoded as
    the JSON string it must be; None if it is not one, or if it is longer than max_chars
    characters (not decoded when its bytes say so: a character is at most 12 of them, an
    escaped surrogate pair). For the few records whose max_new_tokens is shown."""
    line = line.strip()
    cut = line.rfind(_ID_KEY)
    if not line.startswith(_PREFIX) or cut < len(_PREFIX):
        return None
    if max_chars is not None and cut - len(_PREFIX) > 12 * max_chars:
        return None
    try:
        text = line[len(_PREFIX) - 1:cut + 1].decode("utf-8", "surrogatepass")
        value, end = _scanstring(text, 1)
    except (ValueError, UnicodeDecodeError):
        return None
    if end != len(text) or (max_chars is not None and len(value) > max_chars):
        return None
    return value


def max_new_tokens(params: str) -> int | None:
    """`sampling_params.max_new_tokens` of a request_parameters string of at most
    MAX_PARAMS_CHARS characters (a longer one is not decoded): a number, or None."""
    return _max_new_tokens(params) if len(params) <= MAX_PARAMS_CHARS else None


def _max_new_tokens(params: str) -> int | None:
    try:
        decoded = json.loads(params)
    except (ValueError, RecursionError):
        return None
    sampling = decoded.get("sampling_params") if isinstance(decoded, dict) else None
    value = sampling.get("max_new_tokens") if isinstance(sampling, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


# -- stats -------------------------------------------------------------------------------------
class _Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(bound), running))
        return out


@dataclass(frozen=True)
class RequestSnapshot:
    """A copy for the collector: per class and histogram (ttft, queue, e2e, tpot) the cumulative
    buckets and sum; counters per class (and finish reason); rejections by reason."""

    records: int
    rejected: dict[str, int]
    finished: dict[tuple[str, str], int]
    prompt_tokens: dict[str, int]
    cached_tokens: dict[str, int]
    histograms: dict[tuple[str, str], tuple[list[tuple[str, int]], float]]
    last_finished_at: float | None
    rejected_files: dict[str, int] = field(default_factory=dict)


@dataclass
class RequestStats:
    """Accounts records of one server. Thread-safe: the follower feeds, the scrape copies.

    The first rejection of each reason is logged (the reason and `where`, never the record),
    later ones only counted."""

    where: str = ""
    records: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rejected_files: dict[str, int] = field(default_factory=dict)
    last_finished_at: float | None = None
    _hist: dict[tuple[str, str], _Histogram] = field(default_factory=lambda: {
        (c, name): _Histogram(bounds) for c in PROMPT_CLASSES
        for name, bounds in HISTOGRAMS.items()})
    _finished: dict[tuple[str, str], int] = field(default_factory=lambda: {
        (c, r): 0 for c in PROMPT_CLASSES for r in FINISH_REASONS})
    _prompt: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_CLASSES, 0))
    _cached: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_CLASSES, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _listeners: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._by_class = {c: tuple(self._hist[(c, name)] for name in ("e2e", "ttft", "queue",
                                                                       "tpot"))
                          for c in PROMPT_CLASSES}

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def batch_fed(self) -> None:
        for listener in self._listeners:
            listener()

    def feed_line(self, line: bytes | str) -> bool:
        """Parse and account one line; whether it was a usable record."""
        parsed = parse_record(line)
        if isinstance(parsed, str):
            self.reject(parsed)
            return False
        self.add(parsed)
        return True

    def add(self, r: Record) -> None:
        c = r.prompt_class
        e2e, ttft, queue, tpot = self._by_class[c]
        with self._lock:
            self.records += 1
            self._finished[(c, r.finish_reason)] += 1
            self._prompt[c] += r.prompt_tokens
            self._cached[c] += r.cached_tokens
            e2e.observe(r.e2e_seconds)
            if r.ttft_seconds is not None:
                ttft.observe(r.ttft_seconds)
            if r.queue_seconds is not None:
                queue.observe(r.queue_seconds)
            if r.tpot_seconds is not None:
                tpot.observe(r.tpot_seconds)
            at = r.finished_at
            if at is not None and (self.last_finished_at is None or at > self.last_finished_at):
                self.last_finished_at = at

    def reject(self, reason: str, n: int = 1) -> None:
        with self._lock:
            first = reason not in self.rejected
            self.rejected[reason] = self.rejected.get(reason, 0) + n
        if first:
            log.warning("request records %s: skipped a record (%s: %s); counted in "
                        "sglang_obs_request_records_rejected_total{reason=%r}, not logged again",
                        self.where or "(in memory)", reason, REJECT_REASONS.get(reason, "?"),
                        reason)

    def reject_file(self, reason: str, path: str) -> None:
        """A file of the directory refused unopened (the follower calls this once per file);
        the first of each reason is logged, with the file's path, never its content."""
        with self._lock:
            first = reason not in self.rejected_files
            self.rejected_files[reason] = self.rejected_files.get(reason, 0) + 1
        if first:
            log.warning("request records %s: refused %s (%s: %s), not opened; counted in "
                        "sglang_obs_request_files_rejected_total{reason=%r}, not logged again",
                        self.where or "(in memory)", path, reason,
                        FILE_REJECT_REASONS.get(reason, "?"), reason)

    def snapshot(self) -> RequestSnapshot:
        with self._lock:
            return RequestSnapshot(
                records=self.records, rejected=dict(self.rejected),
                finished=dict(self._finished), prompt_tokens=dict(self._prompt),
                cached_tokens=dict(self._cached),
                histograms={k: (h.cumulative(), h.sum) for k, h in self._hist.items()},
                last_finished_at=self.last_finished_at,
                rejected_files=dict(self.rejected_files))
