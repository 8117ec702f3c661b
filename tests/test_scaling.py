"""The replica recommendation (docs/scaling.md): its policy step by step, and on the simulator's
ramp the PromQL (real rule files, promtool) equal to the Python the replay applied, leading the
TTFT SLO's fast burn, holding the SLO, and scaling down without flapping."""

from __future__ import annotations

from itertools import pairwise

import pytest

from sglang_obs.core import scaling, settings
from sglang_obs.generate import scaling_replay
from sglang_obs.simulator import scenario as scenarios

from conftest import require_binary

S = settings.default()
POLICY = scaling.Policy.from_thresholds(S.thresholds)
EVERY = 15.0


def recommender() -> scaling.Recommender:
    return scaling.Recommender(POLICY)


def drive(r: scaling.Recommender, loads: list[float], start: float = 0.0) -> list[int]:
    return [r.step(start + i * EVERY, {"a:1": x}) for i, x in enumerate(loads)]


# -- the policy -----------------------------------------------------------------------------
def test_a_server_is_as_loaded_as_its_busiest_signal_over_its_target():
    p = POLICY
    assert p.server_load(32, 0, 64, 0.1, 0) == pytest.approx(32 / 64 / p.running_target_ratio)
    assert p.server_load(1, 0, 64, 0.63, 0) == pytest.approx(0.63 / p.kv_target_ratio)
    backlog = p.backlog_tokens * p.backlog_target_ratio * 3
    assert p.server_load(1, 0, 64, 0.1, backlog) == pytest.approx(3.0)
    # A queue counts as load: the pool asks for enough servers at once.
    assert p.server_load(64, 192, 64, 0.5, 0) == pytest.approx(4 / p.running_target_ratio)


def test_a_missing_signal_is_left_out_and_none_is_no_load():
    p = POLICY
    assert p.server_load(None, 0, 64, 0.35, None) == pytest.approx(0.35 / p.kv_target_ratio)
    assert p.server_load(10, 0, 0, None, None) is None  # max_running 0: no requests signal
    assert p.server_load(None, None, None, None, None) is None


def test_the_desired_count_is_the_load_rounded_up_within_min_and_max():
    assert POLICY.desired(0.0) == POLICY.min_replicas
    assert POLICY.desired(1.01) == 2
    assert POLICY.desired(3.0) == 3
    assert POLICY.desired(1e9) == POLICY.max_replicas


def test_it_follows_the_load_up_at_once():
    r = recommender()
    out = drive(r, [0.5, 0.5] + [3.5] * 10)
    assert out[:3] == [1, 1, 2]  # the first 3.5 averaged with the 0.5s before it: 1.5
    assert r.load == pytest.approx(3.5)  # the window holds only 3.5 now
    assert out[-1] == 4


def test_it_steps_down_one_server_per_window_after_the_load_stayed_low_for_a_window():
    r = recommender()
    window = int(POLICY.scale_down_window_s // EVERY)
    drive(r, [6.0] * 20)
    assert r.recommended == 6
    low = drive(r, [0.1] * (4 * window + 8), start=20 * EVERY)
    changes = [i for i in range(1, len(low)) if low[i] != low[i - 1]]
    assert [low[i - 1] - low[i] for i in changes] == [1] * len(changes)  # one at a time
    assert all(b - a >= window for a, b in pairwise(changes))  # once per window
    assert low[0] == 6
    assert low[-1] < 6


def test_a_dip_shorter_than_the_window_changes_nothing():
    r = recommender()
    window = int(POLICY.scale_down_window_s // EVERY)
    out = drive(r, [3.0] * 20 + [0.2] * (window - 2) + [3.0] * 20)
    assert set(out) == {3}


def test_a_load_that_still_fills_a_smaller_pool_keeps_the_servers():
    """One server fewer must carry the load at scale_down_fill_ratio: the signals grow faster
    than the traffic near a server's limit."""
    r = recommender()
    drive(r, [3.0] * 20)
    keep = (3 - 1) * POLICY.scale_down_fill_ratio + 0.01
    assert set(drive(r, [keep] * 200, start=20 * EVERY)) == {3}


def test_a_server_that_left_the_pool_no_longer_counts():
    r = recommender()
    r.step(0, {"a:1": 1.5, "b:1": 1.5})
    assert r.load == pytest.approx(3.0)
    r.step(EVERY, {"a:1": 1.5})
    assert r.load == pytest.approx(1.5)


def test_the_pool_scenarios_stay_out_of_the_per_server_tables():
    assert "scale-ramp" in scenarios.pool_scenarios()
    assert "scale-ramp" not in scenarios.available()
    ramp = scenarios.load("scale-ramp")
    starts = [a.arrival for a in ramp.arrivals()]
    lo, hi = ramp.phases[0]["rate"]["ramp"]
    assert hi / lo == 4  # 4x over the hour
    first = sum(1 for t in starts if t < 600) / 600  # the ramp's first 10 minutes
    plateau = sum(1 for t in starts if 3600 <= t < 4800) / 1200
    assert first == pytest.approx(lo + (hi - lo) * 300 / 3600, rel=0.15)
    assert plateau == pytest.approx(hi, rel=0.1)


# -- the ramp, replayed -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    require_binary("promtool")
    return scaling_replay.replay(S, tmp_path_factory.mktemp("scaling"))


@pytest.mark.slow
def test_the_promql_recommends_what_the_replay_applied_at_every_step(replayed):
    _, scaled = replayed
    decisions = scaled.fleet.decisions
    assert len(decisions) == scaled.steps
    wrong = [(d.t, d.recommended, scaled.recommended.get(i))
             for i, d in enumerate(decisions) if scaled.recommended.get(i) != d.recommended]
    assert wrong == []
    loads = [(d.t, d.load, scaled.load.get(i)) for i, d in enumerate(decisions)
             if scaled.load.get(i) != pytest.approx(d.load, abs=1e-9)]
    assert loads == []


@pytest.mark.slow
def test_the_recommendation_rises_before_the_fast_burn_and_the_slo_holds_with_it(replayed):
    unscaled, scaled = replayed
    objective = float(S.thresholds["slo"]["ttft"]["objective"])
    assert unscaled.burn_onset is not None, "one server must burn the TTFT budget on the ramp"
    assert unscaled.first_alert() is not None
    rise = unscaled.rise()
    assert rise is not None
    assert rise < unscaled.burn_onset
    lead = unscaled.burn_onset - rise
    print(f"recommendation above 1 at {rise / 60:.1f} min, fast burn at "
          f"{unscaled.burn_onset / 60:.1f} min: {lead / 60:.1f} min ahead")
    assert lead > scaling_replay.STARTUP_S  # time for the new server to start
    assert scaled.burn_onset is None
    assert scaled.ttft_errors < 1 - objective
    assert unscaled.ttft_errors > 1 - objective
    assert set(scaled.alerts) <= {"Watchdog"}
    assert scaled.fleet.lost == 0


@pytest.mark.slow
def test_the_ramp_down_recommends_fewer_servers_without_flapping(replayed):
    _, scaled = replayed
    decisions = scaled.fleet.decisions
    peak_at = max(range(len(decisions)), key=lambda i: decisions[i].recommended)
    after = decisions[peak_at:]
    changes = [b for a, b in pairwise(after) if b.recommended != a.recommended]
    assert changes
    assert after[-1].recommended < decisions[peak_at].recommended
    assert all(b.recommended < a.recommended for a, b in pairwise(after)
               if b.recommended != a.recommended), "the ramp-down never asks for more"
    gaps = [b.t - a.t for a, b in pairwise(changes)]
    assert all(g >= POLICY.scale_down_window_s for g in gaps), gaps


@pytest.mark.slow
def test_docs_scaling_md_states_this_replay(replayed):
    text = (S.docs_dir / scaling_replay.DOC).read_text()
    block = text.split(f"<!-- generated:{scaling_replay.BLOCK} -->\n", 1)[1].split(
        f"<!-- end:{scaling_replay.BLOCK} -->", 1)[0]
    assert block == scaling_replay.doc_block(*replayed) + "\n", (
        "stale: python -m sglang_obs.generate scaling")
