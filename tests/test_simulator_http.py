"""The simulator over real HTTP on loopback: SGLang's exposition per release, both spellings,
the status endpoints, a crash that refuses connections, and a real Prometheus scraping it."""

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.exporter.gpu_feed import FeedNvml, FeedTimeout, RealGpuPresent, real_gpu_count
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.xid import XidWatcher
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.server import SimServer
from sglang_obs.simulator.simulation import Simulation

from conftest import ROOT
from helpers import running_prometheus, wait_query

OM = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
def sim_server():
    servers = []

    def start(scenario="healthy", release=None, advance=120.0, **kw):
        sim = Simulation(scenarios.load(scenario), release, start_ts=time.time() - advance)
        sim.advance(advance)
        server = SimServer(sim, "127.0.0.1", 0, speed=kw.pop("speed", 0.0), **kw)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def get(server, path, accept=None):
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}",
                                     headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()


def samples(text):
    return {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize(
    ("release", "present", "absent", "rank_labels"),
    [
        ("0.4.6.post5",
         ["sglang:num_grammar_queue_reqs", "sglang:num_prefill_infight_queue_reqs"],
         # avg_request_queue_latency: 0.4.6.post5 defines it and never sets it (its golden)
         ["sglang:avg_request_queue_latency", "sglang:max_total_num_tokens",
          "sglang:queue_time_seconds_count",
          "sglang:realtime_tokens_total"], set()),
        ("0.5.5", ["sglang:queue_time_seconds_count", "sglang:num_retracted_reqs"],
         ["sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:context_len"],
         {"tp_rank", "pp_rank"}),
        ("0.5.23", ["sglang:max_total_num_tokens", "sglang:kv_used_tokens",
                    "sglang:request_time_per_output_token_seconds_count",
                    "sglang:prefill_effective_tokens_total"],
         ["sglang:avg_request_queue_latency", "sglang:num_prefill_prealloc_queue_reqs"],
         {"tp_rank", "pp_rank", "moe_ep_rank"}),
    ],
)
def test_each_release_profile_exposes_its_own_names_and_labels(
    sim_server, release, present, absent, rank_labels
):
    server = sim_server("healthy", release)
    content_type, text = get(server, "/metrics")
    parsed = samples(text)  # prometheus_client's parser accepts it
    assert content_type.startswith("text/plain")
    for name in present:
        assert name in parsed, name
    for name in absent:
        assert name not in parsed, name
    running = parsed["sglang:num_running_reqs"]
    assert set(running.labels) == {"model_name", "engine_type"} | rank_labels
    ttft = next(s for s in text_string_to_metric_families(text)
                if s.name == "sglang:time_to_first_token_seconds")
    assert {s.labels.get("is_streaming") for s in ttft.samples} == (
        {"true", "false"} if release == "0.5.23" else {None})


def test_constants_repeat_on_every_tp_rank_but_load_only_on_rank_0(sim_server):
    server = sim_server("long-context-incident", "0.5.23")
    families = {f.name: f for f in text_string_to_metric_families(get(server, "/metrics")[1])}
    assert sorted(s.labels["tp_rank"] for s in families["sglang:max_total_num_tokens"].samples) \
        == ["0", "1", "2", "3"]
    assert [s.labels["tp_rank"] for s in families["sglang:num_running_reqs"].samples] == ["0"]


def test_openmetrics_scraper_gets_underscores_unless_colon_mode(sim_server):
    negotiating = sim_server("healthy", "0.5.23")
    content_type, text = get(negotiating, "/metrics", OM)
    assert "escaping=underscores" in content_type
    assert re.search(r"^sglang_num_running_reqs\{", text, re.M)
    assert re.search(r"^# TYPE sglang:num_running_reqs gauge", text, re.M)
    old_client = sim_server("healthy", "0.5.23", metrics_escaping="colon")
    _, text = get(old_client, "/metrics", OM)
    assert re.search(r"^sglang:num_running_reqs\{", text, re.M)


@pytest.mark.parametrize(("release", "routes", "missing"), [
    ("0.4.6.post5", ["/get_server_info", "/v1/models", "/health", "/health_generate"],
     ["/server_info", "/v1/loads", "/get_load", "/ready"]),
    ("0.5.5", ["/get_load", "/get_server_info"], ["/server_info", "/v1/loads", "/ready"]),
    ("0.5.12", ["/get_load", "/v1/loads", "/server_info"], ["/ready"]),
    ("0.5.23", ["/v1/loads", "/server_info", "/get_server_info", "/ready"], ["/get_load"]),
])
def test_status_endpoints_exist_exactly_in_their_releases(sim_server, release, routes, missing):
    server = sim_server("healthy", release)
    for path in routes:
        get(server, path)
    for path in missing:
        with pytest.raises(urllib.error.HTTPError) as err:
            get(server, path)
        assert err.value.code == 404


@pytest.mark.parametrize("release", ["0.4.6.post5", "0.5.5", "0.5.12", "0.5.23"])
def test_the_exporter_reads_every_release_of_the_simulator(sim_server, release):
    server = sim_server("long-context-incident", release, advance=200.0)
    poller = TargetPoller(f"http://127.0.0.1:{server.port}", PollSettings(timeout=2.0))
    snap = poller.poll_once()
    assert snap.up
    assert snap.native_spelling == "colon"
    assert snap.scheduler_metrics_present
    assert snap.config.version == release
    assert snap.derived.kv_capacity_tokens == 2_300_000
    assert snap.derived.waiting_requests == 4  # t=200 s is inside the prefill backlog
    if release in ("0.5.12", "0.5.23"):
        assert snap.derived.prefill_backlog_tokens > 300_000
        assert snap.derived.max_running_requests == 44
    assert sum(snap.errors.values()) == 0


@pytest.mark.slow  # waits out a crash and the restart
def test_crash_refuses_connections_then_the_server_comes_back(sim_server):
    # crash-restart crashes at 600 s for 90 s; serve it at 100x so this takes a second.
    sim = Simulation(scenarios.load("crash-restart"), start_ts=time.time())
    sim.advance(590.0)
    server = SimServer(sim, "127.0.0.1", 0, speed=100.0, tick_seconds=0.02)
    port = None
    try:
        server.start()
        port = server.port
        seen = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and seen != {"up", "refused", "back"}:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                seen.add("back" if "refused" in seen else "up")
            except urllib.error.URLError as err:
                if isinstance(err.reason, ConnectionRefusedError):
                    seen.add("refused")
            except ConnectionError:  # a request caught by the crash itself
                pass
            time.sleep(0.02)
        assert seen == {"up", "refused", "back"}
        assert server.port == port
    finally:
        server.stop()


def test_gpu_feed_only_when_asked_and_fake_nvml_refuses_a_real_gpu(sim_server):
    plain = sim_server("slow-gpu")
    with pytest.raises(urllib.error.HTTPError):
        get(plain, "/sim/gpu")
    feed = sim_server("slow-gpu", gpu_feed=True, advance=800.0)
    readings = json.loads(get(feed, "/sim/gpu")[1])
    assert len(readings) == 2
    assert readings[0]["thermal_throttle"] is True  # the scenario throttles from 600 s

    class RealNvml:  # a host where NVML answers with one GPU
        def nvmlInit(self):
            pass

        def nvmlDeviceGetCount(self):
            return 1

        def nvmlShutdown(self):
            pass

    class NoNvml:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    url = f"http://127.0.0.1:{feed.port}/sim/gpu"
    assert real_gpu_count(RealNvml()) == 1
    with pytest.raises(RealGpuPresent):
        FeedNvml.from_feed(url, pynvml_module=RealNvml())
    nvml = FeedNvml.from_feed(url, pynvml_module=NoNvml())
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) != 0
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used > 0.8 * nvml.nvmlDeviceGetMemoryInfo(
        handle).total  # preallocated: "full" even when it is not load
    events = nvml.nvmlEventSetCreate()
    delivered = []
    with contextlib.suppress(FeedTimeout):
        while True:
            event = nvml.nvmlEventSetWait(events, 0)
            delivered.append((event.device, event.eventData))
    assert delivered == [(1, 79)]  # once: the next wait times out like NVML's

    # The exporter's own Xid watcher, unchanged, books the feed's event on its GPU.
    stop = threading.Event()
    watcher = XidWatcher(nvml, wait_ms=50)
    watcher.start(stop)
    try:
        deadline = time.monotonic() + 5
        while not watcher.snapshot()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    assert watcher.snapshot()[0] == {("1", nvml.nvmlDeviceGetUUID(1), "79"): 1}


@pytest.mark.slow  # a real Prometheus scraping four simulated servers
def test_a_real_prometheus_scrapes_every_release_profile(sim_server, tmp_path):
    """Prometheus 2.42 asks for OpenMetrics, so it gets sglang_ names; the shipped sglang job's
    relabelling turns them back into sglang: for every release."""
    servers = {release: sim_server("healthy", release, speed=1.0)
               for release in ("0.4.6.post5", "0.5.5", "0.5.23")}
    shipped = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "sglang")
    job = {"job_name": "sglang", "metric_relabel_configs": job["metric_relabel_configs"],
           "static_configs": [{"targets": [f"127.0.0.1:{s.port}" for s in servers.values()]}]}
    config = yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]})
    query = 'count by (instance) ({__name__=~"sglang:.+"})'
    with running_prometheus(config, tmp_path) as prom:
        deadline = time.monotonic() + 20
        result = wait_query(prom, query)
        while len(result) < len(servers) and time.monotonic() < deadline:
            time.sleep(0.5)
            result = wait_query(prom, query)
        escaped = wait_query(prom, 'count({__name__=~"sglang_.+"})', timeout=0)
        up = wait_query(prom, "up")
    assert {r["metric"]["instance"] for r in result} == {
        f"127.0.0.1:{s.port}" for s in servers.values()}
    assert all(float(r["value"][1]) > 20 for r in result)
    assert escaped == []
    assert all(r["value"][1] == "1" for r in up)
