"""Ratio charts for benchmark tables that come without a plot."""

from softmaxkit._table import Table
from softmaxkit.report.figures import ratio_columns, ratio_figure, slug


def test_ratio_columns_are_the_positive_numeric_ratio_columns():
    table = Table(title="t", columns=["shape", "torch ms", "speedup vs torch", "kernel x copy", "fwd / SDPA", "note"])
    table.add("4x8", 1.5, 2.0, 1.1, 0.5, "x / y")
    table.add("8x8", 2.5, 3.0, 1.2, 0.7, "-")
    assert ratio_columns(table) == [2, 3, 4]


def test_ratio_figure_has_one_bar_group_per_ratio_column_and_marks_one():
    table = Table(title="t", columns=["shape", "L", "speedup"], rows=[["a", 16, 2.0], ["b", 32, 0.5]])
    fig = ratio_figure(table)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a 16", "b 32"]
    assert ax.get_xscale() == "log" and any(line.get_xdata()[0] == 1.0 for line in ax.get_lines())


def test_no_figure_without_ratios_or_rows():
    assert ratio_figure(Table(title="t", columns=["name", "ms"], rows=[["a", 1.0]])) is None
    assert ratio_figure(Table(title="t", columns=["speedup"])) is None
    assert ratio_figure(Table(title="t", columns=[], skipped="not installed")) is None


def test_slug_is_file_name_safe():
    assert slug("Soft-NMS vs NMS: AP@0.5 (points)") == "soft-nms-vs-nms-ap-0-5-points"
