"""Line styles that stay distinguishable for a dozen normalizers on one plot."""

from __future__ import annotations

_MARKERS = "os^vDP*Xph<>"
_DASHES = ("-", "--", "-.", ":")


def line_style(i: int) -> dict:
    """Colour, marker and dash pattern of the ``i``-th line (no two of the first 20 alike)."""
    from matplotlib import colormaps

    colors = colormaps["tab20"].colors
    return {"color": colors[(2 * i) % 20 + (i // 10) % 2], "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _DASHES[i % len(_DASHES)], "markersize": 4}
