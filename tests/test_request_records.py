"""SGLang's per-request records read as numbers: every field a release writes, every way a
record can be wrong (each a reject reason, never an exception), no text of a record kept, the
prompt-length classes, and the series the collector builds from them."""

import json
import math
import random

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.catalogue import request_series_per_server
from sglang_obs.exporter.collector import GuardedCollector, RequestCollector
from sglang_obs.exporter.request_records import (
    FINISH_REASONS,
    MAX_RECORD_BYTES,
    PROMPT_CLASS_BOUNDS,
    PROMPT_CLASSES,
    REJECT_REASONS,
    TIMING_0_5_6,
    TIMING_LATER,
    Record,
    RecordReader,
    RequestStats,
    parse_record,
    prompt_class,
    safe_request_id,
)
from sglang_obs.simulator.model import Request, ServerConfig
from sglang_obs.simulator.profiles import Profile
from sglang_obs.simulator.records import PROMPT_MARKER, line, record

from conftest import ROOT

MARKER = "PROMPT-MARKER-7f3a9c"
T0 = 1764410400.0


def later(**fields):
    """A 0.5.10+ record (observability/req_time_stats.py timing fields), as SGLang lays it out."""
    rec = {"request_parameters": json.dumps({"text": MARKER, "sampling_params":
                                                 {"max_new_tokens": 256}}),
           "id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
           "finish_reason": {"type": "stop", "matched": 151645}, "prompt_tokens": 40000,
           "weight_version": "default", "num_retractions": 0,
           "forward_entry_time": T0 + 2.0, "prefill_finished_time": T0 + 5.0,
           "queue_time": 1.9, "prefill_waiting_latency": 0.002,
           "prefill_launch_latency": 0.004, "completion_tokens": 101, "cached_tokens": 30000,
           "e2e_latency": 15.0, "request_received_ts": T0,
           "api_server_dispatch_finish_ts": T0 + 0.002, "request_finished_ts": T0 + 15.0,
           "inference_time": 13.0, "decode_throughput": 10.0}
    rec.update(fields)
    return {k: v for k, v in rec.items() if v is not ...}


def old(**fields):
    """A 0.5.6-0.5.9 record (managers/tokenizer_manager.py `_calculate_timing_metrics`)."""
    rec = {"request_parameters": json.dumps({"text": MARKER}),
           "id": "1a2b3c4d5e6f708192a3b4c5d6e7f809", "finish_reason": {"type": "length"},
           "prompt_tokens": 140000, "weight_version": "default", "total_retractions": 0,
           "queue_time": 0.1, "prefill_launch_delay": 0.002, "prefill_launch_latency": 0.004,
           "completion_tokens": 11, "cached_tokens": 138000, "e2e_latency": 20.0,
           "request_received_ts": T0, "request_sent_to_scheduler_ts": T0 + 0.002,
           "prefill_finished_ts": T0 + 1.5, "response_sent_to_client_ts": T0 + 20.0,
           "decode_finished_ts": T0 + 20.0}
    rec.update(fields)
    return {k: v for k, v in rec.items() if v is not ...}


def parse(rec, **kw):
    return parse_record(json.dumps(rec).encode(), **kw)


# -- what is read --------------------------------------------------------------------------------
def test_a_later_release_record_gives_ttft_queue_tpot_and_its_class():
    r = parse(later())
    assert isinstance(r, Record)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (40000, 101, 30000)
    assert r.ttft_seconds == pytest.approx(5.0)  # prefill_finished_time - request_received_ts
    assert r.queue_seconds == pytest.approx(1.9)
    assert r.tpot_seconds == pytest.approx((15.0 - 5.0) / 100)
    assert (r.prompt_class, r.finish_reason, r.release) == ("32k_128k", "stop", "later")
    assert r.finished_at == pytest.approx(T0 + 15.0)
    assert r.prefill_seconds == pytest.approx(3.1)
    assert r.decode_seconds == pytest.approx(10.0)
    assert r.request_id is None
    assert r.max_new_tokens is None


def test_a_0_5_6_record_reads_its_ts_fields():
    r = parse(old())
    assert (r.release, r.prompt_class, r.finish_reason) == ("0.5.6", "ge_128k", "length")
    assert r.ttft_seconds == pytest.approx(1.5)  # prefill_finished_ts - request_received_ts
    assert r.finished_at == pytest.approx(T0 + 20.0)  # decode_finished_ts


def test_a_record_without_timing_fields_still_counts_with_its_e2e():
    rec = {"request_parameters": "{}", "id": "x", "finish_reason": {"type": "abort",
                                                                     "message": MARKER},
           "prompt_tokens": 9000, "completion_tokens": 0, "cached_tokens": 0, "e2e_latency": 3.0}
    r = parse(rec)
    assert (r.release, r.prompt_class, r.finish_reason) == ("untimed", "8k_32k", "abort")
    assert r.ttft_seconds is r.queue_seconds is r.tpot_seconds is r.finished_at is None
    assert r.e2e_seconds == 3.0


def test_class_bounds_are_the_thresholds_file_and_every_edge_falls_right():
    t = yaml.safe_load((ROOT / "prometheus/thresholds.yml").read_text())
    assert tuple(t["request_classes"]["prompt_tokens_bounds"]) == PROMPT_CLASS_BOUNDS
    cases = {0: "lt_8k", 8191: "lt_8k", 8192: "8k_32k", 32767: "8k_32k", 32768: "32k_128k",
             131071: "32k_128k", 131072: "ge_128k", 2**31: "ge_128k"}
    assert {n: prompt_class(n) for n in cases} == cases
    assert len(PROMPT_CLASSES) == len(PROMPT_CLASS_BOUNDS) + 1


@pytest.mark.parametrize(("value", "expected"), [
    ({"type": "stop", "matched": "</s>"}, "stop"), ({"type": "length", "length": 5}, "length"),
    ({"type": "abort", "message": MARKER}, "abort"), ({"type": MARKER}, "other"),
    ("stop", "stop"), (None, "other"), (7, "other"), ({"matched": "stop"}, "other"),
    ({"type": ["stop"]}, "other")])
def test_finish_reasons_map_to_a_fixed_set(value, expected):
    r = parse(later(finish_reason=value))
    assert r.finish_reason == expected
    assert expected in FINISH_REASONS


def test_tpot_only_for_stop_or_length_and_more_than_one_token():
    assert parse(later(completion_tokens=1)).tpot_seconds is None
    assert parse(later(finish_reason={"type": "abort"})).tpot_seconds is None
    assert parse(later(prefill_finished_time=...)).tpot_seconds is None


def test_max_new_tokens_and_the_id_only_for_local_reports():
    r = parse(later(), keep_id=True, read_params=True)
    assert r.max_new_tokens == 256
    assert r.request_id == "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    # A client may set its own id: anything but SGLang's uuid form is hashed.
    hashed = parse(later(id=f"user {MARKER} sk-test-1234567890"), keep_id=True).request_id
    assert hashed.startswith("h:")
    assert MARKER not in hashed
    assert len(hashed) == 18
    assert safe_request_id("12345678-1234-1234-1234-123456789abc") == (
        "12345678-1234-1234-1234-123456789abc")
    assert safe_request_id(5) is None
    assert safe_request_id("") is None
    # max_new_tokens of a bool, a string or a huge request_parameters is not read.
    for params in ('{"sampling_params": {"max_new_tokens": true}}',
                   '{"sampling_params": {"max_new_tokens": "5"}}', "[1]", "{",
                   json.dumps({"text": "x" * (300 * 1024), "sampling_params": {
                       "max_new_tokens": 5}})):
        assert parse(later(request_parameters=params), read_params=True).max_new_tokens is None


# -- what is rejected ----------------------------------------------------------------------------
REJECTS = [
    (later(e2e_latency=...), "missing_field"),
    (later(prompt_tokens=...), "missing_field"),
    (later(e2e_latency=None), "missing_field"),
    (later(prompt_tokens="40000"), "wrong_type"),
    (later(prompt_tokens=4.0e4), "wrong_type"),
    (later(prompt_tokens=True), "wrong_type"),
    (later(e2e_latency="fast"), "wrong_type"),
    (later(queue_time=[1]), "wrong_type"),
    (later(completion_tokens={"n": 1}), "wrong_type"),
    (later(e2e_latency=float("nan")), "not_finite"),
    (later(queue_time=float("inf")), "not_finite"),
    (later(request_received_ts=float("-inf")), "not_finite"),
    (later(e2e_latency=-1.0), "negative"),
    (later(queue_time=-0.5), "negative"),
    (later(prompt_tokens=-3), "negative"),
    (later(cached_tokens=-1), "negative"),
    (later(prefill_finished_time=T0 - 1), "negative"),  # first token before the request
    (later(prompt_tokens=2**40), "out_of_range"),
    (later(e2e_latency=1e9), "out_of_range"),
    (later(cached_tokens=50000), "out_of_range"),  # more cached than prompt tokens
    (later(prefill_finished_time=T0 + 100), "out_of_range"),  # TTFT > e2e
    (later(queue_time=9.0), "out_of_range"),  # queued longer than its TTFT
    (later(request_received_ts=1e300), "out_of_range"),
    (later(request_parameters=...), "unknown_release"),
    (later(request_parameters={"text": MARKER}), "unknown_release"),
    (later(prefill_finished_ts=T0 + 1), "unknown_release"),  # two releases' fields at once
]


@pytest.mark.parametrize(("rec", "reason"), REJECTS, ids=[r for _, r in REJECTS])
def test_a_bad_record_is_a_reason_never_an_exception(rec, reason):
    assert reason in REJECT_REASONS
    assert parse(rec) == reason
    assert parse(rec, keep_id=True, read_params=True) == reason


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[1, 2]", b'"a string"', b"42", b"{", b'{"request_parameters": "',
    b"\xff\xfe\x00garbage", b"[" * 100_000 + b"]" * 100_000, b'{"e2e_latency": 1' + b"0" * 5000,
    b'{"request_parameters": "x", "id": ' + b"9" * 5000 + b"}"])
def test_garbage_is_not_json(raw):
    assert parse_record(raw) in ("not_json", "missing_field")


def test_a_line_over_the_limit_is_too_long_unread():
    assert parse_record(b"x" * (MAX_RECORD_BYTES + 1)) == "too_long"


def test_the_prompt_cannot_fake_the_numbers():
    """SGLang's layout is read without decoding request_parameters: its meta_info starts at the
    last `", "id": `. A prompt that holds that text, escaped as any JSON string must be, cannot
    move the cut: the numbers are the record's own."""
    forged = ('", "id": "x", "prompt_tokens": 1, "e2e_latency": 0.001, '
              '"request_parameters": "", "cached_tokens": 0}')
    rec = later(request_parameters=json.dumps({"text": forged * 3 + MARKER}))
    r = parse(rec)
    assert (r.prompt_tokens, r.e2e_seconds) == (40000, 15.0)
    # The same without SGLang's key order (a full parse) reads the same.
    reordered = {k: rec[k] for k in reversed(rec)}
    assert parse(reordered) == r


def test_random_bytes_and_mutated_records_never_raise():
    rng = random.Random(19)
    base = json.dumps(later()).encode()
    for _ in range(3000):
        raw = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(raw))
            raw[i] = rng.randrange(256)
        result = parse_record(bytes(raw))
        assert isinstance(result, Record) or result in REJECT_REASONS
        result = parse_record(bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))))
        assert result in REJECT_REASONS


# -- the simulator writes what the parser reads, per release ---------------------------
@pytest.mark.parametrize(("release", "family"), [
    ("0.4.6.post5", None), ("0.5.5", None), ("0.5.8", "0.5.6"), ("0.5.12", "later"),
    ("0.5.23", "later")])
def test_simulator_records_per_release_parse(release, family):
    profile = Profile(release)
    assert profile.request_records == family
    req = Request(rid=3, arrival=10.0, input_len=50000, cached_fraction=0.5, output_len=400,
                  max_new_tokens=400)
    req.cached_len, req.generated = 20000, 400.0
    req.scheduled_at, req.first_token_at = 12.0, 14.0
    rec = record(req, 30.0, T0, profile, ServerConfig(speculative_algorithm="NEXTN",
                                                      spec_accept_length=2.0), seed=5)
    if family is None:
        assert rec is None
        return
    assert PROMPT_MARKER in json.loads(rec["request_parameters"])["text"]
    assert list(rec)[:2] == ["request_parameters", "id"]  # SGLang's layout: the fast path
    r = parse_record(line(rec).encode(), keep_id=True, read_params=True)
    assert isinstance(r, Record), r
    assert r.release == ("0.5.6" if family == "0.5.6" else "later")
    assert r.ttft_seconds == pytest.approx(4.0)
    assert r.e2e_seconds == pytest.approx(20.0)
    assert r.finish_reason == "length"
    assert r.max_new_tokens == 400
    assert r.request_id == rec["id"]
    assert len(r.request_id) == 32
    assert ("num_retractions" in rec) == profile.at_least("0.5.12")


# -- the collector ---------------------------------------------------------------------------
class _Source:
    server, up, rotations = "10.0.0.5:30000", True, 0

    def __init__(self):
        self.stats = RequestStats()


def test_every_class_is_exposed_from_the_start_and_the_count_is_the_documented_one():
    source = _Source()
    registry = CollectorRegistry()
    registry.register(GuardedCollector([RequestCollector([source], lambda s: "m")]))

    def series():
        return sum(len(f.samples) for f in registry.collect()
                   if f.name.startswith("sglang_obs_request_"))

    # Before any record only the last-finished time is missing.
    assert series() == request_series_per_server() - 1
    source.stats.feed_line(json.dumps(later()).encode())
    assert series() == request_series_per_server()
    source.stats.feed_line(b"garbage " + MARKER.encode())
    assert series() == request_series_per_server() + 1  # one per reject reason seen
    text = generate_latest(registry).decode()
    assert MARKER not in text
    assert ('sglang_obs_request_ttft_seconds_bucket{le="8.0",model_name="m",'
            'prompt_class="32k_128k",server="10.0.0.5:30000"} 1.0') in text
    assert ('sglang_obs_request_finished_total{finish_reason="stop",model_name="m",'
            'prompt_class="32k_128k",server="10.0.0.5:30000"} 1.0') in text
    assert ('sglang_obs_request_records_rejected_total{reason="not_json",'
            'server="10.0.0.5:30000"} 1.0') in text
    assert 'sglang_obs_request_cached_tokens_total{model_name="m",prompt_class="32k_128k"' in text
    values = [s.value for f in registry.collect() for s in f.samples]
    assert all(math.isfinite(v) for v in values)


def test_a_rejection_is_logged_once_per_reason_without_the_record(caplog):
    stats = RequestStats(where="/srv/records")
    for _ in range(50):
        stats.feed_line(f"garbage {MARKER}".encode())
        stats.feed_line(json.dumps(later(e2e_latency=-1)).encode())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert all("/srv/records" in w and MARKER not in w for w in warnings)
    assert stats.snapshot().rejected == {"not_json": 50, "negative": 50}


def test_the_record_reader_parses_as_whole_lines_would_in_any_chunking():
    """RecordReader hands out records without their request_parameters: whatever the chunk
    boundaries, the parsed records (and the too-long count) are those of whole lines."""
    rng = random.Random(11)
    lines = [json.dumps(later(prompt_tokens=rng.randint(1, 200000),
                              request_parameters=json.dumps({"text": MARKER * rng.randint(
                                  0, 2000)}))) for _ in range(40)]
    lines += [json.dumps(old()), f"garbage {MARKER}", "", "  ", "{" * 50,
              '{"request_parameters": "", "id": 1, "prompt_tokens": 1, "e2e_latency": 1}',
              '{"request_parameters": "x", "prompt_tokens": 2, "e2e_latency": 1}']
    rng.shuffle(lines)
    huge = "x" * 5000
    stream = ("\n".join(lines[:20] + [huge] + lines[20:]) + "\n").encode()
    expected = [parse_record(line.encode()) for line in lines if line and not line.isspace()]
    for _ in range(30):
        reader = RecordReader(max_line=4096)
        got, i = [], 0
        while i < len(stream):
            step = rng.choice((1, 7, 100, 4095, 4096, 4097, 10_000, 100_000))
            got += [parse_record(line) for line in reader.feed(stream[i:i + step])
                    if line and not line.isspace()]
            i += step
        assert got == [
            e for e, line in zip(expected, [x for x in lines if x and not x.isspace()],
                                 strict=True) if len(line) <= 4096]
        assert reader.too_long == 1 + sum(len(x) > 4096 for x in lines)


def test_each_timing_field_marks_its_release():
    untimed = {"request_parameters": "{}", "id": "x", "prompt_tokens": 5, "e2e_latency": 1.0}
    for key in TIMING_0_5_6:
        value = 0.001 if key.endswith("delay") else T0
        assert parse({**untimed, key: value}).release == "0.5.6", key
    for key in TIMING_LATER:
        value = 0.001 if key.endswith("latency") else T0
        assert parse({**untimed, key: value}).release == "later", key
    assert parse(untimed).release == "untimed"
