"""Write each table's plots as PNG files beside the report, and read them back for embedding."""

from __future__ import annotations

import base64
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .._table import Table, format_value


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


_RATIO_COLUMN = re.compile(r"speedup|ratio|\bx\b|/")


def ratio_columns(table: Table) -> list[int]:
    """Indices of the columns holding ratios (named "speedup", "ratio", "... x ...", "a / b") with numbers."""
    out = []
    for i, column in enumerate(table.columns):
        values = [row[i] for row in table.rows if i < len(row)]
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if _RATIO_COLUMN.search(str(column)) and numeric and all(v > 0 for v in numeric):
            out.append(i)
    return out


def ratio_figure(table: Table):
    """A bar chart of ``table``'s ratio columns per row (log scale, 1 marked), or ``None``.

    For benchmark tables that come without a plot: every figure there is a ratio to a
    baseline measured in the same run, so 1 is the line that matters.
    """
    columns = ratio_columns(table)
    if not columns or table.skipped or not table.rows:
        return None
    from matplotlib.figure import Figure

    labels = [" ".join(format_value(v) for j, v in enumerate(row) if j not in columns) or f"row {i}"
              for i, row in enumerate(table.rows)]
    height = 0.8 / len(columns)
    fig = Figure(figsize=(7, 0.6 + 0.28 * len(labels) * len(columns) ** 0.5 + 0.5))
    ax = fig.add_subplot()
    for k, col in enumerate(columns):
        values = [row[col] if isinstance(row[col], (int, float)) and row[col] > 0 else float("nan")
                  for row in table.rows]
        ax.barh([i + k * height for i in range(len(labels))], values, height, label=str(table.columns[col]))
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    shown = [row[c] for row in table.rows for c in columns if isinstance(row[c], (int, float)) and row[c] > 0]
    if max(shown + [1.0]) / min(shown + [1.0]) < 10:  # within a decade: label the minor ticks too
        ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="minor", labelsize=6)
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ratio (1 = the baseline measured in the same run)")
    ax.set_title(table.title, fontsize=9)
    ax.legend(fontsize=6, loc="best")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    return fig
