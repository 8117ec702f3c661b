"""`sglang-sim` writes SGLang's hourly request-record files, serving and rendering, for the
releases that have them (0.5.6+), with a fake prompt in every record's request_parameters."""

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from sglang_obs.exporter.request_records import Record, parse_record
from sglang_obs.simulator.records import PROMPT_MARKER

from helpers import free_port, stop_process, wait_for

SIM = str(Path(sys.executable).parent / "sglang-sim")


def record_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("sglang-request-metrics-*.log"))


def parsed(directory: Path) -> list:
    return [parse_record(line) for f in record_files(directory)
            for line in f.read_bytes().splitlines() if line]


def test_serve_writes_hourly_record_files_as_requests_finish(tmp_path):
    out = tmp_path / "records"
    proc = subprocess.Popen([SIM, "--scenario", "healthy", "--release", "0.5.23", "--port",
                             str(free_port()), "--speed", "100", "--no-stdout-log",
                             "--request-metrics-dir", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(parsed(out)) >= 20 if out.exists() else False, timeout=30)
    finally:
        stop_process(proc)
    # Named after the server's local hour; a run across an hour's end has two files.
    names = {f.name for f in record_files(out)}
    assert names & {time.strftime("sglang-request-metrics-%Y%m%d_%H.log", time.localtime(t))
                    for t in (time.time() - 3600, time.time())}
    records = parsed(out)
    assert all(isinstance(r, Record) and r.release == "later" for r in records)
    lines = [json.loads(line) for f in record_files(out) for line in f.read_text().splitlines()]
    assert all(PROMPT_MARKER in rec["request_parameters"] for rec in lines)
    assert all(abs(r.finished_at - time.time()) < 3600 for r in records)  # real time


def test_serve_refuses_records_for_a_release_without_them(tmp_path):
    result = subprocess.run([SIM, "--scenario", "healthy", "--release", "0.5.5",
                             "--request-metrics-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "writes no request records" in result.stderr
    assert not record_files(tmp_path)


def test_render_writes_the_records_of_the_scenario(tmp_path):
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump({"extends": "healthy", "name": "short", "duration": 240}))
    result = subprocess.run([SIM, "render", "--scenario", str(short), "--release", "0.5.12",
                             "--out", str(tmp_path / "out"), "--format", "promtool",
                             "--start", "1785232800", "--request-metrics-dir",
                             str(tmp_path / "records")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    records = parsed(tmp_path / "records")
    assert len(records) > 50
    assert all(1785232800 <= r.finished_at <= 1785232800 + 240 for r in records)
    series = (tmp_path / "out/short.promtool.yml").read_text()
    assert "sglang_obs_request_ttft_seconds_bucket" in series
    assert 'stage=\\"request_process\\"' in series or 'stage="request_process"' in series
