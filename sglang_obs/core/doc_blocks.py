"""Generated blocks inside hand-written Markdown (docs/simulator.md, docs/runbooks.md).

A block sits between the lines `<!-- generated:NAME -->` and `<!-- end:NAME -->`; `make generate`
rewrites what is between the markers and leaves the prose around them alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_START = re.compile(r"^<!-- generated:(\S+) -->$", re.M)  # a marker is a line of its own


class DocBlockError(ValueError):
    """The document's blocks and the generator's disagree: one is missing or unknown."""


def replace_blocks(text: str, blocks: Mapping[str, str], doc: Path) -> str:
    """`text` with each block's content replaced by blocks[name] (which ends in a newline)."""
    # A block the generator no longer makes would otherwise freeze stale text in the doc.
    unknown = sorted(set(_START.findall(text)) - set(blocks))
    if unknown:
        raise DocBlockError(f"{doc}: no generator for blocks {unknown}")
    for name, content in blocks.items():
        pattern = re.compile(
            rf"^(<!-- generated:{re.escape(name)} -->\n).*?^(<!-- end:{re.escape(name)} -->)$",
            re.S | re.M)
        if not pattern.search(text):
            raise DocBlockError(f"{doc}: block {name} missing")
        text = pattern.sub(lambda m, content=content: m.group(1) + content + m.group(2), text)
    return text



def read_block(text: str, name: str) -> str:
    """The content of block `name` as it stands (a generator that makes another block of the
    same document hands it back unchanged)."""
    pattern = re.compile(
        rf"^<!-- generated:{re.escape(name)} -->\n(.*?)^<!-- end:{re.escape(name)} -->$",
        re.S | re.M)
    m = pattern.search(text)
    if not m:
        raise DocBlockError(f"block {name} missing")
    return m.group(1)
