"""Read SGLang's /metrics exposition into the few per-server numbers the exporter derives from.

Three traps handled here, all described in the SGLang reference:
- spelling: `sglang:x` (text format) or `sglang_x` (prometheus_client >= 0.23 answering an
  OpenMetrics scraper with escaping=underscores). Both map to the bare name `x`.
- renames across releases: old exposed names map to the current one (RENAMES).
- ranks: scheduler series repeat per tp/pp/ep rank (and constants on every rank) and split per
  dp_rank; `pid`-labelled gauges repeat per process. Load is max within a DP rank, summed over DP
  ranks; ratios are the worst (max) rank. Priority-split series keep only the total (`priority=""`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families as parse_text

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
    }
)
# Per-DP ratios and per-server constants: the worst / largest value over every rank.
MAXIMUM = frozenset({"token_usage", "context_len"})

WANTED = ADDITIVE | MAXIMUM
# Scheduler gauges that every SGLang release with --enable-metrics exposes once it has reported.
SCHEDULER_PRESENCE = ("num_running_reqs", "num_queue_reqs")

class ExpositionError(ValueError):
    """The body is not a Prometheus/OpenMetrics exposition."""

@dataclass
class NativeMetrics:
    """Aggregated view of one /metrics answer."""

    values: dict[str, float] = field(default_factory=dict)  # bare name -> aggregated value
    model_name: str = ""
    spelling: str = "none"  # colon | underscore | mixed | none
    sample_count: int = 0

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def has_scheduler_series(self) -> bool:
        return any(name in self.values for name in SCHEDULER_PRESENCE)

def parse_exposition(text: str, content_type: str = "") -> NativeMetrics:
    """Parse an exposition body and aggregate the wanted SGLang series across ranks."""
    if "openmetrics" in content_type.lower():
        # prometheus_client's strict OpenMetrics parser rejects exactly what SGLang sends with
        # escaping=underscores (sample names no longer match the HELP/TYPE names). The text
        # parser reads the same samples; the mandatory `# EOF` still detects truncation.
        body = text.rstrip("\n")
        if not body.endswith("# EOF"):
            raise ExpositionError("OpenMetrics body without '# EOF' (truncated)")
        text = body[: -len("# EOF")]
    try:
        return _aggregate(_samples(parse_text(text)))
    except ExpositionError:
        raise
    except Exception as err:  # the parsers raise ValueError, KeyError, IndexError, ... on junk
        raise ExpositionError(f"{type(err).__name__}: {err}"[:200]) from None

def _samples(families) -> Iterable[tuple[str, str, dict[str, str], float]]:
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name.startswith(COLON_PREFIX):
                spelling, bare = "colon", name[len(COLON_PREFIX):]
            elif name.startswith(UNDERSCORE_PREFIX):
                spelling, bare = "underscore", name[len(UNDERSCORE_PREFIX):]
            else:
                yield "", "", sample.labels, sample.value
                continue
            yield spelling, RENAMES.get(bare, bare), sample.labels, sample.value

def _aggregate(samples) -> NativeMetrics:
    out = NativeMetrics()
    spellings: set[str] = set()
    # name -> (model_name, dp_rank) -> max value
    per_dp: dict[str, dict[tuple[str, str], float]] = {}
    for spelling, bare, labels, value in samples:
        out.sample_count += 1
        if not spelling:
            continue
        spellings.add(spelling)
        if bare not in WANTED or labels.get("priority", "") != "":
            continue
        if not isinstance(value, float | int) or math.isnan(value):
            continue
        model = labels.get("model_name", "")
        if model and not out.model_name and bare in SCHEDULER_PRESENCE:
            out.model_name = model
        key = (model, labels.get("dp_rank", "") if bare in ADDITIVE else "")
        groups = per_dp.setdefault(bare, {})
        groups[key] = max(value, groups.get(key, -math.inf))
    if out.sample_count == 0:
        raise ExpositionError("no samples in the body")
    for bare, groups in per_dp.items():
        out.values[bare] = sum(groups.values()) if bare in ADDITIVE else max(groups.values())
    out.spelling = (
        "mixed" if len(spellings) > 1 else next(iter(spellings)) if spellings else "none"
    )
    return out
