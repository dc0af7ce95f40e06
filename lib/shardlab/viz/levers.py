"""Figures of notebook 08 (compiler levers): timings and their α–β fit, the bucket curve, memory profiles of
operator orders, TPU schedules with and without the latency-hiding scheduler, and the layout search."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardlab.viz.common import PALETTE, REPLICATED

KIND_COLOR = {"matmul": PALETTE[0], "collective-start": PALETTE[3], "collective-done": PALETTE[7],
              "collective": PALETTE[4], "other": REPLICATED}


def timing_figure(points: Sequence[Any], fit: Any, title: str = "k all-reduces of n/k elements (gloo)") -> Any:
    """Median time (with min-max bars) against k, one line per total size n; dashed: the α–β model."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, n in enumerate(sorted({p.numel for p in points})):
        pts = sorted((p for p in points if p.numel == n), key=lambda p: p.calls)
        ks = [p.calls for p in pts]
        med = [p.timing.median_s * 1e3 for p in pts]
        fig.add_scatter(x=ks, y=med, mode="markers+lines", name=f"n = {n} (measured)", line_color=PALETTE[i],
                        error_y=dict(type="data", symmetric=False,
                                     array=[(p.timing.max_s - p.timing.median_s) * 1e3 for p in pts],
                                     arrayminus=[(p.timing.median_s - p.timing.min_s) * 1e3 for p in pts]))
        if fit is not None:
            fig.add_scatter(x=ks, y=[fit.time_s(k, n * 4) * 1e3 for k in ks], mode="lines",
                            name=f"n = {n} (α–β model)", line=dict(color=PALETTE[i], dash="dash"))
    fig.update_layout(title=title, xaxis_title="k (calls)", yaxis_title="ms", xaxis_type="log",
                      yaxis_type="log", height=380)
    return fig


def bucket_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """All-reduces (formula and ledger) and the α–β time against the bucket size."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [max(r["bucket_bytes"], 1) for r in rows]
    fig.add_scatter(x=x, y=[r["formula"] for r in rows], name="all-reduces (formula)", mode="lines",
                    line_color=PALETTE[0])
    fig.add_scatter(x=x, y=[r["ledger"] for r in rows], name="all-reduces (ledger)", mode="markers",
                    marker=dict(color=PALETTE[0], size=9, symbol="circle-open"))
    if rows and rows[0].get("model_ms") is not None:
        fig.add_scatter(x=x, y=[r["model_ms"] for r in rows], name="α–β time (ms)", mode="lines+markers",
                        line=dict(color=PALETTE[3], dash="dot"), secondary_y=True)
    fig.update_xaxes(type="log", title="bucket size (bytes)")
    fig.update_yaxes(title="all-reduces", secondary_y=False)
    fig.update_yaxes(title="ms (model)", secondary_y=True)
    fig.update_layout(title="Hand-made buckets: fewer, larger all-reduces", height=360)
    return fig


def profile_figure(profiles: Mapping[str, Any], unit: str = "MB") -> Any:
    """Live memory while each operator runs, one line per order."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, (label, prof) in enumerate(profiles.items()):
        fig.add_scatter(x=[s.op for s in prof.steps], y=[s.during for s in prof.steps], mode="lines+markers",
                        name=f"{label}: peak {prof.peak} {unit}", line=dict(color=PALETTE[i], shape="hv"))
    fig.update_layout(title="Memory while each operator runs", xaxis_title="step", yaxis_title=unit, height=340)
    return fig


def schedule_figure(schedules: Mapping[str, Sequence[tuple[str, str]]], title: str) -> Any:
    """The entry schedule as a strip of coloured cells per program: matmuls, collective starts / dones."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for row, (label, sched) in enumerate(schedules.items()):
        for kind, color in KIND_COLOR.items():
            xs = [i for i, (_, k) in enumerate(sched) if k == kind]
            if xs:
                fig.add_scatter(x=xs, y=[label] * len(xs), mode="markers", name=kind, legendgroup=kind,
                                showlegend=row == 0, marker=dict(symbol="square", size=9, color=color),
                                text=[sched[i][0] for i in xs], hoverinfo="text")
    fig.update_layout(title=title, xaxis_title="position in the schedule", height=120 + 60 * len(schedules))
    return fig


def search_figure(frame: Any) -> Any:
    """Wire bytes against memory per chip, one point per candidate; Megatron and the planner marked."""
    import plotly.graph_objects as go

    fits = frame[frame["fits"]]
    fig = go.Figure()
    fig.add_scatter(x=fits["wire_bytes"], y=fits["memory_bytes"], mode="markers+text",
                    text=[f"{m} {lay}" for m, lay in zip(fits["mesh"], fits["layout"], strict=True)],
                    textposition="top center", marker=dict(size=9, color=PALETTE[0]), name="candidates")
    for col, color, name in (("megatron", PALETTE[3], "Megatron"), ("planner", PALETTE[2], "planner")):
        sel = fits[fits[col]]
        if len(sel):
            fig.add_scatter(x=sel["wire_bytes"], y=sel["memory_bytes"], mode="markers", name=name,
                            marker=dict(size=16, color="rgba(0,0,0,0)", line=dict(color=color, width=3)))
    fig.update_layout(title="Layouts compiled for the TPU: communication vs memory per chip",
                      xaxis_title="wire bytes per chip (ring model)", yaxis_title="bytes per chip", height=420)
    return fig
