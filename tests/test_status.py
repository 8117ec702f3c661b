"""The glance page's model and HTTP answers (exporter/status.py, exporter/status_page.py):
the same classification as the recording rules, bounded history, escaped values, safe headers,
and nothing of it on the scrape path. The replay against promtool is test_status_agreement.py,
the real browser test_glance_browser.py."""

import http.client
import json
import re
import threading
import tracemalloc
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sglang_obs.exporter import cli
from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.derived import Derived
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.gpu_feed import FeedNvml
from sglang_obs.exporter.nvml import GpuReading, NvmlBackend, NvmlReading
from sglang_obs.exporter.poller import PollSettings, Snapshot, TargetPoller
from sglang_obs.exporter.queue_run import QueueRunState
from sglang_obs.exporter.sglang_api import PD_QUEUES, PdLoad, ServerConfig
from sglang_obs.exporter.status import (
    OTHER_FIELDS,
    PRIORITY,
    Classification,
    Signals,
    StatusBoard,
    ThresholdsError,
    classify,
    default_thresholds_file,
    load_classification,
    quantile,
)
from sglang_obs.exporter.status_page import (
    CSP,
    GlancePages,
    status_json,
    status_with_display,
)
from sglang_obs.exporter.status_page import page as render_page
from sglang_obs.exporter.web import Exposition, make_app, serve
from sglang_obs.generate import detection
from sglang_obs.render import rules
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import in_process_fetcher
from sglang_obs.simulator.server import make_app as sim_app
from sglang_obs.simulator.simulation import GPU_IDLE_POWER_W, GPU_POWER_LIMIT_W, Simulation

from fake_sglang import Route

ROOT = Path(__file__).resolve().parent.parent
MARKUP = "<script>alert(1)</script>"
C = load_classification()


def snapshot(server="s:1", up=True, polls=1, **derived) -> Snapshot:
    values = {"running_requests": 2.0, "waiting_requests": 0.0, "kv_occupancy_ratio": 0.2,
              "max_running_requests": 10.0, "running_requests_ratio": 0.2,
              "decode_speed_per_request": 20.0, "model_name": "m", **derived}
    native = values.pop("native", {})
    return Snapshot(server=server, up=up, polls=polls, last_success_timestamp=1.0,
                    derived=Derived(**values) if up else None,
                    queue_run=QueueRunState(0.0, (0,) * 14, 0.0, 0, 0.0) if up else None,
                    native_values=native)


# -- one classification --------------------------------------------------------------------------
def test_classification_reads_every_threshold_of_the_shipped_file_and_nothing_else():
    doc = yaml.safe_load(default_thresholds_file().read_text())
    shipped = {**doc["classification"], **{k: doc[section][k]
                                           for k, section in OTHER_FIELDS.items()}}
    assert {f.name for f in fields(Classification)} == set(shipped)
    assert {f.name: getattr(C, f.name) for f in fields(Classification)} == {
        k: detection.seconds(v) if k == "kv_retraction_window" else float(v)
        for k, v in shipped.items()}


def test_verdict_priority_is_the_recording_rules_order():
    t = rules.inputs()
    assert tuple(k.state for k in rules.state_classes(t)) == PRIORITY


BUSY = dict(available=True, kv_occupancy=0.3, kv_used=8 * 20_000.0, waiting=0.0, running=8.0,
            running_ratio=0.5,
            speed=20.0, speed_p90_1h=20.0, running_avg_1h=8.0, queue_seconds=0.0,
            prefill_backlog=0.0)


@pytest.mark.parametrize(("signals", "expected"), [
    (dict(BUSY, available=False, kv_occupancy=0.99), "unavailable"),
    (dict(BUSY, kv_occupancy=0.9, prefill_backlog=500_000, waiting=5), "kv_capacity"),
    (dict(BUSY, retracted_recently=True), "kv_capacity"),
    (dict(BUSY, prefill_backlog=100_000, waiting=1), "prefill_backlog"),
    # waiting prompts behind a batch at its limit wait for a slot, not for prefill
    (dict(BUSY, prefill_backlog=600_000, waiting=3, running_ratio=0.95), "healthy"),
    (dict(BUSY, prefill_backlog=600_000, waiting=0), "healthy"),
    (dict(BUSY, prefill_backlog=None, waiting=4), "healthy"),  # absent: the condition is false
    # collapse at the limit; a drop with a batch twice its usual size
    (dict(BUSY, speed=9.9, running_ratio=0.9), "decode_contention"),
    (dict(BUSY, speed=9.9, running_ratio=0.89, running_avg_1h=5.0), "healthy"),
    (dict(BUSY, speed=13.9, running_avg_1h=4.0), "decode_contention"),
    (dict(BUSY, speed=13.9, running_avg_1h=4.1), "healthy"),
    # ...of long requests: a grown batch of short chats slows only until it drains
    (dict(BUSY, speed=13.9, running_avg_1h=4.0, kv_used=8 * 8000.0), "decode_contention"),
    (dict(BUSY, speed=13.9, running_avg_1h=4.0, kv_used=8 * 7999.0), "healthy"),
    (dict(BUSY, speed=13.9, running_avg_1h=4.0, kv_used=None), "healthy"),
    (dict(BUSY, speed=9.9, running_ratio=0.9, kv_used=8 * 3000.0), "decode_contention"),
    (dict(BUSY, speed=13.9, running=3.0, running_avg_1h=1.0), "healthy"),
    (dict(BUSY, speed=1.0, running_ratio=1.0, kv_occupancy=0.04), "healthy"),
    (dict(BUSY, speed=1.0, running_ratio=1.0, speed_p90_1h=None), "healthy"),
    (dict(BUSY, queue_seconds=30.0, waiting=2), "scheduling_bottleneck"),
    (dict(BUSY, queue_seconds=30.0, waiting=2, kv_occupancy=0.8), "healthy"),
    (dict(BUSY, running=0.0, waiting=0.0, speed=None), "idle"),
    (dict(BUSY, running=None, waiting=0.0), "healthy"),
    (dict(BUSY), "healthy"),
])
def test_verdict_follows_the_rules_conditions(signals, expected):
    assert classify(Signals(**signals), C) == expected


def test_quantile_is_prometheus_quantile_over_time():
    assert quantile(0.9, [float(v) for v in range(10, 0, -1)]) == pytest.approx(9.1)
    assert quantile(0.9, [4.0]) == 4.0
    assert quantile(0.9, []) is None


def test_baseline_takes_one_sample_per_evaluation_step_and_an_absent_one_counts_as_absent():
    # Prepare: the first poll of a step sees no decode speed (nothing runs), later ones do
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    # Act
    tracker.observe(0.0, snapshot(decode_speed_per_request=None, polls=1))
    tracker.observe(5.0, snapshot(decode_speed_per_request=50.0, polls=2))
    tracker.observe(10.0, snapshot(decode_speed_per_request=50.0, polls=3))
    tracker.observe(board.baseline_step, snapshot(decode_speed_per_request=10.0, polls=4))
    # Check: the rules' recorded series has no sample at 0 and 10.0 at 15: the p90 is 10
    assert tracker.signals()[0].speed_p90_1h == 10.0


def test_a_retraction_counts_for_its_window_and_a_counter_already_there_at_start_does_not():
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    tracker.observe(0.0, snapshot(native={"num_retracted_requests_total": 7.0}))
    assert not tracker.signals()[0].retracted_recently
    tracker.observe(5.0, snapshot(polls=2, native={"num_retracted_requests_total": 9.0}))
    assert tracker.verdict() == "kv_capacity"
    w = C.kv_retraction_window  # the rise was seen at 5 s, after the poll at 0 s
    tracker.observe(w, snapshot(polls=3, native={"num_retracted_requests_total": 9.0}))
    assert tracker.verdict() == "kv_capacity"
    tracker.observe(w + 5.0, snapshot(polls=4, native={"num_retracted_requests_total": 9.0}))
    assert tracker.verdict() == "healthy"
    # a new server, whose counter appears with its first retraction
    other = board.add("s:2")
    other.observe(0.0, snapshot(server="s:2"))
    other.observe(5.0, snapshot(server="s:2", polls=2,
                                native={"num_retracted_requests_total": 1.0}))
    assert other.verdict() == "kv_capacity"


def test_requests_received_and_finished_in_the_last_minute():
    tracker = StatusBoard(C, poll_interval=5.0).add("s:1")
    for i in range(20):  # 100 s: 1 request finished per poll, in flight grows by 1 every poll
        tracker.observe(i * 5.0, snapshot(polls=i + 1, running_requests=float(i),
                                          native={"num_requests_total": float(i)}))
    minute = tracker.signals()[1]["minute"]
    assert minute["window_seconds"] == 60.0
    assert minute["finished"] == 12.0
    assert minute["received"] == 24.0


# -- bounded memory ------------------------------------------------------------------------------
def test_history_is_fixed_size_whatever_the_uptime():
    tracker = StatusBoard(C, poll_interval=1.0).add("s:1")
    native = {"num_requests_total": 0.0, "time_to_first_token_seconds_sum": 0.0,
              "time_to_first_token_seconds_count": 0.0}
    snaps = [snapshot(polls=i, native=native) for i in range(8)]
    tracemalloc.start()
    try:
        for i in range(4 * 3600):  # four hours of 1 s polls
            tracker.observe(float(i), snaps[i % 8])
            if i == 2 * 3600:
                size_at_two_hours = tracker.nbytes()
                traced_at_two_hours = tracemalloc.get_traced_memory()[0]
        traced_at_four_hours = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert tracker.nbytes() == size_at_two_hours
    assert traced_at_four_hours - traced_at_two_hours < 4096
    assert tracker.nbytes() < 32 * 1024


# -- the page and the JSON -----------------------------------------------------------------------
@pytest.fixture
def glance():
    """(port, board, registry collects): the real WSGI app serving a board, on loopback."""
    board = StatusBoard(C, poll_interval=1.0)
    collects = []

    class Counting:
        def collect(self):
            collects.append(1)
            return iter(())

    registry = CollectorRegistry()
    registry.register(Counting())
    pages = GlancePages(board, "/metrics", ["http://127.0.0.1:1"])
    server = serve(make_app(Exposition(registry), "/metrics", ["http://127.0.0.1:1"], pages),
                   "127.0.0.1:0")
    yield server.server_address[1], board, collects
    server.shutdown()
    server.server_close()


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_markup_in_a_server_label_model_name_and_gpu_name_is_escaped_never_raw(glance):
    # Prepare
    port, board, _ = glance
    server = f"{MARKUP}:1"
    tracker = board.add(server)
    tracker.observe(0.0, snapshot(server=server, model_name=MARKUP))
    board.set_gpus(lambda: NvmlReading(True, [GpuReading(0, "GPU-x", name=MARKUP, values={
        "utilization_ratio": 0.5})]))
    # Act
    page = get(port, "/")[1].decode()
    raw_json = get(port, "/api/v1/status")[1].decode()
    # Check
    assert MARKUP not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # label, model, GPU
    assert "<script" not in page.replace('<script src="/glance.js', "")
    assert MARKUP not in raw_json
    assert "<" not in raw_json
    status = json.loads(raw_json)
    assert status["servers"][0]["server"] == server
    assert status["servers"][0]["model_name"] == MARKUP


def test_every_glance_answer_forbids_other_origins_inline_code_and_sniffing(glance):
    port, board, _ = glance
    board.add("s:1").observe(0.0, snapshot())
    assert "default-src 'self'" in CSP
    assert "unsafe" not in CSP
    assert "http" not in CSP
    for path, kind in (("/", "text/html"), ("/api/v1/status", "application/json"),
                       ("/glance.css", "text/css"), ("/glance.js", "text/javascript")):
        resp, body = get(port, path)
        assert resp.status == 200, path
        assert resp.getheader("Content-Type").startswith(kind), path
        assert resp.getheader("Content-Security-Policy") == CSP, path
        assert resp.getheader("X-Content-Type-Options") == "nosniff", path
        assert body
    page = get(port, "/")[1].decode()
    # every asset and link is this origin's; no inline script, style or event handler
    for url in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert url.startswith("/"), url
        assert not url.startswith("//"), url
    assert "<style" not in page
    assert " style=" not in page
    assert " on" not in re.sub(
        r">[^<]*<", "><", page)
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/glance.js?v=' +
                                                  re.search(r'glance\.js\?v=([^"]+)"',
                                                            page).group(1) + '" defer>']


def test_the_page_reads_without_javascript_and_keeps_the_landing_links_below(glance):
    port, board, _ = glance
    board.add("s:1").observe(0.0, snapshot(prefill_backlog_tokens=621_390.0,
                                           waiting_requests=3.0))
    page = get(port, "/")[1].decode()
    assert re.search(r'<noscript><meta http-equiv="refresh" content="\d+"></noscript>', page)
    assert "621,390 prompt tokens are waiting to be prefilled; new requests wait for their " \
           "first token" in page
    assert 'data-state="prefill_backlog"' in page
    first_server = page.index('class="server"')
    for link in ('href="/metrics"', 'href="/sd/sglang"', "<li>http://127.0.0.1:1</li>"):
        assert page.index(link) > first_server, link


def test_scrapes_never_compute_the_status_and_the_page_never_renders_the_exposition(glance):
    port, board, collects = glance
    tracker = board.add("s:1")
    tracker.observe(0.0, snapshot())
    calls = []
    signals = tracker.signals
    tracker.signals = lambda: calls.append(1) or signals()
    for _ in range(20):
        assert get(port, "/metrics")[0].status == 200
    assert calls == []
    rendered = len(collects)
    for path in ("/", "/api/v1/status"):
        get(port, path)
    assert calls == [1]  # one computation serves both within the cache's second
    assert len(collects) == rendered


def test_many_open_pages_cost_one_status_computation_per_cache_period():
    board = StatusBoard(C)
    tracker = board.add("s:1")
    tracker.observe(0.0, snapshot())
    calls = []
    signals = tracker.signals
    tracker.signals = lambda: calls.append(1) or signals()
    now = [100.0]
    pages = GlancePages(board, "/metrics", [], cache_seconds=1.0, clock=lambda: now[0])
    for _ in range(50):
        pages.answer("/api/v1/status")
        pages.answer("/")
    assert calls == [1]
    now[0] += 1.0
    pages.answer("/api/v1/status")
    assert calls == [1, 1]


def test_a_simulated_server_shows_its_numbers_but_no_launch_command_or_prompt():
    # Prepare, act: a 0.5.23 server (its /server_info has launch_command), polled in-process
    sc = scenarios.load("healthy")
    pages = polled_pages("healthy", 295)
    page = pages.answer("/")[2].decode()
    raw = pages.answer("/api/v1/status")[2].decode()
    # Check
    status = json.loads(raw)["servers"][0]
    assert status["state"] in ("healthy", "idle")
    assert status["baseline"]["prompt_tokens"] > 0
    assert status["baseline"]["cache_hit_ratio"] is not None
    assert status["pressure"]["max_running"] == sc.server.max_running_requests
    for text in (page, raw):
        assert "launch_server" not in text
        assert "--model-path" not in text
        assert "launch_command" not in text


def test_json_fields_are_documented():
    board = StatusBoard(C)
    board.add("s:1").observe(0.0, snapshot())
    for server, mode in (("p:1", "prefill"), ("d:1", "decode")):  # a pool of each role
        board.add(server).observe(0.0, replace(
            snapshot(server=server), config=ServerConfig(disaggregation_mode=mode),
            pd=PdLoad(mode, {queue: 1.0 for queue, _ in PD_QUEUES[mode]})))
    status = json.loads(status_json(board))
    doc = (ROOT / "docs" / "glance.md").read_text()
    names = set(status)
    assert len(status["pools"]) == 2
    for entry in (*status["servers"], *status["pools"]):
        for key, value in entry.items():  # a block's fields as block.field
            names |= ({f"{key}.{sub}" for sub in value} if isinstance(value, dict)
                      and key != "display" else {key})
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/glance.md does not describe: {missing}"


# -- the thresholds file ---------------------------------------------------------------------------
def test_a_thresholds_file_without_a_classification_number_is_refused(tmp_path):
    shipped = yaml.safe_load(default_thresholds_file().read_text())
    del shipped["classification"]["kv_occupancy_ratio"]
    bad = tmp_path / "thresholds.yml"
    bad.write_text(yaml.safe_dump(shipped))
    with pytest.raises(ThresholdsError, match="kv_occupancy_ratio"):
        load_classification(bad)
    with pytest.raises(SystemExit) as err:
        cli.parse_args(["--sglang.url", "http://127.0.0.1:1",
                        "--web.glance.thresholds-file", str(bad)])
    assert err.value.code == 2
    assert cli.parse_args(["--sglang.url", "http://127.0.0.1:1", "--no-web.glance",
                           "--web.glance.thresholds-file", str(bad)]).classification is None


def test_an_edited_thresholds_file_moves_the_verdict(tmp_path):
    shipped = yaml.safe_load(default_thresholds_file().read_text())
    shipped["classification"]["prefill_backlog_tokens"] = 1000
    edited = tmp_path / "thresholds.yml"
    edited.write_text(yaml.safe_dump(shipped))
    args = cli.parse_args(["--sglang.url", "http://127.0.0.1:1",
                           "--web.glance.thresholds-file", str(edited)])
    signals = Signals(**dict(BUSY, prefill_backlog=5000.0, waiting=1.0))
    assert classify(signals, args.classification) == "prefill_backlog"
    assert classify(signals, C) == "healthy"


def test_the_collector_exposition_is_unchanged_by_the_page_fields():
    # The poller's snapshot carries the page's counters; the exporter's series are as before.
    poller = TargetPoller("http://s:1", PollSettings())
    poller.snapshot = replace(snapshot(server="s:1"), native_values={"prompt_tokens_total": 5.0})
    registry = CollectorRegistry()
    registry.register(GuardedCollector([SGLangCollector([poller])]))
    names = {m.name for m in registry.collect()}
    assert not any("prompt" in n for n in names)


def test_a_failing_history_costs_neither_the_poll_nor_the_metrics(fake_sglang):
    # Prepare: a history that raises on every poll
    server = fake_sglang({"/metrics": Route(b"sglang:num_running_reqs 3.0\n")})
    changed = []

    def broken(t, snap):
        raise RuntimeError("bug")

    poller = TargetPoller(server.url, PollSettings(timeout=1.0), on_poll=broken,
                          on_change=lambda: changed.append(1))
    # Act
    first, second = poller.poll_once(), poller.poll_once()
    # Check
    assert first.up
    assert second.up
    assert changed == [1, 1]  # the exposition is still told of each new snapshot


def test_a_failing_status_answers_500_for_the_page_only(glance):
    port, board, _ = glance
    tracker = board.add("s:1")
    tracker.observe(0.0, snapshot())
    tracker.signals = lambda: 1 / 0
    assert get(port, "/")[0].status == 500
    assert get(port, "/api/v1/status")[0].status == 500
    assert get(port, "/metrics")[0].status == 200


def polled_pages(name: str, at: int) -> GlancePages:
    """The glance pages of scenario `name`'s server as SGLang 0.5.23, polled in-process every
    5 s up to `at` simulated seconds."""
    sim = Simulation(scenarios.load(name), "0.5.23")
    app = sim_app(sim, threading.Lock())
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("sglang:30000")
    poller = TargetPoller("http://sglang:30000", PollSettings(interval=5.0),
                          clock=lambda: sim.t, fetcher=in_process_fetcher(app, None, lambda: True),
                          on_poll=tracker.observe)
    for t in range(0, at + 1, 5):
        sim.advance(float(t))
        poller.poll_once()
    return GlancePages(board, "/metrics", ["http://sglang:30000"])


def polled_status(name: str, at: int) -> dict:
    """The server's part of /api/v1/status after polled_pages."""
    return json.loads(polled_pages(name, at).answer("/api/v1/status")[2].decode())["servers"][0]


@pytest.mark.parametrize(("name", "at", "cause"), [
    ("lora-churn", 600, "Every LoRA adapter slot is in use (4 of 4)"),
    ("priority-starvation", 800, "Priority scheduling: priority 0 holds"),
    ("scheduling-bottleneck", 600, None),
    ("grammar-compile-backlog", 700, "structured-output requests wait for their grammar"),
])
def test_the_glance_page_names_the_feature_that_holds_the_queue(name, at, cause):
    status = polled_status(name, at)
    # Check: the state, and the cause in its sentence (none where no feature holds the queue)
    assert status["state"] == ("healthy" if name == "grammar-compile-backlog"
                               else "scheduling_bottleneck")
    if cause is None:
        assert "LoRA" not in status["reason"]
        assert "Priority" not in status["reason"]
    else:
        assert cause in status["reason"], status["reason"]


@pytest.mark.parametrize(("name", "at", "said"), [
    ("spec-decoding-collapse", 800, "Speculative decoding yields"),
    ("hicache-host-drops", 900, "HiCache dropped"),
    ("healthy", 600, None),
])
def test_the_glance_page_names_the_feature_that_stopped_paying(name, at, said):
    status = polled_status(name, at)
    # Check: a healthy verdict whose sentence names the feature (none on the healthy scenario)
    assert status["state"] == "healthy"
    if said is None:
        assert "Speculative" not in status["reason"]
        assert "HiCache" not in status["reason"]
        assert status["features"]["hicache_dropped_ratio_last_minute"] is None
    else:
        assert said in status["reason"], (status["reason"], status["features"])


# -- energy --------------------------------------------------------------------------------------
def _gpus(joules: float, watts: float) -> NvmlReading:
    return NvmlReading(True, [GpuReading(i, f"GPU-{i}", name="H200", values={
        "energy_joules_total": joules / 2, "power_watts": watts / 2, "utilization_ratio": 0.5})
        for i in range(2)])


def test_energy_per_output_token_splits_the_minutes_energy_by_the_tokens_computed():
    """By hand: 2 GPUs at 600 W for the minute, 36,000 J; 3,000 prompt tokens of which 1,000
    cached, 1,000 output tokens: 36,000 / (2,000 + 1,000) = 12 J per output token, as the
    energy records compute it (decode's share of the energy over the output tokens)."""
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    joules = [1e6]
    board.set_gpus(lambda: _gpus(joules[0], 600.0))
    for i in range(13):  # 0 .. 60 s
        tracker.observe(i * 5.0, snapshot(polls=i + 1, native={
            "num_requests_total": float(i), "prompt_tokens_total": 250.0 * i,
            "cached_tokens_total": 1000.0 / 12 * i, "generation_tokens_total": 1000.0 / 12 * i}))
        joules[0] += 600.0 * 5.0
    srv = status_with_display(board)["servers"][0]
    assert srv["energy"]["power_watts"] == 600.0
    assert srv["energy"]["joules_per_output_token_last_minute"] == pytest.approx(12.0)
    text = srv["display"]["text"]
    assert (text["g.power"], text["g.energy_per_token"]) == ("600 W", "12 J")
    page = render_page(board, "/metrics", ["http://s:1"]).decode()
    assert "Energy per output token" in page
    assert "12 J" in page


def test_energy_needs_the_counter_and_gpus_known_to_be_the_servers():
    board = StatusBoard(C, poll_interval=5.0)
    one, two = board.add("s:1"), board.add("s:2")
    board.set_gpus(lambda: _gpus(1e6, 600.0))  # two servers, GPUs not attributed: unknown
    for t in (0.0, 60.0):
        for tracker in (one, two):
            tracker.observe(t, snapshot(polls=int(t) + 1, native={
                "generation_tokens_total": t, "prompt_tokens_total": t,
                "cached_tokens_total": 0.0}))
    for srv in status_with_display(board)["servers"]:
        assert srv["energy"]["joules_per_output_token_last_minute"] is None
        assert srv["display"]["text"]["g.energy_per_token"] == "—"


def test_a_simulated_servers_glance_energy_matches_its_gpus():
    """The simulator's healthy server through the real poller and NVML code: its GPUs' power,
    and J per output token within the range its power and token rate allow."""
    sim = Simulation(scenarios.load("healthy"), "0.5.23")
    app = sim_app(sim, threading.Lock())
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("sglang:30000")
    nvml = FeedNvml(lambda: [r.__dict__ for r in sim.gpu_readings()])
    sampler = GpuSampler(NvmlBackend(nvml))
    board.set_gpus(lambda: sampler.reading)
    poller = TargetPoller("http://sglang:30000", PollSettings(interval=5.0),
                          clock=lambda: sim.t, fetcher=in_process_fetcher(app, None, lambda: True),
                          on_poll=tracker.observe)
    for t in range(0, 601, 5):
        sim.advance(float(t))
        sampler.sample()
        poller.poll_once()
    e = status_with_display(board)["servers"][0]["energy"]
    watts = sum(g.values["power_watts"] for g in sampler.reading.gpus)
    assert e["power_watts"] == pytest.approx(watts)
    assert GPU_IDLE_POWER_W * 2 <= watts <= GPU_POWER_LIMIT_W * 2  # 2 GPUs
    assert e["output_tokens_last_minute"] > 0
    # At most the whole minute at the power limit over the output tokens, at least at idle
    # power over every token computed: a loose bracket, and a value that is there.
    per_token = e["joules_per_output_token_last_minute"]
    assert per_token is not None
    assert 0 < per_token < GPU_POWER_LIMIT_W * 2 * 65 / e["output_tokens_last_minute"]
