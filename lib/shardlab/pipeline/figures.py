"""A pipeline schedule as a timeline: devices down, time across, forward / backward coloured, idle visible.

Design note
-----------
``timeline_figure(timeline)`` draws a :class:`shardlab.pipeline.timeline.Timeline` (a schedule placed on a time
axis by ``simulate``) as horizontal bars: one row per device (device 0 on top, as the papers draw it), one bar
per action, labelled with its microbatch (interleaved: ``microbatch·chunk``), forward in one colour, backward in
another (a zero-bubble schedule's input and weight gradients in two shades of the backward colour), and every
idle interval of a device as a light hatched bar, so the bubble is what you see.  Hover gives the action in
PyTorch's spelling ("1F0": stage 1, forward, microbatch 0), its start and end.  The title states the measured
bubble (idle / busy, the paper's convention) next to the formula's.
``idle_intervals`` is the pure part (tested without plotly).

``split_figure`` draws the stage costs of two splits side by side (the automatic split against the even one).
The notebook's explorer (p, m, v sliders) is declared in :mod:`shardlab.pipeline.explorers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from shardlab.pipeline.schedules import Action
from shardlab.pipeline.timeline import Timeline
from shardlab.viz.common import PADDING, device_color

KIND_COLOR = {"F": "#2E91E5", "B": "#E15F99", "I": "#E15F99", "W": "#F6A6C8"}
KIND_NAME = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)"}

__all__ = ["KIND_COLOR", "idle_intervals", "split_figure", "timeline_figure"]


def idle_intervals(timeline: Timeline) -> list[tuple[int, float, float]]:
    """(device, start, end) of every interval a device waits, from 0 to the makespan."""
    out = []
    for r in range(timeline.schedule.p):
        t = 0
        for e in sorted((e for e in timeline.events if e.device == r), key=lambda e: e.start):
            if e.start > t:
                out.append((r, t, e.start))
            t = e.end
        if timeline.makespan > t:
            out.append((r, t, timeline.makespan))
    return out


def _label(a: Action, p: int, v: int) -> str:
    return f"{a.microbatch}" if v == 1 else f"{a.microbatch}·{a.stage // p}"  # microbatch (· chunk)


def timeline_figure(timeline: Timeline, title: str | None = None, formula: float | None = None) -> Any:
    """The timeline as a plotly figure (see the module note); `formula` (bubble ratio) goes in the title."""
    sched = timeline.schedule
    rows = [f"device {r}" for r in range(sched.p)]
    fig = go.Figure()
    for kind in KIND_COLOR:  # one trace per kind (a trace per bar is slow to build and to draw)
        events = [e for e in timeline.events if e.action.kind == kind]
        if not events:
            continue
        fig.add_bar(y=[rows[e.device] for e in events], x=[float(e.end - e.start) for e in events],
                    base=[float(e.start) for e in events], orientation="h", marker_color=KIND_COLOR[kind],
                    marker_line_color="white", marker_line_width=1, name=KIND_NAME[kind], hoverinfo="text",
                    text=[_label(e.action, sched.p, sched.v) for e in events], textposition="inside",
                    insidetextanchor="middle",
                    hovertext=[f"{e.action} (stage {e.action.stage}, microbatch {e.action.microbatch}): "
                               f"{float(e.start):g} -> {float(e.end):g}" for e in events])
    idle = idle_intervals(timeline)
    if idle:
        fig.add_bar(y=[rows[r] for r, _, _ in idle], x=[float(hi - lo) for _, lo, hi in idle],
                    base=[float(lo) for _, lo, _ in idle], orientation="h", marker_color=PADDING,
                    marker_pattern_shape="/", name="idle (bubble)", hoverinfo="text",
                    hovertext=[f"device {r} idle {float(lo):g} -> {float(hi):g}" for r, lo, hi in idle])
    measured = float(timeline.bubble_ratio)
    head = title or f"{sched.name}: p={sched.p}, m={sched.m}" + (f", v={sched.v}" if sched.v > 1 else "")
    tail = f"bubble / ideal = {measured:.3f}" + (f" (formula {formula:.3f})" if formula is not None else "")
    fig.update_layout(barmode="overlay", title=f"{head} — {tail}", xaxis_title="time (forward of one stage = 1)",
                      yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
                      height=140 + 40 * sched.p, bargap=0.15, legend={"orientation": "h", "y": -0.25})
    return fig


def split_figure(costs: Mapping[str, Sequence[float]], layers: Mapping[str, Sequence[str]], unit: str = "GFLOP",
                 scale: float = 1e9) -> Any:
    """Grouped bars: each split's per-stage cost (``costs[rule]``), hover naming the layers a stage holds."""
    fig = go.Figure()
    for i, (rule, values) in enumerate(costs.items()):
        fig.add_bar(name=rule, x=[f"stage {j}" for j in range(len(values))], y=[c / scale for c in values],
                    marker_color=device_color(i), hovertext=[", ".join(x) for x in layers[rule]], hoverinfo="text+y")
        worst = max(values) / scale
        fig.add_hline(y=worst, line_dash="dot", line_color=device_color(i),
                      annotation_text=f"{rule}: slowest {worst:.3g} {unit}", annotation_position="top left")
    fig.update_layout(barmode="group", height=320, yaxis_title=f"training cost per step ({unit})",
                      title="stage costs: the slowest stage sets the pipeline's pace")
    return fig
