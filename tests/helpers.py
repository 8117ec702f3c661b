"""The tests' shared helpers, one copy each: ports, waiting, a real Prometheus and queries to it
(through the project's own client, sglang_obs.core.prometheus_api), golden files, and simulator
renders computed once per test session."""

from __future__ import annotations

import contextlib
import difflib
import functools
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.core.prometheus_api import Prometheus
from sglang_obs.exporter.log_follow import FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.generate.backfill import prometheus
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import Rendered, render

from conftest import require_binary

T = TypeVar("T")


# -- processes on loopback -----------------------------------------------------------------
def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def followed_empty_log(tmp_path: Path, server: str = ""):
    """(path, stats, follower): an empty sglang.log under `tmp_path`, followed from its start."""
    path = tmp_path / "sglang.log"
    path.write_text("")
    stats = LogStats()
    follower = FileFollower(str(path), stats, server=server)
    follower.poll()
    return path, stats, follower


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Terminate, then kill what does not exit within `timeout`, and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """The first truthy answer of `predicate` within `timeout` seconds, asking every `interval`;
    past the deadline, its answer to one last call (falsy when it never came true)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    return predicate()


# -- a real Prometheus -----------------------------------------------------------------------
@contextlib.contextmanager
def running_prometheus(config_text: str, workdir: Path):
    """The project's own runner (sglang_obs.generate.backfill.prometheus) over `workdir/data`."""
    require_binary("prometheus")
    with prometheus(workdir / "data", config_text) as url:
        yield url


def query(url: str, expr: str, at: float | None = None) -> list[dict]:
    """Instant query (at `at`, default Prometheus's now): Prometheus's result list."""
    return Prometheus(url, timeout=10).query(expr, at)


def wait_query(url: str, expr: str, timeout: float = 20.0) -> list[dict]:
    """`query` until it returns something or `timeout` passes."""
    return wait_for(lambda: query(url, expr), timeout, interval=0.25)


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    """Range query: Prometheus's result list, asked in chunks under its points limit."""
    return Prometheus(url, timeout=60).range_series(expr, start, end, step)


# -- golden files ----------------------------------------------------------------------------
def assert_matches_golden(request, golden: Path, actual: str, what: str) -> None:
    """`actual` is the committed `golden` file's text; `pytest --update-golden` rewrites the
    file first (review its diff)."""
    if request.config.getoption("--update-golden"):
        golden.write_text(actual)
    expected = golden.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                        "golden", "actual"))
    assert not diff, f"{what} changed (pytest --update-golden to accept):\n{diff}"


# -- simulator renders, once per session ---------------------------------------------------
RENDERS: list[tuple] = []  # the renders computed (not answered from the cache), in order


def rendered(name: str, release: str | None = None, start: float = 0.0, step: float = 15.0,
             poll_interval: float = 5.0) -> Rendered:
    """sglang_obs.simulator.render.render of the shipped scenario `name`, computed once per
    test session for each (scenario, parameters); callers must not change what it returns."""
    release = release or scenarios.load(name).release  # None is the scenario's own release
    return _rendered(name, release, float(start), float(step), float(poll_interval))


@functools.cache
def _rendered(name: str, release: str, start: float, step: float,
              poll_interval: float) -> Rendered:
    RENDERS.append((name, release, start, step, poll_interval))
    return render(scenarios.load(name), release, start=start, step=step,
                  poll_interval=poll_interval)


def poll_within(source, seconds: float = 2.0):
    """source.poll() in a thread: fails (instead of hanging) if it blocks."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("fed", source.poll()),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"poll() blocked for more than {seconds} s"
    return result["fed"]


def family_shapes(text: str) -> dict[str, tuple]:
    """family -> (type, label names, histogram bucket bounds) of an exposition: the shape
    the simulator must share with SGLang's goldens."""
    out = {}
    for family in text_string_to_metric_families(text):
        labels, bounds = set(), set()
        for sample in family.samples:
            labels |= set(sample.labels) - ({"le"} if family.type == "histogram" else set())
            if family.type == "histogram" and "le" in sample.labels:
                bounds.add(float(sample.labels["le"]))
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, tuple(sorted(labels)), tuple(sorted(bounds)))
    return out
