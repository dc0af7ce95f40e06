"""All-gather context parallelism per rank: gather every key and value, attend with the local queries.

Design note
-----------
Llama 3 (Dubey et al. 2024, §3.3.2) trains long contexts this way: each of cp ranks holds s/cp positions of q, k, v;
attention contracts every query with every key, so before attending each rank **all-gathers** k and v along the
sequence (two all-gathers, payload = its shard b·(s/cp)·hkv·d·e each), then computes its [s/cp, s] block of
scores. The backward of an all-gather is a **reduce-scatter**: each rank's dK, dV are partial sums over its
queries, summed over the ranks, and each rank keeps its own shard (payload = the full b·s·hkv·d·e gradient)::

    K = all_gather(k_r)                      [b, s, hkv, d]      (g_sp of Korthikanti et al.: forward all-gather,
    out_r = softmax(q_r K^T / sqrt(d)) V     [b, s/cp, hq, d]     backward reduce-scatter — tp.mappings)
    dk_r = reduce_scatter(dK partial sums)   [b, s/cp, hkv, d]

Same wire bytes as the ring's forward ((cp − 1) blocks of k and of v per rank), but the whole K/V and s/cp × s
scores live on every rank at once. This code uses the contiguous layout: its causal mask is applied to the whole
[s/cp, s] block (nothing skipped), so the layout would not change its work — true of this dense masked kernel
only: a causal flash kernel skips the tiles above the diagonal, and then the contiguous layout leaves the last
rank about 2cp − 1 times the first rank's work (Llama 3 uses 2·cp chunks for its all-gather CP for that reason).

Example (run by the tests and the notebook)::

    results = SimulatedWorld(4).run(allgather_attention_step, q, k, v, target, causal=True)
    results[r]["out"]      # rank r's output rows, == dense_attention(q, k, v, True)[:, r·s/cp:(r+1)·s/cp]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shardlab.comm import Comm
from shardlab.context.attention import check_qkv, contiguous_step
from shardlab.tp.mappings import gather_from_sp_region


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm,
                        causal: bool = False) -> torch.Tensor:
    """This rank's output [b, s/cp, hq, d] for its local q [b, s/cp, hq, d] against the gathered k, v
    ([b, s/cp, hkv, d] shards of a contiguous split). Differentiable: the backward reduce-scatters dk, dv."""
    check_qkv(q, k, v)
    c = q.shape[1]
    keys, values = (gather_from_sp_region(t, comm, dim=1) for t in (k, v))  # [b, s, hkv, d]: all-gather each
    mask = None
    if causal:
        qpos = comm.rank * c + torch.arange(c)  # this rank's query positions
        mask = torch.arange(keys.shape[1])[None, :] <= qpos[:, None]  # [s/cp, s]: True = the key is visible
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=q.shape[2] != k.shape[2])  # [b, hq, s/cp, d]
    return out.transpose(1, 2)


def allgather_attention_step(comm: Comm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             target: torch.Tensor | None = None, causal: bool = False) -> dict[str, Any]:
    """:func:`shardlab.context.attention.contiguous_step` of this module's attention."""
    return contiguous_step(allgather_attention, comm, q, k, v, target, causal)
