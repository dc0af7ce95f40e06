"""Reference solutions of the notebooks' exercises (graded by ``shardlab.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas import tp as ftp
from shardlab.formulas import zero as fzero
from shardlab.fsdp.flat_param import plan_flat_shards


@dataclass(frozen=True)
class Solution:
    expected: Callable[..., Any]  # (**measured) -> the reference answer
    hint: str  # what to think about; never the answer itself
    rel_tol: float = 0.0  # numbers: accepted relative error (0: exact)


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "02_megatron_mlp": {
        1: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16")["bytes"],
                    "the forward all-reduce (g) sums the full activation [b, s, h]; payload = elements × bytes "
                    "per element, and tp does not appear"),
        2: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16", backward=True,
                                               input_requires_grad=False)["count"],
                    "f's backward all-reduce sums the INPUT gradient — is there one to sum?"),
        3: Solution(lambda: 2,
                    "GeLU(a + b) ≠ GeLU(a) + GeLU(b): with A split by rows, where must the partial sums be added?"),
    },
    "05_fsdp_flat_params": {
        1: Solution(lambda: [r.numel_padded for r in plan_flat_shards([10], 4).ranks],
                    "c = ceil(N/W); torch.chunk hands out chunks of c until the elements run out — a list of W ints"),
        2: Solution(lambda: ffsdp.flat_numel([1500, 50, 500, 10], 8, align=4) - 2060,
                    "each parameter must start at a multiple of 4 float32 elements (16 bytes), and the total is "
                    "padded to a multiple of W; add up the pads"),
        3: Solution(lambda: fzero.zero_memory(7.5e9, 64, 3).total / 1e9,
                    "stage 3 divides all of (2 + 2 + K)·Ψ by N; GB = 1e9 bytes", rel_tol=1e-9),
        4: Solution(lambda: tuple(max((fzero.padding_waste(2060, w), w) for w in range(1, 17))[::-1]),
                    "waste = W·ceil(N/W) − N; try every W — answer as (W, waste)"),
        5: Solution(lambda: ffsdp.flat_step_comm(2060, 8, 4, root=True).wire_bytes(8),
                    "the root unit is not resharded after forward: count its all-gathers, then the ring model: "
                    "(W−1)·payload per all-gather, (W−1)/W·payload per reduce-scatter", rel_tol=1e-9),
        6: Solution(lambda: ffsdp.flat_step_comm(510, 8, root=True).all_gather_count
                    + ffsdp.flat_step_comm(1550, 8, root=False).all_gather_count,
                    "which unit is the root, and which unit frees its parameters after forward?"),
    },
    "05b_fsdp_gspmd": {
        1: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False]).all_gather_forward,
                    "dim 0 is split with torch.chunk and padded to ceil(d0/W) rows; an all-gather's payload is "
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
    },
}
