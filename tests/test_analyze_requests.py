"""`sglang-obs analyze-requests` over generated records whose truth is known: the by-class
table (quantiles within 1 % of the exact ones), the slowest requests with their stage times,
plain, gzipped and directory inputs, --json and --csv, and one-line errors (exit 1; 2 for usage).
"""

import csv
import gzip
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_obs.exporter.request_records import PROMPT_CLASSES, prompt_class
from sglang_obs.tools.analyze_requests import CSV_COLUMNS, Quantiles, analyze

EXE = str(Path(sys.executable).parent / "sglang-obs")
MARKER = "PROMPT-MARKER-7f3a9c"
T0 = 1_785_232_800.0  # 2026-07-28 10:00:00 UTC
SIZES = {"lt_8k": (500, 8000), "8k_32k": (9000, 30000), "32k_128k": (40000, 120000),
         "ge_128k": (140000, 250000)}


def record(i, rng):
    cls = PROMPT_CLASSES[i % 4]
    prompt = rng.randint(*SIZES[cls])
    queue = rng.expovariate(1 / (0.05 if cls == "lt_8k" else 2.0 * (1 + i % 4)))
    prefill = prompt * 1.5e-4
    ttft = queue + prefill
    out = rng.randint(2, 800)
    e2e = ttft + out * 0.03
    received = T0 + i * 1.5
    return {"request_parameters": json.dumps({"text": f"{MARKER} {i}", "sampling_params": {
                "max_new_tokens": 1000}}),
            "id": f"{i:032x}", "finish_reason": {"type": "stop", "matched": MARKER},
            "prompt_tokens": prompt, "weight_version": MARKER, "num_retractions": 0,
            "forward_entry_time": received + queue, "prefill_finished_time": received + ttft,
            "queue_time": queue, "completion_tokens": out, "cached_tokens": prompt // 2,
            "e2e_latency": e2e, "request_received_ts": received,
            "request_finished_ts": received + e2e}


@pytest.fixture(scope="module")
def records_dir(tmp_path_factory):
    """2,000 records over 3 hourly files (the oldest gzipped) plus garbage, and the truth."""
    rng = random.Random(7)
    recs = [record(i, rng) for i in range(2000)]
    d = tmp_path_factory.mktemp("records")
    parts = [recs[:700], recs[700:1400], recs[1400:]]
    lines = [[json.dumps(r) for r in part] for part in parts]
    lines[1].insert(5, f"garbage {MARKER}")
    lines[2].append(json.dumps({**recs[0], "e2e_latency": -1}))
    with gzip.open(d / "sglang-request-metrics-20260728_10.log.gz", "wt") as f:
        f.write("\n".join(lines[0]) + "\n")
    (d / "sglang-request-metrics-20260728_11.log").write_text("\n".join(lines[1]) + "\n")
    (d / "sglang-request-metrics-20260728_12.log").write_text("\n".join(lines[2]))  # no \n
    (d / "unrelated.txt").write_text("not a record file")
    return d, recs


def run(*args, cwd=None):
    return subprocess.run([EXE, "analyze-requests", *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def exact(values, q):
    values = sorted(values)
    return values[math.floor(q * (len(values) - 1))]


def test_quantiles_are_within_one_percent():
    rng = random.Random(3)
    for _ in range(20):
        values = [rng.lognormvariate(0, 2) for _ in range(rng.randint(1, 3000))] + [0.0]
        h = Quantiles()
        for v in values:
            h.add(v)
        for q in (0.0, 0.5, 0.95, 1.0):
            assert h.quantile(q) == pytest.approx(exact(values, q), rel=0.01, abs=1e-9)
    assert Quantiles().quantile(0.5) is None


def test_by_class_table_matches_the_truth(records_dir):
    d, recs = records_dir
    doc = analyze([str(d)], top=5).document()
    assert doc["records"] == 2000
    assert doc["rejected"] == {"negative": 1, "not_json": 1}
    assert [Path(f).name for f in doc["files"]] == [
        "sglang-request-metrics-20260728_10.log.gz", "sglang-request-metrics-20260728_11.log",
        "sglang-request-metrics-20260728_12.log"]
    for cls in PROMPT_CLASSES:
        mine = [r for r in recs if prompt_class(r["prompt_tokens"]) == cls]
        c = doc["classes"][cls]
        assert c["requests"] == len(mine) == 500
        ttft = [r["prefill_finished_time"] - r["request_received_ts"] for r in mine]
        assert c["ttft_p50_seconds"] == pytest.approx(exact(ttft, 0.5), rel=0.01)
        assert c["ttft_p95_seconds"] == pytest.approx(exact(ttft, 0.95), rel=0.01)
        assert c["queue_p95_seconds"] == pytest.approx(exact([r["queue_time"] for r in mine],
                                                             0.95), rel=0.01)
        assert c["e2e_p95_seconds"] == pytest.approx(exact([r["e2e_latency"] for r in mine],
                                                           0.95), rel=0.01)
        tpot = [(r["e2e_latency"] - (r["prefill_finished_time"] - r["request_received_ts"]))
                / (r["completion_tokens"] - 1) for r in mine]
        assert c["tpot_p50_seconds"] == pytest.approx(exact(tpot, 0.5), rel=0.01)
        share = sum(r["cached_tokens"] for r in mine) / sum(r["prompt_tokens"] for r in mine)
        assert c["cached_share"] == pytest.approx(share)


def test_the_slowest_requests_with_their_stage_times(records_dir):
    d, recs = records_dir
    doc = analyze([str(d)], top=5).document()
    ttft = sorted(recs, key=lambda r: -(r["prefill_finished_time"] - r["request_received_ts"]))
    assert [s["id"] for s in doc["slowest"]] == [r["id"] for r in ttft[:5]]
    for s, r in zip(doc["slowest"], ttft, strict=False):
        t = r["prefill_finished_time"] - r["request_received_ts"]
        assert s["ttft_seconds"] == pytest.approx(t)
        assert s["queue_seconds"] == pytest.approx(r["queue_time"])
        assert s["prefill_seconds"] == pytest.approx(t - r["queue_time"])
        assert s["decode_seconds"] == pytest.approx(r["e2e_latency"] - t)
        assert (s["prompt_tokens"], s["completion_tokens"], s["max_new_tokens"]) == (
            r["prompt_tokens"], r["completion_tokens"], 1000)


def test_text_json_and_csv_from_the_command_line(records_dir, tmp_path):
    d, _ = records_dir
    text = run(d, "--top", "3")
    assert text.returncode == 0, text.stderr
    assert "Request records: 2,000 from 3 file(s)" in text.stdout
    assert "2 skipped (negative 1, not_json 1)" in text.stdout
    for cls in PROMPT_CLASSES:
        assert f"\n{cls:9}       500 " in text.stdout
    assert "Slowest 3 by TTFT" in text.stdout
    as_json = run(d, "--json", "--top", "0", "--csv", tmp_path / "m.csv")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["schema_version"] == 1
    assert doc["slowest"] == []
    assert set(doc) == {"schema_version", "files", "records", "rejected", "time_range",
                        "class_bounds_tokens", "classes", "slowest"}
    rows = list(csv.reader((tmp_path / "m.csv").open()))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert sum(int(r[2]) for r in rows[1:]) == 2000
    assert {r[1] for r in rows[1:]} == set(PROMPT_CLASSES)
    for out in (text.stdout, text.stderr, as_json.stdout, (tmp_path / "m.csv").read_text()):
        assert MARKER not in out


@pytest.mark.parametrize(("args", "code", "message"), [
    (["/nonexistent/records.log"], 1, "/nonexistent/records.log: no such file"),
    (["{empty}"], 1, "no sglang-request-metrics-*.log files in this directory"),
    (["{bad_gz}"], 1, "bad.log.gz: corrupt gzip data"),
    (["{garbage}"], 1, "no usable request records in"),
    (["/dev/zero"], 1, "/dev/zero: not a regular file"),
    ([], 2, "the following arguments are required"),
    (["{garbage}", "--top", "-1"], 2, "--top"),
    (["{garbage}", "--top", "many"], 2, "--top"),
])
def test_errors_are_one_line_naming_the_file(tmp_path, args, code, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.log.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    (tmp_path / "garbage.log").write_text(f"{MARKER}\n[1,2]\n")
    paths = {"empty": tmp_path / "empty", "bad_gz": tmp_path / "bad.log.gz",
             "garbage": tmp_path / "garbage.log"}
    result = run(*[a.format(**paths) for a in args])
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert MARKER not in result.stderr + result.stdout
    if code == 1:
        assert len(result.stderr.strip().splitlines()) == 1
