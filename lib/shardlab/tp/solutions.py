"""Reference solutions of notebooks 02-04's exercises (graded by ``shardlab.core.exercises``; never printed).

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
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import wire_bytes
from shardlab.tp.layers import vocab_range
from shardlab.tp.params import AttentionParams


def _row_parallel_forward(fn: Callable[..., Any]) -> list[Any]:
    """02 #4: run the learner's ``fn(comm, y_i, b_i, bias)`` on 4 ranks (y [6, 16], B [16, 8], b2 [8]; rank i holds
    columns 4i..4i+3 of y and the same rows of B): [every rank's z == y B + b2, the collectives issued, their payload
    bytes]."""
    g = torch.Generator().manual_seed(0)
    y, b, bias = torch.randn(6, 16, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, generator=g)
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, y[:, 4 * comm.rank:4 * comm.rank + 4].clone(),
                                    b[4 * comm.rank:4 * comm.rank + 4].clone(), bias.clone()))
    ok = all(isinstance(z, torch.Tensor) and z.shape == (6, 8) and torch.allclose(z, y @ b + bias, atol=1e-5)
             for z in out)
    return [ok, [e.op for e in world.ledger], world.ledger.payload_bytes()]

def _attention_collectives(specs: dict[str, tuple[str | None, ...]]) -> list[int]:
    """03 #5: compile notebook 03's attention step (defaults, forward + backward) with the dense module's parameters
    annotated by ``specs``; [all-gathers, all-reduces (logical: a tuple all-reduce counts its operands)], from
    XLA:CPU when this process has tp devices, else XLA:TPU."""
    from shardlab.core import harness  # imported here: torch_xla, after runtime.setup() (solutions load before it)
    from shardlab.tp.case import AttentionCase

    if not isinstance(specs, dict):
        raise ValueError(f"answer_5 must be a dict {{parameter name: spec}}, got {type(specs).__name__}")
    colls = harness.compiler_view(AttentionCase(AttentionParams(), specs={k: tuple(v) for k, v in specs.items()})
                      ).detail.module.collectives
    return [sum(c.op == "all-gather" for c in colls), sum(c.operands for c in colls if c.op == "all-reduce")]

VOCAB_GRID = [(v, p) for v in (8, 10, 1003, 50257, 128256) for p in (1, 2, 3, 4, 8) if v >= p]

def _vocab_ranges(fn: Callable[..., Any]) -> list[list[int]]:
    """04 #7: the learner's ``fn(V, rank, p)`` on :data:`VOCAB_GRID`, every rank: a list of [start, end]."""
    return [[int(x) for x in fn(v, r, p)] for v, p in VOCAB_GRID for r in range(p)]


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
        4: Solution(lambda: [True, ["all_reduce"], 6 * 8 * 4],
                    "y_i B_i is a full-size partial sum: add the ranks' partials with one collective, and add the "
                    "bias once, after that sum (not on every rank before it)", run=_row_parallel_forward),
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
        5: Solution(lambda: [0, ftp.attention_all_reduce(2, 8, 64, 4, backward=True)["count"]],
                    "a device must own whole heads: which dim of W_Q/W_K/W_V (nn.Linear layout [out, in]) holds the "
                    "heads, and which dim of W_O? Answer [all-gathers, all-reduces] must come out [0, 2]",
                    run=_attention_collectives),
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
        6: Solution(lambda: ftp.output_layer_all_reduce(1, 8, 64, 8, backward=True)["count"],
                    "logits_i = f(x) E_i^T: what does f do in the backward?"),
        7: Solution(lambda: [list(vocab_range(v, r, p)) for v, p in VOCAB_GRID for r in range(p)],
                    "divmod(V, p) gives the base rows and the leftover; the first `leftover` ranks take one more, "
                    "and every range starts where the previous one ended", run=_vocab_ranges),
    },
}
