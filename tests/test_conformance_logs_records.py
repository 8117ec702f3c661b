"""The scheduler log lines and per-request records SGLang's own code wrote
(conformance/goldens/<release>/<variant>/scheduler.log and request_records.log, from the
release's stats-logging functions and its FileRequestMetricsExporter: conformance/drivers/):
the exporter reads every line to the hand-checked numbers, and the simulator writes the same
bytes for the same numbers, or the difference is listed with its reason in
conformance/simulator-differences.yml.

The numbers are the drivers' (conformance/drivers/common.py): a prefill batch of 3 new
requests, 9,100 new and 1,536 cached tokens, and a decode interval of 14,800 tokens in 10 s
(1480 token/s), on a 412,000-token pool holding 171,000 (usage 0.42), 16 running and 3 waiting;
EAGLE accepting 2,700 tokens in 1,000 forwards (2.70) with 1,710 correct drafts of 3,000; PD
queues of 2 bootstrapping, 3 in flight, 2 preallocating and 1 transferring, 20,600 tokens
preallocated (0.05). 0.5.5 logs what its real Scheduler object holds instead (its driver feeds
metrics and logs from one object): 6,900 new and 3,100 cached tokens, 59,200 tokens in 40 s,
3,200 preallocated tokens (0.01)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
import yaml

from sglang_obs.exporter.request_records import parse_record
from sglang_obs.exporter.sglang_log import parse_line
from sglang_obs.simulator import logs as sim_logs
from sglang_obs.simulator.events import DecodeBatch, PrefillBatch

from conftest import ROOT

GOLDENS = ROOT / "conformance" / "goldens"
RELEASES = sorted(p.name for p in GOLDENS.iterdir() if p.is_dir())
LOG_CASES = sorted((r, v.name) for r in RELEASES for v in (GOLDENS / r).iterdir()
                   if (v / "scheduler.log").exists())
RECORD_CASES = sorted((r, v.name) for r in RELEASES for v in (GOLDENS / r).iterdir()
                      if (v / "request_records.log").exists())
ALLOWED = yaml.safe_load((ROOT / "conformance" / "simulator-differences.yml").read_text()) or {}
PROMPT_MARKER = "CONFORMANCE-PROMPT-9c1e"  # in every golden prompt
AT_LEAST_0_5_12 = ("0.5.12", "0.5.23")


def expected_lines(release: str, variant: str) -> list[tuple[str, dict]]:
    """(kind, fields) of each line the release's stats rank logs, worked out by hand."""
    new_token, cached = (6900, 3100) if release == "0.5.5" else (9100, 1536)
    prefill = {"new_seq": 3, "new_token": new_token, "cached_token": cached,
               "token_usage": 0.42, "running_req": 16, "queue_req": 3}
    if release in AT_LEAST_0_5_12:
        prefill |= {"pending_token": 0, "cuda_graph": False, "input_throughput": 910.0}
    decode = {"running_req": 16, "num_token": 171_000, "token_usage": 0.42,
              "cuda_graph": True, "gen_throughput": 1480.0, "queue_req": 3}
    if variant == "spec":
        decode["accept_len"] = 2.7
        if release != "0.4.6.post5":
            # 0.5.5: accepted / (forwards x (steps + 1)) = 2700 / 4000; later: correct drafts
            # / (forwards x (draft tokens - 1)) = 1710 / 3000
            decode["accept_rate"] = 0.68 if release == "0.5.5" else 0.57
    if variant == "pd-prefill":
        prefill |= {"bootstrap_req": 2, "inflight_req": 3}
        if release == "0.5.5":  # the previous batch's tokens over the gap: none yet
            prefill["input_throughput"] = 0.0
        if release == "0.5.23":
            prefill["optimistic_req"] = 0
        return [("prefill", prefill)]
    if variant == "pd-decode":
        decode["prealloc_usage"] = 0.01 if release == "0.5.5" else 0.05
        if release != "0.4.6.post5":
            decode |= {"prealloc_req": 2, "transfer_req": 1, "pd_retracted_req": 0}
        return [("decode", decode)]
    order = [("prefill", prefill), ("decode", decode)]
    return order[::-1] if release == "0.5.5" else order  # 0.5.5's driver: decode first


def _lines(release: str, variant: str) -> list[str]:
    return (GOLDENS / release / variant / "scheduler.log").read_text().splitlines()


@pytest.mark.parametrize(("release", "variant"), LOG_CASES)
def test_the_exporter_reads_every_log_line(release, variant):
    lines = _lines(release, variant)
    parsed = [parse_line(line) for line in lines]
    assert all(p is not None for p in parsed), lines
    assert [(p.kind, p.fields) for p in parsed] == expected_lines(release, variant)
    for line, p in zip(lines, parsed, strict=True):
        assert p.ranks == {"TP": 0}
        assert p.ts == datetime(2026, 12, 3, 10, 0, lines.index(line))
        # Every `key: value` of the line is one the parser knows: nothing is dropped.
        pairs = re.findall(r"(?:\] [A-Za-z]+ batch[.,] |, )([^,:]+): ", line)
        assert len(pairs) == len(p.fields), (pairs, p.fields)


def _simulated(release: str, kind: str, fields: dict, ts: float) -> str:
    """The simulator's line for the same numbers (the fields it models)."""
    if kind == "prefill":
        event = PrefillBatch(ts=ts, dp_rank=None, new_seq=fields["new_seq"],
                             new_token=fields["new_token"], cached_token=fields["cached_token"],
                             token_usage=fields["token_usage"],
                             running_req=fields["running_req"], queue_req=fields["queue_req"],
                             pending_token=fields.get("pending_token", 0),
                             input_throughput=fields.get("input_throughput", 0.0),
                             cuda_graph=fields.get("cuda_graph", False))
    else:
        event = DecodeBatch(ts=ts, dp_rank=None, running_req=fields["running_req"],
                            num_token=fields["num_token"], token_usage=fields["token_usage"],
                            gen_throughput=fields["gen_throughput"],
                            queue_req=fields["queue_req"], accept_len=fields.get("accept_len"),
                            accept_rate=fields.get("accept_rate"),
                            cuda_graph=fields["cuda_graph"])
    return sim_logs.format_event(event, release, tp_size=2)


def log_differences(release: str) -> dict[str, str]:
    """variant/kind -> the golden line and the simulator's, where they differ."""
    out = {}
    for variant in sorted(v for r, v in LOG_CASES if r == release):
        for i, line in enumerate(_lines(release, variant)):
            p = parse_line(line)
            ts = datetime(2026, 12, 3, 10, 0, i, tzinfo=timezone.utc).timestamp()
            simulated = _simulated(release, p.kind, p.fields, ts)
            if simulated != line:
                out[f"{variant}/{p.kind}"] = f"release: {line!r}\nsimulator: {simulated!r}"
    return out


def _check_allowed(section: str, release: str, found: dict[str, str]) -> None:
    allowed = (ALLOWED.get(section) or {}).get(release) or {}
    unexplained = {k: v for k, v in found.items() if k not in allowed}
    assert unexplained == {}, "explain in conformance/simulator-differences.yml or fix"
    stale = sorted(set(allowed) - set(found))
    assert stale == [], f"listed but no longer different: {stale}"
    assert all(isinstance(v, str) and len(v) > 20 for v in allowed.values())


@pytest.mark.parametrize("release", RELEASES)
def test_the_simulator_logs_what_the_release_logs(release):
    _check_allowed("log", release, log_differences(release))


# -- per-request records ------------------------------------------------------------------------
def _records(release: str, variant: str) -> list[str]:
    return (GOLDENS / release / variant / "request_records.log").read_text().splitlines()


def test_the_releases_that_write_records_have_record_goldens():
    assert {r for r, _ in RECORD_CASES} == set(AT_LEAST_0_5_12)


@pytest.mark.parametrize(("release", "variant"), RECORD_CASES)
def test_the_exporter_reads_every_record(release, variant):
    lines = _records(release, variant)
    assert len(lines) == 6
    for i, line in enumerate(lines):
        assert PROMPT_MARKER in line  # the release writes the prompt...
        rec = parse_record(line, keep_id=True, read_params=True)
        assert not isinstance(rec, str), rec
        assert PROMPT_MARKER not in repr(rec)  # ...and nothing of it gets through
        assert rec.release == "later"
        assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (
            1200 + 97 * i, 180 + 11 * i, 512 if i % 3 else 0)
        assert rec.e2e_seconds == pytest.approx(2.5 + 0.11 * i, abs=1e-6)
        assert rec.ttft_seconds == pytest.approx(0.21 + 0.01 * i, abs=1e-6)
        assert rec.queue_seconds == pytest.approx(0.05 + 0.01 * i, abs=1e-6)
        assert rec.finish_reason == "stop"
        assert rec.max_new_tokens == 1024
        assert rec.received_at == pytest.approx(1_796_292_000.0 + 1000.0 + 10.0 * i)


def _simulated_record_keys(release: str, streaming: bool, spec: bool) -> list[str]:
    from sglang_obs.simulator.model import Request, ServerConfig
    from sglang_obs.simulator.profiles import profile
    from sglang_obs.simulator.records import record

    req = Request(rid=1, arrival=10.0, input_len=1297, cached_fraction=0.0, output_len=191,
                  max_new_tokens=1024, streaming=streaming, generated=191.0, scheduled_at=10.06,
                  first_token_at=10.22)
    cfg = ServerConfig(speculative_algorithm="EAGLE" if spec else None)
    return list(record(req, 12.6, 1_796_292_000.0, profile(release), cfg))


def record_differences(release: str) -> dict[str, str]:
    """variant/streaming|batch -> the release's keys and the simulator's, where they differ."""
    out = {}
    for variant in ("default", "spec"):
        for i, line in enumerate(_records(release, variant)[:2]):
            kind = "streaming" if i % 4 else "not-streaming"  # request_input: stream = i % 4
            golden = list(json.loads(line))
            simulated = _simulated_record_keys(release, i % 4 != 0, variant == "spec")
            if golden != simulated:
                out[f"{variant}/{kind}"] = f"release: {golden}\nsimulator: {simulated}"
    return out


@pytest.mark.parametrize("release", AT_LEAST_0_5_12)
def test_the_simulator_records_what_the_release_records(release):
    """Same keys in the same order, for a streaming and a non-streaming request, with and
    without speculative decoding."""
    _check_allowed("records", release, record_differences(release))
