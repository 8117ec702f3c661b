"""The only place generated files are written or checked against what the generators make."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

ORPHAN = "(not generated: delete it)"


def _current(path: Path, fresh: str | bytes) -> str | bytes | None:
    if not path.is_file():
        return None
    return path.read_bytes() if isinstance(fresh, bytes) else path.read_text()


def sync(files: Mapping[Path, str | bytes], check: bool,
         owned: Iterable[tuple[Path, str]] = ()) -> list[str]:
    """Write each changed file (nothing with `check`); return one line per file that was, or
    with `check` is, stale or missing, and per file in an `owned` (folder, glob) that no product
    makes (reported, never deleted)."""
    lines = []
    for path, fresh in files.items():
        current = _current(path, fresh)
        if current == fresh:
            continue
        lines.append(f"{path} ({'missing' if current is None else 'stale'})")
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(fresh, bytes):
                path.write_bytes(fresh)
            else:
                path.write_text(fresh)
    made = {p.resolve() for p in files}
    for folder, pattern in owned:
        lines += [f"{p} {ORPHAN}" for p in sorted(folder.glob(pattern))
                  if p.is_file() and p.resolve() not in made]
    return lines
