"""Prometheus naming rules for everything the exporter emits (checked on the catalogue, which
the collector builds its families from, and on a rendered exposition by promtool)."""

import re
import subprocess

import pytest

from sglang_obs.exporter.catalogue import METRICS, PREFIX, render_markdown

from conftest import ROOT, require_binary

NON_BASE_UNITS = re.compile(r"_(percent|percentage|ms|milliseconds|minutes|hours|mib|mb|kb|gb|"
                            r"kilobytes|megabytes)(_|$)")
TARGET_LABELS = {"job", "instance", "hostname", "host"}


@pytest.mark.parametrize("spec", METRICS, ids=lambda s: s.name)
def test_metric_follows_prometheus_naming(spec):
    assert spec.name.startswith(PREFIX)
    assert re.fullmatch(r"[a-z][a-z0-9_]*", spec.name), "snake_case, no colons"
    assert not NON_BASE_UNITS.search(spec.name), "base units only"
    assert spec.name.endswith("_total") == (spec.kind == "counter")
    assert spec.name.endswith("_info") == (spec.kind == "info")
    assert not TARGET_LABELS & set(spec.labels), "must not clash with target labels"
    assert spec.help.strip()[-1:] in (".", ")")
    if spec.kind == "histogram":
        assert spec.name.endswith(("_seconds", "_tokens"))  # a base unit


def test_names_are_unique():
    names = [spec.name for spec in METRICS]
    assert len(names) == len(set(names))


def test_docs_metrics_md_is_generated_from_the_catalogue():
    """The catalogue, then the energy records' section (sglang_obs/generate/energy.py)."""
    from sglang_obs.core.settings import default
    from sglang_obs.generate import products

    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed.startswith(render_markdown())
    assert {ROOT / "docs" / "metrics.md": committed} == products.metrics(default())[0], (
        "docs/metrics.md is stale: run python -m sglang_obs.generate metrics")


def test_golden_exposition_passes_promtool_check_metrics():
    promtool = require_binary("promtool")
    golden = (ROOT / "tests" / "fixtures" / "exporter_golden.prom").read_bytes()
    result = subprocess.run([promtool, "check", "metrics"], input=golden, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
