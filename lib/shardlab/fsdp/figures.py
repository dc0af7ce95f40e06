"""The FSDP flat buffer as a picture (notebook 05's explorer, :mod:`shardlab.fsdp.explorers`, redraws it).

Design note
-----------
``flat_buffer_figure(plan, names)`` draws the padded flat parameter [0, n_pad) twice, as two stacked bars that
share the x axis (flat element index):

* top, "parameters": one segment per parameter (a parameter palette distinct from device colours),
  alignment padding (``use_orig_params``) in light grey, shard padding (zeros up to N·c) in dark grey;
* bottom, "ranks": rank r's slice [r·c, (r+1)·c) in ``device_color(r)``; dashed lines mark rank boundaries.

Hover shows, per piece, the parameter, its intra-parameter index range (end inclusive, as in
``ShardParamInfo``) and the owning rank.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from shardlab.fsdp.flat_param import FlatShardPlan
from shardlab.viz.common import PADDING, device_color

PARAM_PALETTE = ("#8DD3C7", "#FFFFB3", "#BEBADA", "#FB8072", "#80B1D3", "#FDB462", "#B3DE69", "#FCCDE5",
                 "#BC80BD", "#CCEBC5", "#FFED6F", "#D9D9D9")
SHARD_PADDING = "#707070"


def pieces(plan: FlatShardPlan, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every maximal run of the padded flat buffer with one owner rank and one content (param / padding)."""
    names = names or [f"p{i}" for i in range(len(plan.numels))]
    c = plan.shard_numel
    runs: list[dict[str, Any]] = []
    content = [(s.start, s.start + s.numel, s.kind, s.param_index) for s in plan.segments]
    content.append((plan.flat_numel, plan.padded_numel, "shard_pad", None))
    for lo, hi, kind, idx in content:
        x = lo
        while x < hi:
            r = x // c
            end = min(hi, (r + 1) * c)
            label = names[idx] if kind == "param" else ("alignment padding" if kind == "align_pad"
                                                        else "shard padding (zeros)")
            runs.append({"start": x, "end": end, "rank": r, "kind": kind, "param_index": idx, "label": label,
                         "intra": (x - lo, end - 1 - lo) if kind == "param" else None})
            x = end
    return runs


def flat_buffer_figure(plan: FlatShardPlan, names: list[str] | None = None, title: str | None = None) -> go.Figure:
    fig = go.Figure()
    shown: set[str] = set()
    for p in pieces(plan, names):
        if p["kind"] == "param":
            color, pattern = PARAM_PALETTE[p["param_index"] % len(PARAM_PALETTE)], ""
            hover = f"{p['label']}[{p['intra'][0]}..{p['intra'][1]}] on rank {p['rank']}"
        else:
            color = PADDING if p["kind"] == "align_pad" else SHARD_PADDING
            pattern = "/"
            hover = f"{p['label']}: flat [{p['start']}, {p['end'] - 1}] on rank {p['rank']}"
        width = p["end"] - p["start"]
        fig.add_bar(y=["parameters"], x=[width], base=[p["start"]], orientation="h", marker_color=color,
                    marker_pattern_shape=pattern, marker_line_color="white", marker_line_width=0.5,
                    name=p["label"], legendgroup=p["label"], showlegend=p["label"] not in shown,
                    hovertext=hover, hoverinfo="text")
        shown.add(p["label"])
    c = plan.shard_numel
    for r in range(plan.world_size):
        rs = plan.ranks[r]
        fig.add_bar(y=["ranks"], x=[c], base=[r * c], orientation="h", marker_color=device_color(r),
                    name=f"rank {r}", showlegend=False,  # labelled r0, r1, ... inside the bar
                    hovertext=f"rank {r}: flat [{r * c}, {(r + 1) * c - 1}], {rs.numel_unpadded} real + "
                              f"{rs.numel_padded} zero padding", hoverinfo="text", text=[f"r{r}"],
                    textposition="inside")
        if r:
            fig.add_vline(x=r * c, line_dash="dash", line_color="black", line_width=1)
    fig.update_layout(
        barmode="overlay", height=300, margin=dict(l=10, r=10, t=50, b=90), xaxis_title="flat element index",
        title=title or (f"flat parameter: {plan.param_numel} params + {plan.align_padding_numel} alignment pad + "
                        f"{plan.shard_padding_numel} shard pad = {plan.padded_numel} = {plan.world_size} × "
                        f"{plan.shard_numel}"),
        legend=dict(orientation="h", y=-0.5),
        yaxis=dict(categoryorder="array", categoryarray=["ranks", "parameters"]),
        xaxis=dict(range=[0, plan.padded_numel]),
    )
    return fig


def parse_sizes(text: str) -> tuple[int, ...]:
    """'16, 32, 8' -> (16, 32, 8) with an error naming the text."""
    try:
        sizes = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise ValueError(f"layer sizes {text!r} must be comma-separated integers, e.g. '16, 32, 8'") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"layer sizes {text!r} need at least two widths, each >= 1")
    return sizes
