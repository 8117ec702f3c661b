"""The PD deployment's recording rules on a real Prometheus backfilled with a PD scenario: the
TTFT decomposition is the critical path's stages, and a pool that serves requests is never
called idle because none is held at the instant of a scrape."""

from __future__ import annotations

import pytest

from sglang_obs.core.prometheus_api import Prometheus
from sglang_obs.core.states import PD_STATES
from sglang_obs.render import pd_rules, rules

from helpers import query_range

pytestmark = pytest.mark.slow  # backfills a PD scenario into a real Prometheus TSDB


def _range(url: str, b, expr: str) -> list[dict]:
    return query_range(url, expr, b.start, b.end, step=b.step)


def test_the_ttft_decomposition_is_the_critical_path(backfilled):
    b, url = backfilled("pd-healthy")
    stages = {r["metric"]["stage"] for r in _range(url, b,
                                                   "cluster:sglang_pd_ttft_stage_seconds:avg1m")}
    assert stages == set(pd_rules.TTFT_STAGES)
    ratios = sorted(abs(float(v)) for r in _range(
        url, b, "cluster:sglang_pd_ttft_unexplained:ratio1m")
        for t, v in r["values"] if float(t) >= b.start + 120)
    assert len(ratios) > 100
    # Most minutes close; a single minute may not (docs/detection.md says why).
    assert ratios[len(ratios) // 2] <= 0.05, f"median minute {ratios[len(ratios) // 2]:.1%}"
    # Over the run, the one definition the 1-min record uses closes within 10 %.
    window = f"{int(b.end - b.start) - 120}s"
    [whole] = Prometheus(url, timeout=60).query(
        pd_rules.ttft_unexplained(rules.inputs(), window), at=b.end)
    assert abs(float(whole["value"][1])) <= 0.10, whole


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_a_pool_that_serves_requests_is_not_idle(backfilled, pool):
    b, url = backfilled("pd-healthy")
    codes = [int(float(v)) for r in _range(url, b, f'{pd_rules.POOL_CODE}{{pool="{pool}"}}')
             for t, v in r["values"] if float(t) >= b.start + 120]
    assert len(codes) > 100
    idle = codes.count(PD_STATES.index("idle"))
    healthy = codes.count(PD_STATES.index("healthy"))
    assert idle == 0, (pool, idle, len(codes))
    assert healthy == len(codes), (pool, healthy, len(codes))
