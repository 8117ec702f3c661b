"""Files the commands and followers are given or find: a FIFO, a device or a directory never
blocks a command (one line, exit 1), and a file found in a directory is read only if it is in
that directory: an hourly record file that is a symbolic link out of it (to /etc/shadow, say) is
refused unopened, counted once as a rejected file, and the legit files are still followed.

Every command runs under a timeout and every follower poll in a thread with a deadline, so each
test ends by itself.
"""

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.core.cli_support import Failure
from sglang_obs.exporter import request_follow
from sglang_obs.exporter.collector import GuardedCollector, RequestCollector
from sglang_obs.exporter.log_follow import FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.request_follow import RequestRecordDir
from sglang_obs.exporter.request_records import RequestStats
from sglang_obs.tools import alert_delivery as delivery
from sglang_obs.tools import stack

from helpers import poll_within

EXE = str(Path(sys.executable).parent / "sglang-obs")
T0 = 1764410400.0
OUTSIDE_TOKENS = 777_777  # a prompt size only the outside file has (class ge_128k)
CAPACITY = ("[2026-11-29 11:00:00 TP0] max_total_num_tokens=1130000, chunked_prefill_size=4096, "
            "max_prefill_tokens=16384, max_running_requests=44, context_len=262144")
PREFILL = ("[2026-11-29 11:51:14 TP0] Prefill batch, #new-seq: 1, #new-token: 4000, "
           "#cached-token: 90000, token usage: 0.31, #running-req: 8, #queue-req: 3, "
           "#pending-token: 5, cuda graph: False, input throughput (token/s): 1234.56")


def rec(prompt_tokens=4000, e2e=2.0):
    return json.dumps({"request_parameters": "{}", "id": "a" * 32,
                       "finish_reason": {"type": "stop"}, "prompt_tokens": prompt_tokens,
                       "completion_tokens": 50, "cached_tokens": 0, "queue_time": 0.1,
                       "e2e_latency": e2e, "forward_entry_time": T0 + 0.1,
                       "prefill_finished_time": T0 + 0.5, "request_received_ts": T0,
                       "request_finished_ts": T0 + e2e})


def hour(n):
    return f"sglang-request-metrics-20261129_{n:02d}.log"


def append(path, *lines):
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def run(*args, timeout=10, **kwargs):
    """The real command; a test fails (instead of hanging) if it blocks."""
    try:
        return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`sglang-obs {' '.join(map(str, args))}` blocked for {timeout} s")


@contextlib.contextmanager
def opened_paths():
    """Every path os.open is asked for while the block runs (the followers open through it)."""
    seen, real_open = [], os.open

    def spy(path, *args, **kwargs):
        seen.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    os.open = spy
    try:
        yield seen
    finally:
        os.open = real_open


def unblock(fifo):
    """Open the FIFO's other end: frees a reader stuck in open() should the fix regress."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# -- 1. a FIFO, a device or a directory never blocks a command -------------------------------
@pytest.mark.parametrize("command", ["analyze-requests", "analyze-log"])
def test_a_fifo_nothing_writes_to_exits_at_once_with_one_line(tmp_path, command):
    fifo = tmp_path / "sglang-request-metrics-20261129_10.log"
    os.mkfifo(fifo)
    result = run(command, fifo, timeout=8)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(fifo) in lines[0]
    assert "FIFO" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["analyze-requests", "analyze-log"])
@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    (lambda p: p.symlink_to("/dev/null"), "not a regular file"),
])
def test_a_device_is_one_line_and_exit_1(tmp_path, command, make, message):
    path = tmp_path / "odd.log"
    make(path)
    result = run(command, path)
    assert result.returncode == 1
    assert [message in line and str(path) in line
            for line in result.stderr.strip().splitlines()] == [True]


def test_a_pipe_something_writes_to_is_still_read(tmp_path):
    """`analyze-requests <(ssh host cat …)` and `… | analyze-requests /dev/stdin`: a pipe with
    a writer is read to its end (the documented "regular files and pipes")."""
    data = "".join(rec() + "\n" for _ in range(3))
    result = run("analyze-requests", "/dev/stdin", "--json", input=data)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 3
    log = f"{CAPACITY}\n{PREFILL}\n"
    result = run("analyze-log", "/dev/stdin", "--json", input=log)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["peaks"]["pending_tokens"]["value"] == 5


def test_a_fifo_in_a_records_directory_is_skipped_and_the_rest_analysed(tmp_path):
    """One odd file among an hour's files: a line saying it was skipped, the rest analysed
    (the user named the directory, not that file), exit 0."""
    directory = tmp_path / "records"
    directory.mkdir()
    append(directory / hour(10), rec(), rec())
    os.mkfifo(directory / hour(11))
    (directory / hour(12)).mkdir()
    try:
        result = run("analyze-requests", directory, "--json")
    finally:
        unblock(directory / hour(11))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 2
    skipped = result.stderr.strip().splitlines()
    assert len(skipped) == 2, skipped
    assert all("skipped" in line and "not a regular file" in line for line in skipped)
    assert any(hour(11) in line for line in skipped)
    assert any(hour(12) in line for line in skipped)


# -- 2. no symbolic link out of the directory --------------------------------------------------
@pytest.fixture
def records_dir(tmp_path):
    """A records directory beside an `outside` one holding a file of records that must never
    be read through the directory."""
    directory, outside = tmp_path / "records", tmp_path / "outside"
    directory.mkdir()
    outside.mkdir()
    append(outside / "shadow", *[rec(OUTSIDE_TOKENS)] * 7)
    return directory, outside


def test_analyze_requests_skips_a_symlink_out_of_the_directory(records_dir):
    directory, outside = records_dir
    append(directory / hour(10), rec(), rec())
    (directory / hour(11)).symlink_to(outside / "shadow")
    result = run("analyze-requests", directory, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["records"] == 2  # the outside file's 7 are not read
    assert doc["classes"]["ge_128k"]["requests"] == 0
    assert doc["files"] == [str(directory / hour(10))]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "skipped" in lines[0]
    assert hour(11) in lines[0]
    assert "outside" in lines[0]


def test_analyze_requests_reads_a_symlink_the_user_names(records_dir):
    """Named on the command line, a link is the user's choice (as the scheduler log path is the
    operator's): read."""
    directory, outside = records_dir
    link = directory / "mine.log"
    link.symlink_to(outside / "shadow")
    result = run("analyze-requests", link, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 7


def test_a_directory_of_only_refused_files_is_one_line_and_exit_1(records_dir):
    directory, outside = records_dir
    (directory / hour(11)).symlink_to(outside / "shadow")
    result = run("analyze-requests", directory)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(directory) in lines[0]
    assert "outside" in lines[0]


@pytest.fixture
def follow(records_dir):
    directory, _ = records_dir
    now = [0.0]

    def make():
        stats = RequestStats()
        return RequestRecordDir(str(directory), stats, server="s:1", clock=lambda: now[0]), stats

    make.clock = now
    return make


def exposition(source) -> str:
    registry = CollectorRegistry()
    registry.register(GuardedCollector([RequestCollector([source], lambda s: "m")]))
    return generate_latest(registry).decode()


def test_the_follower_never_opens_a_next_hour_symlink_out_of_the_directory(records_dir, follow,
                                                                           caplog):
    caplog.set_level(logging.DEBUG)
    directory, outside = records_dir
    append(directory / hour(10), rec())
    source, stats = follow()
    with opened_paths() as opened:
        poll_within(source)
        (directory / hour(11)).symlink_to(outside / "shadow")  # the next hour: out of here
        append(directory / hour(10), rec(), rec())  # the current hour still being written
        for _ in range(3):
            follow.clock[0] += request_follow.RESCAN_SECONDS  # rescans see it each time
            poll_within(source)
        snap = stats.snapshot()
        assert snap.prompt_tokens["ge_128k"] == 0  # nothing of the outside file was read
        assert snap.records == 2  # the current hour is still followed
        assert source.file.endswith(hour(10))
        assert source.up
        append(directory / hour(12), rec(), rec(), rec())  # a legit next hour
        for _ in range(2):
            follow.clock[0] += request_follow.RESCAN_SECONDS
            poll_within(source)
    assert stats.snapshot().records == 5
    assert source.file.endswith(hour(12))
    assert stats.snapshot().prompt_tokens["ge_128k"] == 0
    real = os.path.realpath(outside / "shadow")
    assert not [p for p in opened if os.path.realpath(p) == real
                or os.path.basename(p) == hour(11)], opened  # never opened
    assert stats.snapshot().rejected_files == {"symlink_outside": 1}  # once, not per rescan
    text = exposition(source)
    assert ('sglang_obs_request_files_rejected_total{reason="symlink_outside",server="s:1"} 1.0'
            in text)
    warnings = [r.getMessage() for r in caplog.records
                if r.name.startswith("sglang_obs.exporter.request")
                and r.levelno >= logging.WARNING and hour(11) in r.getMessage()]
    assert len(warnings) == 1, warnings  # logged once, naming the file, not its target's text
    source.close()


def test_a_symlink_out_to_a_fifo_never_blocks_and_is_never_opened(records_dir, follow):
    """The outside target is a FIFO: opened, it would block (or, non-blocking, be read)."""
    directory, outside = records_dir
    fifo = outside / "pipe"
    os.mkfifo(fifo)
    source, stats = follow()
    poll_within(source)
    (directory / hour(10)).symlink_to(fifo)
    try:
        with opened_paths() as opened:
            for _ in range(3):
                follow.clock[0] += request_follow.RESCAN_SECONDS
                poll_within(source)
    finally:
        unblock(fifo)
    assert not [p for p in opened if os.path.realpath(p) == str(fifo)], opened
    assert stats.snapshot().rejected_files == {"symlink_outside": 1}
    assert source.up  # the directory is fine; that file is not followed
    append(directory / hour(11), rec())
    follow.clock[0] += request_follow.RESCAN_SECONDS
    poll_within(source)
    assert stats.snapshot().records == 1


def test_a_symlink_into_a_subdirectory_is_refused_too(records_dir, follow):
    """A subdirectory could be swapped for a link between the check and the open."""
    directory, _ = records_dir
    sub = directory / "sub"
    sub.mkdir()
    append(sub / "x.log", rec(OUTSIDE_TOKENS))
    source, stats = follow()
    poll_within(source)
    (directory / hour(10)).symlink_to(sub / "x.log")
    follow.clock[0] += request_follow.RESCAN_SECONDS
    poll_within(source)
    assert stats.snapshot().records == 0
    assert stats.snapshot().rejected_files == {"symlink_outside": 1}


def test_a_symlink_to_a_file_in_the_same_directory_is_followed(records_dir, follow):
    """Decided: a link to a file in the directory itself exposes nothing the directory does not;
    it is read (through the real path, opened with O_NOFOLLOW)."""
    directory, _ = records_dir
    source, stats = follow()
    poll_within(source)
    append(directory / "hour-10-data", rec(), rec())
    (directory / hour(10)).symlink_to("hour-10-data")  # relative, as `ln -s` makes it
    follow.clock[0] += request_follow.RESCAN_SECONDS
    poll_within(source)
    assert stats.snapshot().records == 2
    assert stats.snapshot().rejected_files == {}
    append(directory / "hour-10-data", rec())
    poll_within(source)
    assert stats.snapshot().records == 3
    source.close()


def test_a_followed_link_retargeted_out_of_the_directory_is_dropped_unread(records_dir, follow):
    directory, outside = records_dir
    append(directory / "data", rec())
    (directory / hour(10)).symlink_to("data")
    source, stats = follow()
    poll_within(source)
    assert source.up
    link = directory / hour(10)
    tmp = directory / "link.tmp"
    tmp.symlink_to(outside / "shadow")
    os.replace(tmp, link)  # atomically: now a link out of the directory
    with opened_paths() as opened:
        for _ in range(3):
            follow.clock[0] += request_follow.RESCAN_SECONDS
            poll_within(source)
    assert not [p for p in opened if "shadow" in os.path.realpath(p)], opened
    assert stats.snapshot().prompt_tokens["ge_128k"] == 0
    assert stats.snapshot().rejected_files == {"symlink_outside": 1}
    source.close()


def test_the_scheduler_log_path_may_be_a_symlink_anywhere(tmp_path):
    """The scheduler log's path is the operator's (/var/log/sglang.log -> a dated file,
    /var/log/containers/*.log -> /var/log/pods/…): a link there is followed, wherever it
    points."""
    real = tmp_path / "elsewhere" / "sglang-2026-11-29.log"
    real.parent.mkdir()
    append(real, CAPACITY)
    link = tmp_path / "logs" / "sglang.log"
    link.parent.mkdir()
    link.symlink_to(real)
    stats = LogStats()
    follower = FileFollower(str(link), stats)
    poll_within(follower)
    assert follower.up
    append(real, PREFILL)
    assert poll_within(follower) == 1
    follower.close()


# -- 3. the other commands' input files ----------------------------------------------------------
def in_thread(fn, seconds=5.0):
    """fn() in a thread: its result or the exception it raised; fails if it blocks."""
    out = {}

    def target():
        try:
            out["result"] = fn()
        except Exception as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    return out


def on_a_fifo(fifo: Path, fn):
    """in_thread(fn) with `fifo` made a FIFO nothing writes to (unblocked after)."""
    os.mkfifo(fifo)
    try:
        return in_thread(fn)
    finally:
        unblock(fifo)


def test_snapshot_alerts_log_that_is_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "alerts.jsonl"
    out = on_a_fifo(fifo, lambda: delivery.read_alerts_log(fifo))
    assert isinstance(out.get("error"), delivery.DeliveryError), out
    assert str(fifo) in str(out["error"])
    assert "FIFO" in str(out["error"])


def test_a_fifo_beside_the_alerts_log_is_an_error_not_a_hang(tmp_path):
    log = tmp_path / "alerts.jsonl"
    log.write_text(json.dumps({"labels": {"alertname": "A"}}) + "\n")
    os.mkfifo(tmp_path / "alerts.jsonl.1")  # where the sink's rotated files go
    try:
        out = in_thread(lambda: delivery.read_alerts_log(log))
    finally:
        unblock(tmp_path / "alerts.jsonl.1")
    assert isinstance(out.get("error"), delivery.DeliveryError), out
    assert "alerts.jsonl.1" in str(out["error"])


def test_stack_override_that_is_a_fifo_nothing_writes_to_fails_at_once(tmp_path):
    fifo = tmp_path / "override.yml"
    out = on_a_fifo(fifo, lambda: stack._override_global(fifo))
    assert isinstance(out.get("error"), Failure), out
    assert str(fifo) in str(out["error"])
    assert "FIFO" in str(out["error"])


def test_stack_override_from_a_pipe_is_still_read():
    """`--override <(echo 'global: …')`: a pipe with something written to it is read."""
    r, w = os.pipe()
    os.write(w, b"global:\n  scrape_interval: 5s\n")
    os.close(w)
    try:
        out = in_thread(lambda: stack._override_global(Path(f"/dev/fd/{r}")))
    finally:
        os.close(r)
    assert out.get("result") == {"scrape_interval": "5s"}, out


def test_render_dashboard_with_a_fifo_for_a_dashboard_exits_at_once(tmp_path):
    fifo = tmp_path / "mine.json"
    os.mkfifo(fifo)
    try:
        result = run("render-dashboard", "--scenario", "healthy", "--dashboard", fifo,
                     "--out", tmp_path / "x.png", timeout=30)
    finally:
        unblock(fifo)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(fifo) in lines[0]
    assert "FIFO" in lines[0]


@pytest.mark.parametrize(("command", "flag"), [("analyze-requests", "--csv"),
                                               ("analyze-log", "--csv-per-minute")])
def test_a_csv_output_that_is_a_fifo_nothing_reads_from_exits_at_once(tmp_path, command, flag):
    """open() for writing waits for a reader forever: refused at once, one line, exit 1."""
    records, log = append(tmp_path / hour(10), rec()), append(tmp_path / "s.log", PREFILL)
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    try:
        result = run(command, records if command == "analyze-requests" else log, flag, fifo,
                     timeout=8)
    finally:
        with contextlib.suppress(OSError):  # a reader frees a writer stuck in open()
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(fifo) in lines[0]
    assert "FIFO" in lines[0]


def test_a_csv_output_to_a_pipe_with_a_reader_and_to_dev_null_is_written(tmp_path):
    records = append(tmp_path / hour(10), rec())
    assert run("analyze-requests", records, "--csv", "/dev/null").returncode == 0
    result = subprocess.run(["bash", "-c", f'"{EXE}" analyze-requests "{records}" --csv '
                             f'>(cat > "{tmp_path}/copy.csv")'], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    for _ in range(50):  # the substituted process may finish just after
        if (tmp_path / "copy.csv").stat().st_size if (tmp_path / "copy.csv").exists() else 0:
            break
        time.sleep(0.1)
    assert (tmp_path / "copy.csv").read_text().startswith("minute,prompt_class")


def test_an_api_key_file_that_is_a_fifo_fails_the_exporters_start_at_once(tmp_path):
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    exporter = str(Path(sys.executable).parent / "sglang-exporter")
    try:
        result = subprocess.run([exporter, "--sglang.url", "http://127.0.0.1:1",
                                 "--sglang.api-key-file", str(fifo),
                                 "--web.listen-address", "127.0.0.1:0"],
                                capture_output=True, text=True, timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("the exporter blocked opening a FIFO as its API key file")
    finally:
        unblock(fifo)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "api-key-file" in result.stderr
    assert "FIFO" in result.stderr


def test_an_alert_sink_log_file_that_is_a_fifo_fails_at_once(tmp_path):
    fifo = tmp_path / "alerts.jsonl"
    os.mkfifo(fifo)
    try:
        result = run("alert-sink", "--listen", "127.0.0.1:0", "--log-file", fifo, timeout=8)
    finally:
        unblock(fifo)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--log-file" in result.stderr
    assert "FIFO" in result.stderr
