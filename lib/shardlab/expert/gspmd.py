"""Expert parallelism as GSPMD annotations: GShard's dispatch / combine einsums with experts on an `expert` axis.

Design note
-----------
GShard (Lepikhin et al. 2020) §2.2 writes the MoE layer as dense einsums and lets the SPMD partitioner place the
communication. Mesh (data = n / ep, expert = ep); one routing group per device (G = n groups of S tokens)::

    x          [G, S, h]      (("data", "expert"), None, None)   tokens: every device one group
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

:func:`build_graph` returns ``[y, dx, dW_r, dW1, dW3, dW2]`` (or ``[y]``) unsynced, for
``shardlab.profile.capture_hlo`` and ``shardlab.profile.tpu.compile_program``; :func:`oracle` is the dense
answer of ``shardlab.expert.moe`` with the same groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardlab import runtime
from shardlab.expert.moe import MoE, MoEConfig, dispatch_tensors, moe_reference, router_probs, top_k_gates

AXIS = "expert"
DATA = "data"
PARAMS = ("router", "w1", "w3", "w2")


@dataclass(frozen=True)
class EPGraphConfig:
    """One MoE layer under expert parallelism, as a GSPMD program."""

    tokens: int = 512  # T, all devices together (G = n groups of T / n)
    hidden: int = 64  # h
    ffn: int = 128  # f
    experts: int = 8  # E
    top_k: int = 2  # k
    capacity_factor: float = 1.25  # C = ceil(cf·k·S/E) per group
    normalize: bool = True
    ep: int = 8  # size of the expert axis (mesh: data = n / ep, expert = ep)
    backward: bool = True
    dtype: str = "float32"
    seed: int = 0
    placeholders: bool = False  # compile-only inputs (nothing allocated; the graph must never run)

    @property
    def moe(self) -> MoEConfig:
        return MoEConfig(self.hidden, self.ffn, self.experts, self.top_k, self.capacity_factor, self.normalize)

    def validate(self, devices: int) -> EPGraphConfig:
        if self.capacity_factor is None:
            raise ValueError("capacity_factor=None (dropless) has data-dependent buffer sizes: a static XLA program "
                             "needs a capacity factor")
        self.moe  # noqa: B018 — validates the layer's sizes
        for name in ("tokens", "ep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        problem = runtime.axis_problem(self.ep, devices, "ep", "(data, expert) = (n / ep, ep)")
        if problem:
            raise ValueError(problem)
        if self.experts % self.ep:
            raise ValueError(f"experts={self.experts} is not divisible by ep={self.ep}")
        if self.tokens % devices:
            raise ValueError(f"tokens={self.tokens} is not divisible by the {devices} devices (one group each)")
        return self


def expert_mesh(ep: int) -> Any:
    """Mesh (data = n / ep, expert = ep) over all devices."""
    n = runtime.current().num_devices
    problem = runtime.axis_problem(ep, n, "ep", "(data, expert) = (n / ep, ep)")
    if problem:
        raise ValueError(problem)
    return runtime.mesh((n // ep, ep), (DATA, AXIS))


def _mark(t: torch.Tensor, mesh: Any, spec: tuple) -> torch.Tensor:
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(t, mesh, spec)
    return t


class Reshard(torch.autograd.Function):
    """A tensor pinned to one sharding, then annotated with another: one all-to-all when the sharded dimension
    changes. Forward: ``src`` -> ``dst``. Backward: the gradient pinned to ``dst``, then re-annotated ``src``
    (the reverse all-to-all). Pinning both sides keeps the partitioner from moving something else instead."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: Any, src: tuple, dst: tuple) -> torch.Tensor:
        ctx.mesh, ctx.src, ctx.dst = mesh, src, dst
        return _mark(_mark(x * 1.0, mesh, src) * 1.0, mesh, dst)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _mark(_mark(g * 1.0, ctx.mesh, ctx.dst) * 1.0, ctx.mesh, ctx.src), None, None, None


BY_GROUP = (None, (DATA, AXIS), None, None)  # [E, G, C, h] with the groups where the tokens are
BY_EXPERT = (AXIS, DATA, None, None)  # [E, G, C, h] with the experts' shards


def gshard_moe(x: torch.Tensor, router: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
               cfg: MoEConfig, mesh: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GShard's MoE layer: x [G, S, h] -> (y [G, S, h], loads [G, E]). Annotations as in the module note."""
    g, s, _ = x.shape
    probs = router_probs(x, router)  # [G, S, E]
    _, experts = top_k_gates(probs.detach(), cfg.top_k, cfg.normalize)  # [G, S, k] expert ids only
    # the gates read by a one-hot product, not top-k's values: top-k's backward is a scatter, which XLA:TPU
    # partitioned by all-gathering its indices and updates over every device (measured); this has none
    pick = (experts.unsqueeze(-1) == torch.arange(cfg.experts, device=x.device)).to(probs.dtype)  # [G, S, k, E]
    gates = (pick * probs.unsqueeze(-2)).sum(-1)  # [G, S, k]: exactly the chosen probabilities
    if cfg.normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    d = dispatch_tensors(gates, experts, cfg.experts, cfg.capacity(s))
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
    return y, d.loads


def layer(cfg: EPGraphConfig) -> MoE:
    """The layer's weights, seeded (the same for the graph and the oracle)."""
    return MoE(cfg.moe, torch.Generator().manual_seed(cfg.seed)).to(getattr(torch, cfg.dtype))


def inputs(cfg: EPGraphConfig, groups: int) -> dict[str, torch.Tensor]:
    """x and grad_out [G, S, h] on the CPU (seeded; ``meta`` tensors with placeholders)."""
    shape = (groups, cfg.tokens // groups, cfg.hidden)
    dt = getattr(torch, cfg.dtype)
    if cfg.placeholders:
        return {n: torch.empty(shape, dtype=dt, device="meta") for n in ("x", "grad_out")}
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return {n: torch.randn(shape, generator=g).to(dt) for n in ("x", "grad_out")}


def _device(t: torch.Tensor, cfg: EPGraphConfig, mesh: Any, spec: tuple, grad: bool) -> torch.Tensor:
    if cfg.placeholders:  # annotate a value computed from the placeholder, never the placeholder itself
        from torch_xla.core.xla_builder import create_placeholder_tensor

        x = create_placeholder_tensor(tuple(t.shape), t.dtype) * 1
    else:
        x = t.detach().to(runtime.device())
    x = _mark(x, mesh, spec)
    return x.detach().requires_grad_(grad) if grad else x


def build_graph(cfg: EPGraphConfig) -> list[torch.Tensor]:
    """The step on the current device world: ``[y, dx, dW_r, dW1, dW3, dW2]`` (``[y]`` without backward)."""
    n = runtime.current().num_devices
    cfg.validate(n)
    mesh = expert_mesh(cfg.ep)
    data, moe = inputs(cfg, n), layer(cfg)
    tokens = ((DATA, AXIS), None, None)
    x = _device(data["x"], cfg, mesh, tokens, cfg.backward)
    specs = {"router": (None, None), "w1": (AXIS, None, None), "w3": (AXIS, None, None), "w2": (AXIS, None, None)}
    params = {p: _device(getattr(moe, p), cfg, mesh, specs[p], cfg.backward) for p in PARAMS}
    y, _ = gshard_moe(x, params["router"], params["w1"], params["w3"], params["w2"], cfg.moe, mesh)
    y = _mark(y, mesh, tokens)
    if not cfg.backward:
        return [y]
    (y * _device(data["grad_out"], cfg, mesh, tokens, False)).sum().backward()
    return [y, x.grad, *(params[p].grad for p in PARAMS)]


def oracle(cfg: EPGraphConfig, groups: int) -> list[torch.Tensor]:
    """The dense layer (``moe_reference``, one routing group per device): [y, dx, dW_r, dW1, dW3, dW2]."""
    data, moe = inputs(cfg, groups), layer(cfg)
    x = data["x"].reshape(cfg.tokens, cfg.hidden).clone().requires_grad_(cfg.backward)
    y = moe_reference(x, moe, groups).out
    if not cfg.backward:
        return [y.reshape(data["x"].shape).detach()]
    (y * data["grad_out"].reshape(y.shape)).sum().backward()
    return [y.reshape(data["x"].shape).detach(), x.grad.reshape(data["x"].shape),
            *(getattr(moe, p).grad for p in PARAMS)]


# ------------------------------------------------------------------------------------------ reading the programs
def all_to_all_traffic(module: Any) -> dict[str, Any]:
    """The all-to-alls of a partitioned program: ``count``, per-device operand ``bytes`` and ``elements`` (XLA:TPU
    moves them in bf16 where XLA:CPU keeps f32: compare elements), ``group_size``s, ``dtypes``, ``async``."""
    from shardlab.dtypes import HLO_BYTES

    a2a = [c for c in module.collectives if c.op == "all-to-all"]
    return {"count": len(a2a), "bytes": sum(c.operand_bytes for c in a2a),
            "elements": sum(c.operand_bytes // HLO_BYTES[c.dtype] for c in a2a),
            "group_sizes": sorted({c.group_size for c in a2a}), "dtypes": sorted({c.dtype for c in a2a}),
            "async": sum(c.async_ for c in a2a)}


def expert_weight_bytes(module: Any, cfg: EPGraphConfig, devices: int) -> int:
    """Per-device bytes of the expert weights among the program's entry parameters: the arrays shaped
    [E/ep, h, f] or [E/ep, f, h] (W1, W3, W2). Refuses a configuration where the tokens' per-device shape
    [1, S, h] looks like an expert weight (E/ep = 1 and S = f or h)."""
    e_loc = cfg.experts // cfg.ep
    shapes = {(e_loc, cfg.hidden, cfg.ffn), (e_loc, cfg.ffn, cfg.hidden)}
    if (1, cfg.tokens // devices, cfg.hidden) in shapes:
        raise ValueError(f"tokens per device {cfg.tokens // devices} x hidden {cfg.hidden} has an expert weight's "
                         f"shape {sorted(shapes)}: the parameters cannot be told apart by shape")
    return sum(a.nbytes for i in module.instructions.values()
               if i.opcode == "parameter" and i.computation == module.entry for a in i.shape if a.dims in shapes)
