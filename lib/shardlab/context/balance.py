"""Causal balance of ring attention: the work each rank does, counted from what the per-rank code computed.

Design note
-----------
Under a causal mask, query i attends to keys 0 … i only. With the contiguous split rank r holds queries
[r·s/cp, (r+1)·s/cp) and computes r + 1 of the cp key blocks that visit it (r full blocks and its own, diagonal
one): the last rank does about 2cp − 1 times the first rank's work, and every ring step waits for the busiest
rank. The zig-zag split (2·cp chunks, rank r takes chunks r and 2cp − 1 − r: ring-flash-attention's and
Megatron-LM's context parallelism, Llama 3) pairs an early chunk with a late one, and every rank does the same work.
(Brandon et al. 2023's *striped* attention balances differently: round-robin tokens, rank r holds positions
r, r + cp, r + 2cp, …)

:func:`work_from_trace` reads one rank's ``trace`` (``shardlab.context.ring.ChunkPair``: the blocks the ring met and
their kinds; masked blocks are skipped and cost nothing); :func:`measure` runs the per-rank ring in a
``SimulatedWorld`` for both layouts and puts the counts beside the formula (``formulas.context.causal_work``,
``causal_blocks``). Work is in unmasked score elements per (batch row, head) — a full block of c queries x c keys
is c², a diagonal one c(c + 1)/2 — and in blocks computed (a diagonal block counts as one). The trace and the
formula share that block rule; :func:`pairs_by_brute_force` does not: it takes the positions each rank holds from
the per-rank code's own sharding (``attention.shard_sequence``) and counts the (query, key) pairs the mask allows,
one by one — the independent count both are checked against.

Example::

    >>> [r["max_over_mean"] for r in measure(seq=16, cp=4)]        # contiguous, zigzag
    [1.7058823529411764, 1.0]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from shardlab.comm import SimulatedWorld
from shardlab.context.attention import LAYOUTS, shard_sequence
from shardlab.context.ring import ChunkPair, ring_attention_step
from shardlab.formulas import context as fcp


def work_from_trace(trace: Iterable[ChunkPair], phase: str = "forward") -> dict[str, int]:
    """One rank's ``{"elements", "blocks", "full", "diagonal", "masked"}`` in ``phase``."""
    blocks = [b for b in trace if b.phase == phase]
    out = {k: sum(1 for b in blocks if b.kind == k) for k in ("full", "diagonal", "masked")}
    return {"elements": sum(b.elements for b in blocks), "blocks": out["full"] + out["diagonal"], **out}


def pairs_by_brute_force(seq: int, cp: int, layout: str, causal: bool = True) -> list[int]:
    """Per rank: the (query i, key j) pairs with j <= i (every pair without ``causal``) over the query positions
    the rank holds, counted one by one."""
    fcp.causal_work(seq, cp, layout, causal)  # the layout's divisibility rule
    positions = torch.arange(seq).reshape(1, seq)
    out = []
    for r in range(cp):
        mine = shard_sequence(positions, layout, r, cp, dim=1)[0].tolist()
        out.append(sum(1 for i in mine for j in range(seq) if j <= i or not causal))
    return out


def measure(seq: int, cp: int, layouts: Iterable[str] = LAYOUTS, causal: bool = True, batch: int = 1,
            heads: int = 2, kv_heads: int = 1, head_dim: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Per layout: the work per rank counted in a SimulatedWorld(cp) forward, the formula's, max / mean, and what
    rank 0 sent (``sends``, ``send_bytes``: float32 blocks of k and v)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    k, v = (torch.randn(batch, seq, kv_heads, head_dim, generator=g) for _ in range(2))
    rows = []
    for layout in layouts:
        world = SimulatedWorld(cp)
        results = world.run(ring_attention_step, q, k, v, None, causal=causal, layout=layout)
        work = [work_from_trace(r["trace"]) for r in results]
        sends = world.ledger.select("send")
        elements = [w["elements"] for w in work]
        rows.append({
            "layout": layout, "cp": cp, "seq": seq, "elements": elements, "blocks": [w["blocks"] for w in work],
            "formula_elements": fcp.causal_work(seq, cp, layout, causal),
            "brute_force": pairs_by_brute_force(seq, cp, layout, causal),
            "formula_blocks": [b["full"] + b["diagonal"] for b in fcp.causal_blocks(cp, layout, causal)],
            "max_over_mean": fcp.max_over_mean(elements), "sends": len(sends), "send_bytes": sends.payload_bytes(),
        })
    return rows


def explore(cp: int, seq: int, kv_heads: int, head_dim: int, layout: str, causal: bool, batch: int = 1,
            seed: int = 0) -> dict[str, Any]:
    """The explorer's numbers for one small ring (heads = 2·kv_heads): the formula's sends per rank for a forward +
    backward (``backward="ring"``) beside the ledger of a SimulatedWorld(cp) run, the all-gather payload, and
    the forward work per rank (formula vs counted from the trace) with its max / mean. ValueError (naming the
    rule) for a combination that cannot be split."""
    heads = 2 * kv_heads
    fcp.causal_work(seq, cp, layout, causal)  # the layout's divisibility rule, before any work
    g = torch.Generator().manual_seed(seed)
    q, target = (torch.randn(batch, seq, heads, head_dim, generator=g) for _ in range(2))
    k, v = (torch.randn(batch, seq, kv_heads, head_dim, generator=g) for _ in range(2))
    world = SimulatedWorld(cp)
    results = world.run(ring_attention_step, q, k, v, target, causal=causal, layout=layout)
    sends = world.ledger.select("send")
    work = [work_from_trace(r["trace"])["elements"] for r in results]
    return {"formula": fcp.ring_p2p(batch, seq, kv_heads, head_dim, cp, "float32", phase="step"),
            "ledger": {"count": len(sends), "bytes": sends.payload_bytes()},
            "allgather_payload": fcp.kv_block_bytes(batch, seq, kv_heads, head_dim, cp, "float32"),
            "work": work, "formula_work": fcp.causal_work(seq, cp, layout, causal),
            "max_over_mean": fcp.max_over_mean(work)}
