"""Whatever a server (or something posing as one) answers, the exporter keeps serving and says
what went wrong in its own metrics."""

import time

import pytest
from prometheus_client import generate_latest

from sglang_obs.exporter.poller import PollSettings

from fake_sglang import Route
from helpers import free_port

GOOD_METRICS = (
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'
    b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n'
)
SETTINGS = PollSettings(timeout=0.5, max_response_bytes=64 * 1024)


def errors(registry, server, endpoint, reason):
    return registry.get_sample_value(
        "sglang_obs_poll_errors_total",
        {"server": server, "endpoint": endpoint, "reason": reason},
    )


def poll_and_render(registry, poller):
    poller.poll_once()
    text = generate_latest(registry).decode()  # must render, whatever was polled
    assert "sglang_obs_up" in text
    return text


def test_should_report_connection_refused_when_nothing_listens(make_registry):
    registry, [poller] = make_registry(f"http://127.0.0.1:{free_port()}", settings=SETTINGS)
    poll_and_render(registry, poller)
    assert registry.get_sample_value("sglang_obs_up", {"server": poller.server}) == 0.0
    assert errors(registry, poller.server, "metrics", "connection_refused") == 1.0
    # An unreachable server is not asked for the load endpoint too (that would double the wait).
    assert errors(registry, poller.server, "loads", "connection_refused") is None


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        (Route(b"boom", status=500), "http_status"),
        (Route(b"unavailable", status=503), "http_status"),
        (Route(b"# TYPE x gauge\nx{a=\"1\" 1.0\n"), "parse"),  # malformed
        (Route(GOOD_METRICS[:-25]), "parse"),  # truncated mid-sample
        (Route(b"<html><body><h1>Welcome to nginx!</h1></body></html>",
               content_type="text/html"), "parse"),
        (Route(b"\x00\xff\xfe garbage \x01" * 100), "parse"),
        (Route(b""), "parse"),  # empty body
        (Route(b"a" * (128 * 1024)), "too_large"),  # over the cap, honest length
        (Route(b"a" * (128 * 1024), declared_length=-1), "too_large"),  # no length given
        (Route(GOOD_METRICS, delay_seconds=1.5), "timeout"),  # slow to answer
        (Route(GOOD_METRICS * 20, drip_seconds=0.02), "timeout"),  # answers, but drips
        (Route(b"# EOF\n", content_type="application/openmetrics-text; version=1.0.0"),
         "parse"),
    ],
    ids=["500", "503", "malformed", "truncated", "html", "binary", "empty", "huge",
         "huge-unannounced", "slow", "drip", "openmetrics-empty"],
)
def test_should_count_hostile_metrics_answer_and_keep_serving(
    fake_sglang, make_registry, route, reason
):
    # Prepare
    server = fake_sglang({"/metrics": route})
    registry, [poller] = make_registry(server.url, settings=SETTINGS)
    # Act
    started = time.monotonic()
    poll_and_render(registry, poller)
    elapsed = time.monotonic() - started
    # Check
    assert errors(registry, poller.server, "metrics", reason) == 1.0
    assert registry.get_sample_value("sglang_obs_up", {"server": poller.server}) == 0.0
    assert registry.get_sample_value("sglang_obs_kv_occupancy_ratio",
                                     {"server": poller.server, "model_name": "m"}) is None
    assert elapsed < 3 * SETTINGS.timeout + 1.0, "one poll must respect the deadlines"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2, 3]", b'{"loads": "x"}', b"[" * 30_000 + b"]" * 30_000,
     b'{"load": "many"}', b"\xff\xfe"],
    ids=["invalid", "wrong-shape", "loads-not-list", "deep-nesting", "old-shape-bad", "bad-utf8"],
)
def test_should_count_bad_load_json_as_parse_error_and_still_use_metrics(
    fake_sglang, make_registry, body
):
    server = fake_sglang({
        "/metrics": Route(GOOD_METRICS),
        "/v1/loads": Route(body, content_type="application/json"),
    })
    registry, [poller] = make_registry(server.url, settings=SETTINGS)
    poll_and_render(registry, poller)
    labels = {"server": poller.server, "model_name": "m"}
    assert errors(registry, poller.server, "loads", "parse") == 1.0
    assert registry.get_sample_value("sglang_obs_up", {"server": poller.server}) == 1.0
    assert registry.get_sample_value("sglang_obs_running_requests", labels) == 3.0


def test_should_keep_last_config_and_count_bad_server_info(fake_sglang, make_registry):
    server = fake_sglang({
        "/metrics": Route(GOOD_METRICS),
        "/server_info": Route(b'{"version": "0.5.23", "tp_size": 4, "served_model_name": "m"}',
                              content_type="application/json"),
    })
    settings = PollSettings(timeout=0.5, server_info_interval=0.001)
    registry, [poller] = make_registry(server.url, settings=settings)
    poll_and_render(registry, poller)
    server.routes["/server_info"] = Route(b"<html>oops</html>", content_type="text/html")
    time.sleep(0.01)
    poll_and_render(registry, poller)
    assert errors(registry, poller.server, "server_info", "parse") == 1.0
    assert registry.get_sample_value(
        "sglang_obs_config_tp_size", {"server": poller.server, "model_name": "m"}) == 4.0


def test_metrics_disabled_is_visible_as_http_errors_while_load_endpoint_keeps_server_up(
    fake_sglang, make_registry
):
    # SGLang without --enable-metrics: /metrics is 404 but the API answers.
    server = fake_sglang({
        "/v1/loads": Route(b'{"loads": [{"dp_rank": 0, "num_running_reqs": 2, '
                           b'"num_waiting_reqs": 0}]}', content_type="application/json"),
    })
    registry, [poller] = make_registry(server.url, settings=SETTINGS)
    poll_and_render(registry, poller)
    assert registry.get_sample_value("sglang_obs_up", {"server": poller.server}) == 1.0
    assert errors(registry, poller.server, "metrics", "http_status") == 1.0
    assert registry.get_sample_value(
        "sglang_obs_running_requests", {"server": poller.server, "model_name": ""}) == 2.0
