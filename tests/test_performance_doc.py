"""docs/performance.md says what bench/results/*.json hold: each measured block is what its bench
script's doc_block makes of its JSON (sglang_obs/generate/performance.py), and every figure of the
page is inside such a block."""

from __future__ import annotations

import re

from sglang_obs.core.doc_blocks import replace_blocks
from sglang_obs.generate import performance

from conftest import ROOT

DOC = ROOT / "docs" / performance.DOC


def test_every_block_is_what_its_json_makes():
    text = DOC.read_text()
    assert replace_blocks(text, performance.blocks(ROOT), DOC) == text, \
        "docs/performance.md is stale: run `python -m sglang_obs.generate performance`"


def test_every_block_has_its_json_and_names_its_machine_and_date():
    blocks = performance.blocks(ROOT)
    assert set(blocks) == set(performance.BENCHES)
    for name, block in blocks.items():
        assert re.search(r"\b20\d\d\b", block), f"{name}: no date"
        assert "load average" in block, f"{name}: no load"


def test_no_measured_figure_stands_outside_the_blocks():
    """Outside the generated blocks the page may name parameters (a bound, a count of servers) but
    no measurement: no milliseconds, percentages, ratios or rates."""
    text = DOC.read_text()
    prose = re.sub(r"<!-- generated:(\S+) -->.*?<!-- end:\1 -->", "", text, flags=re.S)
    found = re.findall(r"\d[\d.,]*\s*(?:ms|µs|%|×|lines/s|records/s|MiB|GiB)\b|\d[\d.,]*×",
                       prose)
    assert not found, found
