"""Compiler levers as cases: the programs notebook 08 compiles, each holding the notebook's ``LeversParams``.

Design
------
Each case reads its sizes from ``p`` (:class:`shardlab.levers.params.LeversParams`) and names the variant it shows;
:mod:`shardlab.core.harness` compiles it (XLA:CPU: ``harness.hlo``; XLA:TPU compile-only: ``harness.tpu`` with the
compile options of the lever — disabled passes, XLA:TPU flags, auto-sharding)::

    StepCase(p, mode, big, combiners)   L square layers, DP or FSDP over every device (combining, overlap)
    OrderToyCase(p, compile_only)       the memory-order toy as tensors (section 3)
    UpdateCase(p, stage)                the weight update fused into the backward, or in a graph of its own
    LayoutCase(p, data, fsdp, tensor, layout)   the Megatron MLP on one mesh and weight layout (the search)

**Combining** (:class:`StepCase`, values ``<op>.{count,bytes,elements}``, no phase: the step is always forward +
backward):

- formula — DP: L gradient all-reduces (payload: one [h, h] gradient each) + 1 all-reduce of the scalar loss
  (its mean over the batch shards). FSDP: L all-gathers (payload: the [h/n, h] shard), L reduce-scatters
  (payload: the full gradient), and the loss all-reduce. n = 1: nothing is sharded, no collective at all.
- XLA:CPU — no combiner in torch_xla 2.9: one instruction per logical collective; its reduce-scatter is an
  all-reduce + dynamic-slice, counted as the reduce-scatter it is.
- XLA:TPU, compile-only, for an n-chip slice; ``combiners=False`` disables :data:`COMBINER_PASSES` and names
  every value ``<name>.combiner_off``. XLA ignores an unknown pass name silently (measured: ``"no-such-pass"``
  leaves the program unchanged), so a name is verified only by its effect — :func:`pass_effects` measures it per
  pass. Measured (libtpu 0.0.21): ``all-reduce-combiner`` alone undoes all the combining in both steps, FSDP's
  reduce-scatters included (the TPU reduces them as all-reduces, combines those, and only then turns them into
  a reduce-scatter fusion); ``reduce-scatter-combiner`` and ``all-gather-combiner`` change nothing here.
  A combined tuple collective is one instruction carrying k operands: ``count`` is then listed as differing
  (with the measured k) and ``operands`` is recorded instead.

Every view also carries ``reductions``: the logical gradient/loss reductions (reduce-scatters + all-reduces,
operands of tuple collectives counted). It is what must agree everywhere: the TPU compiler may legitimately
reduce an FSDP gradient with an all-reduce and keep its shard instead of a reduce-scatter (measured on a
4-chip slice with 16 KiB gradients), and may decompose a large reduce-scatter into a ring of
collective-permutes interleaved with the matmuls that produce it (measured at 2048² weights) — such per-op values
are listed as differing, with the measured reason.

Example::

    views = combining(StepCase(p, "fsdp"), generation=p.generation)   # formula, hlo, tpu (combiners on + off)
    harness.record(rec, "levers.combine.fsdp", *views.values())
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pandas as pd

from shardlab import runtime
from shardlab.core import harness
from shardlab.core.case import Case, Step
from shardlab.core.views import View, merge
from shardlab.levers import programs as P
from shardlab.levers.params import LeversParams
from shardlab.profile.hlo import HloModule
from shardlab.tp.case import MlpCase
from shardlab.tp.params import MlpParams

COMBINER_PASSES = ("all-reduce-combiner", "all-gather-combiner", "reduce-scatter-combiner")
LHS_OFF = {"xla_tpu_enable_latency_hiding_scheduler": False}  # XLA:TPU's latency-hiding scheduler off
LOSS_BYTES = 4  # the loss is reduced in float32
OFF = ".combiner_off"  # suffix of the values of a program compiled without the combiner passes


def _bytes(dtype: str, elements: int) -> int:
    return elements * {"float32": 4, "bfloat16": 2}[dtype]


def devices(p: LeversParams) -> int:
    """The notebook's devices: ``p.num_devices`` (None on a TPU host: every chip of this process)."""
    return int(p.num_devices or runtime.current().num_devices)


@dataclass(frozen=True)
class LeversCase(Case):
    """A lever's program on the notebook's devices (``p.num_devices``; None on a TPU host: every chip)."""

    size_name: ClassVar[str] = "num_devices"
    mesh_text: ClassVar[str] = "one mesh over every device"
    replicated: ClassVar[bool] = False  # True: no mesh, the program compiles for any device count

    p: LeversParams

    @property
    def devices(self) -> int:
        return devices(self.p)

    def mesh_problem(self, num_devices: int) -> str | None:
        """The program's mesh spans ``devices`` exactly (a replicated program: any device count)."""
        if not self.replicated and self.devices != num_devices:
            return f"the program's mesh spans num_devices={self.devices}; this process has {num_devices}"
        return None


# -------------------------------------------------------------------------------------- the DP / FSDP step
@dataclass(frozen=True)
class StepCase(LeversCase):
    """One training step of L square layers, data parallel or FSDP over every device (``programs.train_step``).

    ``big``: the overlap section's compile-only step (``p.big_layers`` weights [overlap_hidden]², batch
    ``overlap_batch``, bf16, placeholders); else ``p.layers`` x [hidden]², batch ``p.batch``, f32, real tensors.
    ``combiners=False``: XLA:TPU compiles it with :data:`COMBINER_PASSES` disabled."""

    cpu_reduce_scatter: ClassVar[bool] = True

    mode: str = "dp"
    big: bool = False
    combiners: bool = True

    def __post_init__(self) -> None:
        if self.mode not in P.MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {P.MODES}")
        n = self.devices
        if self.batch % n:
            raise ValueError(f"batch={self.batch} is not divisible by the {n} devices (batch sharding)")
        if self.mode == "fsdp" and self.hidden % n:
            raise ValueError(f"hidden={self.hidden} is not divisible by the {n} devices (FSDP shards dim 0)")

    @property
    def layers(self) -> int:
        return self.p.big_layers if self.big else self.p.layers

    @property
    def batch(self) -> int:
        return self.p.overlap_batch if self.big else self.p.batch

    @property
    def hidden(self) -> int:
        return self.p.overlap_hidden if self.big else self.p.hidden

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.big else "float32"

    @property
    def phase(self) -> str:
        return self.mode

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("all_reduce",) if self.mode == "dp" else ("all_gather", "reduce_scatter", "all_reduce")

    @property
    def grad_bytes(self) -> int:
        """Bytes of one weight gradient [hidden, hidden]."""
        return _bytes(self.dtype, self.hidden * self.hidden)

    def not_executable(self) -> str | None:
        return "placeholder inputs: compile-only" if self.big else None

    def compile_options(self) -> dict[str, Any]:
        return {"disable_passes": () if self.combiners else COMBINER_PASSES,
                "label": f"{self.mode} step{' (big)' if self.big else ''}, combiners "
                         f"{'on' if self.combiners else 'off'}"}

    def graph(self) -> Step:
        return Step(P.train_step(self.mode, self.layers, self.batch, self.hidden, self.dtype, self.p.seed, self.big))

    def formula(self) -> View:
        """The algebra of one step on ``devices`` ranks (see the module note)."""
        n, g, L, h = self.devices, self.grad_bytes, self.layers, self.hidden
        view = View("formula", detail={"grad_bytes": g})
        rows = {"all_reduce": (1, LOSS_BYTES, 1)} if self.mode == "fsdp" else \
            {"all_reduce": (L + 1, L * g + LOSS_BYTES, L * h * h + 1)}
        if self.mode == "fsdp":
            rows |= {"all_gather": (L, L * g // n, L * h * h // n), "reduce_scatter": (L, L * g, L * h * h)}
        for op in self.ops:
            count, nbytes, elems = rows[op] if n > 1 else (0, 0, 0)
            view.add(f"{op}.count", count, "count")
            view.add(f"{op}.bytes", nbytes, "bytes")
            view.add(f"{op}.elements", elems, "elements")
        view.add("reductions", (L + 1) if n > 1 else 0, "count")
        view.notes.append(f"{self.mode}: L={L} gradients of {g} bytes ({g // (h * h)} B per element) over {n} "
                          "devices")
        return view

    def read(self, view: View, module: HloModule) -> View:
        """Names without the phase, + ``reductions``; the TPU's instructions and operands, and why a per-op
        value differs from the formula (see the module note); ``.combiner_off`` names without the combiners."""
        view = view.renamed(lambda name: name.removeprefix(f"{self.phase}."))
        if view.source == "hlo":
            view.add("reductions", sum(view.get(f"{op}.count", 0) for op in ("reduce_scatter", "all_reduce")),
                     "count")
            return view
        view.add("reductions", sum(logical(view, op) for op in ("reduce_scatter", "all_reduce")
                                   if f"{op}.count" in view.values), "count")
        colls = module.collectives
        view.add("instructions", len(colls), "count")
        view.add("operands", sum(c.operands for c in colls), "operands")
        expect = self.formula()
        permutes = sum(c.op == "collective-permute" for c in colls)
        for op in self.ops:
            if logical(view, op) == expect[f"{op}.count"]:
                continue
            if permutes:
                why = (f"the tpu compiler decomposed collectives into {permutes} collective-permutes interleaved "
                       "with the matmuls (a ring it overlaps with compute)")
            elif op in ("reduce_scatter", "all_reduce"):
                why = (f"the tpu compiler reduced {expect['reduce_scatter.count'] - logical(view, 'reduce_scatter')}"
                       " FSDP gradient(s) with an all-reduce (each chip keeps its shard) instead of a reduce-scatter")
            else:
                why = f"the tpu program has {logical(view, op)} {op.replace('_', '-')}(s) (formula: " \
                      f"{expect[f'{op}.count']})"
            for q in ("count", "bytes", "elements", "operands"):
                if f"{op}.{q}" in view.values:
                    view.differs[f"{op}.{q}"] = why
        if permutes:
            view.differs["reductions"] = f"decomposed into {permutes} collective-permutes"
        return view if self.combiners else view.renamed(lambda name: name + OFF)


def logical(view: View, op: str, suffix: str = "") -> int:
    """Logical collectives ``op`` in a compiler view: its operands when combined, else its count (``suffix``
    :data:`OFF`: of the program compiled without the combiners)."""
    return view.get(f"{op}.operands{suffix}", view.get(f"{op}.count{suffix}", 0))


def tpu_on_off(case: StepCase, generation: str = "v5e") -> View:
    """XLA:TPU's program with its combiner passes on and off as one ``tpu`` view (the off program's names end in
    :data:`OFF`), with the combiner's invariants as checks."""
    on = harness.tpu(replace(case, combiners=True), generation)
    off = harness.tpu(replace(case, combiners=False), generation)
    if off.ran and "fits" in off.values:  # out of memory: the case's read() did not name its values
        off = off.renamed(lambda name: name + OFF)
    view = merge(on, off)
    if view.ran and "instructions" in view.values and "instructions" + OFF in view.values:
        (i, i_off), (o, o_off) = ((view[k], view[k + OFF]) for k in ("instructions", "operands"))
        view.checks |= {"tpu: combining never adds instructions": (i <= i_off, f"{i} <= {i_off}"),
                        "tpu: combining keeps every operand": (o == o_off, f"{o} = {o_off}"),
                        "tpu.combiner_off: one operand per instruction": (
                            o_off == i_off, "no tuple collective without the combiner passes")}
    return view


def combining(case: StepCase, tpu: bool = True, generation: str = "v5e") -> dict[str, View]:
    """The step in its views: ``formula``, ``hlo`` (XLA:CPU) and, when ``tpu``, :func:`tpu_on_off`."""
    views = {"formula": harness.formula(case), "hlo": harness.hlo(case)}
    if tpu:
        views["tpu"] = tpu_on_off(case, generation)
    return views


def effect_passes(case: StepCase) -> tuple[str, ...]:
    """The combiner passes of the collectives the step issues (``case.ops``: the DP step has no all-gather or
    reduce-scatter to combine), then a made-up name as the control."""
    return (*(q for q in COMBINER_PASSES if q.removesuffix("-combiner").replace("-", "_") in case.ops),
            "no-such-pass")


def pass_effects(case: StepCase, generation: str = "v5e", passes: tuple[str, ...] | None = None
                 ) -> tuple[pd.DataFrame, list[View]]:
    """Collective instructions (and operands) of the TPU program with each pass disabled on its own — a pass
    name is verified when disabling it changes the program (``passes`` None: :func:`effect_passes`). Returns a
    DataFrame and the views compiled."""
    rows, views = [], []
    passes = effect_passes(case) if passes is None else passes
    for disabled in ((), *((q,) for q in passes)):
        view = harness.tpu(case, generation, disable_passes=disabled,
                           label=f"{case.mode} step without {disabled or 'nothing'}")
        views.append(view)
        row: dict[str, Any] = {"disabled": disabled[0] if disabled else "(none)"}
        for op, s in sorted(view.detail.module.summary().items()):
            row[op] = f"{s['count']}" if s["count"] == s["operands"] else f"{s['count']} (carrying {s['operands']})"
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("disabled").fillna("0")
    base = frame.iloc[0]
    frame["changes the program"] = [not r.equals(base) for _, r in frame.iterrows()]
    return frame, views


def scheduler_on_off(case: Case, generation: str = "v5e") -> dict[str, View]:
    """``{"on": view, "off": view}``: XLA:TPU's program with its latency-hiding scheduler on (default) and off."""
    return {lhs: harness.tpu(case, generation, debug_options={} if lhs == "on" else LHS_OFF,
                             label=f"{case.phase}, scheduler {lhs}") for lhs in ("on", "off")}


def mlp_case(p: LeversParams, runnable: bool = False) -> MlpCase:
    """Notebook 02's Megatron MLP at tp = every device: bf16 at ``mlp_seq`` / ``mlp_hidden`` / ``mlp_ffn``
    (overlap, auto-sharding, the TPU's kernels), or — ``runnable`` — f32 at 1/8 of the sequence and 1/4 of the
    widths, a program XLA:CPU executes (its kernels)."""
    n = devices(p)
    if runnable:
        return MlpCase(MlpParams(tp=n, batch=2, seq=p.mlp_seq // 8, hidden=p.mlp_hidden // 4, ffn=p.mlp_ffn // 4,
                                 seed=p.seed))
    return MlpCase(MlpParams(tp=n, batch=2, seq=p.mlp_seq, hidden=p.mlp_hidden, ffn=p.mlp_ffn, dtype="bfloat16",
                             seed=p.seed))


# --------------------------------------------------------------------------------------------- memory order
@dataclass(frozen=True)
class OrderToyCase(LeversCase):
    """The memory-order toy (``programs.order_toy``), replicated: ``compile_only`` — one unit [p.toy_rows, 256]
    bf16 per chip, placeholders, for XLA:TPU; else [64, 64] f32 tensors XLA:CPU executes."""

    replicated: ClassVar[bool] = True

    compile_only: bool = True

    @property
    def rows(self) -> int:
        return self.p.toy_rows if self.compile_only else 64

    @property
    def cols(self) -> int:
        return 256 if self.compile_only else 64

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.compile_only else "float32"

    @property
    def phase(self) -> str:
        return "order toy"

    @property
    def unit_bytes(self) -> int:
        return _bytes(self.dtype, self.rows * self.cols)

    def not_executable(self) -> str | None:
        return "placeholder inputs: compile-only" if self.compile_only else None

    def graph(self) -> Step:
        return Step(P.order_toy(self.rows, self.cols, self.dtype, self.compile_only))


@dataclass(frozen=True)
class UpdateCase(LeversCase):
    """``programs.weight_update``'s ``stage`` ("fused" | "backward" | "update") with ``p.optimizer``:
    ``p.big_layers`` x [update_hidden]² bf16 weights, batch ``p.update_batch``, replicated, placeholders."""

    replicated: ClassVar[bool] = True

    stage: str = "fused"

    def __post_init__(self) -> None:
        if self.stage not in P.STAGES:
            raise ValueError(f"stage={self.stage!r} must be one of {P.STAGES}")

    @property
    def phase(self) -> str:
        return f"weight update: {self.stage}"

    @property
    def weight_bytes(self) -> int:
        return self.p.big_layers * _bytes("bfloat16", self.p.update_hidden ** 2)

    def not_executable(self) -> str | None:
        return "placeholder inputs: compile-only"

    def graph(self) -> Step:
        return Step(P.weight_update(self.stage, self.p.optimizer, self.p.big_layers, self.p.update_batch,
                               self.p.update_hidden))


def update_memory(views: dict[str, View]) -> dict[str, dict[str, int]]:
    """Per chip, from the TPU compiles of the three stages: ``{"temp" | "peak": {"fused", "separate"}}`` with
    peak = arguments + outputs − aliased + temporaries, and a separate update's the larger of its two graphs."""
    mem = {k: v.detail.memory for k, v in views.items()}
    peak = {k: m.argument + m.output - m.alias + m.temp for k, m in mem.items()}
    return {"temp": {"fused": mem["fused"].temp, "separate": max(mem["backward"].temp, mem["update"].temp)},
            "peak": {"fused": peak["fused"], "separate": max(peak["backward"], peak["update"])}}


# --------------------------------------------------------------------------------------------------- search
@dataclass(frozen=True)
class LayoutCase(LeversCase):
    """The Megatron MLP (batch 8, ``p.mlp_seq // 8``, ``p.mlp_hidden``, ``p.mlp_ffn``, bf16) on a (data, fsdp,
    tensor) mesh with a weight layout (``programs.mlp_layout``)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    layout: str = "megatron"

    batch: ClassVar[int] = 8

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor

    @property
    def phase(self) -> str:
        return f"mesh {self.data}·{self.fsdp}·{self.tensor} {self.layout}"  # degrees data·fsdp·tensor

    @property
    def dtype(self) -> str:
        return "bfloat16"

    def problem(self) -> str | None:
        """Why the sizes do not split over this mesh and layout (None: they do)."""
        return P.layout_problem(self.data, self.fsdp, self.tensor, self.layout, self.batch, self.p.mlp_hidden,
                                self.p.mlp_ffn, self.devices)

    def graph(self) -> Step:
        return Step(P.mlp_layout(self.data, self.fsdp, self.tensor, self.layout, self.batch, self.p.mlp_seq // 8,
                            self.p.mlp_hidden, self.p.mlp_ffn, self.dtype, self.p.seed))
