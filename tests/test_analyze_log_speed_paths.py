"""`sglang-obs analyze-log`'s fast path (a batch line in a layout seen before, read by one strict
regex: exporter.sglang_log.BatchLayouts) gives exactly what its slow path (parse_line on every
line) gives: line by line, and for the whole report, on the lines of every release and on odd
ones made to trip it."""

import random
from datetime import datetime, timezone

import pytest
from test_sglang_log import VARIANTS

from sglang_obs.exporter import sglang_log
from sglang_obs.exporter.sglang_log import BatchLayouts, parse_line
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.events import DecodeBatch, PrefillBatch
from sglang_obs.simulator.logs import RELEASES, format_event
from sglang_obs.simulator.simulation import Simulation
from sglang_obs.tools.analyze_log import FAST_FIELDS, Analysis, analyze

START = 1_785_232_800.0  # 2026-07-28 10:00:00 UTC


def rendered(release, seconds=240, **kw):
    events = []
    sim = Simulation(scenarios.load("long-context-incident"), start_ts=START,
                     on_event=events.append)
    sim.advance(seconds)
    return [format_event(e, release, **kw) for e in events]


def report(analysis):
    analysis.finish()
    return analysis.document(), list(analysis.per_minute_rows())


def both(lines):
    """The report of the same byte lines, fast path on and off."""
    fast, slow = Analysis(), Analysis(learn_layouts=0)
    fast.feed_lines(lines)
    slow.feed_lines(lines)
    return fast, report(fast), report(slow)


def fast_read(layouts, line):
    """What the fast path reads of a line: (kind, time, DP rank, fields) or None."""
    read = layouts.read(line)
    if read is None:
        return None
    prefill, (hhmm, second, millis, ranks, *values) = read
    try:
        ts = datetime.strptime((hhmm + b":" + second).decode(), "%Y-%m-%d %H:%M:%S").replace(
            microsecond=int(millis) * 1000 if millis else 0)
    except ValueError:
        ts = None
    fields = {}
    for name, value in zip(FAST_FIELDS, values, strict=True):
        if value is not None:
            fields[name] = float(value) if name == "gen_throughput" else int(value)
    return ("prefill" if prefill else "decode"), ts, BatchLayouts.dp_rank(ranks), fields


def assert_line_agrees(layouts, line):
    """A line the fast path reads, parse_line reads the same: kind, time, DP rank, values."""
    fast = fast_read(layouts, line)
    if fast is None:
        return False
    parsed = parse_line(line.rstrip(b"\r"))
    assert parsed is not None, line
    kind, ts, rank, fields = fast
    assert (kind, ts, rank) == (parsed.kind, parsed.ts, parsed.ranks.get("DP", 0)), line
    for name in FAST_FIELDS:
        assert fields.get(name) == parsed.fields.get(name), (name, line)
        if name in fields:
            assert type(fields[name]) is type(parsed.fields[name]), (name, line)
    return True


def odd_versions(line: str) -> list[str]:
    """A batch line made odd in every way that matters to a reader."""
    head, sep, msg = line.partition("] ")
    stamp = head[1:20]
    odd = [
        line + "\r", line + "\r\r", line + ", ", line + " ", line + ",", line + " extra",
        line + ", #queue-req: 7",  # a key twice: the later one counts
        line + ", #queue-req: 7x",  # ...a malformed one: not a batch line
        line + ", some field: some text", line + ", text without a colon",
        line.replace(", ", ",  ", 1), line.replace(": ", ":  ", 1), line.replace(": ", " : ", 1),
        line.replace(", ", ", , ", 1),
        line.replace(" batch, ", " batch [12], ").replace(" batch. ", " batch [12]. "),
        line.replace(" batch, ", " batch,        ").replace(" batch. ", " batch.        "),
        line.replace(" batch, ", " batch,         ").replace(" batch. ", " batch.         "),
        line.replace(" batch, ", " batch, " + " " * 5000),
        line.replace(" batch, ", " batch. ").replace(" batch. ", " batch, "),
        line.replace(stamp, stamp + ".123"), line.replace(stamp, stamp[:-2] + "60"),
        line.replace(stamp, "2026-02-30" + stamp[10:]),
        line.replace(stamp, "2026-13-01" + stamp[10:]),
        line.replace(stamp, stamp[:11] + "24" + stamp[13:]),
        line.replace(stamp, "0000" + stamp[4:]),
        head + " DP1" + sep + msg, head + " DP1 DP2" + sep + msg, head + " MOE_DP3" + sep + msg,
        head + " DP007 EP1" + sep + msg, head + " XX1" + sep + msg, head + " TP1234567" + sep + msg,
        "sglang-1  | " + line, "2026-11-29T11:51:14.123456789Z stdout F " + line,
        "Nov 29 11:51:14 host python[123]: " + line, "sglang-é  | " + line,
        "  " + line, "x" + line, "prompt text " + line,
        line.replace("#queue-req: ", "#queue-req: \u0663"), line + " é",
    ]
    for key in ("#new-seq", "#new-token", "#cached-token", "#running-req", "#queue-req",
                "#pending-token", "#token", "token usage", "gen throughput (token/s)",
                "cuda graph"):
        at = msg.find(key + ": ")
        if at < 0:
            continue
        start = len(head) + len(sep) + at + len(key) + 2
        end = line.find(",", start)
        end = len(line) if end < 0 else end
        for value in ("", "12x", "1e5", "nan", "-1", " 5", "5 ", "9" * 19, "9" * 18, "01",
                      "1.", ".5", "1.5", "1", "True", "maybe", "0" * 18 + ".5"):
            odd.append(line[:start] + value + line[end:])
        odd.append(line[:start - len(key) - 2] + line[end + 2:])  # the field left out
    return odd


def corpus():
    lines = [ln for release in RELEASES for ln in rendered(release, 120)]
    lines += rendered("0.5.23", 120, dp_size=2, tp_size=2, log_ms=True)
    lines += [line for line, _, _ in VARIANTS]
    return lines


def test_every_release_reads_the_same_fast_and_slow():
    for release in RELEASES:
        for kw in ({}, {"tp_size": 4}, {"dp_size": 4, "tp_size": 2, "log_ms": True}):
            lines = [ln.encode() for ln in rendered(release, **kw)]
            fast, want, got = both(lines)
            assert got == want, (release, kw)
            batch = sum(b" batch" in ln for ln in lines)
            assert len(fast.layouts.layouts) >= 2  # one prefill, one decode layout at least
            assert sum(fast_read(fast.layouts, ln) is not None for ln in lines) > batch - 10


def test_what_the_fast_path_reads_parse_line_reads_the_same():
    """Every odd version of every batch line: the fast path reads it as parse_line does, or
    leaves it to parse_line."""
    layouts = BatchLayouts(FAST_FIELDS, limit=32)
    lines = [ln.encode() for ln in corpus()]
    for line in lines:
        layouts.learn(line, parse_line(line))
    batch = [ln.decode() for ln in lines if (p := parse_line(ln)) and p.kind in ("prefill",
                                                                                  "decode")]
    unread = [ln for ln in batch if not assert_line_agrees(layouts, ln.encode())]
    assert unread == [VARIANTS[0][0]]  # a blank after its last value: parse_line reads it
    read = unread = 0
    for line in batch[::7]:
        for odd in odd_versions(line):
            for raw in (odd.encode("utf-8"), odd.encode("utf-8").replace("é".encode(), b"\xe9")):
                if assert_line_agrees(layouts, raw):
                    read += 1
                else:
                    unread += 1
    assert read > 1000, (read, unread)
    assert unread > 1000, (read, unread)


def test_layouts_learned_from_odd_lines_still_agree():
    """Layouts learned from the odd lines too (a key twice, leading zeros, ...)."""
    layouts = BatchLayouts(FAST_FIELDS, limit=1000, tries=100_000)
    lines = [ln for line in corpus()[::5] if " batch" in line for ln in odd_versions(line)]
    raw = [ln.encode("utf-8") for ln in lines]
    for line in raw:
        layouts.learn(line.rstrip(b"\r"), parse_line(line.rstrip(b"\r")))
    assert len(layouts.layouts) > 20
    assert sum(assert_line_agrees(layouts, line) for line in raw) > 1000
    _, want, got = both(raw)
    assert got == want


def test_a_known_key_where_a_layout_has_an_ignored_pair_is_not_ignored():
    """A layout with a pair parse_line ignores (a newer field) must not read past a known key
    in that place: parse_line reads that one (or finds it malformed)."""
    prefill, decode = (next(ln for ln in rendered("0.5.12", 60) if kind in ln)
                       for kind in ("Prefill batch", "Decode batch"))
    for line, table in ((prefill, "prefill"), (decode, "decode")):
        layouts = BatchLayouts(FAST_FIELDS)
        assert layouts.learn((line + ", est. TFLOPS/s (per GPU): 1.5").encode(),
                             parse_line(line + ", est. TFLOPS/s (per GPU): 1.5"))
        keys = (sglang_log._PREFILL if table == "prefill" else sglang_log._DECODE)
        values = ("7", "7.5", "True", "x", " 7", "")
        read = 0
        for key in keys:
            for value in values:
                for pair in (f"{key}: {value}", f" {key}: {value}", f"{key} : {value}",
                             f"{key}\t: {value}", f"{key.upper()}: {value}"):
                    read += assert_line_agrees(layouts, f"{line}, {pair}".encode())
        assert read == len(keys) * len(values)  # only the upper-case (unknown) keys read past


P = ("Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token usage: 0.10, "
     "#running-req: 1, #queue-req: {queue}, #pending-token: {pending}, cuda graph: False, "
     "input throughput (token/s): 1.00")
D = ("Decode batch, #running-req: {running}, #token: {token}, token usage: 0.20, "
     "cuda graph: True, gen throughput (token/s): {gen}, #queue-req: {queue}")
HAND = [
    "[2026-07-28 10:00:00.500 DP0 TP0] " + P.format(new=100, cached=50, queue=2, pending=300),
    "[2026-07-28 10:00:10 DP1 TP0] " + D.format(running=3, token=900, gen="10.00", queue=2),
    "[2026-07-28 09:59:59 DP0 TP0] " + D.format(running=3, token=900, gen="20.00", queue=0),
    "[2026-07-28 10:01:30.250 DP1 TP0] " + D.format(running=2, token=500, gen="30.00", queue=0),
    "[2026-07-28 10:03:00 DP0 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
    "#new_tokens_gained: 10, #new_token_ratio: 0.5000 -> 0.7000",
    "[2026-02-30 10:00:00 TP0] " + P.format(new=7, cached=7, queue=9, pending=9999),
    "Traceback (most recent call last):",
    "[2026-07-28 10:04:00 DP0 TP0] " + P.format(new=100, cached=5, queue=1, pending=300),
]


def test_a_hand_made_log_gives_the_known_report():
    """Worked out by hand (and the same as before the fast path): ties keep the first line,
    a line earlier than the last moves only `from`, queueing runs are per DP rank (one closed
    by a line printed earlier than it began counts for nothing), an impossible date is only
    counted, the peaks keep their int values."""
    _, (doc, rows), slow = both([ln.encode() for ln in HAND])
    assert (doc, rows) == slow
    assert doc["lines"] == {"total": 8, "decode": 3, "prefill": 3, "retraction": 1,
                            "unparsed": 1, "too_long": 0}
    assert doc["time_range"] == {"from": "2026-07-28 09:59:59", "to": "2026-07-28 10:04:00"}
    assert doc["context_tokens"] == {"requests": 2, "chunked": 0, "chunk_size": None,
                                     "mean": 127.5, "median": 127.5, "max": 150, "first": 150,
                                     "last": 105}
    assert doc["prefill_tokens"] == {"new": 200, "cached": 55, "cache_hit_ratio": 55 / 255}
    assert doc["peaks"] == {
        "pending_tokens": {"value": 300, "at": "2026-07-28 10:00:00.500000"},
        "queue_requests": {"value": 2, "at": "2026-07-28 10:00:00.500000"},
        "running_requests": {"value": 3, "at": "2026-07-28 10:00:10"},
        "full_tokens": {"value": 900, "at": "2026-07-28 10:00:10"}}
    assert all(type(p["value"]) is int for p in doc["peaks"].values())
    assert doc["longest_queueing"] == {"seconds": 80.25, "from": "2026-07-28 10:00:10"}
    assert doc["retracted_requests"] == 2
    assert [(w["from"], w["to"], w["queue_peak"], w["full_token_peak"])
            for w in doc["pressure_windows"]] == [
        ("2026-07-28 10:00:00", "2026-07-28 10:01:00", 2, 900),
        ("2026-07-28 10:04:00", "2026-07-28 10:05:00", 1, 0)]
    assert rows == [["2026-07-28 09:59:00", 0, 0, 0, 0, 0, 3, 900, 20.0, 0],
                    ["2026-07-28 10:00:00", 1, 100, 50, 300, 2, 3, 900, 10.0, 0],
                    ["2026-07-28 10:01:00", 0, 0, 0, 0, 0, 2, 500, 30.0, 0],
                    ["2026-07-28 10:03:00", 0, 0, 0, 0, 0, 0, 0, "", 2],
                    ["2026-07-28 10:04:00", 1, 100, 5, 300, 1, 1, 0, "", 0]]


def test_the_report_is_the_same_on_a_shuffled_mixture():
    """Batch lines of every release, odd versions, start-up, retraction, other and unparsed
    lines, out of order in time: the whole report, fast and slow."""
    rng = random.Random(7)
    lines = corpus()
    lines += [odd for line in lines[::11] if " batch" in line for odd in odd_versions(line)]
    lines += ["", "Traceback (most recent call last):", "[2026-07-28 10:00:00] x"]
    for seed in range(3):
        mixed = lines[:]
        rng.shuffle(mixed)
        raw = [ln.encode("utf-8") for ln in mixed]
        _, want, got = both(raw)
        assert got == want, seed
    doc = want[0]
    assert doc["lines"]["prefill"] > 50
    assert doc["lines"]["decode"] > 50
    assert doc["lines"]["other"] > 50
    assert doc["lines"]["unparsed"] > 50


def test_peaks_and_queueing_runs_per_dp_rank_agree():
    """Ties, out-of-order times, queueing runs on several DP ranks, milliseconds."""
    ts = datetime(2026, 7, 28, 10, 0, tzinfo=timezone.utc).timestamp()
    events = []
    for i in range(400):
        at = ts + (i * 7919 % 600) + (i % 1000) / 1000
        if i % 3:
            events.append(DecodeBatch(ts=at, dp_rank=i % 3, running_req=i % 5, num_token=i % 7,
                                      token_usage=0.1, gen_throughput=i / 3, queue_req=i % 4 // 2,
                                      accept_len=None, accept_rate=None, cuda_graph=True))
        else:
            events.append(PrefillBatch(ts=at, dp_rank=i % 2, new_seq=1 + i % 2, new_token=i % 5,
                                       cached_token=i % 3, token_usage=0.1, running_req=i % 5,
                                       queue_req=i % 3 // 2, pending_token=i % 6,
                                       input_throughput=1.0, cuda_graph=False))
    for release in RELEASES:
        lines = [format_event(e, release, dp_size=3, log_ms=True).encode() for e in events]
        _, want, got = both(lines)
        assert got == want, release
        assert want[0]["longest_queueing"]["seconds"] > 0


def test_analyze_reads_files_the_same_fast_and_slow(tmp_path):
    """Through the file reader: CRLF endings, a last line without a newline, a line over the
    limit, a gzipped file."""
    lines = corpus()
    path = tmp_path / "sglang.log"
    body = "\r\n".join(lines[:200]) + "\n" + "x" * 70_000 + "\n" + "\n".join(lines[200:])
    path.write_text(body)  # no newline at the end
    fast, slow = analyze([path]), analyze([path], fast=False)
    assert fast.document() == slow.document()
    assert list(fast.per_minute_rows()) == list(slow.per_minute_rows())
    assert fast.document()["lines"]["too_long"] == 1


def test_layouts_hold_no_text_of_a_line_and_stay_bounded():
    secret = "api_key=sk-SECRET"
    line = rendered("0.5.12", 60)[-1]
    assert " batch" in line
    layouts = BatchLayouts(FAST_FIELDS, limit=3, tries=50)
    unknown = line + f", {secret}: {secret}"  # a pair parse_line ignores: read past, not kept
    learned = [layouts.learn(odd.encode(), parse_line(odd))
               for odd in (unknown, line + f", {secret}", line.replace(": ", f": {secret}"))]
    assert learned == [True, False, False]
    assert b"SECRET" not in layouts.regex.pattern
    assert assert_line_agrees(layouts, unknown.encode())
    assert assert_line_agrees(layouts, unknown.replace("SECRET", "OTHER").encode())
    for n in range(200):  # layouts of every length: at most `limit` kept, `tries` looked at
        extra = "".join(f", #queue-req: {i}" for i in range(n))
        layouts.learn((line + extra).encode(), parse_line(line + extra))
    assert len(layouts.layouts) == 3
    assert b"SECRET" not in layouts.regex.pattern


@pytest.mark.parametrize("line", [
    b"", b"\r", b"[", b"\xff\xfe",
    b"[2026-07-28 10:00:00] Prefill batch, " + b"#new-seq: 1, " * 400,
])
def test_any_line_is_safe_on_both_paths(line):
    lines = [ln.encode() for ln in rendered("0.5.12", 60)]
    _, want, got = both([*lines, line, *lines])
    assert got == want


def test_each_analysis_learns_its_own_layouts():
    a, b = Analysis(), Analysis()
    a.feed_lines([ln.encode() for ln in rendered("0.5.12", 60)])
    assert a.layouts.layouts
    assert not b.layouts.layouts
