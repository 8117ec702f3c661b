#!/usr/bin/env python3
"""Render every grafana/dashboards/*.dashboard.py to <name>.json (committed, never hand-edited).

    python grafana/dashboards/generate.py           # write the JSON files that changed
    python grafana/dashboards/generate.py --check   # exit 1 listing stale or orphaned JSON

Output is deterministic (sorted keys, indent 2, trailing newline), so it diffs cleanly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the definitions `import dashlib` from this folder
    sys.path.insert(0, str(HERE))

import dashlib  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed JSON file is stale")
    args = parser.parse_args(argv)

    stale: list[str] = []
    expected: set[Path] = set()
    for source in dashlib.sources():
        target = dashlib.json_path(source)
        expected.add(target)
        text = dashlib.render(source)
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(f"{target.relative_to(dashlib.ROOT)} (stale: regenerate from "
                         f"{source.name})" if current is not None else
                         f"{target.relative_to(dashlib.ROOT)} (missing)")
        else:
            target.write_text(text)
            print(f"wrote {target.relative_to(dashlib.ROOT)}")
    for orphan in sorted(set(HERE.glob("*.json")) - expected):
        stale.append(f"{orphan.relative_to(dashlib.ROOT)} (no {dashlib.DASHBOARD_SUFFIX} "
                     "source: delete it)")
    if stale:
        print("dashboards out of date; run python grafana/dashboards/generate.py:",
              *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
