"""The import layers, as README.md's architecture section ("Layers") draws them: each layer
imports only the layers its row allows, at any depth of a file (a function-level import counts),
and no code outside tests/ reaches into tests/.

The table below is the one statement of the allowed edges; the README's table is checked
against it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

# Layer -> the layers it may import (itself included), lowest first.
LAYERS = {
    "core": {"core"},
    "exporter": {"core", "exporter"},
    "simulator": {"core", "exporter", "simulator"},
    "render": {"core", "exporter", "render"},
    "tools": {"core", "exporter", "simulator", "render", "tools"},
    "generate": {"core", "exporter", "simulator", "render", "tools", "generate"},
    "cli": {"core", "exporter", "simulator", "render", "tools", "generate", "cli"},
    # (generate: its backfill puts a scenario into a real Prometheus for bench_snapshot.py)
    "bench": {"core", "exporter", "simulator", "render", "tools", "generate", "bench"},
    # Runs inside a throwaway virtualenv holding one SGLang release: none of ours.
    "conformance": {"conformance"},
}
# Where each layer's code lives (checkout folders; sglang_obs.exporter is exporter/, ...).
FOLDERS = {
    "core": ["sglang_obs/core", "sglang_obs/__init__.py"],
    "exporter": ["exporter"],
    "simulator": ["simulator"],
    # The dashboards' grafanalib definitions are render code that lives beside their JSON.
    "render": ["sglang_obs/render", "grafana/dashboards"],
    "tools": ["sglang_obs/tools"],
    "generate": ["sglang_obs/generate"],
    "cli": ["sglang_obs/cli.py"],
    "bench": ["bench"],
    "conformance": ["conformance"],
}
TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")}


def layer_of_module(name: str) -> str | None:
    """The layer of an imported module name; None for one outside the project."""
    if name in ("sglang_obs", "sglang_obs.__version__"):
        return "core"  # the package itself holds only __version__
    if name == "dashlib":
        return "render"
    parts = name.split(".")
    if parts[0] != "sglang_obs":
        return None
    if len(parts) > 1 and parts[1] == "config":
        return "core"
    if len(parts) > 1 and parts[1] == "cli":
        return "cli"
    for layer in ("core", "exporter", "simulator", "render", "tools", "generate"):
        if len(parts) > 1 and parts[1] == layer:
            return layer
    raise AssertionError(f"{name}: a module in no layer")


def files_of(layer: str) -> list[Path]:
    out = []
    for entry in FOLDERS[layer]:
        path = ROOT / entry
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports too); a relative
    import counts as the package it names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (name the module)"
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _all_files() -> list[tuple[str, Path]]:
    return [(layer, path) for layer in FOLDERS for path in files_of(layer)]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(layer):
    wrong = []
    for path in files_of(layer):
        for name in sorted(imported(path)):
            target = layer_of_module(name)
            if target is not None and target not in LAYERS[layer]:
                wrong.append(f"{path.relative_to(ROOT)} imports {name} ({layer} -> {target})")
    assert not wrong, "\n".join(wrong)


def test_every_python_file_is_in_a_layer():
    """A new folder of code gets a row, so the test sees it."""
    placed = {path for _, path in _all_files()}
    code = {p for d in ("sglang_obs", "exporter", "simulator", "grafana", "bench", "conformance")
            for p in (ROOT / d).rglob("*.py")}
    assert sorted(str(p.relative_to(ROOT)) for p in code - placed) == []


def test_nothing_outside_tests_imports_or_paths_into_tests():
    wrong = []
    for _, path in _all_files():
        text = path.read_text()
        wrong += [f"{path.relative_to(ROOT)} imports {n}" for n in imported(path)
                  if n.split(".")[0] in TEST_MODULES]
        if re.search(r"sys\.path\.\w+\([^)]*tests", text):
            wrong.append(f"{path.relative_to(ROOT)} puts tests/ on sys.path")
    assert not wrong, "\n".join(wrong)


def _readme_layers() -> dict[str, set[str]]:
    text = (ROOT / "README.md").read_text().split("### Layers", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("**"):
            layer = cells[0].strip("*")
            rows[layer] = {layer} | {c.strip("` ") for c in cells[2].split(",")} - {"-"}
    return rows


def test_the_readme_draws_these_layers():
    assert _readme_layers() == LAYERS


def test_the_dashboards_and_the_rules_share_facts_through_core_not_each_other():
    """dashlib once imported the whole rules generator for one string, and the rules module
    imported the runbooks lazily while the runbooks imported it: facts both need are in core."""
    assert not [n for n in imported(ROOT / "grafana/dashboards/dashlib.py")
                if n.startswith("sglang_obs.render")]
    assert not [n for n in imported(ROOT / "sglang_obs/render/rules.py")
                if n.startswith("sglang_obs.render.runbooks")]
