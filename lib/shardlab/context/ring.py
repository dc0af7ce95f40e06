"""Ring attention per rank: each rank keeps its queries, key/value blocks travel around the ring.

Design note
-----------
Liu, Zaharia & Abbeel 2023 ("Ring Attention with Blockwise Transformers"); the zig-zag load balance of
ring-flash-attention / Megatron-LM / Llama 3 (Brandon et al. 2023's striped attention is the round-robin one).
cp ranks stand in a ring; rank r sends to r+1 and receives from r−1 (mod cp). Rank r
holds its query chunks and, at step t = 0 … cp−1, the key/value blocks that started on rank (r − t) mod cp::

    step t:  send (k, v) to r+1 (buffered, returns at once)  -> fold the held block into the online softmax
             (shardlab.context.attention.SoftmaxState)          -> receive the next (k, v) from r−1
             (no send / receive at the last step: cp − 1 transfers of k and of v in all)

Under a causal mask a (query chunk, key chunk) pair whose keys are all in the future is skipped, and the
``trace`` says which blocks each rank computed (the causal-balance count): with the contiguous layout rank r
computes r + 1 of its cp blocks, with the zig-zag layout every rank computes the same amount.

**Backward: hand-written, and it rings too.** The forward saves only the local q, k, v, out and the log-sum-exp
(not the cp − 1 visiting blocks: that would cost cp times the K/V memory). The backward runs the ring again:
the (k, v) blocks travel as in the forward (cp − 1 transfers), and next to each block travels its gradient
accumulator (dk, dv): every rank adds its queries' contribution (``attention.block_backward``) and passes it on.
After cp steps (cp transfers: one more than k and v, to bring the finished gradient home) rank r holds dk, dv
of its own block. Per rank per layer the backward sends (cp − 1) + cp blocks of k-size twice (k and dk, v and
dv): (2cp − 1)·2·b·(s/cp)·hkv·d·e bytes against the forward's (cp − 1)·2·b·(s/cp)·hkv·d·e
(``shardlab.formulas.context.ring_p2p``). The accumulators carry k's dtype.

Collectives used: ``comm.send(t, dst, tag=...)`` (buffered) and ``comm.recv(shape, dtype, src, tag=...)``;
tags ``cp.k``, ``cp.v`` (forward and backward), ``cp.dk``, ``cp.dv`` (backward).

Example (run by the tests and the notebook; q, k, v are the full [b, s, heads, d] tensors)::

    results = SimulatedWorld(4).run(ring_attention_step, q, k, v, target, causal=True, layout="zigzag")
    results[r]["out"]      # rank r's output rows (its chunks), == dense_attention(...) sharded the same way
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import FunctionCtx

from shardlab.comm import Comm
from shardlab.context.attention import (
    SoftmaxState,
    block_backward,
    block_elements,
    block_kind,
    check_layout,
    check_qkv,
    chunk_ids,
    shard_sequence,
    softmax_delta,
)
from shardlab.models import loss

TAGS = ("cp.k", "cp.v", "cp.dk", "cp.dv")


@dataclass(frozen=True)
class ChunkPair:
    """One (query chunk, key chunk) pair a rank met in the ring."""

    phase: str  # "forward" | "backward"
    step: int  # ring step t: the key/value block started on rank (rank − t) mod cp
    q_chunk: int
    k_chunk: int
    kind: str  # full | diagonal | masked (masked blocks are skipped: no work)
    elements: int  # unmasked score elements computed


def _blocks(rank: int, step: int, cp: int, layout: str, causal: bool, chunk: int, phase: str) -> list[ChunkPair]:
    src = (rank - step) % cp
    return [ChunkPair(phase, step, qc, kc, kind, block_elements(kind, chunk))
            for qc in chunk_ids(layout, rank, cp) for kc in chunk_ids(layout, src, cp)
            for kind in (block_kind(qc, kc, causal),)]


def _send_next(comm: Comm, tensors: list[torch.Tensor], tags: list[str]) -> None:
    """Hand every tensor to rank+1 (buffered: returns at once)."""
    for t, tag in zip(tensors, tags, strict=True):
        comm.send(t, (comm.rank + 1) % comm.world_size, tag=tag)


def _recv_prev(comm: Comm, like: list[torch.Tensor], tags: list[str]) -> list[torch.Tensor]:
    """Receive tensors shaped like ``like`` from rank−1 (blocks until they arrive)."""
    src = (comm.rank - 1) % comm.world_size
    return [comm.recv(t.shape, t.dtype, src, tag=tag) for t, tag in zip(like, tags, strict=True)]


class RingAttention(torch.autograd.Function):
    """out = attention(q, K, V) for this rank's queries; forward and backward both ring (see the module note)."""

    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, causal: bool,
                layout: str, trace: list[ChunkPair]) -> torch.Tensor:
        cp, r = comm.world_size, comm.rank
        n = len(chunk_ids(layout, r, cp))  # chunks per rank: 1 (contiguous) or 2 (zigzag)
        chunk = q.shape[1] // n
        q_parts = q.chunk(n, dim=1)  # n x [b, c, hq, d]
        states = [SoftmaxState.empty(qp, k.shape[2]) for qp in q_parts]
        kv = [k, v]  # the block held now: [b, n·c, hkv, d] each
        for step in range(cp):
            last = step == cp - 1
            if not last:
                _send_next(comm, kv, ["cp.k", "cp.v"])  # in flight while this step computes
            blocks = _blocks(r, step, cp, layout, causal, chunk, "forward")
            trace.extend(blocks)
            ks, vs = kv[0].chunk(n, dim=1), kv[1].chunk(n, dim=1)
            for i, blk in enumerate(blocks):
                a, b = divmod(i, n)  # query part a, key part b
                if blk.kind != "masked":
                    states[a].update(q_parts[a], ks[b], vs[b], blk.kind)
            if not last:
                kv = _recv_prev(comm, kv, ["cp.k", "cp.v"])
        outs, lses = zip(*(s.result() for s in states), strict=True)
        out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=-1)  # [b, n·c, hq, d], [b, hkv, g, n·c]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.causal, ctx.layout, ctx.trace = comm, causal, layout, trace
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        comm, causal, layout = ctx.comm, ctx.causal, ctx.layout
        cp, r = comm.world_size, comm.rank
        n = len(chunk_ids(layout, r, cp))
        chunk = q.shape[1] // n
        delta = softmax_delta(out, dout, k.shape[2])  # [b, hkv, g, n·c]
        q_parts, do_parts = q.chunk(n, dim=1), dout.contiguous().chunk(n, dim=1)
        lse_parts, delta_parts = lse.chunk(n, dim=-1), delta.chunk(n, dim=-1)
        dq = [torch.zeros_like(p) for p in q_parts]
        kv = [k, v]
        dkv = [torch.zeros_like(k), torch.zeros_like(v)]  # the travelling accumulators of the held block
        for step in range(cp):
            last = step == cp - 1
            if not last:
                _send_next(comm, kv, ["cp.k", "cp.v"])
            blocks = _blocks(r, step, cp, layout, causal, chunk, "backward")
            ctx.trace.extend(blocks)
            ks, vs = kv[0].chunk(n, dim=1), kv[1].chunk(n, dim=1)
            dks, dvs = list(dkv[0].chunk(n, dim=1)), list(dkv[1].chunk(n, dim=1))
            for i, blk in enumerate(blocks):
                a, b = divmod(i, n)
                if blk.kind != "masked":
                    g_q, g_k, g_v = block_backward(q_parts[a], ks[b], vs[b], do_parts[a], lse_parts[a],
                                                   delta_parts[a], blk.kind)
                    dq[a] = dq[a] + g_q
                    dks[b], dvs[b] = dks[b] + g_k, dvs[b] + g_v
            dkv = [torch.cat(dks, dim=1), torch.cat(dvs, dim=1)]
            if cp > 1:  # pass the accumulators on (after cp passes each is home); receive in send order
                _send_next(comm, dkv, ["cp.dk", "cp.dv"])
                if not last:
                    kv = _recv_prev(comm, kv, ["cp.k", "cp.v"])
                dkv = _recv_prev(comm, dkv, ["cp.dk", "cp.dv"])
        return torch.cat(dq, dim=1), dkv[0], dkv[1], None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, causal: bool = False,
                   layout: str = "contiguous", trace: list[ChunkPair] | None = None) -> torch.Tensor:
    """This rank's attention output for its local q [b, s_loc, hq, d] against every rank's k, v [b, s_loc, hkv, d]
    (local shards laid out by ``layout``). Differentiable in q, k, v; appends the blocks met to ``trace``."""
    check_qkv(q, k, v)
    check_layout(layout, q.shape[1] * comm.world_size, comm.world_size)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"ring attention needs equal local query and key lengths; got {q.shape[1]} and {k.shape[1]}")
    return RingAttention.apply(q, k, v, comm, causal, layout, [] if trace is None else trace)


def ring_attention_step(comm: Comm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        target: torch.Tensor | None = None, causal: bool = False,
                        layout: str = "contiguous") -> dict[str, Any]:
    """One forward (+ backward of ½‖out − target‖², ``models.loss``, summed over the ranks' rows) on this
    rank: autograd hands :class:`RingAttention`'s backward dO = out − target of this rank's rows. q, k, v, target
    are the FULL [b, s, heads, d] tensors; each rank takes its chunks (``layout``). Returns this rank's out and
    gradients (in its local layout), its chunk ids, and the blocks it met (``trace``)."""
    cp, r = comm.world_size, comm.rank
    check_layout(layout, q.shape[1], cp)
    ql, kl, vl = (shard_sequence(t, layout, r, cp).detach().clone().requires_grad_(target is not None)
                  for t in (q, k, v))
    trace: list[ChunkPair] = []
    out = ring_attention(ql, kl, vl, comm, causal, layout, trace)
    if target is not None:
        loss(out, shard_sequence(target, layout, r, cp)).backward()
    return {"out": out.detach(), "grad_q": ql.grad, "grad_k": kl.grad, "grad_v": vl.grad,
            "chunks": chunk_ids(layout, r, cp), "trace": trace}
