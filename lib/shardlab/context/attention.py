"""Attention in blocks: the dense oracle, sequence layouts, and the flash-attention block kernels.

Design note
-----------
Layout everywhere in `shardlab.context`: q [b, s, hq, d], k and v [b, s, hkv, d] (sequence before heads, so a
sequence shard is a slice of dim 1). Grouped-query attention (GQA) has hq = g·hkv: query head n·g + i reads
key/value head n (``repeat_interleave``, as Llama and PyTorch's ``enable_gqa`` do). The scale is 1/sqrt(d).

**Oracle.** :func:`dense_attention` is PyTorch's own ``scaled_dot_product_attention`` on the full sequence;
:func:`reference_attention` writes the same math as einsums (the graph the GSPMD programs annotate).

**Layouts** (how the sequence is cut over cp ranks; Liu et al. 2023 ring attention; the zig-zag split of
Llama 3 / ring-flash-attention):

    contiguous   cp chunks of s/cp; rank r holds chunk r
    zigzag       2·cp chunks of s/(2cp); rank r holds chunks r and 2cp−1−r (balanced under a causal mask)

**Blocks.** Attention of one query chunk against one key chunk, classified by :func:`block_kind` under a causal
mask: ``full`` (every key precedes every query), ``diagonal`` (same chunk: lower triangle incl. the diagonal),
``masked`` (every key is in the future: skipped, no work). Work per block in unmasked score elements:
c² for full, c(c+1)/2 for diagonal.

**Online softmax** (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022): :class:`SoftmaxState` keeps,
per query row, the running max m, the denominator l = Σ exp(s − m) and the unnormalised accumulator
acc = Σ exp(s − m) v. Adding a block with scores s_blk:

    m' = max(m, rowmax(s_blk))      l' = l·exp(m − m') + Σ exp(s_blk − m')
    acc' = acc·exp(m − m') + exp(s_blk − m') v_blk           out = acc / l,   lse = m + log l

so blocks can arrive in any order (the ring's). :func:`block_backward` is FlashAttention's backward for one
block, from the saved log-sum-exp: p = exp(s − lse), dv += pᵀ dO, ds = p ∘ (dO vᵀ − D) with D = rowsum(dO ∘ O),
dq += ds k / sqrt(d), dk += dsᵀ q / sqrt(d).

Example (chunks of a zig-zag split over 4 ranks: 8 chunks)::

    >>> chunk_ids("zigzag", 1, 4), chunk_ids("contiguous", 1, 4)
    ([1, 6], [1])
    >>> block_kind(6, 1, causal=True), block_kind(1, 6, causal=True), block_kind(3, 3, causal=True)
    ('full', 'masked', 'diagonal')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from shardlab.comm import Comm
from shardlab.models import loss

LAYOUTS = ("contiguous", "zigzag")
KINDS = ("full", "diagonal", "masked")


# ------------------------------------------------------------------------------------------ oracle
def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate q [b, s, hq, d], k/v [b, s, hkv, d]; returns the group size g = hq / hkv."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [b, s, heads, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and head dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads hq={q.shape[2]} must be a multiple of kv heads hkv={k.shape[2]} (GQA)")
    return q.shape[2] // k.shape[2]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """PyTorch's scaled_dot_product_attention on the whole sequence: [b, s, hq, d] -> [b, s, hq, d]."""
    check_qkv(q, k, v)
    if q.shape[1] != k.shape[1] and causal:
        raise ValueError(f"causal attention needs as many queries as keys; got {q.shape[1]} and {k.shape[1]}")
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])  # [b, hq, s, d]
    return out.transpose(1, 2)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The same as :func:`dense_attention`, written with einsums (no fused kernel): what GSPMD annotates."""
    g = check_qkv(q, k, v)
    b, s, hq, d = q.shape
    qg = q.reshape(b, s, hq // g, g, d)  # [b, s, hkv, g, d]
    scores = torch.einsum("bqngd,bknd->bngqk", qg, k) / math.sqrt(d)  # [b, hkv, g, s, s]
    if causal:
        future = torch.ones(s, k.shape[1], dtype=torch.bool, device=q.device).triu(1)  # key after query
        scores = scores.masked_fill(future, float("-inf"))
    out = torch.einsum("bngqk,bknd->bqngd", scores.softmax(dim=-1), v)  # [b, s, hkv, g, d]
    return out.reshape(b, s, hq, d)


# ------------------------------------------------------------------------------------------ layouts
def check_layout(layout: str, seq: int, cp: int) -> int:
    """Chunk length of ``layout`` for ``seq`` over ``cp`` ranks; ValueError naming the rule."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp={cp!r} must be a positive int")
    chunks = cp if layout == "contiguous" else 2 * cp
    if seq % chunks:
        raise ValueError(f"seq={seq} is not divisible by the {chunks} chunks of the {layout} layout (cp={cp})")
    return seq // chunks


def chunk_ids(layout: str, rank: int, cp: int) -> list[int]:
    """Which chunks rank ``rank`` holds, in order."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank={rank} is not in [0, cp={cp})")
    if layout == "contiguous":
        return [rank]
    if layout == "zigzag":
        return [rank, 2 * cp - 1 - rank]
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")


def shard_sequence(x: torch.Tensor, layout: str, rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s part of ``x`` along ``dim``: its chunks, concatenated in order."""
    c = check_layout(layout, x.shape[dim], cp)
    return torch.cat([x.narrow(dim, i * c, c) for i in chunk_ids(layout, rank, cp)], dim=dim)


def contiguous_step(attention: Callable[..., torch.Tensor], comm: Comm, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, target: torch.Tensor | None = None, causal: bool = False) -> dict[str, Any]:
    """One rank's forward (+ backward of ½‖out − target‖², ``models.loss``, summed over the ranks' rows) of
    ``attention(q, k, v, comm, causal)`` on a contiguous split: q, k, v, target are the FULL [b, s, heads, d];
    rank r takes positions [r·s/cp, (r+1)·s/cp). Returns its out and gradients (its rows)."""
    cp, r = comm.world_size, comm.rank
    check_layout("contiguous", q.shape[1], cp)
    ql, kl, vl = (shard_sequence(t, "contiguous", r, cp).detach().clone().requires_grad_(target is not None)
                  for t in (q, k, v))
    out = attention(ql, kl, vl, comm, causal)
    if target is not None:
        loss(out, shard_sequence(target, "contiguous", r, cp)).backward()
    return {"out": out.detach(), "grad_q": ql.grad, "grad_k": kl.grad, "grad_v": vl.grad}


def unshard_sequence(parts: list[torch.Tensor], layout: str, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: the ranks' parts (rank order) -> the whole sequence."""
    cp = len(parts)
    per_rank = len(chunk_ids(layout, 0, cp))
    chunks: dict[int, torch.Tensor] = {}
    for r, part in enumerate(parts):
        for i, piece in zip(chunk_ids(layout, r, cp), part.chunk(per_rank, dim=dim), strict=True):
            chunks[i] = piece
    return torch.cat([chunks[i] for i in sorted(chunks)], dim=dim)


def block_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """``full`` / ``diagonal`` / ``masked`` for query chunk vs key chunk (equal chunk lengths)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "masked"


def block_elements(kind: str, chunk: int) -> int:
    """Unmasked score elements of one block of ``chunk`` queries x ``chunk`` keys."""
    return {"full": chunk * chunk, "diagonal": chunk * (chunk + 1) // 2, "masked": 0}[kind]


# ------------------------------------------------------------------------------------------ block kernels
def _scores(q: torch.Tensor, k: torch.Tensor, kind: str) -> torch.Tensor:
    """Scaled scores of a q block [b, c, hq, d] against a k block [b, c', hkv, d] -> [b, hkv, g, c, c']."""
    b, c, hq, d = q.shape
    hkv = k.shape[2]
    s = torch.einsum("bqngd,bknd->bngqk", q.reshape(b, c, hkv, hq // hkv, d), k) / math.sqrt(d)
    if kind == "diagonal":
        future = torch.ones(c, k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


@dataclass
class SoftmaxState:
    """Online-softmax state of one query block: running max m, denominator l, accumulator acc."""

    m: torch.Tensor  # [b, hkv, g, c]       running row max of the scores seen so far
    denom: torch.Tensor  # [b, hkv, g, c]   l = Σ exp(s − m)
    acc: torch.Tensor  # [b, hkv, g, c, d]  Σ exp(s − m) v

    @classmethod
    def empty(cls, q: torch.Tensor, kv_heads: int) -> SoftmaxState:
        b, c, hq, d = q.shape
        shape = (b, kv_heads, hq // kv_heads, c)
        m = torch.full(shape, float("-inf"), dtype=q.dtype, device=q.device)
        return cls(m, torch.zeros(shape, dtype=q.dtype, device=q.device),
                   torch.zeros((*shape, d), dtype=q.dtype, device=q.device))

    def update(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str) -> None:
        """Fold one key/value block into the state (``kind`` "full" or "diagonal")."""
        s = _scores(q, k, kind)  # [b, hkv, g, c, c']
        m_new = torch.maximum(self.m, s.amax(dim=-1))  # [b, hkv, g, c]
        alpha = torch.exp(self.m - m_new)  # rescales what was accumulated under the old max (0 at the start)
        p = torch.exp(s - m_new.unsqueeze(-1))  # [b, hkv, g, c, c']
        self.denom = self.denom * alpha + p.sum(dim=-1)
        self.acc = self.acc * alpha.unsqueeze(-1) + torch.einsum("bngqk,bknd->bngqd", p, v)
        self.m = m_new

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out [b, c, hq, d], lse [b, hkv, g, c])."""
        out = self.acc / self.denom.unsqueeze(-1)  # [b, hkv, g, c, d]
        b, n, g, c, d = out.shape
        return out.permute(0, 3, 1, 2, 4).reshape(b, c, n * g, d), self.m + torch.log(self.denom)


def block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                   delta: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention's backward of one block. q, dout [b, c, hq, d]; k, v [b, c', hkv, d]; lse, delta
    [b, hkv, g, c] (delta = rowsum(dout ∘ out)). Returns this block's (dq, dk, dv) contributions."""
    b, c, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    p = torch.exp(_scores(q, k, kind) - lse.unsqueeze(-1))  # [b, hkv, g, c, c']: softmax probabilities
    do = dout.reshape(b, c, hkv, g, d)  # [b, c, hkv, g, d]
    dv = torch.einsum("bngqk,bqngd->bknd", p, do)  # [b, c', hkv, d] (summed over the g query heads)
    dp = torch.einsum("bqngd,bknd->bngqk", do, v)  # [b, hkv, g, c, c']
    ds = p * (dp - delta.unsqueeze(-1)) / math.sqrt(d)
    dq = torch.einsum("bngqk,bknd->bqngd", ds, k).reshape(b, c, hq, d)
    dk = torch.einsum("bngqk,bqngd->bknd", ds, q.reshape(b, c, hkv, g, d))  # [b, c', hkv, d]
    return dq, dk, dv


def softmax_delta(out: torch.Tensor, dout: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """D = rowsum(dout ∘ out) per query row and head: [b, c, hq, d] -> [b, hkv, g, c]."""
    b, c, hq, _ = out.shape
    return (out * dout).sum(-1).reshape(b, c, kv_heads, hq // kv_heads).permute(0, 2, 3, 1)
