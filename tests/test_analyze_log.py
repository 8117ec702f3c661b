"""`sglang-obs analyze-log` over a generated multi-hour log whose true peaks are known."""

import bisect
import csv
import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from sglang_obs.exporter.log_stats import CONTEXT_BUCKETS, LogStats
from sglang_obs.exporter.sglang_log import parse_line
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.events import DecodeBatch, PrefillBatch, Retraction
from sglang_obs.simulator.logs import format_event
from sglang_obs.simulator.simulation import Simulation
from sglang_obs.tools.analyze_log import CSV_COLUMNS, analyze

from conftest import ROOT

EXE = str(Path(sys.executable).parent / "sglang-obs")
START = 1_785_232_800.0  # 2026-07-28 10:00:00 UTC
HOURS = 3


def second(ts):
    """The log prints whole seconds (no SGLANG_LOG_MS), in UTC for the simulator."""
    return datetime.fromtimestamp(int(ts), tz=timezone.utc).replace(tzinfo=None)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Three hours of seed-000-like traffic, its log (split in two files, the older gzipped),
    and the truth computed from the simulator's own events."""
    base = scenarios.load("long-context-incident")
    sc = scenarios.from_dict({
        "duration": HOURS * 3600, "seed": 5, "release": "0.5.12", "warm_cache": 0.6,
        "server": {**base.server.__dict__}, "perf": {**base.perf.__dict__},
        "load": [
            {"at": 0, "rate": 0.06, "input_tokens": {"ramp": [60000, 170000]},
             "cached_fraction": {"uniform": [0.98, 0.999]},
             "output_tokens": {"normal": [1200, 400]}},
            *({"at": at, "burst": 3, "spread": 10, "input_tokens": {"uniform": [90000, 110000]},
               "cached_fraction": {"uniform": [0.0, 0.3]},
               "output_tokens": {"normal": [4000, 800]}} for at in (1800, 5400, 9000)),
        ]})
    events, prompts = simulate(sc)
    lines = [format_event(e, "0.5.12", tp_size=4) for e in events]
    out = tmp_path_factory.mktemp("logs")
    half = len(lines) // 2
    with gzip.open(out / "sglang.log.1.gz", "wt") as f:
        f.write("\n".join(lines[:half]) + "\n")
    (out / "sglang.log").write_text("\n".join(lines[half:]) + "\n"
                                    "Traceback (most recent call last): not a scheduler line\n")
    return out, events, prompts


def simulate(sc):
    """The scenario's events and the prompt lengths of every request it admitted (finished, or
    still held when it ends)."""
    events, finished = [], []
    sim = Simulation(sc, start_ts=START, on_event=events.append,
                     on_request=lambda req, _at: finished.append(req))
    sim.advance(sc.duration)
    held = [r for s in sim.server.schedulers
            for r in (*s.running, *s.waiting, *([s.chunked] if s.chunked else []))]
    return events, Counter(r.prompt_len for r in finished + held)


def truth(events):
    batches = [e for e in events if isinstance(e, PrefillBatch | DecodeBatch)]
    prefill = [e for e in batches if isinstance(e, PrefillBatch)]
    decode = [e for e in batches if isinstance(e, DecodeBatch)]

    def peak(items, attr):
        best = None
        for e in items:
            if best is None or getattr(e, attr) > getattr(best, attr):
                best = e
        return {"value": float(getattr(best, attr)), "at": second(best.ts).isoformat(sep=" ")}

    longest, since = 0.0, None
    for e in batches:
        if e.queue_req > 0 and since is None:
            since = second(e.ts)
        elif e.queue_req == 0 and since is not None:
            longest = max(longest, (second(e.ts) - since).total_seconds())
            since = None
    new = sum(e.new_token for e in prefill)
    cached = sum(e.cached_token for e in prefill)
    return {
        "pending_tokens": peak(prefill, "pending_token"),
        "queue_requests": peak(batches, "queue_req"),
        "running_requests": peak(batches, "running_req"),
        "full_tokens": peak(decode, "num_token"),
        "longest_queueing": longest,
        "cache_hit_ratio": cached / (new + cached),
        "retracted": sum(e.retracted_reqs for e in events if isinstance(e, Retraction)),
    }


@pytest.mark.slow  # `generated` simulates three hours
def test_json_matches_the_known_peaks_exactly(generated):
    out, events, prompts = generated
    result = subprocess.run([EXE, "analyze-log", str(out / "sglang.log.1.gz"),
                             str(out / "sglang.log"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    want = truth(events)
    assert doc["peaks"]["pending_tokens"] == want["pending_tokens"]
    assert doc["peaks"]["queue_requests"] == want["queue_requests"]
    assert doc["peaks"]["running_requests"] == want["running_requests"]
    assert doc["peaks"]["full_tokens"] == want["full_tokens"]
    assert doc["longest_queueing"]["seconds"] == want["longest_queueing"]
    assert doc["prefill_tokens"]["cache_hit_ratio"] == pytest.approx(want["cache_hit_ratio"])
    assert doc["retracted_requests"] == want["retracted"]
    contexts = doc["context_tokens"]
    assert 0 < contexts["requests"] <= prompts.total()
    assert all(contexts[k] in prompts for k in ("max", "first", "last")), contexts
    assert doc["lines"]["unparsed"] == 1
    span = doc["time_range"]
    hours = (datetime.fromisoformat(span["to"]) - datetime.fromisoformat(span["from"]))
    assert hours.total_seconds() > (HOURS - 0.5) * 3600
    assert len(doc["pressure_windows"]) >= 3  # the three cold bursts at least


@pytest.mark.slow
def test_text_report_and_per_minute_csv(generated, tmp_path):
    out, events, _ = generated
    csv_path = tmp_path / "minutes.csv"
    result = subprocess.run([EXE, "analyze-log", str(out / "sglang.log.1.gz"),
                             str(out / "sglang.log"), "--csv-per-minute", str(csv_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    want = truth(events)
    assert f"Pending prefill tokens, peak: {want['pending_tokens']['value']:,.0f}" in result.stdout
    assert "Sustained pressure" in result.stdout
    rows = list(csv.reader(csv_path.open()))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) > HOURS * 50
    assert max(float(r[4]) for r in rows[1:]) == want["pending_tokens"]["value"]


@pytest.mark.slow
def test_every_json_field_is_documented(generated):
    out, _, _ = generated
    doc = json.loads(subprocess.run([EXE, "analyze-log", str(out / "sglang.log"), "--json"],
                                    capture_output=True, text=True).stdout)
    text = (ROOT / "docs/log-analysis.md").read_text()
    for key, value in doc.items():
        assert f"`{key}" in text, key
        if isinstance(value, dict):
            for sub in value:
                assert re.search(rf"`{key}\.{sub}`|`\.{sub}`|\.{sub}[`,]|`{key}\.<kind>`", text) \
                    or sub in ("total",), f"{key}.{sub}"


def test_a_chunked_prompt_counts_whole_not_as_its_chunks(tmp_path):
    """Seed 000's scenario, every prompt 32K or more: chunked prefill logs the long cold ones
    as runs of 4,096-token single-request lines. The headline is the prompts, not the chunks."""
    sc = scenarios.load("long-context-incident")
    events, prompts = simulate(sc)
    assert min(prompts) >= 32_768
    log = tmp_path / "sglang.log"
    log.write_text("\n".join(format_event(e, sc.release) for e in events) + "\n")
    result = subprocess.run([EXE, "analyze-log", str(log), "--json"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    contexts = json.loads(result.stdout)["context_tokens"]
    want = sorted(prompts.elements())
    print(f"median {contexts['median']:,.0f} of {contexts['requests']} prompts; true median "
          f"{want[len(want) // 2]:,} of {len(want)}")
    assert contexts["median"] >= 32_768
    assert contexts["median"] == pytest.approx(want[len(want) // 2], rel=0.05)
    assert contexts["chunk_size"] == sc.server.chunked_prefill_size
    assert contexts["chunked"] >= 3  # the three cold bursts at least
    # Each one is a real prompt's length: no chunk counted alone, no two prompts added up.
    assert not Counter(analyze([log]).contexts) - prompts
    assert f"median {contexts['median']:,.0f}," in subprocess.run(
        [EXE, "analyze-log", str(log)], capture_output=True, text=True).stdout


def test_the_chunk_size_is_found_without_the_startup_line(tmp_path):
    """A rotated log has no capacity line: the chunk size is the largest #new-token, followed
    by an uncached continuation."""
    sc = scenarios.load("long-context-incident")
    events, prompts = simulate(sc)
    lines = [format_event(e, sc.release) for e in events]
    whole, rotated = tmp_path / "whole.log", tmp_path / "rotated.log"
    whole.write_text("\n".join(lines) + "\n")
    rotated.write_text("\n".join(ln for ln in lines if "chunked_prefill_size=" not in ln) + "\n")
    assert len(rotated.read_text()) < len(whole.read_text())
    with_line, without = analyze([whole]), analyze([rotated])
    assert without.chunk_size == with_line.chunk_size == sc.server.chunked_prefill_size
    assert list(without.contexts) == list(with_line.contexts)
    assert without.chunked_requests == with_line.chunked_requests > 0


@pytest.mark.parametrize(("args", "code", "message"), [
    (["/nonexistent.log"], 1, "no such file"),
    (["{empty}"], 1, "no SGLang scheduler lines"),
])
def test_bad_input_gives_a_clear_message(tmp_path, args, code, message):
    empty = tmp_path / "empty.log"
    empty.write_text("hello\n")
    result = subprocess.run([EXE, "analyze-log", *[a.format(empty=empty) for a in args]],
                            capture_output=True, text=True)
    assert result.returncode == code
    assert message in result.stderr


def test_the_exporter_counts_the_same_prompts_as_analyze_log(tmp_path):
    """One definition of a prompt's context (exporter.log_stats.PromptRuns): the exporter's
    sglang_obs_log_prefill_context_tokens histogram, fed the same log line by line, holds the
    prompts analyze-log reports, not chunked prefill's chunks."""
    sc = scenarios.load("long-context-incident")
    events, prompts = simulate(sc)
    lines = [format_event(e, sc.release) for e in events]
    log = tmp_path / "sglang.log"
    log.write_text("\n".join(lines) + "\n")
    stats = LogStats()
    for line in lines:
        stats.feed(parse_line(line))
    snap = stats.snapshot()
    contexts = analyze([log]).contexts
    print(f"exporter: {snap.context_count} prompts, {snap.context_sum:,.0f} tokens; analyze-log: "
          f"{len(contexts)} prompts, {sum(contexts):,} tokens")
    assert (snap.context_count, snap.context_sum) == (len(contexts), sum(contexts))
    below = bisect.bisect_left(CONTEXT_BUCKETS, 32_768)  # the buckets up to 16K
    assert snap.context_buckets[:below] == (0,) * below, \
        "a chunk counted as a prompt: every prompt of the scenario is 32K or more"
