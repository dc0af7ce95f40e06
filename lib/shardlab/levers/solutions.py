"""Reference solutions of notebook 08's exercises (graded by ``shardlab.core.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from shardlab.core.topics import Solution
from shardlab.levers.combine import AlphaBeta, bucket_count, combining_saving_s
from shardlab.profile import order


def _toy_peaks(small: int, large: int, expanded: int, shrunk: int, out: int) -> tuple[int, int]:
    """Peaks of V0-V1-V2-V3 and V0-V2-V1-V3 for the memory-order toy with these sizes."""
    g = order.graph({"V0": ((), {"small": small, "large": large}), "V1": (("small",), {"expanded": expanded}),
                     "V2": (("large",), {"shrunk": shrunk}), "V3": (("expanded", "shrunk"), {"out": out})},
                    outputs=("out",))
    return order.peak(g, ("V0", "V1", "V2", "V3")).peak, order.peak(g, ("V0", "V2", "V1", "V3")).peak

def _saving_ms(alpha_s: float, beta_Bps: float, calls_before: int, calls_after: int) -> float:
    return combining_saving_s(AlphaBeta(alpha_s, beta_Bps, 1.0, 0.0, 0), calls_before, calls_after) * 1e3

MIB = 2**20

# 08 #5: (gradient sizes in bytes, cap, first bucket's limit): equal and uneven sizes, DDP's defaults, 0 limits
BUCKET_GRID = [([4 * MIB] * 24, 25 * MIB, MIB), ([4 * MIB] * 24, 25 * MIB, 25 * MIB), ([3, 5, 1, 9, 2], 6, 2),
               ([3, 5, 1, 9, 2], 6, 6), ([256 * 1024] * 8, MIB, MIB), ([7] * 10, 0, 0), ([1, 2, 3, 4, 5, 6], 4, 100),
               ([10], 5, 1)]

def _pytorch_buckets() -> list[list[list[int]]]:
    """08 #5's reference: PyTorch's own DDP bucket assignment on :data:`BUCKET_GRID` (uint8 tensors: a size is its
    bytes; limits [first, cap] as DDP passes them)."""
    return [dist._compute_bucket_assignment_by_size([torch.empty(b, dtype=torch.uint8) for b in sizes],
                                                     [first, cap])[0] for sizes, cap, first in BUCKET_GRID]

def _learner_buckets(fn: Callable[..., Any]) -> list[list[list[int]]]:
    """08 #5: the learner's ``fn(sizes, cap, first)`` on :data:`BUCKET_GRID`."""
    return [[[int(i) for i in b] for b in fn(list(sizes), cap, first)] for sizes, cap, first in BUCKET_GRID]


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "08_compiler_levers": {
        1: Solution(lambda: _saving_ms(50e-6, 10e9, 32, 1),
                    "the bytes are the same before and after: which term of m·α + bytes/β changes?", rel_tol=1e-3),
        2: Solution(lambda: _toy_peaks(2, 8, 5, 1, 1),
                    "an operator's outputs exist while its inputs are still alive; a tensor dies after its last "
                    "reader — walk both orders step by step"),
        3: Solution(lambda: bucket_count(24, 4 * MIB, 25 * MIB, MIB),
                    "a bucket closes once it holds at least its limit, and the first bucket has its own, smaller "
                    "limit: how many 4 MiB gradients until >= 1 MiB, and then until >= 25 MiB?"),
        4: Solution(lambda: max(0.0, 30.0 - 20.0), "only the part of the transfer the window does not cover is exposed",
                    rel_tol=1e-9),
        5: Solution(_pytorch_buckets, "keep a running total of the open bucket; after adding a gradient, close the "
                    "bucket when the total is >= its limit (first for the first bucket, cap after); a last, partly "
                    "filled bucket still counts", run=_learner_buckets),
    },
}
