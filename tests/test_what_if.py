"""`sglang-sim what-if`: the estimate from known series, the replay, the calibration against the
shipped incident and tuned scenarios, and the real path (backfilled Prometheus -> what-if)."""

import dataclasses
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_obs.core import pack
from sglang_obs.core.cli_support import UsageError
from sglang_obs.core.prometheus_api import Prometheus
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator import what_if
from sglang_obs.simulator.render import Rendered

from conftest import ROOT, require_binary

SIM = str(Path(sys.executable).parent / "sglang-sim")
OBS = str(Path(sys.executable).parent / "sglang-obs")
INSTANCE = "sglang:30000"
START = 1_000_000.0


def _rendered(steps: int = 41, step: float = 15.0) -> Rendered:
    return Rendered(start=START, step=step, steps=steps)


def _native(r: Rendered, name: str, values, **labels) -> None:
    for i, v in enumerate(values):
        if v is not None:
            r.add(name, {"job": "sglang", "instance": INSTANCE, **labels}, i, float(v))


def _counter(per_step: list[float]) -> list[float]:
    out, total = [], 0.0
    for inc in per_step:
        total += inc
        out.append(total)
    return out


def _histogram(r: Rendered, name: str, bounds, observations: list[tuple[int, float]]) -> None:
    """Histogram `name` observing value v at step i for each (i, v)."""
    for le in (*bounds, float("inf")):
        incs = [0.0] * r.steps
        for i, v in observations:
            incs[i] += v <= le
        label = "+Inf" if le == float("inf") else str(float(le))
        _native(r, name + "_bucket", _counter(incs), le=label)
    counts, sums = [0.0] * r.steps, [0.0] * r.steps
    for i, v in observations:
        counts[i] += 1
        sums[i] += v
    _native(r, name + "_count", _counter(counts))
    _native(r, name + "_sum", _counter(sums))


def _known_window() -> Rendered:
    """10 minutes at 15 s steps: 2 requests scheduled at step 4 (after 30 s in the queue),
    3 at step 24; prompts of 1,000-2,000 tokens, outputs of 100-300, half of each prompt cached;
    the exporter's configuration series and a half-full radix cache at the start."""
    r = _rendered()
    sched = [0.0] * r.steps
    waited = [0.0] * r.steps
    sched[4], waited[4] = 2, 60.0  # 2 requests, 30 s each
    sched[24], waited[24] = 3, 0.0
    _native(r, "sglang:queue_time_seconds_count", _counter(sched))
    _native(r, "sglang:queue_time_seconds_sum", _counter(waited))
    finished = [(10, 1500.0), (10, 1500.0), (30, 1200.0), (30, 1800.0), (30, 1500.0)]
    _histogram(r, "sglang:prompt_tokens_histogram", (1000, 2000, 4000), finished)
    _histogram(r, "sglang:generation_tokens_histogram", (100, 300, 500),
               [(i, 200.0) for i, _ in finished])
    _histogram(r, "sglang:uncached_prompt_tokens_histogram", (500, 1000, 2000),
               [(i, v / 2) for i, v in finished])
    requests = [0.0] * r.steps
    requests[10], requests[30] = 2, 3
    _native(r, "sglang:num_requests_total", _counter(requests))
    prompt = [0.0] * r.steps
    prompt[10], prompt[30] = 3000, 4500
    _native(r, "sglang:prompt_tokens_total", _counter(prompt))
    _native(r, "sglang:cached_tokens_total", _counter([p / 2 for p in prompt]))
    _native(r, "sglang:generation_tokens_total", _counter([n * 200 for n in requests]))
    for tp in "0123":  # a constant every TP rank reports: max, not sum
        _native(r, "sglang:max_total_num_tokens", [500_000] * r.steps, tp_rank=tp)
    _native(r, "sglang:kv_evictable_tokens", [250_000] * r.steps)
    exporter = {"job": "sglang-obs", "server": INSTANCE}
    for name, value in (("sglang_obs_max_running_requests", 32),
                        ("sglang_obs_config_chunked_prefill_size_tokens", 2048),
                        ("sglang_obs_config_max_prefill_tokens", 8192)):
        _native(r, name, [value] * r.steps, **exporter)
    _native(r, "sglang_obs_server_config_info", [1] * r.steps, schedule_policy="fcfs",
            speculative_algorithm="null", version="0.5.23", tp_size="4", **exporter)
    return r


@pytest.fixture(scope="module")
def known():
    return what_if.estimate(what_if.RenderedSource(_known_window()))


def test_arrivals_are_counted_per_minute_at_their_arrival_not_their_scheduling(known):
    # Scheduled at 45-60 s after waiting 30 s: arrived in minute 0. Scheduled at 345-360 s
    # without waiting: minute 5.
    assert known.arrivals == [2, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    assert "queue_time_seconds_count" in known.arrivals_from
    assert known.finished == 5


def test_length_distributions_keep_the_histograms_bins_and_exact_means(known):
    assert known.prompt.overall.bins == [(1000.0, 2000.0, 5.0)]
    assert known.prompt.overall.mean == pytest.approx(1500.0)
    assert known.output.overall.mean == pytest.approx(200.0)
    assert known.uncached.overall.mean == pytest.approx(750.0)
    # Two 5-minute segments: the first had the two requests of step 10, the second three.
    assert [s.count if s else 0 for s in known.prompt.segments] == [2.0, 3.0]
    rng = random.Random(1)
    draws = [known.prompt.overall.draw(rng) for _ in range(2000)]
    assert min(draws) >= 1000
    assert max(draws) <= 2000
    assert sum(draws) / len(draws) == pytest.approx(1500, rel=0.03)


def test_cache_hit_warm_cache_and_server_arguments_come_from_the_series(known):
    assert known.cache_hit_ratio == pytest.approx(0.5)
    assert known.warm_cache == pytest.approx(0.5)
    assert known.args == {"max_running_requests": 32, "max_total_num_tokens": 500_000,
                          "chunked_prefill_size": 2048, "max_prefill_tokens": 8192,
                          "schedule_policy": "fcfs", "speculative_algorithm": None}
    assert known.args_from["max_total_num_tokens"] == "sglang:max_total_num_tokens"
    assert known.release == "0.5.23"


def test_a_drawn_load_has_the_estimated_counts_and_cached_shares(known):
    load = what_if.draw_load(known, seed=3, context_length=262_144)
    minutes = [int(p["at"] // 60) for p in load]
    assert sorted(minutes) == [0, 0, 5, 5, 5]
    for p in load:  # prompts 1,000-2,000 and uncached 500-1,000: cached share 0-75 %
        assert 0.0 <= p["cached_fraction"] <= 0.75
    assert what_if.draw_load(known, 3, 262_144) == load  # a seed is one reproducible draw


def test_without_token_histograms_the_counters_give_the_means():
    r = _known_window()
    r.series = {k: v for k, v in r.series.items() if "tokens_histogram" not in k[0]}
    est = what_if.estimate(what_if.RenderedSource(r))
    assert est.prompt.overall.mean == pytest.approx(1500.0)
    assert est.output.overall.mean == pytest.approx(200.0)
    assert est.uncached is None
    assert any("cache hit ratio" in n for n in est.notes)
    load = what_if.draw_load(est, 1, 262_144)
    assert {p["cached_fraction"] for p in load} == {0.5}


def test_a_window_without_requests_is_a_one_line_failure():
    r = _rendered()
    _native(r, "sglang:num_requests_total", [0] * r.steps)
    with pytest.raises(what_if.EstimateError, match="no requests in the window"):
        what_if.estimate(what_if.RenderedSource(r))


@pytest.mark.parametrize(("retention", "names"), [
    ("30d", ["no SGLang server in this window", "sglang:num_requests_total"]),
    ("1d", ["before Prometheus's retention (1 day"]),
])
def test_a_window_without_data_names_the_window_not_an_option_not_given(tmp_path, retention,
                                                                        names):
    """`--start '3d ago'` on a Prometheus that holds nothing then: the window is the problem
    (empty, or older than what Prometheus keeps), not --instance, which was not given."""
    from sglang_obs.generate.backfill import prometheus

    require_binary("prometheus")
    with prometheus(tmp_path / "data", retention=retention) as url:
        result = subprocess.run([SIM, "what-if", "--prometheus", url, "--start", "3d ago",
                                 "--end", "2d ago", "--set", "max_running_requests=10"],
                                capture_output=True, text=True, timeout=60)
    print(result.stderr)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "--instance" not in result.stderr
    assert result.stderr.startswith("sglang-sim what-if: --start/--end: ")
    for name in names:
        assert name in result.stderr


def test_replay_runs_both_configurations_on_the_same_draws(known):
    rep = what_if.replay(known, {}, {"max_running_requests": 1}, seeds=2)
    assert rep.current["max_running_requests"] == 32
    assert rep.proposed["max_running_requests"] == 1
    assert rep.current["num_continuous_decode_steps"] == 1  # the model's default
    assert [s.requests for s in rep.before] == [s.requests for s in rep.after] == [5, 5]
    _, _, delta = rep.values("running_peak")
    assert all(d <= 0 for d in delta)
    text = what_if.markdown(known, rep, {}, {"max_running_requests": 1})
    assert "model prediction" in text
    assert "| TTFT p95 over the window |" in text
    doc = what_if.document(known, rep, {}, {"max_running_requests": 1})
    assert doc["kind"] == "model prediction"
    assert len(doc["figures"]["ttft_p95_seconds"]["delta"]) == 2
    json.loads(what_if.to_json(doc))


@pytest.mark.parametrize(("items", "message"), [
    (["max_runing_requests=10"], "did you mean max_running_requests"),
    (["max_running_requests"], "expected NAME=VALUE"),
    (["max_running_requests=ten"], "expected an integer"),
    (["schedule_policy=random"], "fcfs, lpm"),
    (["gpu_name=H100"], "unknown argument 'gpu_name'"),
])
def test_bad_assignments_name_the_flag(items, message):
    with pytest.raises(UsageError, match=message) as err:
        what_if.parse_assignments("--set", items)
    assert str(err.value).startswith("--set")


def test_assignments_are_typed_by_the_models_fields():
    assert what_if.parse_assignments("--set", [
        "max_running_requests=10", "schedule_policy=lpm", "spec_accept_length=2.5",
        "speculative_algorithm=none"]) == {"max_running_requests": 10, "schedule_policy": "lpm",
                                           "spec_accept_length": 2.5,
                                           "speculative_algorithm": None}


class Recording:
    """A Source that notes every request the estimate makes of the one it wraps."""

    def __init__(self, source):
        self.source, self.asked, self.infos = source, set(), set()
        self.where, self.instance = source.where, source.instance
        self.start, self.end = source.start, source.end

    def series(self, name, agg="sum", by=None):
        self.asked.add((name, agg, by))
        return self.source.series(name, agg, by)

    def info(self, name):
        self.infos.add(name)
        return self.source.info(name)


def test_a_pack_holds_every_series_the_estimate_asks_for_on_either_path():
    """With and without the token histograms (the estimate's two paths), and every candidate
    series of every server argument: a request missing from sglang_obs.core.pack.LOAD_SERIES would
    be missing from every snapshot pack."""
    bare = _known_window()
    bare.series = {k: v for k, v in bare.series.items() if "tokens_histogram" not in k[0]}
    for rendered in (_known_window(), bare):
        source = Recording(what_if.RenderedSource(rendered))
        what_if.estimate(source)
        assert source.asked, "nothing recorded"
        assert source.asked <= set(pack.LOAD_SERIES), source.asked - set(pack.LOAD_SERIES)
        assert source.infos <= set(pack.LOAD_INFO)
    candidates = {(name, "max", None) for names in what_if.ARG_SERIES.values() for name in names}
    assert candidates <= set(pack.LOAD_SERIES), candidates - set(pack.LOAD_SERIES)


def docs_block(name: str) -> str:
    """The generated block `name` of docs/simulator.md."""
    text = (ROOT / "docs" / "simulator.md").read_text()
    return text.split(f"<!-- generated:{name} -->\n")[1].split(f"<!-- end:{name} -->")[0]


# -- calibration: the shipped incident, estimated from its rendered series -----------------
@pytest.fixture(scope="module")
def calibration():
    return what_if.calibration()


def test_the_estimate_of_the_incident_is_close_to_the_scenario(calibration):
    est, _, before, _ = calibration
    sc = scenarios.load("long-context-incident")
    assert abs(sum(est.arrivals) - len(sc.arrivals())) <= 8
    assert est.args["max_running_requests"] == 44
    assert est.args["chunked_prefill_size"] == 4096
    assert est.args["max_total_num_tokens"] == 2_300_000
    assert est.args["spec_accept_length"] == pytest.approx(2.8)
    assert est.cache_hit_ratio == pytest.approx(before.cache_hit_ratio, abs=0.01)
    assert 0.5 <= est.warm_cache <= 0.6  # the scenario's warm_cache 0.6, at the first report
    assert 90_000 <= est.prompt.overall.mean <= 130_000


# The figures the tuned scenario improves, and the way each moves (seed 000's claim).
SEED_000_DIRECTIONS = {"ttft_p95_seconds": -1, "ttft_mean_seconds": -1,
                       "queue_time_mean_seconds": -1, "longest_queueing_seconds": -1,
                       "queued_seconds": -1, "pending_peak_tokens": -1,
                       "decode_speed_p10": 1, "itl_p95_seconds": -1, "e2e_mean_seconds": -1}


@pytest.mark.parametrize("attr", sorted(SEED_000_DIRECTIONS))
def test_what_if_predicts_the_direction_the_tuned_scenario_shows(calibration, attr):
    _, rep, before, after = calibration
    sign = SEED_000_DIRECTIONS[attr]
    assert (getattr(after, attr) - getattr(before, attr)) * sign > 0  # the simulated change
    _, _, delta = rep.values(attr)
    assert sorted(delta)[len(delta) // 2] * sign > 0, delta  # the predicted median change


def test_the_calibration_table_in_docs_simulator_md_is_current(calibration, monkeypatch):
    monkeypatch.setattr(what_if, "calibration", lambda: calibration)
    assert docs_block("what-if-calibration") == what_if.calibration_table(), \
        "docs/simulator.md is stale: run make generate"


# -- the real path: backfilled Prometheus -> what-if --------------------------------------
@pytest.mark.slow
def test_what_if_on_a_backfilled_incident_matches_the_rendered_estimate(backfilled, tmp_path,
                                                                        calibration):
    b, url = backfilled("long-context-incident")
    out = tmp_path / "prediction.json"
    result = subprocess.run(
        [SIM, "what-if", "--prometheus", url, "--start", str(b.start), "--end", str(b.end),
         *[a for k, v in what_if.SEED_000.items() for a in ("--set", f"{k}={v}")],
         "--current", "num_continuous_decode_steps=2", "--perf", "decode_overhead_s=0.035",
         "--perf", "decode_s_per_kv_token=6e-8", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "# What-if: model prediction" in result.stdout
    assert "num_continuous_decode_steps=2 (--current)" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "model prediction"
    est, rep, _, _ = calibration
    # The same series through Prometheus give the same estimate as read from the render.
    assert sum(doc["estimate"]["arrivals"]) == sum(est.arrivals)
    assert doc["estimate"]["args"]["max_running_requests"] == 44
    for attr in SEED_000_DIRECTIONS:
        sign = SEED_000_DIRECTIONS[attr]
        assert doc["figures"][attr]["median_delta"] * sign > 0, attr


# -- a snapshot pack of the backfilled incident (conftest.incident_pack) -> what-if ------
def _fields(est):
    """The estimate's fields, but for the one naming where it was read."""
    return {k: v for k, v in dataclasses.asdict(est).items() if k != "where"}


@pytest.mark.slow
def test_a_pack_gives_the_estimate_prometheus_gives_for_its_window(incident_pack):
    b, url, out, _ = incident_pack
    live = Recording(what_if.PrometheusSource(Prometheus(url), b.start, b.end))
    from_prometheus = what_if.estimate(live)
    assert live.asked <= set(pack.LOAD_SERIES), live.asked - set(pack.LOAD_SERIES)
    assert live.infos <= set(pack.LOAD_INFO)
    from_pack = what_if.estimate(what_if.PackSource(out))
    assert from_pack.where == f"snapshot pack {out}"
    incident = scenarios.load("long-context-incident")  # its load, not an empty window
    assert abs(sum(from_pack.arrivals) - len(incident.arrivals())) <= 8
    expected = _fields(from_prometheus)
    for name, value in _fields(from_pack).items():
        assert value == expected[name], name


@pytest.mark.slow
def test_what_if_on_the_incidents_pack_predicts_seed_000s_directions(incident_pack, tmp_path):
    b, url, out, _ = incident_pack
    prediction = tmp_path / "prediction.json"
    result = subprocess.run(
        [SIM, "what-if", "--pack", str(out),
         *[a for k, v in what_if.SEED_000.items() for a in ("--set", f"{k}={v}")],
         "--current", "num_continuous_decode_steps=2", "--perf", "decode_overhead_s=0.035",
         "--perf", "decode_s_per_kv_token=6e-8", "--json", str(prediction)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"read from snapshot pack {out}" in result.stdout
    doc = json.loads(prediction.read_text())
    live = what_if.estimate(what_if.PrometheusSource(Prometheus(url), b.start, b.end))
    estimate = {k: v for k, v in doc["estimate"].items() if k != "where"}
    assert estimate == {k: v for k, v in json.loads(what_if.to_json(live.document())).items()
                        if k != "where"}
    for attr, sign in SEED_000_DIRECTIONS.items():
        assert doc["figures"][attr]["median_delta"] * sign > 0, attr


# -- speculative steps -------------------------------------------------------------------------
def test_the_accept_length_at_other_steps_follows_one_chance_per_draft_token():
    from sglang_obs.simulator.model import accept_length_at
    assert accept_length_at(2.5, 3, 3) == pytest.approx(2.5)
    # a = 0.5: 1 + 0.5 + 0.25 + 0.125 = 1.875 at 3 steps; 1.5 at 1 step; 1.9375 at 4
    assert accept_length_at(1.875, 3, 1) == pytest.approx(1.5)
    assert accept_length_at(1.875, 3, 4) == pytest.approx(1.9375)
    assert accept_length_at(1.0, 3, 1) == pytest.approx(1.0)  # every draft rejected
    assert accept_length_at(4.0, 3, 5) == pytest.approx(6.0)  # every draft accepted
    assert accept_length_at(9.0, 3, 1) == pytest.approx(2.0)  # more than a step yields: capped


@pytest.fixture(scope="module")
def spec_calibration():
    return what_if.spec_calibration()


def test_the_accept_length_is_read_per_minute_from_the_counters(spec_calibration):
    est = spec_calibration[0]
    assert est.args["speculative_num_steps"] == 3
    assert "spec_verify_calls_total" in est.args_from["spec_accept_length"]
    # the scenario: about 3 tokens a step until 300 s, 1.0-1.25 from 300 s to 1080 s
    early, collapsed = est.spec_accept[1:4], est.spec_accept[7:17]
    assert all(2.6 <= v <= 3.4 for v in early), early
    assert all(1.0 <= v <= 1.3 for v in collapsed), collapsed


@pytest.mark.parametrize("attr", [a for a in what_if.SPEC_FIGURES if a != "ttft_mean_seconds"])
def test_what_if_predicts_the_change_of_speculative_steps(spec_calibration, attr):
    _, rep, before, after = spec_calibration
    _, _, delta = rep.values(attr)
    unit = next(u for a, _, u, _ in what_if.FIGURES if a == attr)
    change = float(getattr(after, attr)) - float(getattr(before, attr))
    assert what_if.direction(change, delta, unit).startswith("agrees"), (change, delta)


def test_the_spec_calibration_table_in_docs_simulator_md_is_current(spec_calibration,
                                                                    monkeypatch):
    monkeypatch.setattr(what_if, "spec_calibration", lambda: spec_calibration)
    assert docs_block("what-if-spec-calibration") == what_if.spec_calibration_table(), \
        "stale: python -m sglang_obs.generate simulator-docs"


# -- HiCache host pool ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hicache_calibration():
    return what_if.hicache_calibration()


def test_the_working_set_is_read_from_the_split_of_the_hits(hicache_calibration):
    est = hicache_calibration[0]
    sc = scenarios.load(what_if.HICACHE_SCENARIO)
    assert est.args["enable_hierarchical_cache"] is True
    assert est.args["hicache_ratio"] == pytest.approx(sc.server.hicache_ratio)
    # 0-240 s: a working set of 100,000 tokens that fits the device cache: the hits are all on
    # the device, and the estimate is the device cache's size (the working set fits there)
    device = sc.server.max_total_num_tokens
    assert all(75_000 <= w <= device for w in est.working_set[0:4]), est.working_set[0:4]
    # from 480 s the working set (500,000 -> 1,000,000) outgrows both tiers: the estimate stops
    # at their size (a lower bound), never above it
    tiers = sc.server.max_total_num_tokens * (1 + sc.server.hicache_ratio)
    later = [w for w in est.working_set[9:18] if w is not None]
    assert later
    assert all(w <= tiers for w in later), later
    assert any("lower bound" in note for note in est.notes)


def test_what_if_predicts_the_way_a_larger_host_pool_moves_the_hits(hicache_calibration):
    _, rep, before, after = hicache_calibration
    _, _, delta = rep.values("cache_hit_ratio")
    change = after.cache_hit_ratio - before.cache_hit_ratio
    assert change > 0
    assert statistics.median(delta) > 0
    assert statistics.median(delta) < change  # a lower bound, as the docs say


def test_the_hicache_calibration_table_in_docs_simulator_md_is_current(hicache_calibration,
                                                                       monkeypatch):
    monkeypatch.setattr(what_if, "hicache_calibration", lambda: hicache_calibration)
    assert docs_block("what-if-hicache-calibration") == what_if.hicache_calibration_table(), \
        "stale: python -m sglang_obs.generate simulator-docs"
