"""The exporter against SGLang's own answers: conformance/goldens/<release>/<variant>/ were
written by SGLang's collectors, /metrics app and JSON builders (conformance/generate.py); here
the exporter reads every one of them. The expected numbers are the driver's traffic, worked out
by hand: 40 requests finished, prompts 1200 + 97 i and completions 180 + 11 i tokens
(i = 0..39), 16 running and 3 waiting on a 412,000-token KV pool holding 171,000."""

from __future__ import annotations

import json

import pytest

from sglang_obs.exporter.sglang_api import parse_loads, parse_server_info
from sglang_obs.exporter.sglang_exposition import parse_exposition

from conftest import ROOT

GOLDENS = ROOT / "conformance" / "goldens"
RELEASES = sorted(p.name for p in GOLDENS.iterdir() if p.is_dir())
CASES = sorted((r, v.name) for r in RELEASES for v in (GOLDENS / r).iterdir() if v.is_dir())
PROMPT_TOKENS = 123_660  # sum of 1200 + 97 i, i < 40: 48,000 + 97 * 780
GENERATION_TOKENS = 15_780  # sum of 180 + 11 i: 7,200 + 11 * 780
REQUESTS = 40


def _manifest(release: str, variant: str) -> dict:
    return json.loads((GOLDENS / release / variant / "manifest.json").read_text())


def test_goldens_cover_at_least_four_releases_each_with_a_default_server():
    assert len(RELEASES) >= 4, RELEASES
    for release in RELEASES:
        m = _manifest(release, "default")
        assert m["release"] == release
        assert m["generator_version"] >= 1 and m["prometheus_client"]
        assert set(m["families_exposed"]) <= set(m["families_defined"]), release


@pytest.mark.parametrize(("release", "variant"), CASES)
def test_the_exporter_reads_the_metrics_answer(release, variant):
    folder = GOLDENS / release / variant
    m = _manifest(release, variant)
    got = parse_exposition((folder / "metrics.prom").read_text(), m["text_content_type"])
    assert got.malformed_lines == 0 and got.lines_over_limit == 0
    assert got.model_name == "Qwen/Qwen3-8B"
    # Scheduler gauges of rank 0 only (TP copies are maxed, not summed).
    assert got.get("num_running_reqs") == 16
    assert got.get("num_queue_reqs") == 3
    used = got.get("kv_used_tokens") or got.get("num_used_tokens")
    assert used == 171_000
    assert got.get("token_usage") == pytest.approx(171_000 / 412_000)
    assert got.get("gen_throughput") == 1480
    # Tokenizer counters summed over their label sets (is_streaming, cache_source).
    assert got.get("num_requests_total") == REQUESTS
    assert got.get("prompt_tokens_total") == PROMPT_TOKENS
    assert got.get("generation_tokens_total") == GENERATION_TOKENS
    assert got.get("e2e_request_latency_seconds_count") == REQUESTS


@pytest.mark.parametrize("release", RELEASES)
def test_the_openmetrics_answer_reads_the_same(release):
    folder = GOLDENS / release / "default"
    content_type = (folder / "metrics.openmetrics.content-type").read_text().strip()
    om = parse_exposition((folder / "metrics.openmetrics.txt").read_text(), content_type)
    text = parse_exposition((folder / "metrics.prom").read_text(),
                            _manifest(release, "default")["text_content_type"])
    assert om.malformed_lines == 0
    assert om.values == text.values
    if "escaping=underscores" in content_type:
        assert om.spelling == "underscore"


@pytest.mark.parametrize("release", RELEASES)
def test_the_exporter_reads_server_info_and_loads(release):
    folder = GOLDENS / release / "default"
    info = parse_server_info(json.loads((folder / "server_info.json").read_text()))
    assert info.bad_fields == ()
    assert (info.version, info.model_name, info.tp_size) == (release, "Qwen/Qwen3-8B", 2)
    assert info.max_total_num_tokens == 412_000
    for name in ("v1_loads.json", "get_load.json"):
        if (folder / name).exists():
            load = parse_loads(json.loads((folder / name).read_text()))
            assert load.bad_fields == ()
            assert (load.running, load.waiting, load.used_tokens) == (16, 3, 171_000)
