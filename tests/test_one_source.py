"""Facts stated once: the exporter's and SGLang's ports and the exporter's compose address live
in sglang_obs/core/sglang.py. No other Python module types them again, and the files that
cannot import them (the Dockerfile, compose, prometheus.yml, the Kubernetes objects) say the
same number."""

from __future__ import annotations

import ast
import re

import pytest

from sglang_obs.core.sglang import EXPORTER_ADDRESS, EXPORTER_PORT, SGLANG_PORT

from conftest import ROOT

SOURCE = ROOT / "sglang_obs" / "core" / "sglang.py"
CODE = sorted(p for d in ("sglang_obs", "exporter", "simulator", "grafana", "bench")
              for p in (ROOT / d).rglob("*.py") if p != SOURCE)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (examples in prose are not copies of the fact)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def copies(path, root=ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        value = node.value
        if isinstance(value, int) and not isinstance(value, bool) and value in (
                EXPORTER_PORT, SGLANG_PORT):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {value}")
        elif isinstance(value, str) and (value in (EXPORTER_ADDRESS, f":{EXPORTER_PORT}",
                                                   str(EXPORTER_PORT), str(SGLANG_PORT))):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {value!r}")
    return found


def test_no_module_types_a_port_again():
    assert [c for path in CODE for c in copies(path)] == []


def test_the_scan_sees_a_copy(tmp_path):
    """The scan is not blind: a module that types the port is caught, a docstring is not."""
    (tmp_path / "m.py").write_text(f'"""Listens on :{EXPORTER_PORT}."""\n'
                                   f"PORT = {EXPORTER_PORT}\nADDR = {EXPORTER_ADDRESS!r}\n")
    path = tmp_path / "m.py"
    found = [c.split(": ", 1)[1] for c in copies(path, tmp_path)]
    assert found == [str(EXPORTER_PORT), repr(EXPORTER_ADDRESS)]


@pytest.mark.parametrize(("name", "pattern"), [
    ("exporter/Dockerfile", rf"^EXPOSE {EXPORTER_PORT}$"),
    ("exporter/Dockerfile", rf"127\.0\.0\.1:{EXPORTER_PORT}/metrics"),
    ("docker-compose.yml", rf'- "{EXPORTER_PORT}"'),
    ("docker-compose.yml", rf"127\.0\.0\.1:{EXPORTER_PORT}/metrics"),
    ("docker-compose.yml", rf'"--port", "{SGLANG_PORT}"'),
    ("docker-compose.yml", rf"sglang-sim:{SGLANG_PORT}"),
    ("prometheus/prometheus.yml", rf"http://{EXPORTER_ADDRESS}/sd/sglang"),
    ("prometheus/prometheus.yml", rf"\['{EXPORTER_ADDRESS}'\]"),
    ("deploy/kubernetes/overlays/example/deployment.yaml", rf"containerPort: {EXPORTER_PORT}$"),
])
def test_the_files_that_cannot_import_it_say_the_same(name, pattern):
    assert re.search(pattern, (ROOT / name).read_text(), re.M), f"{name}: {pattern}"


@pytest.mark.parametrize("name", ["exporter/Dockerfile", "docker-compose.yml",
                                  "prometheus/prometheus.yml"])
def test_the_configuration_names_no_other_exporter_port(name):
    """A changed port in one file but not the others: any exporter:PORT or :PORT/metrics with
    another number."""
    text = (ROOT / name).read_text()
    pairs = re.findall(r"exporter:(\d+)|127\.0\.0\.1:(\d+)/metrics", text)
    ports = {int(a or b) for a, b in pairs}
    assert ports <= {EXPORTER_PORT}, ports


def test_the_prompt_classes_are_named_in_one_module():
    """exporter/request_records.py names the classes (and a rules test keeps its bounds equal to
    thresholds.yml's request_classes); no other module types a class name or the bounds."""
    from sglang_obs.exporter.request_records import PROMPT_CLASS_BOUNDS, PROMPT_CLASSES

    home = ROOT / "exporter" / "request_records.py"
    found = []
    for path in CODE:
        if path == home:
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in skip and (
                    node.value in PROMPT_CLASSES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.Tuple | ast.List) and [
                    getattr(e, "value", None) for e in node.elts] == list(PROMPT_CLASS_BOUNDS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: the bounds")
    assert found == []


# An interval typed as a number or a duration where a step or an interval is named: the
# scrape and evaluation intervals are prometheus.yml's (sglang_obs.core.settings reads them).
_INTERVAL_COPY = [
    # STEP = 15, step: float = 15.0, interval="15s", {"scrape_interval": "15s"}
    re.compile(r"""(?i)(step|interval)\w*["']?\s*(:\s*[\w\[\], |.]+)?\s*[=:]\s*["']?"""
               r"""(?P<n>\d+(\.\d+)?)s?["']?\s*[,)}\n]"""),
    # add_argument("--step", ..., default=15.0)
    re.compile(r"""(?i)["']--[\w-]*(step|interval)[\w-]*["'].*default=(?P<n>\d+(\.\d+)?)"""),
]


def interval_copies(path, seconds: set[float], root=ROOT) -> list[str]:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if any(float(m.group("n")) in seconds
               for pattern in _INTERVAL_COPY for m in pattern.finditer(code + "\n")):
            found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_module_types_the_scrape_or_evaluation_interval():
    from sglang_obs.core.settings import default

    s = default()
    seconds = {s.scrape_interval_s, s.evaluation_interval_s}
    assert [c for path in CODE for c in interval_copies(path, seconds)] == []


def test_the_interval_scan_sees_a_copy(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('STEP = 15  # seconds\nevaluation_interval: str = "15s"\n'
                    "def f(step: float = 15.0):\n    return step\nWINDOW = 15\n"
                    'G = {"global": {"scrape_interval": "15s"}}\n'
                    'p.add_argument("--step", type=float, default=15.0)\n'
                    'p.add_argument("--seeds", type=int, default=15)\n')
    assert [c.split(": ", 1)[1] for c in interval_copies(path, {15.0}, tmp_path)] == [
        "STEP = 15  # seconds", 'evaluation_interval: str = "15s"',
        "def f(step: float = 15.0):", 'G = {"global": {"scrape_interval": "15s"}}',
        'p.add_argument("--step", type=float, default=15.0)']
