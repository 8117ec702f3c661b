"""No text of a request record leaves the machine it is on: a marker prompt and a fake API key
put into request_parameters and into every other string field of SGLang's records (the id, the
finish reason's matched string and message, weight_version, unknown extra fields, and garbage
lines that are rejected) never show in the real exporter's /metrics, in its log at debug level,
in analyze-requests' text, JSON and CSV, nor in a snapshot pack.
"""

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sglang_obs.exporter.cli import parse_args

from fake_sglang import json_route, text_route
from helpers import free_port, stop_process, wait_for

BIN = Path(sys.executable).parent
MARKER = "PROMPT-MARKER-7f3a9c"
API_KEY = "sk-live-FAKEKEY0123456789abcdef"
SECRETS = (MARKER, API_KEY, "FAKEKEY")


def hostile_records(t0: float) -> tuple[list[str], int]:
    """(lines, how many are usable): every string field carries a secret."""
    params = json.dumps({"text": f"{MARKER} my key is {API_KEY}",
                         "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 64,
                                                                     "stop": [MARKER]},
                         "lora_path": f"/adapters/{API_KEY}", "rid": MARKER})
    good = []
    for i, (prompt, ttft) in enumerate(((3000, 0.4), (50000, 30.0), (200000, 2.0))):
        received = t0 + 60 * i
        good.append(json.dumps({
            "request_parameters": params, "id": f"{MARKER}-{i} {API_KEY}",
            "finish_reason": {"type": "stop", "matched": f"{MARKER} {API_KEY}"},
            "prompt_tokens": prompt, "weight_version": API_KEY, "num_retractions": 0,
            "forward_entry_time": received + ttft / 2, "prefill_finished_time": received + ttft,
            "queue_time": ttft / 2, "completion_tokens": 20, "cached_tokens": 0,
            "e2e_latency": ttft + 5, "request_received_ts": received,
            "request_finished_ts": received + ttft + 5,
            "customized_info": {"note": [MARKER, API_KEY]}, MARKER: API_KEY}))
    aborted = json.dumps({"request_parameters": params, "id": API_KEY,
                          "finish_reason": {"type": "abort", "message": f"{MARKER} {API_KEY}"},
                          "prompt_tokens": 10, "completion_tokens": 0, "e2e_latency": 0.5})
    bad = [f"{MARKER} {API_KEY}", "{" + json.dumps(MARKER),
           json.dumps({"request_parameters": params, "prompt_tokens": MARKER,
                       "e2e_latency": 1.0}),
           json.dumps({"request_parameters": {"text": MARKER}, "prompt_tokens": 1,
                       "e2e_latency": 1.0}),
           json.dumps({"request_parameters": params, "prompt_tokens": 1, "e2e_latency": -1.0,
                       "id": API_KEY})]
    return [*good, aborted, *bad], len(good) + 1


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} in {where}"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def value(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_real_exporter_and_the_analyzer_never_show_record_text(fake_sglang, tmp_path):
    server = fake_sglang({"/metrics": text_route("metrics_0.5.23_tp4.prom"),
                          "/v1/loads": json_route("v1_loads_0.5.23.json"),
                          "/server_info": json_route("server_info_0.5.12_seed.json")})
    records = tmp_path / "records"
    records.mkdir()
    port = free_port()
    log = (tmp_path / "exporter.log").open("w")
    proc = subprocess.Popen(
        [BIN / "sglang-exporter", "--sglang.url", server.url,
         "--sglang.request-metrics-dir", f"{server.url}={records}",
         "--sglang.request-metrics-poll-interval", "100ms", "--sglang.poll-interval", "200ms",
         "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.nvml",
         "--no-collector.docker", "--log.level", "debug"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: value(_try(scrape, port), "sglang_obs_request_source_up") == 1,
                        timeout=15), "the exporter never followed the directory"
        lines, usable = hostile_records(1_785_232_800.0)
        (records / "sglang-request-metrics-20260728_10.log").write_text("\n".join(lines) + "\n")
        done = wait_for(lambda: value(_try(scrape, port), "sglang_obs_request_records_total")
                        == usable, timeout=15)
        assert done, "records never counted"
        text = scrape(port)
        assert value(text, "sglang_obs_request_ttft_seconds_count",
                     prompt_class="32k_128k") == 1
        assert value(text, "sglang_obs_request_finished_total", prompt_class="lt_8k",
                     finish_reason="abort") == 1
        rejected = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'sglang_obs_request_records_rejected_total\{reason="(\w+)",[^}]*\} (\S+)', text)}
        assert rejected == {"not_json": 2, "wrong_type": 1, "unknown_release": 1,
                            "negative": 1}
        assert_clean(text, "/metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert_clean(r.read().decode(), "the landing page")
    finally:
        stop_process(proc)
        log.close()
    exporter_log = (tmp_path / "exporter.log").read_text()
    assert "skipped a record (not_json" in exporter_log  # the warnings were there...
    assert_clean(exporter_log, "the exporter log")  # ...without any record text
    # The analyzer: text, JSON and CSV.
    outputs = []
    for args in ([], ["--json"], ["--csv", tmp_path / "out.csv"]):
        result = subprocess.run([BIN / "sglang-obs", "analyze-requests", records, *args],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        outputs += [result.stdout, result.stderr]
    outputs.append((tmp_path / "out.csv").read_text())
    doc = json.loads(outputs[2])
    assert doc["records"] == usable
    assert all(s["id"].startswith("h:") for s in doc["slowest"])  # client ids are hashed
    for i, out in enumerate(outputs):
        assert_clean(out, f"analyze-requests output {i}")


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError:
        return ""


def test_a_records_directory_belongs_to_one_server():
    one = parse_args(["--sglang.url", "http://a:1", "--sglang.request-metrics-dir", "/r"])
    assert one.sglang_request_metrics_dir == [("http://a:1", "/r")]
    two = ["--sglang.url", "http://a:1", "--sglang.url", "http://b:2"]
    with pytest.raises(SystemExit) as err:
        parse_args([*two, "--sglang.request-metrics-dir", "/r"])
    assert err.value.code == 2
    paired = parse_args([*two, "--sglang.request-metrics-dir", "http://b:2=/r"])
    assert paired.sglang_request_metrics_dir == [("http://b:2", "/r")]
    with pytest.raises(SystemExit):
        parse_args([*two, "--sglang.request-metrics-dir", "http://b:2=/r",
                    "--sglang.request-metrics-dir", "http://b:2=/s"])
    with pytest.raises(SystemExit):
        parse_args([*two, "--sglang.request-metrics-dir", "http://c:3=/r"])


@pytest.mark.slow  # a backfilled Prometheus
def test_a_snapshot_with_the_records_never_shows_record_text(backfilled, tmp_path):
    b, url = backfilled("long-context-incident")
    records = tmp_path / "records"
    records.mkdir()
    lines, usable = hostile_records(b.start + 120)
    (records / "sglang-request-metrics-20260728_10.log").write_text("\n".join(lines) + "\n")
    # One record outside the window: not in the pack.
    late = json.loads(lines[0])
    late |= {"request_received_ts": b.end + 600, "prefill_finished_time": b.end + 600.4,
             "forward_entry_time": b.end + 600.2, "request_finished_ts": b.end + 605.4}
    (records / "sglang-request-metrics-20260728_11.log").write_text(json.dumps(late) + "\n")
    out = tmp_path / "pack"
    result = subprocess.run([BIN / "sglang-obs", "snapshot", "--prometheus", url, "--from",
                             str(b.start), "--to", str(b.end), "--out", out,
                             "--request-metrics-dir", records],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    section = summary["requests"]
    # The abort has no timing fields (no time to place it), the late one is after the window.
    assert (section["records"], section["outside_window"]) == (usable - 1, 2)
    assert section["slowest"][0]["prompt_class"] == "32k_128k"
    report = (out / "report.md").read_text()
    assert "## Slowest requests in this window" in report
    for path in out.iterdir():
        if path.suffix in (".md", ".json", ".csv"):
            assert_clean(path.read_text(), path.name)
    assert_clean(result.stdout + result.stderr, "snapshot output")
