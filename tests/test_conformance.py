"""The exporter against SGLang's own answers: conformance/goldens/<release>/<variant>/ were
written by SGLang's collectors, /metrics app and JSON builders (conformance/generate.py); here
the exporter reads every one of them. The expected numbers are the driver's traffic, worked out
by hand: 40 requests finished, prompts 1200 + 97 i and completions 180 + 11 i tokens
(i = 0..39), 16 running and 3 waiting on a 412,000-token KV pool holding 171,000."""

from __future__ import annotations

import json

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.sglang_api import parse_loads, parse_server_info
from sglang_obs.exporter.sglang_exposition import parse_exposition
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.exposition import SimCollector
from sglang_obs.simulator.profiles import RELEASES as SIM_RELEASES
from sglang_obs.simulator.simulation import Simulation

from conftest import ROOT
from helpers import family_shapes

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
        assert m["generator_version"] >= 1
        assert m["prometheus_client"]
        assert set(m["families_exposed"]) <= set(m["families_defined"]), release


@pytest.mark.parametrize(("release", "variant"), CASES)
def test_the_exporter_reads_the_metrics_answer(release, variant):
    folder = GOLDENS / release / variant
    m = _manifest(release, variant)
    got = parse_exposition((folder / "metrics.prom").read_text(), m["text_content_type"])
    assert got.malformed_lines == 0
    assert got.lines_over_limit == 0
    assert got.model_name == "Qwen/Qwen3-8B"
    # Scheduler gauges of rank 0 only (TP copies are maxed, not summed).
    assert got.get("num_running_reqs") == 16
    assert got.get("num_queue_reqs") == 3
    used = got.get("kv_used_tokens") or got.get("num_used_tokens")
    assert used == 171_000
    # Releases before 0.5 round the usage to two places in the report.
    assert got.get("token_usage") == pytest.approx(171_000 / 412_000, abs=0.005)
    # A PD prefill server of 0.4.6 and 0.5.5 logs prefill reports only (no decode
    # throughput), and 0.5.5 finishes each of its requests after one generated token.
    prefill = variant == "pd-prefill" and release in ("0.4.6.post5", "0.5.5")
    assert got.get("gen_throughput") == (0.0 if prefill else 1480)
    one_token = variant == "pd-prefill" and release == "0.5.5"
    # Tokenizer counters summed over their label sets (is_streaming, cache_source).
    assert got.get("num_requests_total") == REQUESTS
    assert got.get("prompt_tokens_total") == PROMPT_TOKENS
    assert got.get("generation_tokens_total") == (REQUESTS if one_token else GENERATION_TOKENS)
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
            assert (load.running, load.waiting) == (16, 3)
            # /get_load's num_tokens counts the waiting prompts too: no used-token count.
            assert load.used_tokens == (171_000 if name == "v1_loads.json" else None)


# -- the simulator against the goldens ---------------------------------------------------------
ALLOWED = yaml.safe_load((ROOT / "conformance" / "simulator-differences.yml").read_text()) or {}


def simulator_answer(release: str) -> str:
    """The simulator's /metrics as that release, 10 minutes into a scenario that retracts (the
    goldens' traffic retracted once, and SGLang creates the retraction counters lazily)."""
    sim = Simulation(scenarios.load("kv-exhaustion"), release=release)
    sim.advance(600)
    registry = CollectorRegistry()
    registry.register(SimCollector(lambda: sim.server, sim.profile))
    return generate_latest(registry).decode()


def differences(release: str) -> dict[str, str]:
    golden = family_shapes((GOLDENS / release / "default" / "metrics.prom").read_text())
    simulated = family_shapes(simulator_answer(release))
    out = {}
    for name in sorted(set(golden) | set(simulated)):
        if name not in simulated:
            out[name] = "missing from the simulator"
        elif name not in golden:
            out[name] = "not exposed by the release"
        elif golden[name] != simulated[name]:
            kinds = [k for k, a, b in zip(("type", "labels", "buckets"), golden[name],
                                          simulated[name], strict=True) if a != b]
            out[name] = f"different {', '.join(kinds)}"
    return out


@pytest.mark.parametrize("release", [r for r in RELEASES if r in SIM_RELEASES])
def test_the_simulator_exposes_what_the_release_exposes(release):
    """Same families, types, label names and bucket bounds as the release's own collectors on a
    default-flags server; every difference is listed with its reason."""
    found = differences(release)
    allowed = (ALLOWED.get("metrics") or {}).get(release) or {}
    unexplained = {k: v for k, v in found.items() if k not in allowed}
    assert unexplained == {}, "explain in conformance/simulator-differences.yml or fix"
    stale = sorted(set(allowed) - set(found))
    assert stale == [], f"listed but no longer different: {stale}"
    assert all(isinstance(v, str) and len(v) > 20 for v in allowed.values())


def test_every_simulated_release_has_goldens():
    assert set(SIM_RELEASES) <= set(RELEASES)


# -- panels that stay empty on a supported release say so --------------------------------------
def test_every_panel_without_data_on_a_supported_release_says_so():
    """A default-flags server of a supported release that leaves a panel query without data
    (docs/compatibility.md's cells) is named in that panel's description, with what it lacks."""
    from sglang_obs.core.settings import default
    from sglang_obs.generate.products import conformance_goldens
    from sglang_obs.render import compatibility as c

    s = default()
    goldens = conformance_goldens(s)
    rules = [p.read_text() for p in sorted(s.rules_dir.glob("*.yml"))]
    records = c.recording_rules(rules)
    known = set().union(*(g.defined for g in goldens.values()))
    checked = 0
    for path in sorted(s.dashboards_dir.glob("*.json")):
        for panel in c.panels(json.loads(path.read_text())):
            for target in panel.get("targets", []):
                for release in RELEASES:
                    lacking = c.missing(target.get("expr", ""), goldens[(release, "default")]
                                        .exposed, records, known)
                    if lacking is None:
                        continue
                    checked += 1
                    text = panel.get("description", "")
                    assert release in text, (path.name, panel["title"], release)
                    for name in lacking:
                        assert f"`{name.removeprefix('sglang:')}`" in text
    assert checked >= 20  # the older releases lack the KV-pool, retraction and stage families


def test_the_queue_total_and_each_prioritys_queue_are_read_apart():
    """--enable-priority-scheduling: the scheduler writes each queue's total under priority=""
    beside one series per priority; the total is the queue, the others are kept apart."""
    native = parse_exposition((GOLDENS / "0.5.23" / "priority" / "metrics.prom").read_text())
    assert native.values["num_queue_reqs"] == 3
    assert native.values["num_running_reqs"] == 16
    assert native.by_priority["num_queue_reqs"] == {"0": 2.0, "1": 1.0}
    assert native.by_priority["num_running_reqs"] == {"0": 12.0, "1": 4.0}
    default = parse_exposition((GOLDENS / "0.5.23" / "default" / "metrics.prom").read_text())
    assert default.by_priority == {}
