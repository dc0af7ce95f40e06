"""Pictures for notebook 01: which device holds which block of x, W and y.

``split_figure`` draws three heatmaps of owner ids (device colours from :mod:`shardlab.viz.common`, grey =
replicated); ``block_check`` is the blocked product's error against the dense one. The explorer that redraws both
is declared in :mod:`shardlab.blocks.explorers`.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from shardlab import blocks
from shardlab.viz.common import REPLICATED, device_color, finish_grid

KINDS = ("column", "row", "grid")


def _grid_shape(parts: int) -> tuple[int, int]:
    if parts % 2 or parts < 2:
        raise ValueError(f"parts={parts}: the grid split needs an even number of parts (a 2 x parts/2 mesh)")
    return 2, parts // 2


def owners(m: int, k: int, n: int, parts: int, kind: str) -> dict[str, list[list[int]]]:
    """Owner-id maps for x, W and y (−1 = replicated on every device)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")

    def rep(r: int, c: int) -> list[list[int]]:
        return [[-1] * c for _ in range(r)]

    if kind == "column":
        return {"x": rep(m, k), "W": blocks.owner_map(k, n, 1, parts), "y": blocks.owner_map(m, n, 1, parts)}
    if kind == "row":
        return {"x": blocks.owner_map(m, k, 1, parts), "W": blocks.owner_map(k, n, parts, 1), "y": rep(m, n)}
    pr, pc = _grid_shape(parts)
    y = [[pc * i for i in row] for row in blocks.owner_map(m, n, pr, 1)]  # row block i: group of devices i*pc..
    return {"x": blocks.owner_map(m, k, pr, pc), "W": blocks.owner_map(k, n, pc, 1), "y": y}


def split_figure(m: int, k: int, n: int, parts: int, kind: str) -> go.Figure:
    """Three heatmaps: x (m×k), W (k×n), y (m×n), coloured by owning device."""
    own = owners(m, k, n, parts, kind)
    notes = {
        "column": ("x: replicated", "W = [W_1 … W_p]<br>by columns", "y = [xW_1 … xW_p]<br>concatenate, no collective"),
        "row": ("x = [x_1 … x_p]<br>by columns", "W = [W_1; …; W_p]<br>by rows", "y = Σ x_i W_i<br>one all-reduce"),
        "grid": ("x by (mesh rows,<br>mesh cols)", "W rows over<br>mesh cols", "y row blocks:<br>all-reduce per row"),
    }[kind]
    fig = make_subplots(rows=1, cols=3, subplot_titles=notes, column_widths=[k, n, n], horizontal_spacing=0.06)
    n_dev = parts
    scale = [[0.0, REPLICATED], [1.0 / (n_dev + 1), REPLICATED]]
    for d in range(n_dev):
        lo, hi = (d + 1) / (n_dev + 1), (d + 2) / (n_dev + 1)
        scale += [[lo, device_color(d)], [hi, device_color(d)]]
    for col, name in enumerate(("x", "W", "y"), start=1):
        z = own[name]
        text = [["replicated" if v < 0 else f"device {v}" for v in row] for row in z]
        fig.add_trace(go.Heatmap(z=z, zmin=-1, zmax=n_dev - 1, colorscale=scale, showscale=False, text=text,
                                 hovertemplate=f"{name}[%{{y}}, %{{x}}]: %{{text}}<extra></extra>", xgap=1, ygap=1),
                      row=1, col=col)
    return finish_grid(fig, f"{kind} split over {parts} devices: x {m}×{k} @ W {k}×{n}", 340, 12)


def block_check(m: int, k: int, n: int, parts: int, kind: str, seed: int = 0) -> float:
    """Max |blocked − dense| for random float64 operands (0 up to rounding)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    w = torch.randn(k, n, generator=g, dtype=torch.float64)
    if kind == "column":
        bp = blocks.column_parallel(x, w, parts)
    elif kind == "row":
        bp = blocks.row_parallel(x, w, parts)
    else:
        bp = blocks.grid_parallel(x, w, _grid_shape(parts), k_parts=_grid_shape(parts)[1])
    return float((bp.result - x @ w).abs().max())
