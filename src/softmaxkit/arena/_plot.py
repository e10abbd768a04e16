"""Line styles that stay distinguishable for a dozen normalizers on one plot."""

from __future__ import annotations

_MARKERS = "os^vDP*Xph<>"
_DASHES = ("-", "--", "-.", ":")


def line_style(i: int) -> dict:
    """Colour, marker and dash pattern of the ``i``-th line (no two of the first 20 alike)."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    cmap = colormaps["tab20"]
    assert isinstance(cmap, ListedColormap)  # tab20 is a listed (qualitative) colormap
    colors = cmap.colors
    # matplotlib's stub types ListedColormap.colors as any ArrayLike; tab20's is a list of RGB tuples
    color = colors[(2 * i) % 20 + (i // 10) % 2]  # type: ignore[index]
    return {"color": color, "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _DASHES[i % len(_DASHES)], "markersize": 4}
