"""Expert parallelism per rank: tokens travel to their experts' rank and back with two all-to-alls.

Design note
-----------
GShard (Lepikhin et al. 2020) §3: ep ranks, E experts, rank j holds experts [j·E/ep, (j+1)·E/ep). Each rank
holds one group of S tokens (its slice of the batch) and a replica of the router::

    route            gates, experts = top_k(softmax(x W_r))                         x [S, h] -> [S, k]
    pack             mask, combine [S, E, C] (``moe.dispatch_tensors``); buf = einsum("sec,sh->ech")   [E, C, h]
    dispatch   a2a   expert block j of buf goes to rank j:  recv [ep · E/ep, C, h] = (source rank, local expert)
    experts          each local expert runs on the ep·C rows it received                [E/ep, ep·C, h]
    combine    a2a   the outputs go back to the source ranks:       back [E, C, h] in global expert order
    unpack           y = einsum("sec,ech->sh", combine, back)                                        [S, h]

:func:`all_to_all` is the collective as an autograd function ("forward: all-to-all, backward: all-to-all" — an
all-to-all with equal chunks is its own transpose: the gradient of the chunk rank i received from rank j goes
back from i to j), so the backward issues the same two all-to-alls of the gradients, in reverse order. The
router's gradient flows through the combine weights (the gates); top-k itself has no gradient. Each rank's
router gradient covers its own tokens only: in training they are summed over the ranks (the data-parallel
all-reduce of replicated weights, not counted here); the expert gradients are complete where they live.

Capacity: C = ceil(cf · k · S / E) per rank (``moe.capacity``). Dropless (``dropless=True``): this code's
all-to-all has equal chunks, so every rank must send buffers of the same C: C = the largest load of any expert on
any rank, agreed with one all-reduce (max) of a scalar before the dispatch — the buffers grow with the worst
imbalance. That padding is the equal-chunk collective's, not dropless routing's: an all-to-all with variable splits
(Megatron-Core's token dispatcher: exchange the counts first, then ``all_to_all_single`` with split sizes) moves
only the kept rows; MegaBlocks removes the padding from the expert compute (block-sparse matmuls).

Tags: ``ep.capacity`` (dropless only), ``ep.dispatch``, ``ep.combine``.

Example (dense oracle with one routing group per rank; tests and notebook compare)::

    results = SimulatedWorld(4).run(moe_step, moe, x, target)      # moe: expert.moe.MoE, x: [T, h]
    torch.cat([r["out"] for r in results]) == moe_reference(x, moe, groups=4).out
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import FunctionCtx

from shardlab.comm import Comm
from shardlab.expert.moe import MoE, capacity, dispatch_tensors, expert_ffn, router_probs, top_k_gates
from shardlab.expert.params import ExpertParams
from shardlab.models import loss


class _AllToAll(torch.autograd.Function):
    """Forward: all-to-all along ``dim``. Backward: the same all-to-all of the gradient."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, comm: Comm, dim: int, tag: str) -> torch.Tensor:
        ctx.comm, ctx.dim, ctx.tag = comm, dim, tag
        return comm.all_to_all(x, dim, tag=tag)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return ctx.comm.all_to_all(grad.contiguous(), ctx.dim, tag=ctx.tag), None, None, None


def all_to_all(x: torch.Tensor, comm: Comm, dim: int = 0, tag: str = "") -> torch.Tensor:
    """Differentiable ``comm.all_to_all``: chunk j of x along ``dim`` goes to rank j (ep = 1: x itself)."""
    return x if comm.world_size == 1 else _AllToAll.apply(x, comm, dim, tag)


def expert_range(experts: int, ep: int, rank: int) -> range:
    """The global ids of the experts rank ``rank`` holds."""
    if experts % ep:
        raise ValueError(f"experts={experts} is not divisible by ep={ep} (each rank holds E/ep whole experts)")
    n = experts // ep
    return range(rank * n, (rank + 1) * n)


def expert_parallel_moe(x: torch.Tensor, router: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                        w2: torch.Tensor, comm: Comm, p: ExpertParams,
                        dropless: bool = False) -> tuple[torch.Tensor, dict[str, Any]]:
    """This rank's MoE output for its tokens x [S, h]; w1/w3 [E/ep, h, f], w2 [E/ep, f, h] are its experts;
    the routing rule is ``p``'s (top_k, capacity_factor, normalize; ``dropless``: no capacity).
    Returns (y [S, h], routing facts: capacity, loads [E], kept assignments, dropped assignments)."""
    ep = comm.world_size
    s, h = x.shape
    e_all, e_loc = p.experts, w1.shape[0]
    if e_loc * ep != e_all:
        raise ValueError(f"this rank holds {e_loc} experts; ep={ep} ranks must hold experts={e_all} in all")
    gates, experts = top_k_gates(router_probs(x, router), p.top_k, p.normalize)  # [S, k] each
    if dropless:  # one C for every rank = the largest load anywhere
        loads = torch.bincount(experts.flatten(), minlength=e_all)
        c = int(comm.all_reduce(loads.max().reshape(1).float(), op="max", tag="ep.capacity").item())
    else:
        c = capacity(p, s)
    d = dispatch_tensors(gates[None], experts[None], e_all, c)  # G = 1: this rank's group
    buf = torch.einsum("sec,sh->ech", d.mask[0].to(x.dtype), x)  # [E, C, h]
    recv = all_to_all(buf, comm, 0, "ep.dispatch")  # [ep · E/ep, C, h]: rows (source rank, local expert)
    rows = recv.reshape(ep, e_loc, c, h).transpose(0, 1).reshape(e_loc, ep * c, h)  # per local expert
    out = torch.stack([expert_ffn(rows[i], w1[i], w3[i], w2[i]) for i in range(e_loc)])  # [E/ep, ep·C, h]
    back = out.reshape(e_loc, ep, c, h).transpose(0, 1).reshape(e_all, c, h)  # blocks for source ranks
    home = all_to_all(back, comm, 0, "ep.combine")  # [E, C, h]: this rank's tokens, global expert order
    y = torch.einsum("sec,ech->sh", d.combine[0].to(x.dtype), home)  # [S, h]
    kept = int(d.kept.sum())
    return y, {"capacity": c, "loads": d.loads[0].tolist(), "kept": kept, "dropped": s * p.top_k - kept}


def moe_step(comm: Comm, dense: MoE, x: torch.Tensor, target: torch.Tensor | None = None,
             dropless: bool = False) -> dict[str, Any]:
    """One forward (+ backward of ½‖y − target‖², ``models.loss``, summed over the ranks' rows) on this rank.
    x, target: the FULL [T, h]; rank r
    takes rows r·T/ep … (r+1)·T/ep and experts ``expert_range``. Returns its output, input gradient, router
    gradient (its tokens' share), its experts' gradients, the bytes of its expert weights and the routing facts."""
    ep, r = comm.world_size, comm.rank
    t = x.shape[0]
    if t % ep:
        raise ValueError(f"tokens={t} is not divisible by ep={ep} (one equal group per rank)")
    mine = expert_range(dense.p.experts, ep, r)
    want_grad = target is not None
    router = dense.router.detach().clone().requires_grad_(want_grad)
    w1, w3, w2 = (p.detach()[mine.start:mine.stop].clone().requires_grad_(want_grad)
                  for p in (dense.w1, dense.w3, dense.w2))
    xl = x.chunk(ep, dim=0)[r].detach().clone().requires_grad_(want_grad)  # [S, h]
    y, facts = expert_parallel_moe(xl, router, w1, w3, w2, comm, dense.p, dropless)
    if want_grad:
        loss(y, target.chunk(ep, dim=0)[r]).backward()
    return {"out": y.detach(), "grad_x": xl.grad, "grad_router": router.grad,
            "grads": {"w1": w1.grad, "w3": w3.grad, "w2": w2.grad}, "experts": list(mine),
            "expert_bytes": sum(w.numel() * w.element_size() for w in (w1, w3, w2)), **facts}
