"""The import layers: the exporter knows nothing of the simulator, the tools or the generators;
the simulator (what-if) and the operator's tools (snapshot, compare) never import each other;
both import the neutral sglang_obs.pack and sglang_obs.times, which import neither."""

import ast

import pytest

from conftest import ROOT

# The native stack runner serves the simulator's demo scenarios: the one tool that runs it.
RUNS_THE_SIMULATOR = {"stack.py"}


def imported(path):
    """Every module `path` imports, at any depth of the file (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _under(names, package):
    return sorted(n for n in names if n == package or n.startswith(package + "."))


@pytest.mark.parametrize("path", sorted((ROOT / "simulator").rglob("*.py")), ids=str)
def test_the_simulator_never_imports_the_tools(path):
    assert not _under(imported(path), "sglang_obs.tools")


@pytest.mark.parametrize("path", sorted((ROOT / "exporter").rglob("*.py")), ids=str)
def test_the_exporter_imports_no_higher_layer(path):
    names = imported(path)
    assert not [n for part in ("simulator", "tools", "generate")
                for n in _under(names, f"sglang_obs.{part}")]


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "sglang_obs/tools").glob("*.py")
                                        if p.name not in RUNS_THE_SIMULATOR), ids=str)
def test_the_tools_do_not_import_the_simulator(path):
    assert not _under(imported(path), "sglang_obs.simulator")


@pytest.mark.parametrize("name", ["pack.py", "times.py"])
def test_the_neutral_modules_import_neither(name):
    names = imported(ROOT / "sglang_obs" / name)
    assert not _under(names, "sglang_obs.tools") + _under(names, "sglang_obs.simulator")
