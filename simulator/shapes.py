"""What a real SGLang server of each release exposes that the scheduler model does not drive.

simulator/shapes/<release>.json is generated (`python -m sglang_obs.generate simulator-shapes`)
from conformance/goldens/<release>/default/metrics.prom, the answer of the release's own
collectors on a default-flags server under load. Per family: its type, help, label names in
order, histogram bucket bounds, which label values its series carry besides the rank labels,
whether every TP rank reports it, and (for startup-time gauges, those with a `phase`) the
value. The simulator emits every such family it does not model itself, at zero (startup gauges
at the golden's value), with the release's own names, labels and buckets, so that a dashboard
or rule sees the same families on the simulator as on a real server of that release.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent / "shapes"
# The labels the simulator fills from its own ranks, not from the catalogue.
RANK_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank",
               "pid", "priority")


def catalogue(text: str) -> dict[str, dict]:
    """The shapes of an exposition's families (the generator's half)."""
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        names: list[str] = []
        combos: list[dict[str, str]] = []
        buckets: list[float] = []
        ranks = set()
        value = None
        # `le` is a bucket bound of a histogram; of a gauge (SGLang's gauge histograms) a label.
        bound_label = "le" if family.type == "histogram" else None
        for sample in family.samples:
            for label in sample.labels:
                if label != bound_label and label not in names:
                    names.append(label)
            if bound_label in sample.labels:
                bound = float(sample.labels["le"])
                if bound not in buckets and not math.isinf(bound):
                    buckets.append(bound)
            other = {k: v for k, v in sample.labels.items()
                     if k not in RANK_LABELS and k != bound_label}
            extra = sample.name[len(family.name):]  # _bucket, _sum, _count, _created, _total
            if other not in combos and extra not in ("_sum", "_count", "_created"):
                combos.append(other)
            ranks.add(sample.labels.get("tp_rank"))
            if family.type == "gauge" and "phase" in sample.labels:
                value = sample.value
        out[name] = {"type": family.type, "help": family.documentation, "labels": names,
                     "series": combos, "buckets": sorted(buckets), "every_rank": len(ranks) > 1,
                     "value": value}
    return dict(sorted(out.items()))


@functools.cache
def load(release: str) -> dict[str, dict]:
    """The release's catalogue; empty when none was generated for it."""
    path = HERE / f"{release}.json"
    return json.loads(path.read_text()) if path.is_file() else {}
