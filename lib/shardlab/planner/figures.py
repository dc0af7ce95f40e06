"""Planner pictures: per-chip memory as a stacked bar against HBM, and an ipywidgets explorer.

Design note
-----------
`memory_figure(plans)` draws one stacked bar per plan (categories of `Plan.memory`, GB = 1e9 bytes) with each
chip's HBM as a marker, so "does it fit" is visible at a glance. `summary_frame(plans)` is the same
information as a table (memory, comm per step, FLOPs, step time, MFU, verdict).

`PlannerExplorer` wires dropdowns / int boxes (model, topology, the six mesh degrees, microbatches, recompute,
batch, seq) to `planner.plan`. `update()` is an ordinary method: a notebook run headless (papermill) calls it
once so the code path behind the widgets is exercised without a browser. Bad input does not raise inside the widget:
the error message (which names the values) is shown instead, and kept in `.error`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from shardlab.formulas.hardware import topologies
from shardlab.planner import MESH_AXES, MODEL_PRESETS, ModelConfig, Plan, PlanConfig, model_from, plan

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


class PlannerExplorer:
    """ipywidgets front end of `planner.plan`; `update()` recomputes and redraws. ``initial`` is any plan
    configuration (notebook 07 passes its parameters); the widgets change its model, slice, degrees, recompute
    policy, batch and sequence, and keep the rest (sequence parallelism, flash attention, the byte assumptions)."""

    def __init__(self, initial: PlanConfig) -> None:
        self.custom: ModelConfig | None = None if isinstance(initial.model, str) else model_from(initial.model)
        model = initial.model if self.custom is None else self.custom.name
        models = sorted(MODEL_PRESETS) + ([model] if self.custom else [])
        self.base = initial
        self.model = w.Dropdown(options=models, value=model, description="model")
        self.topology = w.Dropdown(options=sorted(topologies()), value=initial.topology, description="topology")
        self.data = w.BoundedIntText(value=initial.data, min=1, max=100000, description="data")
        self.fsdp = w.BoundedIntText(value=initial.fsdp, min=1, max=100000, description="fsdp")
        self.tensor = w.BoundedIntText(value=initial.tensor, min=1, max=100000, description="tensor")
        self.pipeline = w.BoundedIntText(value=initial.pipeline, min=1, max=100000, description="pipeline")
        self.context = w.BoundedIntText(value=initial.context, min=1, max=100000, description="context")
        self.expert = w.BoundedIntText(value=initial.expert, min=1, max=100000, description="expert")
        self.microbatches = w.BoundedIntText(value=initial.microbatches, min=1, max=100000, description="microbatches")
        self.recompute = w.Dropdown(options=["none", "selective", "full"], value=initial.recompute,
                                    description="recompute")
        self.batch = w.BoundedIntText(value=initial.global_batch, min=1, max=10**7, description="global batch")
        self.seq = w.BoundedIntText(value=initial.seq, min=1, max=10**7, description="seq")
        self.out = w.Output()
        self.plan: Plan | None = None
        self.error: str | None = None
        controls = [self.model, self.topology, self.recompute, self.batch, self.seq, self.microbatches,
                    *(getattr(self, a) for a in MESH_AXES)]
        for c in controls:
            c.observe(lambda _change: self.update(), names="value")
        self.widget = w.VBox([w.HBox(controls[:3]), w.HBox(controls[3:6]), w.HBox(controls[6:9]),
                              w.HBox(controls[9:]), self.out])

    def config(self) -> PlanConfig:
        name = self.model.value
        model = self.custom if (self.custom is not None and name == self.custom.name) else name
        return replace(self.base, model=model, topology=self.topology.value, recompute=self.recompute.value,
                       global_batch=self.batch.value, seq=self.seq.value, microbatches=self.microbatches.value,
                       **{a: getattr(self, a).value for a in MESH_AXES})

    def update(self) -> Plan | None:
        """Recompute the plan from the widget values and redraw; returns the plan (None on bad input).

        The output widget is filled with `append_*` calls, not `with self.out:` capture: capture sends
        msg-id updates that left headless clients (nbclient / papermill) waiting until their cell timeout."""
        try:
            self.plan, self.error = plan(self.config()), None
        except ValueError as e:
            self.plan, self.error = None, str(e)
        self.out.outputs = ()
        if self.plan is None:
            self.out.append_stdout(f"invalid configuration: {self.error}\n")
        else:
            self.out.append_stdout(self.plan.verdict + "\n")
            self.out.append_display_data(summary_frame(self.plan))
            bundle = figure_bundle(memory_figure(self.plan))
            self.out.outputs += ({"output_type": "display_data", "data": bundle, "metadata": {}},)
        return self.plan


def figure_bundle(fig: go.Figure) -> dict[str, Any]:
    """MIME bundle of a plotly figure (plotly JSON + standalone HTML), independent of the default renderer."""
    bundle = dict(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()))
    bundle["text/html"] = fig.to_html(include_plotlyjs="cdn", full_html=False)
    return bundle
