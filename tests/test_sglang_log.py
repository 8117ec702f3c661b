"""The simulator's log lines and the exporter's log parser agree, for every supported release, and
the parser reads the scheduler log formats of every release (exporter/sglang_log.py) and survives
any input."""

import dataclasses
import itertools
import random
import time
from datetime import datetime, timezone

import pytest

from sglang_obs.exporter.sglang_log import KINDS, ParsedLine, parse_line
from sglang_obs.simulator.events import (
    DecodeBatch,
    HealthCheckFailed,
    PrefillBatch,
    Ready,
    Retraction,
    StartupCapacity,
)
from sglang_obs.simulator.logs import RELEASES, format_event, prefix

TS = datetime(2026, 10, 30, 1, 4, 5, 678901, tzinfo=timezone.utc).timestamp()


def assert_numeric(parsed: ParsedLine | None) -> None:
    """No text of a line may ever reach the fields (prompts and keys must not leak)."""
    if parsed is None:
        return
    assert parsed.kind in KINDS
    for key, value in parsed.fields.items():
        assert isinstance(key, str)
        assert type(value) in (int, float, bool), (key, value)
    for tag, index in parsed.ranks.items():
        assert isinstance(tag, str)
        assert type(index) is int


def parse(line: str) -> ParsedLine:
    parsed = parse_line(line)
    assert parsed is not None, line
    assert_numeric(parsed)
    return parsed


# --- round trip: simulator.logs -> exporter.sglang_log ---------------------------------------


def events(dp_rank, spec):
    return {
        "prefill": PrefillBatch(
            ts=TS, dp_rank=dp_rank, new_seq=3, new_token=1536, cached_token=512,
            token_usage=0.3149, running_req=12, queue_req=4, pending_token=2048,
            input_throughput=12345.678, cuda_graph=spec,
        ),
        "decode": DecodeBatch(
            ts=TS, dp_rank=dp_rank, running_req=17, num_token=8931, token_usage=0.4451,
            gen_throughput=2500.004, queue_req=2,
            accept_len=3.104 if spec else None, accept_rate=0.7049 if spec else None,
            cuda_graph=not spec,
        ),
        "retraction": Retraction(
            ts=TS, dp_rank=dp_rank, retracted_reqs=8, new_tokens_gained=4096,
            new_token_ratio_before=0.71234, new_token_ratio_after=0.9,
        ),
        "capacity": StartupCapacity(
            ts=TS, max_total_num_tokens=412345, chunked_prefill_size=8192,
            max_prefill_tokens=16384, max_running_requests=2048, context_len=131072,
            available_gpu_mem_gb=12.345,
        ),
        "ready": Ready(ts=TS),
        "health_check_failed": HealthCheckFailed(
            ts=TS, seconds=20.0, tic=TS - 20, last_heartbeat=TS - 61
        ),
    }


def expected_fields(kind, event, release):
    """What the parser must give back for `event` as `release` prints it."""
    v5 = release != "0.4.6.post5"
    modern = release in ("0.5.12", "0.5.23")
    if kind == "prefill":
        out = {
            "new_seq": event.new_seq, "new_token": event.new_token,
            "cached_token": event.cached_token, "token_usage": round(event.token_usage, 2),
            "running_req": event.running_req, "queue_req": event.queue_req,
        }
        if modern:
            out |= {
                "pending_token": event.pending_token, "cuda_graph": event.cuda_graph,
                "input_throughput": round(event.input_throughput, 2),
            }
        return out
    if kind == "decode":
        out = {
            "running_req": event.running_req, "num_token": event.num_token,
            "token_usage": round(event.token_usage, 2), "cuda_graph": event.cuda_graph,
            "gen_throughput": round(event.gen_throughput, 2), "queue_req": event.queue_req,
        }
        if event.accept_len is not None:
            out["accept_len"] = round(event.accept_len, 2)
            if v5:
                out["accept_rate"] = round(event.accept_rate, 2)
        return out
    if kind == "retraction":
        out = {
            "retracted_reqs": event.retracted_reqs,
            "new_token_ratio_before": round(event.new_token_ratio_before, 4),
            "new_token_ratio_after": round(event.new_token_ratio_after, 4),
        }
        if v5:
            out["new_tokens_gained"] = event.new_tokens_gained
        return out
    if kind == "capacity":
        out = {
            "max_total_num_tokens": event.max_total_num_tokens,
            "chunked_prefill_size": event.chunked_prefill_size,
            "max_prefill_tokens": event.max_prefill_tokens,
            "max_running_requests": event.max_running_requests,
            "context_len": event.context_len,
        }
        if v5:
            out["available_gpu_mem_gb"] = round(event.available_gpu_mem_gb, 2)
        return out
    if kind == "health_check_failed":
        return {"seconds": event.seconds}
    return {}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("dp_size", [1, 2])
@pytest.mark.parametrize("tp_size", [1, 4])
@pytest.mark.parametrize("log_ms", [False, True])
@pytest.mark.parametrize("spec", [False, True])
def test_round_trip(release, dp_size, tp_size, log_ms, spec):
    dp_rank = 1 if dp_size > 1 else None
    for kind, event in events(dp_rank, spec).items():
        line = format_event(event, release, tp_size=tp_size, dp_size=dp_size, log_ms=log_ms)
        assert "\n" not in line
        parsed = parse(line)
        assert parsed.kind == kind, line
        assert parsed.ts == datetime(2026, 10, 30, 1, 4, 5, 678000 if log_ms else 0), line
        ranks = {}
        if kind not in ("ready", "health_check_failed"):  # main-process lines carry no ranks
            if dp_size > 1:
                ranks["DP"] = 0 if kind == "capacity" else dp_rank
            if tp_size > 1:
                ranks["TP"] = 0
        assert parsed.ranks == ranks, line
        assert parsed.fields == expected_fields(kind, event, release), line


@pytest.mark.parametrize("release", RELEASES)
def test_round_trip_values_sweep(release):
    """Many random batches: the numbers survive the text, token usage to two decimals."""
    rng = random.Random(release)
    for _ in range(300):
        prefill = PrefillBatch(
            ts=rng.uniform(1.6e9, 1.9e9), dp_rank=rng.choice([None, 0, 7]),
            new_seq=rng.randrange(0, 512), new_token=rng.randrange(0, 10**6),
            cached_token=rng.randrange(0, 10**6), token_usage=rng.random(),
            running_req=rng.randrange(0, 4096), queue_req=rng.randrange(0, 10**5),
            pending_token=rng.randrange(0, 10**7), input_throughput=rng.uniform(0, 1e6),
            cuda_graph=rng.random() < 0.5,
        )
        decode = DecodeBatch(
            ts=prefill.ts, dp_rank=prefill.dp_rank, running_req=rng.randrange(0, 4096),
            num_token=rng.randrange(0, 10**7), token_usage=rng.random(),
            gen_throughput=rng.uniform(0, 1e5), queue_req=rng.randrange(0, 10**5),
            accept_len=rng.choice([None, rng.uniform(1, 8)]), accept_rate=rng.random(),
            cuda_graph=rng.random() < 0.5,
        )
        dp_size = 8 if prefill.dp_rank is not None else 1
        for kind, event in (("prefill", prefill), ("decode", decode)):
            parsed = parse(format_event(event, release, dp_size=dp_size, log_ms=True))
            assert parsed.kind == kind
            assert parsed.fields == expected_fields(kind, event, release)
            assert parsed.fields["token_usage"] == float(f"{event.token_usage:.2f}")
            assert parsed.ranks.get("DP") == event.dp_rank


# --- exact text per release (reference §10 table) ---------------------------------------------


SPEC_DECODE = DecodeBatch(
    ts=TS, dp_rank=None, running_req=12, num_token=8192, token_usage=0.02,
    gen_throughput=2500.0, queue_req=0, accept_len=3.1, accept_rate=0.7, cuda_graph=True,
)
PREFILL = PrefillBatch(
    ts=TS, dp_rank=None, new_seq=1, new_token=512, cached_token=0, token_usage=0.01,
    running_req=0, queue_req=0, pending_token=0, input_throughput=1234.56,
)


@pytest.mark.parametrize(("release", "expected"), [
    ("0.4.6.post5", "[2026-10-30 01:04:05] Prefill batch. #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0"),
    ("0.4.6", "[2026-10-30 01:04:05] Prefill batch. #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0"),
    ("0.5.5", "[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, "),
    # The literal example of §10.
    ("0.5.12", "[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, "
     "cuda graph: False, input throughput (token/s): 1234.56"),
    ("0.5.23", "[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, "
     "cuda graph: False, input throughput (token/s): 1234.56"),
])
def test_prefill_text(release, expected):
    assert format_event(PREFILL, release) == expected


@pytest.mark.parametrize(("release", "expected"), [
    ("0.4.6.post5", "[2026-10-30 01:04:05 TP0] Decode batch. #running-req: 12, #token: 8192, "
     "token usage: 0.02, accept len: 3.10, cuda graph: True, gen throughput (token/s): 2500.00, "
     "#queue-req: 0"),
    ("0.5.5", "[2026-10-30 01:04:05 TP0] Decode batch, #running-req: 12, #token: 8192, "
     "token usage: 0.02, accept len: 3.10, accept rate: 0.70, cuda graph: True, "
     "gen throughput (token/s): 2500.00, #queue-req: 0, "),
    # The literal example of §10.
    ("0.5.23", "[2026-10-30 01:04:07 TP0] Decode batch, #running-req: 12, #token: 8192, "
     "token usage: 0.02, accept len: 3.10, accept rate: 0.70, cuda graph: True, "
     "gen throughput (token/s): 2500.00, #queue-req: 0"),
])
def test_decode_text(release, expected):
    event = SPEC_DECODE
    if release == "0.5.23":
        event = dataclasses.replace(event, ts=TS + 2)
    assert format_event(event, release, tp_size=2) == expected


def test_decode_without_spec_has_no_accept_fields():
    event = dataclasses.replace(SPEC_DECODE, accept_len=None, accept_rate=None)
    for release in RELEASES:
        line = format_event(event, release)
        assert "accept" not in line
        assert "accept_len" not in parse(line).fields


@pytest.mark.parametrize(("release", "expected"), [
    ("0.4.6.post5", "[2026-10-30 01:04:05.678 DP3 TP0 PP0] "),
    ("0.5.5", "[2026-10-30 01:04:05.678 DP3 TP0 EP0 PP0] "),
    ("0.5.12", "[2026-10-30 01:04:05.678 DP3 PP0 TP0 EP0] "),
    ("0.5.23", "[2026-10-30 01:04:05.678 DP3 PP0 TP0 EP0] "),
])
def test_rank_order(release, expected):
    head = prefix(TS, release, dp_rank=3, tp_size=8, dp_size=4, pp_size=2, ep_size=8,
                  log_ms=True)
    assert head == expected
    ranks = {"DP": 3, "TP": 0, "PP": 0}
    if not release.startswith("0.4"):
        ranks["EP"] = 0
    assert parse(head + "x").ranks == ranks


def test_rank_sizes_of_one_are_not_printed():
    for release in RELEASES:
        assert prefix(TS, release) == "[2026-10-30 01:04:05] "
        assert prefix(TS, release, pp_size=2) == "[2026-10-30 01:04:05 PP0] "


def test_other_lines_text():
    capacity = events(None, False)["capacity"]
    assert format_event(capacity, "0.4.6.post5") == (
        "[2026-10-30 01:04:05] max_total_num_tokens=412345, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=131072"
    )
    assert format_event(capacity, "0.5.23", tp_size=2) == (
        "[2026-10-30 01:04:05 TP0] max_total_num_tokens=412345, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=131072, "
        "available_gpu_mem=12.35 GB"
    )
    retraction = events(1, False)["retraction"]
    assert format_event(retraction, "0.5.12", dp_size=2) == (
        "[2026-10-30 01:04:05 DP1] KV cache pool is full. Retract requests. #retracted_reqs: 8, "
        "#new_tokens_gained: 4096, #new_token_ratio: 0.7123 -> 0.9000"
    )
    assert format_event(retraction, "0.4.6.post5") == (
        "[2026-10-30 01:04:05] Decode out of memory happened. #retracted_reqs: 8, "
        "#new_token_ratio: 0.7123 -> 0.9000"
    )
    assert format_event(Ready(ts=TS), "0.5.5", tp_size=4, dp_size=2) == (
        "[2026-10-30 01:04:05] The server is fired up and ready to roll!"
    )
    health = events(None, False)["health_check_failed"]
    assert format_event(health, "0.5.23", log_ms=True) == (
        "[2026-10-30 01:04:05.678] Health check failed. Server couldn't get a response from "
        "detokenizer for last 20 seconds. tic start time: 01:03:45. last_heartbeat time: 01:03:04"
    )


def test_unknown_release_and_event():
    for release in ("0.5.99", "", "v0.5.23", "0.4.6.post4", None):
        with pytest.raises(ValueError, match="unknown SGLang release"):
            format_event(Ready(ts=TS), release)
    with pytest.raises(TypeError):
        format_event(object(), "0.5.23")


# --- reference §10 lines and hand-built variants ----------------------------------------------


def test_reference_examples():
    prefill = parse(
        "[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, "
        "token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 1234.56"
    )
    assert prefill == ParsedLine(
        ts=datetime(2026, 10, 30, 1, 4, 5), ranks={}, kind="prefill",
        fields={"new_seq": 1, "new_token": 512, "cached_token": 0, "token_usage": 0.01,
                "running_req": 0, "queue_req": 0, "pending_token": 0, "cuda_graph": False,
                "input_throughput": 1234.56},
    )
    decode = parse(
        "[2026-10-30 01:04:07 TP0] Decode batch, #running-req: 12, #token: 8192, "
        "token usage: 0.02, accept len: 3.10, accept rate: 0.70, cuda graph: True, "
        "gen throughput (token/s): 2500.00, #queue-req: 0"
    )
    assert decode == ParsedLine(
        ts=datetime(2026, 10, 30, 1, 4, 7), ranks={"TP": 0}, kind="decode",
        fields={"running_req": 12, "num_token": 8192, "token_usage": 0.02, "accept_len": 3.1,
                "accept_rate": 0.7, "cuda_graph": True, "gen_throughput": 2500.0, "queue_req": 0},
    )


VARIANTS = [
    # 0.4.6.post5 PD prefill: no #running-req, bootstrap/transfer queues, trailing space.
    ("[2025-05-20 08:00:00 DP0 TP0] Prefill batch. #new-seq: 2, #new-token: 4096, "
     "#cached-token: 128, token usage: 0.12, #unbootstrapped-req: 1, #queue-req: 3, "
     "#transferring-req: 2, input throughput (token/s): 8000.00 ",
     "prefill", {"new_seq": 2, "new_token": 4096, "cached_token": 128, "token_usage": 0.12,
                 "bootstrap_req": 1, "queue_req": 3, "inflight_req": 2,
                 "input_throughput": 8000.0}),
    # 0.4.10.post2-0.5.2 PD prefill: still no #running-req, lines end with ", ".
    ("[2025-08-01 10:00:00] Prefill batch. #new-seq: 2, #new-token: 4096, #cached-token: 0, "
     "token usage: 0.12, #unbootstrapped-req: 0, #queue-req: 3, #transferring-req: 2, "
     "input throughput (token/s): 8000.00, ",
     "prefill", {"new_seq": 2, "new_token": 4096, "cached_token": 0, "token_usage": 0.12,
                 "bootstrap_req": 0, "queue_req": 3, "inflight_req": 2,
                 "input_throughput": 8000.0}),
    # 0.4.10.post2 hybrid SWA prefill with the trailing ", ".
    ("[2025-08-01 10:00:01] Prefill batch. #new-seq: 1, #new-token: 100, #cached-token: 0, "
     "full token usage: 0.25, swa token usage: 0.60, #running-req: 1, #queue-req: 0, ",
     "prefill", {"new_seq": 1, "new_token": 100, "cached_token": 0, "token_usage": 0.25,
                 "swa_token_usage": 0.6, "running_req": 1, "queue_req": 0}),
    # 0.5.2 on CPU: "cpu graph".
    ("[2025-09-01 00:00:00] Decode batch. #running-req: 2, #token: 300, token usage: 0.01, "
     "cpu graph: False, gen throughput (token/s): 12.50, #queue-req: 0, ",
     "decode", {"running_req": 2, "num_token": 300, "token_usage": 0.01, "cuda_graph": False,
                "gen_throughput": 12.5, "queue_req": 0}),
    # 0.5.3 PD decode.
    ("[2025-09-20 00:00:00 TP0] Decode batch. #running-req: 5, #token: 900, token usage: 0.03, "
     "pre-allocated usage: 0.10, #prealloc-req: 2, #transfer-req: 1, #retracted-req: 0, "
     "cuda graph: True, gen throughput (token/s): 410.00, #queue-req: 0, ",
     "decode", {"running_req": 5, "num_token": 900, "token_usage": 0.03, "prealloc_usage": 0.1,
                "prealloc_req": 2, "transfer_req": 1, "pd_retracted_req": 0, "cuda_graph": True,
                "gen_throughput": 410.0, "queue_req": 0}),
    # 0.5.4: the iteration number is always printed.
    ("[2025-10-01 12:00:00 TP0] Prefill batch [123], #new-seq: 1, #new-token: 512, "
     "#cached-token: 0, token usage: 0.05, #running-req: 3, #queue-req: 0, ",
     "prefill", {"iteration": 123, "new_seq": 1, "new_token": 512, "cached_token": 0,
                 "token_usage": 0.05, "running_req": 3, "queue_req": 0}),
    ("[2025-10-01 12:00:01 TP0] Decode batch [124], #running-req: 4, #token: 2048, "
     "token usage: 0.06, cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0, ",
     "decode", {"iteration": 124, "running_req": 4, "num_token": 2048, "token_usage": 0.06,
                "cuda_graph": True, "gen_throughput": 300.0, "queue_req": 0}),
    # 0.5.5-0.5.8 with SGLANG_LOG_FORWARD_ITERS and the trailing ", ".
    ("[2025-11-01 12:00:00.001 DP1 TP0 EP0] Decode batch [77], #running-req: 4, #token: 2048, "
     "token usage: 0.06, accept len: 2.50, accept rate: 0.50, cuda graph: True, "
     "gen throughput (token/s): 300.00, #queue-req: 0, ",
     "decode", {"iteration": 77, "running_req": 4, "num_token": 2048, "token_usage": 0.06,
                "accept_len": 2.5, "accept_rate": 0.5, "cuda_graph": True,
                "gen_throughput": 300.0, "queue_req": 0}),
    # 0.5.9: prefill ends "input throughput, cuda graph"; NPU.
    ("[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 3, "
     "token usage: 0.00, #running-req: 0, #queue-req: 0, input throughput (token/s): 1.00, "
     "npu graph: True",
     "prefill", {"new_seq": 1, "new_token": 7, "cached_token": 3, "token_usage": 0.0,
                 "running_req": 0, "queue_req": 0, "input_throughput": 1.0, "cuda_graph": True}),
    # 0.5.10: hybrid SSM prefill, "cuda graph, input throughput", MUSA.
    ("[2026-02-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 3, "
     "full token usage: 0.20, mamba usage: 0.40, #running-req: 0, #queue-req: 0, "
     "musa graph: False, input throughput (token/s): 99.99",
     "prefill", {"new_seq": 1, "new_token": 7, "cached_token": 3, "token_usage": 0.2,
                 "mamba_usage": 0.4, "running_req": 0, "queue_req": 0, "cuda_graph": False,
                 "input_throughput": 99.99}),
    # 0.5.12+ hybrid SWA decode: token usage is the full pool, #full token the full-pool tokens.
    ("[2026-04-01 00:00:00 TP0] Decode batch, #running-req: 8, #full token: 10000, "
     "full token usage: 0.31, #swa token: 4000, swa token usage: 0.52, cuda graph: True, "
     "gen throughput (token/s): 900.12, #queue-req: 1",
     "decode", {"running_req": 8, "num_token": 10000, "token_usage": 0.31,
                "swa_num_token": 4000, "swa_token_usage": 0.52, "cuda_graph": True,
                "gen_throughput": 900.12, "queue_req": 1}),
    # Hybrid SSM decode.
    ("[2026-04-01 00:00:00] Decode batch, #running-req: 8, #full token: 10000, "
     "full token usage: 0.31, mamba num: 12, mamba usage: 0.05, cuda graph: False, "
     "gen throughput (token/s): 1.00, #queue-req: 0",
     "decode", {"running_req": 8, "num_token": 10000, "token_usage": 0.31, "mamba_num": 12,
                "mamba_usage": 0.05, "cuda_graph": False, "gen_throughput": 1.0,
                "queue_req": 0}),
    # 0.5.20+ PD prefill with MFU and device-timer suffixes, every rank tag, milliseconds.
    ("[2026-08-01 00:00:00.999 DP3 PP1 ATTN_CP0 MOE_DP2 TP0 EP1] Prefill batch, #new-seq: 4, "
     "#new-token: 8000, #cached-token: 100, token usage: 0.50, #running-req: 9, #queue-req: 2, "
     "#pending-token: 30000, #replay-token: 5, #bootstrap-req: 1, #inflight-req: 2, "
     "#optimistic-req: 0, cuda graph: False, input throughput (token/s): 40000.00, "
     "est. prefill TFLOPS/s (per GPU): 123.40, fwd occupancy: 95.10%, "
     "fwd+idle occupancy: 97.00%",
     "prefill", {"new_seq": 4, "new_token": 8000, "cached_token": 100, "token_usage": 0.5,
                 "running_req": 9, "queue_req": 2, "pending_token": 30000, "replay_token": 5,
                 "bootstrap_req": 1, "inflight_req": 2, "optimistic_req": 0,
                 "cuda_graph": False, "input_throughput": 40000.0}),
    # 0.5.23 PD decode with spec extras and MFU suffix.
    ("[2026-10-30 01:04:07 TP0] Decode batch, #running-req: 64, #token: 50000, "
     "token usage: 0.70, accept len: 3.20, accept rate: 0.55, cap len: 4.00, "
     "block accept len: 2.00, pre-allocated usage: 0.05, #prealloc-req: 3, #transfer-req: 2, "
     "#host-receive-req: 1, #retracted-req: 0, cuda graph: True, "
     "gen throughput (token/s): 5000.00, #queue-req: 0, est. decode TFLOPS/s (per GPU): 10.00, "
     "est. read BW (GB/s per GPU): 1000.00, est. write BW (GB/s per GPU): 10.00",
     "decode", {"running_req": 64, "num_token": 50000, "token_usage": 0.7, "accept_len": 3.2,
                "accept_rate": 0.55, "prealloc_usage": 0.05, "prealloc_req": 3,
                "transfer_req": 2, "host_receive_req": 1, "pd_retracted_req": 0,
                "cuda_graph": True, "gen_throughput": 5000.0, "queue_req": 0}),
    # 0.4.x decode (accept len only, no accept rate).
    ("[2025-06-01 00:00:00] Decode batch. #running-req: 1, #token: 10, token usage: 0.00, "
     "accept len: 1.90, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 0",
     "decode", {"running_req": 1, "num_token": 10, "token_usage": 0.0, "accept_len": 1.9,
                "cuda_graph": True, "gen_throughput": 40.0, "queue_req": 0}),
    # Startup capacity: chunked prefill disabled, CPU memory.
    ("[2026-10-30 01:00:00 TP0] max_total_num_tokens=100000, chunked_prefill_size=None, "
     "max_prefill_tokens=16384, max_running_requests=512, context_len=32768, "
     "available_cpu_mem=100.50 GB",
     "capacity", {"max_total_num_tokens": 100000, "chunked_prefill_size": -1,
                  "max_prefill_tokens": 16384, "max_running_requests": 512,
                  "context_len": 32768, "available_gpu_mem_gb": 100.5}),
    ("[2026-10-30 01:00:00] max_total_num_tokens=100000, chunked_prefill_size=-1, "
     "max_prefill_tokens=16384, max_running_requests=512, context_len=32768",
     "capacity", {"max_total_num_tokens": 100000, "chunked_prefill_size": -1,
                  "max_prefill_tokens": 16384, "max_running_requests": 512,
                  "context_len": 32768}),
    # Retraction on a hybrid SSM model.
    ("[2026-10-30 01:00:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
     "#new_tokens_gained: 4000, #mamba_num_gained: 2, #new_token_ratio: 0.5000 -> 0.7000",
     "retraction", {"retracted_reqs": 2, "new_tokens_gained": 4000, "mamba_num_gained": 2,
                    "new_token_ratio_before": 0.5, "new_token_ratio_after": 0.7}),
    ("[2026-10-30 01:00:00] Health check failed. Server couldn't get a response from "
     "detokenizer for last 20 seconds. tic start time: 10:47:07. last_heartbeat time: 09:44:42",
     "health_check_failed", {"seconds": 20.0}),
    ("[2026-10-30 01:00:00] The server is fired up and ready to roll!", "ready", {}),
    # Prefixed, but none of the kinds.
    ('[2026-10-30 01:00:00] INFO:     127.0.0.1:51448 - "GET /metrics HTTP/1.1" 200 OK',
     "other", {}),
    ("[2026-10-30 01:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16",
     "other", {}),
    ("[2026-10-30 01:00:00] ", "other", {}),
]


@pytest.mark.parametrize(("line", "kind", "fields"), VARIANTS)
def test_variants(line, kind, fields):
    parsed = parse(line)
    assert parsed.kind == kind
    assert parsed.fields == fields


def test_prefix_details():
    parsed = parse("[2026-08-01 00:00:00.999 DP3 PP1 ATTN_CP0 MOE_DP2 TP0 EP1] x")
    assert parsed.ts == datetime(2026, 8, 1, 0, 0, 0, 999000)
    assert parsed.ranks == {"DP": 3, "PP": 1, "ATTN_CP": 0, "MOE_DP": 2, "TP": 0, "EP": 1}
    assert parse("[2026-13-45 99:00:00] x").ts is None  # impossible date: kept, ts unknown
    assert parse("[2026-10-30 01:04:05] The server is fired up and ready to roll!\r\n").kind == (
        "ready"
    )


@pytest.mark.parametrize("line", [
    "",
    "\n",
    "Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2001, in event_loop_normal',
    'INFO:     127.0.0.1:51448 - "GET /health HTTP/1.1" 200 OK',
    '{"ts": "2026-10-30T01:04:05", "msg": "Decode batch, #running-req: 1, #token: 1"}',
    "Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0",
    "[2026-10-30 01:04:05]Prefill batch, #new-seq: 1",
    "[2026-10-30T01:04:05] Prefill batch, #new-seq: 1",
    "[2026-10-30 01:04:05 XX0] Prefill batch, #new-seq: 1",
    "[2026-10-30 01:04:05.12] x",
    "[\u0662\u0660\u0662\u0666-10-30 01:04:05] x",  # non-ASCII digits
])
def test_lines_without_prefix(line):
    assert parse_line(line) is None


@pytest.mark.parametrize("msg", [
    "Prefill batch, #new-seq: 1, #new-token: , #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 12x, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 1_000, #cached-token: 0, token usage: 0.01, "
    "#queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: \u0661\u0662, #cached-token: 0, "
    "token usage: 0.01, #queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: nan, "
    "#queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 1e5, "
    "#queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: " + "9" * 5000 + ", #cached-token: 0, "
    "token usage: 0.01, #queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 512",  # truncated
    "Prefill batch, #new-token: 512, #cached-token: 0, token usage: 0.01, #queue-req: 0",
    "Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 5",
    "Decode batch, #running-req: 1, #token: 1, token usage: 0.01, cuda graph: maybe, "
    "gen throughput (token/s): 1.00, #queue-req: 0",
    "Decode batch, #running-req: -1, #token: 1, token usage: 0.01, "
    "gen throughput (token/s): 1.00, #queue-req: 0",
    "Decode batch, #running-req: 1",
    "KV cache pool is full. Retract requests. #retracted_reqs: many",
    "max_total_num_tokens=abc, chunked_prefill_size=1",
    "Health check failed. Server couldn't get a response",
    "Prefill batch, " + "#new-seq: 1, " * 100_000,
])
def test_malformed_messages_are_other(msg):
    parsed = parse("[2026-10-30 01:04:05] " + msg)
    assert parsed.kind == "other"
    assert parsed.fields == {}


def test_garbage_never_raises():
    rng = random.Random(1234)
    prefixes = ["", "[2026-10-30 01:04:05] ", "[2026-10-30 01:04:05.123 DP1 TP0] "]
    heads = ["", "Prefill batch, ", "Decode batch. ", "KV cache pool is full. Retract requests. ",
             "max_total_num_tokens=", "Health check failed. ", "#new-token: "]
    for _ in range(3000):
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        text = noise.decode("utf-8", errors="replace")
        line = rng.choice(prefixes) + rng.choice(heads) + text
        assert_numeric(parse_line(line))
        assert_numeric(parse_line(line.encode("utf-8", errors="replace")))
        assert_numeric(parse_line(noise))
    for odd in (None, 42, 3.5, ["[2026-10-30 01:04:05] x"], object(), b"\xff\xfe\x00"):
        assert parse_line(odd) is None


def test_fields_never_hold_text_from_the_line():
    secret = "api_key=sk-SECRET"
    lines = [
        f"[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, {secret}, #new-token: 512, "
        f"#cached-token: 0, token usage: 0.01, prompt: {secret}, #running-req: 0, "
        f"#queue-req: 0, #pending-token: 0, cuda graph: False, "
        f"input throughput (token/s): 1234.56, {secret}: {secret}",
        f"[2026-10-30 01:04:05] Prefill batch, #new-seq: 1, #new-token: {secret}, "
        "#cached-token: 0, token usage: 0.01, #queue-req: 0",
        f"[2026-10-30 01:04:05] Decode batch, #running-req: 1, token usage: 0.10, "
        f"cuda graph: {secret}, gen throughput (token/s): 1.00, #queue-req: 0",
        f"[2026-10-30 01:04:05] Receive: obj=GenerateReqInput(text='{secret} Prefill batch, "
        "#new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.01, #queue-req: 0')",
        f"[2026-10-30 01:04:05] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
        f"{secret}",
    ]
    for line in lines:
        parsed = parse(line)
        assert not any(isinstance(v, str) for v in parsed.fields.values())
        assert "SECRET" not in repr(parsed)
    first = parse(lines[0])
    assert first.kind == "prefill"
    assert first.fields["new_token"] == 512
    assert parse(lines[1]).kind == "other"
    assert parse(lines[2]).kind == "other"
    assert parse(lines[3]).kind == "other"  # a prompt quoting a batch line is not one
    assert parse(lines[4]).fields == {"retracted_reqs": 1}


@pytest.mark.parametrize("body", [
    "token usage: 1, " * 100_000,
    "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 1, "
    + "token usage: 1," * 70_000,
    "Decode batch, #running-req: 1, " + "x" * 1_000_000,
    "[" * 1_000_000,
    "KV cache pool is full. Retract requests. #retracted_reqs: " + "1" * 1_000_000,
])
def test_huge_lines_are_cheap(body):
    start = time.perf_counter()
    for head in ("", "[2026-10-30 01:04:05 TP0] "):
        assert_numeric(parse_line(head + body))
        parsed = parse_line(head + body)
        assert parsed is None or parsed.kind == "other"
    assert time.perf_counter() - start < 2.0


def test_every_kind_is_reachable():
    seen = {parse(line).kind for line, _, _ in VARIANTS}
    seen |= {
        parse(format_event(e, "0.5.23")).kind for e in events(None, True).values()
    }
    assert seen == KINDS


def test_prefix_carries_no_rank_for_size_one():
    combos = itertools.product(RELEASES, [1, 2], [1, 2], [1, 2])
    for release, tp, pp, ep in combos:
        head = prefix(TS, release, tp_size=tp, pp_size=pp, ep_size=ep)
        ranks = parse(head + "x").ranks
        assert ("TP" in ranks) == (tp > 1)
        assert ("PP" in ranks) == (pp > 1)
        # 0.4.6.post5 never printed EP (reference §10: DP, TP, PP).
        assert ("EP" in ranks) == (ep > 1 and not release.startswith("0.4"))


PREFILL_0512 = ("[2026-11-29 11:51:14 TP0] Prefill batch, #new-seq: 1, #new-token: 4096, "
                "#cached-token: 0, token usage: 0.05, #running-req: 6, #queue-req: 3, "
                "#pending-token: 208013, cuda graph: False, input throughput (token/s): 1536.21")


@pytest.mark.parametrize("wrapper", [
    "",
    " ",  # odd spacing before the prefix
    "sglang-1  | ",  # docker compose logs
    "2026-11-29T11:51:14.123456789Z stdout F ",  # the CRI log format (containerd, Kubernetes)
    "Nov 29 11:51:14 gpu-01 python3[4242]: ",  # journald / syslog
])
def test_lines_wrapped_by_another_logger_still_parse(wrapper):
    parsed = parse_line(wrapper + PREFILL_0512)
    assert parsed.kind == "prefill"
    assert parsed.fields["pending_token"] == 208013
    assert parsed.ranks == {"TP": 0}


def test_odd_spacing_inside_the_message_still_parses():
    parsed = parse_line(PREFILL_0512.replace(", #", ",  #").replace(": 4096", ":  4096"))
    assert parsed.kind == "prefill"
    assert parsed.fields["new_token"] == 4096


def test_a_wrapper_too_long_to_be_one_is_not_parsed():
    assert parse_line("x" * 200 + PREFILL_0512) is None

