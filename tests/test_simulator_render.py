"""`sglang-sim render`: series a real Prometheus backfills and promtool tests accept; the CLI."""

import io
import logging
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from sglang_obs.exporter.http_fetch import METRICS_ACCEPT
from sglang_obs.simulator import docs
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.exposition import SimCollector
from sglang_obs.simulator.render import render
from sglang_obs.simulator.server import make_app
from sglang_obs.simulator.simulation import Simulation

from conftest import ROOT, require_binary
from helpers import running_prometheus, wait_query

SIM = str(Path(sys.executable).parent / "sglang-sim")


def run_sim(*args, timeout=120):
    return subprocess.run([SIM, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def rendered_incident(tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    result = run_sim("render", "--scenario", "long-context-incident", "--out", str(out),
                     "--format", "openmetrics,promtool,log")
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow  # `rendered_incident` runs `sglang-sim render` (about 12 s)
def test_promtool_backfills_the_openmetrics_and_prometheus_serves_it(rendered_incident,
                                                                      tmp_path):
    promtool = require_binary("promtool")
    data = tmp_path / "data"
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics",
         str(rendered_incident / "long-context-incident.om.txt"), str(data)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    (tmp_path / "data").mkdir(exist_ok=True)
    with running_prometheus(config, tmp_path) as prom:
        peak = wait_query(prom, "max_over_time(sglang_obs_prefill_backlog_tokens[1h])")
        queueing = wait_query(prom, "max_over_time(sglang_obs_queue_nonempty_duration_seconds[1h])")
        native = wait_query(prom, 'max_over_time(sglang:num_queue_reqs{job="sglang"}[1h])')
    assert 300_000 <= float(peak[0]["value"][1]) <= 650_000
    assert 60 <= float(queueing[0]["value"][1]) <= 120
    assert 3 <= float(native[0]["value"][1]) <= 9


@pytest.mark.slow
def test_promtool_accepts_the_rendered_input_series(rendered_incident, tmp_path):
    promtool = require_binary("promtool")
    doc = yaml.safe_load((rendered_incident / "long-context-incident.promtool.yml").read_text())
    assert doc["interval"] == "15s"
    step = 15
    # Expected values straight from the rendered series: the backlog peak sample.
    backlog = next(s for s in doc["input_series"]
                   if s["series"].startswith("sglang_obs_prefill_backlog_tokens{"))
    values = backlog["values"].split()
    peak_index = max(range(len(values)),
                     key=lambda i: float(values[i]) if values[i] != "_" else -1)
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": doc["interval"],
            "input_series": doc["input_series"],
            "promql_expr_test": [{
                "expr": "max(sglang_obs_prefill_backlog_tokens)",
                "eval_time": f"{peak_index * step}s",
                "exp_samples": [{"labels": "{}", "value": float(values[peak_index])}],
            }],
        }],
    }
    path = tmp_path / "incident_test.yml"
    path.write_text(yaml.safe_dump(test, width=1_000_000))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_render_writes_scheduler_log_lines_of_the_release(rendered_incident):
    lines = (rendered_incident / "long-context-incident.log").read_text().splitlines()
    prefill = [ln for ln in lines if "Prefill batch" in ln]
    assert prefill
    assert all(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Prefill batch, #new-seq: ", ln)
               for ln in prefill)
    assert all("#pending-token: " in ln for ln in prefill)  # 0.5.12 has it


def test_list_names_every_shipped_scenario():
    result = run_sim("list")
    assert result.returncode == 0
    for name in ("healthy", "idle-preallocated", "long-context-incident",
                 "long-context-incident-tuned", "kv-exhaustion", "decode-contention",
                 "scheduling-bottleneck", "crash-restart", "slow-gpu"):
        assert re.search(rf"^{re.escape(name)}\s", result.stdout, re.M), name


@pytest.mark.parametrize(("args", "message"), [
    (["--scenario", "no-such-thing"], "no scenario 'no-such-thing'"),
    (["render", "--scenario", "healthy"], "--out"),
    (["render", "--scenario", "healthy", "--out", "/tmp/x", "--format", "pdf"], "--format"),
    (["render", "--scenario", "healthy", "--out", "/tmp/x", "--step", "0s"], "positive"),
    (["--release", "9.9"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_clear_message(args, message):
    result = run_sim(*args, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.slow  # renders every calibration: tens of seconds (make check < 2 min)
def test_generated_blocks_of_docs_simulator_md_are_fresh():
    doc = ROOT / "docs" / "simulator.md"
    current = doc.read_text()
    assert docs.render(current, doc) == current, "docs/simulator.md is stale: run make generate"


def test_every_model_parameter_is_documented():
    assert "| `server.max_running_requests` | `44` |" in (ROOT / "docs/simulator.md").read_text()


def test_a_render_leaves_the_pollers_log_level_as_it_found_it():
    # Renders run in the same process as live pollers (the tests, the detection table):
    # quieting the simulated crashes must not silence the real ones.
    poller_log = logging.getLogger("sglang_obs.exporter.poller")
    poller_log.setLevel(logging.DEBUG)
    try:
        render(scenarios.load("healthy"), step=300.0, poll_interval=60.0)
        assert poller_log.level == logging.DEBUG
    finally:
        poller_log.setLevel(logging.NOTSET)


@pytest.mark.parametrize("name", scenarios.available())
def test_the_served_metrics_text_is_prometheus_clients_own(name):
    """The simulator writes /metrics without prometheus_client's encoder (simulator/plain_text):
    byte for byte generate_latest's, through each shipped scenario."""
    sc = scenarios.load(name)
    sim = Simulation(sc)
    app = make_app(sim, threading.Lock())
    registry = CollectorRegistry()
    registry.register(SimCollector(lambda: sim.server, sim.profile))
    checked, headers = 0, {}
    for t in (0.0, sc.duration / 3, sc.duration * 2 / 3, sc.duration):
        sim.advance(t)
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
                   "HTTP_ACCEPT": METRICS_ACCEPT, "wsgi.input": io.BytesIO()}
        headers.clear()
        body = b"".join(app(environ, lambda status, h: headers.update(h)))
        assert headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
        assert body == generate_latest(registry), (name, t)
        checked += body.count(b"\n")
    assert checked > 0 or not sim.up, name
