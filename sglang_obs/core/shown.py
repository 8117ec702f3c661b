"""What a person reads: every number and every URL that the glance page, the landing page, the
tools' reports and the logs show goes through here.

**Numbers.** A value is shown only when it is a finite number in the range of its kind (BOUNDS);
anything else shows as DASH, "—", and the reason is counted. None is "no value": also "—", but
not counted (nothing was hidden). The reasons (REASONS): `not_finite` (NaN or ±Inf, which is
also what a sum over a 1e-320 count gives), `negative` (a count, duration, rate or ratio below
0), `too_large` (past the kind's magnitude: no real server counts 1e15 tokens), `not_a_ratio`
(a ratio outside [0, 1] by more than rounding) and `not_a_number` (a string, a bool).

| kind | shown when | e.g. |
|---|---|---|
| count | 0 <= v <= 1e15 | tokens, requests, bytes |
| ratio | -0.001 <= v <= 1.001, shown clamped into [0, 1] | KV occupancy, cache hit ratio |
| seconds | 0 <= v <= 1e9 (31 years) | TTFT, a queueing run |
| rate | 0 <= v <= 1e12 | tok/s, requests per minute |
| signed | abs(v) <= 1e15 | a difference of two counts |
| change | abs(v) <= 1e6 | a relative change (+100,000,000 %) |

Each hidden value is counted in the process's HIDDEN tally and in the Tally the caller set with
`counting()` for the current thread: the exporter's status board keeps one, exported as
sglang_obs_glance_values_hidden_total{reason}.

**URLs.** `url()` is the one way a URL is shown: userinfo, query and fragment are replaced by
`***` (a password, an `api_key=` or a token cannot show), non-printable characters escaped, the
whole cut to MAX_URL_CHARS; it never raises, whatever the text. `plain_url()` refuses a URL
that holds any of the three: the base URLs the commands take (SGLang's, Prometheus's,
Alertmanager's) append their own paths and queries, so a query or fragment in one could only be
a secret or a mistake.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections import Counter
from collections.abc import Iterator

DASH = "—"
MAX_COUNT = 1e15
MAX_SECONDS = 1e9
MAX_RATE = 1e12
MAX_CHANGE = 1e6
RATIO_TOLERANCE = 1e-3
# kind -> (lowest, highest) shown; a ratio within RATIO_TOLERANCE of its range shows clamped.
BOUNDS = {
    "count": (0.0, MAX_COUNT),
    "ratio": (0.0, 1.0),
    "seconds": (0.0, MAX_SECONDS),
    "rate": (0.0, MAX_RATE),
    "signed": (-MAX_COUNT, MAX_COUNT),
    "change": (-MAX_CHANGE, MAX_CHANGE),
}
REASONS = ("not_finite", "negative", "too_large", "not_a_ratio", "not_a_number")
MAX_URL_CHARS = 200


class Tally:
    """Hidden values by reason; safe to add to from one thread while another reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


HIDDEN = Tally()  # every value this process hid
_current: contextvars.ContextVar[Tally | None] = contextvars.ContextVar("shown_tally",
                                                                        default=None)


@contextlib.contextmanager
def counting(tally: Tally) -> Iterator[Tally]:
    """Count the values hidden inside the block (in this thread) in `tally` too."""
    token = _current.set(tally)
    try:
        yield tally
    finally:
        _current.reset(token)


def _hide(reason: str) -> None:
    HIDDEN.add(reason)
    tally = _current.get()
    if tally is not None and tally is not HIDDEN:
        tally.add(reason)


def why_hidden(value: object, kind: str = "count") -> str | None:
    """The reason `value` (not None) cannot be shown as a `kind`, or None if it can."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not_a_number"
    if not math.isfinite(value):
        return "not_finite"
    low, high = BOUNDS[kind]
    if kind == "ratio":
        return (None if -RATIO_TOLERANCE <= value <= high + RATIO_TOLERANCE
                else "not_a_ratio")
    if value < low:
        return "negative" if low == 0 else "too_large"
    if value > high:
        return "too_large"
    return None


def checked(value: object, kind: str = "count") -> float | None:
    """`value` as a float if it can be shown as a `kind` (a ratio clamped into [0, 1]); None
    if it is None or cannot (then the reason is counted)."""
    if value is None:
        return None
    reason = why_hidden(value, kind)
    if reason is not None:
        _hide(reason)
        return None
    value = float(value)
    return min(max(value, 0.0), 1.0) if kind == "ratio" else value


def checked_all(values: list, kind: str = "count") -> list[float | None]:
    """[checked(v, kind) for v in values], with one comparison per value when every value is
    None or a float inside the bounds (a trend's 180 points, several per server per page)."""
    low, high = BOUNDS[kind]
    present = [v for v in values if v is not None]
    if kind != "ratio" and {type(v) for v in present} <= {float} and (
            not present or (math.isfinite(sum(present)) and low <= min(present)
                            and max(present) <= high)):
        return list(values)  # (a NaN or an infinity makes the sum so)
    return [checked(v, kind) for v in values]


def number(value: object, spec: str, kind: str = "count", suffix: str = "") -> str:
    """`value` formatted with the format `spec` (e.g. ",.0f", ".1%") followed by `suffix`, or
    DASH when it is None or cannot be shown as a `kind`."""
    v = checked(value, kind)
    return DASH if v is None else f"{v:{spec}}{suffix}"


def watts(value: object) -> str:
    return number(value, ",.0f", "rate", " W")


def joules(value: object) -> str:
    """Energy to three significant figures: 0.0979 J, 2.56 J, 1,840 J."""
    v = checked(value, "rate")
    if v is None:
        return DASH
    return f"{v:,.0f} J" if v >= 1000 else f"{v:.3g} J"


# -- the glance page's words ---------------------------------------------------------------
def count(value: object) -> str:
    return number(value, ",.0f")


def percent(value: object) -> str:
    v = checked(value, "ratio")
    return DASH if v is None else f"{v * 100:.0f} %"


def seconds(value: object) -> str:
    v = checked(value, "seconds")
    if v is None:
        return DASH
    if v < 10:
        return f"{v:.1f} s"
    if v < 120:
        return f"{v:.0f} s"
    if v < 7200:
        return f"{v // 60:.0f} min {v % 60:.0f} s"
    return f"{v // 3600:.0f} h {v % 3600 // 60:.0f} min"


def speed(value: object) -> str:
    return number(value, ",.1f", "rate", " tok/s")


# -- URLs ------------------------------------------------------------------------------------
def _parts(text: str) -> tuple[str, str, str, str, str | None, str | None]:
    """(scheme with "://", userinfo or "", host and the rest of the authority, path, query,
    fragment), split by hand as urllib.parse.urlsplit does, but never raising."""
    text, hash_, fragment = text.partition("#")
    text, qmark, query = text.partition("?")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    else:
        scheme += sep
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    return (scheme, userinfo + at, host, slash + path, query if qmark else None,
            fragment if hash_ else None)


def url(text: object) -> str:
    """`text` as a URL may be shown: userinfo, query and fragment replaced by `***`
    (`http://***@host:port/path?***#***`), non-printable characters escaped, at most
    MAX_URL_CHARS characters. Never raises."""
    scheme, userinfo, host, path, query, fragment = _parts(str(text))
    shown = (scheme + ("***@" if userinfo else "") + host + path
             + ("?***" if query is not None else "") + ("#***" if fragment is not None else ""))
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                    for c in shown)
    return shown if len(shown) <= MAX_URL_CHARS else shown[:MAX_URL_CHARS - 1] + "…"


def plain_url(text: str) -> str:
    """`text` if it holds no userinfo, query or fragment; a ValueError saying which (and
    showing the URL without it) otherwise."""
    scheme, userinfo, _, _, query, fragment = _parts(text)
    found = [what for what, there in (("credentials (user:password@)", bool(userinfo)),
                                      ("a query string (?…)", query is not None),
                                      ("a fragment (#…)", fragment is not None)) if there]
    if found:
        verb = "is" if len(found) == 1 else "are"
        raise ValueError(f"{' and '.join(found)} in a URL {verb} refused ({url(text)})")
    return text
