"""Figures for notebook 06 (scan over layers, shard_as).

* :func:`compile_curves` — compile time and HLO size vs L, one line per mode (loop / scan_layers / scan).
* :func:`bytes_vs_layers` — per-device stacked-gradient bytes vs L, shard_as on vs off: the formula's lines and the
  compilers' measured points.
* :func:`tiling_figure` — which device holds which tile of a [d_in, d_out] gradient, read from XLA's spec
  string: 2-D (one device per tile) next to 1-D (each tile replicated over the fsdp axis).

The explorer (mesh, L, hidden re-running the small case) is declared in :mod:`shardlab.xla_scan.explorers`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlab.viz.common import device_color

MODE_COLORS = {"loop": "#EB663B", "scan_layers": "#B68100", "scan": "#2E91E5"}


def compile_curves(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """rows: dicts with mode, layers, compile_s, hlo_instructions (the compile sweep's rows)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("compile time (s)", "HLO instructions (per device)"))
    for mode in MODE_COLORS:
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["layers"])
        if not rs:
            continue
        x = [r["layers"] for r in rs]
        style = dict(mode="lines+markers", name=mode, line=dict(color=MODE_COLORS[mode]), legendgroup=mode)
        fig.add_scatter(x=x, y=[r["compile_s"] for r in rs], row=1, col=1, **style)
        fig.add_scatter(x=x, y=[r["hlo_instructions"] for r in rs], row=1, col=2, showlegend=False, **style)
    fig.update_xaxes(title_text="layers L", type="log", dtick=math.log10(2))
    fig.update_layout(height=360, title="Loop grows with L; pre-stacked scan stays flat")
    return fig


def bytes_vs_layers(lines: dict[str, list[tuple[int, int]]], points: dict[str, list[tuple[int, int]]]
                    ) -> go.Figure:
    """Stacked-gradient MiB per device vs L: ``lines`` {label: [(L, bytes)]} (the formula, drawn as lines) and
    ``points`` {label: [(L, bytes)]} (measured, drawn as markers). A label containing "off" is drawn red."""
    fig = go.Figure()
    for label, xy in lines.items():
        xy = sorted(xy)
        color = "#FB0D0D" if "off" in label else "#2E91E5"
        fig.add_scatter(x=[x for x, _ in xy], y=[y / 2**20 for _, y in xy], mode="lines", name=label,
                        line=dict(color=color, dash="dash" if "off" in label else "solid"))
    symbols = ["circle", "x", "diamond", "square", "triangle-up", "cross"]
    for i, (label, xy) in enumerate(points.items()):
        color = "#FB0D0D" if "off" in label else "#2E91E5"
        fig.add_scatter(x=[x for x, _ in xy], y=[y / 2**20 for _, y in xy], mode="markers", name=label,
                        marker=dict(color=color, symbol=symbols[i % len(symbols)], size=10,
                                    line=dict(width=1, color="black")))
    fig.update_xaxes(title_text="layers L")
    fig.update_yaxes(title_text="stacked gradients, MiB per device")
    fig.update_layout(height=360, title="Without shard_as the stacked gradients are 1-D: the slope is fsdp× steeper")
    return fig


def tile_devices(spec: str, rank: int) -> np.ndarray:
    """Device ids per tile: array of shape (*tiles, replicas) from ``{devices=[a,b(,r)]ids...}``.

    >>> tile_devices("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", 2).tolist()
    [[[0, 2], [1, 3]]]
    """
    m = re.search(r"devices=\[([\d,]+)\]([\d,]+)", spec)
    if m is None:
        raise ValueError(f"spec {spec!r} has no explicit device tiling")
    dims = [int(d) for d in m.group(1).split(",")]
    ids = np.array([int(d) for d in m.group(2).split(",")])
    if len(dims) == rank:
        dims = [*dims, 1]
    if len(dims) != rank + 1:
        raise ValueError(f"spec {spec!r}: {len(dims)} tile dims do not fit a rank-{rank} tensor")
    return ids.reshape(dims)


def tiling_figure(specs: dict[str, str], rows_label: str = "d_in", cols_label: str = "d_out") -> go.Figure:
    """One heatmap per spec (e.g. ``{"shard_as on": s1, "shard_as off": s2}``) of a 2-D gradient's tiles.

    Each cell is one tile on the finest common grid; its colour is the first device holding it, its text
    lists every device holding a copy.
    """
    grids = {k: tile_devices(v, 2) for k, v in specs.items()}
    R = math.lcm(*[g.shape[0] for g in grids.values()])
    C = math.lcm(*[g.shape[1] for g in grids.values()])
    fig = make_subplots(rows=1, cols=len(grids), subplot_titles=[f"{k}: {g.shape[0]}×{g.shape[1]} tiles, "
                                                                 f"{g.shape[2]} cop{'y' if g.shape[2] == 1 else 'ies'}"
                                                                 for k, g in grids.items()])
    n_dev = int(max(g.max() for g in grids.values())) + 1
    scale = [[i / max(n_dev - 1, 1), device_color(i)] for i in range(n_dev)]
    for col, g in enumerate(grids.values(), start=1):
        z = np.zeros((R, C), dtype=int)
        text = np.empty((R, C), dtype=object)
        for i in range(R):
            for j in range(C):
                devs = g[i * g.shape[0] // R, j * g.shape[1] // C]
                z[i, j] = devs[0]
                text[i, j] = ",".join(f"d{d}" for d in devs)
        fig.add_heatmap(z=z, text=text, texttemplate="%{text}", colorscale=scale, zmin=0, zmax=max(n_dev - 1, 1),
                        showscale=False, xgap=2, ygap=2, row=1, col=col)
        fig.update_yaxes(autorange="reversed", title_text=rows_label, showticklabels=False, row=1, col=col)
        fig.update_xaxes(title_text=cols_label, showticklabels=False, row=1, col=col)
    fig.update_layout(height=320, title="Which devices hold each tile of the per-layer W_up gradient")
    return fig
