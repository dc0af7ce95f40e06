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

    >>> cfg = LMConfig(vocab=64, hidden=16, heads=2, ffn=32, layers=2, seq=8)
    >>> model = TinyLM(cfg)
    >>> tokens, targets = batch(cfg, 4)
    >>> tuple(model(tokens).shape), tuple(tokens.shape)
    ((4, 8, 64), (4, 8))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.models import TransformerBlock

__all__ = ["LMConfig", "TinyLM", "batch", "lm_loss"]


@dataclass(frozen=True)
class LMConfig:
    vocab: int = 2048  # V: large next to h, so the ends are heavy
    hidden: int = 64  # h
    heads: int = 4  # nh (hidden % heads == 0)
    ffn: int = 256  # MLP width (4 h)
    layers: int = 8  # L transformer blocks
    seq: int = 16  # s
    seed: int = 0  # parameters and data are drawn from torch.manual_seed(seed)

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "heads", "ffn", "layers", "seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")


class TinyLM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        with torch.random.fork_rng():  # deterministic parameters, the caller's RNG untouched
            torch.manual_seed(cfg.seed)
            self.embed = nn.Embedding(cfg.vocab, cfg.hidden)  # [V, h]
            self.blocks = nn.ModuleList(
                [TransformerBlock(cfg.hidden, cfg.heads, cfg.ffn) for _ in range(cfg.layers)]
            )
            self.norm = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)  # [V, h]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # [b, s] -> [b, s, h]
        for block in self.blocks:
            x = block(x)  # [b, s, h]
        return self.head(self.norm(x))  # [b, s, h] @ [h, V] -> [b, s, V]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token: logits [b, s, V], targets [b, s]."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch(cfg: LMConfig, size: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), both int64 [size, seq]; targets are the tokens shifted by one (next-token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (size, cfg.seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
