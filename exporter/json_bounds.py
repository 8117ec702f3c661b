"""Bounded decoding of SGLang's JSON answers (/v1/loads, /get_load, /server_info,
/get_server_info, /v1/models).

Why: `json.loads` of an answer well under --sglang.max-response-bytes can take many times its
size. 15 MiB of `[{"a":1},{"a":1},...]` decodes into 1.8 million dicts, ~400 MiB (27x the body);
one character beyond U+FFFF makes CPython store every character of the text, and of the string
holding it, in 4 bytes (8x). Two such servers took the exporter past a 256 MiB pod limit. SGLang
itself sends little: the largest recorded answer (conformance/goldens, 0.5.23 /server_info) is
42 KB, 2,500 values, 7 levels deep, and /server_info grows by ~20 KB and ~1,300 values per
data-parallel rank (internal_states has one entry per rank).

So an answer is held, before it is decoded and at C speed, to:
  - MAX_JSON_BYTES: the poller's fetch of a JSON endpoint stops there (a `too_large` error),
    whatever --sglang.max-response-bytes allows /metrics;
  - MAX_JSON_VALUES: an upper bound on the values (keys included), from bytes.count of `,` `:`
    `[` `{` (every value but the outermost follows one of `[` `,` `:`, every key `{` or `,`;
    the bound is loose where strings hold these characters);
  - MAX_DECODE_BYTES: an upper bound on what decoding allocates: the text (the body as a str,
    1, 2 or 4 bytes a character by its widest character), its strings (no more characters than
    the body has bytes, as wide as the text, or 4 bytes with a \\uD8xx escape) and VALUE_BYTES
    per value (measured at most ~80 on CPython 3.11: a dict key, a short string, a float pair),
    plus BASE_BYTES;
and after decoding to MAX_JSON_DEPTH levels of nesting (json raises RecursionError only at
~1,000; a reader must never meet one). With the body held at most MAX_JSON_BYTES, one answer
costs at most MAX_JSON_BYTES + MAX_DECODE_BYTES (56 MiB), and an answer over a bound costs
nothing but the counts. tests/test_poller_bounds.py measures peak RSS against the estimate.

An answer over a bound raises JSONBoundsError (a ValueError), which the poller counts as a
`parse` error of the endpoint; its message says which bound, never what the body held.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_BYTES = 8 * 1024 * 1024  # ~400 DP ranks of 0.5.23's /server_info
MAX_JSON_VALUES = 400_000  # ~300 DP ranks of 0.5.23's /server_info
MAX_JSON_DEPTH = 64  # SGLang's answers: 7
MAX_DECODE_BYTES = 48 * 1024 * 1024
VALUE_BYTES = 96  # allowance per counted value: object, pointer, allocator rounding, growth
BASE_BYTES = 1024 * 1024  # the decoder's own bookkeeping, rounding to pages

_LEAD_4_BYTES = re.compile(rb"[\xf0-\xff]")  # a character beyond U+FFFF (or not UTF-8)
_LEAD_WIDE = re.compile(rb"[\xc4-\xef]")  # a character in U+0100..U+FFFF
_HIGH_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")  # \uD83D\uDE00: one wide character


class JSONBoundsError(ValueError):
    """The answer is over one of this module's bounds (the message says which)."""


def _text_width(body: bytes) -> int:
    """Bytes per character of the body decoded to a str (CPython stores 1, 2 or 4)."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        return 4  # UTF-16 or -32: not what SGLang sends (RFC 8259 says UTF-8); bounded anyway
    if body.isascii():
        return 1
    if _LEAD_4_BYTES.search(body):
        return 4
    return 2 if _LEAD_WIDE.search(body) else 1


def _string_width(body: bytes, text_width: int) -> int:
    """Bytes per character of the widest string decoding can make."""
    if b"\\u" not in body:
        return text_width
    return 4 if _HIGH_SURROGATE_ESCAPE.search(body) else max(text_width, 2)


def decode_estimate(body: bytes) -> tuple[int, int]:
    """(an upper bound on the values, an upper bound on the bytes decoding allocates)."""
    values = 1 + sum(body.count(c) for c in (b",", b":", b"[", b"{"))
    text_width = _text_width(body)
    width = text_width + _string_width(body, text_width)
    return values, len(body) * width + values * VALUE_BYTES + BASE_BYTES


def check(body: bytes) -> None:
    """Raise JSONBoundsError if decoding `body` could pass a bound; allocates nothing."""
    if len(body) > MAX_JSON_BYTES:
        raise JSONBoundsError(f"{len(body):,} bytes, over {MAX_JSON_BYTES:,}")
    values, estimate = decode_estimate(body)
    if values > MAX_JSON_VALUES:
        raise JSONBoundsError(f"up to {values:,} values, over {MAX_JSON_VALUES:,}")
    if estimate > MAX_DECODE_BYTES:
        raise JSONBoundsError(f"decoding could take {estimate / 2**20:.1f} MiB, over "
                              f"{MAX_DECODE_BYTES / 2**20:.0f} MiB")


def loads(body: bytes) -> Any:
    """json.loads(body) within the bounds: JSONBoundsError past one; ValueError (not JSON, bad
    UTF-8, an integer over Python's digit limit) and RecursionError as json.loads raises them."""
    check(body)
    value = json.loads(body)
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise JSONBoundsError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` levels; iterative, so never a RecursionError."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
