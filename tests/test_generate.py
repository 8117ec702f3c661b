"""`make generate` is one command, `python -m sglang_obs.generate`, and it alone writes the
generated files: the render layer returns text and writes nothing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from sglang_obs.generate import products

from conftest import ROOT

# No Prometheus, promtool or Chromium run.
CHEAP = ["metrics", "simulator-shapes", "simulator-docs", "rules", "shipper", "dashboards",
         "kubernetes", "compatibility", "fleet-timing", "readme"]


def test_make_generate_is_the_one_entry_point():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^generate:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert recipe.strip().splitlines() == ["$(PY) -m sglang_obs.generate"]


@pytest.mark.slow  # every cheap product in a subprocess: tens of seconds (make check < 2 min)
def test_the_committed_files_are_what_the_entry_point_makes():
    result = subprocess.run([sys.executable, "-m", "sglang_obs.generate", "--check", *CHEAP],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr


def test_an_unknown_product_is_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "sglang_obs.generate", "--check", "nope"],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 2
    assert "unknown product nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_product_is_listed_once_and_cheap_ones_are_checked():
    assert len(set(products.NAMES)) == len(products.NAMES)
    assert set(CHEAP) <= set(products.NAMES)
    assert all(products.BY_NAME[n].checked for n in CHEAP)


FILE_IO = ("write_text", "write_bytes", "mkdir", "unlink", "rmtree", "read_text", "read_bytes",
           "glob", "rglob", "iterdir", "exists", "is_file", "is_dir", "stat")


def test_the_render_layer_reads_and_writes_no_file():
    """Pure functions of the settings and of texts the generator read: no file I/O at all."""
    found = []
    for path in sorted((ROOT / "sglang_obs" / "render").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in FILE_IO:
                found.append(f"{path.name}:{node.lineno}: {node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "open"):
                found.append(f"{path.name}:{node.lineno}: open")
    assert found == []


def test_only_the_files_module_writes_what_the_products_make(tmp_path):
    """sync writes a changed file, leaves an unchanged one alone, and reports left-overs
    without deleting them."""
    from sglang_obs.generate.files import ORPHAN, sync

    same, changed, left = tmp_path / "same.txt", tmp_path / "changed.txt", tmp_path / "old.txt"
    same.write_text("a\n")
    changed.write_text("old\n")
    left.write_text("x\n")
    made = {same: "a\n", changed: "new\n", tmp_path / "new.bin": b"\x00"}
    assert sync(made, check=True, owned=[(tmp_path, "*")]) == [
        f"{changed} (stale)", f"{tmp_path / 'new.bin'} (missing)", f"{left} {ORPHAN}"]
    assert changed.read_text() == "old\n", "--check writes nothing"
    sync(made, check=False)
    assert changed.read_text() == "new\n"
    assert (tmp_path / "new.bin").read_bytes() == b"\x00"
    assert sync(made, check=True, owned=[(tmp_path, "*")]) == [f"{left} {ORPHAN}"]
    assert left.exists()
