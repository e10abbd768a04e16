"""Write each table's plots as PNG files beside the report, and read them back for embedding."""

from __future__ import annotations

import base64
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .._table import Table, is_number, noise_of, row_labels


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


_RATIO_COLUMN = re.compile(r"speed-?up|ratio|\bx\b|/|\bvs\b")

#: Fill colours (light to dark greys and blues) and hatches that stay apart in greyscale.
_FILLS = ("#4d4d4d", "#bdbdbd", "#1f4e99", "#ffffff", "#8c8c8c", "#9ecae1")
_HATCHES = ("", "//", "", "xx", "..", "\\\\")


def bar_style(i: int) -> dict:
    """Face colour, hatch and edge of the ``i``-th bar series: distinct in colour and in greyscale."""
    return {"color": _FILLS[i % len(_FILLS)], "hatch": _HATCHES[i % len(_HATCHES)], "edgecolor": "black",
            "linewidth": 0.6}


def ratio_columns(table: Table) -> list[int]:
    """Indices of the columns holding ratios ("speedup", "ratio", "a x b", "a / b", "time vs b") with numbers."""
    out = []
    for i, column in enumerate(table.columns):
        values = [row[i] for row in table.rows if i < len(row)]
        numeric = [v for v in values if is_number(v)]
        if _RATIO_COLUMN.search(str(column)) and numeric and all(v > 0 for v in numeric):
            out.append(i)
    return out


def quantity(column: str) -> tuple[str, str, str]:
    """``(group, series, axis label)`` of a ratio column: columns of one group measure the same
    quantity against the same baseline and share a chart (one bar series each)."""
    c = str(column).strip()
    if re.search(r"speed-?up", c, re.I):
        vs = re.search(r"\bvs\.?\s+(.+)$", c)
        baseline = vs.group(1) if vs else "the baseline"
        return (f"speed-up vs {baseline}", c, f"speed-up: {baseline} time / softmaxkit time (x; > 1 = faster)")
    if " x " in c:
        head, tail = c.split(" x ", 1)
        label = ("time / time of a plain copy of the same tensor (x; 1 = memory-bandwidth bound)"
                 if tail.strip() == "copy" else f"time / {tail} time (x)")
        return (f"x {tail}", head, label)
    if " / " in c:
        head, tail = c.rsplit(" / ", 1)
        return (f"/ {tail}", head, f"ratio to {tail} (1 = same as {tail})")
    vs = re.match(r"(.+?)\s+vs\s+(.+)$", c)
    if vs:
        what = vs.group(1)
        return (c, c, f"{what} / {what} of {vs.group(2)} (ratio; 1 = {vs.group(2)})")
    return (c, c, f"{c} (ratio)")


def ratio_figures(table: Table) -> list:
    """One horizontal bar chart per quantity among ``table``'s ratio columns: ``[(name, Figure)]``.

    Rows are named by the case (:func:`softmaxkit._table.row_labels`: shape, op, normalizer,
    L), the axis says what the ratio is and of what, 1 is marked by a vertical line, and the
    axis is logarithmic when the values span a decade or more; error bars show the figures'
    run-to-run noise where it was measured. For benchmark tables that
    come without a plot: every figure there is a ratio to a baseline measured in the same run.
    """
    columns = ratio_columns(table)
    if not columns or table.skipped or not table.rows:
        return []
    groups: dict[str, list[int]] = {}
    for col in columns:
        groups.setdefault(quantity(table.columns[col])[0], []).append(col)
    labels = row_labels(table)
    return [(f"{group}", _bar_chart(table, labels, cols)) for group, cols in groups.items()]


def _bar_chart(table: Table, labels: list[str], cols: list[int]):
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    _, _, axis_label = quantity(table.columns[cols[0]])
    if len(cols) == 1 and " / " in str(table.columns[cols[0]]):
        axis_label = f"{table.columns[cols[0]]} (ratio; 1 = equal)"
    height = 0.8 / len(cols)
    fig = Figure(figsize=(7.5, 1.3 + 0.3 * len(labels) * max(1.0, len(cols) ** 0.7)))
    ax = fig.add_subplot()
    shown = []
    for k, col in enumerate(cols):
        values = [row[col] if is_number(row[col]) and row[col] > 0 else float("nan") for row in table.rows]
        shown += [v for v in values if v == v]
        series = quantity(table.columns[col])[1]
        # error bars: the run-to-run noise of the figure, where it was measured
        errors = [v * (noise_of(row[col]) or 0.0) if v == v else 0.0 for v, row in zip(values, table.rows)]
        ax.barh([i + k * height for i in range(len(labels))], values, height, label=series,
                xerr=errors if any(errors) else None, error_kw={"ecolor": "#d00000", "capsize": 2, "elinewidth": 1},
                **bar_style(k))
    ax.set_yticks([i + (len(cols) - 1) * height / 2 for i in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylabel("case")
    ax.invert_yaxis()
    span = max(shown + [1.0]) / min(shown + [1.0])
    if span >= 10:
        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_xlim(0, max(shown + [1.0]) * 1.08)
    ax.axvline(1.0, color="black", linewidth=1.0, linestyle="--")
    ax.set_xlabel(axis_label, fontsize=8)
    ax.set_title(table.title, fontsize=9)
    if len(cols) > 1:
        ax.legend(fontsize=7, loc="best")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def unlabelled_axes(fig) -> list[str]:
    """Titles (or positions) of the axes of ``fig`` that have no x or no y label; ``[]`` when all do."""
    missing = []
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.has_data():
            continue
        if not ax.get_xlabel().strip() or not ax.get_ylabel().strip():
            missing.append(ax.get_title() or f"axes {i}")
    return missing
