"""Context parallelism as GSPMD programs: all-gather CP and the ring, written once for every device.

Design note
-----------
Mesh (data = n / cp, context = cp); inputs are replicated over ``data`` (only ``context`` splits anything), so every
collective runs within groups of cp devices. Four methods (``shardlab.context.case`` builds each step from the
notebook's parameters and runs it through the harness):

``allgather`` — q, k, v [b, s, h, d] sharded on the sequence: ``(None, "context", None, None)``. Attention
contracts every query with every key, so each device needs all of K and V: :class:`GatherKV` annotates a
replicated copy of k and v (forward: **all-gather** of each shard) and, in its backward, pins the K/V gradient
replicated before annotating it sequence-sharded again (**reduce-scatter**; on XLA:CPU an all-reduce +
dynamic-slice: its pass pipeline never forms a reduce-scatter from the pair, though its runtime has one). Scores
per device [b, hq, s/cp, s]. Measured (torch_xla 2.9, XLA:CPU, 8 devices, b 1, s 1024, hq 8, hkv 2, d 64, f32,
forward + backward of ½‖out − target‖²): with the pin 2 all-gathers (64 KiB each) and 2 reduce-scatters (512 KiB
each), 1.2 MB of collective operands per device; without it (``pin=False``) the partitioner computes dk already
sequence-sharded: it all-to-alls the [b, hkv, g, s/cp, s] score gradient to key-sharding (4 MiB, plus its
causal mask), all-gathers q, and reduces dv before summing its g query heads (2 MiB all-reduce) — 7.3 MB, with
the O(s²) score gradient on the wire where the reduce-scatter moves O(s·d). XLA:TPU at that size: one
reduce-scatter instruction carrying dk and dv (combined: the two are independent of each other).

``ring`` — Liu et al.'s ring as one SPMD program. q, k, v are stacked on a leading ``context`` axis
([cp, b, s/cp, h, d], row r = rank r's chunks, ``(context, None, ...)``), k and v concatenated into one
[cp, 2b, s/cp, hkv, d] tensor; a Python loop runs cp steps of the online softmax, and between steps :class:`Shift`
moves the K/V stack one row along the axis (row r receives row r − 1). Written as slice + concatenate, that is
**one collective-permute of one shard** per step (cp − 1 in all); its backward, written by hand as the opposite
shift, is one permute per step too. Measured: autograd's own backward of the concatenate (pad + add of two
slices) costs three permutes per step, two of them masks — hence the hand-written backward. ``torch.roll`` for
the shift compiles to two all-to-alls and an all-gather (measured on XLA:CPU, torch_xla 2.9). Autograd keeps every
visiting block for the backward (``formulas.context.ring_p2p(backward="saved")``): only dk, dv travel back.

``ring_scan`` — the same ring inside torch_xla's ``scan`` (one XLA ``while`` loop, trip count cp − 1; step 0,
the device's own block, runs before the loop): one collective-permute in the loop body, executed cp − 1 times,
and one in the backward loop. The loop body cannot carry annotations (``scan`` traces it with fake tensors:
``mark_sharding`` there raises "Expected XLA tensor"); the partitioner propagates the carry's sharding.
Integer carries are refused by ``scan`` (every carry gets ``requires_grad``): positions travel as float32.
Memory: the backward keeps what autograd saved for every step (the visiting K/V blocks and the per-step
intermediates); ``remat=True`` passes functorch's min-cut rematerialisation partition to ``scan``. Measured
(s = 1024, hq 8, hkv 2, d 64, cp 8, XLA:TPU v5e-8 peak per chip, the step's loss ½‖out − target‖²): forward
only 1.9 MB (all-gather CP 6.1 MB); forward + backward 23.1 MB, with ``remat`` 15.0 MB (all-gather CP 11.6 MB,
the unrolled ring 11.1 MB) — the per-rank ring's hand-written backward (``shardlab.context.ring``) keeps only q,
k, v, out and the log-sum-exp instead.

``ulysses`` — DeepSpeed-Ulysses (Jacobs et al. 2023): q, k, v re-annotated from sequence-sharded to head-sharded
(``shardlab.expert.gspmd.Reshard``: one all-to-all each), attention per head group over the whole sequence, the
output re-annotated back: 4 all-to-alls forward, 4 backward (``formulas.context.ulysses_all_to_all``); needs
hkv divisible by cp.

Under a causal mask SPMD computes every block and masks it: all devices run one program, so the rank-dependent
skip of the per-rank ring (``shardlab.context.ring``) — and with it the causal imbalance — does not exist here;
the zig-zag layout changes only which positions a device holds.

Tried and not used (torch_xla 2.9.0): manual-sharding regions (``xs.enable_manual_sharding`` /
``disable_manual_sharding``) give each device its local block, but the result carries no autograd history
("element 0 of tensors does not require grad"), and ``xm.collective_permute`` inside such a region aborts the
process (``std::out_of_range: Span::at failed bounds check``): the replica-based collective does not fit SPMD's one
replica of n partitions.

The step functions below take device tensors already annotated and return unsynced outputs; positions travel
as tensors (never Python ints) so one program serves every device. :func:`permute_traffic` reads the
collective-permutes of either compiler's program.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
import torch_xla.distributed.spmd as xs  # context.gspmd is imported after runtime.setup() (the notebooks' order)
from functorch.compile import default_partition, min_cut_rematerialization_partition
from torch.autograd.function import FunctionCtx
from torch_xla.experimental.scan import scan

from shardlab import runtime
from shardlab.context.attention import shard_sequence, unshard_sequence
from shardlab.expert.gspmd import Reshard
from shardlab.formulas.dtypes import HLO_BYTES
from shardlab.profile.hlo import HloModule

AXIS = "context"
MESH_TEXT = "(data, context) = (n / cp, cp)"
NEG_INF = float("-inf")
SEQ = (None, AXIS, None, None)  # [b, s, h, d] split along the sequence
HEADS = (None, None, AXIS, None)  # [b, s, h, d] split along the heads
ROWS = (AXIS, None, None, None, None)  # [cp, b, s/cp, h, d]: row r on context rank r


def context_mesh(cp: int) -> Any:
    """Mesh (data = n / cp, context = cp) over all devices."""
    n = runtime.current().num_devices
    problem = runtime.axis_problem(cp, n, "cp", MESH_TEXT)
    if problem:
        raise ValueError(problem)
    return runtime.mesh((n // cp, cp), ("data", AXIS))


def mark(t: torch.Tensor, mesh: xs.Mesh, spec: tuple) -> torch.Tensor:
    """``t`` annotated with ``spec`` on ``mesh`` (returned for chaining)."""
    xs.mark_sharding(t, mesh, spec)
    return t


# ------------------------------------------------------------------------------------------ collectives as annotations
class GatherKV(torch.autograd.Function):
    """All-gather CP's collective pair. Forward: a replicated copy of the sequence-sharded k or v (all-gather).
    Backward: the gradient pinned replicated (each device's partial sum, all-reduced), then sequence-sharded
    (the dynamic-slice that makes it a reduce-scatter); ``pin=False`` leaves that choice to the partitioner."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, mesh: xs.Mesh, pin: bool) -> torch.Tensor:
        ctx.mesh, ctx.pin = mesh, pin
        return mark(x * 1.0, mesh, (None,) * x.dim())  # [b, s, hkv, d] on every device

    @staticmethod
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.pin:
            g = mark(g * 1.0, ctx.mesh, (None,) * g.dim())
        return mark(g * 1.0, ctx.mesh, SEQ), None, None  # [b, s/cp, hkv, d]


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """Rows move n places along dim 0 (cyclic): out[r] = x[(r − n) mod rows]."""
    return torch.cat([x[-n:], x[:-n]], dim=0)


class Shift(torch.autograd.Function):
    """The ring step on a stacked axis. Forward: row r receives row r − 1 (one collective-permute when dim 0 is
    sharded). Backward: the opposite shift of the gradient (one collective-permute)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return _shift(x, 1)

    @staticmethod
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        return _shift(g, -1)


# ------------------------------------------------------------------------------------------ attention graphs
def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: xs.Mesh, qpos: torch.Tensor | None,
                        kpos: torch.Tensor | None, pin_grad: bool = True) -> torch.Tensor:
    """q [b, s, hq, d], k, v [b, s, hkv, d] sequence-sharded; positions [s] (q's sharded, k's replicated) or None
    (no mask). Returns out [b, s, hq, d]."""
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    k, v = GatherKV.apply(k, mesh, pin_grad), GatherKV.apply(v, mesh, pin_grad)  # [b, s, hkv, d] everywhere
    qg = q.reshape(b, s, hkv, hq // hkv, d)  # [b, s, hkv, g, d]
    scores = torch.einsum("bqngd,bknd->bngqk", qg, k) / math.sqrt(d)  # [b, hkv, g, s, s]: rows s/cp per device
    if qpos is not None and kpos is not None:
        scores = scores.masked_fill(kpos[None, :] > qpos[:, None], NEG_INF)  # [s, s] from positions: no comm
    out = torch.einsum("bngqk,bknd->bqngd", scores.softmax(dim=-1), v)  # [b, s, hkv, g, d]
    return out.reshape(b, s, hq, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: xs.Mesh,
                      causal: bool) -> torch.Tensor:
    """q [b, s, hq, d], k, v [b, s, hkv, d] sequence-sharded: each re-annotated head-sharded (one all-to-all
    each), attention over the whole sequence per head group, the output re-annotated sequence-sharded."""
    q, k, v = (Reshard.apply(t, mesh, SEQ, HEADS) for t in (q, k, v))  # [b, s, h/cp, d] per device
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    scores = torch.einsum("bqngd,bknd->bngqk", q.reshape(b, s, hkv, hq // hkv, d), k) / math.sqrt(d)
    if causal:
        pos = torch.arange(s, device=q.device)
        scores = scores.masked_fill(pos[None, :] > pos[:, None], NEG_INF)
    out = torch.einsum("bngqk,bknd->bqngd", scores.softmax(dim=-1), v).reshape(b, s, hq, d)
    return Reshard.apply(out, mesh, HEADS, SEQ)


def _block(qg: torch.Tensor, kv: torch.Tensor, qpos: torch.Tensor | None, kpos: torch.Tensor | None,
           batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of every row's queries against the K/V block it holds: qg [cp, b, c, hkv, g, d], kv [cp, 2b, c, hkv,
    d] -> (scores [cp, b, hkv, g, c, c], v [cp, b, c, hkv, d])."""
    k, v = kv[:, :batch], kv[:, batch:]
    scores = torch.einsum("rbqngd,rbknd->rbngqk", qg, k) / math.sqrt(qg.shape[-1])
    if qpos is not None and kpos is not None:
        future = kpos[:, None, :] > qpos[:, :, None]  # [cp, c, c]
        scores = scores.masked_fill(future[:, None, None, None], NEG_INF)
    return scores, v


def _fold(state: tuple[torch.Tensor, ...] | None, scores: torch.Tensor,
          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Online softmax (running max m, denominator l, accumulator acc) with one more block."""
    m_blk = scores.amax(dim=-1)  # [cp, b, hkv, g, c]
    if state is None:
        p = torch.exp(scores - m_blk.unsqueeze(-1))
        return m_blk, p.sum(-1), torch.einsum("rbngqk,rbknd->rbngqd", p, v)
    m, denom, acc = state
    m_new = torch.maximum(m, m_blk)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new.unsqueeze(-1))
    return (m_new, denom * alpha + p.sum(-1),
            acc * alpha.unsqueeze(-1) + torch.einsum("rbngqk,rbknd->rbngqd", p, v))


def _finish(state: tuple[torch.Tensor, ...], heads: int) -> torch.Tensor:
    _, denom, acc = state
    out = acc / denom.unsqueeze(-1)  # [cp, b, hkv, g, c, d]
    cp, b, _, _, c, d = out.shape
    return out.permute(0, 1, 4, 2, 3, 5).reshape(cp, b, c, heads, d)  # [cp, b, c, hq, d]


def ring_attention_unrolled(q: torch.Tensor, kv: torch.Tensor, qpos: torch.Tensor | None,
                            kposs: list[torch.Tensor] | None) -> torch.Tensor:
    """q [cp, b, c, hq, d]; kv [cp, 2b, c, hkv, d] (k rows then v rows); qpos [cp, c]; kposs[t] [cp, c] the key
    positions row r holds at step t (None: no mask). cp steps, cp − 1 shifts. Returns out [cp, b, c, hq, d]."""
    cp, b, c, hq, d = q.shape
    hkv = kv.shape[3]
    qg = q.reshape(cp, b, c, hkv, hq // hkv, d)
    state = None
    for t in range(cp):
        if t:
            kv = Shift.apply(kv)  # one collective-permute: row r now holds rank (r − t)'s block
        scores, v = _block(qg, kv, qpos, kposs[t] if kposs else None, b)
        state = _fold(state, scores, v)
    return _finish(state, hq)


def ring_attention_scan(q: torch.Tensor, kv: torch.Tensor, qpos: torch.Tensor | None,
                        kposs: torch.Tensor | None, remat: bool = False) -> torch.Tensor:
    """As :func:`ring_attention_unrolled`, steps 1 … cp − 1 inside torch_xla's ``scan`` (kposs [cp, cp, c] float
    positions, or None; ``remat``: the backward recomputes what the min-cut partition chooses instead of
    saving it). Returns out [cp, b, c, hq, d]."""
    cp, b, c, hq, d = q.shape
    hkv = kv.shape[3]
    qg = q.reshape(cp, b, c, hkv, hq // hkv, d)
    causal = qpos is not None
    state = _fold(None, *_block(qg, kv, qpos, kposs[0] if causal else None, b))
    if cp == 1:
        return _finish(state, hq)

    def step(carry: tuple[torch.Tensor, ...], kpos: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], None]:
        qg_, qpos_, m, denom, acc, kv_ = carry  # scan's body must be pure: q and positions ride in the carry
        kv_ = Shift.apply(kv_)
        new = _fold((m, denom, acc), *_block(qg_, kv_, qpos_ if causal else None, kpos if causal else None, b))
        return (qg_, qpos_, *new, kv_), None

    qpos_carry = qpos if causal else torch.zeros(cp, c, device=q.device, dtype=q.dtype)
    xs = kposs[1:] if causal else torch.zeros(cp - 1, cp, c, device=q.device, dtype=q.dtype)
    partition = min_cut_rematerialization_partition if remat else default_partition
    carry, _ = scan(step, (qg, qpos_carry, *state, kv), xs, partition_fn=partition)
    return _finish(carry[2:5], hq)


# ------------------------------------------------------------------------------------------ layouts
def stack_rows(x: torch.Tensor, layout: str, cp: int) -> torch.Tensor:
    """[b, s, ...] -> [cp, b, s/cp, ...]: row r = rank r's chunks (``layout``)."""
    return torch.stack([shard_sequence(x, layout, r, cp) for r in range(cp)])


def unstack_rows(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The inverse of :func:`stack_rows`: [cp, b, s/cp, ...] -> [b, s, ...]."""
    return unshard_sequence(list(x.unbind(0)), layout)


# ------------------------------------------------------------------------------------------ reading the programs
def permute_traffic(module: HloModule) -> dict[str, Any]:
    """The collective-permutes of a partitioned program (XLA:CPU or XLA:TPU):

    ``count`` instructions (logical, start/done folded), ``operands`` the arrays they carry (> count: combined) and
    their per-device ``bytes``; ``executed`` with each counted as often as its computation runs (a ``while`` body:
    trip count times); ``sent_elements`` / ``sent_bytes`` — what one device sends on average per execution of the
    program (Σ runs · source-target pairs · operand size / devices), the numbers to hold against the formula's
    per-rank traffic (XLA:TPU moves the forward's K/V in bf16 and may split a cyclic permute into several with
    fewer pairs: elements still agree); ``pairs`` ``{source-target pairs: permutes with that many}``; ``dtypes`` the
    element types seen; ``async`` how many are start/done pairs; ``loops`` ``[(while, trip count)]``. Executed
    and sent values are None when a loop's trip count is unknown."""
    perms = [c for c in module.collectives if c.op == "collective-permute"]
    runs = [module.runs(c.computation) for c in perms]
    known = all(r is not None for r in runs)

    def sent(size: list[int]) -> int | float | None:
        if not known:
            return None
        total = sum(r * len(c.source_target_pairs) * n for r, c, n in zip(runs, perms, size, strict=True))
        return total // module.num_partitions if total % module.num_partitions == 0 else total / module.num_partitions

    return {
        "count": len(perms), "operands": sum(c.operands for c in perms), "bytes": sum(c.operand_bytes for c in perms),
        "executed": sum(runs) if known else None,
        "sent_elements": sent([c.operand_bytes // HLO_BYTES[c.dtype] for c in perms]),
        "sent_bytes": sent([c.operand_bytes for c in perms]),
        "pairs": dict(sorted(Counter(len(c.source_target_pairs) for c in perms).items(), reverse=True)),
        "dtypes": sorted({c.dtype for c in perms}), "async": sum(c.async_ for c in perms),
        "loops": [(w.name, module.trip_count(w.name)) for w in module.while_loops],
    }
