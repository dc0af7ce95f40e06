"""TorchAcc's memory levers as cases (notebook 08b): FlashAttention on the TPU compiler, ROAM's operator order, the
memory-aware weight-update schedule — each through ``shardlab.core.harness``.

Design
------
Every case holds the notebook's :class:`~shardlab.memory.params.MemoryParams` ``p`` (the sizes) and its variant::

    KernelAttentionCase(p, kernel)    one attention core, forward + backward, "flash" (torch_xla's Pallas kernel, a TPU
                                      custom call) or "plain" (softmax(QKᵀ)V): formula (the planner's terms) and tpu
                                      (compile-only for a p.tensor-chip slice; placeholders, never executed)
    RoamCase(p)                       the training step: formula (its DAG's peak by program order, greedy, ROAM's
                                      split integer program), hlo (XLA:CPU executes it; buffer assignment) and tpu
                                      (compile-only)
    UpdateScheduleCase(p, choice)     the step with every Adam update "eager", at the "end", or the "best" per-unit
                                      choice: formula (the DAG simulator) and tpu (eager updates forced by barriers)

Value names (the notebook records them under ``levers.flash``, ``levers.roam``, ``levers.update_schedule``)::

    temp_bytes.<kernel>      formula, tpu   per-chip temporaries of the attention core
    custom_calls.<kernel>    tpu            tpu_custom_call instructions (flash: forward, dq, dk/dv)
    square_bytes.<kernel>    tpu            the largest s × s array (0: none)
    nodes                    formula        operators of the step's DAG (views folded)
    peak_bytes.<order>       formula        program / greedy / ilp: the DAG's peak temporaries by that order
    peak_bytes.xla           hlo, tpu       the step's temporaries as each XLA compiler scheduled it
    peak_bytes.<choice>      formula, tpu   eager / end / best (update schedule)

The compilers hold more than the planner's terms and lay the step out otherwise than the DAG model: their values
are recorded with the measured reason (``View.differs``) and shown beside the formula's, not compared for equality.
The step's analysis (trace, ROAM, the schedule integer program) runs once per step size (:func:`analyze`, cached).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from shardlab.core import harness
from shardlab.core.case import Case
from shardlab.core.views import View
from shardlab.memory import flash, graph, ilp, roam, update_schedule, xla_step
from shardlab.memory.params import MemoryParams
from shardlab.profile import order as order_mod
from shardlab.profile.hlo import HloModule
from shardlab.profile.tpu import Step

STEP_FIELDS = ("model", "layers", "hidden", "ffn", "step_heads", "step_seq", "step_batch", "seed", "max_ops",
               "min_ops", "unsplit_limit_s")
PART_LIMIT_S = 30.0  # each part of ROAM's split solved within this (parts of <= max_ops operators: well under it)
CHOICES = ("eager", "end", "best")


# ------------------------------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class KernelAttentionCase(Case):
    """One attention core at ``p``'s sizes with ``kernel`` = "flash" or "plain" (see ``memory.flash``)."""

    p: MemoryParams
    kernel: str = "flash"

    ops: ClassVar[tuple[str, ...]] = ()  # read as memory, not collectives
    size_name: ClassVar[str] = "tensor"
    mesh_text: ClassVar[str] = "the heads split over tensor chips"

    def __post_init__(self) -> None:
        flash.check_kernel(self.kernel)

    @property
    def phase(self) -> str:
        return f"attention {self.kernel} s={self.p.seq}"

    @property
    def dtype(self) -> str:
        return "bfloat16"

    def not_executable(self) -> str | None:
        return "the attention core's inputs are placeholders: it is compiled, never executed"

    def formula(self) -> View:
        view = View("formula")
        view.add(f"temp_bytes.{self.kernel}", flash.formula_temp_bytes(self.p, self.kernel), "bytes")
        return view

    def graph(self) -> Step:
        return Step(flash.attention_graph(self.p, self.kernel))

    def read(self, view: View, module: HloModule) -> View:
        row = flash.memory_row(self.p, self.kernel, view.detail)
        k, s, heads = self.kernel, self.p.seq, self.p.heads // self.p.tensor
        view.add(f"temp_bytes.{k}", row.temp, "bytes")
        ratio = row.temp / row.formula if row.formula else float("nan")
        view.differs[f"temp_bytes.{k}"] = (
            "XLA:TPU holds everything the program needs (GQA-expanded K and V, fp32 copies, "
            + ("the kernel's softmax statistics 128 lanes wide" if k == "flash" else "the masked scores")
            + f"); the planner counts only {'the log-sum-exp' if k == 'flash' else 'the s×s softmax, dP and dS'}: "
            f"compiler / planner = {ratio:.2f}")
        view.add(f"custom_calls.{k}", row.custom_calls, "count")
        view.add(f"square_bytes.{k}", row.square_bytes, "bytes")
        if k == "flash":
            view.checks[f"tpu.{k}.three_custom_calls"] = (
                row.custom_calls == 3, f"{row.custom_calls} tpu_custom_call instructions: forward, dq, dk/dv")
            view.checks[f"tpu.{k}.no_square_array"] = (
                row.square_bytes == 0, f"no array of the program has two dimensions of s = {s} "
                f"(largest: {row.largest[0].shape if row.largest else 'none'})")
        else:
            view.checks[f"tpu.{k}.square_array"] = (
                row.square_bytes >= 2 * heads * s * s,
                f"the largest s×s array is {row.square_bytes} B >= one bf16 [{heads}, {s}, {s}] score array "
                f"({2 * heads * s * s} B)")
            view.checks[f"tpu.{k}.no_custom_call"] = (row.custom_calls == 0, f"{row.custom_calls} custom calls")
        return view


def attention_row(p: MemoryParams, kernel: str, view: View | None = None) -> flash.AttentionMemory | None:
    """The per-chip memory row of one compile (out of memory is a row too) — of ``view`` (a KernelAttentionCase's tpu
    view) or of a new compile; None when the TPU view is skipped."""
    view = view or harness.tpu(KernelAttentionCase(p, kernel), p.generation)
    return flash.memory_row(p, kernel, view.detail) if view.ran else None


def sweep(p: MemoryParams, seqs: list[int]) -> list[flash.AttentionMemory]:
    """Both kernels at each sequence length (``p``'s other sizes), one compile each."""
    rows = [attention_row(replace(p, seq=s), k) for s in seqs for k in flash.KERNELS]
    return [r for r in rows if r is not None]


def seq_max_fit(p: MemoryParams, kernel: str, start: int | None = None, criterion: str = "peak") -> flash.SeqFit:
    """The longest sequence (a multiple of 1024) whose attention core fits one chip by ``criterion``: "peak" — the
    chip holds arguments + outputs + temporaries (nothing is donated: O, dQ, dK, dV count); "check" — XLA:TPU's
    capacity check passes (arguments + temporaries; what the compiler itself accepts)."""
    if criterion not in flash.CRITERIA:
        raise ValueError(f"criterion={criterion!r} must be one of {flash.CRITERIA}")
    peaks: dict[int, int] = {}

    def fits(s: int) -> bool:
        row = attention_row(replace(p, seq=s), kernel)
        if row is None:
            raise ValueError(f"seq_max_fit: the TPU view is skipped here (tensor={p.tensor})")
        if row.peak is not None:
            peaks[s] = row.peak
        return row.holds if criterion == "peak" else row.fits

    fit = flash.seq_max_fit(fits, kernel, start=start)
    return replace(fit, criterion=criterion, peaks=peaks)


# ------------------------------------------------------------------------------------------------ the step
@dataclass
class Analysis:
    """One step size's DAG, ROAM's comparison and the update schedules (bytes; seconds as measured)."""

    step: graph.StepGraph
    roam: roam.RoamResult
    schedule: dict[str, Any]  # update_schedule.compare: eager / end / best peaks, the best schedule
    seconds: float


def step_key(p: MemoryParams) -> tuple[Any, ...]:
    return tuple(getattr(p, f) for f in STEP_FIELDS)


@functools.lru_cache(maxsize=8)
def _analyze(key: tuple[Any, ...]) -> Analysis:
    p = MemoryParams(**dict(zip(STEP_FIELDS, key, strict=True)))
    t0 = time.perf_counter()
    step = graph.trace_step(p)
    res = roam.compare(step, p.max_ops, p.min_ops, PART_LIMIT_S, p.unsplit_limit_s or None)
    return Analysis(step, res, update_schedule.compare(step), time.perf_counter() - t0)


def analyze(p: MemoryParams) -> Analysis:
    """Trace ``p``'s step, order it (program, greedy, ROAM's split ILP, the unsplit ILP within
    ``p.unsplit_limit_s``) and solve its update schedule — once per step size."""
    return _analyze(step_key(p))


@dataclass(frozen=True)
class ReplicatedStepCase(Case):
    """The training step at ``p``'s sizes on the XLA world, replicated (any device count holds it)."""

    p: MemoryParams

    ops: ClassVar[tuple[str, ...]] = ()
    size_name: ClassVar[str] = "num_devices"

    @property
    def devices(self) -> int:
        return 1

    def mesh_problem(self, num_devices: int) -> str | None:
        return None  # replicated: every device runs the whole step

    def schedule(self) -> dict[str, str]:
        return {}

    def donated(self) -> bool:
        """Updates on clones donated to their inputs (the graph XLA:TPU compiles) or, False, in place as torch_xla
        runs a step (the graph XLA:CPU executes); see ``memory.xla_step``."""
        return True

    def graph(self) -> Step:
        return xla_step.build(self.p, self.schedule(), self.donated())

    def compile_options(self) -> dict[str, Any]:
        return {"label": f"step {self.p.model} L={self.p.layers}"}


@dataclass(frozen=True)
class RoamCase(ReplicatedStepCase):
    """ROAM's orders of the step's DAG (formula) beside XLA's own schedules of the same step (hlo: ``executed=True``,
    the in-place step XLA:CPU runs; tpu: the donated step)."""

    executed: bool = False

    def donated(self) -> bool:
        return not self.executed

    @property
    def phase(self) -> str:
        return "roam"

    def formula(self) -> View:
        a = analyze(self.p)
        r = a.roam
        view = View("formula", detail=a)
        view.add("nodes", r.nodes, "operators")
        for k in ("program", "greedy", "ilp"):
            view.add(f"peak_bytes.{k}", r.peaks[k], "bytes")
        # (the split ILP <= greedy and the schedule order holds by construction: each part is solved along an order
        # with that peak; the independent checks are the brute-force search and the unsplit program's bound)
        if r.unsplit is not None:
            view.checks["formula.roam.unsplit_bound"] = (
                r.unsplit.bound <= r.peaks["ilp"] + 1e-6 * r.peaks["ilp"],
                f"the unsplit integer program's lower bound {r.unsplit.bound:.0f} <= split ILP {r.peaks['ilp']}")
        return view

    def read(self, view: View, module: HloModule) -> View:
        if view.source == "hlo":
            if module.buffers is None:
                raise RuntimeError("XLA:CPU wrote no buffer assignment for the step")
            view.add("peak_bytes.xla", module.buffers.temp, "bytes")
        else:
            view.add("peak_bytes.xla", view.detail.memory.checked_temp, "bytes")
            view.differs["peak_bytes.xla"] = (
                "XLA:TPU's own schedule and layout: it fuses elementwise chains (no buffer between them), pads "
                "arrays to (8, 128) tiles and keeps small ones on chip")
        return view


@dataclass(frozen=True)
class UpdateScheduleCase(ReplicatedStepCase):
    """The step with every update unit ``choice`` = "eager" / "end", or the "best" per-unit schedule."""

    choice: str = "best"

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ValueError(f"choice={self.choice!r} must be one of {CHOICES}")

    @property
    def phase(self) -> str:
        return f"update schedule {self.choice}"

    def schedule(self) -> dict[str, str]:
        a = analyze(self.p)
        if self.choice == "best":
            return dict(a.schedule["schedule"])
        return update_schedule.uniform(update_schedule.plan(a.step), self.choice)

    def formula(self) -> View:
        view = View("formula")
        view.add(f"peak_bytes.{self.choice}", analyze(self.p).schedule[self.choice], "bytes")
        return view

    def read(self, view: View, module: HloModule) -> View:
        view.add(f"peak_bytes.{self.choice}", view.detail.memory.checked_temp, "bytes")
        view.differs[f"peak_bytes.{self.choice}"] = (
            "XLA:TPU orders the lazy graph itself (only an eager update is pinned, by a barrier before the next "
            "block's backward), fuses and pads: its temporaries are its own schedule's")
        return view


def brute_force_check(p: MemoryParams) -> dict[str, Any]:
    """ILP vs exact search (``profile.order.extremes``) on the forward + backward of ``p``'s step (no optimizer):
    ``{nodes, ilp, brute, optimal, seconds}``; ``brute`` None when the graph is too wide for the exact search."""
    step = graph.trace_step(p, optimizer="none")
    sol = ilp.solve(ilp.problem_from_graph(step.graph), PART_LIMIT_S)
    try:
        brute = order_mod.extremes(step.graph).best.peak
    except ValueError:
        brute = None
    return {"nodes": step.nodes, "ilp": sol.peak, "brute": brute, "optimal": sol.optimal, "seconds": sol.seconds}
