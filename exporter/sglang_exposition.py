"""Read SGLang's /metrics exposition into the few per-server numbers the exporter derives from.

Three traps handled here, all described in the SGLang reference:
- spelling: `sglang:x` (text format) or `sglang_x` (prometheus_client >= 0.23 answering an
  OpenMetrics scraper with escaping=underscores). Both map to the bare name `x`.
- renames across releases: old exposed names map to the current one (RENAMES).
- ranks: scheduler series repeat per tp/pp/ep rank (and constants on every rank) and split per
  dp_rank; `pid`-labelled gauges repeat per process. Load is max within a DP rank, summed over DP
  ranks; ratios are the worst (max) rank; tokenizer counters are summed over their label sets
  (is_streaming, cache_source, priority). Priority-split scheduler series keep only the total
  (`priority=""`).

The body is read by a targeted scan, not a full parser: a real 0.5.23 answer has ~1,000
sample lines (histogram buckets mostly) of which about forty are kept. One regular expression
walks the body in C and stops only at the lines Python must read: a kept name (its label set and
value parsed fully: any label order, escapes, timestamps, OpenMetrics exemplars), another prefix
than `sglang`, or an odd shape. A line of an SGLang name the exporter does not keep is counted
(sample_count, spelling) when its name is a metric name followed by `{` or a blank and more;
its labels and value are never read, so they are not judged. A line that is not a sample (junk,
a kept sample whose labels or value do not parse) is skipped and counted in `malformed_lines`.

The work per answer is bounded whatever the body holds: at most MAX_LINES lines are scanned,
and at most MAX_FULL_LINES of them, MAX_FULL_CHARS characters in all, read in full (wanted
samples, rare shapes, junk: the costly path). The scan stops at whichever bound comes first;
the lines after it are not read. A line longer than MAX_LINE_CHARS (a label value of megabytes)
is skipped unread. Both are counted in `lines_over_limit`. A real answer has ~1,000 lines of
at most a few hundred characters, ~40 of them read in full.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

COLON_PREFIX = "sglang:"
UNDERSCORE_PREFIX = "sglang_"

# Old exposed name -> current name (bare, without prefix). Only names the exporter reads.
RENAMES = {
    "total_retracted_reqs": "num_retracted_reqs",
    "num_prefill_infight_queue_reqs": "num_prefill_inflight_queue_reqs",
    "num_prefill_prealloc_queue_reqs": "num_prefill_bootstrap_queue_reqs",
}

# Additive per-DP quantities: max over the copies inside one DP rank, then sum over DP ranks.
ADDITIVE = frozenset(
    {
        "num_running_reqs",
        "num_queue_reqs",
        "gen_throughput",
        "num_used_tokens",
        "kv_used_tokens",
        "kv_available_tokens",
        "kv_evictable_tokens",
        "max_total_num_tokens",
        "num_retracted_reqs",
        "num_paused_reqs",
        "num_prefill_bootstrap_queue_reqs",
        "num_prefill_inflight_queue_reqs",
        # for the glance page (exporter/status.py): requests elsewhere than queue and batch,
        "num_grammar_queue_reqs",
        "num_decode_prealloc_queue_reqs",
        "num_decode_transfer_queue_reqs",
        # ...and why a queue waits with the KV pool free: the LoRA adapter pool (per DP rank)
        "lora_pool_slots_used",
        "lora_pool_slots_total",
        # retractions (the recording rules' KV-capacity condition), the queue-time histogram
        "num_retracted_requests_total",
        "queue_time_seconds_sum",
        "queue_time_seconds_count",
    }
)
# Per-DP ratios and per-server constants: the worst / largest value over every rank.
MAXIMUM = frozenset({"token_usage", "context_len"})
# Tokenizer counters and latency sums (one process, no rank labels, split by is_streaming,
# cache_source, engine_type): max over repeats of one label set, summed over label sets. Only the
# glance page reads them (cumulative tokens, requests finished, average TTFT and request time).
SUMMED = frozenset(
    {
        "prompt_tokens_total",
        "generation_tokens_total",
        "cached_tokens_total",
        "num_requests_total",
        "time_to_first_token_seconds_sum",
        "time_to_first_token_seconds_count",
        "e2e_request_latency_seconds_sum",
        "e2e_request_latency_seconds_count",
        # the glance page's last-minute feature ratios (exporter/status.py FEATURE_COUNTERS):
        # the verify steps beside generation_tokens_total, and the radix cache's evicted and
        # dropped tokens, whose rank series each carry the same logical count (0.5.21+), so
        # their sums keep the ratio
        "spec_verify_calls_total",
        "hicache_dropped_tokens_total",
        "evicted_tokens_total",
    }
)

WANTED = ADDITIVE | MAXIMUM | SUMMED
# Scheduler gauges that every SGLang release with --enable-metrics exposes once it has reported.
SCHEDULER_PRESENCE = ("num_running_reqs", "num_queue_reqs")
# Work bounds per answer (see the module docstring).
MAX_LINES = 200_000
MAX_FULL_LINES = 20_000
MAX_FULL_CHARS = 1 << 20
MAX_LINE_CHARS = 64 << 10

class ExpositionError(ValueError):
    """The body is not a Prometheus/OpenMetrics exposition. The message never quotes it."""

    def __init__(self, message: str, malformed_lines: int = 0, first_malformed: int | None = None):
        super().__init__(message)
        self.malformed_lines = malformed_lines
        self.first_malformed = first_malformed

@dataclass
class NativeMetrics:
    """Aggregated view of one /metrics answer."""

    values: dict[str, float] = field(default_factory=dict)  # bare name -> aggregated value
    # With priority scheduling: the queue gauges' per-priority series (bare name -> priority ->
    # value, aggregated as `values`); `values` keeps their priority="" total.
    by_priority: dict[str, dict[str, float]] = field(default_factory=dict)
    model_name: str = ""
    spelling: str = "none"  # colon | underscore | mixed | none
    sample_count: int = 0
    malformed_lines: int = 0  # non-comment lines that are not a readable sample (skipped)
    lines_over_limit: int = 0  # lines after the scan stopped at MAX_LINES / MAX_FULL_LINES
    first_malformed: int | None = None  # line number (from 1) of the first malformed line

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def has_scheduler_series(self) -> bool:
        return any(name in self.values for name in SCHEDULER_PRESENCE)

def parse_exposition(text: str, content_type: str = "") -> NativeMetrics:
    """Parse an exposition body and aggregate the wanted SGLang series across ranks.

    Lines that are no readable sample are skipped and counted (`malformed_lines`); a body with no
    sample at all, or a truncated one, raises ExpositionError.
    """
    if "openmetrics" in content_type.lower():
        # The mandatory `# EOF` line detects truncation.
        body = text.rstrip()
        if not (body == "# EOF" or body.endswith("\n# EOF")):
            raise ExpositionError("OpenMetrics body without '# EOF' (truncated)")
        text = body[: -len("# EOF")]
    else:
        # The text format ends every line, the last included, with a line feed: a body whose last
        # line has none was cut (possibly inside a value, which would still read as a number).
        last = text[text.rfind("\n") + 1 :]
        if last and not last.isspace():
            raise ExpositionError("body does not end with a line feed (truncated)")
    return _scan(text)

# --- the scan ------------------------------------------------------------------------------------

_COLON, _UNDERSCORE = 1, 2  # spelling bits of a name code
_SPELLINGS = ("none", "colon", "underscore", "mixed")
_JUNK = -1  # name code of something that is no metric name
_WANTED_BARE = tuple(sorted(WANTED))

def _wanted_codes() -> dict[str, int]:
    """Exposed sample name -> code: wanted-name index + 1 above the two spelling bits."""
    codes = {}
    for index, bare in enumerate(_WANTED_BARE, start=1):
        exposed = [bare] + sorted(old for old, new in RENAMES.items() if new == bare)
        for name in exposed:
            codes[COLON_PREFIX + name] = index << 2 | _COLON
            codes[UNDERSCORE_PREFIX + name] = index << 2 | _UNDERSCORE
    return codes

_WANTED_CODES = _wanted_codes()
# Names seen so far -> code (the wanted ones, then others as met; emptied back when it grows).
_NAME_CODES: dict[str, int] = dict(_WANTED_CODES)
_NAME_CODES_MAX = 4096
_NAME_CACHED_MAX_CHARS = 256

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NAME_TOKEN = re.compile(r"[^{ \t]*")

def _spelling_bits(name: str) -> int:
    code = _WANTED_CODES.get(name)
    if code is not None:
        return code
    if name.startswith(COLON_PREFIX):
        return _COLON
    return _UNDERSCORE if name.startswith(UNDERSCORE_PREFIX) else 0

def _learn(name: str) -> int:
    """Code of a name not met yet (a valid metric name is required), remembered if short."""
    code = _spelling_bits(name) if _METRIC_NAME.fullmatch(name) else _JUNK
    if len(name) > _NAME_CACHED_MAX_CHARS:  # a huge junk "name" must not live in the cache
        return code
    if len(_NAME_CODES) >= _NAME_CODES_MAX:
        _NAME_CODES.clear()
        _NAME_CODES.update(_WANTED_CODES)
    _NAME_CODES[name] = code
    return code

# Label sets. A quoted value holds anything but an unescaped quote; escapes are \\ \" \n (any
# other backslash pair is kept as it is, as prometheus_client does). Names starting with `__` are
# reserved; `__name__` (or a bare quoted name) only names the metric in the `{"name", ...}` form.
_VALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_LABEL_NAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
_PAIR = _LABEL_NAME + r"[ \t]*=[ \t]*" + _VALUE
# The common shape, checked by one match: unquoted names, comma separated, trailing comma allowed.
_LABEL_SET = re.compile(
    r"\{[ \t]*(?:" + _PAIR + r"[ \t]*(?:,[ \t]*" + _PAIR + r"[ \t]*)*(?:,[ \t]*)?)?\}"
)
_PAIRS = re.compile(r"(" + _LABEL_NAME + r')[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
# One item of any label set, for the lines the common shape does not cover (quoted names).
_ITEM = re.compile(
    r'[ \t]*(?:([a-zA-Z_][a-zA-Z0-9_]*)|"([^"\\]*(?:\\.[^"\\]*)*)")'
    r'[ \t]*(?:=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)")?[ \t]*([,}])'
)
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

# Label-set text of a kept line -> its raw label values (never changed once made: shared by the
# samples that carry it); emptied when full.
_LABEL_SETS: dict[str, dict[str, str]] = {}
_LABEL_SETS_MAX = 4096
_LABEL_SET_CACHED_MAX_CHARS = 512  # at most ~2 MiB of keys, whatever a server sends


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value)

def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, label values, value) of each sample line of a whole exposition read in full, as a
    scraper stores it: for a text the caller trusts (the simulator's own); ValueError on a line
    that is not a sample."""
    for line in text.splitlines():
        try:
            read = _read_line(line)
        except _Malformed:
            raise ValueError(f"not a sample line: {line[:80]!r}") from None
        if read is not None:
            name, labels, value = read
            yield name, {k: _unescape(v) for k, v in labels.items()}, value

class _Malformed(Exception):
    """A non-comment line that is not a readable sample."""

def _trie(words: list[str]) -> str:
    """A regular expression matching exactly `words`, as a trie: one branch per first letter, so
    a name that is none of them fails at its first differing letter."""
    ends = "" in words
    branches: dict[str, list[str]] = {}
    for word in words:
        if word:
            branches.setdefault(word[0], []).append(word[1:])
    alternatives = [re.escape(c) + _trie(rest) for c, rest in sorted(branches.items())]
    if ends:
        alternatives.append("")
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


# A line the scan leaves to C: a comment, a blank line, or a sample of an SGLang name the
# exporter does not keep whose shape passes the same cheap check as before (a name, then a label
# set closed before a value that does not end in `}`, or a blank and a value without `{`). Every
# other line (a kept name, another prefix, an odd shape, junk) is read by _line in Python.
_EXPOSED = sorted({name for bare in WANTED for name in (bare, *(old for old, new in
                                                                RENAMES.items() if new == bare))})
_UNREAD_REST = r"(?!" + _trie(_EXPOSED) + r"[{ ])[a-zA-Z0-9_:]*[{ ][^\n]"
_LEFT_TO_C = r"sglang[:_]" + _UNREAD_REST + r"|#|\n|\Z"
_READ_FIRST = re.compile(r"(?!" + _LEFT_TO_C + ")")  # at the body's start
_READ_NEXT = re.compile(r"\n(?!" + _LEFT_TO_C + ")")  # after each line feed
_NOT_SAMPLE_NEXT = re.compile(r"\n(?=[#\n])")  # comment and blank lines after the first
# Spelling bit -> (an unread sample of that spelling at the start, after a line feed)
_UNREAD_OF = {bits: (prefix, re.compile(prefix + _UNREAD_REST),
                     re.compile("\n" + prefix + _UNREAD_REST))
              for bits, prefix in ((_COLON, "sglang:"), (_UNDERSCORE, "sglang_"))}


@functools.lru_cache(maxsize=4)
def _first_lines(n: int) -> re.Pattern:
    return re.compile(r"(?:[^\n]*\n){" + str(n) + "}")


def _lines_in(text: str, end: int) -> int:
    """Lines in text[:end] (the empty string after a final line feed is none)."""
    return text.count("\n", 0, end) + (1 if end and text[end - 1] != "\n" else 0)


class _Scan:
    """Counters of one scan, and the work budget of the lines read in full."""

    __slots__ = ("count", "bits", "malformed", "first_malformed", "full", "full_chars", "kept")

    def __init__(self) -> None:
        self.count = self.bits = self.malformed = self.full = self.full_chars = 0
        self.first_malformed: int | None = None
        self.kept: list[tuple[int, dict[str, str], float]] = []  # code, raw labels, value


def _scan(text: str, max_lines: int = MAX_LINES, max_full: int = MAX_FULL_LINES,
          max_full_chars: int = MAX_FULL_CHARS, max_line: int = MAX_LINE_CHARS) -> NativeMetrics:
    # The region scanned: the first max_lines lines; the rest is counted unread.
    end, over = len(text), 0
    if end > max_lines and text.count("\n") >= max_lines:
        end = _first_lines(max_lines).match(text).end() - 1
        over = _lines_in(text, len(text)) - _lines_in(text, end)
    scan = _Scan()
    visited = 0  # lines handed to _line
    stop = end  # where the scan stopped (the start of the line that ran out of budget)
    starts = [0] if _READ_FIRST.match(text, 0, end) else []
    for start in itertools.chain(starts, (m.end() for m in _READ_NEXT.finditer(text, 0, end))):
        line_end = text.find("\n", start, end)
        if line_end < 0:
            line_end = end
        visited += 1
        if line_end - start > max_line:
            over += 1
            continue
        if not _line(text[start:line_end], scan, max_full, max_full_chars):
            visited -= 1
            stop = start
            over += _lines_in(text, end) - text.count("\n", 0, start)
            break
        if scan.malformed and scan.first_malformed is None:
            scan.first_malformed = text.count("\n", 0, start) + 1
    # The lines left to C: every line before the stop that is no comment, no blank, not visited.
    lines = _lines_in(text, stop) if stop == end else text.count("\n", 0, stop)
    not_samples = len(_NOT_SAMPLE_NEXT.findall(text, 0, stop)) + (
        1 if stop and text[0] in "#\n" else 0)
    unread = lines - not_samples - visited
    if unread:
        scan.count += unread
        for bits, (prefix, first, after) in _UNREAD_OF.items():
            if not scan.bits & bits and prefix in text and (
                    first.match(text, 0, stop) or after.search(text, 0, stop)):
                scan.bits |= bits
    if scan.count == 0:
        detail = f" ({scan.malformed} malformed lines)" if scan.malformed else ""
        raise ExpositionError("no samples in the body" + detail, scan.malformed,
                              scan.first_malformed)
    out = _aggregate(scan.kept)
    out.sample_count = scan.count
    out.malformed_lines = scan.malformed
    out.lines_over_limit = over
    out.first_malformed = scan.first_malformed
    out.spelling = _SPELLINGS[scan.bits & 3]
    return out


def _line(line: str, scan: _Scan, max_full: int, max_full_chars: int) -> bool:
    """Reads one line the C scan left (a kept name, another prefix, an odd shape, junk) into
    `scan`; False, unread, when it would overrun the budget of lines read in full."""
    if not line or line[0] == "#":
        return True
    heavy = False  # this line already counted as read in full
    i = line.find("{")
    if i > 0:  # name{labels} value ...
        name = line[:i]
        code = _NAME_CODES.get(name)
        if code is None:
            code = _learn(name)
        if code > 3:
            scan.full += 1
            scan.full_chars += len(line)
            heavy = True
            if scan.full > max_full or scan.full_chars > max_full_chars:
                return False
            # A label set read before (the same ranks, every poll) is not read again.
            end = line.rfind("}") + 1
            labels = _LABEL_SETS.get(line[i:end])
            if labels is None:
                match = _LABEL_SET.match(line, i)
                end = match.end() if match is not None else -1
            if end > 0:
                rest = line[end:]
                try:
                    if "_" in rest:
                        raise ValueError
                    value = float(rest)  # the common case: just the value
                except ValueError:
                    value = _value(rest)
                if value is not None:
                    if labels is None:
                        pairs = _PAIRS.findall(line, i, end)
                        labels = dict(pairs)
                        if len(labels) != len(pairs):
                            labels = None
                        elif end - i <= _LABEL_SET_CACHED_MAX_CHARS:
                            if len(_LABEL_SETS) >= _LABEL_SETS_MAX:
                                _LABEL_SETS.clear()
                            _LABEL_SETS[line[i:end]] = labels
                    if labels is not None:
                        scan.count += 1
                        scan.bits |= code
                        scan.kept.append((code, labels, value))
                        return True
            # else: not the common shape, read in full below
        elif code >= 0 and line.rfind("}") > i and line[-1] != "}":
            scan.count += 1  # a sample not kept: counted, its labels unread
            scan.bits |= code
            return True
    elif i < 0:  # name value ...
        k = line.find(" ")
        if k > 0:
            name = line[:k]
            code = _NAME_CODES.get(name)
            if code is None:
                code = _learn(name)
            if 0 <= code <= 3 and k < len(line) - 1:
                scan.count += 1
                scan.bits |= code
                return True
    # Anything else (leading blanks, `{"name", ...}`, kept samples of a rarer shape, junk).
    if not heavy:
        scan.full += 1
        scan.full_chars += len(line)
        if scan.full > max_full or scan.full_chars > max_full_chars:
            return False
    try:
        sample = _read_line(line)
    except _Malformed:
        scan.malformed += 1
        return True
    if sample is None:  # blank or comment
        return True
    name, labels, value = sample
    code = _spelling_bits(name)
    scan.count += 1
    scan.bits |= code
    if code > 3:
        scan.kept.append((code, labels, value))
    return True


def _aggregate(kept: list[tuple[int, dict[str, str], float]]) -> NativeMetrics:
    out = NativeMetrics()
    # name -> (model_name, dp_rank) -> max value
    per_dp: dict[str, dict[tuple[str, str], float]] = {}
    # (name, priority) -> (model_name, dp_rank) -> max value
    per_priority: dict[tuple[str, str], dict[tuple[str, str], float]] = {}
    for code, labels, value in kept:
        bare = _WANTED_BARE[(code >> 2) - 1]
        if math.isnan(value):
            continue
        # The scheduler writes a queue's total under priority="" beside its per-priority
        # series: the total counts, the others are kept apart. The tokenizer's counters carry
        # each request's own priority and no total: they are summed over it like any label.
        priority = labels.get("priority", "")
        if bare not in SUMMED and priority != "":  # (an escaped value is never empty)
            key = (_unescape(labels.get("model_name", "")), labels.get("dp_rank", ""))
            groups = per_priority.setdefault((bare, _unescape(priority)), {})
            groups[key] = max(value, groups.get(key, -math.inf))
            continue
        model = _unescape(labels.get("model_name", ""))
        if model and not out.model_name and bare in SCHEDULER_PRESENCE:
            out.model_name = model
        if bare in SUMMED:
            key = tuple(sorted(labels.items()))
        else:
            key = (model, _unescape(labels.get("dp_rank", "")) if bare in ADDITIVE else "")
        groups = per_dp.setdefault(bare, {})
        groups[key] = max(value, groups.get(key, -math.inf))
    for bare, groups in per_dp.items():
        out.values[bare] = (max(groups.values()) if bare in MAXIMUM
                            else sum(groups.values()))
    for (bare, priority), groups in per_priority.items():
        out.by_priority.setdefault(bare, {})[priority] = sum(groups.values())
    return out

def _read_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """(name, raw label values, value) of one line read in full; None for a blank or a comment."""
    s = line.strip()
    if not s or s[0] == "#":
        return None
    if s[0] == "{":  # {"name", labels} value: the name inside the label set
        labels, end = _read_labels(s, 0, name_inside=True)
        name = labels.pop("__name__", None)
        if name is None:
            raise _Malformed
        name = _unescape(name)
    else:
        name = _NAME_TOKEN.match(s).group(0)
        if not _METRIC_NAME.fullmatch(name):
            raise _Malformed
        end = len(name)
        while end < len(s) and s[end] in " \t":
            end += 1
        if end < len(s) and s[end] == "{":
            labels, end = _read_labels(s, end, name_inside=False)
        else:
            labels = {}
            if end == len(name):
                raise _Malformed  # name glued to something
    value = _value(s[end:])
    if value is None:
        raise _Malformed
    return name, labels, value

def _read_labels(s: str, start: int, name_inside: bool) -> tuple[dict[str, str], int]:
    """Raw label values of the set opening at s[start] and the index after its `}`."""
    labels: dict[str, str] = {}
    pos = start + 1
    while pos < len(s) and s[pos] in " \t":
        pos += 1
    if s.startswith("}", pos):
        return labels, pos + 1
    while True:
        m = _ITEM.match(s, pos)
        if m is None:
            raise _Malformed
        plain, quoted, value, sep = m.groups()
        if value is None:  # a bare item: only a quoted metric name, only in `{"name", ...}`
            if quoted is None or not name_inside:
                raise _Malformed
            name, value = "__name__", quoted
        else:
            name = plain if plain is not None else _unescape(quoted)
            if name.startswith("__") and not (name == "__name__" and name_inside):
                raise _Malformed
        if name in labels:
            raise _Malformed
        labels[name] = value
        pos = m.end()
        if sep == "}":
            return labels, pos
        while pos < len(s) and s[pos] in " \t":
            pos += 1
        if s.startswith("}", pos):  # trailing comma
            return labels, pos + 1

def _number(token: str) -> float | None:
    if "_" in token:
        return None
    try:
        return float(token)
    except ValueError:
        return None

def _value(rest: str) -> float | None:
    """The value of `value [timestamp] [# {exemplar labels} value [timestamp]]`, or None."""
    s = rest.strip()
    if not s:
        return None
    sep = " " if " " in s else "\t"
    mark = s.find("#")
    if mark >= 0:  # an exemplar, ignored but checked: ` # {labels} value [timestamp]`
        if s[mark - 1 : mark + 2] != " # ":
            return None
        exemplar = s[mark + 1 :].strip()
        m = _LABEL_SET.match(exemplar)
        if m is None or not exemplar.startswith(sep, m.end()):
            return None
        if not _numbers(exemplar[m.end() :], sep):
            return None
        s = s[:mark]
    tokens = [t for t in (t.strip() for t in s.split(sep)) if t]
    if not 1 <= len(tokens) <= 2 or (len(tokens) == 2 and _number(tokens[1]) is None):
        return None
    return _number(tokens[0])

def _numbers(s: str, sep: str) -> bool:
    """`value [timestamp]`"""
    tokens = [t for t in (t.strip() for t in s.split(sep)) if t]
    return 1 <= len(tokens) <= 2 and all(_number(t) is not None for t in tokens)
