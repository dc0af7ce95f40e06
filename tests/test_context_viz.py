"""The context-parallel pictures draw what the code does: the ring schedule is the one the per-rank ring follows
(read from its trace), the causal owner map covers exactly the unmasked blocks, each rank's area is its work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardlab.comm import SimulatedWorld
from shardlab.context.balance import measure
from shardlab.context.figures import causal_figure, causal_owner, ring_figure, ring_schedule, work_figure
from shardlab.context.ring import ring_attention_step
from shardlab.formulas import context as fcp


def test_schedule_is_the_rings() -> None:
    cp = 4
    x = torch.randn(1, 8, 1, 2)
    results = SimulatedWorld(cp).run(ring_attention_step, x, x, x, None, causal=False)
    for r, res in enumerate(results):  # the key chunk rank r met at each step = the rank it started on
        met = [b.k_chunk for b in res["trace"] if b.phase == "forward"]
        assert met == ring_schedule(cp)[:, r].tolist()
    fig = ring_figure(cp, "zigzag")
    assert np.array_equal(np.asarray(fig.data[0].z), ring_schedule(cp))
    assert fig.data[0].text[1][0] == "K/V 3<br>chunks 3,4"


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_owner_map_areas_are_the_work(layout: str) -> None:
    cp, seq = 4, 64
    owner = causal_owner(cp, layout)
    assert np.array_equal(owner >= 0, np.tril(np.ones_like(owner)) == 1)  # exactly the unmasked blocks
    n = owner.shape[0]
    c = seq // n
    area = [int(((owner == r) * (np.tril(np.ones((n, n)), -1) * c * c + np.eye(n) * c * (c + 1) // 2)).sum())
            for r in range(cp)]
    assert area == fcp.causal_work(seq, cp, layout)


def test_figures_build() -> None:
    assert len(causal_figure(4).data) == 2
    rows = measure(seq=32, cp=4)
    fig = work_figure(rows)
    assert [list(d.y) for d in fig.data if d.type == "scatter"] == [r["elements"] for r in rows]


def test_explorer_headless() -> None:
    """The explorer's update (what a slider move runs): a small ring matches its formula; a bad split is shown."""
    from shardlab.context.params import ContextParams
    from shardlab.core.explorer import explorer_for

    ui, update = explorer_for(ContextParams(), cp=2, seq=16, kv_heads=1, head_dim=4, layout="zigzag")
    shown = update()
    # forward 2(cp - 1) = 2 blocks, the ring backward 2(cp - 1) + 2cp = 6; a block is 1·(16/2)·1·4 float32 = 128 B
    assert shown["ok"] and shown["ledger"] == {"count": 2 + 6, "bytes": 8 * 128}
    bad = update(cp=3)
    assert not bad["ok"] and "not divisible by the 6 chunks" in bad["error"]
    assert ui.children  # the sliders, the status line and the table
