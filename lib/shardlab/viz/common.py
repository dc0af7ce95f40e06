"""One colour per device, everywhere: device d is ``device_color(d)`` in every figure of every notebook.

Replicated data is grey, padding is a hatched light grey, partial sums (``{U_X}``, still to be reduced) are
drawn in the colour of the device that holds them with a dashed outline.
"""

from __future__ import annotations

import plotly.graph_objects as go

# Plotly's "Dark24"-like qualitative palette, first 16 entries fixed so device colours never change.
PALETTE = (
    "#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#B68100", "#750D86", "#EB663B",
    "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D", "#6C7C32", "#778AAE", "#862A16",
)
REPLICATED = "#B0B0B0"
PADDING = "#E8E8E8"


def device_color(d: int) -> str:
    """Colour of device ``d`` (cycles after 16 devices)."""
    return PALETTE[d % len(PALETTE)]


def discrete_colorscale(n: int) -> list[list[object]]:
    """A plotly colorscale mapping integer values 0..n-1 to device colours (for heatmaps of owner ids)."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if n == 1:
        return [[0.0, device_color(0)], [1.0, device_color(0)]]
    scale: list[list[object]] = []
    for d in range(n):
        lo, hi = d / n, (d + 1) / n
        scale += [[lo, device_color(d)], [hi, device_color(d)]]
    return scale


def finish_grid(fig: go.Figure, title: str, height: int, font_size: int) -> go.Figure:
    """Heatmap panels drawn as grids: rows top-down, no tick labels, titles at ``font_size``, compact margins."""
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_annotations(font_size=font_size)
    return fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": 90, "b": 10}, title=title)
