"""Whatever is put at a followed log path or handed to `analyze-log` (a FIFO, /dev/zero, a
deleted file, a rewrite within one poll, a megabyte prompt that ends like a batch line, a sparse
2 GB file, a gzip bomb), the reader never blocks, stays within its bounds, says the source is
down while it is, and no text of a line reaches a metric or a log record.

Every loop here is bounded (a poll count or a deadline), so each test stops by itself.
"""

import contextlib
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.collector import GuardedCollector, LogCollector
from sglang_obs.exporter.log_follow import MAX_BYTES_PER_POLL, DockerLogFollower, FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.sglang_log import MAX_LINE_BYTES, LineReader, parse_line

from fake_docker import FakeContainer, FakeDocker
from helpers import followed_empty_log, poll_within

EXE = str(Path(sys.executable).parent / "sglang-obs")
MARKER = "PROMPT-MARKER-7f3a9c"
CAPACITY = ("[2026-11-29 11:00:00 TP0] max_total_num_tokens=1130000, chunked_prefill_size=4096, "
            "max_prefill_tokens=16384, max_running_requests=44, context_len=262144")
# What a prompt could end with to pass for a batch line, were its tail read as a line.
FORGED = ("[2026-11-29 11:59:59 TP0] Prefill batch, #new-seq: 1, #new-token: 1, "
          "#cached-token: 0, token usage: 0.99, #running-req: 1, #queue-req: 999, "
          "#pending-token: 999999999, cuda graph: False, input throughput (token/s): 1.00")
RSS_LIMIT = 200 * 1024 * 1024
MIB = 1024 * 1024


def prefill(pending, minute=51):
    return (f"[2026-11-29 11:{minute:02d}:14 TP0] Prefill batch, #new-seq: 1, #new-token: 4000, "
            f"#cached-token: 90000, token usage: 0.31, #running-req: 8, #queue-req: 3, "
            f"#pending-token: {pending}, cuda graph: False, input throughput (token/s): 1234.56")


def write(path, *lines, mode="a"):
    with open(path, mode) as f:
        f.write("".join(line + "\n" for line in lines))


def state_logs(caplog):
    return [r for r in caplog.records if r.name == "sglang_obs.exporter.log_follow"]


# -- 1. a FIFO in place of the log ------------------------------------------------------------
def test_a_fifo_at_the_path_never_blocks_and_is_down_until_a_file_returns(tmp_path, caplog):
    caplog.set_level(logging.INFO, "sglang_obs.exporter.log_follow")
    path = tmp_path / "sglang.log"
    write(path, CAPACITY, mode="w")
    stats = LogStats()
    follower = FileFollower(str(path), stats)
    poll_within(follower)
    assert follower.up
    os.remove(path)
    os.mkfifo(path)
    try:
        for _ in range(5):  # a FIFO with no writer would block a plain open() forever
            poll_within(follower)
            assert not follower.up
        assert follower.state == "a FIFO"
    finally:
        _unblock(path)
        os.remove(path)
    write(path, *(prefill(i) for i in range(20)), mode="w")  # a regular file again
    assert poll_within(follower) == 20  # read from its first line, all of it
    assert follower.up
    assert follower.state == "following"
    assert stats.snapshot().prefill_batches == 20
    messages = [r.getMessage() for r in state_logs(caplog)]
    assert sum("a FIFO" in m for m in messages) == 1  # one line per change, not per poll
    assert sum(m.endswith(": following") for m in messages) == 2  # start, and back


def test_a_fifo_there_from_the_start_never_blocks(tmp_path):
    path = tmp_path / "sglang.log"
    os.mkfifo(path)
    try:
        follower = FileFollower(str(path), LogStats())
        for _ in range(3):
            poll_within(follower)
        assert not follower.up
        assert follower.state == "a FIFO"
    finally:
        _unblock(path)


def _unblock(fifo):
    """Open the FIFO's other end: frees a reader stuck in open() should the fix regress."""
    with contextlib.suppress(OSError):  # ENXIO: no reader waits, as it should be
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# -- 2. a device, a socket, a directory; bytes per poll ---------------------------------------
def test_a_symlink_to_dev_zero_is_refused_without_reading_a_byte(tmp_path, caplog):
    caplog.set_level(logging.INFO, "sglang_obs.exporter.log_follow")
    path = tmp_path / "sglang.log"
    path.symlink_to("/dev/zero")
    stats = LogStats()
    follower = FileFollower(str(path), stats)
    started = time.monotonic()
    for _ in range(50):
        poll_within(follower)
    assert time.monotonic() - started < 2.0  # no busy reading: 50 polls cost nothing
    assert follower.bytes_read == 0
    assert not follower.up
    assert follower.state == "a character device"
    assert len(state_logs(caplog)) == 1


def test_a_followed_file_swapped_for_dev_zero_is_dropped(tmp_path):
    path = tmp_path / "sglang.log"
    write(path, prefill(1), mode="w")
    follower = FileFollower(str(path), LogStats())
    follower.poll()
    read = follower.bytes_read
    os.remove(path)
    path.symlink_to("/dev/zero")
    for _ in range(10):
        poll_within(follower)
    assert follower.bytes_read == read
    assert not follower.up


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_a_directory_or_a_socket_at_the_path_is_down(tmp_path, kind):
    path = tmp_path / "sglang.log"
    sock = None
    if kind == "directory":
        path.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    try:
        follower = FileFollower(str(path), LogStats())
        poll_within(follower)
        assert not follower.up
        assert follower.state == f"a {kind}"
    finally:
        if sock:
            sock.close()


def test_one_poll_reads_at_most_the_byte_cap_and_the_next_ones_the_rest(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path)
    # The file grows by 40 MiB of NUL bytes (sparse: no disk), then a real line.
    os.truncate(path, 40 * MIB)
    write(path, "", prefill(42))
    polls = 0
    while stats.snapshot().prefill_batches == 0 and polls < 20:
        before = follower.bytes_read
        follower.poll()
        assert follower.bytes_read - before <= MAX_BYTES_PER_POLL
        polls += 1
    assert polls == 6  # 5 capped polls of 8 MiB, then the end
    assert follower.capped_polls == 5
    snap = stats.snapshot()
    assert snap.prefill_batches == 1
    assert snap.pending_prefill_tokens == 42
    assert snap.dropped == {"too_long": 1}


# -- 3. a deleted file ------------------------------------------------------------------------
def test_a_deleted_file_is_down_and_back_when_it_reappears(tmp_path, caplog):
    caplog.set_level(logging.INFO, "sglang_obs.exporter.log_follow")
    path = tmp_path / "sglang.log"
    write(path, CAPACITY, mode="w")
    stats = LogStats()
    follower = FileFollower(str(path), stats, server="s")
    registry = CollectorRegistry()
    registry.register(GuardedCollector([LogCollector([follower])]))

    def up():
        return registry.get_sample_value("sglang_obs_log_source_up",
                                         {"server": "s", "source": "file"})

    follower.poll()
    assert up() == 1
    os.remove(path)
    for _ in range(3):
        follower.poll()
        assert up() == 0
    assert follower.state == "no such file"
    write(path, prefill(7), mode="w")
    follower.poll()
    assert up() == 1
    assert stats.snapshot().pending_prefill_tokens == 7
    messages = [r.getMessage() for r in state_logs(caplog)]
    assert [m.rsplit(": ", 1)[-1] for m in messages] == [
        "following", "no such file; log_source_up is 0 until it is a regular file", "following"]


# -- 4. truncated and refilled within one poll -----------------------------------------------
def test_truncated_and_refilled_past_the_offset_within_one_poll_counts_every_new_line(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path)
    write(path, *(prefill(100_000 + i) for i in range(30)))
    assert follower.poll() == 30
    with open(path, "w") as f:  # copytruncate, then the writer goes on: all before one poll
        f.write("".join(prefill(i) + "\n" for i in range(200)))
    assert os.path.getsize(path) > follower._offset  # the size alone shows no truncation
    assert follower.poll() == 200
    snap = stats.snapshot()
    assert snap.prefill_batches == 230
    assert snap.pending_prefill_tokens == 199
    assert follower.rotations == 1


def test_a_rewritten_head_is_a_truncation_too(tmp_path):
    path = tmp_path / "sglang.log"
    write(path, prefill(1), mode="w")
    stats = LogStats()
    follower = FileFollower(str(path), stats, read_history=False)
    follower.poll()
    # Refilled with a different first line but the same bytes right before our offset.
    offset = follower._offset
    with open(path, "w") as f:
        f.write(prefill(2, minute=50) + "\n" + prefill(3) + "\n")
    assert os.path.getsize(path) > offset
    follower.poll()
    assert stats.snapshot().prefill_batches == 2
    assert follower.rotations == 1


def test_appends_are_not_mistaken_for_a_rewrite(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path)
    for i in range(50):
        write(path, prefill(i))
        follower.poll()
    assert follower.rotations == 0
    assert stats.snapshot().prefill_batches == 50


# -- 5. only lines that start like SGLang's; over-long lines dropped --------------------------
def prompt_line(before, ending=FORGED):
    """A logged request whose prompt ends in `ending`, text shaped like a batch line, which
    starts `before` bytes into the line."""
    head = f"[2026-11-29 11:51:20 TP0] Receive: obj=GenerateReqInput(text='{MARKER} "
    filler = "lorem ipsum " * (before // 12 + 1)
    return (head + filler)[:before] + ending


@pytest.mark.parametrize("pieces", [1, 4])
def test_a_megabyte_prompt_that_ends_like_a_batch_line_is_dropped_not_parsed(tmp_path, pieces):
    # The forged text starts 5 bytes after a 1 MiB read: the reader this replaced dropped the
    # first MiB of the line and parsed the rest as a line (pending 999999999, queue 999).
    path, stats, follower = followed_empty_log(tmp_path)
    write(path, prefill(5))
    follower.poll()
    line = prompt_line(MIB + 5) + "\n"
    step = -(-len(line) // pieces)
    with open(path, "a") as f:
        for start in range(0, len(line), step):  # in one write, or across several polls
            f.write(line[start:start + step])
            f.flush()
            follower.poll()
    snap = stats.snapshot()
    assert snap.pending_prefill_tokens == 5
    assert snap.queue_requests == 3
    assert snap.prefill_batches == 1
    assert snap.dropped == {"too_long": 1}
    assert snap.lines["unparsed"] == 1


def test_a_prompt_before_a_batch_line_on_one_line_is_not_sglang():
    for before in ("user: ", "x" * 50, "said [2026-11-29 11:51:14] and then ", f"{MARKER} "):
        assert parse_line(before + FORGED) is None, before
    assert parse_line(FORGED).fields["pending_token"] == 999999999  # the shape itself parses


def test_lines_not_sglang_and_too_long_are_counted_apart(tmp_path):
    path, stats, follower = followed_empty_log(tmp_path)
    write(path, "user: " + FORGED, "Traceback (most recent call last):",
          "[2026-11-29 11:51:16 TP0] " + "y" * (MAX_LINE_BYTES + 1), prefill(9))
    follower.poll()
    snap = stats.snapshot()
    assert snap.dropped == {"not_sglang": 2, "too_long": 1}
    assert snap.lines["unparsed"] == 3
    follower.server = "s"
    registry = CollectorRegistry()
    registry.register(GuardedCollector([LogCollector([follower])]))
    for reason, n in (("not_sglang", 2), ("too_long", 1)):
        assert registry.get_sample_value("sglang_obs_log_dropped_lines_total",
                                         {"server": "s", "reason": reason}) == n
    assert snap.pending_prefill_tokens == 9


def test_the_docker_stream_drops_an_over_long_line_whole():
    line = prompt_line(MIB + 5).encode()
    chunks = [prefill(5).encode() + b"\n"]
    chunks += [line[i:i + 65536] for i in range(0, len(line), 65536)]
    chunks.append(b"\n" + prefill(6).encode() + b"\n")
    stats = LogStats()
    follower = DockerLogFollower(FakeDocker(FakeContainer("sglang", log_chunks=chunks)),
                                 "sglang", stats)
    stop = threading.Event()
    follower.start(stop)
    deadline = time.monotonic() + 5
    while stats.snapshot().prefill_batches < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    snap = stats.snapshot()
    assert snap.pending_prefill_tokens == 6
    assert snap.queue_requests == 3
    assert snap.dropped.get("too_long") == 1


def test_line_reader_bounds():
    reader = LineReader(10)
    assert reader.feed(b"short\n0123456789") == [b"short"]
    assert reader.feed(b"X") == []  # 11 bytes: too long, dropped from here to its newline
    assert reader.feed(b"more text that is not a line\nok\n") == [b"ok"]
    assert reader.too_long == 1
    assert reader.feed(b"0123456789A\nlast") == []
    assert reader.too_long == 2
    assert reader.finish() == b"last"


# -- 6. no prompt text anywhere ---------------------------------------------------------------
def test_no_prompt_text_reaches_a_metric_or_a_log_record(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, every level
    path, stats, follower = followed_empty_log(tmp_path, server="s")
    write(path, prompt_line(2 * MIB),  # too long
          prompt_line(2000, ending=""),  # an SGLang line of another kind
          f"[2026-11-29 11:51:16 TP0] Prefill batch, #new-seq: {MARKER}, #new-token: 1",
          f"[2026-11-29 11:52:00 TP0] KV cache pool is full. Retract requests. "
          f"#retracted_reqs: 3 {MARKER}",
          f"{MARKER} [2026-11-29 11:51:14 TP0] Prefill batch",  # not SGLang's
          "\xff\xfe" + MARKER)
    follower.poll()
    os.remove(path)
    follower.poll()  # state changes log too
    os.mkfifo(path)
    follower.poll()
    text = prompt_line(MIB + 5).encode() + b"\n"
    chunks = [text[i:i + 100_000] for i in range(0, len(text), 100_000)]
    docker = DockerLogFollower(FakeDocker(FakeContainer("c", log_chunks=chunks)), "c",
                               LogStats(), server="d")
    stop = threading.Event()
    docker.start(stop)
    time.sleep(0.3)
    stop.set()
    registry = CollectorRegistry()
    registry.register(GuardedCollector([LogCollector([follower, docker])]))
    exposition = generate_latest(registry).decode()
    assert "sglang_obs_log_source_up" in exposition
    assert MARKER not in exposition
    assert stats.snapshot().retracted_requests == 3
    assert caplog.records  # the state changes were logged...
    for record in caplog.records:  # ...and nothing of a line with them
        assert MARKER not in record.getMessage()
        assert MARKER not in repr(record.args)
        assert MARKER not in (record.exc_text or "")
    os.remove(path)


def test_analyze_log_prints_no_prompt_text(tmp_path):
    log = tmp_path / "sglang.log"
    write(log, CAPACITY, prompt_line(MIB + 5), prompt_line(3000), prefill(5),
          f"{MARKER} " + FORGED, mode="w")
    for args in ([], ["--json"], ["--csv-per-minute", str(tmp_path / "m.csv")]):
        out = subprocess.run([EXE, "analyze-log", str(log), *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert MARKER not in out.stdout + out.stderr
    assert MARKER not in (tmp_path / "m.csv").read_text()
    doc = json.loads(subprocess.run([EXE, "analyze-log", str(log), "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert doc["peaks"]["pending_tokens"]["value"] == 5
    assert doc["peaks"]["queue_requests"]["value"] == 3
    assert doc["lines"]["too_long"] == 1
    assert doc["lines"]["unparsed"] == 2


# -- 7. analyze-log within bounded memory and time ---------------------------------------------
# Linux carries the old memory's high-water mark across exec, so a child's ru_maxrss is at least
# its parent's RSS when it forked: a pytest worker that ran big tests before would be measured.
# A small wrapper forks the command and reports the command's own peak.
MEASURE = ("import os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[2:])\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
           "code = os.waitstatus_to_exitcode(status)\n"
           "sys.exit(code if code >= 0 else 128 - code)\n")


def run_measured(args, tmp_path, timeout=60.0):
    """Run the CLI; returns (exit code, stdout, stderr, peak RSS in bytes, seconds)."""
    out, err, rss = tmp_path / "stdout", tmp_path / "stderr", tmp_path / "maxrss"
    with open(out, "wb") as o, open(err, "wb") as e:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", MEASURE, str(rss), EXE, "analyze-log",
                                 *args], stdout=o, stderr=e, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"analyze-log {args} ran for more than {timeout} s")
    return (proc.returncode, out.read_text(), err.read_text(), int(rss.read_text()) * 1024,
            time.monotonic() - started)


@pytest.mark.slow
def test_analyze_log_reads_a_sparse_2_gb_file_in_bounded_memory(tmp_path):
    path = tmp_path / "sparse.log"
    path.touch()
    os.truncate(path, 2 * 1024 * MIB)  # NUL bytes, no disk
    write(path, "", CAPACITY, prefill(5))
    try:
        code, out, err, rss, seconds = run_measured([str(path)], tmp_path)
    finally:
        path.unlink()
    assert code == 0, err
    assert rss < RSS_LIMIT, f"peak RSS {rss / MIB:.0f} MiB"
    assert "1 over 64 KiB skipped" in out
    print(f"sparse 2 GB file: {seconds:.1f} s, peak RSS {rss / MIB:.0f} MiB")


@pytest.mark.slow
def test_analyze_log_skips_a_200_mb_line_in_bounded_memory(tmp_path):
    path = tmp_path / "long-line.log"
    block = ("lorem ipsum " * 87381).encode()  # ~1 MiB, no newline
    with open(path, "wb") as f:
        f.write((CAPACITY + "\n" + prefill(5) + "\n").encode())
        f.write(f"[2026-11-29 11:51:20 TP0] Receive: text='{MARKER} ".encode())
        for _ in range(200):
            f.write(block)
        f.write((FORGED + "\n" + prefill(6, minute=52) + "\n").encode())
    try:
        code, out, err, rss, seconds = run_measured([str(path), "--json"], tmp_path)
    finally:
        path.unlink()
    assert code == 0, err
    assert rss < RSS_LIMIT, f"peak RSS {rss / MIB:.0f} MiB"
    doc = json.loads(out)
    assert doc["lines"]["too_long"] == 1
    assert doc["peaks"]["pending_tokens"]["value"] == 6  # not the forged 999999999
    assert doc["peaks"]["queue_requests"]["value"] == 3
    assert MARKER not in out + err
    print(f"one 200 MB line: {seconds:.1f} s, peak RSS {rss / MIB:.0f} MiB")


@pytest.mark.slow
def test_analyze_log_streams_a_gzip_bomb_in_bounded_memory(tmp_path):
    # 2 GiB of zeros in ~2 MB: eight gzip members of 256 MiB each (one compressed, repeated).
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zero = bytes(MIB)
    member = b"".join([c.compress(zero) for _ in range(256)] + [c.flush()])
    bomb = tmp_path / "bomb.log.gz"
    with open(bomb, "wb") as f:
        for _ in range(8):
            f.write(member)
    real = tmp_path / "sglang.log"
    write(real, CAPACITY, prefill(5), mode="w")
    try:
        code, out, err, rss, seconds = run_measured([str(bomb), str(real)], tmp_path)
    finally:
        bomb.unlink()
    assert code == 0, err
    assert rss < RSS_LIMIT, f"peak RSS {rss / MIB:.0f} MiB"
    assert "1 over 64 KiB skipped" in out
    print(f"2 GiB gzip bomb: {seconds:.1f} s, peak RSS {rss / MIB:.0f} MiB")


@pytest.mark.parametrize(("make", "code", "message"), [  # a file it cannot read: a failure, 1
    (lambda p: p.mkdir(), 1, "is a directory"),
    (lambda p: None, 1, "no such file"),
    (lambda p: p.symlink_to("/dev/zero"), 1, "not a regular file"),
    (lambda p: p.write_bytes(gzip.compress(((CAPACITY + "\n") * 5000).encode())[:-100]), 1,
     "truncated gzip"),
    (lambda p: p.write_bytes(b"\x1f\x8b" + b"\x00" * 100), 1, "corrupt gzip"),
])
def test_analyze_log_names_the_file_it_cannot_read(tmp_path, make, code, message):
    path = tmp_path / "odd.log.gz"
    make(path)
    result = subprocess.run([EXE, "analyze-log", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == code
    assert message in result.stderr
    assert str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
