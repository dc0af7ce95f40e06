"""Notebook 01's explorer, declared (:mod:`shardlab.core.explorer` builds it): sliders for (m, k, n, parts) and the
split kind; each change recomputes the block product against the dense one and redraws who holds which block."""

from __future__ import annotations

from typing import Any

from shardlab.blocks.figures import KINDS, block_check, split_figure
from shardlab.core.explorer import Choice, Explorer, Shown, Slider


def _evaluate(_p: Any, v: dict[str, Any]) -> dict[str, Any]:
    return {"max_abs_err": block_check(**v), "figure": split_figure(**v)}


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    err = res["max_abs_err"]
    return Shown(err < 1e-9, f"max |blocked − dense| = {err:.2e} &nbsp; ({'match' if err < 1e-9 else 'MISMATCH'})",
                 figure=res["figure"])


EXPLORERS = {"01_block_matrices": Explorer(
    controls={"m": Slider(1, 32, label="m (rows of x)", default=8), "k": Slider(1, 32, label="k (inner)", default=16),
              "n": Slider(1, 32, label="n (cols of W)", default=12), "parts": Slider(1, 16, label="parts", default=4),
              "kind": Choice(KINDS, label="split", default="row")},
    evaluate=_evaluate, show=_show)}
