"""Notebook 06's explorer, declared (:mod:`shardlab.core.explorer` builds it): a mesh, L and hidden chosen among the
notebook's own sizes; its button re-runs the small scan step with shard_as on and off (two compiles, so a button,
not every change) and shows both as a table."""

from __future__ import annotations

from typing import Any

import pandas as pd

from shardlab.core.explorer import Choice, Explorer, Shown
from shardlab.xla_scan.params import ScanParams
from shardlab.xla_scan.sections import explore


def _meshes(p: ScanParams) -> list[tuple[str, tuple[int, int]]]:
    return [(f"fsdp={a} × tensor={b}", (a, b)) for a, b in ((p.mesh_fsdp, p.mesh_tensor), (p.mesh_tensor, p.mesh_fsdp))]


def _evaluate(p: ScanParams, v: dict[str, Any]) -> dict[str, Any]:
    return explore(p, *v["mesh"], v["L"], v["hidden"])


EXPLORERS = {"06_scan_shard_as": Explorer(
    controls={"mesh": Choice(_meshes), "L": Choice(lambda p: sorted({p.layers, max(p.layers_sweep)})),
              "hidden": Choice(lambda p: [p.hidden, 2 * p.hidden])},
    evaluate=_evaluate, show=lambda res, _v: Shown(True, "", table=pd.DataFrame(res).T.to_html()),
    rows=(4,), button="run (compiles twice)")}
