"""Reference solutions of notebooks 05 and 05b's exercises (graded by ``shardlab.core.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardlab.core.topics import Solution
from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas import zero as fzero
from shardlab.fsdp.flat_param import plan_flat_shards
from shardlab.fsdp.params import FsdpGspmdParams

# FLAT_CASES: (n, N) pairs graded by 05 #7 — even, uneven, an empty trailing rank (n 6, N 4), more ranks than elements
FLAT_CASES = ((10, 4), (6, 4), (2060, 8), (7, 3), (5, 8))

def _torch_flat_shards() -> list[list[list[float]]]:
    """05 #7's oracle: PyTorch FSDP1's own ``FlatParamHandle._get_shard`` of ``arange(1, n + 1)`` for every rank."""
    # imported here: torch.distributed.fsdp costs about a second to import (measured), and only this exercise needs it
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    return [[FlatParamHandle._get_shard(torch.arange(1.0, n + 1), r, w)[0].tolist() for r in range(w)]
            for n, w in FLAT_CASES]

def _flat_shards(fn: Callable[..., Any]) -> list[list[list[float]]]:
    """05 #7: the learner's ``fn(flat, rank, world_size)`` for every rank of every case of :data:`FLAT_CASES`."""
    return [[[float(v) for v in fn(torch.arange(1.0, n + 1), r, w)] for r in range(w)] for n, w in FLAT_CASES]

def _unshard_bytes(spec: tuple[str | None, ...]) -> int:
    """05b #6: compile the unshard of the default MLP's weight W_2 [10, 50] annotated ``spec`` on the mesh (fsdp 8,
    replica); the bytes one device hands to the collectives that replicate it (XLA:CPU here, else XLA:TPU)."""
    from shardlab.core import harness  # imported here: torch_xla, after runtime.setup() (solutions load before it)
    from shardlab.fsdp.case import UnshardCase

    case = UnshardCase(FsdpGspmdParams(), (10, 50), tuple(spec))
    view = harness.compiler_view(case)
    return int(sum(view.get(f"unshard.{op}.bytes", 0) for op in case.ops))


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "05_fsdp_flat_params": {
        1: Solution(lambda: [r.numel_padded for r in plan_flat_shards([10], 4).ranks],
                    "c = ceil(n/N); torch.chunk hands out chunks of c until the elements run out — a list of N ints"),
        2: Solution(lambda: ffsdp.flat_numel([1500, 50, 500, 10], 8, align=4) - 2060,
                    "each parameter must start at a multiple of 4 float32 elements (16 bytes), and the total is "
                    "padded to a multiple of N; add up the pads"),
        3: Solution(lambda: fzero.zero_memory(7.5e9, 64, 3).total / 1e9,
                    "stage 3 divides all of (2 + 2 + K)·Ψ by N; GB = 1e9 bytes", rel_tol=1e-9),
        4: Solution(lambda: tuple(max((fzero.padding_waste(2060, w), w) for w in range(1, 17))[::-1]),
                    "waste = N·ceil(n/N) − n; try every N — answer as (N, waste)"),
        5: Solution(lambda: ffsdp.flat_step_comm(2060, 8, 4, root=True).wire_bytes(8),
                    "the root unit is not resharded after forward: count its all-gathers, then the ring model: "
                    "(N−1)·payload per all-gather, (N−1)/N·payload per reduce-scatter", rel_tol=1e-9),
        6: Solution(lambda: ffsdp.flat_step_comm(510, 8, root=True).all_gather_count
                    + ffsdp.flat_step_comm(1550, 8, root=False).all_gather_count,
                    "which unit is the root, and which unit frees its parameters after forward?"),
        7: Solution(lambda: _torch_flat_shards(),
                    "c = ceil(n/N) elements per rank; torch.chunk hands out chunks of c while elements remain (a "
                    "trailing rank may get none); pad every shard with zeros to c",
                    run=lambda fn: _flat_shards(fn)),
    },
    "05b_fsdp_gspmd": {
        1: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False]).all_gather_forward,
                    "dim 0 is split with torch.chunk and padded to ceil(d0/N) rows; an all-gather's payload is "
                    "the padded shard"),
        2: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False], device_kind="tpu").all_gather_forward,
                    "same rows; at the default mat-mul precision, what element type does the TPU matmul read?"),
        3: Solution(lambda: ffsdp.per_param_step_bytes([(50,)], 8, [False], device_kind="tpu")
                    .unshard_all_reduce_forward,
                    "a 50-element bias on 8 ranks has shards far shorter than a 128-lane row: which collective "
                    "replicates it on XLA:TPU, and over how many (padded) elements?"),
        4: Solution(lambda: ffsdp.per_param_step_bytes([(50, 30), (50,), (10, 50), (10,), (5, 10), (5,)], 8,
                                                       [False] * 6).reduce_scatter_count,
                    "one gradient reduction per parameter, whatever the compiler combines"),
        5: Solution(lambda: 4 * sum(ffsdp.per_param_shard(s, 2, 0)[1][0] * (s[1] if len(s) > 1 else 1)
                                    for s in [(50, 30), (50,)]),
                    "FSDP2 all-gathers all parameters of a unit in one call: sum the padded dim-0 shards of the "
                    "first Linear's weight [50, 30] and bias [50]"),
        6: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False]).all_gather_forward,
                    "FSDP2's rule: which dim of the weight is split over the fsdp axis, and which is left whole? "
                    "(a tuple with one entry per dim: a mesh axis name or None)",
                    run=lambda spec: _unshard_bytes(spec)),
    },
}
