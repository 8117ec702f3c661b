"""matplotlib, for the commands that draw (snapshot, render-dashboard): an optional extra, so the
exporter and the rest install without it."""

from __future__ import annotations

EXTRA = "charts"


class MissingExtra(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def pyplot():
    try:
        import matplotlib  # noqa: PLC0415 - optional
    except ImportError:
        raise MissingExtra(f"drawing needs matplotlib: pip install 'sglang-obs[{EXTRA}]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt
