"""Reference solutions of notebook 06's exercises (graded by ``shardlab.core.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardlab.comm import SimulatedWorld
from shardlab.core.topics import Solution
from shardlab.formulas import scan as fscan


def _reduction(tag: str) -> str:
    """The formula's answer (used when neither compiler view ran): the collective over fsdp that finishes dW."""
    op = fscan.grad_reduction([(128, 512)], fsdp=2, tensor=4, shard_as=tag == "on").op
    return f"{op.replace('_', '-')} fsdp"

def _shard_as_by_hand(fn: Callable[..., Any]) -> list[Any]:
    """06 #7: run the learner's ``fn(comm, x, dh)`` on 4 fsdp ranks, rank r holding rows [8r, 8r + 8) of x [32, 16]
    and dh [32, 24] (h 16, F 24): [every rank returned rows [4r, 4r + 4) of the dense dW = xᵀ·dh, the collectives
    it issued]."""
    g = torch.Generator().manual_seed(0)
    x, dh = torch.randn(32, 16, generator=g), torch.randn(32, 24, generator=g)
    dense = x.T @ dh  # [h, F]
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, x[8 * comm.rank:8 * comm.rank + 8].clone(),
                                    dh[8 * comm.rank:8 * comm.rank + 8].clone()))
    ok = all(isinstance(o, torch.Tensor) and o.shape == (4, 24) and torch.allclose(o, dense[4 * r:4 * r + 4], atol=1e-4)
             for r, o in enumerate(out))
    return [ok, [e.op for e in world.ledger]]


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "06_scan_shard_as": {
        1: Solution(lambda: fscan.shard_as_saving(4, [(128, 512), (512, 128)], fsdp=8, tensor=1).ratio,
                    "the 1-D gradient keeps only the tensor split; how many fsdp devices now hold the same copy?"),
        2: Solution(lambda: fscan.seed_case(fsdp=16, tensor=16, dtype="bfloat16").one_d_per_chip_bytes / 2**30,
                    "the logical [126, 16384, 16384] bf16 array is 63 GiB; the 1-D gradient is split over tensor only",
                    rel_tol=0.01),
        3: Solution(lambda changed=None: changed or _reduction("off"),
                    "dW = xᵀ·dy sums over the batch: which mesh axis splits the batch, and what must the devices do "
                    "with their partial sums when nobody asks for a split result? Answer as '<collective> <axis>'"),
        4: Solution(lambda changed=None: changed or _reduction("on"),
                    "shard_as asks for dW split like W (H over fsdp): which collective sums partial results and "
                    "leaves each device only its share? Answer as '<collective> <axis>'"),
        5: Solution(lambda: fscan.flattened_rows(8, 8, fsdp=4, tensor=2).rows_per_device,
                    "is each device's (batch, seq) block one contiguous run of the merged B·S rows? If not, only the "
                    "batch split survives"),
        6: Solution(lambda: fscan.block_trace_transfer(8, 8, 128, 512, placeholders=False).transfers,
                    "count the fake inputs: the forward scan traces with a carry and one layer's weights, the backward "
                    "with a gradient carry and one slice of every tensor the block saved for its backward"),
        7: Solution(lambda: [True, ["reduce_scatter"]],
                    "each rank's xᵀ·dh is a partial sum over its own batch rows; which one collective adds the "
                    "partial sums and leaves each rank only its block of rows of dW? (return a [h/4, F] tensor)",
                    run=lambda fn: _shard_as_by_hand(fn)),
    },
}
