"""Per-parameter FSDP on XLA SPMD (FSDPv2 style): shard every weight's dim 0 over the ``fsdp`` mesh axis.

Design note
-----------
Instead of one flat buffer, each parameter p of shape (d0, *rest) is annotated
``mark_sharding(p, mesh, ("fsdp", None, ...))``; the batch is sharded the same way. XLA's SPMD partitioner
then inserts the collectives itself. We compile a training step as TWO graphs — forward (loss) and
backward + SGD update — by cutting the lazy graph after the forward (``capture_hlo`` syncs). That mirrors
FSDP's "free after forward": between the two graphs only the *sharded* parameters persist, so the backward
graph must all-gather again whatever it needs.

What the HLO shows (CPU, torch_xla 2.9.0; read with ``shardlab.profile.capture_hlo``)::

    forward   unshard of every parameter: all-gather, operand = its padded shard ceil(d0/W)·rest·b — or, when
              d0 <= W // 2, an all-reduce of the full d0·rest·b (XLA's partitioner, ``ReplicatePartial``: a
              dynamic-update-slice into zeros, or for d0 = 1 a select of the owning device, then all-reduce)
              all-reduce of the scalar loss (the batch mean)                 — not FSDP traffic
    backward  unshard again of the weights the input-gradient needs: dX_l = dY_l · W_l for layers 2..L
              (layer 1's input is data, biases are never needed) — FSDP1 re-gathers the WHOLE flat param
              gradient "reduce-scatter" of every parameter: on CPU XLA emits all-reduce + dynamic-slice
              (reduce-scatter never appears); we count each such all-reduce as one reduce-scatter, its
              operand = the full gradient numel·b

An all-reduce is classified by its operand: one that places this device's shard by its partition-id (a
dynamic-update-slice into zeros, or a select of the owning device) is an unshard; any other non-scalar
all-reduce of the backward graph is a gradient reduce-scatter.

The unshards and the reduce-scatter are written out (``_FsdpLinear``): each Linear constrains a copy of its
weight and bias to replicated before use (-> all-gather), saves the SHARDED weight and re-gathers it in
backward, and constrains its gradient to replicated then dim-0 sharded (-> all-reduce + dynamic-slice).
Annotating only the parameters left the choice to the partitioner, and on mesh (fsdp 2, replica 4) it chose
another algorithm (measured, layers 30-50-10): it resharded each *transposed* weight onto the replica axis
(collective-permutes, then an all-gather over the 4 replica devices of a 1/4 slice) and reduced each weight
gradient as an all-reduce of half the rows plus a collective-permute to the owner. At W = 4, 8 both forms
measure the same collective bytes. With W = 1 nothing is sharded: no collective at all (formula: zeros).

``shardlab.formulas.fsdp.per_param_step_bytes`` is that algebra; ``gspmd_step`` measures it. Compare with
the flat design (``formulas.fsdp.flat_step_comm``): c·b + c·b + P·b with c = ceil(N/W). Per-parameter padding
rounds each d0 up instead of the total N, and the backward gathers only what autograd reads.
torch_xla's ``SpmdFullyShardedDataParallel`` (``wrapper="torch_xla_fsdpv2"``) makes the same kind of
annotations but shards each parameter's LARGEST dimension (``shard_maximal=True``), not dim 0: same
algebra with ``rule="largest"``. It annotates only parameters and outputs, so at W = 2 on 8 devices the
partitioner reshards over the replica axis as above (``strict=False`` reports those collectives).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from shardlab import runtime
from shardlab.formulas.fsdp import StepBytes
from shardlab.fsdp.train import TrainConfig, make_batch, make_model
from shardlab.profile import capture_hlo
from shardlab.profile.hlo import Collective, HloModule


def _is_unshard_all_reduce(module: HloModule, c: Collective) -> bool:
    """An all-reduce that replicates a sharded value: its operand places this device's shard by its
    ``partition-id`` — a dynamic-update-slice into zeros (d <= W // 2) or a select of the owning device (d == 1)
    — XLA's all-reduce form of an unshard. A gradient reduce-scatter's operand is a partial sum (dot, reduce)."""
    ins = module.instructions.get(c.name)
    if ins is None or not ins.operands or ins.operands[0] not in module.instructions:
        return False
    op = module.instructions[ins.operands[0]]
    if op.opcode == "dynamic-update-slice":
        return True
    uses_partition_id = any(module.instructions[o].opcode == "partition-id" for o in op.operands
                            if o in module.instructions)
    if op.opcode == "select" and uses_partition_id:
        return True
    if op.opcode != "fusion":
        return False
    inner = [module.instructions[n].opcode for n in module.computations.get(op.attrs.get("calls", "").lstrip("%"), [])]
    return "dynamic-update-slice" in inner or (uses_partition_id and "select" in inner)


def mlp_backward_needed(model: nn.Module) -> list[bool]:
    """Which parameters backward reads for dX: weights of every Linear but the first (whose input is data)."""
    out, first = [], True
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            out.append(not first)
            if mod.bias is not None:
                out.append(False)
            first = False
    return out


class GspmdStep(NamedTuple):
    forward: Any  # HloModule
    backward: Any  # HloModule
    measured: StepBytes
    other_all_reduce_bytes: int  # e.g. the scalar loss mean
    rs_pairs_with_dynamic_slice: int  # how many gradient all-reduces the parser saw feeding a dynamic-slice
    shapes: list[tuple[int, ...]]
    loss: float
    resharding: dict[str, int]  # operand bytes of collectives outside the FSDP algorithm, by op (strict=False)
    updated: list[torch.Tensor]  # the parameters after the SGD step, gathered to the host (parity oracle)

    @property
    def is_fsdp(self) -> bool:
        """True when the partitioner used only all-gathers and all-reduces (the per-parameter FSDP algorithm)."""
        return not self.resharding


def _fsdp_spec(p: torch.Tensor) -> tuple[str | None, ...]:
    return ("fsdp",) + (None,) * (p.dim() - 1)


def _unshard(p: torch.Tensor, mesh: Any) -> torch.Tensor:
    """FSDP's unshard as a sharding constraint: a replicated copy of the sharded parameter (-> one all-gather)."""
    import torch_xla.distributed.spmd as xs

    full = p * 1.0  # an intermediate to constrain; the parameter itself stays sharded
    xs.mark_sharding(full, mesh, (None,) * p.dim())
    return full


def _reduce_scatter(g: torch.Tensor, mesh: Any) -> torch.Tensor:
    """A reduce-scatter the way XLA:CPU lowers one: sum the full gradient (all-reduce), keep the dim-0 shard."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(g, mesh, (None,) * g.dim())  # replicated -> all-reduce of the partial sums
    shard = g * 1.0
    xs.mark_sharding(shard, mesh, _fsdp_spec(g))  # dim-0 sharded -> dynamic-slice
    return shard


class _FsdpLinear(torch.autograd.Function):
    """y = x·Wᵀ + b with FSDP's explicit unshards: gather W, b before forward; gather W again in backward.

    Saves the SHARDED weight (free after forward), so the backward graph must all-gather it for dX — and only
    if dX is needed (layer 1's input is data). Without the explicit constraint the partitioner reshards the
    transposed weight on its own; on mesh (fsdp 2, replica 4) it chose collective-permutes + an all-gather over
    the replica axis instead of gathering the fsdp shards (see the module note).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mesh: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.mesh = mesh
        # x (B, d_in) · W_full^T (d_in, d_out) -> (B, d_out)
        return x @ _unshard(w, mesh).t() + _unshard(b, mesh)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        gx = gy @ _unshard(w, ctx.mesh) if ctx.needs_input_grad[0] else None  # (B, d_out)·(d_out, d_in)
        gw = gy.t() @ x  # (d_out, B)·(B, d_in) -> (d_out, d_in), partial sums over the batch shards
        return gx, _reduce_scatter(gw, ctx.mesh), _reduce_scatter(gy.sum(0), ctx.mesh), None  # gb: (d_out,)


def gspmd_step(cfg: TrainConfig, world_size: int, wrapper: str = "mark_sharding", strict: bool = True) -> GspmdStep:
    """Run one SGD step of ``make_model(cfg)`` with per-parameter FSDP sharding; read both graphs' HLO.

    Needs ``runtime.setup()`` first; the mesh is (world_size, num_devices // world_size) named
    ("fsdp", "replica"): parameters and batch sharded over ``fsdp``, replicated over ``replica``.
    ``wrapper="mark_sharding"``: dim 0 of every parameter (FSDP2's rule), Linear outputs kept batch-sharded.
    ``wrapper="torch_xla_fsdpv2"``: every Linear wrapped in torch_xla's ``SpmdFullyShardedDataParallel``
    (shards each parameter's LARGEST dim, shards each output on the batch, adds backward optimization
    barriers) — its formula is ``per_param_step_bytes(..., rule="largest")``.
    Collectives other than all-gather / all-reduce mean the partitioner chose another algorithm: ``strict``
    raises; ``strict=False`` returns them in ``resharding`` (``is_fsdp`` False) — then ``measured`` is NOT the
    FSDP algebra and must not be compared with ``per_param_step_bytes``.
    """
    if wrapper not in ("mark_sharding", "torch_xla_fsdpv2"):
        raise ValueError(f"wrapper={wrapper!r} must be 'mark_sharding' or 'torch_xla_fsdpv2'")
    import torch_xla.distributed.spmd as xs

    n = runtime.current().num_devices
    if world_size < 1 or n % world_size:
        raise ValueError(f"world_size={world_size} must divide num_devices={n} for the GSPMD mesh")
    if cfg.tied:
        raise ValueError("tied=True is not supported by gspmd_step (the per-param formula assumes an MLP)")
    if cfg.batch % world_size:
        raise ValueError(f"batch={cfg.batch} is not divisible by world_size={world_size}")
    mesh = runtime.mesh((world_size, n // world_size), ("fsdp", "replica"))
    dev = runtime.device()
    model = make_model(cfg)
    model = model.to(dev)  # CPU-initialised, then moved, then sharded (device-side RNG before a sync breaks lowering)
    if wrapper == "torch_xla_fsdpv2":
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

        for i, mod in enumerate(model):
            if isinstance(mod, nn.Linear):
                model[i] = FSDPv2(mod, mesh=mesh)
    params = list(model.parameters())
    for p in params:
        if wrapper == "mark_sharding":
            xs.mark_sharding(p, mesh, _fsdp_spec(p))
    # keep activations batch-sharded (FSDPv2's shard_output): otherwise, when B/W is small next to the widths,
    # the partitioner may move activations (all-to-all) instead of gathering weights — a different algorithm
    def shard_output(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        xs.mark_sharding(out, mesh, ("fsdp", None))  # (B, d) sharded on B; constraint on an intermediate

    for mod in model.modules():
        if isinstance(mod, nn.Linear) and wrapper == "mark_sharding":
            if mod.bias is None:
                raise ValueError("gspmd_step expects Linear layers with a bias (make_model's MLP)")
            mod.forward = lambda x, m=mod: _FsdpLinear.apply(x, m.weight, m.bias, mesh)  # type: ignore[method-assign]
            mod.register_forward_hook(shard_output)
    x, y = make_batch(cfg, 0)  # (B, d_in), (B, d_out)
    x, y = x.to(dev), y.to(dev)
    xs.mark_sharding(x, mesh, ("fsdp", None))
    xs.mark_sharding(y, mesh, ("fsdp", None))
    held: dict[str, torch.Tensor] = {}

    def forward():
        held["loss"] = nn.functional.mse_loss(model(x), y)
        return held["loss"]

    def backward():
        held["loss"].backward()
        with torch.no_grad():
            for p in params:
                p -= cfg.lr * p.grad
        return params + [p.grad for p in params]

    fwd = capture_hlo(forward)
    bwd = capture_hlo(backward)
    fm, bm = fwd.module, bwd.module
    ag_f = [c for c in fm.collectives if c.op == "all-gather"]
    ag_b = [c for c in bm.collectives if c.op == "all-gather"]
    # non-scalar all-reduces: an unshard in its all-reduce form (operand = dynamic-update-slice into zeros), or,
    # in the backward graph, a gradient reduce-scatter (CPU: all-reduce + dynamic-slice)
    ar_f = [c for c in fm.collectives if c.op == "all-reduce" and _is_unshard_all_reduce(fm, c)]
    ar_b = [c for c in bm.collectives if c.op == "all-reduce" and _is_unshard_all_reduce(bm, c)]
    rs = [c for c in bm.collectives if c.op == "all-reduce" and c not in ar_b and any(len(s) for s in c.operand_shapes)]
    other = [c for c in fm.collectives + bm.collectives if c.op == "all-reduce" and c not in rs + ar_f + ar_b]
    unexpected = [c for c in fm.collectives + bm.collectives if c.op not in ("all-gather", "all-reduce")]
    if unexpected and strict:
        raise RuntimeError(f"unexpected collectives {[c.op for c in unexpected]}: the partitioner did not choose "
                           f"per-parameter FSDP (world_size={world_size}, wrapper={wrapper!r})")
    resharding: dict[str, int] = {}
    for c in unexpected:
        resharding[c.op] = resharding.get(c.op, 0) + c.operand_bytes

    def total(cs: list[Collective]) -> int:
        return sum(c.operand_bytes for c in cs)

    measured = StepBytes(total(ag_f), total(ag_b), total(rs), len(ag_f) + len(ag_b), len(rs), total(ar_f),
                         total(ar_b), len(ar_f) + len(ar_b))
    return GspmdStep(fm, bm, measured, sum(c.operand_bytes for c in other),
                     sum(c.feeds_dynamic_slice for c in rs), [tuple(p.shape) for p in params],
                     float(held["loss"].detach().cpu()), resharding, [p.detach().cpu() for p in params])
