"""Write each table's plots as PNG files beside the report, and read them back for embedding."""

from __future__ import annotations

import base64
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .._table import Table


@dataclass
class SavedFigure:
    name: str
    path: str      # relative to the report directory
    png_base64: str


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "figure"


def save_figures(table: Table, out_dir: Path, prefix: str, taken: set[str]) -> list[SavedFigure]:
    """Save ``table.figures`` under ``out_dir/figures/`` and return them; closes matplotlib figures.

    A figure is either a path to an existing PNG (copied) or a ``(name, Figure)`` pair
    (rendered with the Agg backend).
    """
    folder = out_dir / "figures"
    saved = []
    for i, item in enumerate(table.figures):
        if isinstance(item, (str, Path)):
            name, source = Path(item).stem, Path(item)
        else:
            name, source = item[0], item[1]
        stem = slug(f"{prefix}-{name}")
        while stem in taken:
            stem += f"-{i}"
        taken.add(stem)
        target = folder / f"{stem}.png"
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Path):
            shutil.copyfile(source, target)
        else:
            source.savefig(target, format="png", dpi=100, bbox_inches="tight")
            if getattr(source.canvas, "manager", None) is not None:  # made through pyplot
                import matplotlib.pyplot as plt

                plt.close(source)
        data = base64.b64encode(target.read_bytes()).decode("ascii")
        saved.append(SavedFigure(name=str(name), path=f"figures/{stem}.png", png_base64=data))
    return saved
