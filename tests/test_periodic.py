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


def test_a_failing_cycle_is_logged_once_with_the_loop_name_and_the_loop_goes_on(caplog):
    # Prepare
    caplog.set_level(logging.DEBUG, logger="sglang_obs.exporter.periodic")
    # Act: cycles 1 and 2 of 5 raise
    starts = run_loop(durations=[0.1], cycles=5, fail_on=frozenset({1, 2}))
    # Check: all five ran on time; one record, with its traceback, per failed cycle
    assert starts == [0.0, 1.0, 2.0, 3.0, 4.0]
    records = [r for r in caplog.records if r.name == "sglang_obs.exporter.periodic"]
    assert len(records) == 2, [r.getMessage() for r in records]
    for record, n in zip(records, (1, 2), strict=True):
        assert record.levelno == logging.ERROR
        assert "test loop" in record.getMessage()
        assert record.exc_info
        assert str(record.exc_info[1]) == f"cycle {n} broke"


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
