"""Per-parameter FSDP on XLA SPMD (FSDPv2 style): shard every weight's dim 0 over the ``fsdp`` mesh axis.

Design note
-----------
Instead of one flat buffer, each parameter p of shape (d0, *rest) is annotated
``mark_sharding(p, mesh, ("fsdp", None, ...))``; the batch is sharded the same way. XLA's SPMD partitioner
then inserts the collectives itself. A training step is TWO graphs — :func:`forward` (loss) and
:func:`backward` + SGD update — the lazy graph cut after the forward (``shardlab.fsdp.case.GspmdCase`` names them
as its two programs; the harness executes the first before it builds the second). That mirrors FSDP's "free
after forward": between the two graphs only the *sharded* parameters persist, so the backward graph must
all-gather again whatever it needs.

The HLO shows (CPU, torch_xla 2.9.0) the per-parameter step of :mod:`shardlab.formulas.fsdp`'s module note: an
unshard of every parameter in forward (all-gather of its padded shard, or ``ReplicatePartial``'s all-reduce when
d0 <= N // 2), the all-reduce of the scalar loss (not FSDP traffic), an unshard again in backward of the weights
dX_l = dY_l · W_l reads (layers 2..L; FSDP1 re-gathers the WHOLE flat param), and a "reduce-scatter" of every
gradient, which XLA:CPU emits as all-reduce + dynamic-slice (its passes never form one, though its runtime runs one
when the HLO holds one): each such all-reduce counts as one reduce-scatter of the full gradient numel·e.

Every collective is classified operand by operand (:func:`moved_operands`; XLA:TPU packs several operands into
one tuple collective): an all-gather operand is an unshard; an all-reduce operand whose value places this
device's shard by its partition-id (a dynamic-update-slice into zeros, or a select of the owning device) is an
unshard in its all-reduce form; any other non-scalar all-reduce operand of the backward graph is a gradient
reduce-scatter, and so is every operand of a real reduce-scatter (XLA:TPU's ``all-reduce-scatter`` fusion).

The unshards and the reduce-scatter are written out (``_FsdpLinear``): each Linear constrains a copy of its
weight and bias to replicated before use (-> all-gather), saves the SHARDED weight and re-gathers it in
backward, and constrains its gradient to replicated then dim-0 sharded (-> all-reduce + dynamic-slice).
Annotating only the parameters left the choice to the partitioner, and on mesh (fsdp 2, replica 4) it chose
another algorithm (measured, layers 30-50-10): it resharded each *transposed* weight onto the replica axis
(collective-permutes, then an all-gather over the 4 replica devices of a 1/4 slice) and reduced each weight
gradient as an all-reduce of half the rows plus a collective-permute to the owner. At N = 4, 8 both forms
measure the same collective bytes. With N = 1 nothing is sharded: no collective at all (formula: zeros).

``shardlab.formulas.fsdp.per_param_step_bytes`` is that algebra; :func:`step_bytes` of the classified
operands measures it. Compare with the flat design (``formulas.fsdp.flat_step_comm``): c·e (+ c·e unless the
unit is the root) + n_pad·e with c = ceil(n/N). Per-parameter padding rounds each d0 up instead of the total n, and
the backward gathers only what autograd reads. torch_xla's ``SpmdFullyShardedDataParallel``
(``wrapper="torch_xla_fsdpv2"``) makes the same kind of annotations but shards each parameter's LARGEST dimension
(``shard_maximal=True``), not dim 0: same algebra with ``rule="largest"``. It annotates only parameters and
outputs, so at N = 2 on 8 devices the partitioner reshards over the replica axis as above (classified
``resharding``: another algorithm than FSDP's).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, NamedTuple

import torch
import torch_xla.distributed.spmd as xs  # fsdp.gspmd is imported after runtime.setup() (the notebooks' order)
from torch import nn
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

from shardlab import runtime
from shardlab.formulas.fsdp import StepBytes
from shardlab.fsdp.params import FsdpParamsBase
from shardlab.fsdp.train import make_batch, make_model
from shardlab.profile.hlo import HloModule
from shardlab.profile.hlo_text import Instruction

# Ops a value passes through unchanged in content on its way to a collective (layout, type, tuple plumbing).
_PLUMBING = ("bitcast", "copy", "convert", "get-tuple-element", "reshape", "copy-done")
_COMPUTE = ("dot", "convolution", "reduce")
KINDS = ("all_gather", "unshard_all_reduce", "reduce_scatter", "other", "resharding")
"""What one operand of a collective does in the FSDP step: an unshard by all-gather, an unshard by all-reduce,
a gradient reduction (CPU: all-reduce + dynamic-slice; TPU: a reduce-scatter fusion or an all-reduce), anything
else reduced (the scalar loss), or a collective outside the FSDP algorithm (collective-permute, all-to-all)."""


def _producer(module: HloModule, name: str) -> Instruction | None:
    ins = module.instructions.get(name)
    for _ in range(8):
        if ins is None or ins.opcode not in _PLUMBING or not ins.operands:
            return ins
        ins = module.instructions.get(ins.operands[0])
    return ins


def _is_unshard_value(module: HloModule, name: str) -> bool:
    """A value that places this device's shard into zeros by its ``partition-id`` — a dynamic-update-slice
    (d <= N // 2, or XLA:TPU's all-reduce form of a vector all-gather) or a select of the owning device (d == 1):
    summed over the devices it is the replicated parameter. A gradient's value is a partial sum (dot, reduce)."""
    op = _producer(module, name)
    if op is None:
        return False
    if op.opcode == "dynamic-update-slice":
        return True
    uses_partition_id = any(module.instructions[o].opcode == "partition-id" for o in op.operands
                            if o in module.instructions)
    if op.opcode == "select" and uses_partition_id:
        return True
    if op.opcode != "fusion":
        return False
    inner = {i.opcode for i in module.executed(op.name)[1:]}  # opcodes inside the fusion, nested included
    if inner & set(_COMPUTE):
        return False
    return "dynamic-update-slice" in inner or (uses_partition_id and "select" in inner)


class Moved(NamedTuple):
    """One operand of one collective of the step, classified (bytes per device)."""

    graph: str  # "forward" | "backward"
    kind: str  # one of KINDS
    op: str  # the HLO collective carrying it
    instruction: str  # the collective instruction (several operands may share one: a combined collective)
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def moved_operands(module: HloModule, graph: str) -> list[Moved]:
    """Every operand of every collective in one graph of the step, classified (see :data:`KINDS`).

    An all-gather operand is its shard; an all-reduce operand is counted with its RESULT element type (XLA:TPU
    prints some all-reduces with an f32 operand and a bf16 result: the convert moved into the collective, so the
    reduction travels in bf16); a reduce-scatter operand is the full gradient."""
    out: list[Moved] = []
    for c in module.collectives:
        ins = module.instructions[c.name]
        operands = [a for o in ins.operands if o in module.instructions for a in module.instructions[o].shape]
        results = list(ins.shape) if len(ins.shape) == len(operands) else operands
        for i, (arr, o) in enumerate(zip(operands, ins.operands, strict=False)):
            if c.op == "all-gather":
                kind, shown = "all_gather", arr
            elif c.op == "reduce-scatter":
                kind, shown = "reduce_scatter", arr
            elif c.op == "all-reduce":
                shown = results[i]
                if not arr.dims:  # the scalar loss mean
                    kind = "other"
                elif _is_unshard_value(module, o):
                    kind = "unshard_all_reduce"
                else:
                    kind = "reduce_scatter" if graph == "backward" else "other"
            else:
                kind, shown = "resharding", arr
            out.append(Moved(graph, kind, c.op, c.name, tuple(arr.dims), shown.dtype, shown.nbytes))
    return out


def step_bytes(moved: list[Moved]) -> StepBytes:
    """The step's collectives per kind and graph (counts = logical collectives, one per operand)."""

    def total(kind: str, graph: str | None = None) -> int:
        return sum(m.nbytes for m in moved if m.kind == kind and graph in (None, m.graph))

    def count(kind: str) -> int:
        return sum(m.kind == kind for m in moved)

    return StepBytes(total("all_gather", "forward"), total("all_gather", "backward"), total("reduce_scatter"),
                     count("all_gather"), count("reduce_scatter"), total("unshard_all_reduce", "forward"),
                     total("unshard_all_reduce", "backward"), count("unshard_all_reduce"))


def instruction_counts(moved: list[Moved]) -> dict[str, int]:
    """Collective instructions per kind (a combined collective carrying k operands of one kind counts once)."""
    return {k: len({(m.graph, m.instruction) for m in moved if m.kind == k}) for k in KINDS}


def _fsdp_spec(p: torch.Tensor) -> tuple[str | None, ...]:
    return ("fsdp",) + (None,) * (p.dim() - 1)


def unshard(p: torch.Tensor, mesh: xs.Mesh) -> torch.Tensor:
    """FSDP's unshard as a sharding constraint: a replicated copy of the sharded parameter (-> one all-gather)."""
    full = p * 1.0  # an intermediate to constrain; the parameter itself stays sharded
    xs.mark_sharding(full, mesh, (None,) * p.dim())
    return full


def _reduce_scatter(g: torch.Tensor, mesh: xs.Mesh) -> torch.Tensor:
    """A reduce-scatter the way XLA:CPU lowers one: sum the full gradient (all-reduce), keep the dim-0 shard."""
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
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mesh: xs.Mesh) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.mesh = mesh
        # x [b, d_in] · W_fullᵀ [d_in, d_out] -> [b, d_out]
        return x @ unshard(w, mesh).t() + unshard(b, mesh)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        gx = gy @ unshard(w, ctx.mesh) if ctx.needs_input_grad[0] else None  # [b, d_out]·[d_out, d_in]
        gw = gy.t() @ x  # [d_out, b]·[b, d_in] -> [d_out, d_in], partial sums over the batch shards
        return gx, _reduce_scatter(gw, ctx.mesh), _reduce_scatter(gy.sum(0), ctx.mesh), None  # gb: [d_out]


WRAPPERS = ("mark_sharding", "torch_xla_fsdpv2")


def build(p: FsdpParamsBase, wrapper: str = "mark_sharding"
          ) -> tuple[nn.Module, list[torch.Tensor], torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The sharded model and batch on the current world: (model, params, x, y, kept activations list).

    The mesh is (fsdp, replica) = (N, devices / N) over this process's devices: parameters and batch sharded over
    ``fsdp``, replicated over ``replica``. ``wrapper="mark_sharding"``: dim 0 of every parameter (FSDP2's rule),
    the unshards and reduce-scatters written out (:class:`_FsdpLinear`), Linear outputs kept batch-sharded.
    ``wrapper="torch_xla_fsdpv2"``: every Linear wrapped in torch_xla's ``SpmdFullyShardedDataParallel`` (shards
    each parameter's LARGEST dim, shards each output on the batch, adds backward optimization barriers)."""
    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper={wrapper!r} must be one of {WRAPPERS}")
    n = runtime.current().num_devices
    mesh = runtime.mesh((p.world_size, n // p.world_size), ("fsdp", "replica"))
    dev = runtime.device()
    model = make_model(p)
    model = model.to(dev)  # CPU-initialised, then moved, then sharded (device-side RNG before a sync breaks lowering)
    if wrapper == "torch_xla_fsdpv2":
        for i, mod in enumerate(model):
            if isinstance(mod, nn.Linear):
                model[i] = FSDPv2(mod, mesh=mesh)
    params = list(model.parameters())
    for q in params:
        if wrapper == "mark_sharding":
            xs.mark_sharding(q, mesh, _fsdp_spec(q))
    # keep activations batch-sharded (FSDPv2's shard_output): otherwise, when b/N is small next to the widths,
    # the partitioner may move activations (all-to-all) instead of gathering weights — a different algorithm
    def shard_output(_mod: nn.Module, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        xs.mark_sharding(out, mesh, ("fsdp", None))  # [b, d] sharded on b; constraint on an intermediate

    for mod in model.modules():
        if isinstance(mod, nn.Linear) and wrapper == "mark_sharding":
            if mod.bias is None:
                raise ValueError("the GSPMD step expects Linear layers with a bias (make_model's MLP)")
            # through a weak proxy: a Linear whose forward closed over itself would be a reference cycle, kept
            # alive (with its pending, unsynced update graph) until the garbage collector runs — and the next
            # captured step would compile that graph too
            m = weakref.proxy(mod)
            mod.forward = lambda x, m=m: _FsdpLinear.apply(x, m.weight, m.bias, mesh)  # type: ignore[method-assign]
            mod.register_forward_hook(shard_output)
    kept: list[torch.Tensor] = []  # what autograd saves between the graphs: every Tanh output, the model output
    for mod in model.modules():
        if isinstance(mod, nn.Tanh):
            mod.register_forward_hook(lambda _m, _i, out: kept.append(out))
    x, y = make_batch(p, 0)  # [b, d_in], [b, d_out]
    x, y = x.to(dev), y.to(dev)
    xs.mark_sharding(x, mesh, ("fsdp", None))
    xs.mark_sharding(y, mesh, ("fsdp", None))
    return model, params, x, y, kept


def forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, kept: list[torch.Tensor]) -> list[torch.Tensor]:
    """The step's first graph: [loss, model output, tanh outputs] — the loss first, then what the backward reads."""
    out = model(x)
    return [nn.functional.mse_loss(out, y), out, *kept]


def backward(loss: torch.Tensor, params: list[torch.Tensor], lr: float) -> list[torch.Tensor]:
    """The step's second graph, after the first was executed: [updated params, grads] (SGD, in place)."""
    with warnings.catch_warnings():  # torch_xla's FSDPv2 wrapper hooks a first layer whose input needs no grad
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()
    with torch.no_grad():
        for q in params:
            q -= lr * q.grad
    return params + [q.grad for q in params]
