"""Pictures for context parallelism: the ring's schedule and the causal work per rank.

Design note
-----------
- :func:`ring_schedule` / :func:`ring_figure`: which K/V block each rank holds at each ring step (rank r holds
  the block that started on rank (r − t) mod cp at step t), coloured by the device it started on
  (``viz.common.device_color``), labelled with its sequence chunks.
- :func:`causal_owner` / :func:`causal_figure`: the causal score matrix in chunks (queries x keys), each block
  coloured by the rank that computes it, blank where the mask skips it — contiguous vs zig-zag side by side.
- :func:`work_figure`: unmasked score elements per rank for both layouts (bars: formula; markers: counted from
  the per-rank ring, ``shardlab.context.balance.measure``).
- The notebook's explorer (a small ring's sliders) is declared in :mod:`shardlab.context.explorers`.

This module only draws; the schedule and the counts come from ``shardlab.context`` and ``formulas.context``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlab.context.attention import block_kind, chunk_ids
from shardlab.viz.common import device_color, discrete_colorscale


def ring_schedule(cp: int) -> np.ndarray:
    """[step, rank] -> the rank whose K/V block that rank holds at that step."""
    if cp < 1:
        raise ValueError(f"cp={cp} must be >= 1")
    return np.array([[(r - t) % cp for r in range(cp)] for t in range(cp)])


def ring_figure(cp: int, layout: str = "contiguous") -> go.Figure:
    held = ring_schedule(cp)
    text = [[f"K/V {src}<br>chunks {','.join(map(str, chunk_ids(layout, int(src), cp)))}" for src in row]
            for row in held]
    fig = go.Figure(go.Heatmap(z=held, zmin=-0.5, zmax=cp - 0.5, colorscale=discrete_colorscale(cp), text=text,
                               texttemplate="%{text}", textfont={"size": 10}, xgap=2, ygap=2, showscale=False,
                               hovertemplate="step %{y}, rank %{x}: %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="ring step t", tickvals=list(range(cp)))
    fig.update_xaxes(title="rank (keeps its queries)", tickvals=list(range(cp)))
    fig.update_layout(height=80 + 45 * cp, margin={"l": 10, "r": 10, "t": 70, "b": 10},
                      title=f"ring attention, cp = {cp} ({layout}): at step t rank r holds the K/V of rank (r − t) "
                            f"mod cp<br><sup>{cp - 1} sends of K and of V per rank; colour = the rank the block "
                            "started on</sup>")
    return fig


def causal_owner(cp: int, layout: str) -> np.ndarray:
    """[query chunk, key chunk] -> the rank that computes that block (-1: masked, skipped)."""
    n = cp if layout == "contiguous" else 2 * cp
    owner = -np.ones((n, n), dtype=int)
    for r in range(cp):
        for qc in chunk_ids(layout, r, cp):
            for kc in range(n):
                if block_kind(qc, kc, causal=True) != "masked":
                    owner[qc, kc] = r
    return owner


def causal_figure(cp: int) -> go.Figure:
    layouts = ("contiguous", "zigzag")
    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"{lay}: {cp if lay == 'contiguous' else 2 * cp} chunks"
                                                        for lay in layouts], horizontal_spacing=0.08)
    for col, layout in enumerate(layouts, start=1):
        owner = causal_owner(cp, layout).astype(float)
        owner[owner < 0] = np.nan  # masked: blank
        fig.add_trace(go.Heatmap(z=owner, zmin=-0.5, zmax=cp - 0.5, colorscale=discrete_colorscale(cp),
                                 showscale=False, xgap=1, ygap=1,
                                 hovertemplate="queries %{y} x keys %{x}: rank %{z}<extra></extra>"),
                      row=1, col=col)
    fig.update_yaxes(autorange="reversed", title="query chunk")
    fig.update_xaxes(title="key chunk")
    fig.update_layout(height=420, margin={"l": 10, "r": 10, "t": 80, "b": 10},
                      title="causal attention in chunks, coloured by the rank that computes the block<br><sup>"
                            "blank = masked (skipped); the zig-zag split gives every rank the same area</sup>")
    return fig


def work_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Rows of ``shardlab.context.balance.measure``: formula bars and counted markers per rank and layout."""
    fig = go.Figure()
    for i, row in enumerate(rows):
        ranks = list(range(len(row["elements"])))
        fig.add_bar(x=ranks, y=row["formula_elements"], name=f"{row['layout']} (formula)", offsetgroup=i,
                    marker_color=["#B0B0B0", device_color(0)][i % 2])
        fig.add_scatter(x=ranks, y=row["elements"], mode="markers", marker={"symbol": "x", "size": 10,
                        "color": "black"}, name=f"{row['layout']} (counted)", showlegend=i == 0)
    ratios = ", ".join(f"{r['layout']} {r['max_over_mean']:.2f}" for r in rows)
    fig.update_layout(barmode="group", height=360, xaxis_title="rank", yaxis_title="unmasked score elements",
                      margin={"l": 10, "r": 10, "t": 70, "b": 10},
                      title=f"causal work per rank (max / mean: {ratios})<br><sup>bars: formula; x: counted from "
                            "the blocks the per-rank ring computed</sup>")
    return fig
