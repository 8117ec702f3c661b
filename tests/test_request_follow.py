"""The request-record directory follower: hourly files, rotation, truncation, deletion, garbage
and huge lines, a directory that vanishes or is replaced, a FIFO in a file's place. It never
blocks or raises, says the source is down while it is, logs once per change of state, and no
text of a record reaches its log.

Every loop is a bounded number of polls, so each test ends by itself.
"""

import json
import logging
import os

import pytest

from sglang_obs.exporter import request_follow
from sglang_obs.exporter.log_follow import MAX_BYTES_PER_POLL
from sglang_obs.exporter.request_follow import RequestRecordDir
from sglang_obs.exporter.request_records import MAX_RECORD_BYTES, RequestStats

from helpers import poll_within

MARKER = "PROMPT-MARKER-7f3a9c"
T0 = 1764410400.0


def rec(prompt_tokens=4000, e2e=2.0, **extra):
    body = {"request_parameters": json.dumps({"text": MARKER * 3}), "id": "a" * 32,
            "finish_reason": {"type": "stop", "matched": MARKER}, "prompt_tokens": prompt_tokens,
            "completion_tokens": 50, "cached_tokens": 0, "queue_time": 0.1, "e2e_latency": e2e,
            "forward_entry_time": T0 + 0.1, "prefill_finished_time": T0 + 0.5,
            "request_received_ts": T0, "request_finished_ts": T0 + e2e, **extra}
    return json.dumps(body)


def hour(n):
    return f"sglang-request-metrics-20261129_{n:02d}.log"


def append(path, *lines):
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def follow(tmp_path):
    clock = Clock()

    def make(directory=None):
        stats = RequestStats()
        source = RequestRecordDir(str(directory or tmp_path), stats, server="s:1", clock=clock)
        return source, stats

    make.clock = clock
    return make


def records(stats):
    return stats.snapshot().records


def follower_logs(caplog):
    return [r for r in caplog.records if r.name.startswith("sglang_obs.exporter.request")]


def test_history_in_the_newest_file_at_start_is_skipped_and_new_records_are_read(
        tmp_path, follow):
    append(tmp_path / hour(10), rec(), rec())
    source, stats = follow()
    poll_within(source)
    assert source.up
    assert records(stats) == 0
    append(tmp_path / hour(10), rec(), rec(), rec())
    poll_within(source)
    assert records(stats) == 3


def test_a_file_appearing_in_an_empty_directory_is_read_from_its_first_line(tmp_path, follow):
    source, stats = follow()
    poll_within(source)
    assert source.up
    assert source.state == "no record file yet"
    append(tmp_path / hour(10), rec(), rec())
    follow.clock.t += 1  # same mtime granularity or not: the directory changed
    poll_within(source)
    assert records(stats) == 2
    assert source.file.endswith(hour(10))


def test_the_next_hour_finishes_the_old_file_then_reads_the_new_one_whole(tmp_path, follow):
    append(tmp_path / hour(10), rec())
    source, stats = follow()
    poll_within(source)
    append(tmp_path / hour(10), rec(), rec())  # the old hour's last records...
    append(tmp_path / hour(11), rec(), rec(), rec())  # ...and the new hour's first
    poll_within(source)
    assert records(stats) == 5
    assert source.file.endswith(hour(11))
    assert source.rotations == 1
    append(tmp_path / hour(11), rec())
    poll_within(source)
    assert records(stats) == 6
    # An older file growing does not take the follower back.
    append(tmp_path / hour(9), rec())
    poll_within(source)
    assert source.file.endswith(hour(11))
    assert records(stats) == 6


def test_a_new_file_seen_only_by_the_periodic_rescan(tmp_path, follow, monkeypatch):
    """A file system whose mtime is too coarse to show the new file: the rescan finds it."""
    append(tmp_path / hour(10), rec())
    source, stats = follow()
    poll_within(source)
    mtime = os.stat(tmp_path).st_mtime_ns
    append(tmp_path / hour(11), rec())
    os.utime(tmp_path, ns=(mtime, mtime))  # as if the directory had not changed
    poll_within(source)
    assert source.file.endswith(hour(10))
    follow.clock.t += request_follow.RESCAN_SECONDS
    poll_within(source)
    assert source.file.endswith(hour(11))
    assert records(stats) == 1


def test_truncation_and_replacement_of_the_followed_file(tmp_path, follow):
    path = tmp_path / hour(10)
    append(path, rec())
    source, stats = follow()
    poll_within(source)
    append(path, rec(), rec())
    poll_within(source)
    with open(path, "w") as f:  # copytruncate
        f.write(rec() + "\n")
    poll_within(source)
    assert records(stats) == 3
    assert source.rotations == 1
    os.replace(_write(tmp_path / "new", rec(), rec()), path)  # a new file under the same name
    poll_within(source)
    assert records(stats) == 5
    assert source.rotations == 2


def _write(path, *lines):
    append(path, *lines)
    return path


def test_a_deleted_file_keeps_its_last_records_then_the_next_hour_follows(tmp_path, follow):
    path = tmp_path / hour(10)
    append(path, rec())
    source, stats = follow()
    poll_within(source)
    with open(path, "a") as f:  # SGLang keeps writing through its open file
        os.remove(path)
        f.write(rec() + "\n")
        f.flush()
        poll_within(source)
        assert records(stats) == 1
        assert source.up
    append(tmp_path / hour(11), rec())
    poll_within(source)
    assert records(stats) == 2
    assert source.file.endswith(hour(11))


def test_garbage_and_a_10_mb_line_are_counted_and_the_next_record_is_read(tmp_path, follow,
                                                                         caplog):
    caplog.set_level(logging.DEBUG, "sglang_obs.exporter")
    source, stats = follow()
    poll_within(source)
    path = tmp_path / hour(10)
    with open(path, "w") as f:
        f.write(rec() + "\n")
        f.write("{" + ('"x": "' + MARKER) * 10 + "\n")  # a cut line
        f.write(MARKER * 20 + "\n")
        f.write('{"request_parameters": "' + "y" * (10 * 1024 * 1024) + MARKER + '"}\n')
        f.write(rec(e2e=float("nan")) + "\n")
        f.write(rec(e2e=-3.0) + "\n")
        f.write("\n\n")
        f.write(rec() + "\n")
    for _ in range(5):
        poll_within(source)
    snap = stats.snapshot()
    assert snap.records == 2
    assert snap.rejected == {"not_json": 2, "too_long": 1, "not_finite": 1, "negative": 1}
    text = caplog.text
    assert MARKER not in text
    assert len([r for r in follower_logs(caplog) if r.levelname == "WARNING"]) == 4


def test_reading_is_bounded_per_poll_and_the_old_hour_is_finished_first(tmp_path, follow):
    source, stats = follow()
    poll_within(source)
    line = rec() + " " * 4000  # ~4.5 KB records
    n = 2 * MAX_BYTES_PER_POLL // len(line) + 500  # more than two polls' worth
    with open(tmp_path / hour(10), "w") as f:
        f.write((line + "\n") * n)
    poll_within(source)
    first = records(stats)
    assert 0 < first < n / 2
    assert source.file.endswith(hour(10))
    append(tmp_path / hour(11), rec())
    poll_within(source)  # still the old hour: the new one waits
    assert first < records(stats) < n
    assert source.file.endswith(hour(10))
    poll_within(source)  # the rest of the old hour, then the new one
    assert records(stats) == n + 1
    assert source.file.endswith(hour(11))


def test_the_directory_vanishing_is_one_warning_and_its_return_one_line(tmp_path, follow,
                                                                       caplog):
    caplog.set_level(logging.INFO, "sglang_obs.exporter")
    directory = tmp_path / "records"
    source, stats = follow(directory)
    for _ in range(20):
        poll_within(source)
    assert not source.up
    assert source.state == "no such directory"
    directory.mkdir()
    append(directory / hour(10), rec())
    for _ in range(20):
        poll_within(source)
    assert source.up
    assert records(stats) == 1
    os.remove(directory / hour(10))
    directory.rmdir()
    directory.write_text("now a file")
    for _ in range(20):
        poll_within(source)
    assert not source.up
    assert source.state == "not a directory"
    states = [(r.levelname, r.getMessage()) for r in follower_logs(caplog)]
    assert [level for level, _ in states] == ["WARNING", "INFO", "WARNING"], states
    assert all(str(directory) in message and MARKER not in message for _, message in states)


def test_a_fifo_named_like_a_record_file_never_blocks(tmp_path, follow):
    source, stats = follow()
    poll_within(source)
    os.mkfifo(tmp_path / hour(10))
    follow.clock.t += 1
    for _ in range(3):
        poll_within(source)
    assert source.up
    assert records(stats) == 0
    os.remove(tmp_path / hour(10))
    append(tmp_path / hour(10), rec())
    for _ in range(3):
        poll_within(source)
    assert records(stats) == 1


def test_a_directory_of_too_many_entries_is_refused_not_listed_each_time(tmp_path, follow,
                                                                        monkeypatch):
    monkeypatch.setattr(request_follow, "MAX_ENTRIES", 50)
    for i in range(60):
        (tmp_path / f"other-{i}").write_text("")
    source, _ = follow()
    poll_within(source)
    assert not source.up
    assert "over 50 entries" in source.state


def test_an_unreadable_directory_is_down(tmp_path, follow):
    if os.geteuid() == 0:
        pytest.skip("root reads any directory")
    directory = tmp_path / "locked"
    directory.mkdir()
    directory.chmod(0)
    try:
        source, _ = follow(directory)
        poll_within(source)
        assert not source.up
        assert "cannot list" in source.state
    finally:
        directory.chmod(0o755)


def test_the_record_limit_is_large_enough_for_a_long_context_record():
    # text and input ids of a 262K-token prompt are ~3 MB in request_parameters
    assert MAX_RECORD_BYTES >= 8 * 1024 * 1024 > 10 * 1000 * 1000 * 0.8
