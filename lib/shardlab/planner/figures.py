"""Planner pictures: per-chip memory as a stacked bar against HBM, and the summary table.

Design note
-----------
`memory_figure(plans)` draws one stacked bar per plan (categories of `Plan.memory`, GB = 1e9 bytes) with each
chip's HBM as a marker, so "does it fit" is visible at a glance. `summary_frame(plans)` is the same
information as a table (memory, comm per step, FLOPs, step time, MFU, verdict).

The notebook's explorer over `planner.plan` (model, topology, the six mesh degrees, microbatches, recompute, batch,
seq) is declared in `shardlab.planner.explorers`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from shardlab.planner import Plan

GB = 1e9
CATEGORY_ORDER = ("params", "grads", "optimizer", "padding", "activations", "logits", "fsdp_gathered_unit")


def _label(p: Plan) -> str:
    c = p.config
    more = "".join(f" {a[:2]}{getattr(c, a)}" for a in ("pipeline", "context", "expert") if getattr(c, a) > 1)
    return f"{p.model.name} · {c.topology} · d{c.data} f{c.fsdp} t{c.tensor}{more} · {c.recompute}"


def memory_figure(plans: Plan | list[Plan], title: str = "Per-chip memory") -> go.Figure:
    """Plotly stacked bar of per-chip memory by category, with the chip's HBM marked."""
    plans = [plans] if isinstance(plans, Plan) else list(plans)
    labels = [_label(p) for p in plans]
    fig = go.Figure()
    for cat in CATEGORY_ORDER:
        fig.add_bar(name=cat, x=labels, y=[p.memory.get(cat, 0.0) / GB for p in plans])
    fig.add_scatter(name="usable HBM per chip", x=labels, y=[p.hbm_bytes / GB for p in plans], mode="markers",
                    marker={"symbol": "line-ew-open", "size": 40, "line": {"width": 3}, "color": "black"})
    fig.update_layout(barmode="stack", title=title, yaxis_title="GB per chip", height=420,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def summary_frame(plans: Plan | list[Plan]) -> pd.DataFrame:
    """pandas DataFrame: one row per plan with the headline numbers."""
    plans = [plans] if isinstance(plans, Plan) else list(plans)
    rows = []
    for p in plans:
        rows.append({
            "plan": _label(p),
            "memory GB/chip": round(p.memory_total / GB, 2),
            "usable HBM GB": round(p.hbm_bytes / GB, 1),
            "comm payload GB/step/chip": round(p.comm_payload_bytes / GB, 3),
            "comm wire GB/step/chip": round(p.comm_wire_bytes / GB, 3),
            "PFLOP/step": round(p.flops.hardware / 1e15, 2),
            "compute s": round(p.roofline.compute_s, 4),
            "comm s": round(p.roofline.comm_s, 4),
            "bubble s": round(p.roofline.bubble_s, 4),
            "step s (roofline)": round(p.roofline.step_s, 4),
            "comm/compute": round(p.roofline.comm_compute_ratio, 3),
            "MFU (bound)": round(p.mfu, 3),
            "verdict": p.verdict,
        })
    return pd.DataFrame(rows)
