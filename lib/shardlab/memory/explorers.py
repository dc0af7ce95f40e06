"""Notebook 08b's explorer, declared (:mod:`shardlab.core.explorer` builds it): sliders over the step's sizes (the
notebook's other parameters kept); each change traces the step's DAG and reports its peak by program order, greedy
and the update schedules (:func:`shardlab.memory.roam.quick`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from shardlab.core.explorer import Choice, Explorer, Shown, Slider
from shardlab.memory import graph, roam
from shardlab.memory.params import MODELS, MemoryParams


def _evaluate(q: MemoryParams, _v: dict[str, Any]) -> dict[str, Any]:
    return roam.quick(graph.trace_step(q.validate()))


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    ok = res["best"] <= min(res["eager"], res["end"])
    saved = 1 - res["best"] / res["program"] if res["program"] else 0.0
    status = (f"{res['nodes']} operators; peak temporaries: program order {res['program']} B, greedy "
              f"{res['greedy']} B, best update schedule {res['best']} B ({100 * saved:.1f} % below program "
              f"order){'' if ok else ' — the best schedule is above a uniform one: MISMATCH'}")
    table = pd.DataFrame([{k: res[k] for k in ("program", "greedy", "eager", "end", "best")}],
                         index=["peak bytes"]).to_html()
    return Shown(ok, status, table=table)


EXPLORERS = {"08b_memory": Explorer(
    controls={"model": Choice(list(MODELS)), "layers": Slider(1, 4), "hidden": Slider(8, 256, 8),
              "ffn": Slider(8, 1024, 8), "step_heads": Slider(1, 8), "step_seq": Slider(1, 64),
              "step_batch": Slider(1, 32)},
    evaluate=_evaluate, show=_show, fields=True, rows=(4,))}
