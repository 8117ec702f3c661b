"""The exposition's two renders, text 0.0.4 and OpenMetrics 1.0.0: byte for byte what
prometheus_client renders for the families the exporter makes, at a fraction of its cost.

prometheus_client formats every sample from scratch: each label name and value is escaped on
every scrape (the OpenMetrics sample name character by character), though from one render to the
next the label sets are the same servers' and GPUs'. Here a label set's `{...}` text is made once
and kept (LABEL_SETS_KEPT at most), so a render is a dictionary lookup and a float's text per
sample. Only what the exporter's families use is rendered here: legacy metric and label names,
no timestamps, exemplars, units or native histograms. A family with any of those raises
Unsupported, and the caller renders that scrape with prometheus_client instead.
"""

from __future__ import annotations

import math
import re

LABEL_SETS_KEPT = 1 << 16  # emptied, then refilled, beyond this many

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # also what an OpenMetrics sample name keeps
_INF, _MINUS_INF = math.inf, -math.inf
# Samples the text format moves into a gauge family of their own, after the family's others.
_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
_TEXT_TYPE = {"counter": "counter", "info": "gauge", "stateset": "gauge",
              "gaugehistogram": "histogram", "unknown": "untyped"}


class Unsupported(ValueError):
    """A family this renderer does not cover (see the module docstring)."""


def go_float(value: float) -> str:
    """A sample value as Go (and Prometheus) write it."""
    value = float(value)  # an int sample reads "8.0"
    if value == _INF:
        return "+Inf"
    if value == _MINUS_INF:
        return "-Inf"
    if value != value:
        return "NaN"
    s = repr(value)
    dot = s.find(".")
    if value > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Renderer:
    """Renders collected families; keeps each label set's text between renders. One renderer
    serves one exposition (calls are serialised by its lock)."""

    def __init__(self) -> None:
        self._label_sets: dict[tuple, str] = {}
        self._names: dict[re.Pattern, set[str]] = {_METRIC_NAME: set(), _LABEL_NAME: set()}

    def _labels(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        text = self._label_sets.get(key)
        if text is None:
            for name in labels:
                if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                    raise Unsupported(f"label name {name!r}")
            text = "{" + ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items())) \
                + "}" if labels else ""
            if len(self._label_sets) >= LABEL_SETS_KEPT:
                self._label_sets.clear()
            self._label_sets[key] = text
        return text

    def _check_name(self, name: str, pattern: re.Pattern) -> None:
        checked = self._names[pattern]
        if name not in checked:
            if not pattern.fullmatch(name):
                raise Unsupported(f"name {name!r}")
            checked.add(name)

    def _family(self, metric) -> None:
        """Raises Unsupported for a family this renderer does not cover."""
        if metric.unit:
            raise Unsupported(f"unit of {metric.name}")
        self._check_name(metric.name, _METRIC_NAME)

    def _samples(self, metric, out: list[str], openmetrics: bool) -> dict[str, list[str]]:
        """Appends the sample lines to `out`; returns the text format's moved lines by
        suffix."""
        moved: dict[str, list[str]] = {}
        labels = self._labels
        name_pattern = _LABEL_NAME if openmetrics else _METRIC_NAME
        for s in metric.samples:
            if s.timestamp is not None or s.exemplar is not None or s.native_histogram \
                    or s.value is None:
                raise Unsupported(f"sample {s.name}")
            self._check_name(s.name, name_pattern)
            line = f"{s.name}{labels(s.labels)} {go_float(s.value)}\n"
            if not openmetrics and s.name.endswith(_MOVED_SUFFIXES):
                suffix = s.name[len(metric.name):]
                if suffix in _MOVED_SUFFIXES and s.name == metric.name + suffix:
                    moved.setdefault(suffix, []).append(line)
                    continue
            out.append(line)
        return moved

    def text(self, families) -> bytes:
        out: list[str] = []
        for metric in families:
            self._family(metric)
            name, kind = metric.name, metric.type
            if kind == "counter":
                name += "_total"
            elif kind == "info":
                name += "_info"
            kind = _TEXT_TYPE.get(kind, kind)
            help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            moved = self._samples(metric, out, openmetrics=False)
            for suffix in sorted(moved):
                out.append(f"# HELP {metric.name}{suffix} {help_text}\n"
                           f"# TYPE {metric.name}{suffix} gauge\n")
                out.extend(moved[suffix])
        return "".join(out).encode("utf-8")

    def openmetrics(self, families) -> bytes:
        out: list[str] = []
        for metric in families:
            self._family(metric)
            out.append(f"# HELP {metric.name} {_escaped(metric.documentation)}\n"
                       f"# TYPE {metric.name} {metric.type}\n")
            self._samples(metric, out, openmetrics=True)
        out.append("# EOF\n")
        return "".join(out).encode("utf-8")
