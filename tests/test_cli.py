"""The console script as a user runs it: a real process, real HTTP on loopback."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_sglang import Route
from helpers import free_port, stop_process, wait_for

EXPORTER = str(Path(sys.executable).parent / "sglang-exporter")
METRICS = (
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 7.0\n'
    b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
)
LOADS = (b'{"loads": [{"dp_rank": 0, "num_running_reqs": 7, "num_waiting_reqs": 2, '
         b'"num_waiting_uncached_tokens": 9000, "num_used_tokens": 1000, '
         b'"max_total_num_tokens": 4000, "max_running_requests": 28}]}')


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def run_exporter():
    procs = []

    def start(*args, env=None):
        proc = subprocess.Popen([EXPORTER, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_process(proc)


def wait_serving(port, proc):
    def ready():
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            return scrape(port)
        except (urllib.error.URLError, ConnectionError):
            return None

    samples = wait_for(ready, 10)
    assert samples is not None, "exporter did not start serving"
    return samples


def test_should_flip_up_to_0_within_two_poll_intervals_when_sglang_dies_and_keep_serving(
    fake_sglang, run_exporter
):
    # Prepare
    server = fake_sglang({"/metrics": Route(METRICS),
                          "/v1/loads": Route(LOADS, content_type="application/json")})
    port = free_port()
    interval = 0.5
    proc = run_exporter("--sglang.url", server.url, "--web.listen-address", f"127.0.0.1:{port}",
                        "--sglang.poll-interval", f"{int(interval * 1000)}ms")
    wait_serving(port, proc)
    target = f"127.0.0.1:{server.port}"
    samples = wait_for(lambda: (s := scrape(port)) and
                       value(s, "sglang_obs_up", server=target) == 1.0 and s, 5)
    assert value(samples, "sglang_obs_prefill_backlog_tokens", server=target,
                 model_name="m") == 9000.0
    assert value(samples, "sglang_obs_kv_occupancy_ratio", server=target, model_name="m") == 0.25
    assert value(samples, "sglang_obs_running_requests_ratio", server=target,
                 model_name="m") == 0.25
    # Act
    server.stop()
    killed_at = time.monotonic()
    down = wait_for(lambda: value(scrape(port), "sglang_obs_up", server=target) == 0.0, 5)
    flipped_after = time.monotonic() - killed_at
    # Check
    assert down
    assert flipped_after <= 2 * interval, f"took {flipped_after:.2f}s"
    samples = scrape(port)
    assert proc.poll() is None
    # Later polls find nothing listening, and say so.
    assert wait_for(lambda: value(scrape(port), "sglang_obs_poll_errors_total", server=target,
                                  endpoint="metrics", reason="connection_refused"), 3)
    assert value(samples, "sglang_obs_kv_occupancy_ratio", server=target, model_name="m") is None


def test_should_serve_landing_page_and_404_elsewhere(fake_sglang, run_exporter):
    server = fake_sglang({"/metrics": Route(METRICS)})
    port = free_port()
    proc = run_exporter("--web.listen-address", f"127.0.0.1:{port}",
                        env={"SGLANG_OBS_SGLANG_URL": server.url})
    wait_serving(port, proc)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
        page = resp.read().decode()
    assert 'href="/metrics"' in page
    assert server.url in page
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
    assert err.value.code == 404


def test_help_explains_every_flag_and_its_env_variable():
    out = subprocess.run([EXPORTER, "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"^  (--[a-z.-]+)", out, re.M)) - {"--help", "--version"}
    assert {"--web.listen-address", "--sglang.url", "--sglang.poll-interval", "--log.level",
            ["--collector.sglang", " --no-collector.sglang"][0]} <= flags
    for flag in flags:
        env = "SGLANG_OBS_" + re.sub(r"[.-]", "_", flag.lstrip("-")).upper()
        assert env in out.replace("\n", " ").replace("  ", ""), f"{flag}: env not documented"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "at least one --sglang.url"),
        (["--sglang.url", "localhost:30000"], {}, "not an http(s) URL"),
        (["--sglang.url", "http://a:1", "--sglang.poll-interval", "0s"], {}, "positive duration"),
        (["--sglang.url", "http://a:1", "--web.listen-address", "nonsense"], {}, "[host]:port"),
        (["--sglang.url", "http://a:1", "--sglang.url", "http://a:1/"], {}, "given twice"),
        (["--sglang.url", "http://a:1"], {"SGLANG_OBS_SGLANG_TIMEOUT": "soon"},
         "SGLANG_OBS_SGLANG_TIMEOUT"),
        (["--sglang.url", "http://a:1"], {"SGLANG_OBS_COLLECTOR_SGLANG": "maybe"}, "boolean"),
    ],
)
def test_bad_configuration_exits_2_with_a_clear_message(args, env, message):
    result = subprocess.run([EXPORTER, *args], capture_output=True, text=True, timeout=10,
                            env={**os.environ, **env})
    assert result.returncode == 2
    assert message in result.stderr


def test_port_in_use_exits_1_with_a_clear_message():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [EXPORTER, "--sglang.url", "http://127.0.0.1:1", "--web.listen-address",
             f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=10)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


@pytest.mark.slow  # waits through ten GPU sampling cycles
def test_without_a_gpu_the_exporter_serves_sglang_and_says_once_that_gpus_are_off(
    fake_sglang, run_exporter
):
    server = fake_sglang({"/metrics": Route(METRICS)})
    port = free_port()
    proc = run_exporter("--sglang.url", server.url, "--web.listen-address", f"127.0.0.1:{port}",
                        "--collector.nvml.interval", "100ms", "--no-collector.docker")
    wait_serving(port, proc)
    target = f"127.0.0.1:{server.port}"
    assert wait_for(lambda: value(scrape(port), "sglang_obs_up", server=target) == 1.0, 5)
    time.sleep(1.0)  # ten GPU sampling cycles
    samples = scrape(port)
    assert value(samples, "sglang_obs_gpu_collector_up") == 0.0
    assert value(samples, "sglang_obs_collector_success", collector="nvml") == 1.0
    assert not [k for k in samples if k[0] == "sglang_obs_gpu_utilization_ratio"]
    proc.terminate()
    output = proc.communicate(timeout=5)[0].decode()
    assert output.count("GPU collector down") == 1, output


@pytest.mark.slow  # a simulated server and the exporter reading its GPU feed
def test_demo_gpu_feed_shows_the_scenarios_throttle_and_xid(run_exporter):
    from sglang_obs.simulator import scenario as scenarios
    from sglang_obs.simulator.server import SimServer
    from sglang_obs.simulator.simulation import Simulation

    sim = Simulation(scenarios.load("slow-gpu"), start_ts=time.time() - 800)
    sim.advance(800.0)  # throttled since 600 s, Xid 79 on GPU 1 at 700 s
    server = SimServer(sim, "127.0.0.1", 0, speed=0.0, gpu_feed=True)
    server.start()
    try:
        port = free_port()
        proc = run_exporter(
            "--sglang.url", f"http://127.0.0.1:{server.port}", "--web.listen-address",
            f"127.0.0.1:{port}", "--no-collector.docker", "--collector.nvml.interval", "200ms",
            "--collector.nvml.simulator-feed", f"http://127.0.0.1:{server.port}/sim/gpu")
        wait_serving(port, proc)
        uuid = "GPU-5151a000-0000-4000-8000-000000000001"
        # The Xid arrives through the exporter's own watcher thread, like a real NVML event.
        samples = wait_for(lambda: (s := scrape(port)) and
                           value(s, "sglang_obs_gpu_collector_up") == 1.0 and
                           value(s, "sglang_obs_gpu_xid_errors_total", gpu="1", uuid=uuid,
                                 xid="79") is not None and s, 5)
        assert value(samples, "sglang_obs_gpu_device_count") == 2
        assert value(samples, "sglang_obs_gpu_clock_event_active", gpu="1", uuid=uuid,
                     reason="hw_thermal") == 1.0
        assert value(samples, "sglang_obs_gpu_xid_errors_total", gpu="1", uuid=uuid,
                     xid="79") == 1.0
        assert value(samples, "sglang_obs_gpu_memory_used_bytes", gpu="1", uuid=uuid) > 0.8 * \
            value(samples, "sglang_obs_gpu_memory_total_bytes", gpu="1", uuid=uuid)
    finally:
        server.stop()
