"""Notebook 07's explorer, declared (:mod:`shardlab.core.explorer` builds it): the plan's model, slice, recompute
policy, batch, sequence, microbatches and the six mesh degrees over the notebook's own configuration (the rest —
sequence parallelism, flash attention, the byte assumptions — kept); each change re-plans and shows the verdict,
the summary row and the per-chip memory bars. A configuration given as sizes (not a preset) is one more model
choice."""

from __future__ import annotations

from typing import Any

from shardlab.core.explorer import Choice, Explorer, Number, Shown
from shardlab.formulas.hardware import topologies
from shardlab.planner import MESH_AXES, MODEL_PRESETS, PlanConfig, model_from, plan
from shardlab.planner.figures import memory_figure, summary_frame

DEGREE = Number(1, 100000)


def _models(base: PlanConfig) -> list[tuple[str, Any]]:
    custom = [] if isinstance(base.model, str) else [(model_from(base.model).name, model_from(base.model))]
    return [(name, name) for name in sorted(MODEL_PRESETS)] + custom


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    p = res["plan"]
    return Shown(True, p.verdict, table=summary_frame(p).to_html(), figure=memory_figure(p))


EXPLORERS = {"07_planner": Explorer(
    controls={"model": Choice(_models), "topology": Choice(lambda _b: sorted(topologies())),
              "recompute": Choice(["none", "selective", "full"]),
              "global_batch": Number(1, 10**7, label="global batch"), "seq": Number(1, 10**7),
              "microbatches": DEGREE, **dict.fromkeys(MESH_AXES, DEGREE)},
    evaluate=lambda q, _v: {"plan": plan(q)}, show=_show, fields=True, rows=(3, 3, 3, 3),
    initial=lambda b: {"model": b.model if isinstance(b.model, str) else model_from(b.model)})}
