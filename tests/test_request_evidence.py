"""The closing evidence of issue 19, from the simulator's request records (read by the exporter's
parser and by analyze-requests) and from the recorded per-class p95 of a backfilled Prometheus:

- seed 000 (long-context-incident): TTFT of the 32k_128k class rises to tens of seconds during
  the prefill backlog and is fast before it; ge_128k, whose requests come after the bursts,
  stays fast. The incident has no request under 32K tokens (its sessions start at ~54K).
- healthy: one class (lt_8k), flat: every 5 minutes' TTFT p95 within a factor 3 and under 2 s.
- the incident with short chat traffic beside it (tests/fixtures/scenarios): under fcfs the
  short requests queue behind the chunked prefills about as long as the long ones (so "short
  ones do not wait" is not what a backlog looks like); what they lack is the long uncached
  prompts' own prefill (TTFT - queue).

`python tests/test_request_evidence.py` prints the numbers quoted in docs/request-records.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sglang_obs.exporter.request_records import Record, parse_record
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.profiles import profile
from sglang_obs.simulator.records import RecordFiles, RecordSink, line
from sglang_obs.simulator.simulation import Simulation
from sglang_obs.tools.analyze_requests import analyze

from conftest import ROOT

START = 1_764_400_000.0
WITH_CHAT = ROOT / "tests/fixtures/scenarios/long-context-incident-with-chat.yaml"


def simulate(name: str, directory: Path | None = None) -> list[Record]:
    """Every record the scenario's requests leave, as the exporter's parser reads them."""
    sc = scenarios.load(str(name))
    out: list[Record] = []
    targets = [lambda rec: out.append(parse_record(line(rec).encode()))]
    files = RecordFiles(directory) if directory else None
    if files:
        targets.append(files.write)
    sink = RecordSink(profile(sc.release), sc.server, START, sc.seed, targets)
    Simulation(sc, start_ts=START, on_request=sink).advance(sc.duration)
    if files:
        files.close()
    assert all(isinstance(r, Record) for r in out)
    return out


def p95(values) -> float:
    values = sorted(values)
    return values[math.floor(0.95 * (len(values) - 1))]


def arrived(records, cls, start, end):
    """Records of class `cls` received in [start, end) seconds of the scenario."""
    return [r for r in records if r.prompt_class == cls
            and start <= r.received_at - START < end]


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    d = tmp_path_factory.mktemp("incident")
    return simulate("long-context-incident", d), d


@pytest.fixture(scope="module")
def healthy():
    return simulate("healthy")


@pytest.fixture(scope="module")
def with_chat():
    return simulate(WITH_CHAT)


def incident_numbers(records) -> dict:
    backlog = next(t for t in scenarios.load("long-context-incident").truth
                   if t.cls == "prefill_backlog")
    return {
        "before": p95(r.ttft_seconds for r in arrived(records, "32k_128k", 0, 140)),
        "backlog": p95(r.ttft_seconds for r in arrived(records, "32k_128k", 150,
                                                       backlog.end + 15)),
        "ge_128k": p95(r.ttft_seconds for r in records if r.prompt_class == "ge_128k"),
        "classes": sorted({r.prompt_class for r in records}),
    }


def test_the_incident_shows_ttft_rising_for_long_context_only_during_the_backlog(incident):
    records, _ = incident
    n = incident_numbers(records)
    assert n["classes"] == ["32k_128k", "ge_128k"]  # no request under 32K tokens at all
    assert n["before"] < 2.0
    assert n["backlog"] > 30.0
    assert n["ge_128k"] < 3.0  # sessions past 128K arrive after the bursts


def test_analyze_requests_on_the_simulator_files_shows_the_same(incident):
    _, d = incident
    doc = analyze([str(d)]).document()
    c = doc["classes"]
    assert c["32k_128k"]["ttft_p95_seconds"] > 30.0
    assert c["32k_128k"]["ttft_p50_seconds"] < 2.0  # the rest of the hour is fast
    assert c["ge_128k"]["ttft_p95_seconds"] < 3.0
    assert c["lt_8k"]["requests"] == c["8k_32k"]["requests"] == 0
    slowest = doc["slowest"][0]
    assert slowest["prompt_class"] == "32k_128k"
    assert slowest["queue_seconds"] > 20.0
    assert slowest["prefill_seconds"] > 10.0


def healthy_windows(records) -> list[float]:
    return [p95(r.ttft_seconds for r in arrived(records, "lt_8k", t, t + 300))
            for t in range(0, 1800, 300)]


def test_the_healthy_scenario_is_flat(healthy):
    assert {r.prompt_class for r in healthy} == {"lt_8k"}
    windows = healthy_windows(healthy)
    assert max(windows) < 2.0
    assert max(windows) / min(windows) < 3.0


def chat_numbers(records) -> dict:
    short = arrived(records, "lt_8k", 150, 240)
    long = arrived(records, "32k_128k", 150, 240)
    uncached = [r for r in long if r.cached_tokens < 0.5 * r.prompt_tokens]
    return {
        "short_queue_p95": p95(r.queue_seconds for r in short),
        "long_queue_p95": p95(r.queue_seconds for r in long),
        "short_prefill_p95": p95(r.prefill_seconds for r in short),
        "uncached_prefill_min": min(r.prefill_seconds for r in uncached),
        "short_ttft_p95": p95(r.ttft_seconds for r in short),
        "long_ttft_p95": p95(r.ttft_seconds for r in long),
    }


def test_short_requests_queue_behind_the_backlog_but_do_not_pay_its_prefill(with_chat):
    n = chat_numbers(with_chat)
    assert n["short_queue_p95"] > 0.5 * n["long_queue_p95"] > 10.0  # everyone queues (fcfs)
    assert n["short_prefill_p95"] < 3.0  # ...but a short prompt's own prefill stays small
    assert n["uncached_prefill_min"] > 10.0  # the long uncached ones' does not


@pytest.mark.slow  # backfilled Prometheus TSDBs (the incident's is shared with the dashboards)
def test_the_recorded_p95_per_class_shows_it_too(backfilled):
    from helpers import query_range

    rule = "instance_model_prompt_class:sglang_obs_request_ttft_seconds:p95_5m"
    peaks = {}
    for name in ("long-context-incident", "healthy"):
        b, url = backfilled(name, release="0.5.23")
        series = query_range(url, rule, b.start, b.end, step=60)
        peaks[name] = {s["metric"]["prompt_class"]: max(float(v) for _, v in s["values"])
                       for s in series}
    assert set(peaks["long-context-incident"]) == {"32k_128k", "ge_128k"}
    assert peaks["long-context-incident"]["32k_128k"] > 30.0
    assert peaks["long-context-incident"]["ge_128k"] < 5.0
    assert set(peaks["healthy"]) == {"lt_8k"}
    assert peaks["healthy"]["lt_8k"] < 2.5


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        inc = simulate("long-context-incident", Path(tmp))
        print("incident:", incident_numbers(inc))
        print("analyze-requests:", {k: (v["requests"], v["ttft_p50_seconds"],
                                        v["ttft_p95_seconds"])
                                    for k, v in analyze([tmp]).document()["classes"].items()})
    print("healthy 5-min TTFT p95:", [round(w, 2) for w in healthy_windows(simulate("healthy"))])
    print("with chat:", chat_numbers(simulate(WITH_CHAT)))
