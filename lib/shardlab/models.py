"""Dense (unsharded) reference modules: the oracles every parallel layer is compared with.

Design note
-----------
Plain `torch.nn` code, one process, no communication.  `shardlab.tp` builds each rank's slice of these with
`from_dense(module, comm)`, and `shardlab.tp.gspmd` annotates these very modules with `mark_sharding`, so the
ledger view and the compiler view compute the same function as the dense oracle.

Layout follows `nn.Linear`: weight is [out_features, in_features], y = x @ W^T + b.  Activations are
[batch, seq, hidden] (b, s, h); attention heads nh with head dim hd = h / nh.

    MLP(h, ffn)              y = gelu(x A) B            A: [h, ffn] (fc1), B: [ffn, h] (fc2)
    Attention(h, nh)         causal softmax(Q K^T / sqrt(hd)) V, then the output projection
    nn.Embedding(V, h)       the embedding itself (its tied output layer: `tp.layers.VocabParallelEmbedding`)
    TransformerBlock(h, nh, ffn)   pre-LayerNorm: x + Attn(LN(x)), then + MLP(LN(.))
    loss(out, target)        ½‖out − target‖², the loss of every forward + backward step of the suite
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=bias)  # A^T: [ffn, h]
        self.fc2 = nn.Linear(ffn, hidden, bias=bias)  # B^T: [h, ffn]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.fc1(x))  # [b, s, h] @ [h, ffn] -> [b, s, ffn]
        return self.fc2(y)  # [b, s, ffn] @ [ffn, h] -> [b, s, h]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + causal mask) v for q, k, v: [b, nh, s, hd] -> [b, nh, s, hd]."""
    s, hd = q.shape[-2], q.shape[-1]
    # einsum keeps (b, nh) as two batch dims; `@` would merge them into one, which a heads-sharded GSPMD
    # layout cannot express (the partitioner then all-gathers the heads).
    scores = torch.einsum("bnqd,bnkd->bnqk", q, k) / math.sqrt(hd)  # [b, nh, s, hd] x2 -> [b, nh, s, s]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)  # True above the diagonal
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("bnqk,bnkd->bnqd", scores.softmax(dim=-1), v)  # [b, nh, s, s] x [b, nh, s, hd]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=bias)  # columns grouped by head: head j is [j*hd, (j+1)*hd)
        self.k = nn.Linear(hidden, hidden, bias=bias)
        self.v = nn.Linear(hidden, hidden, bias=bias)
        self.out = nn.Linear(hidden, hidden, bias=bias)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V per head, [b, nh, s, hd] each, from ONE contraction with the stacked weights (Megatron's
        fused QKV): the input gradient is then one sum over (q|k|v, head, hd) — one all-reduce when heads are
        sharded, instead of one per projection on XLA:CPU; XLA:TPU adds the three partial gradients first
        (measured in notebook 03)."""
        nh, hd, h = self.heads, self.head_dim, self.hidden
        w = torch.stack([self.q.weight, self.k.weight, self.v.weight]).view(3, nh, hd, h)  # [3, nh, hd, h]
        qkv = torch.einsum("bsh,tndh->tbnsd", x, w)  # [b, s, h] x [3, nh, hd, h] -> [3, b, nh, s, hd]
        if self.q.bias is not None:
            bias = torch.stack([self.q.bias, self.k.bias, self.v.bias]).view(3, 1, nh, 1, hd)
            qkv = qkv + bias  # [3, b, nh, s, hd]
        return qkv[0], qkv[1], qkv[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv_heads(x)  # each [b, nh, s, hd]
        ctx = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)  # [b, nh, s, hd] -> [b, s, h]
        return self.out(ctx)  # [b, s, h] @ [h, h] -> [b, s, h]


class TransformerBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, bias: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, bias=bias)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # [b, s, h]
        return x + self.mlp(self.ln2(x))  # [b, s, h]


def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """½‖out − target‖², the loss of every forward + backward step here: its output gradient ``out − target``
    depends on the forward's output, as in training, so the backward's first collective (f) waits for the
    forward's last (g). (A loss ``(out * grad_out).sum()`` has the constant output gradient ``grad_out``: the
    two all-reduces are then independent and XLA:TPU's combiner merged them into one — an artefact, measured.)"""
    return 0.5 * (out - target).pow(2).sum()
