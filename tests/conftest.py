import contextlib
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))

from sglang_obs.exporter.collector import GuardedCollector, SGLangCollector
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.generate.backfill import backfill, prometheus, scenario_of

from fake_sglang import FakeSGLang

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite golden files instead of comparing against them")


# Tests that mostly wait on the clock (about 17 and 7 minutes of real binaries at their shipped
# intervals): collected first, so that under `make test` (-n 3, --dist loadfile,
# --no-loadscope-reorder) each starts at once on a worker of its own and overlaps the CPU-bound
# rest. xdist's default order (most tests per file first) queued these one-test files last.
RUN_FIRST = ("test_alert_timing.py", "test_fleet.py")


def pytest_collection_modifyitems(config, items):
    per_file = Counter(item.path.name for item in items)

    def order(item):
        name = item.path.name
        first = RUN_FIRST.index(name) if name in RUN_FIRST else len(RUN_FIRST)
        return first, -per_file[name], name  # then the larger files, each kept whole

    items.sort(key=order)  # stable: a file's tests keep their order


def require_binary(name: str, package: str = "prometheus prometheus-alertmanager") -> str:
    """Path of a real tool (Prometheus's, Chromium); skip locally when absent, fail under
    CI=true."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not installed (apt-get install {package})"
    if os.environ.get("CI") == "true":
        pytest.fail(message + ": CI must install it")
    pytest.skip(message)


@pytest.fixture
def fake_sglang():
    servers = []

    def start(routes=None, port=0):
        server = FakeSGLang(routes, port=port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        with contextlib.suppress(OSError):
            server.stop()


@pytest.fixture
def make_registry():
    """Registry with the SGLang collector over pollers for the given URLs (polled by hand)."""

    def make(*urls, settings=None):
        settings = settings or PollSettings(timeout=1.0)
        pollers = [TargetPoller(u, settings) for u in urls]
        registry = CollectorRegistry()
        registry.register(GuardedCollector([SGLangCollector(pollers)]))
        return registry, pollers

    return make


@pytest.fixture(scope="session")
def backfilled(tmp_path_factory):
    """backfilled(name, release=None) -> (Backfilled, url): the shipped scenario `name` rendered
    as `release` (default: the scenario's own), backfilled with the recording rules and the
    ALERTS series of the alert rules, and served
    by a real Prometheus; done once per test session for each (scenario, release), the
    Prometheus kept until the session ends. Callers only query it."""
    served = {}
    with contextlib.ExitStack() as stack:

        def get(name, release=None):
            require_binary("promtool")
            require_binary("prometheus")
            key = (name, release or scenario_of(name).release)
            if key not in served:
                b = backfill(name, tmp_path_factory.mktemp(name) / "data", release=key[1],
                             alerts=True)
                served[key] = (b, stack.enter_context(prometheus(b.data)))
            return served[key]

        yield get


@pytest.fixture(scope="session")
def incident_pack(backfilled, tmp_path_factory):
    """(Backfilled, url, pack folder, snapshot's stdout): `sglang-obs snapshot` of the whole
    backfilled seed 000 incident (long-context-incident), taken once per session. Callers only
    read it."""
    b, url = backfilled("long-context-incident")
    out = tmp_path_factory.mktemp("incident") / "pack"
    result = subprocess.run([str(Path(sys.executable).parent / "sglang-obs"), "snapshot",
                             "--prometheus", url, "--from", str(b.start), "--to", str(b.end),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return b, url, out, result.stdout
