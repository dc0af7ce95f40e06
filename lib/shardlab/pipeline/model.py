"""The model a pipeline splits: a small decoder-only language model with heavy ends.

Design note
-----------
`TinyLM` = token embedding [V, h] -> L pre-LayerNorm transformer blocks (`shardlab.models.TransformerBlock`) ->
final LayerNorm -> LM head [h, V] (untied, as in Llama: a tied embedding would put one weight on the first and
the last stage and need an extra all-reduce of its gradient between them).  With a large vocabulary both ends
are heavy: the embedding in parameters (V h), the head in FLOPs (2 b s h V, several blocks' worth) — the case
where an even split by layer count leaves the last stage slowest.

The loss is the mean cross-entropy over every token of the batch; a pipeline step with m equal microbatches
sums loss_i / m, the same number.

    >>> model = TinyLM(vocab=64, hidden=16, heads=2, ffn=32, layers=2)
    >>> tokens, targets = batch(vocab=64, seq=8, size=4)
    >>> tuple(model(tokens).shape), tuple(tokens.shape)
    ((4, 8, 64), (4, 8))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.models import TransformerBlock

__all__ = ["TinyLM", "batch", "lm_loss"]


class TinyLM(nn.Module):
    """Embedding [V, h] -> `layers` transformer blocks (hidden h, `heads` heads, MLP width `ffn`) -> LayerNorm
    -> LM head [h, V]; parameters drawn from torch.manual_seed(seed), the caller's RNG untouched."""

    def __init__(self, vocab: int, hidden: int, heads: int, ffn: int, layers: int, seed: int = 0) -> None:
        super().__init__()
        for name, value in (("vocab", vocab), ("hidden", hidden), ("heads", heads), ("ffn", ffn),
                            ("layers", layers)):
            if value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = nn.Embedding(vocab, hidden)  # [V, h]
            self.blocks = nn.ModuleList([TransformerBlock(hidden, heads, ffn) for _ in range(layers)])
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)  # [V, h]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # [b, s] -> [b, s, h]
        for block in self.blocks:
            x = block(x)  # [b, s, h]
        return self.head(self.norm(x))  # [b, s, h] @ [h, V] -> [b, s, V]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token: logits [b, s, V], targets [b, s]."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch(vocab: int, seq: int, size: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), both int64 [size, seq]; targets are the tokens shifted by one (next-token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size, seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
