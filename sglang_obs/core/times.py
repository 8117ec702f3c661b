"""The times the commands read and print: one parser and one formatter for snapshot, compare and
what-if (a low module: sglang_obs.tools and sglang_obs.simulator both import it)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from sglang_obs.core.cli_support import Failure, UsageError

_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s+ago\s*$")


def parse_time(text: str, now: float | None = None, flag: str = "",
               error: type[Failure] = UsageError) -> float:
    """'now', '30m ago', a Unix timestamp, or an ISO time (UTC unless it says otherwise).
    `flag` names the argument in the error, an `error` (a usage error by default)."""
    now = time.time() if now is None else now
    if text.strip() == "now":
        return now
    m = _AGO.match(text)
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise error(f"{flag + ': ' if flag else ''}cannot read time {text!r}: "
                    "use now, '30m ago', a Unix timestamp or 2026-11-29T10:00:00Z") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_words(duration: str) -> str:
    """"30s" -> "30 seconds": a description that names its own for: reads it from the rule."""
    number, unit = int(duration[:-1]), {"s": "second", "m": "minute", "h": "hour"}[duration[-1]]
    if unit == "second" and number >= 60 and number % 60 == 0:
        number, unit = number // 60, "minute"
    return f"{number} {unit}{'s' if number != 1 else ''}"
