"""DeepSpeed-Ulysses per rank: trade sequence shards for head shards with all-to-alls, attend, trade back.

Design note
-----------
Jacobs et al. 2023. Each of cp ranks holds s/cp positions of q, k, v (all heads). One all-to-all per tensor turns
that into all s positions of hq/cp query heads and hkv/cp key/value heads (rank j gets heads [j·h/cp, (j+1)·h/cp):
whole GQA groups, since query head n·g + i reads kv head n); attention runs locally, unsharded over the sequence —
no ring, any kernel; one more all-to-all returns the output to sequence shards::

    q  [b, s/cp, hq, d]  --a2a-->  [b, s, hq/cp, d]        (k, v likewise with hkv)
    out = dense attention per head group                    [b, s, hq/cp, d]
    out  --a2a-->  [b, s/cp, hq, d]

Four all-to-alls forward (q, k, v, out), four backward (their gradients, ``shardlab.expert.parallel.all_to_all``:
"forward: all-to-all, backward: all-to-all"), each of the rank's whole local tensor:
payload b·(s/cp)·(2hq + 2hkv)·d·e per direction (``formulas.context.ulysses_all_to_all``). Unlike the ring,
the traffic per rank falls as 1/cp; cp must divide hq, and hkv unless the K/V heads are replicated first
(``context.case.ulysses_params`` goes to hkv = hq). Contiguous layout only: the
head-sharded attention sees the whole sequence, so a causal mask costs every rank the same.
"""

from __future__ import annotations

from typing import Any

import torch

from shardlab.comm import Comm
from shardlab.context.attention import check_qkv, contiguous_step, dense_attention
from shardlab.expert.parallel import all_to_all


def seq_to_heads(x: torch.Tensor, comm: Comm, tag: str) -> torch.Tensor:
    """[b, s/cp, h, d] (this rank's positions, all heads) -> [b, s, h/cp, d] (all positions, its heads)."""
    cp = comm.world_size
    b, c, h, d = x.shape
    parts = x.reshape(b, c, cp, h // cp, d).permute(2, 0, 1, 3, 4).contiguous()  # [cp (dest rank), b, c, h/cp, d]
    got = all_to_all(parts, comm, 0, tag)  # [cp (source rank = sequence chunk), b, c, h/cp, d]
    return got.permute(1, 0, 2, 3, 4).reshape(b, cp * c, h // cp, d)


def heads_to_seq(x: torch.Tensor, comm: Comm, tag: str) -> torch.Tensor:
    """[b, s, h/cp, d] -> [b, s/cp, h, d]: the inverse of :func:`seq_to_heads`."""
    cp = comm.world_size
    b, s, hl, d = x.shape
    parts = x.reshape(b, cp, s // cp, hl, d).permute(1, 0, 2, 3, 4).contiguous()  # [cp (dest = chunk), b, c, h/cp, d]
    got = all_to_all(parts, comm, 0, tag)  # [cp (source rank = head block), b, c, h/cp, d]
    return got.permute(1, 2, 0, 3, 4).reshape(b, s // cp, cp * hl, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, causal: bool = False
                      ) -> torch.Tensor:
    """This rank's output rows [b, s/cp, hq, d] for its local q [b, s/cp, hq, d], k, v [b, s/cp, hkv, d]."""
    check_qkv(q, k, v)
    cp = comm.world_size
    for name, h in (("heads", q.shape[2]), ("kv_heads", k.shape[2])):
        if h % cp:
            raise ValueError(f"{name}={h} is not divisible by cp={cp} (Ulysses gives each rank whole heads)")
    qh, kh, vh = (seq_to_heads(t, comm, f"cp.ulysses.{n}") for t, n in ((q, "q"), (k, "k"), (v, "v")))
    out = dense_attention(qh, kh, vh, causal)  # [b, s, hq/cp, d]
    return heads_to_seq(out, comm, "cp.ulysses.out")


def ulysses_step(comm: Comm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 target: torch.Tensor | None = None, causal: bool = False) -> dict[str, Any]:
    """:func:`shardlab.context.attention.contiguous_step` of this module's attention."""
    return contiguous_step(ulysses_attention, comm, q, k, v, target, causal)
