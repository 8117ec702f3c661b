import logging
import threading
import time

from sglang_obs.exporter.periodic import Periodic


class FakeTime:
    """A clock that only moves when a cycle "works" or the loop waits; the stop event sets
    itself after `cycles` cycles, so the loop runs in the test's thread, deterministically."""

    def __init__(self, cycles: int):
        self.now = 100.0
        self.starts: list[float] = []
        self.stop = _CountingStop(self, cycles)

    def clock(self) -> float:
        return self.now

    def cycle(self, durations: list[float], fail_on: frozenset[int] = frozenset()):
        def run() -> None:
            n = len(self.starts)
            self.starts.append(self.now)
            self.now += durations[n % len(durations)]
            if n in fail_on:
                raise RuntimeError(f"cycle {n} broke")
        return run


class _CountingStop(threading.Event):
    def __init__(self, fake: FakeTime, cycles: int):
        super().__init__()
        self._fake, self._cycles = fake, cycles

    def wait(self, timeout: float) -> bool:
        assert timeout >= 0  # a negative wait would mean the loop lost its schedule
        self._fake.now += timeout
        if len(self._fake.starts) >= self._cycles:
            self.set()
        return self.is_set()


def run_loop(durations, cycles, interval=1.0, fail_on=frozenset()) -> list[float]:
    fake = FakeTime(cycles)
    Periodic("test loop", fake.cycle(durations, fail_on), interval, fake.clock).run(fake.stop)
    return [round(t - 100.0, 6) for t in fake.starts]


def test_cycles_start_at_a_fixed_rate_whatever_each_takes():
    # Act
    starts = run_loop(durations=[0.3, 0.05, 0.9], cycles=6)
    # Check: every interval from the first start, no drift by the cycles' own duration
    assert starts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_an_overrun_skips_the_missed_ticks_instead_of_bursting():
    # Act: the second cycle takes 2.5 intervals
    starts = run_loop(durations=[0.2, 2.5, 0.2, 0.2, 0.2], cycles=5)
    # Check: the next cycle runs at once, then the rate resumes from there; ticks 2 and 3 are
    # skipped, not made up in a run of back-to-back cycles
    assert starts == [0.0, 1.0, 3.5, 4.5, 5.5]


def test_a_failure_streak_logs_one_traceback_and_one_recovery_line(caplog):
    # Prepare
    caplog.set_level(logging.DEBUG, logger="sglang_obs.exporter.periodic")
    # Act: cycles 1, 2 and 3 of 8 raise, then 5 again
    starts = run_loop(durations=[0.1], cycles=8, fail_on=frozenset({1, 2, 3, 5}))
    # Check: all eight ran on time; per streak, one record with the first failure's traceback
    # and one when the loop recovers, saying how many failed
    assert starts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    records = [r for r in caplog.records if r.name == "sglang_obs.exporter.periodic"]
    assert [(r.levelno, bool(r.exc_info)) for r in records] == [
        (logging.ERROR, True), (logging.WARNING, False), (logging.ERROR, True),
        (logging.WARNING, False)], [r.getMessage() for r in records]
    assert all("test loop" in r.getMessage() for r in records)
    assert str(records[0].exc_info[1]) == "cycle 1 broke"
    assert "3 failed" in records[1].getMessage()
    assert str(records[2].exc_info[1]) == "cycle 5 broke"
    assert "1 failed" in records[3].getMessage()


def test_failures_are_counted_on_the_loop():
    fake = FakeTime(6)
    loop = Periodic("test loop", fake.cycle([0.1], frozenset({0, 2, 3})), 1.0, fake.clock)
    loop.run(fake.stop)
    assert loop.failures == 3


def test_stop_ends_the_thread_well_within_one_interval():
    # Prepare
    ran = threading.Event()
    loop = Periodic("sleepy loop", ran.set, interval=5.0)
    stop = threading.Event()
    loop.start(stop)
    assert ran.wait(2.0)
    (thread,) = [t for t in threading.enumerate() if t.name == "sleepy loop"]
    assert thread.daemon
    # Act: the loop is in its 5 s wait
    stopped_at = time.monotonic()
    stop.set()
    loop.join(timeout=5.0)
    # Check
    assert not thread.is_alive()
    assert time.monotonic() - stopped_at < 1.0
