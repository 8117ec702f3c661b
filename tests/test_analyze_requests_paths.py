"""analyze-requests reads records the fast way (RecordReader.feed_spans and parse_span: of a line
in SGLang's layout only its meta_info is decoded, its request_parameters only for the records
that enter the slowest). The full way, each line decoded whole by json.loads
(`parse_record(line, keep_id=True, read_params=True)`, what the analyzer did before), must give
the same report on the same records: the by-class table, the slowest with their ids and
max_new_tokens, the rejections by reason, the time range, the window and the per-minute rows;
for valid records and hostile ones, in any chunking, gzipped or not. The one difference, on
purpose and as the exporter reads: a record in SGLang's layout whose request_parameters is not a
well-formed JSON string is read from its meta_info instead of being rejected whole.
"""

import dataclasses
import gzip
import json
import random

import pytest

from sglang_obs.exporter.request_records import (
    MAX_RECORD_BYTES,
    NUMBERS,
    REJECT_REASONS,
    Record,
    RecordReader,
    max_new_tokens,
    parse_record,
    parse_span,
    request_parameters,
    safe_request_id,
)
from sglang_obs.exporter.sglang_log import LineReader
from sglang_obs.tools.analyze_requests import Analysis, ClassStats, Quantiles, analyze

MARKER = "PROMPT-MARKER-7f3a9c"
T0 = 1_785_232_800.0
PREFIX = b'{"request_parameters": "'


def later(i: int, rng: random.Random, **fields) -> dict:
    """A 0.5.23 record as SGLang lays it out (request_parameters first, then meta_info)."""
    prompt = rng.choice((rng.randint(10, 8000), rng.randint(9000, 130000),
                         rng.randint(140000, 250000)))
    queue = rng.choice((0.0, rng.expovariate(2.0), rng.expovariate(0.05)))
    ttft = queue + prompt * 1.5e-5 + rng.random() * 0.1
    out = rng.randint(0, 900)
    e2e = ttft + out * 0.03
    received = T0 + i * 0.7 + rng.random()
    text = f"{MARKER} {i} " + " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(
        0, 400)))
    params = {"text": text, "sampling_params": {"max_new_tokens": rng.choice((256, 1024, 8192)),
                                                "temperature": 0.7},
              "rid": f"{i:032x}", "stream": rng.random() < 0.5}
    if rng.random() < 0.2:
        params["input_ids"] = [rng.randint(0, 150000) for _ in range(rng.randint(0, 3000))]
    rec = {"request_parameters": json.dumps(params), "id": f"{rng.getrandbits(128):032x}",
           "finish_reason": rng.choice(({"type": "stop", "matched": 151645},
                                        {"type": "length", "length": out},
                                        {"type": "abort", "message": MARKER}, None)),
           "prompt_tokens": prompt, "weight_version": "default", "num_retractions": 0,
           "forward_entry_time": received + queue, "prefill_finished_time": received + ttft,
           "queue_time": queue, "reasoning_tokens": 0, "completion_tokens": out,
           "cached_tokens": rng.randint(0, prompt), "e2e_latency": e2e,
           "spec_accept_rate": rng.random(), "request_received_ts": received,
           "api_server_dispatch_finish_ts": received + 0.002,
           "request_finished_ts": received + e2e, "decode_throughput": rng.random() * 100,
           "response_sent_to_client_ts": received + e2e + 0.001}
    rec.update(fields)
    return {k: v for k, v in rec.items() if v is not ...}


def old(i: int, rng: random.Random) -> dict:
    """A 0.5.6-0.5.9 record (the *_ts timing fields)."""
    received = T0 + i * 0.7
    return {"request_parameters": json.dumps({"text": MARKER, "sampling_params": {
                "max_new_tokens": 64}}),
            "id": f"{rng.getrandbits(128):032x}", "finish_reason": {"type": "length"},
            "prompt_tokens": 140000, "weight_version": "default", "total_retractions": 0,
            "queue_time": 0.1, "prefill_launch_delay": 0.002, "completion_tokens": 11,
            "cached_tokens": 138000, "e2e_latency": 20.0 + rng.random(),
            "request_received_ts": received, "request_sent_to_scheduler_ts": received + 0.002,
            "prefill_finished_ts": received + 1.5 + rng.random(),
            "decode_finished_ts": received + 20.0}


def dumps(rec: dict, **kw) -> bytes:
    return json.dumps(rec, **kw).encode("utf-8", "surrogatepass")


def hostile(rng: random.Random) -> list[bytes]:
    """Lines that are wrong, odd or made to mislead, each in or near SGLang's layout."""
    a, b = dumps(later(9001, rng)), dumps(later(9002, rng))
    forged = ('", "id": "x", "prompt_tokens": 1, "e2e_latency": 0.001, '
              '"request_parameters": "", "cached_tokens": 0}')
    deep = later(9003, rng)
    lines = [
        f"garbage {MARKER}".encode(), b"[1, 2]", b"{", b"42", b'"a string"', b"", b"   ", b"\t",
        PREFIX, PREFIX + b'", "id": ', PREFIX + b'x", "id": }', PREFIX + b'x", "id": 1',
        a + b"\r",  # a CRLF file
        b"  " + a,  # leading blanks: parsed whole
        a + b" x", a + b"}", a + b"\x1c", a + b"\x00", a + b" ",  # after the object
        a[:300] + b,  # a record cut off, the next one appended to it: not_json whole
        a[:-1] + b', "request_parameters": 5}',  # a second request_parameters
        a[:-1] + b', "request_parameters": "again"}',
        a[:-1] + b', "prompt_tokens": 7}',  # a repeated key: the last one counts
        a[:-1] + b', "prompt_tokens": "7"}',
        a[:-1] + b', "id": "h\\u00e9llo"}',  # a second id, escaped
        a[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nesting too deep
        a[:-1] + b', "x": ' + b"[" * 50 + b"]" * 50 + b"}",
        a[:-1] + b', "x": ' + b"7" * 5000 + b"}",  # an int too long for int()
        a[:-1] + b', "x": NaN}', a[:-1] + b', "e2e_latency": NaN}',
        a[:-1] + b', "e2e_latency": Infinity}', a[:-1] + b', "queue_time": -Infinity}',
        a.replace(b'"id": "', b'"id": "\xff', 1),  # invalid UTF-8 in meta_info
        a.replace(b'"weight_version": "default"', b'"weight_version": "\xed\xa0\x80"'),
        a.replace(b'"weight_version": "default"', '"weight_version": "défaut ✓"'.encode()),
        a.replace(b'"finish_reason": {"type": "', b'"finish_reason": {"id": 5, "type": "'),
        b.replace(b'"id": ', b'"id" : '),  # not SGLang's separators: parsed whole
        dumps(later(9004, rng), separators=(",", ":")),
        dumps({k: v for k, v in reversed(later(9005, rng).items())}),  # another key order
        dumps(later(9006, rng, request_parameters=json.dumps({"text": forged * 3}))),
        dumps(later(9007, rng, request_parameters=json.dumps({"text": PREFIX.decode() * 2}))),
        dumps(later(9008, rng, request_parameters={"text": MARKER})),
        dumps(later(9009, rng, request_parameters=...)),
        dumps(later(9010, rng, id=...)),
        b"\xef\xbb\xbf" + a,  # a byte-order mark: json.loads reads it
    ]
    for fields in ({"prompt_tokens": "5"}, {"prompt_tokens": 4.0e4}, {"prompt_tokens": True},
                   {"prompt_tokens": -3}, {"prompt_tokens": 2**40}, {"prompt_tokens": ...},
                   {"e2e_latency": "fast"}, {"e2e_latency": -1.0}, {"e2e_latency": 1e9},
                   {"e2e_latency": None}, {"e2e_latency": 7}, {"queue_time": [1]},
                   {"queue_time": 9e9}, {"queue_time": 3}, {"completion_tokens": {"n": 1}},
                   {"completion_tokens": None}, {"cached_tokens": 10**7},
                   {"request_received_ts": 1e300}, {"request_received_ts": "now"},
                   {"request_received_ts": None}, {"request_received_ts": T0},
                   {"prefill_finished_time": T0 - 10}, {"prefill_finished_time": T0 + 1e6},
                   {"prefill_finished_time": True}, {"request_finished_ts": -1.0},
                   {"request_finished_ts": ...}, {"prefill_finished_ts": T0},
                   {"finish_reason": "stop"}, {"finish_reason": {"type": ["stop"]}},
                   {"finish_reason": 7}, {"id": 12345}, {"id": None}, {"id": ""},
                   {"id": f"client {MARKER} sk-test"},
                   {"id": "12345678-1234-1234-1234-123456789abc"}):
        lines.append(dumps(later(9100 + len(lines), rng, **fields)))
    for params in ('{"sampling_params": {"max_new_tokens": true}}',
                   '{"sampling_params": {"max_new_tokens": "5"}}',
                   '{"sampling_params": {"max_new_tokens": -1}}', "[1]", "{", "", "null",
                   json.dumps({"text": "x" * (300 * 1024), "sampling_params": {
                       "max_new_tokens": 5}}),
                   json.dumps({"text": "é ✓ \U0001f600 \n\t\"q\" \\", "sampling_params": {
                       "max_new_tokens": 77}}),
                   json.dumps({"text": "é ✓ \U0001f600", "sampling_params": {
                       "max_new_tokens": 78}}, ensure_ascii=False)):
        rec = later(9200 + len(lines), rng, request_parameters=params)
        lines.append(dumps(rec))
        lines.append(dumps(rec, ensure_ascii=False))
    deep["finish_reason"] = {"type": "stop", "matched": [[[[1]]]], "x": {"y": {"z": "w"}}}
    lines.append(dumps(deep))
    return lines


def corpus(seed: int, n: int = 600) -> list[bytes]:
    rng = random.Random(seed)
    lines = [dumps(later(i, rng)) for i in range(n)]
    lines += [dumps(old(n + i, rng)) for i in range(n // 10)]
    lines += [dumps({"request_parameters": "{}", "id": f"{i:032x}", "prompt_tokens": 9000 + i,
                     "completion_tokens": 0, "e2e_latency": 3.0 + i}) for i in range(5)]
    lines += lines[:50]  # the same records again
    for i in range(30):  # other records as slow as each other: ties in the slowest
        received = T0 + 1000 + i
        lines.append(dumps(later(n + 100 + i, rng, queue_time=0.5, request_received_ts=received,
                                 prefill_finished_time=received + 400.0, e2e_latency=450.0,
                                 request_finished_ts=received + 450.0)))
    lines += hostile(rng)
    rng.shuffle(lines)
    return lines


def full_path(data: bytes, chunk: int = 1 << 20, **kw) -> Analysis:
    """What the analyzer did before: whole lines (LineReader), each decoded whole."""
    a = Analysis(**kw)
    reader = LineReader(MAX_RECORD_BYTES)
    for at in range(0, len(data), chunk):
        for line in reader.feed(data[at:at + chunk]):
            if line.strip():
                a.feed(parse_record(line, keep_id=True, read_params=True))
    a.rejected["too_long"] += reader.too_long
    last = reader.finish()
    if last is not None and last.strip():
        a.feed(parse_record(last, keep_id=True, read_params=True))
    return a


def fast_path(data: bytes, chunk: int = 1 << 20, **kw) -> Analysis:
    """What the analyzer does (analyze_requests.read), in chunks of `chunk` bytes."""
    a = Analysis(**kw)
    reader = RecordReader(MAX_RECORD_BYTES)
    for at in range(0, len(data), chunk):
        a.read_spans(reader.feed_spans(data[at:at + chunk]))
    a.rejected["too_long"] += reader.too_long
    last = reader.finish()
    if last is not None:
        a.read_spans([(last, 0, len(last))])
    return a


def report(a: Analysis) -> tuple:
    doc = a.document()
    doc["rejected"] = {k: v for k, v in doc["rejected"].items() if v}
    return doc, a.outside, list(a.per_minute_rows()) if a.per_minute else None


def test_the_same_report_on_valid_and_hostile_records():
    lines = corpus(1)
    data = b"\n".join(lines) + b"\n"
    full = report(full_path(data, top=25))
    assert full == report(fast_path(data, top=25))
    doc = full[0]
    # The corpus is what it says: most records read, every way of being wrong present.
    assert doc["records"] > 600
    assert set(doc["rejected"]) == set(REJECT_REASONS) - {"too_long"}
    assert len(doc["slowest"]) == 25
    assert {s["max_new_tokens"] for s in doc["slowest"]} - {None}
    assert MARKER not in json.dumps(full)


@pytest.mark.parametrize("top", [0, 1, 3, 10, 200, 5000])
def test_the_same_slowest_whatever_their_number(top):
    data = b"\n".join(corpus(2)) + b"\n"
    assert report(full_path(data, top=top)) == report(fast_path(data, top=top))


@pytest.mark.parametrize("chunk", [1, 7, 100, 4095, 4096, 65536, 1 << 20])
def test_the_same_report_in_any_chunking(chunk):
    lines = corpus(3, n=150)
    data = b"\n".join(lines)  # no newline after the last line
    expected = report(full_path(data, top=10))
    assert report(fast_path(data, chunk=chunk, top=10)) == expected


def test_the_same_report_in_a_window_and_without_the_per_minute_table():
    data = b"\n".join(corpus(4)) + b"\n"
    window = {"start": T0 + 60.0, "end": T0 + 300.0}
    full = report(full_path(data, top=10, **window))
    assert full == report(fast_path(data, top=10, **window))
    assert full[1] > 0  # records outside the window
    fast = fast_path(data, top=10, per_minute=False, **window)
    assert report(fast) == (*full[:2], None)
    assert fast.minutes == {}
    with pytest.raises(ValueError, match="per_minute"):
        list(fast.per_minute_rows())


def test_values_counted_in_a_batch_fall_in_the_buckets_they_fall_in_one_by_one():
    edges = [0.0, 5e-324, 1e-10, 1e-9, 1.0000000000000002e-9, 2e-9, 1.0, 1.01, 1.01**-7,
             1.01**300, 0.01, 1e300, 7.0, 123.456]
    rng = random.Random(9)
    values = edges + [rng.lognormvariate(0, 3) for _ in range(2000)]
    one, batch = ClassStats(), ClassStats()
    for v in values:
        one.add_numbers(3, 1, v, v, v, v)
    batch.add_batch([3] * len(values), [1] * len(values), values, values, values, values)
    assert (one.requests, one.prompt_tokens, one.cached_tokens) == (
        batch.requests, batch.prompt_tokens, batch.cached_tokens) == (len(values),
                                                                      3 * len(values),
                                                                      len(values))
    for key in ("e2e", "ttft", "queue", "tpot"):
        assert getattr(one, key).counts == getattr(batch, key).counts, key
    q = Quantiles()
    for v in values:
        q.add(v)
    assert q.counts == one.e2e.counts
    assert q.counts[-10**9] == 4  # up to 1e-9: the zero bucket


def test_long_lines_the_same_in_both():
    """A line over MAX_RECORD_BYTES is too_long unread; a 4 MB prompt among the slowest is not
    decoded for its max_new_tokens (over MAX_PARAMS_CHARS: none) in either path."""
    rng = random.Random(5)
    huge = dumps(later(1, rng, request_parameters=json.dumps({"text": "x" * MAX_RECORD_BYTES})))
    slow = dumps(later(2, rng, request_parameters=json.dumps({"text": "y" * (4 << 20),
                                                              "sampling_params": {
                                                                  "max_new_tokens": 9}}),
                       request_received_ts=T0, prefill_finished_time=T0 + 600.0,
                       e2e_latency=700.0, queue_time=1.0, request_finished_ts=T0 + 700.0))
    lines = [dumps(later(i, rng)) for i in range(20)]
    data = b"\n".join(lines[:10] + [huge, slow] + lines[10:]) + b"\n"
    full = report(full_path(data, top=5))
    assert full[0]["rejected"] == {"too_long": 1}
    assert full[0]["slowest"][0]["ttft_seconds"] == 600.0
    assert full[0]["slowest"][0]["max_new_tokens"] is None
    assert report(fast_path(data, chunk=3 << 20, top=5)) == full


def test_files_plain_and_gzipped_read_by_analyze(tmp_path):
    lines = corpus(6)
    half = len(lines) // 2
    first, second = b"\n".join(lines[:half]) + b"\n", b"\n".join(lines[half:]) + b"\n"
    d = tmp_path / "records"
    d.mkdir()
    with gzip.open(d / "sglang-request-metrics-20260728_10.log.gz", "wb") as f:
        f.write(first)
    (d / "sglang-request-metrics-20260728_11.log").write_bytes(second)
    got = analyze([str(d)], top=10)
    expected = full_path(first + second, top=10)
    expected.files = got.files
    assert report(got) == report(expected)


def x_is_a_json_string(line: bytes) -> bool:
    """Whether a line in SGLang's layout has a well-formed JSON string before its last
    `", "id": ` (or is not in that layout at all): then the fast path reads it as json.loads."""
    line = line.strip()
    cut = line.rfind(b'", "id": ')
    if not line.startswith(PREFIX) or cut < len(PREFIX):
        return True
    try:
        text = line[len(PREFIX) - 1:cut + 1].decode("utf-8", "surrogatepass")
        _, end = json.decoder.scanstring(text, 1)
    except ValueError:
        return False
    return end == len(text)


def test_the_numbers_are_the_fields_of_a_record_in_order():
    assert NUMBERS[:12] == tuple(f.name for f in dataclasses.fields(Record))[:12]


def fast_record(line: bytes) -> Record | str:
    n = parse_span(line, 0, len(line))
    if isinstance(n, str):
        return n
    params = n[13] if n[13] is not None else request_parameters(line)
    return Record(*n[:12], safe_request_id(n[12]),
                  None if params is None else max_new_tokens(params))


def test_mutated_records_read_the_same_wherever_request_parameters_is_a_string():
    rng = random.Random(7)
    base = [dumps(later(i, rng)) for i in range(40)] + [dumps(old(50, rng))]
    compared = 0
    for _ in range(4000):
        raw = bytearray(rng.choice(base))
        # Half of them in meta_info only (the fast path's own part), half anywhere.
        low = raw.rfind(b'", "id": ') if rng.random() < 0.5 else 0
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(low, len(raw))] = rng.choice(
                (rng.randrange(256), *b'"\\{}[],: 0-.eE\n\x00'))
        for line in bytes(raw).split(b"\n"):
            if not line.strip():
                continue
            if x_is_a_json_string(line):
                compared += 1
                assert fast_record(line) == parse_record(line, keep_id=True,
                                                         read_params=True), line
    assert compared > 3000


def test_a_request_parameters_that_is_not_a_json_string_is_read_from_its_meta_info():
    """The one difference, as the exporter reads: the text before the last `", "id": ` is
    not decoded, so a malformed prompt does not cost the record its numbers (the full path
    rejects the whole line); its max_new_tokens is then unknown."""
    rng = random.Random(8)
    good = dumps(later(1, rng))
    cut = good.rfind(b'", "id": ')
    meta = good[cut:]
    for prompt in (b"bad \\x escape", b"raw \x01 control", b"bad \xff utf-8",
                   b'{\\"sampling_params\\": {\\"max_new_tokens\\": 5}}", "prompt_tokens": 1, "x'):
        line = PREFIX + prompt + meta
        assert parse_record(line, keep_id=True, read_params=True) == "not_json"
        fast = fast_record(line)
        assert isinstance(fast, Record)
        assert fast.max_new_tokens is None
        assert fast.prompt_tokens == json.loads(good)["prompt_tokens"]
        assert fast == parse_record(line, keep_id=True)  # the exporter's reading
