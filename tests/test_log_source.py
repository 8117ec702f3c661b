"""The scheduler-log source: following files like tail -F, aggregating lines, and the
container source against a fake Docker API."""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.collector import ContainerCollector, GuardedCollector, LogCollector
from sglang_obs.exporter.containers import ContainerSource
from sglang_obs.exporter.log_follow import DockerLogFollower, FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.poller import PollSettings, TargetPoller

from fake_docker import FakeContainer, FakeDocker
from fake_sglang import Route
from helpers import followed_empty_log, free_port

PREFILL = ("[2026-11-29 11:51:14 TP0] Prefill batch, #new-seq: {seq}, #new-token: {new}, "
           "#cached-token: {cached}, token usage: 0.31, #running-req: 8, #queue-req: 3, "
           "#pending-token: {pending}, cuda graph: False, input throughput (token/s): 1234.56")
DECODE = ("[2026-11-29 11:51:15 TP0] Decode batch, #running-req: 9, #token: 486000, token usage: "
          "0.43, accept len: 2.80, accept rate: 0.60, cuda graph: True, gen throughput (token/s): "
          "300.00, #queue-req: 0")
CAPACITY = ("[2026-11-29 11:00:00 TP0] max_total_num_tokens=1130000, chunked_prefill_size=4096, "
            "max_prefill_tokens=16384, max_running_requests=44, context_len=262144, "
            "available_gpu_mem=9.80 GB")


def prefill(pending=0, seq=1, new=4000, cached=90000):
    return PREFILL.format(pending=pending, seq=seq, new=new, cached=cached)


def write(path, *lines, mode="a"):
    with open(path, mode) as f:
        f.write("".join(line + "\n" for line in lines))


def test_follows_appended_lines_and_counts_only_new_ones(tmp_path):
    path = tmp_path / "sglang.log"
    write(path, CAPACITY, prefill(pending=5000), mode="w")
    stats = LogStats()
    follower = FileFollower(str(path), stats)
    follower.poll()
    snap = stats.snapshot()
    assert snap.capacity["max_running_requests"] == 44  # history sets gauges...
    assert snap.pending_prefill_tokens == 5000
    assert snap.prefill_batches == 0  # ...but is not counted
    write(path, prefill(pending=292965), DECODE)
    assert follower.poll() == 2
    snap = stats.snapshot()
    assert snap.prefill_batches == 1
    assert snap.pending_prefill_tokens == 292965
    assert snap.running_requests == 9  # the decode line is the latest batch line
    assert snap.running_batch_tokens == 486000
    assert snap.spec_accept_length == 2.8
    assert snap.context_count == 1
    assert snap.context_sum == 94000


def test_survives_rotation_truncation_and_a_file_that_appears_later(tmp_path):
    path = tmp_path / "sglang.log"
    stats = LogStats()
    follower = FileFollower(str(path), stats)
    follower.poll()  # not there yet
    assert not follower.up
    write(path, prefill(pending=1), mode="w")  # appears: read from its first line
    follower.poll()
    assert stats.snapshot().prefill_batches == 1
    write(path, prefill(pending=2))
    os.rename(path, tmp_path / "sglang.log.1")  # logrotate: move away, start a new file
    write(tmp_path / "sglang.log.1", prefill(pending=3))  # last words of the old file
    write(path, prefill(pending=4), mode="w")
    follower.poll()
    snap = stats.snapshot()
    assert snap.prefill_batches == 4
    assert snap.pending_prefill_tokens == 4
    assert follower.rotations == 1
    write(path, prefill(pending=5))
    follower.poll()
    with open(path, "w"):  # copytruncate
        pass
    write(path, prefill(pending=6))
    follower.poll()
    snap = stats.snapshot()
    assert snap.prefill_batches == 6
    assert snap.pending_prefill_tokens == 6
    assert follower.rotations == 2


def test_partial_lines_wait_and_garbage_is_counted_not_fatal(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path)
    line = prefill(pending=777)
    with open(path, "a") as f:
        f.write(line[:40])
    follower.poll()
    assert stats.snapshot().prefill_batches == 0
    with open(path, "ab") as f:
        f.write(line[40:].encode() + b"\n\xff\xfe garbage\nTraceback (most recent call last):\n")
        f.write(b"x" * (200 * 1024) + b"\n")  # a runaway line
        f.write(b"[2026-11-29 11:51:16 TP0] Prefill batch, #new-seq: api_key=sk-SECRET\n")
    follower.poll()
    snap = stats.snapshot()
    assert snap.prefill_batches == 1
    assert snap.pending_prefill_tokens == 777
    assert snap.lines["unparsed"] >= 3
    assert snap.lines["other"] == 1  # a prefixed line that is not a valid batch line


def test_log_collector_exposes_numbers_only(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path, server="sglang:30000")
    write(path, CAPACITY, prefill(pending=10), DECODE,
          "[2026-11-29 11:52:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
          "#new_tokens_gained: 12000, #new_token_ratio: 0.4000 -> 0.7000 api_key=sk-SECRET")
    follower.poll()
    registry = CollectorRegistry()
    registry.register(GuardedCollector([LogCollector([follower])]))
    text = generate_latest(registry).decode()
    assert "SECRET" not in text
    labels = {"server": "sglang:30000"}
    assert registry.get_sample_value("sglang_obs_log_retracted_requests_total", labels) == 3
    assert registry.get_sample_value("sglang_obs_log_max_running_requests", labels) == 44
    assert registry.get_sample_value("sglang_obs_log_prefill_context_tokens_bucket",
                                     {**labels, "le": "98304.0"}) == 1
    assert registry.get_sample_value("sglang_obs_log_source_up",
                                     {**labels, "source": "file"}) == 1


def test_container_source_reports_restarts_oom_kills_and_exits():
    sglang = FakeContainer("sglang")
    other = FakeContainer("sglang-b", labels={"sglang-obs.server": "b:30000"})
    docker = FakeDocker(sglang, other)
    source = ContainerSource(docker, {"sglang": "a:30000", "missing": "c:30000"},
                             {"sglang-obs.server": ""})
    registry = CollectorRegistry()
    registry.register(GuardedCollector([ContainerCollector(source)]))

    def value(name, container="sglang", server="a:30000"):
        return registry.get_sample_value(name, {"container": container, "server": server})

    source.poll()
    assert registry.get_sample_value("sglang_obs_container_source_up", {}) == 1
    assert value("sglang_obs_container_running") == 1
    assert value("sglang_obs_container_running", "sglang-b", "b:30000") == 1
    assert value("sglang_obs_container_start_time_seconds") == pytest.approx(1795946400.123456)
    sglang.restart_after(137, oom=True)
    source.poll()
    source.poll()  # the same OOM exit is counted once
    assert value("sglang_obs_container_restarts_total") == 1
    assert value("sglang_obs_container_oom_kills_total") == 1
    assert value("sglang_obs_container_oom_killed") == 1
    assert value("sglang_obs_container_last_exit_code") == 137
    sglang.restart_after(137, oom=True, finished="2026-11-29T10:06:00Z")
    source.poll()
    sglang.exit(1, oom=False)
    source.poll()
    assert value("sglang_obs_container_oom_kills_total") == 2
    assert value("sglang_obs_container_running") == 0
    assert value("sglang_obs_container_restarts_total") == 2
    docker.broken = True
    source.poll()
    assert registry.get_sample_value("sglang_obs_container_source_up", {}) == 0
    assert value("sglang_obs_container_restarts_total") == 2  # last known kept while it is off


def test_docker_log_stream_feeds_the_same_stats():
    container = FakeContainer("sglang", log_chunks=[
        (prefill(pending=100) + "\n" + prefill(pending=200)[:30]).encode(),
        (prefill(pending=200)[30:] + "\n").encode()])
    stats = LogStats()
    follower = DockerLogFollower(FakeDocker(container), "sglang", stats)
    import threading

    stop = threading.Event()
    follower.start(stop)
    deadline = time.monotonic() + 5
    while stats.snapshot().prefill_batches < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    assert stats.snapshot().pending_prefill_tokens == 200


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_a_read_log_line_reaches_the_derived_backlog_without_another_poll(fake_sglang,
                                                                           tmp_path):
    # The derived backlog must not wait for the next server poll after the log is read.
    metrics = (Path(__file__).parent / "fixtures/sglang/metrics_0.5.5.prom").read_bytes()
    server = fake_sglang({"/metrics": Route(metrics)})
    log = tmp_path / "sglang.log"
    log.write_text(CAPACITY + "\n")
    stats = LogStats()
    poller = TargetPoller(server.url, PollSettings(timeout=2.0), log_stats=stats)
    follower = FileFollower(str(log), stats)
    follower.poll()
    assert poller.poll_once().derived.prefill_backlog_tokens is None
    hits = dict(server.hits)
    write(log, prefill(pending=292965))
    assert follower.poll() == 1
    assert poller.snapshot.derived.prefill_backlog_tokens == 292965
    assert poller.snapshot.derived.max_running_requests == 44
    assert server.hits == hits  # re-derived from the last answers, not re-polled


def test_exporter_shows_a_logged_backlog_within_one_poll_interval(fake_sglang, tmp_path):
    # 0.5.5 has no backlog in /metrics or /get_load: the log is the only source.
    metrics = (Path(__file__).parent / "fixtures/sglang/metrics_0.5.5.prom").read_bytes()
    server = fake_sglang({"/metrics": Route(metrics)})
    log = tmp_path / "sglang.log"
    log.write_text(CAPACITY + "\n")
    port = free_port()
    exe = str(Path(sys.executable).parent / "sglang-exporter")
    proc = subprocess.Popen(
        [exe, "--sglang.url", server.url, "--web.listen-address", f"127.0.0.1:{port}",
         "--sglang.log-file", str(log), "--sglang.poll-interval", "500ms",
         "--sglang.log-poll-interval", "500ms", "--no-collector.docker"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if "sglang_obs_log_source_up" in scrape(port):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        write(log, prefill(pending=292965))
        written = time.monotonic()
        target = f'server="127.0.0.1:{server.port}"'
        want = (f"sglang_obs_log_pending_prefill_tokens{{{target}}} 292965.0",
                f'sglang_obs_prefill_backlog_tokens{{model_name="llama-70b",{target}}} 292965.0')
        while not all(w in scrape(port) for w in want):
            assert time.monotonic() - written < 5, scrape(port)
            time.sleep(0.02)
        elapsed = time.monotonic() - written
        text = scrape(port)
        # ...and the start-up line gives the effective limit that 0.5.5 does not export.
        assert f"sglang_obs_max_running_requests{{model_name=\"llama-70b\",{target}}} 44.0" in text
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    print(f"log line to both series: {elapsed:.3f} s")
    assert elapsed <= 1.0, f"{elapsed:.2f}s: more than one poll interval (0.5 s) plus a poll"
