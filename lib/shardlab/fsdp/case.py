"""FSDP as cases: flat FSDP1 units (notebook 05) and per-parameter FSDP under GSPMD (05b), plus PyTorch's own.

Design
------
Each case holds its notebook's parameters ``p`` (:mod:`shardlab.core.params`: ``FsdpParams`` for 05,
``FsdpGspmdParams`` for 05b) and the variant it shows; :mod:`shardlab.core.harness` runs it through the views::

    FlatCase(p, nested, optimizer)   FSDP1 FlatParameter units trained on N ranks: formula and ledger
                                     (shardlab.fsdp.train; re-exported here)
    GspmdCase(p, wrapper)            one SGD step with every parameter sharded (dim 0, FSDP2's rule; or torch_xla's
                                     FSDPv2 wrapper: the largest dim) as two programs, forward and backward +
                                     update: formula (for XLA:CPU or, ``formula("tpu")``, XLA:TPU), hlo, tpu

    UnshardCase(p, shape, spec)      one parameter annotated ``spec`` on the (fsdp, replica) mesh, then replicated:
                                     the collectives of that unshard (05b's annotation exercise), hlo, tpu

plus :func:`torch_fsdp` (PyTorch's FSDP1 and FSDP2 as a case's reference program, which ``harness.gloo`` runs
after FlatUnit in the same gloo processes, against a FlatCase's ledger) and the notebooks'
tables. GSPMD values are named ``step.<kind>.{count,bytes}`` with kind ``all_gather`` / ``unshard_all_reduce``
(the two forms an unshard takes), ``reduce_scatter`` (the gradient reduction whatever its lowering — XLA:CPU:
all-reduce + dynamic-slice; XLA:TPU: an ``all-reduce-scatter`` fusion or an all-reduce, combined),
``step.unshard.{forward,backward}.bytes`` and ``step.collective.bytes``; counts are collective instructions and
``.operands`` the logical collectives they carry when the compiler combined some (every operand classified by
``gspmd.moved_operands``). The mesh is (fsdp, replica) = (N, devices / N); where XLA:TPU differs from the CPU formula
the TPU view says why in ``differs`` (measured from its program) and checks ``formula("tpu")`` instead — where
that formula applies (``formulas.fsdp.tpu_rules_apply``).

Example::

    case = GspmdCase(FsdpGspmdParams(world_size=8, layer_sizes=(30, 50, 10), batch=64))
    harness.record(rec, "fsdp.gspmd", harness.formula(case), harness.hlo(case), harness.tpu(case))
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import pandas as pd
import torch
import torch_xla.distributed.spmd as xs  # fsdp.case is imported after runtime.setup() (the notebooks' order)
from pandas.io.formats.style import Styler
from torch import nn

from shardlab import runtime
from shardlab.comm import Ledger
from shardlab.core import harness
from shardlab.core.case import Case, Checks, Step
from shardlab.core.views import View
from shardlab.formulas import fsdp as ffsdp
from shardlab.fsdp import gspmd  # imports torch_xla: fsdp.case is imported after runtime.setup()
from shardlab.fsdp.params import FsdpParamsBase
from shardlab.fsdp.torch_ref import TorchFsdpCase, flat_param_handle_shards
from shardlab.fsdp.train import ELEM_BYTES, LR, FlatCase, linear_shapes, make_batch, make_model
from shardlab.profile.hlo import HloModule

STEP_KINDS = ("all_gather", "unshard_all_reduce", "reduce_scatter")


# -------------------------------------------------------------------------------------- flat units (05, 05b §5)
def flat_param_handle_check(case: FlatCase) -> tuple[bool, list[int]]:
    """Every rank's shard of the root unit: our plan vs PyTorch's own FlatParamHandle (fake process group).
    Returns (all equal, ranks that differ)."""
    flat = replace(case, nested=False)
    plan = flat.plans()[""]
    theirs = flat_param_handle_shards(flat.model(), case.p.world_size, case.p.align)
    bad = [r for r, t in enumerate(theirs)
           if t["infos"] != {q.param_index: tuple(q)[1:] for q in plan.ranks[r].params}
           or (t["shard_numel"], t["numel_padded"]) != (plan.shard_numel, plan.ranks[r].numel_padded)
           or t["segments"] != [s.numel for s in plan.segments]]
    return not bad, bad


def _rows(entries: Ledger) -> list[tuple[str, str, int]]:
    return [(e.op, e.phase, e.payload_bytes) for e in entries]


def torch_fsdp(case: FlatCase) -> View:
    """PyTorch's FSDP1 (``FullyShardedDataParallel``) and FSDP2 (``fully_shard``) on ``p.world_size`` gloo
    processes against our FlatUnit ledger: the case's ledger view, with PyTorch's agreement as extra checks.

    FSDP1 must match our ledger row by row (op, phase, payload, order), its shard metadata our plan and its
    trained shard ours; FSDP2 issues the same collectives per unit and phase with per-parameter payloads (each
    parameter's dim-0 shard padded to ceil(d0 / N)), its reduce-scatters in another order."""
    w = case.p.world_size
    run = harness.gloo(TorchFsdpCase(**{f.name: getattr(case, f.name) for f in fields(case)}))
    both = run["reference"]
    view = harness.ledger(case)
    view.checks["gloo.flat_unit_ledger"] = (
        _rows(run["ledger"]) == _rows(view.detail["ledger"]),
        f"FlatUnit in {w} gloo processes issues the simulated ledger's {len(run['ledger'])} collectives row by row")
    plan, ours, one = view.detail["plans"][""], view.detail["ranks"], view.detail["one_step"]
    t1 = [b[0] for b in both]
    t2 = [b[1] for b in both]
    # FSDP1: same shard, same data (up to summation order), same collectives in the same order
    view.checks["fsdp1.shard_metadata"] = (
        all((t["shard_numel"], t["numel_padded"], t["flat_numel"]) == (plan.shard_numel, plan.ranks[r].numel_padded,
                                                                        plan.flat_numel) for r, t in enumerate(t1)),
        f"root unit: shard numel {plan.shard_numel}, flat numel {plan.flat_numel} on every rank")
    view.checks["fsdp1.trained_shard"] = (
        all(torch.allclose(t["shard"], ours[r].shard, rtol=1e-5, atol=1e-6) for r, t in enumerate(t1)),
        f"root shard after {case.p.steps} step(s) equals FlatUnit's (float tolerance: summation order)")
    fsdp1_rows = _rows(Ledger.from_records(t1[0]["collectives"]))
    ours_rows = _rows(view.detail["ledger"])
    view.checks["fsdp1.collectives_row_by_row"] = (fsdp1_rows == ours_rows, f"{len(fsdp1_rows)} rows over "
                                                   f"{case.p.steps} step(s), op, phase, payload and order")
    # FSDP2: per-parameter shards; the same ops per phase; per-unit payloads = padded dim-0 shards
    view.checks["fsdp2.per_param_shards"] = (
        all((q["local_shape"], q["padded_shape"]) == ffsdp.per_param_shard(q["orig_shape"], w, r)
            for r, t in enumerate(t2) for q in t["params"]), "dim-0 chunk rule, padded to ceil(d0/N)")
    led2 = Ledger.from_records(t2[0]["collectives"])
    view.checks["fsdp2.same_ops_per_phase"] = (
        Counter((e.op, e.phase) for e in led2) == Counter((e.op, e.phase) for e in view.detail["ledger"]),
        str(sorted(Counter((e.op, e.phase) for e in led2).items())))
    shapes = linear_shapes(case.p.layer_sizes)
    units = [shapes[:2], shapes[2:]] if case.nested else [shapes]
    padded = sorted(ELEM_BYTES * sum(math.prod(ffsdp.per_param_shard(s, w, 0)[1]) for s in u) for u in units)
    got = sorted({e.payload_bytes for e in led2 if e.op == "all_gather"})
    view.checks["fsdp2.unit_payloads"] = (
        w == 1 or (got == padded and sorted({e.payload_bytes for e in led2 if e.op == "reduce_scatter"})
                   == [w * b for b in padded]),
        f"all-gather payloads per unit {got} B = padded dim-0 shards {padded} B; reduce-scatter = N × those")
    view.detail["torch"] = {"fsdp1": t1, "fsdp2": t2, "fsdp1_rows": fsdp1_rows, "fsdp2_rows": _rows(led2),
                            "ours_rows": ours_rows, "one_step": _rows(one)}
    return view


def collectives_frame(view: View) -> pd.DataFrame:
    """One step's collectives side by side: FlatUnit (ours), PyTorch FSDP1, PyTorch FSDP2 (from :func:`torch_fsdp`)."""
    t = view.detail["torch"]
    n = len(t["one_step"])
    cols = {"FlatUnit (ours)": t["ours_rows"][:n], "PyTorch FSDP1": t["fsdp1_rows"][:n],
            "PyTorch FSDP2": t["fsdp2_rows"][:n]}
    return pd.DataFrame({k: [f"{op} {ph} {b} B" for op, ph, b in v] for k, v in cols.items()})


# ------------------------------------------------------------------------------ per-parameter under GSPMD (05b)
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


def step_operands(modules: dict[str, HloModule]) -> list[gspmd.Moved]:
    """Every collective operand of the step's two programs, classified (``gspmd.moved_operands``)."""
    return [m for graph, module in modules.items() for m in gspmd.moved_operands(module, graph)]


@dataclass(frozen=True)
class GspmdCase(Case):
    """One SGD step of the MLP with per-parameter FSDP under GSPMD on ``p.world_size`` shards, as two programs:
    forward (loss), then backward + update — between them only sharded parameters and saved activations live."""

    size_name: ClassVar[str] = "world_size"
    mesh_text: ClassVar[str] = "(fsdp, replica) = (world_size, devices / world_size)"
    ops: ClassVar[tuple[str, ...]] = ()  # every operand is classified instead (gspmd.moved_operands)
    programs: ClassVar[tuple[str, ...]] = ("forward", "backward")

    p: FsdpParamsBase
    wrapper: str = "mark_sharding"  # or "torch_xla_fsdpv2" (torch_xla's SpmdFullyShardedDataParallel)

    def __post_init__(self) -> None:
        if self.wrapper not in gspmd.WRAPPERS:
            raise ValueError(f"wrapper={self.wrapper!r} must be one of {gspmd.WRAPPERS}")

    @property
    def rule(self) -> str:
        return "dim0" if self.wrapper == "mark_sharding" else "largest"

    def shapes(self) -> list[tuple[int, ...]]:
        return linear_shapes(self.p.layer_sizes)

    def backward_needed(self) -> list[bool]:
        """dX = dY·W reads every weight but the first layer's (its input is data); biases are never read."""
        return [len(s) == 2 and i > 0 for i, s in enumerate(self.shapes())]

    def formula(self, device_kind: str = "cpu") -> View:
        """``per_param_step_bytes`` for ``device_kind``'s compiler; counts are logical collectives."""
        s = ffsdp.per_param_step_bytes(self.shapes(), self.p.world_size, self.backward_needed(), ELEM_BYTES,
                                       self.rule, device_kind)
        return _step_values(View("formula", detail=s), s)

    def graphs(self) -> Iterator[Step]:
        """forward: [loss, model output, tanh outputs]; then backward + SGD: [updated parameters, gradients]."""
        gc.collect()  # torch_xla's FSDPv2 wrapper leaves earlier builds in reference cycles: their pending (never
        # synced) graphs would be executed with this step's first program
        model, params, x, y, kept = gspmd.build(self.p, self.wrapper)
        out = gspmd.forward(model, x, y, kept)
        yield Step(out)
        yield Step(gspmd.backward(out[0], params, LR))

    def oracle(self) -> tuple[float, list[torch.Tensor]]:
        """The unsharded SGD step on the CPU: (loss, updated parameters)."""
        model = make_model(self.p)
        x, y = make_batch(self.p, 0)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return float(loss.detach()), [(q - LR * q.grad).detach() for q in model.parameters()]

    def parity(self, source: str, got: dict[str, list[torch.Tensor]], ref: tuple[float, list[torch.Tensor]]
               ) -> Checks:
        loss, updated = ref
        g_loss, g_updated = float(got["forward"][0].detach()), got["backward"][: len(updated)]
        # f32 on both sides: the partitioned sums differ from the dense ones only in order
        ok = abs(g_loss - loss) <= 1e-5 * max(1.0, abs(loss)) and all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(g_updated, updated, strict=True))
        return {"parity.hlo.sgd_step": (ok, "loss and every updated parameter == the unsharded SGD step")}

    def read(self, view: View, module: dict[str, HloModule]) -> View:
        moved = step_operands(module)
        if view.source == "hlo":
            return self._read_cpu(view, module, moved)
        if self.wrapper != "mark_sharding":  # torch_xla's wrapper keeps its modules in reference cycles: collect
            gc.collect()  # them now, or their pending (never synced) graphs would be compiled into the next step
        return self._read_tpu(view, moved)

    def _read_cpu(self, view: View, modules: dict[str, HloModule], moved: list[gspmd.Moved]) -> View:
        s = gspmd.step_bytes(moved)
        view = _step_values(view, s)
        rs = {m.instruction for m in moved if m.kind == "reduce_scatter" and m.graph == "backward"}
        pairs = sum(c.feeds_dynamic_slice for c in modules["backward"].collectives if c.name in rs)
        view.add("step.all_reduce_dynamic_slice.count", pairs, "count")
        if s.reduce_scatter_count:
            view.notes.append("XLA:CPU's pass pipeline never forms a reduce-scatter: each gradient's all-reduce + "
                              f"dynamic-slice is counted as the reduce-scatter it implements ({pairs} of "
                              f"{s.reduce_scatter_count} seen feeding the dynamic-slice directly; uneven dims put a "
                              "pad or slice in between)")
        resharding: dict[str, int] = {}
        for m in moved:
            if m.kind == "resharding":
                resharding[m.op] = resharding.get(m.op, 0) + m.nbytes
        if resharding:
            other = ", ".join(f"{op} {b} B" for op, b in resharding.items())
            why = (f"the partitioner chose another algorithm here ({other} besides all-gathers / all-reduces): "
                   "not the per-parameter FSDP algebra")
            for name in list(view.values):
                view.differs[name] = why
            view.add("step.resharding.bytes", sum(resharding.values()), "bytes")
            view.differs["step.resharding.bytes"] = "collectives outside the FSDP algebra: measured, not compared"
        groups = {len(c.replica_groups[0]) for m in modules.values() for c in m.collectives if c.replica_groups}
        view.checks["hlo.group_size"] = (groups <= {self.p.world_size}, f"collectives run in groups of "
                                         f"{sorted(groups)}, N = world_size = {self.p.world_size}")
        other_bytes = sum(m.nbytes for m in moved if m.kind == "other")
        view.notes.append(f"the scalar loss all-reduce ({other_bytes} B) is not FSDP traffic")
        return view

    def _read_tpu(self, view: View, moved: list[gspmd.Moved]) -> View:
        view = _step_values(view, gspmd.step_bytes(moved), gspmd.instruction_counts(moved))
        resharding = sorted({m.op for m in moved if m.kind == "resharding"})
        cpu = self.formula("cpu")
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
        out_of_domain = ffsdp.tpu_rules_apply(self.shapes(), self.p.world_size, self.rule)
        if out_of_domain:
            view.notes.append(f"the TPU formula is not compared here: {out_of_domain}")
            return view
        for name, value in self.formula("tpu").values.items():
            got = view.get(name) if name.endswith(".bytes") else view.get(name.replace(".count", ".operands"),
                                                                           view.get(name))
            view.checks[f"tpu_formula.{name}"] = (got == value, f"formula(device_kind='tpu') {value} = tpu {got}")
        return view


@dataclass(frozen=True)
class UnshardCase(Case):
    """One parameter of ``shape`` annotated ``spec`` on the mesh (fsdp, replica) = (N, devices / N), then unsharded: a
    replicated copy (``gspmd.unshard``). Values ``unshard.<all_gather|all_reduce>.{count,bytes,elements}``: what
    one device hands to the collectives that replicate it — FSDP2's dim-0 rule moves its padded dim-0 shard."""

    size_name: ClassVar[str] = "world_size"
    mesh_text: ClassVar[str] = "(fsdp, replica) = (world_size, devices / world_size)"
    ops: ClassVar[tuple[str, ...]] = ("all_gather", "all_reduce")

    p: FsdpParamsBase
    shape: tuple[int, ...]
    spec: tuple[str | None, ...]

    def __post_init__(self) -> None:
        axes = [a for a in self.spec if a is not None]
        if len(self.spec) != len(self.shape) or any(a not in ("fsdp", "replica") for a in axes) \
                or len(set(axes)) != len(axes):
            raise ValueError(f"spec={self.spec!r} must name one entry per dim of the parameter {list(self.shape)}: "
                             "'fsdp', 'replica' or None, each mesh axis at most once")

    @property
    def phase(self) -> str:
        return "unshard"

    def graph(self) -> Step:
        """[the replicated copy] on the current world, NOT synced."""
        n = runtime.current().num_devices
        mesh = runtime.mesh((self.p.world_size, n // self.p.world_size), ("fsdp", "replica"))
        w = torch.arange(math.prod(self.shape), dtype=torch.float32).reshape(self.shape).to(runtime.device())
        xs.mark_sharding(w, mesh, self.spec)
        return Step([gspmd.unshard(w, mesh)])


# ---------------------------------------------------------------------------------------------------- tables
def explain(*views: View) -> Styler:
    """What :func:`shardlab.core.harness.record` would print, as one table: each skipped view's reason, each note, and
    every value a view lists in ``differs`` with why (``record(..., show=False)`` then ``explain(...)``)."""
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


def device_frame(case: GspmdCase, hlo: View, tpu: View) -> pd.DataFrame:
    """formula (CPU) | hlo | formula (TPU) | tpu, one row per value: the two compilers and what each formula
    predicts for it."""
    cpu_formula, f_tpu = case.formula("cpu"), case.formula("tpu")
    names = list(cpu_formula.values) + [n for v in (hlo, tpu) if v.ran for n in v.values
                                        if n not in cpu_formula.values]
    rows = []
    for n in dict.fromkeys(names):
        rows.append({"name": n, "formula (cpu)": cpu_formula.get(n), "hlo": hlo.get(n) if hlo.ran else None,
                     "formula (tpu)": f_tpu.get(n, f_tpu.get(n.replace(".operands", ".count"))),
                     "tpu": tpu.get(n) if tpu.ran else None})
    return pd.DataFrame(rows, dtype=object)


def param_frame(case: GspmdCase) -> pd.DataFrame:
    """Per parameter: shape, padded shard, and how each compiler unshards it (``formulas.fsdp.unshard_form``),
    with the bytes one device hands to that collective on XLA:CPU and XLA:TPU."""
    w, rows = case.p.world_size, []
    need = case.backward_needed()
    for i, shape in enumerate(case.shapes()):
        padded = ffsdp.per_param_shard(shape, w, 0, case.rule)[1]
        row: dict[str, Any] = {"parameter": f"{'weight' if len(shape) == 2 else 'bias'} {i // 2}", "shape": shape,
                               "padded shard": padded, "re-gathered in backward": need[i]}
        for kind in ffsdp.DEVICE_KINDS:
            s = ffsdp.per_param_step_bytes([shape], w, [False], ELEM_BYTES, case.rule, kind, [len(shape) == 2])
            row[f"{kind}: unshard by"] = ffsdp.unshard_form(shape, w, case.rule, kind).replace("_", "-")
            row[f"{kind}: bytes"] = s.all_gather_forward + s.unshard_all_reduce_forward
        rows.append(row)
    return pd.DataFrame(rows, dtype=object)


def designs_frame(flat: FlatCase, columns: dict[str, View]) -> pd.DataFrame:
    """Bytes per device and step: the model as one flat FSDP1 unit (the root, and the same unit if it were not
    the root) next to per-parameter designs (``columns``: label -> a formula / hlo / tpu view of a GspmdCase)."""
    n = replace(flat, nested=False).units()[""][0]
    data = {}
    for label, root in (("flat unit, root (FSDP1)", True), ("flat unit, not root (FSDP1)", False)):
        f = ffsdp.flat_step_comm(n, flat.p.world_size, ELEM_BYTES, root=root)
        gathers = [f.all_gather_payload_bytes if k < f.all_gather_count else 0 for k in range(2)]
        data[label] = [*gathers, f.reduce_scatter_bytes]
    for label, v in columns.items():
        if v.ran and "step.unshard.forward.bytes" in v.values:
            data[label] = [v["step.unshard.forward.bytes"], v["step.unshard.backward.bytes"],
                           v["step.reduce_scatter.bytes"]]
    frame = pd.DataFrame(data, index=["forward unshard B", "backward unshard B", "gradient reduction B"])
    frame.loc["total B"] = frame.sum()
    return frame
