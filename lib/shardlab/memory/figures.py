"""Figures of the memory levers (shardlab.memory): live memory over the step for each operator order, the
update schedule's peaks, the attention core's per-chip temporaries against the sequence length, flash vs plain,
ROAM's solve time against the graph's size. The explorer of a step's orders is declared in
:mod:`shardlab.memory.explorers`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from shardlab.profile import order as order_mod
from shardlab.profile import tpu
from shardlab.viz.common import PALETTE

MIB = 2**20
GIB = 2**30
ORDER_COLORS = {"program": PALETTE[3], "base": PALETTE[5], "greedy": PALETTE[7], "ilp": PALETTE[2],
                "ilp_unsplit": PALETTE[0]}
PHASE_COLORS = {"forward": "rgba(46,145,229,0.08)", "backward": "rgba(225,95,153,0.08)",
                "update": "rgba(28,167,28,0.10)"}


def order_profiles_figure(graph: order_mod.Graph, orders: Mapping[str, Sequence[str]],
                          phase: Mapping[str, str] | None = None,
                          title: str = "Live temporaries while the step runs, one line per operator order"
                          ) -> go.Figure:
    """Bytes live during each operator (``profile.order.peak``) for every order; the program order's phases shaded."""
    fig = go.Figure()
    for i, (name, order) in enumerate(orders.items()):
        prof = order_mod.peak(graph, order)
        y = [s.during / MIB for s in prof.steps]
        fig.add_scatter(x=list(range(len(y))), y=y, mode="lines", name=f"{name} (peak {prof.peak / MIB:.2f} MiB)",
                        line=dict(color=ORDER_COLORS.get(name, PALETTE[i % len(PALETTE)]), width=1.5),
                        hovertext=list(prof.order), hoverinfo="text+y")
    program = orders.get("program")
    if phase is not None and program is not None:
        start, current = 0, _phase(phase.get(program[0], ""))
        for k, op in enumerate([*program[1:], None], start=1):
            ph = _phase(phase.get(op, "")) if op is not None else None
            if ph != current:
                fig.add_vrect(x0=start - 0.5, x1=k - 0.5, fillcolor=PHASE_COLORS.get(current, "rgba(0,0,0,0)"),
                              line_width=0, annotation_text=current, annotation_position="top left")
                start, current = k, ph
    fig.update_layout(title=title, xaxis_title="operator (position in the order)", yaxis_title="MiB live",
                      height=420, legend=dict(orientation="h", y=-0.2))
    return fig


def _phase(p: str) -> str:
    return p.split(":", 1)[0]


def flash_figure(rows: Sequence[Any], title: str = "Attention core, forward + backward: per-chip temporaries "
                 "(XLA:TPU) and the planner's terms") -> go.Figure:
    """Temporaries against the sequence length: compiler (solid; open markers where it did not fit: the size the
    out-of-memory message reports) and the planner's formula (dashed), flash vs plain; log-log."""
    fig = go.Figure()
    for kernel in ("plain", "flash"):
        pts = sorted((r for r in rows if r.config["kernel"] == kernel), key=lambda r: r.config["seq"])
        if not pts:
            continue
        color = PALETTE[3] if kernel == "plain" else PALETTE[2]
        xs = [r.config["seq"] for r in pts]
        fig.add_scatter(x=xs, y=[r.temp / GIB for r in pts], mode="lines+markers", name=f"{kernel}: XLA:TPU",
                        line=dict(color=color), marker=dict(symbol=["circle" if r.fits else "circle-open"
                                                                    for r in pts], size=9))
        fig.add_scatter(x=xs, y=[max(r.formula, 1) / GIB for r in pts], mode="lines", name=f"{kernel}: planner",
                        line=dict(color=color, dash="dash"))
        sq = [(r.config["seq"], r.square_bytes / GIB) for r in pts if r.square_bytes]
        if sq:
            fig.add_scatter(x=[s for s, _ in sq], y=[b for _, b in sq], mode="markers", name=f"{kernel}: largest s×s",
                            marker=dict(color=color, symbol="square", size=7))
    if rows and rows[0].config.get("tensor") is not None:
        cap = _capacity(rows)
        if cap:
            fig.add_hline(y=cap / GIB, line=dict(color="grey", dash="dot"), annotation_text="HBM per chip")
    fig.update_layout(title=title, xaxis_title="sequence length", yaxis_title="GiB per chip", xaxis_type="log",
                      yaxis_type="log", height=420)
    return fig


def _capacity(rows: Sequence[Any]) -> int | None:
    try:
        return tpu.get_topology(rows[0].topology).hbm_bytes
    except ValueError:
        return None


def schedule_figure(result: Mapping[str, Any], title: str = "Adam updates: eager, at the end, or chosen per "
                    "parameter (simulator, and XLA:TPU)") -> go.Figure:
    """Peaks of the three schedules (``memory.update_schedule.compare``, optionally with ``tpu`` peaks)."""
    fig = go.Figure()
    keys = ("eager", "end", "best")
    fig.add_bar(x=list(keys), y=[result[k] / MIB for k in keys], name="simulator (DAG)", marker_color=PALETTE[0])
    if result.get("tpu"):
        fig.add_bar(x=list(keys), y=[(result["tpu"].get(k) or 0) / MIB for k in keys], name="XLA:TPU temporaries",
                    marker_color=PALETTE[8])
    fig.update_layout(title=title, yaxis_title="MiB", barmode="group", height=340)
    return fig


def solve_time_figure(rows: Sequence[Mapping[str, Any]], title: str = "Integer programs: seconds to solve against the "
                      "graph's operators") -> go.Figure:
    """Split (every part) and unsplit solve seconds per graph (``rows``: ``{graph, nodes, split s, unsplit s,
    unsplit optimal}``); an unsplit run that hit its limit is an open marker; log-log."""
    fig = go.Figure()
    xs = [r["nodes"] for r in rows]
    fig.add_scatter(x=xs, y=[r["split s"] for r in rows], mode="lines+markers", name="split (ROAM)",
                    text=[r["graph"] for r in rows], line=dict(color=PALETTE[2]))
    un = [r for r in rows if r.get("unsplit s")]
    fig.add_scatter(x=[r["nodes"] for r in un], y=[r["unsplit s"] for r in un], mode="markers", name="unsplit",
                    text=[r["graph"] for r in un], marker=dict(size=10, color=PALETTE[3], symbol=[
                        "circle" if r.get("unsplit optimal") else "circle-open" for r in un]))
    fig.update_layout(title=title, xaxis_title="operators", yaxis_title="seconds", xaxis_type="log", yaxis_type="log",
                      height=360)
    return fig
