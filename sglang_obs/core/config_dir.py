"""Where the stack's configuration files are: prometheus/, alertmanager/, grafana/.

A checkout has them at its root, beside the source. An installed wheel carries a copy as package
data under sglang_obs/config/, so installed commands need no checkout. `--config-dir DIR` (a copy
an operator edited) beats both; DIR has the same three folders.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # sglang_obs/
INSTALLED = PACKAGE / "config"
ENV = "SGLANG_OBS_CONFIG_DIR"
_MARKER = Path("prometheus") / "thresholds.yml"


class ConfigDirError(RuntimeError):
    """No configuration folder: the one given lacks prometheus/thresholds.yml."""


def checkout() -> Path | None:
    """The checkout's root when running from one (docs/ and tests/ live only there)."""
    root = PACKAGE.parent
    return root if (root / _MARKER).is_file() and (root / "pyproject.toml").is_file() else None


def resolve(given: str | os.PathLike | None = None) -> Path:
    """--config-dir, else $SGLANG_OBS_CONFIG_DIR, else the checkout, else the installed copy."""
    given = given or os.environ.get(ENV)
    if given:
        path = Path(given).expanduser().resolve()
        if not path.exists():
            raise ConfigDirError(f"--config-dir {given}: no such directory")
        if not path.is_dir():
            raise ConfigDirError(f"--config-dir {given}: is a file, not a directory")
        if not (path / _MARKER).is_file():
            raise ConfigDirError(f"--config-dir {given}: no {_MARKER} there")
        return path
    for path in (checkout(), INSTALLED):
        if path is not None and (path / _MARKER).is_file():
            return path
    raise ConfigDirError(f"no configuration folder: {INSTALLED} is missing (broken install?)")
