"""The wheel a user installs works with no checkout: built from this tree, installed into a
fresh virtualenv outside it (with the constraints file), run from another folder.

`sglang-exporter --help`, `sglang-sim render` of one scenario, `sglang-obs rules --check` against
the installed configuration, and a `sglang-obs stack up --native --demo` whose Watchdog must
reach the alert sink within 90 s.

Why 90 s and not less: Prometheus evaluates the Watchdog within one evaluation interval (15 s) of
its start, but an alert evaluated before its notifier has learnt the Alertmanager's address (the
discovery manager's first update, about 5 s after start) is consumed without being sent; the rule
sends it again only after --rules.alert.resend-delay (1 min). Where the first evaluation falls
depends on a hash of the rule file's path, so the same wheel passes a 60 s bound from one folder and
fails it from another.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile

import pytest

from conftest import ROOT, require_binary

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# Build inputs only: what a fresh clone has, without this machine's caches and venvs.
# First evaluation (≤ 15 s) + one resend delay (60 s) + Alertmanager's deadman route (0 s wait)
# + the sink, with room for a loaded machine.
WATCHDOG_BOUND_S = 90

IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist",
                                ".pytest_cache", ".ruff_cache", ".whl", ".gl", "docs", "tests")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """bin/ of a fresh virtualenv with only the wheel (and its dependencies) installed."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    dist = work / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
        cwd=work, timeout=300)
    wheel = next(dist.glob("sglang_obs-*.whl"))
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    run([str(venv / "bin/pip"), "install", "-q", "-c", str(ROOT / "constraints.txt"),
         str(wheel)], cwd=work, timeout=600)
    shutil.rmtree(src)  # nothing of the tree is left to fall back on
    return venv / "bin", wheel, work


def run(cmd, cwd, timeout=120, **kwargs):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_OBS_CONFIG_DIR")}
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env=env, **kwargs)
    assert result.returncode == 0, f"{cmd}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


def test_the_wheel_installs_one_import_namespace_and_its_configuration(installed):
    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"sglang_obs"}
    for data in ("sglang_obs/config/prometheus/thresholds.yml",
                 "sglang_obs/config/prometheus/prometheus.yml",
                 "sglang_obs/config/prometheus/rules/sglang.rules.yml",
                 "sglang_obs/config/alertmanager/alertmanager.yml",
                 "sglang_obs/config/grafana/dashboards/sglang-overview.json",
                 "sglang_obs/simulator/scenarios/long-context-incident.yaml"):
        assert data in names


def test_installed_commands_run_outside_the_checkout(installed):
    bin_dir, _, work = installed
    out = run([str(bin_dir / "sglang-exporter"), "--help"], cwd=work).stdout
    assert "--sglang.url" in out
    run([str(bin_dir / "sglang-obs"), "rules", "--check"], cwd=work)
    run([str(bin_dir / "sglang-sim"), "render", "--scenario", "healthy", "--out",
         str(work / "render")], cwd=work, timeout=300)
    assert any((work / "render").iterdir())
    # The tools' code must not import a checkout module by accident.
    probe = run([str(bin_dir / "python"), "-c",
                 "import sglang_obs.tools.stack as s, sglang_obs.exporter.cli as e; "
                 "print(s.__file__); print(e.__file__)"], cwd=work).stdout
    assert str(ROOT) not in probe
    assert "site-packages" in probe


def pipeline_state(banner: str) -> str:
    """Where the Watchdog got stuck: Prometheus' view of the rule, Alertmanager's alerts."""
    urls = dict(re.findall(r"^(Prometheus|Alertmanager)\s+(\S+)", banner, re.M))
    out = []
    for name, path in (("Prometheus", "/api/v1/rules?type=alert"),
                       ("Alertmanager", "/api/v2/alerts")):
        try:
            with urllib.request.urlopen(urls[name] + path, timeout=5) as resp:
                out.append(f"{name}{path}: {resp.read(3000).decode()}")
        except (KeyError, OSError) as err:
            out.append(f"{name}{path}: {err}")
    return "\n".join(out)


def test_installed_native_demo_stack_delivers_the_watchdog_within_90_s(installed):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")  # Debian's name, which the runner looks for first
    bin_dir, _, work = installed
    run_dir = work / "stack"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(
        [str(bin_dir / "sglang-obs"), "stack", "up", "--native", "--demo", "--free-ports",
         "--dir", str(run_dir)], cwd=work, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    alerts = run_dir / "alerts.jsonl"
    banner = []
    for line in proc.stdout:  # the runner prints its banner once every part answers
        banner.append(line)
        if "Ctrl-C stops everything" in line or proc.poll() is not None:
            break
    started = time.monotonic()
    seen = None
    try:
        while time.monotonic() - started < WATCHDOG_BOUND_S and proc.poll() is None:
            if alerts.exists():
                names = [json.loads(line)["labels"]["alertname"]
                         for line in alerts.read_text().splitlines()]
                if "Watchdog" in names:
                    seen = time.monotonic() - started
                    break
            time.sleep(1)
        diagnosis = "" if seen is not None else pipeline_state("".join(banner))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = "".join(banner) + proc.communicate(timeout=30)[0]
    assert seen is not None, (f"no Watchdog at the sink in {WATCHDOG_BOUND_S} s:\n"
                              f"{output[-3000:]}\n{diagnosis}")
    print(f"Watchdog at the sink {seen:.0f} s after the stack was up")
