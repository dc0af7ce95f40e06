"""Pictures for tensor parallelism (notebooks 02-04).

Design note
-----------
- `ownership_figure(panels)`: one heatmap per matrix, each cell coloured by the device that holds it
  (`viz.common.device_color`), so "A split by columns, B by rows" is seen, not read.  Panel builders:
  `mlp_panels`, `attention_panels`, `embedding_panels` (uneven vocab shows as unequal bands).
- `ledger_frame(ledger)` / `ledger_timeline(ledger)`: the collectives a per-rank run issued, as a table and as
  bars in program order (height = payload bytes, colour = forward / backward).
- `saving_ratio_figure(vocabs, tps)`: gathered logits over vocab-parallel CE, wire and payload conventions.
- The notebooks' explorers (sliders over a small configuration) are declared in `shardlab.tp.explorers`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlab.comm import Ledger
from shardlab.formulas import tp as ftp
from shardlab.tp.layers import vocab_range
from shardlab.viz.common import device_color, discrete_colorscale

Panel = tuple[str, np.ndarray]  # (title, owner id per cell)


def _bands(n: int, tp: int, sizes: list[int] | None = None) -> np.ndarray:
    sizes = sizes or [n // tp] * tp
    return np.repeat(np.arange(tp), sizes)


def mlp_panels(hidden: int, ffn: int, tp: int) -> list[Panel]:
    cols = _bands(ffn, tp)
    return [
        (f"A [h={hidden}, ffn={ffn}]: columns", np.tile(cols, (hidden, 1))),
        (f"B [ffn={ffn}, h={hidden}]: rows", np.tile(cols[:, None], (1, hidden))),
    ]


def attention_panels(hidden: int, heads: int, tp: int) -> list[Panel]:
    cols = _bands(hidden, tp)  # head j lives in columns [j*hd, (j+1)*hd): whole heads per device
    panels = [(f"W_{n} [h, h]: heads {heads // tp}/device", np.tile(cols, (hidden, 1))) for n in "QKV"]
    return panels + [("W_out [h, h]: rows", np.tile(cols[:, None], (1, hidden)))]


def embedding_panels(vocab: int, hidden: int, tp: int, tokens: int = 16, max_rows: int = 240) -> list[Panel]:
    """Rows of E and columns of the logits by owner; a large vocab is drawn at `max_rows` sampled rows (the
    band edges stay where vocab_range puts them)."""
    ranges = [vocab_range(vocab, r, tp) for r in range(tp)]
    sizes = [e - s for s, e in ranges]
    sample = np.linspace(0, vocab - 1, min(vocab, max_rows)).round().astype(int)  # row ids drawn
    starts = np.array([s for s, _ in ranges])
    rows = np.searchsorted(starts, sample, side="right") - 1  # owner of each drawn row
    scale = "" if vocab <= max_rows else f" ({len(sample)} of {vocab} rows drawn)"
    return [(f"E [V={vocab}, h]: rows {sizes}{scale}", np.tile(rows[:, None], (1, min(hidden, 16)))),
            (f"logits [b·s, V={vocab}]: columns", np.tile(rows, (tokens, 1)))]


def ownership_figure(panels: list[Panel], tp: int, title: str = "") -> go.Figure:
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels])
    for i, (_, owner) in enumerate(panels, start=1):
        fig.add_trace(
            go.Heatmap(
                z=owner,
                colorscale=discrete_colorscale(tp),
                zmin=-0.5,
                zmax=tp - 0.5,
                showscale=(i == 1),
                hovertemplate="row %{y}, col %{x}: device %{z}<extra></extra>",
                colorbar=dict(title="device", tickvals=list(range(tp))),
            ),
            row=1,
            col=i,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=i)
    fig.update_layout(title=title, height=320, margin=dict(t=70, b=20))
    return fig


def ledger_frame(ledger: Ledger) -> pd.DataFrame:
    cols = ["seq", "phase", "op", "tag", "reduce_op", "group_size", "dtype", "shape", "payload_bytes", "wire_bytes"]
    return ledger.to_frame()[cols]


def ledger_timeline(ledger: Ledger, title: str = "collectives in program order") -> go.Figure:
    colors = {"forward": device_color(0), "backward": device_color(1)}
    fig = go.Figure()
    for phase in ("forward", "backward"):
        es = [e for e in ledger if e.phase == phase]
        fig.add_trace(
            go.Bar(
                x=[e.seq for e in es],
                y=[e.payload_bytes for e in es],
                name=phase,
                marker_color=colors[phase],
                text=[f"{e.op}<br>{e.tag}" for e in es],
                hovertext=[f"{e.op} {e.shape} {e.dtype}, wire {e.wire_bytes:.0f} B" for e in es],
            )
        )
    fig.update_layout(
        title=title, xaxis_title="collective # (per rank)", yaxis_title="payload bytes per rank", height=320, bargap=0.3
    )
    return fig


def saving_ratio_figure(vocabs: list[int], tps: list[int], label_smoothing: float = 0.0) -> go.Figure:
    """Gathered logits / vocab-parallel CE per tp, in both conventions: wire bytes per rank (solid, the saving:
    ~V/6 at every tp) and payload per rank (dashed: one shard over the [b, s] inputs, shrinking with tp)."""
    fig = go.Figure()
    for tp in tps:
        for conv, fn, dash in (("wire", ftp.ce_wire_ratio, "solid"), ("payload", ftp.ce_payload_ratio, "dash")):
            fig.add_trace(
                go.Scatter(
                    x=vocabs,
                    y=[fn(v, tp, label_smoothing) for v in vocabs],
                    mode="lines+markers",
                    name=f"{conv}, tp={tp}",
                    line=dict(color=device_color(tp), dash=dash),
                )
            )
    fig.update_layout(
        title="gathered logits / vocab-parallel CE: wire bytes per rank (solid) and payload per rank (dashed)",
        xaxis_title="vocab V",
        yaxis_title="ratio (wire: p·ceil(V/p)/6, payload: ceil(V/p)/3)",
        xaxis_type="log",
        yaxis_type="log",
        height=360,
    )
    return fig
