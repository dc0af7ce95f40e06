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
"""

from __future__ import annotations

from typing import Any

from shardlab.pipeline.timeline import Timeline
from shardlab.viz.common import PADDING

KIND_COLOR = {"F": "#2E91E5", "B": "#E15F99", "I": "#E15F99", "W": "#F6A6C8"}
KIND_NAME = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)"}

__all__ = ["KIND_COLOR", "idle_intervals", "timeline_figure"]


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


def timeline_figure(timeline: Timeline, title: str | None = None, formula: float | None = None) -> Any:
    """The timeline as a plotly figure (see the module note); `formula` (bubble ratio) goes in the title."""
    import plotly.graph_objects as go

    sched = timeline.schedule
    rows = [f"device {r}" for r in range(sched.p)]
    fig = go.Figure()
    shown: set[str] = set()
    for e in timeline.events:
        a = e.action
        chunk = a.stage // sched.p
        label = f"{a.microbatch}" if sched.v == 1 else f"{a.microbatch}·{chunk}"
        name = KIND_NAME[a.kind]
        fig.add_bar(y=[rows[e.device]], x=[float(e.end - e.start)], base=[float(e.start)], orientation="h",
                    marker_color=KIND_COLOR[a.kind], marker_line_color="white", marker_line_width=1,
                    text=[label], textposition="inside", insidetextanchor="middle", name=name, legendgroup=name,
                    showlegend=name not in shown, hoverinfo="text",
                    hovertext=f"{a} (stage {a.stage}, microbatch {a.microbatch}): {float(e.start):g} -> "
                              f"{float(e.end):g}")
        shown.add(name)
    for r, lo, hi in idle_intervals(timeline):
        fig.add_bar(y=[rows[r]], x=[float(hi - lo)], base=[float(lo)], orientation="h", marker_color=PADDING,
                    marker_pattern_shape="/", name="idle (bubble)", legendgroup="idle",
                    showlegend="idle" not in shown, hoverinfo="text",
                    hovertext=f"device {r} idle {float(lo):g} -> {float(hi):g}")
        shown.add("idle")
    measured = float(timeline.bubble_ratio)
    head = title or f"{sched.name}: p={sched.p}, m={sched.m}" + (f", v={sched.v}" if sched.v > 1 else "")
    tail = f"bubble / ideal = {measured:.3f}" + (f" (formula {formula:.3f})" if formula is not None else "")
    fig.update_layout(barmode="overlay", title=f"{head} — {tail}", xaxis_title="time (forward of one stage = 1)",
                      yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
                      height=140 + 40 * sched.p, bargap=0.15, legend={"orientation": "h", "y": -0.25})
    return fig
