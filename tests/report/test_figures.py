"""Charts a person can read: one quantity per chart, labelled axes, rows named by their case,
a log axis only where ratios span a decade, a reference line at 1, styles apart in greyscale."""

import pytest

from softmaxkit._table import Table, row_labels
from softmaxkit.report.figures import (
    bar_style,
    quantity,
    ratio_columns,
    ratio_figures,
    slug,
    unlabelled_axes,
)


def kernels_like_table():
    table = Table(title="softmax forward", columns=["shape", "torch ms", "kernel ms", "speedup vs torch",
                                                    "kernel x copy", "torch x copy", "three-pass / two-pass"])
    table.add("256x32768", 21.3, 40.1, 0.53, 7.9, 4.2, 1.02)
    table.add("8192x1024", 12.0, 3.0, 4.0, 1.9, 7.5, 0.98)
    return table


def test_ratio_columns_are_the_positive_numeric_ratio_columns():
    table = Table(title="t", columns=["shape", "torch ms", "speedup vs torch", "kernel x copy", "fwd / SDPA", "note"])
    table.add("4x8", 1.5, 2.0, 1.1, 0.5, "x / y")
    table.add("8x8", 2.5, 3.0, 1.2, 0.7, "-")
    assert ratio_columns(table) == [2, 3, 4]


def test_one_chart_per_quantity():
    charts = dict(ratio_figures(kernels_like_table()))
    # "kernel x copy" and "torch x copy" are one quantity (time over the copy time); the others stand alone
    assert sorted(charts) == ["/ two-pass", "speed-up vs torch", "x copy"]
    copy_chart = charts["x copy"].axes[0]
    assert [t.get_text() for t in copy_chart.get_legend().get_texts()] == ["kernel", "torch"]
    assert "copy" in copy_chart.get_xlabel()
    assert "torch time / softmaxkit time" in charts["speed-up vs torch"].axes[0].get_xlabel()


def test_rows_are_named_by_their_case_not_the_raw_row():
    table = Table(title="t", columns=["normalizer", "passes", "L", "fwd / SDPA"])
    table.add("softpick", "one", 256, 2.0)
    table.add("softpick", "one", 512, 0.5)
    assert row_labels(table) == ["softpick, one, L=256", "softpick, one, L=512"]
    ax = ratio_figures(table)[0][1].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["softpick, one, L=256", "softpick, one, L=512"]
    # numbers before any label column: widened until the names are unique
    grid = Table(title="g", columns=["noise", "crowding", "AP"], rows=[[0.1, 0.0, 50.0], [0.1, 0.4, 51.0]])
    assert row_labels(grid) == ["noise=0.1, crowding=0", "noise=0.1, crowding=0.4"]


@pytest.mark.parametrize("values, log", [((2.0, 0.5), False), ((20.0, 0.5), True)])
def test_log_axis_only_when_ratios_span_a_decade_and_one_is_marked(values, log):
    table = Table(title="t", columns=["shape", "speedup"], rows=[["a", values[0]], ["b", values[1]]])
    ax = ratio_figures(table)[0][1].axes[0]
    assert (ax.get_xscale() == "log") == log
    assert any(tuple(line.get_xdata()) == (1.0, 1.0) for line in ax.get_lines())


def test_every_ratio_chart_has_both_axis_labels():
    for _, fig in ratio_figures(kernels_like_table()):
        assert unlabelled_axes(fig) == []


def test_unlabelled_axes_finds_a_missing_label():
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [3, 4])
    ax.set_title("bare")
    ax.set_xlabel("x only")
    assert unlabelled_axes(fig) == ["bare"]


def test_bar_styles_differ_in_greyscale():
    from matplotlib.colors import to_rgb

    def grey(i):
        r, g, b = to_rgb(bar_style(i)["color"])
        return round(0.299 * r + 0.587 * g + 0.114 * b, 2), bar_style(i)["hatch"]

    assert len({grey(i) for i in range(6)}) == 6


def test_quantity_names_axis_and_series():
    assert quantity("fwd+bwd / SDPA")[:2] == ("/ SDPA", "fwd+bwd")
    assert quantity("memory vs torch")[2].startswith("memory / memory of torch")


def test_no_figure_without_ratios_or_rows():
    assert ratio_figures(Table(title="t", columns=["name", "ms"], rows=[["a", 1.0]])) == []
    assert ratio_figures(Table(title="t", columns=["speedup"])) == []
    assert ratio_figures(Table(title="t", columns=[], skipped="not installed")) == []


def test_slug_is_file_name_safe():
    assert slug("Soft-NMS vs NMS: AP@0.5 (points)") == "soft-nms-vs-nms-ap-0-5-points"
