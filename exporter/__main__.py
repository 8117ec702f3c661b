"""`python -m sglang_obs.exporter` runs the exporter, like the `sglang-exporter` console script."""

from sglang_obs.exporter.cli import main

raise SystemExit(main())
