"""A FlatParameter FSDP unit (FULL_SHARD / ZeRO-3) over a ``shardlab.comm`` Comm, written per rank.

Design note
-----------
``FlatUnit(module, comm)`` does what PyTorch FSDP1's ``FlatParamHandle`` + runtime hooks do, in ~200 lines:

1. *Flatten + shard* (``__init__``): concatenate the parameters in ``flat_param.module_params`` order with
   alignment padding (``plan_flat_shards_for``), zero-pad to n_pad = N·c and keep only this rank's slice
   ``self.shard`` [c]. The module's parameters are de-registered; from now on they are views.
2. *Unshard before forward* (``forward``): ``all_gather(shard) -> [n_pad]`` into ``self._full`` (whose storage
   is reallocated), ``flat = leaf [n_pad] requires_grad``; every parameter becomes a view
   ``flat[start:start+numel].view(shape)`` (shared parameters: the same view at every registration).
3. *Free after forward* (``reshard_after_forward``): ``_full``'s storage is resized to 0 — autograd's saved
   views now point at nothing. PyTorch's rule, which is the default here: every unit reshards after forward
   EXCEPT the root (the outermost unit, the first whose forward runs): its parameters would be all-gathered
   again at once for the backward, so FSDP1 (``_post_forward_reshard``: ``not state._is_root``) and FSDP2
   (the root's ``post_forward_mesh_info = None``) keep them. A model that is one root unit therefore issues
   ONE all-gather per step.
4. *Unshard before backward*: a hook on the unit's output (fires when its gradient is ready, i.e. before
   the module's own backward nodes run) reallocates the storage and all-gathers into it again — only if
   step 3 freed it.
5. *Reduce-scatter after backward*: a post-accumulate-grad hook on ``flat`` reduce-scatters ``flat.grad``
   [n_pad] -> [c], divides by N (average over data-parallel ranks) and accumulates into ``shard.grad``; then
   the unsharded parameter and gradient are freed.
6. *Optimizer on the shard*: ``ShardSGD`` / ``ShardAdam`` update the [c] shard only. Padding stays inert:
   its gradient is always zero (never read by the module), so SGD and Adam leave it unchanged.

Nesting, as with PyTorch's auto-wrap: wrap submodules first, then the whole model; the outer unit flattens
only the parameters no inner unit owns. Per step the ledger shows exactly, per unit: forward all-gather
(payload c·e), backward all-gather (c·e; non-root units only), backward reduce-scatter (n_pad·e) —
``formulas.fsdp.flat_step_comm(..., root=...)`` — in the order PyTorch FSDP1 issues them on gloo (tested
against its collectives).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from shardlab.comm import Comm
from shardlab.fsdp.flat_param import (
    FLAT_PARAM_PADDING_VALUE,
    FlatShardPlan,
    module_params,
    owned_modules,
    plan_flat_shards_for,
)

_RUNNING = threading.local()  # per thread (= per SimulatedWorld rank): units whose forward is running


def _registrations(module: nn.Module, ignored: tuple[nn.Module, ...]) -> dict[int, list[tuple[nn.Module, str]]]:
    """id(param) -> every (submodule, attribute name) that registers it (shared params: several), outside the
    subtrees of ``ignored`` (inner units own those)."""
    regs: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in owned_modules(module, ignored):
        for name, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            if (mod, name) not in regs.setdefault(id(p), []):
                regs[id(p)].append((mod, name))
    return regs


class FlatUnit(nn.Module):
    """FULL_SHARD wrapper of ``module`` for one rank of ``comm``; ``plan`` (optional) must match it.

    ``reshard_after_forward``: None = PyTorch's rule (non-root units free after forward, the root does not);
    True / False force it. Inner FlatUnits inside ``module`` keep their own parameters."""

    def __init__(
        self, module: nn.Module, comm: Comm, use_orig_params: bool = False, plan: FlatShardPlan | None = None,
        reshard_after_forward: bool | None = None,
    ) -> None:
        super().__init__()
        inner = tuple(m for m in module.modules() if isinstance(m, FlatUnit))
        params = module_params(module, inner)  # errors: no params, non-float, mixed dtypes
        mine = plan_flat_shards_for(module, comm.world_size, use_orig_params=use_orig_params, ignored=inner)
        if plan is not None and plan != mine:
            raise ValueError(
                f"plan does not match the module: plan numels={list(plan.numels)}, world_size={plan.world_size}, "
                f"align={plan.align}; module numels={list(mine.numels)}, world_size={comm.world_size}, "
                f"align={mine.align}"
            )
        self.plan, self.comm = mine, comm
        self.module = module
        self.reshard_after_forward = reshard_after_forward
        self.is_root: bool | None = None  # decided at the first forward, like PyTorch's lazy init
        dtype = params[0][1].dtype
        self.names = [n for n, _ in params]
        self.shapes = [tuple(p.shape) for _, p in params]
        regs = _registrations(module, inner)
        self._regs = [regs[id(p)] for _, p in params]
        # 1. flatten (alignment padding = named fill value), zero-pad to n_pad, keep this rank's slice
        full = torch.zeros(mine.padded_numel, dtype=dtype)  # [n_pad]
        for seg in mine.segments:
            if seg.kind == "param":
                full[seg.start : seg.start + seg.numel] = params[seg.param_index][1].detach().reshape(-1)
            else:
                full[seg.start : seg.start + seg.numel] = FLAT_PARAM_PADDING_VALUE
        c, r = mine.shard_numel, comm.rank
        self.shard = nn.Parameter(full[r * c : (r + 1) * c].clone())  # [c]
        for reg in self._regs:  # de-register: parameters become views into the unsharded flat parameter
            for mod, name in reg:
                del mod._parameters[name]
                setattr(mod, name, None)
        self._full = torch.empty(mine.padded_numel, dtype=dtype)  # all-gather destination; storage freed when idle
        self._free_storage(self._full)
        self._flat: torch.Tensor | None = None
        self._regathered = False
        self.peak_unsharded_bytes = 0  # largest unsharded param + grad bytes held at once (measured)

    # ---- storage management (PyTorch FSDP: _alloc_storage / _free_storage) --------------------------------
    @staticmethod
    def _free_storage(t: torch.Tensor) -> None:
        t.untyped_storage().resize_(0)

    def _unshard(self, tag: str) -> None:
        storage = self._full.untyped_storage()
        storage.resize_(self._full.numel() * self._full.element_size())
        gathered = self.comm.all_gather(self.shard.detach(), 0, tag=tag)  # [c] per rank -> [n_pad]
        # write through .data: a fresh version counter, so autograd's saved views stay valid (as in FSDP)
        self._full.data.copy_(gathered)

    def unsharded_bytes(self) -> int:
        held = self._full.untyped_storage().nbytes()
        if self._flat is not None and self._flat.grad is not None:
            held += self._flat.grad.untyped_storage().nbytes()
        return held

    # ---- forward / backward --------------------------------------------------------------------------------
    def _reshards_after_forward(self) -> bool:
        return (not self.is_root) if self.reshard_after_forward is None else self.reshard_after_forward

    def forward(self, *args, **kwargs):
        running: list[FlatUnit] = _RUNNING.__dict__.setdefault("units", [])
        if self.is_root is None:
            self.is_root = not running  # no unit's forward encloses this one
        running.append(self)
        try:
            return self._forward(*args, **kwargs)
        finally:
            running.pop()

    def _forward(self, *args, **kwargs):
        if self._full.untyped_storage().nbytes() == 0:  # not kept from a previous forward
            self._unshard("fsdp.forward.unshard")  # 2. all-gather before forward
        flat = self._full.data.requires_grad_(True)  # leaf [n_pad] sharing _full's storage
        self._flat = flat
        for seg in self.plan.segments:
            if seg.kind != "param":
                continue
            view = flat[seg.start : seg.start + seg.numel].view(self.shapes[seg.param_index])
            for mod, name in self._regs[seg.param_index]:
                setattr(mod, name, view)
        flat.register_post_accumulate_grad_hook(self._post_backward)
        out = self.module(*args, **kwargs)
        self.peak_unsharded_bytes = max(self.peak_unsharded_bytes, self.unsharded_bytes())
        if self._reshards_after_forward():
            self._free_storage(self._full)  # 3. free after forward (autograd keeps views of the freed storage)
        self._regathered = False
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(self._pre_backward)
        return out

    def _pre_backward(self, grad: torch.Tensor) -> None:
        if not self._regathered:  # 4. all-gather again before this unit's backward, if step 3 freed it
            self._regathered = True
            if self._full.untyped_storage().nbytes() == 0:
                self._unshard("fsdp.backward.unshard")

    def _post_backward(self, flat: torch.Tensor) -> None:
        self.peak_unsharded_bytes = max(self.peak_unsharded_bytes, self.unsharded_bytes())
        w = self.comm.world_size
        grad = self.comm.reduce_scatter(flat.grad, 0, tag="fsdp.backward.reduce_grad")  # [n_pad] -> [c] sum
        grad = grad / w  # average over the data-parallel ranks: each rank's loss is a mean over its batch
        if self.shard.grad is None:
            self.shard.grad = grad.clone()
        else:
            self.shard.grad += grad
        flat.grad = None  # 5. free the unsharded gradient and parameter
        self._free_storage(self._full)
        self._flat = None

    # ---- inspection ----------------------------------------------------------------------------------------
    def persistent_bytes(self, optimizer: ShardSGD | ShardAdam | None = None) -> dict[str, int]:
        """Bytes this rank keeps between steps: shard, gradient shard, optimizer state (measured tensors)."""
        out = {"param_shard": self.shard.untyped_storage().nbytes(),
               "grad_shard": 0 if self.shard.grad is None else self.shard.grad.untyped_storage().nbytes(),
               "optimizer": 0 if optimizer is None else optimizer.state_bytes()}
        return out


def unflatten(plan: FlatShardPlan, shards: list[torch.Tensor], shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Reassemble parameters from every rank's shard (rank order): cat -> [n_pad], slice each segment."""
    if len(shards) != plan.world_size:
        raise ValueError(f"got {len(shards)} shards for world_size={plan.world_size}")
    full = torch.cat([s.detach() for s in shards])  # N × [c] -> [n_pad]
    segs = [s for s in plan.segments if s.kind == "param"]
    return [full[s.start : s.start + s.numel].view(shapes[s.param_index]).clone() for s in segs]


class ShardSGD:
    """p <- p - lr·g on the shard (no state)."""

    def __init__(self, shard: torch.Tensor, lr: float) -> None:
        self.shard, self.lr = shard, lr

    @torch.no_grad()
    def step(self) -> None:
        self.shard -= self.lr * self.shard.grad

    def zero_grad(self) -> None:
        self.shard.grad = None

    def state_bytes(self) -> int:
        return 0


class ShardAdam:
    """Adam (Kingma & Ba; torch.optim.Adam's defaults, no weight decay) on the shard: m, v are (c,) fp32."""

    def __init__(self, shard: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.shard, self.lr, self.betas, self.eps, self.t = shard, lr, betas, eps, 0
        self.m = torch.zeros_like(shard, dtype=torch.float32)  # [c]
        self.v = torch.zeros_like(shard, dtype=torch.float32)  # [c]

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        g = self.shard.grad
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_hat = self.m / (1 - b1**self.t)
        denom = (self.v / (1 - b2**self.t)).sqrt_().add_(self.eps)
        self.shard.addcdiv_(m_hat, denom, value=-self.lr)

    def zero_grad(self) -> None:
        self.shard.grad = None

    def state_bytes(self) -> int:
        return self.m.untyped_storage().nbytes() + self.v.untyped_storage().nbytes()
