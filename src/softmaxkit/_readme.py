"""Keeps README.md's generated sections in step with the code.

``python -m softmaxkit._readme`` rewrites the normalizer table between the
``<!-- section:normalizers -->`` markers from the registry; a test fails when the
README's table differs from the registry.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from . import registry

START, END = "<!-- section:normalizers -->", "<!-- /section:normalizers -->"


def normalizer_section() -> str:
    """The README's normalizer table, generated from the registry."""
    table = registry.table()
    lines = ["## Normalizers", "",
             "Generated from the registry (`softmaxkit list` prints the same table; "
             "regenerate with `python -m softmaxkit._readme`). Every name works with "
             "`sk.normalize(x, name, dim=-1, mask=None, **params)` and has a function `sk.<name>`.", ""]
    lines.append("| " + " | ".join(table.columns) + " |")
    lines.append("|" + "|".join("---" for _ in table.columns) + "|")
    for row in table.rows:
        cells = [f"`{row[0]}`"] + [str(v).replace("|", "\\|") for v in row[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def current_section(text: str) -> str:
    match = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"README has no {START} ... {END} markers")
    return match.group(1)


def update(path: Path) -> bool:
    """Rewrite the section in ``path``; returns True if it changed."""
    text = path.read_text()
    old = current_section(text)
    new = normalizer_section()
    if old == new:
        return False
    path.write_text(text.replace(START + "\n" + old + "\n" + END, START + "\n" + new + "\n" + END))
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    print("updated" if update(target) else "up to date")
