"""Expert parallelism as GSPMD annotations: GShard's dispatch / combine einsums with experts on an `expert` axis.

Design note
-----------
GShard (Lepikhin et al. 2020) §2.2 writes the MoE layer as dense einsums and lets the SPMD partitioner place the
communication. Mesh (data = n / ep, expert = ep); one routing group per device (G = n groups of S tokens)::

    x          [G·S, h]       (("data", "expert"), None)         tokens: every device one group of S
    W_r        [h, E]         replicated                          router
    W1, W3     [E, h, f]      ("expert", None, None)              E/ep experts per device
    W2         [E, f, h]      ("expert", None, None)
    mask, combine [G, S, E, C]  (moe.dispatch_tensors: top-k, cumulative-sum slots, capacity C)
    dispatched = einsum("gsec,gsh->egch")   pinned by group, re-annotated ("expert", "data", None, None) -> all-to-all
    h = SwiGLU per expert: einsum("egch,ehf->egcf") ...                                                (local)
    back       = out pinned by expert, re-annotated (None, ("data", "expert"), None, None)      -> all-to-all
    y          = einsum("gsec,egch->gsh", combine, back)                                               (local)

``dispatched`` is computed where its group's tokens are (sharded on g); annotating it sharded on e instead is a
reshard from one dimension to another, which the partitioner emits as **one all-to-all** within each group of
ep devices (the expert axis), and the combine's reshard back is the second (:class:`Reshard`, which pins both
sides, in both directions). Measured without the pins (8 devices, S = 16, h = 32): the partitioner moved the
dispatch *mask* with an all-to-all, all-gathered the tokens x within the expert axis and the expert ids (s64)
instead — fine at that size, O(S·h·ep) per device as h grows; on mesh (2, 4) its backward replicated a tensor
("Involuntary full rematerialization") and added five all-gathers. Per device each moves
[E, G/n, C, h] = E·C·h·e bytes — the ledger's payload (``formulas.expert.all_to_all``). The backward adds the
same two for the gradients, the all-reduce of the replicated router's gradient over all devices, and, with a
data axis (n / ep > 1), the all-reduce of the expert weights' gradients over it.

Only the capacity-factor layer exists here: the dropless variant sizes its buffers by the largest load, a
data-dependent shape a static XLA program cannot have.

:func:`step` builds the layer of notebook 11's parameters ``p`` (tokens x [G·S, h], one group of S = ``p.tokens`` per
device, reshaped to [G, S, h] inside: no per-device array of the tokens has an expert weight's three dimensions)
and returns ``[y, dx, dW_r, dW1, dW3, dW2]`` (``[y]`` forward only) unsynced; ``shardlab.expert.case.MoECase`` runs
it through the harness and checks it against the dense oracle of ``shardlab.expert.moe`` with the same groups.
Measured: making the groups' kept-assignment counts [G] an output as well (sharding annotated or not) made XLA:TPU
all-gather the tokens over every device and the expert weights within each expert group — the routing is read
from the outputs' agreement with the oracle instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_xla.distributed.spmd as xs  # expert.gspmd is imported after runtime.setup() (the notebooks' order)
from torch.autograd.function import FunctionCtx

from shardlab import runtime
from shardlab.expert.moe import capacity, dispatch_tensors, inputs, layer, router_probs, top_k_gates
from shardlab.expert.params import ExpertParams
from shardlab.formulas.dtypes import HLO_BYTES
from shardlab.models import loss
from shardlab.profile.hlo import HloModule

AXIS = "expert"
DATA = "data"
PARAMS = ("router", "w1", "w3", "w2")
TOKENS = ((DATA, AXIS), None)  # x, y [G·S, h]: every device one group of S tokens


def expert_mesh(ep: int) -> Any:
    """Mesh (data = n / ep, expert = ep) over all devices."""
    n = runtime.current().num_devices
    problem = runtime.axis_problem(ep, n, "ep", "(data, expert) = (n / ep, ep)")
    if problem:
        raise ValueError(problem)
    return runtime.mesh((n // ep, ep), (DATA, AXIS))


def _mark(t: torch.Tensor, mesh: xs.Mesh, spec: tuple) -> torch.Tensor:
    xs.mark_sharding(t, mesh, spec)
    return t


class Reshard(torch.autograd.Function):
    """A tensor pinned to one sharding, then annotated with another: one all-to-all when the sharded dimension
    changes. Forward: ``src`` -> ``dst``. Backward: the gradient pinned to ``dst``, then re-annotated ``src``
    (the reverse all-to-all). Pinning both sides keeps the partitioner from moving something else instead."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, mesh: xs.Mesh, src: tuple, dst: tuple) -> torch.Tensor:
        ctx.mesh, ctx.src, ctx.dst = mesh, src, dst
        return _mark(_mark(x * 1.0, mesh, src) * 1.0, mesh, dst)

    @staticmethod
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _mark(_mark(g * 1.0, ctx.mesh, ctx.dst) * 1.0, ctx.mesh, ctx.src), None, None, None


BY_GROUP = (None, (DATA, AXIS), None, None)  # [E, G, C, h] with the groups where the tokens are
BY_EXPERT = (AXIS, DATA, None, None)  # [E, G, C, h] with the experts' shards


def gshard_moe(x: torch.Tensor, router: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
               p: ExpertParams, mesh: xs.Mesh) -> torch.Tensor:
    """GShard's MoE layer: x [G·S, h] -> y [G·S, h]. Annotations as in the module note; routing by ``p`` (top_k,
    capacity_factor, normalize)."""
    s = p.tokens
    g = x.shape[0] // s
    x = x.reshape(g, s, -1)  # [G, S, h]: splits the sharded token dim at group boundaries (local)
    probs = router_probs(x, router)  # [G, S, E]
    _, experts = top_k_gates(probs.detach(), p.top_k, p.normalize)  # [G, S, k] expert ids only
    # the gates read by a one-hot product, not top-k's values: top-k's backward is a scatter, which XLA:TPU
    # partitioned by all-gathering its indices and updates over every device (measured); this has none
    pick = (experts.unsqueeze(-1) == torch.arange(p.experts, device=x.device)).to(probs.dtype)  # [G, S, k, E]
    gates = (pick * probs.unsqueeze(-2)).sum(-1)  # [G, S, k]: exactly the chosen probabilities
    if p.normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    d = dispatch_tensors(gates, experts, p.experts, capacity(p, s))
    tokens = ((DATA, AXIS), None, None, None)
    mask = _mark(d.mask.to(x.dtype), mesh, tokens)  # [G, S, E, C], computed where the group lives
    combine = _mark(d.combine.to(x.dtype), mesh, tokens)
    dispatched = torch.einsum("gsec,gsh->egch", mask, x)  # [E, G, C, h] (local: each device its group)
    dispatched = Reshard.apply(dispatched, mesh, BY_GROUP, BY_EXPERT)  # all-to-all over the expert axis
    hidden = torch.nn.functional.silu(torch.einsum("egch,ehf->egcf", dispatched, w1)) \
        * torch.einsum("egch,ehf->egcf", dispatched, w3)  # [E, G, C, f] (local: each device its experts)
    out = torch.einsum("egcf,efh->egch", hidden, w2)  # [E, G, C, h]
    back = Reshard.apply(out, mesh, BY_EXPERT, BY_GROUP)  # all-to-all back to the tokens' devices
    y = torch.einsum("gsec,egch->gsh", combine, back)  # [G, S, h] (local)
    return y.reshape(g * s, -1)


def _device(t: torch.Tensor, mesh: xs.Mesh, spec: tuple, grad: bool) -> torch.Tensor:
    x = _mark(t.detach().to(runtime.device()), mesh, spec)  # created on the CPU, moved, then annotated
    return x.detach().requires_grad_(grad) if grad else x


def step(p: ExpertParams, backward: bool = True) -> list[torch.Tensor]:
    """The step on the current device world (one group per device), NOT synced: forward and backward of
    ½‖y − target‖² (``models.loss``: the output gradient depends on y, so the backward's first all-to-all
    waits for the forward's last), ``[y, dx, dW_r, dW1, dW3, dW2]`` (``[y]`` without backward)."""
    n = runtime.current().num_devices
    mesh = expert_mesh(p.ep)
    moe = layer(p)
    x_cpu, target = inputs(p, n)
    x = _device(x_cpu, mesh, TOKENS, backward)
    specs = {"router": (None, None), "w1": (AXIS, None, None), "w3": (AXIS, None, None), "w2": (AXIS, None, None)}
    params = {name: _device(getattr(moe, name), mesh, specs[name], backward) for name in PARAMS}
    y = _mark(gshard_moe(x, params["router"], params["w1"], params["w3"], params["w2"], p, mesh), mesh, TOKENS)
    if not backward:
        return [y]
    loss(y, _device(target, mesh, TOKENS, False)).backward()
    return [y, x.grad, *(params[name].grad for name in PARAMS)]


# ------------------------------------------------------------------------------------------ reading the programs
def all_to_all_traffic(module: HloModule) -> dict[str, Any]:
    """The all-to-alls of a partitioned program: ``count``, per-device operand ``bytes`` and ``elements`` (XLA:TPU
    moves them in bf16 where XLA:CPU keeps f32: compare elements), ``group_sizes``, ``dtypes``, ``async`` (issued
    by a start and completed by a done), ``operands`` (logical all-to-alls carried: > count when the compiler
    combined some; XLA:CPU's tuple form, one chunk per destination, is one — ``shardlab.profile.hlo``), ``forms``."""
    a2a = [c for c in module.collectives if c.op == "all-to-all"]
    return {"count": len(a2a), "bytes": sum(c.operand_bytes for c in a2a),
            "elements": sum(c.operand_bytes // HLO_BYTES[c.dtype] for c in a2a),
            "group_sizes": sorted({c.group_size for c in a2a}), "dtypes": sorted({c.dtype for c in a2a}),
            "async": sum(c.async_ for c in a2a), "operands": sum(c.operands for c in a2a),
            "forms": sorted({c.form for c in a2a})}


def expert_weight_bytes(module: HloModule, p: ExpertParams) -> int:
    """Per-device bytes of the expert weights among the program's entry parameters: the arrays shaped
    [E/ep, h, f] or [E/ep, f, h] (W1, W3, W2). Nothing else enters with three dimensions: tokens are [S, h]."""
    e_loc = p.experts // p.ep
    shapes = {(e_loc, p.hidden, p.ffn), (e_loc, p.ffn, p.hidden)}
    return sum(a.nbytes for i in module.instructions.values()
               if i.opcode == "parameter" and i.computation == module.entry for a in i.shape if a.dims in shapes)
