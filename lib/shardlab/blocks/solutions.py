"""Reference solutions of notebooks 00 and 01's exercises (graded by ``shardlab.core.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardlab.blocks import ring
from shardlab.blocks.params import BlocksParams
from shardlab.blocks.tiles import sharding_string
from shardlab.comm import SimulatedWorld
from shardlab.core.topics import Solution, measured
from shardlab.formulas import blocks as fblocks
from shardlab.formulas.common import reduction_dtype


def _two_phase_all_reduce(fn: Callable[..., Any]) -> list[Any]:
    """00 #6: run the learner's ``fn(comm, x)`` on 4 ranks of a SimulatedWorld (x: 12 values per rank):
    [every rank returned the sum, the collectives it issued, its wire bytes (counted along the ring schedule) ==
    a ring all-reduce's]."""
    data = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))  # rank r hands in row r
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, data[comm.rank].clone()))
    ok = all(isinstance(o, torch.Tensor) and o.shape == (12,) and torch.allclose(o, data.sum(0), atol=1e-5)
             for o in out)
    ops = [e.op for e in world.ledger]
    ring_ops = all(op in ring.OPS for op in ops)
    return [ok, ops, ring_ops and ring.ledger_wire_bytes(world.ledger) == ring.wire_bytes("all_reduce", 12, 4, 4)]

def _matmul_c_elements(spec: tuple[str | None, ...]) -> int:
    """01 #6: compile notebook 01's case 5 (defaults: A [64, 128], B [128, 64] on the (X 2, Y 4) mesh) with C
    annotated ``spec``; C's elements per device, from XLA:CPU when this process has the mesh, else XLA:TPU."""
    from shardlab.blocks.case import MatmulCase
    from shardlab.core import harness  # imported here: torch_xla, after runtime.setup() (solutions load before it)

    return int(harness.compiler_view(MatmulCase(BlocksParams(), "5", ask=tuple(spec)))["case5.C.elements"])


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "00_welcome": {
        1: Solution(lambda steps=None: measured(steps, "the ring trace's step count"),
                    "the ring all-reduce is a reduce-scatter followed by an all-gather; each phase moves one chunk "
                    "per rank per step until every rank has seen every chunk"),
        2: Solution(lambda sent=None: measured(sent, "bytes rank 0 sent in the ring trace"),
                    "count the chunks one rank sends (one per step) and multiply by the chunk size: payload / W"),
        3: Solution(lambda sent=None: measured(sent, "bytes rank 0 sent in the ring all-gather trace"),
                    "in an all-gather each rank must receive the W - 1 shards it does not have, and in a ring it "
                    "forwards as many as it receives"),
        4: Solution(lambda operand_bytes=None: measured(operand_bytes, "the compiler's all-gather operand bytes"),
                    "the operand is what ONE device hands in — its own shard, not the gathered result"),
        5: Solution(lambda: sharding_string((2, 4), ("data", "model"), (None, "data")),
                    "one tile count per tensor dim, then the copies count; the device list is the mesh's id array "
                    "with the spec's axis first and the unnamed axis last, flattened"),
        6: Solution(lambda: [True, ["reduce_scatter", "all_gather"], True],
                    "reduce-scatter leaves each rank one block of the sum; which collective then hands every rank "
                    "every block? (and return a 1-D tensor of x's length)", run=_two_phase_all_reduce),
    },
    "01_block_matrices": {
        1: Solution(lambda: fblocks.row_split_all_reduce(16, 32, 4, "float32")["bytes"],
                    "the row rule adds full-size partial sums: how large is Y, and how many bytes is a float32?"),
        2: Solution(lambda: [fblocks.grid_all_reduce(16, 32, (2, 4))["group_size"],
                             8 // fblocks.grid_all_reduce(16, 32, (2, 4))["group_size"]],
                    "partial sums are added only along the mesh axis that splits k; answer [group size, groups]"),
        3: Solution(lambda: [fblocks.row_split_all_reduce(16, 32, 4, reduction_dtype("bfloat16", kind))["bytes"]
                             for kind in ("cpu", "tpu")],
                    "which element type does each compiler add the partial sums in? answer [XLA:CPU bytes, TPU bytes]"),
        4: Solution(lambda: sharding_string((2, 2), ("r", "c"), ("c", None)),
                    "W's rows follow the mesh axis c, its columns are not split, and the r axis holds copies: "
                    "tile counts, then the copies, then the device ids with c first"),
        5: Solution(lambda count=None: measured(count, "the compiler's collective count for the column rule"),
                    "x is on every device already; does any output column block depend on another device's W?"),
        6: Solution(lambda: fblocks.sharded_matmul("5b", 64, 128, 32)["C.elements"],
                    "C is [M, M]: name a mesh axis for each of its two dims so that no device holds a copy another "
                    "device also holds — a tuple of two axis names", run=_matmul_c_elements),
    },
}
