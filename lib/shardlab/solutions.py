"""Reference solutions of the notebooks' exercises (graded by ``shardlab.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.formulas import scan as fscan
from shardlab.formulas import tp as ftp


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
    },
}


def _reduction(tag: str) -> str:
    """The formula's answer (used when neither compiler view ran): the collective over fsdp that finishes dW."""
    op = fscan.grad_reduction([(128, 512)], fsdp=2, tensor=4, shard_as=tag == "on").op
    return f"{op.replace('_', '-')} fsdp"
