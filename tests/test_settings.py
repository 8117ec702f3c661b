"""One typed settings object, read once and passed in: no module reads the configuration when
it is imported, the intervals come from prometheus.yml alone, and a broken configuration is one
line from the commands."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from sglang_obs.core import settings

from conftest import ROOT

# Imports every module of the installed namespace with an audit hook that records each file
# opened under the configuration folder, then reads the settings once (the hook must see that).
IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
from pathlib import Path
root = Path(sys.argv[1]).resolve()
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = Path(args[0] if isinstance(args[0], str) else args[0].decode()).resolve()
        if any(path.is_relative_to(root / d) for d in ("prometheus", "alertmanager", "grafana")):
            opened.append(str(path.relative_to(root)))
sys.addaudithook(hook)
names, packages = [], ["sglang_obs", "sglang_obs.exporter", "sglang_obs.simulator"]
while packages:  # the exporter and simulator live in folders of their own (package-dir)
    package = importlib.import_module(packages.pop())
    for m in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if m.name.startswith("sglang_obs.config") or m.name.endswith(".__main__"):
            continue  # the configuration folders (package data); `python -m` entry scripts
        importlib.import_module(m.name)
        names.append(m.name)
        if m.ispkg:
            packages.append(m.name)
at_import = list(opened)
from sglang_obs.core import settings
settings.load()
print(json.dumps({"modules": len(names), "at_import": at_import, "after_load": opened}))
"""


def test_importing_every_module_reads_no_configuration():
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(ROOT)], capture_output=True,
                            text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    got = yaml.safe_load(result.stdout)
    assert got["modules"] > 80, got  # the walk saw the whole namespace
    assert got["at_import"] == [], f"read at import time: {got['at_import']}"
    # The hook is not blind: loading the settings opens the two files, once each.
    assert sorted(got["after_load"]) == ["prometheus/prometheus.yml",
                                         "prometheus/thresholds.yml"]


def test_the_settings_carry_the_intervals_prometheus_yml_states():
    s = settings.load()
    prom = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())["global"]
    assert s.evaluation_interval == prom["evaluation_interval"]
    assert s.evaluation_interval_s == settings.duration_seconds(prom["evaluation_interval"])
    assert s.scrape_interval_s == settings.duration_seconds(prom["scrape_interval"])
    assert s.root == ROOT
    assert s.checkout == ROOT
    assert s.shipped
    assert s.rules_dir == ROOT / "prometheus" / "rules"


def _copy_config(tmp_path):
    for part in ("prometheus", "alertmanager", "grafana"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def test_another_evaluation_interval_reaches_every_consumer(tmp_path):
    """An operator's prometheus.yml at 30 s: the rules' one-evaluation for:, the vmalert flags,
    the detection step and the glance page's baseline all follow it."""
    from sglang_obs.exporter.status import StatusBoard, load_classification
    from sglang_obs.generate import detection
    from sglang_obs.render import rules
    from sglang_obs.tools import fleet

    root = _copy_config(tmp_path)
    prom_file = root / "prometheus" / "prometheus.yml"
    prom_file.write_text(prom_file.read_text().replace("evaluation_interval: 15s",
                                                       "evaluation_interval: 30s"))
    thresholds = root / "prometheus" / "thresholds.yml"  # and a sustain of 45 s
    thresholds.write_text(thresholds.read_text().replace("  decode_contention: 15s",
                                                         "  decode_contention: 45s"))
    s = settings.load(root)
    assert s.evaluation_interval_s == 30
    # A sustain longer than one evaluation: a for: of one evaluation and a window over the rest.
    alerts = {a.name: a for a in rules.saturation_alerts(rules.inputs(s))}
    assert alerts["SGLangDecodeContention"].for_ == "30s"
    assert "== bool 3)[15s:]" in alerts["SGLangDecodeContention"].expr.replace(
        str(rules.STATES.index("decode_contention")), "3")
    shipped = {a.name: a for a in rules.saturation_alerts(rules.inputs(settings.load()))}
    assert shipped["SGLangDecodeContention"].for_ == "15s"  # one evaluation: no window
    assert "min_over_time" not in shipped["SGLangDecodeContention"].expr
    args = fleet.vmalert_args("http://vm", "http://am", ":8880", s)
    assert "-evaluationInterval=30s" in args
    assert "-datasource.queryStep=30s" in args
    assert f"-rule={root / 'prometheus' / 'rules-vmalert'}/*.yml" in args
    assert detection.step_seconds(s) == 30
    board = StatusBoard(load_classification(s.thresholds_file), baseline_step=30.0)
    assert board.status()["baseline_step_seconds"] == 30.0


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p.write_text(p.read_text().replace("evaluation_interval: 15s\n", "")),
     r"prometheus\.yml: global\.evaluation_interval"),
    (lambda p: p.write_text(p.read_text().replace("evaluation_interval: 15s",
                                                  "evaluation_interval: soon")),
     r"'soon' is not a duration"),
    (lambda p: p.write_text("global: [\n"), r"prometheus\.yml: cannot read it"),
])
def test_a_broken_prometheus_yml_is_one_line_and_exit_1(tmp_path, edit, message):
    root = _copy_config(tmp_path)
    edit(root / "prometheus" / "prometheus.yml")
    with pytest.raises(settings.SettingsError, match=message):
        settings.load(root)
    result = subprocess.run([sys.executable, "-m", "sglang_obs.cli", "--config-dir", str(root),
                             "rules", "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stderr
    assert re.search(message, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_thresholds_file_without_a_section_is_named(tmp_path):
    root = _copy_config(tmp_path)
    path = root / "prometheus" / "thresholds.yml"
    doc = yaml.safe_load(path.read_text())
    del doc["selectors"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(settings.SettingsError, match="no selectors section"):
        settings.load(root)


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.load().root = ROOT  # type: ignore[misc]
