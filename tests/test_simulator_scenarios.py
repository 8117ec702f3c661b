"""Each scenario's declared ground truth is what its rendered series show.

The checks are plain evidence, read the way seed 000 reads a dashboard, per class:
unavailable: the SGLang target is down; idle: nothing runs or waits; healthy: nothing waits;
prefill_backlog: prompt tokens wait to be prefilled while requests queue; decode_contention:
each request's decode speed falls a quarter or more below usual while the batch is twice usual;
kv_capacity: the KV pool is (nearly) full and requests are retracted; scheduling_bottleneck:
requests queue while the KV pool is far from full and running sits at its limit (or every LoRA
adapter slot is in use); gpu_lost: NVML
reports the GPU lost and the SGLang target is down; the feature classes read their own series
(spec_collapsed, hicache_dropping, grammar_backlog) on a server that is otherwise not saturated.
"""

import statistics

import pytest

from sglang_obs.core.settings import default as _settings
from sglang_obs.simulator import scenario as scenarios

from helpers import rendered as rendered_with

STEP = _settings().evaluation_interval_s  # the shipped scrape and evaluation interval


def rendered(name):
    """The session's one render of `name` at this step (shared with the detection table)."""
    return rendered_with(name, step=STEP, poll_interval=5.0)


def window(r, values, truth):
    return [v for i, v in enumerate(values)
            if truth.start <= i * STEP <= truth.end]


def share(values, predicate):
    present = [v for v in values if v is not None]
    return sum(1 for v in present if predicate(v)) / len(present) if present else 0.0


def usual(name, metric):
    """The median outside every declared incident window: the scenario's normal."""
    r = rendered(name)
    windows = scenarios.load(name).truth
    values = [v for i, v in enumerate(r.values(metric))
              if v and not any(t.start <= i * STEP <= t.end for t in windows if t.cls != "healthy")]
    return statistics.median(values)


def evidence(name, truth):
    r = rendered(name)

    def w(metric, **match):
        return window(r, r.values(metric, **match), truth)

    up = w("up", job="sglang")
    running, waiting = w("sglang_obs_running_requests"), w("sglang_obs_waiting_requests")
    backlog, kv = w("sglang_obs_prefill_backlog_tokens"), w("sglang_obs_kv_occupancy_ratio")
    ratio = w("sglang_obs_running_requests_ratio")
    speed = w("sglang_obs_decode_speed_per_request_tokens_per_second")
    retracted = [v or 0 for v in w("sglang:num_retracted_requests_total")]
    cls = truth.cls
    if cls == "unavailable":
        return all(v == 0 for v in up)
    if cls == "idle":
        return all(v == 0 for v in running) and all(v == 0 for v in waiting)
    if cls == "healthy":  # short queues that clear at once
        return share(waiting, lambda v: v <= 2) >= 0.9 and share(kv, lambda v: v < 0.8) == 1
    if cls == "prefill_backlog":
        return (share(waiting, lambda v: v > 0) >= 0.8
                and share(backlog, lambda v: v > 100_000) >= 0.8)
    if cls == "decode_contention":  # a bigger batch than usual, each request slower
        usual_speed = usual(name, "sglang_obs_decode_speed_per_request_tokens_per_second")
        usual_running = usual(name, "sglang_obs_running_requests")
        return (statistics.median(v for v in speed if v is not None) <= 0.75 * usual_speed
                and statistics.median(v for v in running if v is not None)
                >= 2 * usual_running)
    if cls == "kv_capacity":
        return share(kv, lambda v: v >= 0.9) >= 0.8 and retracted[-1] > retracted[0]
    if cls == "scheduling_bottleneck":  # at the slot limit, or held by the LoRA adapter pool
        lora = w("sglang:lora_pool_utilization")
        held = (share(ratio, lambda v: v >= 0.8) >= 0.9
                or bool(lora) and share(lora, lambda v: v >= 1) >= 0.9)
        return share(waiting, lambda v: v > 0) >= 0.9 and max(v for v in kv if v) < 0.5 and held
    if cls == "gpu_lost":  # the faulted GPU reads lost, and SGLang is down
        gpus = {f.gpu for f in scenarios.load(name).faults if f.kind == "gpu_lost"}
        lost = all(0 in w("sglang_obs_gpu_device_up", gpu=str(g)) for g in gpus)
        return bool(gpus) and lost and all(v == 0 for v in up[1:])
    if cls == "spec_collapsed":  # about one token per verify step, on a server not saturated
        accept = w("sglang:spec_accept_length")
        return (share(accept, lambda v: v < 1.5) >= 0.95
                and share(ratio, lambda v: v < 0.9) == 1 and share(kv, lambda v: v < 0.8) == 1)
    if cls == "hicache_dropping":  # evictions without a host copy, on a server not saturated
        dropped = w("sglang:hicache_dropped_tokens_total")
        evicted = w("sglang:evicted_tokens_total")
        return (dropped[-1] - dropped[0] > 0.1 * (evicted[-1] - evicted[0]) > 0
                and share(waiting, lambda v: v <= 2) >= 0.9 and share(kv, lambda v: v < 0.8) == 1)
    if cls == "grammar_backlog":  # requests wait for grammars, none for the scheduler
        grammar = w("sglang:num_grammar_queue_reqs")
        return (share(grammar, lambda v: v >= 5) >= 0.9
                and share(waiting, lambda v: v <= 2) >= 0.9 and share(kv, lambda v: v < 0.8) == 1)
    raise AssertionError(f"no evidence check for class {cls}")


CASES = [(name, t) for name in scenarios.available() for t in scenarios.load(name).truth]


@pytest.mark.slow  # renders every scenario (once per session, shared with the detection table)
@pytest.mark.parametrize(("name", "truth"), CASES,
                         ids=[f"{n}-{t.cls}-{t.start:.0f}" for n, t in CASES])
def test_declared_ground_truth_is_what_the_series_show(name, truth):
    assert evidence(name, truth), f"{name}: {truth.cls} not shown in [{truth.start}, {truth.end}]"


def test_every_class_but_healthy_has_a_scenario_that_shows_it():
    declared = {t.cls for _, t in CASES}
    assert declared >= set(scenarios.CLASSES)


@pytest.mark.slow  # renders the healthy scenario
def test_a_healthy_window_does_not_pass_as_an_incident():
    healthy = scenarios.load("healthy").truth[0]
    for cls in ("prefill_backlog", "decode_contention", "kv_capacity", "scheduling_bottleneck",
                "unavailable", "idle", "grammar_backlog"):
        fake = scenarios.Truth(healthy.start, healthy.end, cls)
        assert not evidence("healthy", fake), cls
