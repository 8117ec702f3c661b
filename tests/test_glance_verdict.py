"""The glance page tells one story: its badge and its reading patterns come from one
classification, and its first minute says "none yet" where a supported release has simply not
finished a request, and the arrivals it draws are the requests it says it received."""

import json
import random
from dataclasses import replace

import pytest

from sglang_obs.exporter.status import (
    COUNTED_FROM_FIRST_REQUEST,
    PRIORITY,
    QUIET_STATES,
    READINGS,
    Signals,
    StatusBoard,
    classify,
    conditions,
    load_classification,
    readings,
)
from sglang_obs.exporter.status_page import NONE_YET, NOT_REPORTED, status_with_display

from test_conformance import GOLDENS, RELEASES
from test_status import snapshot

C = load_classification()
SATURATION = ("kv_capacity", "prefill_backlog", "decode_contention", "scheduling_bottleneck")
BUSY_GPUS = [{"up": True, "utilization_ratio": 0.95, "memory_used_bytes": 70e9,
              "memory_total_bytes": 80e9}]
IDLE_GPUS = [{"up": True, "utilization_ratio": 0.02, "memory_used_bytes": 75e9,
              "memory_total_bytes": 80e9}]


def _check(s: Signals, gpus, minute) -> str:
    state = classify(s, C)
    shown = readings(state, s, C, gpus, minute)
    pointed = {r["state"] for r in shown}
    if state in SATURATION:
        assert state in pointed, f"badge {state} without its reading: {s}"
    assert pointed <= {state, None}, f"badge {state}, readings point to {pointed}: {s}"
    if None in pointed:
        assert state in QUIET_STATES, f"a quiet server's pattern beside {state}: {s}"
    return state


def test_decode_contention_with_a_grown_batch_far_from_the_limit_has_its_reading():
    # The page: "Decode contention ... with 6 of 44 slots running (14 %)" while
    # "None of the four reading patterns applies now": the batch had grown to twice its usual
    # size (the classification's second branch), the seed's pattern wants it at the limit.
    s = Signals(available=True, kv_occupancy=0.3, prefill_backlog=0.0, waiting=0.0, running=6.0,
                kv_used=6 * 90_000.0, running_ratio=6 / 44, speed=12.0, speed_p90_1h=40.0,
                running_avg_1h=2.5, queue_seconds=0.0)
    assert classify(s, C) == "decode_contention"
    shown = readings("decode_contention", s, C, [], {})
    assert [r["id"] for r in shown] == ["batch_grown_speed_falling"]
    assert "6 running, 2.4× the usual batch of 2.5, 90,000 KV tokens each" in shown[0]["text"]
    _check(s, [], {})


def test_no_badge_without_its_reading_and_no_reading_of_another_state():
    rng = random.Random(27)
    seen = set()
    for _ in range(20000):
        def maybe(value):
            return None if rng.random() < 0.1 else value
        limit = rng.choice([8.0, 44.0, 64.0])
        running = maybe(float(rng.randint(0, int(limit))))
        s = Signals(
            available=rng.random() > 0.05,
            kv_occupancy=maybe(rng.random()),
            retracted_recently=rng.random() < 0.05,
            prefill_backlog=maybe(rng.choice([0.0, rng.uniform(0, 3e5)])),
            waiting=maybe(float(rng.randint(0, 6))),
            running=running,
            kv_used=maybe(rng.choice([0.0, rng.uniform(0, 2e6)])),
            running_ratio=None if running is None else running / limit,
            speed=maybe(rng.uniform(1, 60)),
            speed_p90_1h=maybe(rng.uniform(10, 60)),
            running_avg_1h=maybe(rng.uniform(0.5, 30)),
            queue_seconds=maybe(rng.choice([0.0, rng.uniform(0, 120)])),
        )
        minute = {"backlog_then": rng.choice([None, 0.0, 5e4])}
        seen.add(_check(s, rng.choice([[], BUSY_GPUS, IDLE_GPUS]), minute))
    assert seen == set(PRIORITY), f"the random signals never reached {set(PRIORITY) - seen}"


def test_every_reading_points_to_a_state_and_the_saturation_states_all_have_one():
    assert {state for state, _ in READINGS.values()} == {*SATURATION, None}
    assert all(set(conditions(Signals(available=True), C)) == set(PRIORITY) for _ in (0,))


# -- the first minute ----------------------------------------------------------------------------
def test_the_tokenizer_counters_are_defined_by_every_supported_release():
    for release in RELEASES:
        manifest = json.loads((GOLDENS / release / "default" / "manifest.json").read_text())
        defined = set(manifest["families_defined"])
        assert {f"sglang:{name}" for name in COUNTED_FROM_FIRST_REQUEST} <= defined, release


def test_a_fresh_server_says_none_yet_not_unreported():
    # A server that answers but has finished no request: SGLang has not created its labelled
    # tokenizer counters yet. Before: "Received / finished: not reported by this release".
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    for i in range(3):
        tracker.observe(i * 5.0, snapshot(polls=i + 1, running_requests=float(i)))
    srv = status_with_display(board)["servers"][0]
    text = srv["display"]["text"]
    assert (text["p.received"], text["p.finished"]) == ("2", "0")
    for key in ("b.requests", "b.prompt", "b.generated"):
        assert text[key] == "0", key
    for key in ("b.ttft", "b.request", "b.gen_speed", "b.cache_hit"):
        assert text[key] == NONE_YET, key
    assert not [k for k, v in text.items() if k.startswith(("p.", "b.")) and v == NOT_REPORTED]


def test_arrivals_now_is_the_received_figure():
    # Before: "Arrivals per min now 0.0" (its newest 10 s slot) beside "Received 5" (the last
    # minute): two windows for one quantity.
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    finished = 0.0
    for i in range(40):  # 200 s; five requests finish in the first 20 s of the last minute
        if 140 <= i * 5.0 < 160:
            finished += 1.0
        tracker.observe(i * 5.0, snapshot(polls=i + 1, running_requests=0.0,
                                          native={"num_requests_total": finished}))
    srv = status_with_display(board)["servers"][0]
    text = srv["display"]["text"]
    assert text["p.received"] == "4"
    assert text["tr.arrivals_per_minute"].startswith("last minute 4.0 · max ")
    assert text["tr.completions_per_minute"].startswith("last minute 4.0 · max ")


@pytest.mark.parametrize("state", SATURATION)
def test_the_page_shows_the_reading_of_its_badge(state):
    base = Signals(available=True, kv_occupancy=0.3, prefill_backlog=0.0, waiting=0.0,
                   running=10.0, running_ratio=10 / 44, speed=40.0, speed_p90_1h=40.0,
                   running_avg_1h=10.0, queue_seconds=0.0)
    s = {"kv_capacity": replace(base, kv_occupancy=0.95),
         "prefill_backlog": replace(base, prefill_backlog=2e5, waiting=3.0, queue_seconds=20.0),
         "decode_contention": replace(base, running=44.0, running_ratio=1.0, speed=10.0),
         "scheduling_bottleneck": replace(base, waiting=2.0, queue_seconds=45.0)}[state]
    assert classify(s, C) == state
    assert _check(s, BUSY_GPUS, {"backlog_then": 1e5}) == state
