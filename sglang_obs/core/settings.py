"""The stack's settings, read once and passed in: thresholds.yml, prometheus.yml's intervals, the
ports, and where the configuration, rules, dashboards and docs lie.

Nothing in sglang_obs reads configuration at import time (tests/test_settings.py imports every
module and watches for it): a command builds one Settings with `load` (from --config-dir, else
the checkout's or the installed copy, core/config_dir.py) and hands it to what it calls. Library
functions called without one use `default()`, the same object read on first use.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sglang_obs.core import config_dir
from sglang_obs.core.sglang import EXPORTER_PORT, SGLANG_PORT

# The sections of thresholds.yml every layer reads: a file without one is not the stack's.
SECTIONS = ("classification", "slo", "alerts", "selectors", "compare", "runbook_base")
# Where the files lie inside the configuration folder (relative paths; Settings joins its root).
THRESHOLDS_FILE = Path("prometheus", "thresholds.yml")
PROMETHEUS_FILE = Path("prometheus", "prometheus.yml")
ALERTMANAGER_FILE = Path("alertmanager", "alertmanager.yml")
RULES_DIR = Path("prometheus", "rules")
VMALERT_RULES_DIR = Path("prometheus", "rules-vmalert")
FLEET_DIR = Path("prometheus", "fleet")
DASHBOARDS_DIR = Path("grafana", "dashboards")
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class SettingsError(config_dir.ConfigDirError):
    """A configuration file that cannot be read or lacks what the stack needs (one line)."""


def duration_seconds(text: str) -> float:
    """A Prometheus duration of one unit ("15s", "1m") in seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration such as 15s")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Settings:
    root: Path  # holds prometheus/, alertmanager/, grafana/
    checkout: Path | None  # the source checkout when running from one (docs/, tests/, deploy/)
    thresholds: Mapping[str, Any]  # prometheus/thresholds.yml, parsed
    prometheus: Mapping[str, Any]  # prometheus/prometheus.yml, parsed
    scrape_interval_s: float  # prometheus.yml global.scrape_interval
    evaluation_interval_s: float  # prometheus.yml global.evaluation_interval: one recorded sample
    exporter_port: int = EXPORTER_PORT
    sglang_port: int = SGLANG_PORT
    docs: Path | None = None  # where the developer commands' documents are (default below)

    # -- where things are -------------------------------------------------------------------
    @property
    def thresholds_file(self) -> Path:
        return self.root / THRESHOLDS_FILE

    @property
    def prometheus_file(self) -> Path:
        return self.root / PROMETHEUS_FILE

    @property
    def alertmanager_file(self) -> Path:
        return self.root / ALERTMANAGER_FILE

    @property
    def rules_dir(self) -> Path:
        return self.root / RULES_DIR

    @property
    def vmalert_rules_dir(self) -> Path:
        return self.root / VMALERT_RULES_DIR

    @property
    def dashboards_dir(self) -> Path:
        return self.root / DASHBOARDS_DIR

    @property
    def docs_dir(self) -> Path:
        """docs/ lives only in a checkout (developer commands); else the working folder's."""
        return self.docs or (self.checkout or Path.cwd()) / "docs"

    @property
    def shipped(self) -> bool:
        """True when the configuration is the checkout's own (the docs quote it)."""
        return self.checkout is not None and self.root == self.checkout

    # -- thresholds.yml's sections ------------------------------------------------------------
    @property
    def selectors(self) -> Mapping[str, str]:
        return self.thresholds["selectors"]

    @property
    def evaluation_interval(self) -> str:
        """The evaluation interval as prometheus.yml writes it ("15s")."""
        return str(self.prometheus["global"]["evaluation_interval"])

    @property
    def scrape_interval(self) -> str:
        return str(self.prometheus["global"]["scrape_interval"])


def _yaml(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SettingsError(f"{path}: cannot read it ({err})") from None
    if not isinstance(doc, dict):
        raise SettingsError(f"{path}: not a mapping")
    return doc


def load(given: str | os.PathLike | None = None) -> Settings:
    """Read the configuration folder (--config-dir, else the default one) once."""
    root = config_dir.resolve(given)
    thresholds = _yaml(root / THRESHOLDS_FILE)
    missing = [s for s in SECTIONS if s not in thresholds]
    if missing:
        raise SettingsError(f"{root / THRESHOLDS_FILE}: no {', '.join(missing)} section")
    prom_file = root / PROMETHEUS_FILE
    prometheus = _yaml(prom_file)
    intervals = {}
    for key in ("scrape_interval", "evaluation_interval"):
        try:
            intervals[key] = duration_seconds((prometheus.get("global") or {})[key])
        except (KeyError, TypeError, ValueError) as err:
            raise SettingsError(f"{prom_file}: global.{key}: {err}") from None
    return Settings(root=root, checkout=config_dir.checkout(), thresholds=thresholds,
                    prometheus=prometheus, scrape_interval_s=intervals["scrape_interval"],
                    evaluation_interval_s=intervals["evaluation_interval"])


@functools.cache
def default() -> Settings:
    """The default folder's Settings, read on first use (never at import)."""
    return load()
