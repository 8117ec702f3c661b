"""exporter/exposition_format.py renders prometheus_client's bytes: the exporter's whole
exposition (the golden exposition's servers, the H200 machine's GPUs) and families made to hit
every branch of the format (escapes, special values, moved `_created` samples), in both formats,
on a first render and on a second one from the kept label sets."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.exposition import generate_latest as client_text
from prometheus_client.openmetrics.exposition import generate_latest as client_openmetrics
from prometheus_client.samples import Sample, Timestamp
from test_golden_exposition import registry_of
from test_nvml import Rig, h200_machine

from sglang_obs.exporter import exposition_format
from sglang_obs.exporter.exposition_format import Renderer, Unsupported, go_float
from sglang_obs.exporter.web import Exposition


class Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def assert_same_bytes(families) -> None:
    renderer = Renderer()
    for _ in range(2):  # the second render reads the kept label sets
        assert renderer.text(families) == client_text(Families(families))
        assert renderer.openmetrics(families) == client_openmetrics(Families(families))


def test_the_exporters_exposition_is_prometheus_clients_bytes(fake_sglang, tmp_path):
    families = list(registry_of(fake_sglang, tmp_path).collect())
    assert sum(len(f.samples) for f in families) > 500
    assert_same_bytes(families)


def test_the_gpu_exposition_is_prometheus_clients_bytes():
    rig = Rig(h200_machine(), processes=True, process_servers=lambda pid: "10.0.0.5:30000")
    rig.cycle(2)
    families = list(rig.registry.collect())
    assert sum(len(f.samples) for f in families) > 200
    assert_same_bytes(families)


VALUES = [0.0, -0.0, 1.0, -1.5, 0.1, 1e-7, 123456.0, 1234567.0, 1e21, 12345678.9, -12345678.9,
          math.inf, -math.inf, math.nan, 2.0 ** 53, 5e-324]
LABEL_VALUES = ["", "plain", 'a "quoted" value', "back\\slash", "two\nlines", "ünïcødé ✓",
                "trailing\\", "{}=,"]


def test_every_branch_of_the_format_is_prometheus_clients_bytes():
    gauge = GaugeMetricFamily("sglang_obs_test", 'help with "quotes", \\ and\nnewline',
                              labels=["server", "z", "a"])
    for i, (v, lv) in enumerate(zip(VALUES, LABEL_VALUES * 2, strict=False)):
        gauge.add_metric([f"s{i}", lv, lv[::-1]], v)
    counter = CounterMetricFamily("sglang_obs_test_events", "events", labels=["reason"])
    counter.add_metric(["x"], 3.0, created=1700000000.5)
    counter.add_metric(["y"], 0.0)
    histogram = HistogramMetricFamily("sglang_obs_test_seconds", "seconds", labels=["class"])
    histogram.add_metric(["short"], [("0.1", 1.0), ("1.0", 4.0), ("+Inf", 5.0)], 2.5)
    info = InfoMetricFamily("sglang_obs_test_build", "build", labels=["server"])
    info.add_metric(["a"], {"version": "1.2.3", "note": 'say "hi"'})
    unlabelled = GaugeMetricFamily("sglang_obs_test_plain", "no labels", value=7.0)
    assert_same_bytes([gauge, counter, histogram, info, unlabelled])


def test_go_float_is_prometheus_clients_float_text():
    from prometheus_client.utils import floatToGoString
    for v in VALUES + [10.0 ** k for k in range(-12, 25)] + [1.5 * 10.0 ** k for k in range(25)]:
        assert go_float(v) == floatToGoString(v), v


def unit_family():
    return GaugeMetricFamily("sglang_obs_test_bytes", "bytes", value=1.0, unit="bytes")


def timestamped_family():
    family = GaugeMetricFamily("sglang_obs_test_ts", "ts")
    family.samples.append(Sample("sglang_obs_test_ts", {}, 1.0, Timestamp(1, 0)))
    return family


def colon_family():
    return GaugeMetricFamily("sglang:test", "an SGLang-style name", value=1.0)


@pytest.mark.parametrize("make", [unit_family, timestamped_family, colon_family])
def test_what_it_does_not_render_is_rendered_by_prometheus_client(make):
    family = make()
    with pytest.raises(Unsupported):
        Renderer().openmetrics([family])
    registry = CollectorRegistry()

    class One:
        def collect(self):
            return [make()]

    registry.register(One())
    exposition = Exposition(registry)
    exposition.changed()
    assert exposition.body(openmetrics=True, gzipped=False) == client_openmetrics(registry)
    assert exposition.body(openmetrics=False, gzipped=False) == client_text(registry)
    assert exposition.fallback_renders >= 1


def test_the_kept_label_sets_are_bounded(monkeypatch):
    monkeypatch.setattr(exposition_format, "LABEL_SETS_KEPT", 10)
    gauge = GaugeMetricFamily("sglang_obs_test", "many", labels=["server"])
    for i in range(50):
        gauge.add_metric([f"s{i}"], float(i))
    renderer = Renderer()
    assert renderer.text([gauge]) == client_text(Families([gauge]))
    assert len(renderer._label_sets) <= 10
