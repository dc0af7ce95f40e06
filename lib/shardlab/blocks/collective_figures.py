"""Pictures for notebook 00: what the three collectives do, the ring step by step, and sharding tiles.

- :func:`before_after` draws every rank's tensor before and after each collective, as
  :func:`shardlab.blocks.rank_arithmetic` computed them with the per-rank code in a ``SimulatedWorld``
  on rank-arithmetic data (rank r holds the value r + 1 everywhere): the picture shows what the code returned.
- :func:`ring_figure` draws a :class:`shardlab.blocks.ring.RingTrace`: one panel per step, a row per rank, a
  cell per chunk, coloured by how many ranks' contributions that copy holds, labelled with them.
- :func:`tiles_figure` draws which devices hold each element of a 2-D tensor for a few sharding strings.

Device colours come from :mod:`shardlab.viz.common` (the same device, the same colour, in every notebook).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlab.blocks import rank_arithmetic, tiles
from shardlab.blocks.ring import RingTrace
from shardlab.formulas.common import ceil_div
from shardlab.viz.common import REPLICATED, device_color, finish_grid

SUM = "#444444"  # a value summed over every rank
EMPTY = "#FFFFFF"
TITLES = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}


def _cells(values: list[list[float | None]], colours: list[list[str]]) -> dict[str, Any]:
    """Heatmap arguments that paint each cell with its own colour (z = cell index into a discrete scale)."""
    flat = [c for row in colours for c in row]
    palette = list(dict.fromkeys(flat))
    n = max(len(palette), 1)
    scale = []
    for i, c in enumerate(palette):
        scale += [[i / n, c], [(i + 1) / n, c]]
    z = [[palette.index(c) + 0.5 for c in row] for row in colours]
    text = [["" if v is None else f"{v:g}" for v in row] for row in values]
    return dict(z=z, zmin=0, zmax=n, colorscale=scale, showscale=False, text=text, texttemplate="%{text}",
                xgap=2, ygap=2, hoverinfo="skip")


def before_after(world_size: int = 4) -> go.Figure:
    """Three rows (all-reduce, reduce-scatter, all-gather) × (before, after): a row per rank, a cell per element."""
    w = world_size
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    titles = []
    for op in ops:
        titles += [f"{TITLES[op]}: before", f"{TITLES[op]}: after"]
    fig = make_subplots(rows=3, cols=2, subplot_titles=titles, horizontal_spacing=0.08, vertical_spacing=0.09)
    for i, op in enumerate(ops, start=1):
        before, after = rank_arithmetic(op, w)
        for j, per_rank in enumerate((before, after), start=1):
            values: list[list[float | None]] = []
            colours: list[list[str]] = []
            for r, t in enumerate(per_rank):
                vals = [float(v) for v in t]
                if op == "all_gather" and j == 1:  # rank r holds only its own shard: slot r of W
                    row_v: list[float | None] = [vals[0] if c == r else None for c in range(w)]
                    row_c = [device_color(r) if c == r else EMPTY for c in range(w)]
                elif op == "all_gather":  # slot c came from rank c
                    row_v, row_c = list(vals), [device_color(c) for c in range(w)]
                elif op == "reduce_scatter" and j == 2:  # rank r keeps element r of the sum
                    row_v = [vals[0] if c == r else None for c in range(w)]
                    row_c = [SUM if c == r else EMPTY for c in range(w)]
                elif j == 1:
                    row_v, row_c = list(vals), [device_color(r)] * w
                else:
                    row_v, row_c = list(vals), [SUM] * w
                values.append(row_v)
                colours.append(row_c)
            fig.add_trace(go.Heatmap(**_cells(values, colours), textfont={"color": "white"}), row=i, col=j)
            fig.update_yaxes(autorange="reversed", tickvals=list(range(w)), ticktext=[f"rank {r}" for r in range(w)],
                             row=i, col=j)
            fig.update_xaxes(showticklabels=False, row=i, col=j)
    fig.update_layout(height=560, margin={"l": 10, "r": 10, "t": 80, "b": 10},
                      title=f"{w} ranks; rank r starts with the value r + 1 (its colour); dark grey = summed over all")
    return fig


def ring_figure(trace: RingTrace) -> go.Figure:
    """One panel per step of a ring collective: ranks × chunks, coloured by contributions held."""
    w, steps = trace.world_size, trace.steps
    cols = min(steps + 1, 4) if steps else 1
    rows = ceil_div(steps + 1, cols)
    titles = ["before"] + [f"step {s}: {trace.phase_of(s)}<br>rank r sends chunk {_chunk_rule(trace, s)} to r + 1"
                           for s in range(1, steps + 1)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.04,
                        vertical_spacing=0.16)
    scale: list[list[Any]] = []  # value k + 0.5 (k contributions held) falls in band [k, k + 1] of [0, w + 1]
    for k in range(w + 1):
        c = EMPTY if k == 0 else SUM if k == w else _mix(k, w)
        scale += [[k / (w + 1), c], [(k + 1) / (w + 1), c]]
    for s in range(steps + 1):
        held = trace.held[s]
        z = [[len(h) + 0.5 for h in row] for row in held]
        text = [["+".join(map(str, sorted(h))) for h in row] for row in held]
        fig.add_trace(go.Heatmap(z=z, zmin=0, zmax=w + 1, colorscale=scale, showscale=False, text=text,
                                 texttemplate="%{text}", textfont={"size": 10}, xgap=2, ygap=2, hoverinfo="skip"),
                      row=s // cols + 1, col=s % cols + 1)
    fig.update_yaxes(autorange="reversed", tickvals=list(range(w)), ticktext=[f"rank {r}" for r in range(w)])
    fig.update_xaxes(tickvals=list(range(w)), ticktext=[f"c{c}" for c in range(w)])
    fig.update_annotations(font_size=11)
    per_rank = trace.sent_bytes(0)
    fig.update_layout(height=250 * rows + 80, margin={"l": 10, "r": 10, "t": 110, "b": 10},
                      title=f"ring {TITLES[trace.op]} over {w} ranks: {steps} steps, rank 0 sends {per_rank} bytes<br>"
                            "<sup>a cell lists the ranks whose data that copy of the chunk holds; darker = more of "
                            "them, dark grey = all</sup>")
    return fig


def _chunk_rule(trace: RingTrace, step: int) -> str:
    """'r − 2' etc.: the chunk rank r sends at ``step`` (read from the trace: rank 0's send)."""
    send = next(s for s in trace.sends_at(step) if s.src == 0)
    back = (0 - send.chunk) % trace.world_size
    return f"r − {back}" if back else "r"


def _mix(k: int, w: int) -> str:
    """A light-to-dark blue for a partial sum of k of w contributions."""
    t = (k - 1) / max(w - 1, 1)
    lo, hi = (198, 219, 239), (33, 113, 181)
    r, g, b = (round(a + (z - a) * t) for a, z in zip(lo, hi, strict=True))
    return f"#{r:02X}{g:02X}{b:02X}"


def tiles_figure(strings: Mapping[str, str], shape: tuple[int, int], num_devices: int) -> go.Figure:
    """One panel per sharding string of a 2-D tensor of ``shape``: each element coloured by its first device,
    labelled with every device that holds it (grey when every device does)."""
    fig = make_subplots(rows=1, cols=len(strings), subplot_titles=[f"{k}<br>{v}" for k, v in strings.items()],
                        horizontal_spacing=0.05)
    for col, s in enumerate(strings.values(), start=1):
        own = tiles.owners(shape, tiles.tile_devices(s, 2, num_devices))
        colours = [[REPLICATED if len(d) == num_devices and num_devices > 1 else device_color(d[0]) for d in row]
                   for row in own]
        args = _cells([[None] * shape[1] for _ in range(shape[0])], colours)
        args["text"] = [[",".join(map(str, d)) if len(d) < num_devices or num_devices == 1 else "all" for d in row]
                        for row in own]
        fig.add_trace(go.Heatmap(**args, textfont={"size": 9, "color": "white"}), row=1, col=col)
    return finish_grid(fig, f"a {shape[0]}×{shape[1]} tensor: which devices hold each element", 330, 10)
