"""Reference solutions of the notebooks' exercises (graded by ``shardlab.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.formulas import tp as ftp
from shardlab.formulas.common import wire_bytes
from shardlab.tp.layers import vocab_range


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
    "03_megatron_attention": {
        1: Solution(lambda: [t for t in (1, 2, 3, 4, 6, 8, 12) if 12 % t == 0],
                    "each device must own whole heads: which degrees split 12 heads evenly?"),
        2: Solution(lambda: ftp.transformer_layer_all_reduce(8, 1024, 4096, 8, "bfloat16")["bytes"],
                    "count the all-reduces of one layer (attention and MLP, forward and backward); each carries "
                    "the whole activation [b, s, h] in bf16"),
        3: Solution(lambda: wire_bytes("all_reduce", ftp.transformer_layer_all_reduce(8, 1024, 4096, 8,
                                                                                     "bfloat16")["bytes"], 8),
                    "a ring all-reduce sends 2 (p - 1) / p of its payload per rank"),
        4: Solution(lambda: 4, "one g after the output projection, and one f per column-parallel input layer"),
    },
    "04_vocab_parallel_embedding_ce": {
        1: Solution(lambda: ftp.gathered_logits(1, 8192, 128256, 8, "bfloat16")["wire_bytes"],
                    "an all-gather hands over one padded shard [b·s, ceil(V/p)] and, in a ring, each rank sends "
                    "p - 1 shards"),
        2: Solution(lambda: [ftp.ce_wire_ratio(128256, 8), ftp.ce_wire_ratio(128256, 64)],
                    "divide the gathered wire bytes by the three all-reduces' 3 · 2 (p - 1)/p · b·s · e; what "
                    "is left of p?"),
        3: Solution(lambda: ftp.ce_logits_bytes(1, 8192, 128256, 8, "bfloat16")["gathered"],
                    "after the all-gather every device holds all p padded shards of the logits"),
        4: Solution(lambda: [next(r for r in range(8) if vocab_range(50257, r, 8)[0] <= 6283
                                  < vocab_range(50257, r, 8)[1]),
                             vocab_range(50257, 7, 8)[1] - vocab_range(50257, 7, 8)[0]],
                    "50257 = 8 · 6282 + 1: the first V mod p ranks own one row more"),
        5: Solution(lambda: 0, "the softmax needs only the max and the sum the forward already all-reduced"),
    },
}
