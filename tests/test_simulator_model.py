"""The scheduler model keeps SGLang's invariants and reproduces seed 000's shape."""

import pytest

from sglang_obs.exporter.sglang_log import parse_line
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.events import DecodeBatch, PrefillBatch
from sglang_obs.simulator.logs import format_event
from sglang_obs.simulator.simulation import Simulation

ALL = scenarios.available()


def walk(sim, seconds, step=1.0):
    """Advance second by second, yielding the simulation after each step."""
    t = 0.0
    while t <= seconds:
        sim.advance(t)
        yield t
        t += step


@pytest.mark.slow  # runs every scenario to its end, 1-4 s each
@pytest.mark.parametrize("name", ALL)
def test_model_never_breaks_sglang_invariants(name):
    sc = scenarios.load(name)
    sim = Simulation(sc)
    cfg = sc.server
    for _ in walk(sim, sc.duration, step=2.0):
        for s in sim.server.schedulers:
            assert len(s.running) + (1 if s.chunked else 0) <= cfg.max_running_requests
            assert 0 <= s.used_tokens <= cfg.max_total_num_tokens
            assert 0 <= s.evictable <= cfg.max_total_num_tokens - s.used_tokens
            assert s.pending_tokens >= 0
            for req in s.running:
                assert req.prefilled == req.prompt_len  # only fully prefilled requests decode
                assert req.generated <= req.output_len


def incident_peaks(name):
    sc = scenarios.load(name)
    sim = Simulation(sc)
    peaks = {"queue": 0, "pending": 0, "running": 0, "kv": 0.0, "queue_run": 0.0}
    started = None
    for t in walk(sim, sc.duration):
        s = sim.server.schedulers[0]
        peaks["queue"] = max(peaks["queue"], len(s.waiting))
        peaks["pending"] = max(peaks["pending"], s.pending_tokens)
        peaks["running"] = max(peaks["running"], len(s.running))
        peaks["kv"] = max(peaks["kv"], s.used_tokens / sc.server.max_total_num_tokens)
        if s.waiting:
            started = t if started is None else started
            peaks["queue_run"] = max(peaks["queue_run"], t - started)
        else:
            started = None
    tk = sim.server.tokenizer
    peaks["cache_hit"] = tk.cached_tokens / sum(tk.prompt_tokens.values())
    return peaks


def test_seed_000_incident_peaks_are_in_the_seeds_ranges():
    peaks = incident_peaks("long-context-incident")
    assert 3 <= peaks["queue"] <= 9  # seed: queue-req peaks 3 (11:50 window) to 9
    assert 300_000 <= peaks["pending"] <= 650_000  # seed: 292,965 .. 621,390 pending tokens
    assert 60 <= peaks["queue_run"] <= 120  # seed: longest continuous queueing ~89 s
    assert 7 <= peaks["running"] <= 11  # seed: running-req 8-9
    assert peaks["kv"] < 0.6  # seed: token usage never above ~43 %: not a capacity problem
    assert peaks["cache_hit"] > 0.9  # seed: ~96.5 % aggregated


def test_tuned_configuration_queues_less_and_caps_the_running_batch():
    original = incident_peaks("long-context-incident")
    tuned = incident_peaks("long-context-incident-tuned")
    assert tuned["running"] <= 10
    assert tuned["queue_run"] < original["queue_run"]


def test_scheduler_log_lines_round_trip_through_the_exporters_parser():
    sc = scenarios.load("long-context-incident")
    events = []
    sim = Simulation(sc, start_ts=1_790_000_000.0, on_event=events.append)
    for _ in walk(sim, 400, step=5.0):
        pass
    batches = [e for e in events if isinstance(e, PrefillBatch | DecodeBatch)]
    assert len(batches) > 50
    for event in events:
        line = format_event(event, sim.profile.release, tp_size=sc.server.tp_size)
        parsed = parse_line(line)
        assert parsed is not None, line
        if isinstance(event, PrefillBatch):
            assert parsed.kind == "prefill"
            assert parsed.fields["pending_token"] == event.pending_token
            assert parsed.fields["new_token"] == event.new_token
            assert parsed.fields["cached_token"] == event.cached_token
            assert parsed.fields["queue_req"] == event.queue_req
        elif isinstance(event, DecodeBatch):
            assert parsed.kind == "decode"
            assert parsed.fields["running_req"] == event.running_req
            assert parsed.fields["gen_throughput"] == pytest.approx(event.gen_throughput, abs=0.01)
            assert parsed.fields["accept_len"] == pytest.approx(event.accept_len, abs=0.01)


def test_crash_loses_requests_and_restart_starts_cold():
    sc = scenarios.load("crash-restart")
    sim = Simulation(sc)
    sim.advance(599.0)
    before = sum(sim.server.tokenizer.requests.values())
    assert before > 0
    sim.advance(650.0)
    assert not sim.up
    sim.advance(700.0)
    assert sim.up
    assert sim.server.restarts == 1
    assert sum(sim.server.tokenizer.requests.values()) < before  # counters start again
    assert all(s.evictable == 0 or s.now > 690 for s in sim.server.schedulers)


def test_same_scenario_and_seed_give_the_same_run():
    def run():
        sim = Simulation(scenarios.load("healthy"))
        sim.advance(300.0)
        return sim.server.tokenizer.prompt_tokens, sim.server.schedulers[0].counters

    assert run() == run()


def test_bad_scenarios_are_refused_with_the_field_named(tmp_path):
    cases = {
        "duration: -5\n": "duration",
        "duration: 10\nserver: {max_running: 3}\n": "unknown field(s) max_running",
        "duration: 10\nload: [{rate: 1, burst: 2}]\n": "exactly one of rate or burst",
        "duration: 10\nload: [{rate: 1, input_tokens: {gauss: [1, 2]}}]\n": "input_tokens",
        "duration: 10\nfaults: [{at: 1, kind: meteor}]\n": "kind must be one of",
        "duration: 10\ntruth: [{from: 0, to: 5, class: sad}]\n": "class must be one of",
        "[not, a, mapping]\n": "mapping",
        "duration: [unclosed\n": "not valid YAML",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        with pytest.raises(scenarios.ScenarioError, match=message.replace("(", r"\(")
                           .replace(")", r"\)")):
            scenarios.load(str(path))


def _lora_scenario(adapters: int) -> scenarios.Scenario:
    return scenarios.from_dict({
        "name": "lora", "description": "LoRA admission", "duration": 600, "seed": 31,
        "release": "0.5.23",
        "server": {"tp_size": 2, "max_total_num_tokens": 400_000, "max_running_requests": 128,
                   "enable_lora": True, "max_loras_per_batch": 4},
        "load": [{"at": 0, "duration": 600, "rate": 0.7, "input_tokens": {"uniform": [800, 2400]},
                  "output_tokens": {"normal": [300, 100]}, "lora_adapters": adapters}]})


def test_lora_adapters_past_the_batch_slots_make_the_queue_wait():
    """SGLang stops admitting at the first waiting request whose adapter the running batch
    cannot take (more than --max-loras-per-batch distinct adapters): the queue grows while the
    batch has room. With as many adapters as slots, nothing waits for one."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang_obs.simulator.exposition import SimCollector

    queues, peaks = {}, {}
    for adapters in (4, 6):
        sim = Simulation(_lora_scenario(adapters))
        waiting, used = [], []
        for _ in walk(sim, 600, step=5.0):
            s = sim.server.schedulers[0]
            waiting.append(len(s.waiting))
            used.append(len(s.adapters()))
            assert len(s.adapters()) <= 4
            assert len(s.running) < 128
        queues[adapters], peaks[adapters] = max(waiting), max(used)
        registry = CollectorRegistry()
        registry.register(SimCollector(lambda sim=sim: sim.server, sim.profile))
        text = generate_latest(registry).decode()
        [total] = [line for line in text.splitlines()
                   if line.startswith("sglang:lora_pool_slots_total{")]
        assert total.endswith(" 4.0")
        assert "sglang:lora_pool_utilization{" in text
    assert queues[4] <= 2 < 10 <= queues[6], queues
    assert peaks == {4: 4, 6: 4}


def test_lora_series_exist_only_with_lora_enabled():
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang_obs.simulator.exposition import SimCollector

    sim = Simulation(scenarios.load("healthy"))
    sim.advance(120)
    registry = CollectorRegistry()
    registry.register(SimCollector(lambda: sim.server, sim.profile))
    assert "lora_pool" not in generate_latest(registry).decode()


def test_the_grammar_queue_moves_in_order_and_caches_what_it_compiled():
    from sglang_obs.simulator.grammar import GrammarQueue
    q = GrammarQueue(workers=2, timeout_s=300)
    assert [q.submit(r, k, s, 0.0) for r, k, s in (("a", "x", 10), ("b", "y", 1), ("c", "z", 1))] \
        == ["queued"] * 3
    # b compiled at 1 s, but a (the head) is not ready: nothing moves until 10 s; c waited for
    # a free thread (from 1 s) and is ready at 2 s.
    assert q.poll(5.0) == ([], [])
    assert len(q) == 3
    assert q.poll(10.0) == (["a", "b", "c"], [])
    assert q.submit("d", "x", 10, 11.0) == "ready"  # a cached grammar skips the queue


def test_the_grammar_timeout_counts_only_the_heads_own_wait():
    from sglang_obs.simulator.grammar import GrammarQueue
    q = GrammarQueue(workers=1, timeout_s=60)
    # 40 compilations of 50 s on one thread: the last waits ~2000 s, none alone outlasts 60 s.
    for i in range(40):
        q.submit(i, ("unique", i), 50.0, 0.0)
    t, moved = 0.0, []
    while len(q):
        t = q.next_event()
        ready, timed_out = q.poll(t)
        assert not timed_out
        moved += ready
    assert moved == list(range(40))
    assert t == 2000.0
    # One compilation of 90 s at the head times out after 60 s, and its key is then refused.
    assert q.submit("slow", "huge", 90.0, t) == "queued"
    assert q.poll(t + 60) == ([], ["slow"])
    assert q.submit("again", "huge", 1.0, t + 61) == "invalid"


def test_structured_requests_wait_for_grammars_outside_the_waiting_queue():
    sim = Simulation(scenarios.load("grammar-compile-backlog"))
    sim.advance(700)
    scheduler = sim.server.schedulers[0]
    assert scheduler.reported.grammar_queue >= 20
    assert scheduler.reported.queue <= 2
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang_obs.simulator.exposition import SimCollector
    registry = CollectorRegistry()
    registry.register(SimCollector(lambda: sim.server, sim.profile))
    text = generate_latest(registry).decode()
    queued = [line for line in text.splitlines()
              if line.startswith("sglang:num_grammar_queue_reqs{")]
    assert queued
    assert float(queued[0].rsplit(" ", 1)[1]) >= 20
    finished = [line for line in text.splitlines()
                if line.startswith("sglang:num_so_requests_total{")]
    assert finished
    assert float(finished[0].rsplit(" ", 1)[1]) > 100
