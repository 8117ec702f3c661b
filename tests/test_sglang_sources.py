"""Readers of SGLang's answers, against recorded answers of several releases
(tests/fixtures/sglang, with the values a correct reader must find in expected.yaml)."""

import json

import pytest
import yaml

from sglang_obs.exporter.derived import derive
from sglang_obs.exporter.sglang_api import (
    PayloadError,
    parse_loads,
    parse_models_context_length,
    parse_server_info,
)
from sglang_obs.exporter.sglang_exposition import ExpositionError, parse_exposition

from fake_sglang import FIXTURES

EXPECTED = yaml.safe_load((FIXTURES / "expected.yaml").read_text())
METRICS_FILES = sorted(n for n in EXPECTED if n.startswith("metrics_"))


def read_exposition(name):
    content_type = EXPECTED[name].get("content_type", "text/plain; version=0.0.4")
    return parse_exposition((FIXTURES / name).read_text(), content_type)


@pytest.mark.parametrize("name", METRICS_FILES)
def test_exposition_aggregates_across_ranks_like_the_reference_says(name):
    expected = EXPECTED[name]
    native = read_exposition(name)
    kv_used = native.get("kv_used_tokens")
    if kv_used is None:
        kv_used = native.get("num_used_tokens")
    assert native.model_name == expected["model_name"]
    assert native.get("num_running_reqs") == expected["running"]
    assert native.get("num_queue_reqs") == expected["queue"]
    assert kv_used == expected["kv_used_tokens"]
    assert native.get("max_total_num_tokens") == expected["kv_capacity_tokens"]
    assert native.get("token_usage") == expected["token_usage"]
    assert native.get("gen_throughput") == pytest.approx(expected["gen_throughput"])
    assert native.get("num_retracted_reqs") == expected["retracted"]
    assert native.get("num_paused_reqs") == expected["paused"]
    assert native.get("context_len") == expected["context_len"]
    assert native.has_scheduler_series


@pytest.mark.parametrize(
    ("name", "spelling"),
    [("metrics_0.5.23_tp4.prom", "colon"), ("metrics_0.5.23_tp4_underscores.txt", "underscore")],
)
def test_both_spellings_give_the_same_numbers(name, spelling):
    native = read_exposition(name)
    assert native.spelling == spelling
    assert native.values == read_exposition("metrics_0.5.23_tp4.prom").values


def test_truncated_openmetrics_body_is_an_error_not_partial_data():
    name = "metrics_0.5.23_tp4_underscores.txt"
    text = (FIXTURES / name).read_text()
    cut = text[: text.index("sglang_num_queue_reqs")]
    with pytest.raises(ExpositionError, match="EOF"):
        parse_exposition(cut, EXPECTED[name]["content_type"])


def test_old_release_names_are_read_under_their_current_name():
    text = (
        "# TYPE sglang:total_retracted_reqs gauge\n"
        'sglang:total_retracted_reqs{model_name="m",tp_rank="0"} 4.0\n'
        'sglang:num_prefill_infight_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
        'sglang:num_prefill_prealloc_queue_reqs{model_name="m",tp_rank="0"} 1.0\n'
    )
    native = parse_exposition(text)
    assert native.get("num_retracted_reqs") == 4.0
    assert native.get("num_prefill_inflight_queue_reqs") == 2.0
    assert native.get("num_prefill_bootstrap_queue_reqs") == 1.0


def test_exposition_without_sglang_series_is_readable_but_has_no_scheduler_series():
    native = parse_exposition("# TYPE python_info gauge\npython_info{version=\"3\"} 1.0\n")
    assert native.spelling == "none"
    assert not native.has_scheduler_series


def load_json(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", ["get_load_0.5.5.json", "get_load_0.5.15.json",
                                  "v1_loads_0.5.23.json", "v1_loads_0.5.23_dp2.json",
                                  "get_load_0.4.7.json"])
def test_loads_of_every_shape_sum_over_dp_ranks(name):
    expected = EXPECTED[name]
    load = parse_loads(load_json(name))
    assert load.running == expected["running"]
    assert load.waiting == expected["queue"]
    assert load.max_running_requests == expected.get("max_running_requests")
    assert load.capacity_tokens == expected.get("kv_capacity_tokens")
    assert load.used_tokens == expected.get("kv_used_tokens")
    backlog = expected.get("num_waiting_uncached_tokens", expected.get("num_pending_tokens"))
    assert load.prefill_backlog_tokens == backlog


def test_pending_tokens_of_0_5_12_to_0_5_20_count_as_backlog_when_uncached_is_absent():
    payload = load_json("get_load_0.5.15.json")
    for entry in payload:
        entry.pop("num_waiting_uncached_tokens", None)
    assert parse_loads(payload).prefill_backlog_tokens == 38000


@pytest.mark.parametrize("name", ["server_info_0.4.6.json", "server_info_0.5.5.json",
                                  "server_info_0.5.12_seed.json", "server_info_0.5.23_dp2.json"])
def test_server_info_of_every_release_gives_the_effective_configuration(name):
    expected = EXPECTED[name]
    cfg = parse_server_info(load_json(name))
    assert cfg.version == str(expected["version"])
    assert cfg.model_name == expected["served_model_name"]
    assert cfg.tp_size == expected["tp_size"]
    assert cfg.dp_size == expected["dp_size"]
    assert cfg.max_total_num_tokens == expected["kv_capacity_tokens"]
    assert cfg.chunked_prefill_size == expected["chunked_prefill_size"]
    assert cfg.max_prefill_tokens == expected["max_prefill_tokens"]
    assert cfg.context_length == expected["context_length_cli"]
    assert cfg.schedule_policy == expected["schedule_policy"]
    assert cfg.kv_cache_dtype == expected["kv_cache_dtype"]
    assert cfg.speculative_algorithm == (expected["speculative_algorithm"] or "")
    assert cfg.mixed_chunk == expected["enable_mixed_chunk"]
    effective = expected["effective_max_running_requests"]
    if effective is None and expected["max_running_requests_cli"] is not None:
        effective = expected["max_running_requests_cli"]  # before 0.5.8: the CLI value
    assert cfg.max_running_requests == effective


def test_seed_000_config_shows_speculative_decoding_turned_mixed_chunk_off():
    cfg = parse_server_info(load_json("server_info_0.5.12_seed.json"))
    assert cfg.speculative_algorithm == "NEXTN"
    assert cfg.mixed_chunk is False
    assert cfg.max_running_requests == 44


@pytest.mark.parametrize("payload", [None, 3, "x", [], {"foo": 1}, {"loads": []},
                                     {"loads": [1, 2]}, {"load": None}])
def test_loads_reader_rejects_payloads_of_no_release(payload):
    with pytest.raises(PayloadError):
        parse_loads(payload)


@pytest.mark.parametrize("payload", [None, [], "x", {"foo": 1}])
def test_server_info_reader_rejects_payloads_of_no_release(payload):
    with pytest.raises(PayloadError):
        parse_server_info(payload)


def test_server_info_with_wrong_types_yields_unknowns_not_errors():
    cfg = parse_server_info({"version": {"x": 1}, "tp_size": "four", "dp_size": True,
                             "max_running_requests": None, "internal_states": "nope",
                             "chunked_prefill_size": float("nan")})
    assert cfg.version == ""
    assert cfg.tp_size is None
    assert cfg.dp_size is None
    assert cfg.max_running_requests is None
    assert cfg.chunked_prefill_size is None


def test_models_context_length_skips_lora_adapters():
    payload = {"object": "list", "data": [
        {"id": "adapter", "parent": "base", "max_model_len": None},
        {"id": "base", "parent": None, "max_model_len": 262144},
    ]}
    assert parse_models_context_length(payload) == 262144


def test_derive_prefers_live_load_and_falls_back_to_config_for_capacity():
    native = read_exposition("metrics_0.5.5.prom")  # no max_total_num_tokens before 0.5.6
    cfg = parse_server_info(load_json("server_info_0.5.5.json"))
    load = parse_loads(load_json("get_load_0.5.5.json"))
    derived = derive(native, load, cfg)
    assert derived.kv_capacity_tokens == 500000  # from server_info
    assert derived.kv_used_tokens == 187342  # from /metrics (this /get_load has no used tokens)
    assert derived.kv_occupancy_ratio == pytest.approx(187342 / 500000)
    assert derived.running_requests == 12
    assert derived.max_running_requests == 64
    assert derived.running_requests_ratio == pytest.approx(12 / 64)
    assert derived.decode_speed_per_request == pytest.approx(389.7 / 12)
    assert derived.prefill_backlog_tokens is None  # this release cannot say


def test_derive_dp2_sums_ranks_and_uses_effective_limits():
    native = read_exposition("metrics_0.5.23_dp2.prom")
    cfg = parse_server_info(load_json("server_info_0.5.23_dp2.json"))
    load = parse_loads(load_json("v1_loads_0.5.23_dp2.json"))
    derived = derive(native, load, cfg)
    assert derived.running_requests == 16
    assert derived.waiting_requests == 3
    assert derived.max_running_requests == 96
    assert derived.kv_occupancy_ratio == pytest.approx(80000 / 400000)
    assert derived.prefill_backlog_tokens == 20000
    assert derived.context_length_tokens == 262144
