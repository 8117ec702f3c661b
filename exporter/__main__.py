"""`python -m exporter` runs the exporter, like the `sglang-exporter` console script."""

from exporter.cli import main

raise SystemExit(main())
