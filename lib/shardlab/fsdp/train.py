"""FSDP1 training on flat units as a case (notebook 05): the per-rank program, its unsharded oracle, the formula.

Design note
-----------
:class:`FlatCase` holds the notebook's parameters ``p`` (:class:`shardlab.fsdp.params.FsdpParams`: world_size N,
layer_sizes, batch, steps, align) and the variant it shows — ``nested`` (the first Linear wrapped as an inner unit
inside the root, as PyTorch's auto-wrap would), the optimizer, ``tied`` (a head sharing the first weight) — and
supplies two views to :mod:`shardlab.core.harness`::

    formula   flat numel n by hand, formulas.fsdp.flat_step_comm per unit (the root: one all-gather), ZeRO-3's
              (4 + 4 + K)·n_pad / N bytes of model state per rank (formulas.zero)
    ledger    FlatUnit on every rank of a SimulatedWorld (no devices), `steps` steps: one step's collectives, the
              shard tensors each rank keeps, the collectives' order, parity with unsharded training

``fsdp_rank_program(comm, case)`` is a module-level function so it pickles for ``DistributedWorld`` (gloo) as
well as running in ``SimulatedWorld`` (this module imports no torch_xla: PyTorch's own FSDP runs the same case in
gloo processes, ``shardlab.fsdp.torch_ref``). Every rank builds the same model from the seed, wraps it in one
``FlatUnit`` (the root unit; nested: the first Linear first, as an inner unit), takes its rows of the global batch
(``batch / N`` each) and trains ``steps`` steps with a mean-squared-error loss. ``reference_train(case)`` trains the
same model unsharded on the full batch with ``torch.optim``. Why they agree: the mean loss over the global batch B
is the average of the N per-rank means over b/N rows, so the reduce-scattered gradient divided by N equals the
full-batch gradient (exactly up to float summation order), and SGD/Adam are elementwise, so updating shards =
updating the whole.

Example::

    case = FlatCase(FsdpParams(world_size=8, layer_sizes=(30, 50, 10), batch=64))
    harness.record(rec, "fsdp", harness.formula(case), harness.ledger(case))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from shardlab.comm import Comm, Ledger
from shardlab.core.case import Case, Checks, Program
from shardlab.core.views import LedgerRun, View
from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas.zero import zero_memory
from shardlab.fsdp.flat_param import FlatShardPlan, aligned_numel, module_params, plan_flat_shards_for
from shardlab.fsdp.params import FsdpParams, FsdpParamsBase
from shardlab.fsdp.unit import FlatUnit, ShardAdam, ShardSGD, unflatten

OPTIMIZERS = tuple(ffsdp.OPTIMIZER_STATE_BYTES)  # sgd, adam
ELEM_BYTES = 4  # the FSDP lessons train in float32
LR = 0.05
INNER = "0"  # with nested=True: the inner unit wraps submodule "0", the first Linear


def linear_shapes(layer_sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Parameter shapes of the MLP Linear(d0, d1) -> tanh -> ... in registration order: [o, i] weight, [o] bias."""
    return [s for i, o in zip(layer_sizes[:-1], layer_sizes[1:], strict=True) for s in ((o, i), (o,))]


class _Tied(nn.Module):
    """MLP followed by a head reusing the first layer's weight transposed (a shared parameter)."""

    def __init__(self, body: nn.Sequential) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(body[0].in_features, body[0].out_features, bias=False)
        self.head.weight = body[0].weight  # shared: flattened once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)  # [b, d_out] with d_out == d_in
        return torch.tanh(self.head(y))  # [b, d_in] @ [d_in, d_1] -> [b, d_1]


def make_model(p: FsdpParamsBase, tied: bool = False) -> nn.Module:
    """The MLP of ``p.layer_sizes``, deterministic from ``p.seed`` with a LOCAL generator: SimulatedWorld ranks are
    threads, and a global ``torch.manual_seed`` per thread would interleave draws and give every rank a different
    model. ``tied``: append a head tied to the first Linear's weight."""
    layers: list[nn.Module] = []
    sizes = [int(d) for d in p.layer_sizes]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))  # [batch, a] @ [a, b] -> [batch, b]
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    body = nn.Sequential(*layers)
    model = _Tied(body) if tied else body
    g = torch.Generator().manual_seed(p.seed)
    with torch.no_grad():
        for q in dict.fromkeys(model.parameters()):  # nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) init
            fan_in = q.shape[-1] if q.dim() > 1 else q.shape[0]
            q.copy_((torch.rand(q.shape, generator=g) * 2 - 1) / fan_in**0.5)
    return model


def make_batch(p: FsdpParamsBase, step: int, tied: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: x [b, d_in] and the regression target y [b, d_out], seeded."""
    g = torch.Generator().manual_seed(p.seed * 1000 + step + 1)
    x = torch.randn(p.batch, p.layer_sizes[0], generator=g)  # [b, d_in]
    model_out = p.layer_sizes[1] if tied else p.layer_sizes[-1]
    y = torch.randn(p.batch, model_out, generator=g)  # [b, d_out]
    return x, y


class FlatLedgerRun(LedgerRun, total=False):
    """A :class:`FlatCase` ledger view's detail: the harness's ledger run, one step's ledger and the flat plans
    (``ledger_extra``), and with the torch check PyTorch's FSDP1 / FSDP2 runs (``fsdp.case``)."""

    one_step: Ledger  # the first of the ``steps`` steps' collectives
    plans: dict[str, Any]  # FQN prefix -> the flat parameter's shard plan ("" the root)
    torch: dict[str, Any]  # FSDP1 / FSDP2 ranks and rows, side by side with ours


class RankResult(NamedTuple):
    shard: torch.Tensor  # [c] of the root unit after the last step
    losses: list[float]  # this rank's local loss per step
    persistent_bytes: dict[str, int]  # summed over this rank's units
    peak_unsharded_bytes: int  # of the root unit
    shapes: list[tuple[int, ...]]  # the root unit's parameters
    names: list[str]
    inner_shard: torch.Tensor | None = None  # [c_inner] of the inner unit (nested=True)


@dataclass(frozen=True)
class FlatCase(Case):
    """FSDP1 FlatParameter units on ``p.world_size`` ranks, trained ``p.steps`` steps: the MLP as one root unit, or
    (``nested``) the first Linear as an inner unit plus the root around the rest."""

    size_name: ClassVar[str] = "world_size"
    ops: ClassVar[tuple[str, ...]] = ()  # the ledger holds `steps` steps: ledger_extra reads one step's collectives

    p: FsdpParams
    nested: bool = False
    optimizer: str = "adam"  # "sgd" | "adam"
    tied: bool = False  # append a Linear tied to the first one's weight (a shared parameter)
    lr: float = LR

    def __post_init__(self) -> None:
        self.p.validate()
        sizes = list(self.p.layer_sizes)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        if self.tied and sizes[0] != sizes[-1]:
            raise ValueError(f"tied=True needs layer_sizes[0] == layer_sizes[-1], got {sizes}")
        if self.nested and (self.tied or len(sizes) < 3):
            raise ValueError(f"nested=True needs tied=False and >= 2 Linear layers (the root unit must own one), got "
                             f"layer_sizes={sizes}, tied={self.tied}")

    def model(self) -> nn.Module:
        return make_model(self.p, self.tied)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return make_batch(self.p, step, self.tied)

    def plans(self) -> dict[str, FlatShardPlan]:
        """The flat plan of each unit the rank program builds: {"": root} (+ {INNER: inner} with nested)."""
        model = self.model()
        inner = (model[int(INNER)],) if self.nested else ()
        plans = {"": plan_flat_shards_for(model, self.p.world_size, self.p.align, ignored=inner)}
        if self.nested:
            plans[INNER] = plan_flat_shards_for(inner[0], self.p.world_size, self.p.align)
        return plans

    def units(self) -> dict[str, tuple[int, ffsdp.FlatStepComm]]:
        """Per unit, by hand: (n, its collectives per step). The inner unit owns Linear 0 (its weight and bias); a
        tied head shares the first weight, flattened once, so it adds nothing."""
        numels = [math.prod(s) for s in linear_shapes(self.p.layer_sizes)]
        w, align = self.p.world_size, aligned_numel(torch.float32) if self.p.align else 0
        out = {}
        for name, mine in ({"": numels[2:], INNER: numels[:2]} if self.nested else {"": numels}).items():
            n = ffsdp.flat_numel(mine, w, align)
            out[name] = (n, ffsdp.flat_step_comm(n, w, ELEM_BYTES, root=name == ""))
        return out

    def expected_order(self) -> list[tuple[str, str, int]]:
        """One step's collectives in the order PyTorch FSDP1 issues them: (op, phase, payload bytes).

        Forward: each unit all-gathers when its forward starts (the root first). Backward: a non-root unit
        all-gathers again (it was resharded after forward) when the gradient reaches its output, and every unit
        reduce-scatters when its flat gradient is complete — the inner unit first, the root last, in FSDP1 as in
        FlatUnit (FSDP2 issues the root's first)."""
        if self.p.world_size == 1:
            return []
        units = self.units()
        root = units[""][1]
        rows = [("all_gather", "forward", root.all_gather_payload_bytes)]
        if self.nested:
            inner = units[INNER][1]
            rows += [("all_gather", "forward", inner.all_gather_payload_bytes),
                     ("all_gather", "backward", inner.all_gather_payload_bytes),
                     ("reduce_scatter", "backward", inner.reduce_scatter_payload_bytes)]
        return rows + [("reduce_scatter", "backward", root.reduce_scatter_payload_bytes)]

    def formula(self) -> View:
        """The flat units by hand: n, c = ceil(n / N), n_pad = N·c of the root; per step, summed over units, the
        collectives of ``flat_step_comm``; ZeRO-3's (4 + 4 + K)·n_pad / N bytes of model state per rank."""
        w, units = self.p.world_size, self.units()
        view = View("formula", detail={"units": units})
        n_root, f_root = units[""]
        view.add("flat.numel", n_root, "elements")
        view.add("flat.shard_numel", f_root.reduce_scatter_result_bytes // ELEM_BYTES, "elements")
        view.add("flat.padded_numel", f_root.reduce_scatter_payload_bytes // ELEM_BYTES, "elements")
        fs = [f for _, f in units.values()]
        view.add("step.all_gather.count", sum(f.all_gather_count for f in fs), "count")
        view.add("step.all_gather.bytes", sum(f.all_gather_bytes for f in fs), "bytes")
        view.add("step.reduce_scatter.count", sum(f.reduce_scatter_count for f in fs), "count")
        view.add("step.reduce_scatter.bytes", sum(f.reduce_scatter_bytes for f in fs), "bytes")
        view.add("step.collective.bytes", view["step.all_gather.bytes"] + view["step.reduce_scatter.bytes"], "bytes")
        view.add("step.wire.bytes", sum(f.wire_bytes(w) for f in fs), "bytes")
        k = ffsdp.OPTIMIZER_STATE_BYTES[self.optimizer]
        state = sum(zero_memory(f.reduce_scatter_payload_bytes // ELEM_BYTES, w, 3, k=k, param_bytes=ELEM_BYTES,
                                grad_bytes=ELEM_BYTES).total for f in fs)
        view.add("memory.per_rank.bytes", round(state), "bytes")
        return view

    def program(self) -> list[Program]:
        return [(fsdp_rank_program, (self,))]

    def oracle(self) -> tuple[list[torch.Tensor], list[float]]:
        return reference_train(self)

    def parity(self, source: str, got: list[RankResult], ref: tuple[list[torch.Tensor], list[float]]) -> Checks:
        err = max(float((a - b).abs().max()) for a, b in zip(gather_params(self, got), ref[0], strict=True))
        # float32: sharded and unsharded sums differ only in summation order
        return {"parity.params_match_unsharded": (err < 1e-5, f"max |FSDP - unsharded| = {err:.2e} after "
                                                  f"{self.p.steps} steps")}

    def ledger_extra(self, view: View[FlatLedgerRun], ledger: Ledger, results: list[RankResult]) -> View:
        """One step's collectives (the ledger holds ``steps``), the shard tensors each rank keeps, their order."""
        w = self.p.world_size
        one_step = Ledger(list(ledger)[: len(ledger) // self.p.steps])
        plans = self.plans()
        root = plans[""]
        view.detail |= {"one_step": one_step, "plans": plans}
        view.add("flat.numel", root.flat_numel, "elements")
        view.add("flat.shard_numel", root.shard_numel, "elements")
        rs = [e for e in one_step if e.op == "reduce_scatter"]
        view.add("flat.padded_numel", rs[-1].payload_bytes // ELEM_BYTES if rs else root.padded_numel, "elements")
        for op in ("all_gather", "reduce_scatter"):
            view.add(f"step.{op}.count", one_step.count(op), "count")
            view.add(f"step.{op}.bytes", one_step.payload_bytes(op), "bytes")
        view.add("step.collective.bytes", one_step.payload_bytes(), "bytes")
        view.add("step.wire.bytes", one_step.wire_bytes(), "bytes")
        per_rank = [sum(r.persistent_bytes.values()) for r in results]
        view.add("memory.per_rank.bytes", per_rank[0], "bytes")
        rows = [(e.op, e.phase, e.payload_bytes) for e in one_step]
        view.checks["step.order"] = (rows == self.expected_order(), f"{rows} (root unit: one all-gather"
                                     + (", inner unit: two" if self.nested else "") + ")")
        view.checks["memory.all_ranks_equal"] = (len(set(per_rank)) == 1, f"per-rank model state {per_rank} B")
        mem = ffsdp.flat_rank_memory(root.flat_numel, w, ELEM_BYTES, self.optimizer)
        peak = results[0].peak_unsharded_bytes
        view.checks["memory.peak_unsharded"] = (peak == mem.unsharded_param + mem.unsharded_grad,
                                                f"measured {peak} B, formula 2·n_pad·e = "
                                                f"{2 * root.padded_numel * ELEM_BYTES} B")
        return view


def check_world(comm: Comm, case: FlatCase) -> None:
    """The rank program runs on exactly ``case.p.world_size`` ranks (the flat plan is cut for N)."""
    if comm.world_size != case.p.world_size:
        raise ValueError(f"world_size={case.p.world_size} but the program runs on {comm.world_size} ranks")


def fsdp_rank_program(comm: Comm, case: FlatCase) -> RankResult:
    """One rank of FSDP training (runs under SimulatedWorld or DistributedWorld)."""
    check_world(comm, case)
    model = case.model()
    units = []
    if case.nested:  # the inner unit first, then the root around everything (PyTorch's auto-wrap order)
        model[int(INNER)] = FlatUnit(model[int(INNER)], comm, use_orig_params=case.p.align)
        units.append(model[int(INNER)])
    unit = FlatUnit(model, comm, use_orig_params=case.p.align)
    units.insert(0, unit)
    opt_cls = ShardAdam if case.optimizer == "adam" else ShardSGD
    opts: list[ShardSGD | ShardAdam] = [opt_cls(u.shard, case.lr) for u in units]
    rows = case.p.batch // comm.world_size
    losses = []
    for step in range(case.p.steps):
        x, y = case.batch(step)
        xs, ys = x[comm.rank * rows : (comm.rank + 1) * rows], y[comm.rank * rows : (comm.rank + 1) * rows]
        for o in opts:
            o.zero_grad()
        loss = nn.functional.mse_loss(unit(xs), ys)  # mean over this rank's b/N rows
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    held: dict[str, int] = {}
    for u, o in zip(units, opts, strict=True):
        for k, v in u.persistent_bytes(o).items():
            held[k] = held.get(k, 0) + v
    inner_shard = units[1].shard.detach().clone() if case.nested else None
    return RankResult(unit.shard.detach().clone(), losses, held, unit.peak_unsharded_bytes, unit.shapes, unit.names,
                      inner_shard)


def gather_params(case: FlatCase, results: list[RankResult]) -> list[torch.Tensor]:
    """Every parameter reassembled from all ranks' shards, in ``module_params(case.model())`` order."""
    plans = case.plans()
    model = case.model()
    inner = (model[int(INNER)],) if case.nested else ()
    by_name = dict(zip([n for n, _ in module_params(model, inner)],
                       unflatten(plans[""], [r.shard for r in results], results[0].shapes), strict=True))
    if case.nested:
        inner_params = module_params(inner[0])
        shards = [r.inner_shard for r in results]
        assert all(s is not None for s in shards)
        parts = unflatten(plans[INNER], shards, [tuple(q.shape) for _, q in inner_params])  # type: ignore[arg-type]
        by_name.update({f"{INNER}.{n}": t for (n, _), t in zip(inner_params, parts, strict=True)})
    return [by_name[n] for n, _ in module_params(model)]


def reference_train(case: FlatCase) -> tuple[list[torch.Tensor], list[float]]:
    """The oracle: the same model trained unsharded on the full batch with torch.optim."""
    model = case.model()
    params = list(dict.fromkeys(model.parameters()))  # registration order, shared once
    opt = (torch.optim.Adam(params, lr=case.lr) if case.optimizer == "adam" else torch.optim.SGD(params, lr=case.lr))
    losses = []
    for step in range(case.p.steps):
        x, y = case.batch(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [q.detach().clone() for _, q in module_params(model)], losses
