"""Pictures for expert parallelism: where the router sends tokens, what the all-to-all carries, what is dropped.

Design note
-----------
- :func:`load_figure`: per expert, assignments kept (coloured by the device that holds the expert) and dropped
  (hatched) summed over the groups, with the capacity of one group x groups as a line.
- :func:`dispatch_matrix` / :func:`dispatch_figure`: the dispatch all-to-all as a rank x rank matrix — tokens
  rank i sends to rank j (kept assignments to j's experts) next to the slots the buffer carries (E/ep·C from
  every rank to every rank, used or not): the all-to-all pays for capacity, not for tokens.
- :func:`drop_figure`: dropped fraction vs capacity factor: measured, the formula for the routing at hand, and the
  uniform-routing expectation.
- The notebook's explorer (sliders over its parameters) is declared in :mod:`shardlab.expert.explorers`.

This module only draws; loads come from the router (``shardlab.expert.moe``), numbers from ``formulas.expert``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from shardlab.viz.common import PADDING, device_color


def load_figure(loads: list[list[int]], capacity: int, ep: int) -> Any:
    """loads[g][e]: assignments of group g to expert e; ``capacity`` per group; experts split over ep ranks."""
    arr = np.asarray(loads)
    experts = arr.shape[1]
    kept = np.minimum(arr, capacity).sum(axis=0)
    dropped = np.maximum(arr - capacity, 0).sum(axis=0)
    owner = [e // (experts // ep) for e in range(experts)]
    fig = go.Figure()
    fig.add_bar(x=list(range(experts)), y=kept, marker_color=[device_color(o) for o in owner], name="kept",
                hovertemplate="expert %{x}: %{y} kept<extra></extra>")
    fig.add_bar(x=list(range(experts)), y=dropped, marker_color=PADDING, marker_pattern_shape="/", name="dropped",
                hovertemplate="expert %{x}: %{y} dropped<extra></extra>")
    fig.add_hline(y=capacity * arr.shape[0], line_dash="dash",
                  annotation_text=f"capacity {capacity} x {arr.shape[0]} groups")
    fig.update_layout(barmode="stack", height=340, xaxis_title="expert (colour: the rank that holds it)",
                      yaxis_title="assignments", margin={"l": 10, "r": 10, "t": 60, "b": 10},
                      title=f"router load per expert: {int(kept.sum())} kept, {int(dropped.sum())} dropped")
    return fig


def dispatch_matrix(loads: list[list[int]], capacity: int, ep: int) -> np.ndarray:
    """[source rank i, destination rank j] -> kept assignments i sends to j's experts (one group per rank)."""
    arr = np.minimum(np.asarray(loads), capacity)
    if arr.shape[0] != ep or arr.shape[1] % ep:
        raise ValueError(f"loads {arr.shape} must be [ep={ep} groups, experts divisible by ep]")
    return arr.reshape(ep, ep, arr.shape[1] // ep).sum(axis=2)


def dispatch_figure(loads: list[list[int]], capacity: int, ep: int) -> Any:
    m = dispatch_matrix(loads, capacity, ep)
    slots = capacity * (np.asarray(loads).shape[1] // ep)
    fig = go.Figure(go.Heatmap(z=m, zmin=0, zmax=slots, colorscale="Blues", text=m, texttemplate="%{text}",
                               colorbar={"title": "tokens"},
                               hovertemplate="rank %{y} -> rank %{x}: %{z} tokens<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="source rank (its tokens)", tickvals=list(range(ep)))
    fig.update_xaxes(title="destination rank (its experts)", tickvals=list(range(ep)))
    fig.update_layout(height=120 + 40 * ep, margin={"l": 10, "r": 10, "t": 70, "b": 10},
                      title=f"dispatch all-to-all: tokens per (source, destination)<br><sup>every cell carries "
                            f"{slots} slots (E/ep x C) whatever it uses; the diagonal stays home</sup>")
    return fig


def drop_figure(rows: list[dict[str, Any]]) -> Any:
    """rows: ``{"capacity_factor", "measured", "formula", "uniform"}`` dropped fractions."""
    cf = [r["capacity_factor"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(x=cf, y=[r["formula"] for r in rows], mode="lines", name="formula (this routing's loads)")
    fig.add_scatter(x=cf, y=[r["measured"] for r in rows], mode="markers", marker={"symbol": "x", "size": 10},
                    name="measured (dispatch)")
    fig.add_scatter(x=cf, y=[r["uniform"] for r in rows], mode="lines", line={"dash": "dot"},
                    name="uniform routing (binomial)")
    fig.update_layout(height=340, xaxis_title="capacity factor", yaxis_title="dropped fraction of assignments",
                      margin={"l": 10, "r": 10, "t": 50, "b": 10}, title="tokens dropped vs capacity factor")
    return fig
