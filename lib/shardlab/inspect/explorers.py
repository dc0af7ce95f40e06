"""Notebook 12's explorer, declared (:mod:`shardlab.core.explorer` builds it): model, slice, fsdp, tensor, batch,
sequence and recompute; each change re-validates and re-plans (:func:`shardlab.inspect.notebook.explore`, no
compile) and shows the planner's verdict."""

from __future__ import annotations

from typing import Any

from shardlab.core.explorer import Choice, Explorer, Number, Shown
from shardlab.inspect.models import presets
from shardlab.inspect.notebook import FSDP, GIB, SEQS, SLICES, TENSOR, explore


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    return Shown(True, f"mesh {res['mesh']}: {res['verdict']}<br>parameters + AdamW state per chip (the plan's "
                       f"sharded shapes): {res['state'] / GIB:.2f} GiB; {res['params']} parameter tensors")


EXPLORERS = {"12_your_model": Explorer(
    controls={"model": Choice(lambda _p: list(presets()), default="llama-3-8b"),
              "topology": Choice(SLICES, label="slice", default="v6e-8"), "fsdp": Choice(FSDP, default=8),
              "tensor": Choice(TENSOR, default=1), "batch": Number(default=8), "seq": Choice(SEQS, default=8192),
              "recompute": Choice(["full", "none"], default="full")},
    evaluate=lambda _p, v: explore(**v), show=_show, rows=(4,))}
