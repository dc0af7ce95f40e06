"""Reference solutions of notebook 10's exercises (graded by ``shardlab.core.exercises``; never printed).

Every exercise states its own sizes, so the answers do not depend on the notebook's parameters (exercise 4 is
graded against what the notebook's compilers emitted, which is the same at every legal cp); the hand-written key
is ``data/answers/10_context_parallel.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from shardlab.core.topics import Solution
from shardlab.formulas import context as fcp

Merge = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [b, h, c, d] over one key block k, v [b, h, c', d]: (out [b, h, c, d], lse [b, h, c])."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [b, h, c, c']
    return s.softmax(-1) @ v, s.logsumexp(-1)


def _merge_right(merge: Merge) -> list[bool]:
    """Run the learner's merge on two key blocks, at ordinary and at large scores (exp(lse) overflows float32 at
    lse > 88): True where it equals attention over both blocks at once."""
    g = torch.Generator().manual_seed(0)
    ok = []
    for scale in (1.0, 60.0):
        q = torch.randn(1, 2, 4, 8, generator=g) * scale
        k, v = torch.randn(1, 2, 16, 8, generator=g), torch.randn(1, 2, 16, 8, generator=g)
        (o1, l1), (o2, l2) = _partial(q, k[:, :, :8], v[:, :, :8]), _partial(q, k[:, :, 8:], v[:, :, 8:])
        want, _ = _partial(q, k, v)
        got = merge(o1, l1, o2, l2)
        ok.append(isinstance(got, torch.Tensor) and got.shape == want.shape
                  and bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5)))
    return ok


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "10_context_parallel": {
        1: Solution(lambda: fcp.ring_p2p(1, 131072, 8, 128, 16, "bfloat16")["bytes"],
                    "each of the cp − 1 steps sends this rank's current K block and V block: b·(s/cp)·hkv·d elements "
                    "each, 2 bytes per bf16"),
        2: Solution(lambda: fcp.causal_work(16, 4, "contiguous"),
                    "chunks of c = s/cp queries; rank r sees r full c×c blocks before its own diagonal block, "
                    "which has c(c + 1)/2 unmasked entries — a list of 4 ints"),
        3: Solution(lambda: max(c for c in range(1, 33) if 32 % c == 0 and 8 % c == 0),
                    "each rank must get whole heads of q AND of k, v after the all-to-all"),
        4: Solution(lambda count=None: 2 if count is None else count,
                    "scan runs the loop body once per ring step with the same instructions: how many loops does a "
                    "forward + backward have, and how many shifts does one body hold?"),
        5: Solution(lambda: [True, True],
                    "write out = (Σ₁ + Σ₂) / (l₁ + l₂) with Σᵢ = lᵢ·outᵢ and lᵢ = exp(lseᵢ), then divide everything "
                    "by exp(lse) of the whole (torch.logaddexp) so nothing overflows when the scores are large",
                    run=_merge_right),
    },
}
