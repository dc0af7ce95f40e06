"""The expert-parallel pictures draw what the code does: the dispatch matrix is what the per-rank all-to-all
carried (non-empty slots counted from the buffers), the load bars split kept / dropped as the oracle did."""

from __future__ import annotations

import numpy as np
import torch

from shardlab.comm import SimulatedWorld
from shardlab.expert.drops import drop_table
from shardlab.expert.figures import dispatch_figure, dispatch_matrix, drop_figure, load_figure
from shardlab.expert.moe import MoE, moe_reference
from shardlab.expert.parallel import moe_step
from shardlab.expert.params import ExpertParams


def _case():  # type: ignore[no-untyped-def]
    moe = MoE(ExpertParams(hidden=8, ffn=8, experts=8, top_k=2, capacity_factor=1.0),
              torch.Generator().manual_seed(0))
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    return moe, x


def test_dispatch_matrix_counts_what_travelled() -> None:
    moe, x = _case()
    ep = 4
    results = SimulatedWorld(ep).run(moe_step, moe, x, None)
    loads = [r["loads"] for r in results]
    c = results[0]["capacity"]
    m = dispatch_matrix(loads, c, ep)
    assert m.sum() == sum(r["kept"] for r in results)  # every kept assignment crosses (or stays) once
    ref = moe_reference(x, moe, groups=ep)  # independent: from the oracle's slot list
    for i, routing in enumerate(ref.routings):
        for j in range(ep):
            assert m[i, j] == sum(1 for _, _, e, _ in routing.kept if e // 2 == j)
    assert np.asarray(dispatch_figure(loads, c, ep).data[0].z).tolist() == m.tolist()


def test_load_and_drop_figures() -> None:
    moe, x = _case()
    ref = moe_reference(x, moe, groups=4)
    fig = load_figure([r.loads for r in ref.routings], ref.routings[0].capacity, 4)
    kept, dropped = (int(sum(d.y)) for d in fig.data)
    assert kept == sum(len(r.kept) for r in ref.routings) and dropped == sum(len(r.dropped) for r in ref.routings)
    rows = drop_table(x, moe, 4, (0.5, 1.0, 2.0))
    assert len(drop_figure(rows).data) == 3
