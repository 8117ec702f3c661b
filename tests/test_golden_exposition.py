"""The exporter's whole exposition for a fixed set of recorded servers, diffed against a
committed golden file (update it with `pytest --update-golden`, and review the diff)."""

import itertools
import re

from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.catalogue import GPUS, METRICS
from sglang_obs.exporter.collector import (
    ContainerCollector,
    GuardedCollector,
    LogCollector,
    RequestCollector,
    SGLangCollector,
    model_of,
)
from sglang_obs.exporter.containers import ContainerSource
from sglang_obs.exporter.log_follow import FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.request_follow import RequestRecordDir
from sglang_obs.exporter.request_records import RequestStats
from sglang_obs.exporter.status import StatusBoard, load_classification
from sglang_obs.exporter.status_page import status_with_display

from conftest import ROOT
from fake_docker import FakeContainer, FakeDocker
from fake_sglang import Route, json_route, text_route
from helpers import assert_matches_golden, free_port

GOLDEN = ROOT / "tests" / "fixtures" / "exporter_golden.prom"
# Wall-clock and timing values change every run.
NONDETERMINISTIC = re.compile(
    r"^sglang_obs_(last_poll_success_timestamp_seconds|poll_duration_seconds|"
    r"collector_duration_seconds|log_ready_timestamp_seconds|"
    r"log_last_line_timestamp_seconds)\{"  # log times are local: they depend on TZ
)
LOG_FIXTURE = ROOT / "tests/fixtures/sglang/scheduler_0.5.12_tp4.log"
PD_DECODE = ROOT / "conformance/goldens/0.5.12/pd-decode"
RECORDS_FIXTURE = ROOT / "tests/fixtures/sglang/request_metrics_mixed.log"

SERVERS = {
    # 0.5.23 with DP attention: /v1/loads, /server_info
    "sglang-dp2:30000": {
        "/metrics": text_route("metrics_0.5.23_dp2.prom"),
        "/v1/loads": json_route("v1_loads_0.5.23_dp2.json"),
        "/server_info": json_route("server_info_0.5.23_dp2.json"),
        "/v1/models": json_route("v1_models_qwen3.json"),
    },
    # 0.5.23 answering an OpenMetrics scraper with underscores
    "sglang-underscores:30000": {
        "/metrics": text_route(
            "metrics_0.5.23_tp4_underscores.txt",
            content_type=(
                (ROOT / "tests/fixtures/sglang/metrics_0.5.23_tp4_underscores.content-type")
                .read_text().strip())),
        "/v1/loads": json_route("v1_loads_0.5.23.json"),
        "/server_info": json_route("server_info_0.5.12_seed.json"),
    },
    # 0.5.5: /get_load and /get_server_info only
    "sglang-055:30000": {
        "/metrics": text_route("metrics_0.5.5.prom"),
        "/get_load": json_route("get_load_0.5.5.json"),
        "/get_server_info": json_route("server_info_0.5.5.json"),
    },
    # 0.4.6: no load endpoint at all
    "sglang-046:30000": {
        "/metrics": text_route("metrics_0.4.6.prom"),
        "/get_server_info": json_route("server_info_0.4.6.json"),
    },
    # Something posing as SGLang: a junk line, values outside their domain, a config of wrong
    # types and unknown values, a model path with a token in a directory name
    "sglang-hostile:30000": {
        "/metrics": Route(
            b"# TYPE sglang:num_running_reqs gauge\n"
            b'sglang:num_running_reqs{model_name="m",tp_rank="0"} -3.0\n'
            b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
            b'sglang:kv_used_tokens{model_name="m",tp_rank="0"} 100.0\n'
            b'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} +Inf\n'
            b'sglang:gen_throughput{model_name="m",tp_rank="0"} lots\n'
            # a counter the glance page shows as "—" (glance_values_hidden_total)
            b'sglang:prompt_tokens_total{model_name="m",tp_rank="0"} 1e308\n'),
        "/server_info": Route(
            b'{"version": "0.5.23 build=x", "served_model_name": null, '
            b'"model_path": "/srv/hf_0123456789abcdef/Llama-3.1-8B", "tp_size": 1, '
            b'"dp_size": 1' + b"0" * 400 + b', "schedule_policy": "mine", '
            b'"kv_cache_dtype": "fp8_e4m3", "internal_states": 5}',
            content_type="application/json"),
    },
    # A PD decode server of 0.5.12 (SGLang's own answers): its role and its PD queues
    "sglang-pd-decode:30000": {
        "/metrics": Route((PD_DECODE / "metrics.prom").read_bytes()),
        "/v1/loads": Route((PD_DECODE / "v1_loads.json").read_bytes(),
                           content_type="application/json"),
        "/server_info": Route((PD_DECODE / "server_info.json").read_bytes(),
                              content_type="application/json"),
    },
}


def render(fake_sglang, tmp_path):
    text = generate_latest(registry_of(fake_sglang, tmp_path)).decode()
    return "".join(
        line + "\n" for line in text.splitlines() if not NONDETERMINISTIC.match(line)
    )


def registry_of(fake_sglang, tmp_path) -> CollectorRegistry:
    """The exporter's collectors over SERVERS, each polled three times."""
    pollers = []
    # The glance page's model, fed by the pollers as the exporter's CLI wires it; its page is
    # computed once after the polls (what it hides is exported).
    board = StatusBoard(load_classification(), wall_clock=lambda: 1e9)
    for label, routes in SERVERS.items():
        server = fake_sglang(routes)
        # A fake clock makes queue-run durations exact: each poll cycle reads it twice.
        clock = itertools.count(1000.0, 1.0).__next__
        tracker = board.add(label)
        poller = TargetPoller(server.url, PollSettings(timeout=2.0), clock=clock,
                              on_poll=tracker.observe)
        poller.server = label
        pollers.append(poller)
    dead = TargetPoller(f"http://127.0.0.1:{free_port()}", PollSettings(timeout=1.0))
    dead.server = "sglang-dead:30000"
    pollers.append(dead)
    # The scheduler log of the 0.5.5 server (it has no backlog of its own), read from the start.
    stats = LogStats()
    follower = FileFollower(str(tmp_path / "sglang.log"), stats, server="sglang-055:30000")
    follower.poll()  # not there yet: once it appears it is read from its first line
    (tmp_path / "sglang.log").write_bytes(LOG_FIXTURE.read_bytes())
    follower.poll()
    pollers[2].log_stats = stats
    sglang = FakeContainer("sglang-055")
    sglang.attrs["State"]["Health"] = {"Status": "healthy"}
    docker = FakeDocker(sglang)
    containers = ContainerSource(docker, {"sglang-055": "sglang-055:30000"})
    containers.poll()
    sglang.restart_after(137, oom=True)
    containers.poll()
    for _ in range(3):
        for poller in pollers:
            poller.poll_once()
    # The request records of the DP2 server: a file that appears after start is read whole.
    (tmp_path / "records").mkdir()
    records = RequestRecordDir(str(tmp_path / "records"), RequestStats(),
                               server="sglang-dp2:30000")
    records.poll()
    (tmp_path / "records/sglang-request-metrics-20261129_11.log").write_bytes(
        RECORDS_FIXTURE.read_bytes())
    # A next hour that is a link out of the directory: refused unopened, counted.
    (tmp_path / "records/sglang-request-metrics-20261129_12.log").symlink_to(
        tmp_path / "sglang.log")
    records.poll()
    registry = CollectorRegistry()
    status_with_display(board)
    registry.register(GuardedCollector([SGLangCollector(pollers, board), LogCollector([follower]),
                                        RequestCollector([records], model_of(pollers)),
                                        ContainerCollector(containers)]))
    return registry


def test_exposition_matches_golden_file(fake_sglang, request, tmp_path):
    assert_matches_golden(request, GOLDEN, render(fake_sglang, tmp_path), "exposition")


def test_golden_file_has_every_catalogued_metric_and_nothing_else():
    # TYPE lines name counters with or without _total, depending on the prometheus_client release.
    typed = set(re.findall(r"^# TYPE (\S+)", GOLDEN.read_text(), re.M))
    # GPU series have their own golden file (test_nvml.py, an 8-GPU H200 machine).
    assert {n.removesuffix("_total") for n in typed} == {
        spec.name.removesuffix("_total") for spec in METRICS if spec.group != GPUS}
