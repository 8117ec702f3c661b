"""The shipped scrape config, run by a real Prometheus: SGLang's series land as sglang:* whatever
spelling the server used, and derived series join them on (instance, model_name)."""

import re
import threading

import pytest
from prometheus_client import CollectorRegistry

from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.web import Exposition, make_app, serve

from conftest import ROOT
from fake_sglang import Route
from helpers import running_prometheus, wait_query

UNDERSCORE_METRICS = (
    b"# HELP sglang:num_running_reqs The number of running requests.\n"
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang_num_running_reqs{model_name="m",tp_rank="0",pp_rank="0"} 12.0\n'
    b'sglang_num_queue_reqs{model_name="m",tp_rank="0",pp_rank="0"} 4.0\n'
    b'sglang_max_total_num_tokens{model_name="m",tp_rank="0",pp_rank="0"} 1000.0\n'
    b'sglang_max_total_num_tokens{model_name="m",tp_rank="1",pp_rank="0"} 1000.0\n'
    b'sglang_num_used_tokens{model_name="m",tp_rank="0",pp_rank="0"} 250.0\n'
    b"# EOF\n"
)


@pytest.mark.slow  # a real Prometheus scraping until the series are there
def test_shipped_scrape_config_normalises_spelling_and_joins_derived_with_native(
    fake_sglang, tmp_path
):
    # Prepare: a fake SGLang answering with underscores, and the exporter serving on loopback.
    sglang = fake_sglang({"/metrics": Route(
        UNDERSCORE_METRICS,
        content_type="application/openmetrics-text; version=1.0.0; charset=utf-8; "
                     "escaping=underscores")})
    registry = CollectorRegistry()
    exposition = Exposition(registry)
    poller = TargetPoller(sglang.url, PollSettings(interval=0.2, timeout=1.0),
                          on_change=exposition.changed)
    registry.register(GuardedCollector([SGLangCollector([poller])]))
    server = serve(make_app(exposition, "/metrics", [sglang.url]), "127.0.0.1:0")
    stop = threading.Event()
    poller.start(stop)
    exporter_address = f"127.0.0.1:{server.server_address[1]}"
    config = (ROOT / "prometheus" / "prometheus.yml").read_text()
    config = config.replace("exporter:9840", exporter_address)
    config = re.sub(r"scrape_interval: \d+s", "scrape_interval: 1s", config)
    config = re.sub(r"refresh_interval: \d+s", "refresh_interval: 1s", config)
    try:
        with running_prometheus(config, tmp_path) as prom:
            # Act
            native = wait_query(prom, 'sglang:num_running_reqs{job="sglang"}')
            joined = wait_query(
                prom,
                "sglang_obs_kv_used_tokens * on (instance, model_name) group_left "
                "max by (instance, model_name) (sglang:num_running_reqs)",
            )
            health = wait_query(prom, 'sglang_obs_up{job="sglang-obs"}')
    finally:
        stop.set()
        server.shutdown()
    # Check
    instance = f"127.0.0.1:{sglang.port}"
    assert [r["metric"]["instance"] for r in native] == [instance]
    assert [float(r["value"][1]) for r in joined] == [250.0 * 12.0]
    assert joined[0]["metric"]["instance"] == instance
    assert [float(r["value"][1]) for r in health] == [1.0]
    assert health[0]["metric"]["instance"] == instance
