"""The series counts docs/metrics.md quotes are what the exporter serves now (counted by
bench/series_count.py's own setups), and stay within the budget of 330 for 8 H200 + TP8."""

import importlib.util
import re

from conftest import ROOT

SPEC = importlib.util.spec_from_file_location("series_count", ROOT / "bench/series_count.py")
series_count = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(series_count)

BUDGET_TP8 = 330  # dcgm-exporter's default set is ~25 per GPU; ours carries more facts


def counted(tp_sizes):
    registry, servers = series_count.registry_for(tp_sizes)
    try:
        return sum(series_count.count(registry).values())
    finally:
        for server in servers:
            server.stop()


def test_quoted_series_counts_are_current_and_within_budget():
    doc = (ROOT / "docs/metrics.md").read_text()
    quoted = re.search(r"one TP8 server, \d+ series before, (\d+) after; with eight DP1 "
                       r"servers, \d+ before, (\d+) after", doc)
    assert quoted, "docs/metrics.md no longer quotes the series counts"
    tp8, dp1 = counted([8]), counted([1] * 8)
    assert (int(quoted.group(1)), int(quoted.group(2))) == (tp8, dp1), \
        f"docs/metrics.md quotes {quoted.groups()}, bench/series_count.py counts {tp8}, {dp1}"
    assert tp8 <= BUDGET_TP8
