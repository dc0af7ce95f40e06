"""FSDP, four views of one configuration: formula, ledger, CPU compiler, TPU compiler.

Design
------
Two configurations, one per lesson:

* :class:`FlatConfig` — FSDP1's FlatParameter: the model wrapped as one root unit (or, ``nested``, the first
  Linear as an inner unit inside the root), trained ``steps`` steps on ``world_size`` ranks::

      formula(cfg)   flat numel N by hand, formulas.fsdp.flat_step_comm per unit (root: one all-gather),
                     ZeRO-3 model state (formulas.zero)
      ledger(cfg)    FlatUnit per rank in a SimulatedWorld (no devices), parity with unsharded training

* :class:`GspmdConfig` — per-parameter FSDP as GSPMD annotations (dim 0, FSDP2's rule, or torch_xla's FSDPv2
  wrapper: the largest dim), one SGD step compiled as two graphs (forward; backward + update)::

      formula(cfg, device_kind)   formulas.fsdp.per_param_step_bytes for XLA:CPU or XLA:TPU
      compiler(cfg)               the partitioned CPU HLO of both graphs (shardlab.fsdp.gspmd.gspmd_step)
      tpu(cfg)                    the same two graphs compiled by XLA:TPU for a TPU topology (compile-only)

Values are named ``<phase>.<what>.<quantity>`` (``step.all_gather.bytes``, ``flat.numel``,
``memory.per_rank.bytes``); :func:`shardlab.views.record` writes them with the notebook's prefix (``fsdp``,
``fsdp.gspmd``). In the GSPMD views ``all_gather`` and ``unshard_all_reduce`` are the two forms an unshard takes,
``reduce_scatter`` is the gradient reduction whatever its lowering (XLA:CPU: all-reduce + dynamic-slice; XLA:TPU:
an ``all-reduce-scatter`` fusion or an all-reduce, combined), counts are collective instructions and
``.operands`` the logical collectives they carry when the compiler combined some.

The CPU compiler view runs on a mesh (fsdp = W, replica = n / W) over the process's n devices and is skipped
(with the reason) when W does not tile them; the TPU view compiles the same mesh for an n-chip topology, or —
when the process cannot tile W — a (W, 1) mesh for a W-chip topology in a helper process. Where XLA:TPU differs
from the CPU formula the TPU view says why in ``differs`` (measured from its program) and checks the formula for
``device_kind="tpu"`` instead — where that formula applies (``formulas.fsdp.tpu_rules_apply``).

Example::

    cfg = GspmdConfig(world_size=8, layer_sizes=(30, 50, 10), batch=64)
    record(rec, "fsdp.gspmd", formula(cfg), compiler(cfg), tpu(cfg))
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

from shardlab import runtime
from shardlab.comm import Ledger, SimulatedWorld
from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas.zero import zero_memory
from shardlab.fsdp import gspmd
from shardlab.fsdp.flat_param import aligned_numel
from shardlab.fsdp.train import INNER, TrainConfig, fsdp_rank_program, gather_params, reference_train, unit_plans
from shardlab.views import View, formula, ledger

ELEM_BYTES = 4  # the FSDP lessons train in float32
OPTIMIZER_K = {"sgd": 0, "adam": 8}  # fp32 optimizer-state bytes per element (Adam: exp_avg + exp_avg_sq)


def linear_shapes(layer_sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Parameter shapes of the MLP Linear(d0, d1) -> tanh -> ... in registration order: [o, i] weight, [o] bias."""
    return [s for i, o in zip(layer_sizes[:-1], layer_sizes[1:], strict=True) for s in ((o, i), (o,))]


# --------------------------------------------------------------------------------------------- configurations
@dataclass(frozen=True)
class FlatConfig:
    """FSDP1 FlatParameter units on ``world_size`` ranks: the MLP as one root unit, or (``nested``) the first
    Linear as an inner unit plus the root around the rest."""

    world_size: int
    layer_sizes: tuple[int, ...]
    batch: int  # global batch, batch / world_size rows per rank
    steps: int = 3
    align: bool = False  # use_orig_params=True: 16-byte aligned parameter starts
    nested: bool = False
    optimizer: str = "adam"
    seed: int = 0

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> FlatConfig:
        kw = dict(world_size=p.world_size, layer_sizes=tuple(p.layer_sizes), batch=p.batch, seed=p.seed)
        for name in ("steps", "align"):
            if hasattr(p, name):
                kw[name] = getattr(p, name)
        return cls(**{**kw, **overrides})

    @property
    def train(self) -> TrainConfig:
        return TrainConfig(layer_sizes=self.layer_sizes, batch=self.batch, steps=self.steps, optimizer=self.optimizer,
                           use_orig_params=self.align, seed=self.seed, nested=self.nested)

    def unit_numels(self) -> dict[str, list[int]]:
        """Parameter numels per unit, by hand: ``{"": root, "0": inner}`` (the inner unit owns Linear 0)."""
        numels = [n for s in linear_shapes(self.layer_sizes) for n in (_prod(s),)]
        return {"": numels[2:], INNER: numels[:2]} if self.nested else {"": numels}


@dataclass(frozen=True)
class GspmdConfig:
    """One SGD step of the MLP with per-parameter FSDP under GSPMD on ``world_size`` shards."""

    world_size: int
    layer_sizes: tuple[int, ...]
    batch: int
    wrapper: str = "mark_sharding"  # or "torch_xla_fsdpv2" (torch_xla's SpmdFullyShardedDataParallel)
    seed: int = 0

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> GspmdConfig:
        kw = dict(world_size=p.world_size, layer_sizes=tuple(p.layer_sizes), batch=p.batch, seed=p.seed)
        return cls(**{**kw, **overrides})

    @property
    def rule(self) -> str:
        return "dim0" if self.wrapper == "mark_sharding" else "largest"

    @property
    def spec(self) -> gspmd.StepSpec:
        return gspmd.StepSpec(TrainConfig(layer_sizes=self.layer_sizes, batch=self.batch, optimizer="sgd",
                                          seed=self.seed), self.world_size, self.wrapper)

    def shapes(self) -> list[tuple[int, ...]]:
        return linear_shapes(self.layer_sizes)

    def backward_needed(self) -> list[bool]:
        """dX = dY·W reads every weight but the first layer's (its input is data); biases are never read."""
        return [len(s) == 2 and i > 0 for i, s in enumerate(self.shapes())]


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------------------------------- dispatch
# ------------------------------------------------------------------------------------------------ flat (FSDP1)
def _flat_units(cfg: FlatConfig) -> dict[str, tuple[int, ffsdp.FlatStepComm]]:
    align = aligned_numel(torch.float32) if cfg.align else 0
    out = {}
    for name, numels in cfg.unit_numels().items():
        n = ffsdp.flat_numel(numels, cfg.world_size, align)
        out[name] = (n, ffsdp.flat_step_comm(n, cfg.world_size, ELEM_BYTES, root=name == ""))
    return out


@formula.register
def _(cfg: FlatConfig, device_kind: str = "cpu") -> View:
    """The flat units by hand: N, c = ceil(N / W), P = W·c of the root; per step, summed over units, the
    collectives of ``flat_step_comm`` (the root unit is not resharded after forward: one all-gather); ZeRO-3's
    (4 + 4 + K)·P / W bytes of model state per rank."""
    w, units = cfg.world_size, _flat_units(cfg)
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
    k = OPTIMIZER_K[cfg.optimizer]
    state = sum(zero_memory(f.reduce_scatter_payload_bytes // ELEM_BYTES, w, 3, k=k, param_bytes=ELEM_BYTES,
                            grad_bytes=ELEM_BYTES).total for f in fs)
    view.add("memory.per_rank.bytes", round(state), "bytes")
    return view


def expected_order(cfg: FlatConfig) -> list[tuple[str, str, int]]:
    """One step's collectives in the order PyTorch FSDP1 issues them: (op, phase, payload bytes).

    Forward: each unit all-gathers when its forward starts (the root first). Backward: a non-root unit
    all-gathers again (it was resharded after forward) when the gradient reaches its output, and every unit
    reduce-scatters when its flat gradient is complete — the inner unit first, the root last, in FSDP1 as in
    FlatUnit (FSDP2 issues the root's first)."""
    if cfg.world_size == 1:
        return []
    units = _flat_units(cfg)
    _, root = units[""]
    rows = [("all_gather", "forward", root.all_gather_payload_bytes)]
    if cfg.nested:
        _, inner = units[INNER]
        rows += [("all_gather", "forward", inner.all_gather_payload_bytes),
                 ("all_gather", "backward", inner.all_gather_payload_bytes),
                 ("reduce_scatter", "backward", inner.reduce_scatter_payload_bytes)]
    return rows + [("reduce_scatter", "backward", root.reduce_scatter_payload_bytes)]


def _rows(entries: Any) -> list[tuple[str, str, int]]:
    return [(e.op, e.phase, e.payload_bytes) for e in entries]


@ledger.register
def _(cfg: FlatConfig) -> View:
    """FlatUnit on every rank of a SimulatedWorld, ``cfg.steps`` steps: collectives of one step, the shard
    tensors each rank keeps, and parity of the trained parameters with unsharded full-batch training."""
    w, train = cfg.world_size, cfg.train
    sim = SimulatedWorld(w)
    t0 = time.perf_counter()
    results = sim.run(fsdp_rank_program, train)
    wall = (time.perf_counter() - t0) / cfg.steps
    one_step = Ledger(list(sim.ledger)[: len(sim.ledger) // cfg.steps])
    plans = unit_plans(train, w)
    root = plans[""]
    view = View("ledger", detail={"ledger": sim.ledger, "one_step": one_step, "results": results, "plans": plans,
                                  "step_wall_s": wall})
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
    want = expected_order(cfg)
    view.checks["step.order"] = (_rows(one_step) == want, f"{_rows(one_step)} (root unit: one all-gather"
                                 + (", inner unit: two" if cfg.nested else "") + ")")
    view.checks["memory.all_ranks_equal"] = (len(set(per_rank)) == 1, f"per-rank model state {per_rank} B")
    mem = ffsdp.flat_rank_memory(root.flat_numel, w, ELEM_BYTES, cfg.optimizer)
    peak = results[0].peak_unsharded_bytes
    view.checks["memory.peak_unsharded"] = (peak == mem.unsharded_param + mem.unsharded_grad,
                                            f"measured {peak} B, formula 2·P·b = "
                                            f"{2 * root.padded_numel * ELEM_BYTES} B")
    ours, (ref, _) = gather_params(train, results), reference_train(train)
    err = max(float((a - b).abs().max()) for a, b in zip(ours, ref, strict=True))
    # float32 Adam: sharded and unsharded sums differ only in summation order
    view.checks["parity.params_match_unsharded"] = (err < 1e-5, f"max |FSDP - unsharded| = {err:.2e} after "
                                                    f"{cfg.steps} steps")
    view.detail["max_abs_err"] = err
    return view


def flat_param_handle_check(cfg: FlatConfig) -> tuple[bool, list[int]]:
    """Every rank's shard of the root unit: our plan vs PyTorch's own FlatParamHandle (fake process group).
    Returns (all equal, ranks that differ)."""
    from shardlab.fsdp.torch_ref import flat_param_handle_shards
    from shardlab.fsdp.train import make_model

    model = make_model(replace(cfg, nested=False).train)
    plan = unit_plans(replace(cfg, nested=False).train, cfg.world_size)[""]
    theirs = flat_param_handle_shards(model, cfg.world_size, cfg.align)
    bad = [r for r, t in enumerate(theirs)
           if t["infos"] != {p.param_index: tuple(p)[1:] for p in plan.ranks[r].params}
           or (t["shard_numel"], t["numel_padded"]) != (plan.shard_numel, plan.ranks[r].numel_padded)
           or t["segments"] != [s.numel for s in plan.segments]]
    return not bad, bad


# ----------------------------------------------------------------------------------------- PyTorch FSDP1 / 2
def torch_fsdp(cfg: FlatConfig) -> View:
    """PyTorch's FSDP1 (``FullyShardedDataParallel``) and FSDP2 (``fully_shard``) on ``cfg.world_size`` gloo
    processes, one step, against our FlatUnit ledger: a ledger view whose checks are PyTorch's agreement.

    FSDP1 must match our ledger row by row (op, phase, payload, order), its shard metadata our plan and its
    trained shard ours; FSDP2 issues the same collectives per unit and phase with per-parameter payloads (each
    parameter's dim-0 shard padded to ceil(d0 / W)), its reduce-scatters in another order."""
    from shardlab.comm import DistributedWorld
    from shardlab.fsdp.torch_ref import torch_fsdp_both_program

    w, train = cfg.world_size, cfg.train
    both = DistributedWorld(w).run(torch_fsdp_both_program, train)
    view = ledger(cfg)
    plan, ours = view.detail["plans"][""], view.detail["results"]
    t1 = [b[0] for b in both]
    t2 = [b[1] for b in both]
    one = view.detail["one_step"]
    # FSDP1: same shard, same data (up to summation order), same collectives in the same order
    view.checks["fsdp1.shard_metadata"] = (
        all((t["shard_numel"], t["numel_padded"], t["flat_numel"]) == (plan.shard_numel, plan.ranks[r].numel_padded,
                                                                        plan.flat_numel) for r, t in enumerate(t1)),
        f"root unit: shard numel {plan.shard_numel}, flat numel {plan.flat_numel} on every rank")
    view.checks["fsdp1.trained_shard"] = (
        all(torch.allclose(t["shard"], ours[r].shard, rtol=1e-5, atol=1e-6) for r, t in enumerate(t1)),
        f"root shard after {cfg.steps} step(s) equals FlatUnit's (float tolerance: summation order)")
    fsdp1_rows = _rows(Ledger.from_records(t1[0]["collectives"]))
    ours_rows = _rows(view.detail["ledger"])
    view.checks["fsdp1.collectives_row_by_row"] = (fsdp1_rows == ours_rows, f"{len(fsdp1_rows)} rows over "
                                                         f"{cfg.steps} step(s), op, phase, payload and order")
    # FSDP2: per-parameter shards; the same ops per phase; per-unit payloads = padded dim-0 shards
    view.checks["fsdp2.per_param_shards"] = (
        all((p["local_shape"], p["padded_shape"]) == ffsdp.per_param_shard(p["orig_shape"], w, r)
            for r, t in enumerate(t2) for p in t["params"]), "dim-0 chunk rule, padded to ceil(d0/W)")
    led2 = Ledger.from_records(t2[0]["collectives"])
    view.checks["fsdp2.same_ops_per_phase"] = (
        Counter((e.op, e.phase) for e in led2) == Counter((e.op, e.phase) for e in view.detail["ledger"]),
        str(sorted(Counter((e.op, e.phase) for e in led2).items())))
    shapes = linear_shapes(cfg.layer_sizes)
    units = [shapes[:2], shapes[2:]] if cfg.nested else [shapes]
    padded = sorted(ELEM_BYTES * sum(_prod(ffsdp.per_param_shard(s, w, 0)[1]) for s in u) for u in units)
    got = sorted({e.payload_bytes for e in led2 if e.op == "all_gather"})
    view.checks["fsdp2.unit_payloads"] = (
        w == 1 or (got == padded and sorted({e.payload_bytes for e in led2 if e.op == "reduce_scatter"})
                   == [w * b for b in padded]),
        f"all-gather payloads per unit {got} B = padded dim-0 shards {padded} B; reduce-scatter = W × those")
    view.detail["torch"] = {"fsdp1": t1, "fsdp2": t2, "fsdp1_rows": fsdp1_rows, "fsdp2_rows": _rows(led2),
                            "ours_rows": ours_rows, "one_step": _rows(one)}
    return view


def collectives_frame(view: View) -> Any:
    """One step's collectives side by side: FlatUnit (ours), PyTorch FSDP1, PyTorch FSDP2 (from :func:`torch_fsdp`)."""
    import pandas as pd

    t = view.detail["torch"]
    n = len(t["one_step"])
    cols = {"FlatUnit (ours)": t["ours_rows"][:n], "PyTorch FSDP1": t["fsdp1_rows"][:n],
            "PyTorch FSDP2": t["fsdp2_rows"][:n]}
    return pd.DataFrame({k: [f"{op} {ph} {b} B" for op, ph, b in v] for k, v in cols.items()})


# ------------------------------------------------------------------------------------ per-parameter (GSPMD)
STEP_KINDS = ("all_gather", "unshard_all_reduce", "reduce_scatter")


def _step_values(view: View, s: ffsdp.StepBytes, counts: dict[str, int] | None = None) -> View:
    """Add the step's values from a StepBytes (``counts``: instruction counts when the compiler combined
    collectives; then the logical counts of ``s`` become ``.operands``)."""
    logical = {"all_gather": s.all_gather_count, "unshard_all_reduce": s.unshard_all_reduce_count,
               "reduce_scatter": s.reduce_scatter_count}
    nbytes = {"all_gather": s.all_gather_forward + s.all_gather_backward,
              "unshard_all_reduce": s.unshard_all_reduce_forward + s.unshard_all_reduce_backward,
              "reduce_scatter": s.reduce_scatter}
    for k in STEP_KINDS:
        n = logical[k] if counts is None else counts[k]
        view.add(f"step.{k}.count", n, "count")
        if n != logical[k]:
            view.add(f"step.{k}.operands", logical[k], "operands")
        view.add(f"step.{k}.bytes", nbytes[k], "bytes")
    view.add("step.unshard.forward.bytes", s.all_gather_forward + s.unshard_all_reduce_forward, "bytes")
    view.add("step.unshard.backward.bytes", s.all_gather_backward + s.unshard_all_reduce_backward, "bytes")
    view.add("step.collective.bytes", s.total, "bytes")
    return view


@formula.register
def _(cfg: GspmdConfig, device_kind: str = "cpu") -> View:
    """``per_param_step_bytes`` for ``device_kind``'s compiler; counts are logical collectives."""
    s = ffsdp.per_param_step_bytes(cfg.shapes(), cfg.world_size, cfg.backward_needed(), ELEM_BYTES, cfg.rule,
                                   device_kind)
    return _step_values(View("formula", detail=s), s)


def mesh_problem(world_size: int, n: int) -> str | None:
    return runtime.axis_problem(world_size, n, "world_size", "(fsdp, replica) = (W, n / W)")


def _oracle(cfg: GspmdConfig) -> tuple[float, list[torch.Tensor]]:
    """The unsharded SGD step on the CPU: (loss, updated parameters)."""
    from torch import nn

    from shardlab.fsdp.train import make_batch, make_model

    train = cfg.spec.train
    model = make_model(train)
    x, y = make_batch(train, 0)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return float(loss.detach()), [(p - train.lr * p.grad).detach() for p in model.parameters()]


def compiler(cfg: GspmdConfig) -> View:
    """The CPU HLO of both graphs (XLA's SPMD partitioner on this process's devices)."""
    world = runtime.current()
    problem = mesh_problem(cfg.world_size, world.num_devices)
    if problem:
        return View.skip("hlo", problem)
    g = gspmd.gspmd_step(cfg.spec.train, cfg.world_size, cfg.wrapper, strict=False)
    view = _step_values(View("hlo", detail=SimpleNamespace(module=g.backward, step=g)), g.measured)
    view.add("step.all_reduce_dynamic_slice.count", g.rs_pairs_with_dynamic_slice, "count")
    if g.measured.reduce_scatter_count:
        view.notes.append("XLA:CPU has no reduce-scatter: each gradient's all-reduce + dynamic-slice is counted as "
                          f"the reduce-scatter it implements ({g.rs_pairs_with_dynamic_slice} of "
                          f"{g.measured.reduce_scatter_count} seen feeding the dynamic-slice directly; uneven dims "
                          "put a pad or slice in between)")
    if not g.is_fsdp:
        other = ", ".join(f"{op} {b} B" for op, b in g.resharding.items())
        why = (f"the partitioner chose another algorithm here ({other} besides all-gathers / all-reduces): "
               "not the per-parameter FSDP algebra")
        for name in list(view.values):
            view.differs[name] = why
        view.add("step.resharding.bytes", sum(g.resharding.values()), "bytes")
        view.differs["step.resharding.bytes"] = "collectives outside the FSDP algebra: measured, not compared"
    loss, ref = _oracle(cfg)
    # f32 on both sides: the partitioned sums differ from the dense ones only in order
    view.checks["parity.hlo.sgd_step"] = (
        abs(g.loss - loss) <= 1e-5 * max(1.0, abs(loss))
        and all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(g.updated, ref, strict=True)),
        "loss and every updated parameter == the unsharded SGD step")
    groups = {len(c.replica_groups[0]) for m in (g.forward, g.backward) for c in m.collectives if c.replica_groups}
    view.checks["hlo.group_size"] = (groups <= {cfg.world_size}, f"collectives run in groups of {sorted(groups)}, "
                                     f"W = {cfg.world_size}")
    view.notes.append(f"the scalar loss all-reduce ({g.other_all_reduce_bytes} B) is not FSDP traffic")
    return view


def _tpu_reasons(moved: list[gspmd.Moved], name: str) -> str:
    """Why XLA:TPU's value for ``name`` differs from XLA:CPU's, read from its program (one clause per cause)."""
    parts = name.split(".")
    kind, quantity = parts[1], parts[-1]
    graph = {"forward": "forward", "backward": "backward"}.get(parts[2]) if kind == "unshard" else None
    scope = [m for m in moved if graph in (None, m.graph)]
    mine = [m for m in scope if m.kind == kind]
    instructions = len({(m.graph, m.instruction) for m in mine})
    unshards = [m for m in scope if m.kind in ("all_gather", "unshard_all_reduce")]
    bf16 = sum(m.dtype == "bf16" for m in unshards)
    vectors = sorted({m.shape[0] for m in unshards if m.kind == "unshard_all_reduce" and len(m.shape) == 1})
    why = []
    if quantity == "count" and instructions != len(mine):
        why.append(f"combined: {len(mine)} in {instructions} instruction(s)")
    if kind == "reduce_scatter" and any(m.op == "reduce-scatter" for m in mine):
        why.append(f"{sum(m.op == 'reduce-scatter' for m in mine)} by a real reduce-scatter")
    if kind in ("all_gather", "unshard_all_reduce", "unshard", "collective") and vectors:
        why.append(f"vectors replicated by all-reduces of the padded vector {vectors}")
    if quantity == "bytes" and kind in ("all_gather", "unshard", "collective") and bf16:
        why.append(f"{bf16} weight gather(s) in bf16")
    return "; ".join(why) or "XLA:TPU chose another lowering"


def explain(*views: View) -> Any:
    """What :func:`shardlab.views.record` would print, as one table: each skipped view's reason, each note, and
    every value a view lists in ``differs`` with why (``record(..., show=False)`` then ``explain(...)``)."""
    import pandas as pd

    rows = []
    for v in views:
        if not v.ran:
            rows.append({"view": v.source, "value": "(skipped)", "why": v.skipped})
            continue
        rows += [{"view": v.source, "value": "(note)", "why": note} for note in v.notes]
        rows += [{"view": v.source, "value": name, "why": why} for name, why in v.differs.items()]
    with pd.option_context("display.max_colwidth", None):
        return pd.DataFrame(rows, columns=["view", "value", "why"]).style.hide(axis="index") \
            .set_properties(**{"text-align": "left"})


def tpu(cfg: GspmdConfig, generation: str = "v5e") -> View:
    """Both graphs compiled by XLA:TPU (compile-only); see the module note for the topology rule."""
    from shardlab.profile import tpu as T

    fits = mesh_problem(cfg.world_size, runtime.current().num_devices) is None
    topology, why = T.view_topology(cfg.world_size, fits, generation)
    if topology is None:
        return View.skip("tpu", why)
    spec = cfg.spec
    cf = T.compile_program(gspmd.forward_graph, spec, topology, label="fsdp forward")
    cb = T.compile_program(gspmd.backward_graph, spec, topology, label="fsdp backward + SGD")
    if not (cf.fits and cb.fits):
        oom = cf.oom or cb.oom
        view = View("tpu", detail=SimpleNamespace(memory=None, forward=cf, backward=cb))
        view.notes.append(f"does not fit on {topology}: {oom.message.splitlines()[0] if oom else ''}")
        return view
    if cfg.wrapper != "mark_sharding":  # torch_xla's wrapper keeps its modules in reference cycles: collect them
        gc.collect()  # now, or their pending (never synced) graphs would be compiled into the next captured step
    moved = gspmd.moved_operands(cf.module, "forward") + gspmd.moved_operands(cb.module, "backward")
    counts = gspmd.instruction_counts(moved)
    s = gspmd.step_bytes(moved)
    f_tpu = formula(cfg, "tpu")
    view = _step_values(View("tpu", detail=SimpleNamespace(memory=cb.memory, forward=cf, backward=cb, moved=moved,
                                                           formula_tpu=f_tpu)), s, counts)
    view.notes.append(f"XLA:TPU {topology}: {cf.num_chips} chips, compiled in {cf.compile_s + cb.compile_s:.2f} s "
                      "(forward + backward graphs)")
    resharding = sorted({m.op for m in moved if m.kind == "resharding"})
    cpu = formula(cfg, "cpu")
    for name, value in view.values.items():
        ref = cpu.get(name, cpu.get(name.replace(".operands", ".count")))
        if resharding:
            view.differs[name] = f"XLA:TPU chose another algorithm here ({', '.join(resharding)}): not FSDP-shaped"
        elif ref is not None and value != ref:
            view.differs[name] = _tpu_reasons(moved, name)
    if resharding:
        view.add("step.resharding.bytes", sum(m.nbytes for m in moved if m.kind == "resharding"), "bytes")
        view.differs["step.resharding.bytes"] = "collectives outside the FSDP algebra: measured, not compared"
        view.notes.append("the TPU formula is not compared: the program is not per-parameter FSDP")
        return view
    out_of_domain = ffsdp.tpu_rules_apply(cfg.shapes(), cfg.world_size, cfg.rule)
    if out_of_domain:
        view.notes.append(f"the TPU formula is not compared here: {out_of_domain}")
        return view
    for name, value in f_tpu.values.items():
        got = view.get(name) if name.endswith(".bytes") else view.get(name.replace(".count", ".operands"),
                                                                       view.get(name))
        view.checks[f"tpu_formula.{name}"] = (got == value, f"formula(device_kind='tpu') {value} = tpu {got}")
    return view


def device_frame(cpu_formula: View, hlo: View, tpu_view: View) -> Any:
    """formula (CPU) | hlo | formula (TPU) | tpu, one row per value: the two compilers and what each formula
    predicts for it (``tpu_view.detail.formula_tpu``)."""
    import pandas as pd

    f_tpu = getattr(tpu_view.detail, "formula_tpu", None) if tpu_view.ran else None
    names = list(cpu_formula.values) + [n for v in (hlo, tpu_view) if v.ran for n in v.values
                                        if n not in cpu_formula.values]
    rows = []
    for n in dict.fromkeys(names):
        rows.append({"name": n, "formula (cpu)": cpu_formula.get(n), "hlo": hlo.get(n) if hlo.ran else None,
                     "formula (tpu)": f_tpu.get(n, f_tpu.get(n.replace(".operands", ".count"))) if f_tpu else None,
                     "tpu": tpu_view.get(n) if tpu_view.ran else None})
    return pd.DataFrame(rows, dtype=object)


def param_frame(cfg: GspmdConfig) -> Any:
    """Per parameter: shape, padded shard, and how each compiler unshards it (``formulas.fsdp.unshard_form``),
    with the bytes one device hands to that collective on XLA:CPU and XLA:TPU."""
    import pandas as pd

    w, rows = cfg.world_size, []
    need = cfg.backward_needed()
    for i, shape in enumerate(cfg.shapes()):
        padded = ffsdp.per_param_shard(shape, w, 0, cfg.rule)[1]
        row: dict[str, Any] = {"parameter": f"{'weight' if len(shape) == 2 else 'bias'} {i // 2}", "shape": shape,
                               "padded shard": padded, "re-gathered in backward": need[i]}
        for kind in ffsdp.DEVICE_KINDS:
            s = ffsdp.per_param_step_bytes([shape], w, [False], ELEM_BYTES, cfg.rule, kind, [len(shape) == 2])
            row[f"{kind}: unshard by"] = ffsdp.unshard_form(shape, w, cfg.rule, kind).replace("_", "-")
            row[f"{kind}: bytes"] = s.all_gather_forward + s.unshard_all_reduce_forward
        rows.append(row)
    return pd.DataFrame(rows, dtype=object)


def designs_frame(flat: FlatConfig, columns: dict[str, View]) -> Any:
    """Bytes per device and step: the model as one flat FSDP1 unit (the root, and the same unit if it were not
    the root) next to per-parameter designs (``columns``: label -> a formula / hlo / tpu view of a GspmdConfig)."""
    import pandas as pd

    n = _flat_units(replace(flat, nested=False))[""][0]
    data = {}
    for label, root in (("flat unit, root (FSDP1)", True), ("flat unit, not root (FSDP1)", False)):
        f = ffsdp.flat_step_comm(n, flat.world_size, ELEM_BYTES, root=root)
        gathers = [f.all_gather_payload_bytes if k < f.all_gather_count else 0 for k in range(2)]
        data[label] = [*gathers, f.reduce_scatter_bytes]
    for label, v in columns.items():
        if v.ran and "step.unshard.forward.bytes" in v.values:
            data[label] = [v["step.unshard.forward.bytes"], v["step.unshard.backward.bytes"],
                           v["step.reduce_scatter.bytes"]]
    frame = pd.DataFrame(data, index=["forward unshard B", "backward unshard B", "gradient reduction B"])
    frame.loc["total B"] = frame.sum()
    return frame
