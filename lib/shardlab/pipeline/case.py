"""Pipeline parallelism as cases (notebook 09): a schedule through the four views, and the SPMD pipeline's shifts.

Design
------
Each case holds the notebook's :class:`~shardlab.pipeline.params.PipelineParams` ``p`` and its variant;
:mod:`shardlab.core.harness` runs it through the views::

    ScheduleCase(p, schedule)   GPipe / 1F1B / interleaved 1F1B: p = stages devices, m microbatches, v chunks
    ShiftCase(p, how)           one shift of the SPMD pipeline's [p, rows, h] state, written four ways
    FsdpCase(p)                 the SPMD GPipe forward on a 2-D mesh, weights sharded over the second axis

A :class:`ScheduleCase`'s views (values under ``<schedule>.``, recorded as ``pp.<schedule>.…``):

- **formula** — :mod:`shardlab.formulas.pipeline`: ``p2p.count`` / ``p2p.bytes`` (every send of the step, all
  devices), ``bubble_fraction`` (idle share of the step, (p - 1)/(v m + p - 1)), ``bubble_ratio`` (bubble over
  ideal time, Narayanan et al.'s (p - 1)/(v m)), ``peak_inflight_microbatches`` (device 0, the most).
- **ledger** — the language model (:class:`~shardlab.pipeline.model.TinyLM`) cut by the automatic split into
  p v stages, each device's :func:`~shardlab.pipeline.programs.pipeline_program` run in a ``SimulatedWorld``:
  its sends, the bubble of what it executed (timed by :func:`~shardlab.pipeline.timeline.replay` from the
  messages in the ledger — each action waits for the actions whose sends it received — stages of equal cost,
  backward = 2 forward), the activations it really held; its sends and receives, in order, against the ones
  PyTorch's order of the same schedule needs (:func:`p2p_of_order`); loss and every gradient against the
  unsplit model.
- **hlo / tpu** — the same pipeline as ONE SPMD program on a mesh (stage, data) = (p, n / p): GPipe with the
  "pad" shift and autograd's reversed loop (:mod:`shardlab.pipeline.spmd`), interleaved as the circular pipeline
  (v repeats, "cat" shift, forward only), 1F1B as one loop with the backward written into its body
  (:mod:`shardlab.pipeline.spmd_1f1b`: m + 2 (p - 1) ticks, a forward and a backward shift per tick, 2 p - 1
  stash slots per stage). Its stages are one tanh layer each (stacked stages must be identical), but the tensor a
  stage hands over is the language model's cut, [batch / m · seq, h]. Read from the program: the loops' trip
  count, the idle share it implies, and the collective-permutes — under ``spmd.`` (GPipe), ``spmd.circular.``
  (interleaved) and ``spmd.1f1b.``, where the formula (:func:`shardlab.formulas.pipeline.spmd_loop`, written
  apart from the code that builds the loops) predicts the loop's shifts, bubble iterations included.

The compiled programs' parity is checked against their own dense layers (``spmd.dense_forward``), and the
notebook runs the per-stage GPipe program on those very layers too (:func:`spmd_ledger`).

Example::

    case = ScheduleCase(PipelineParams(), "gpipe")
    harness.record(rec, "pp", *harness.views(case))
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)

from shardlab import runtime
from shardlab.comm import Ledger, SimulatedWorld
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import COMPILERS as COMPILER
from shardlab.core.views import View
from shardlab.formulas import pipeline as fpp
from shardlab.pipeline import spmd, spmd_1f1b
from shardlab.pipeline.model import TinyLM, batch
from shardlab.pipeline.params import PipelineParams
from shardlab.pipeline.programs import dense_step, merge_results, pipeline_program, run_stages
from shardlab.pipeline.schedules import Schedule, build
from shardlab.pipeline.split import Stages, Traced, best_cuts, split, trace
from shardlab.pipeline.timeline import replay
from shardlab.pipeline.torch_ref import torch_orders, torch_pipeline_program
from shardlab.profile.hlo import HloModule

F32 = 4
__all__ = ["FsdpCase", "p2p_of_order", "ScheduleCase", "ShiftCase", "model_and_batch", "spmd_ledger",
           "traced_model"]


# ------------------------------------------------------------------------------------------- the model and its split
def model_and_batch(p: PipelineParams) -> tuple[TinyLM, torch.Tensor, torch.Tensor]:
    """The language model of ``p`` and one step's (tokens, targets), [batch, seq] each."""
    tokens, targets = batch(p.vocab, p.seq, p.batch, seed=p.seed + 1)
    return TinyLM(p.vocab, p.hidden, p.heads, p.ffn, p.layers, seed=p.seed), tokens, targets


@functools.lru_cache(maxsize=4)
def _traced(vocab: int, hidden: int, heads: int, ffn: int, layers: int, seq: int, size: int, seed: int) -> Traced:
    model = TinyLM(vocab, hidden, heads, ffn, layers, seed=seed)
    return trace(model, batch(vocab, seq, size, seed=seed + 1)[0])


def traced_model(p: PipelineParams) -> Traced:
    """The language model traced and costed once per model size (:func:`shardlab.pipeline.split.trace`)."""
    return _traced(p.vocab, p.hidden, p.heads, p.ffn, p.layers, p.seq, p.batch, p.seed)


def _auto_stages(p: PipelineParams, n: int) -> Stages:
    traced = traced_model(p)
    return split(traced, best_cuts(traced.train_costs, traced.frontier, n).cuts)


def p2p_of_order(orders: list[list[Any]], stages: int, device_of: Any) -> list[list[tuple[str, int]]]:
    """What each device must send and receive, in order, to run ``orders`` (e.g. PyTorch's): a forward of stage k
    receives from k - 1's device and sends to k + 1's, a backward the reverse (nothing between stages on one
    device; none before stage 0 or after the last)."""
    out = []
    for r, acts in enumerate(orders):
        rows: list[tuple[str, int]] = []
        for a in acts:
            src, dst = (a.stage - 1, a.stage + 1) if a.kind == "F" else (a.stage + 1, a.stage - 1)
            if 0 <= src < stages and device_of(src) != r:
                rows.append(("recv", device_of(src)))
            if 0 <= dst < stages and device_of(dst) != r:
                rows.append(("send", device_of(dst)))
        out.append(rows)
    return out


def _grads_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> bool:
    """Every gradient within rtol 1e-5 and 1e-5 x the largest entry of the model (fp32: the pipeline adds m
    microbatch partial sums, the unsplit model reduces all rows in one matmul — rounding only)."""
    scale = max(g.abs().max().item() for g in ref.values())
    return set(got) == set(ref) and all(torch.allclose(got[k], r, rtol=1e-5, atol=1e-5 * scale) for k, r in ref.items())


def _spmd_oracle(x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = spmd.dense_forward(x, w)
    loss = spmd.pipeline_loss(out)
    gx, gw = torch.autograd.grad(loss, (x, w))
    return {"out": out.detach(), "loss": loss.detach(), "gx": gx, "gw": gw}


# ------------------------------------------------------------------------------------------------------ schedules
@dataclass(frozen=True)
class ScheduleCase(Case):
    """One training step of the pipeline under ``schedule`` (see the module note)."""

    p: PipelineParams
    schedule: str = "gpipe"  # gpipe | 1f1b | interleaved

    ops: ClassVar[tuple[str, ...]] = ()  # values come from ledger_extra / read: sends and shifts, not collectives
    size_name: ClassVar[str] = "stages"
    mesh_text: ClassVar[str] = "(stage, data) = (stages, n / stages)"

    def __post_init__(self) -> None:
        fpp.check_pipeline(self.p.stages, self.p.microbatches, self.v, self.schedule)

    # ------------------------------------------------------------------------------------------- identity
    @property
    def phase(self) -> str:
        return self.schedule

    @property
    def v(self) -> int:
        return self.p.virtual if self.schedule == "interleaved" else 1

    @property
    def spmd_key(self) -> str:
        """Where the SPMD program's values go: ``spmd`` (GPipe), ``spmd.circular`` (interleaved), ``spmd.1f1b``."""
        return {"gpipe": "spmd", "1f1b": "spmd.1f1b"}.get(self.schedule, "spmd.circular")

    @property
    def backward(self) -> bool:
        """The compiled program: GPipe and 1F1B forward + backward; the circular pipeline forward only (its backward
        mirrors it; one program of each is enough for the notebook's time budget)."""
        return self.schedule != "interleaved"

    def replicas(self, num_devices: int | None = None) -> int:
        """Pipelines side by side on the `data` axis where the compiled program runs: n / p on this process's n
        devices when p tiles them, else 1 (the TPU view then compiles p chips in a helper process)."""
        n = runtime.current().num_devices if num_devices is None else num_devices
        return n // self.p.stages if self.mesh_problem(n) is None else 1

    def mesh_problem(self, num_devices: int) -> str | None:
        problem = super().mesh_problem(num_devices)
        if problem is None and self.p.rows % (num_devices // self.p.stages):
            return (f"the data axis n / stages = {num_devices // self.p.stages} does not divide a microbatch's "
                    f"rows = batch / microbatches * seq = {self.p.rows}")
        return problem

    def sched(self) -> Schedule:
        return build(self.schedule, self.p.stages, self.p.microbatches, self.v)

    # -------------------------------------------------------------------------------------------- formula
    def formula(self) -> View:
        p, s, v = self.p, self.schedule, self.v
        P, m = p.stages, p.microbatches
        f = fpp.p2p_traffic(P, m, p.batch // m, p.seq, p.hidden, "float32", v=v)
        view = View("formula", detail=f)
        view.add(f"{s}.p2p.count", int(f["count"]), "count")
        view.add(f"{s}.p2p.bytes", int(f["bytes"]), "bytes")
        view.add(f"{s}.bubble_fraction", fpp.idle_fraction(P, m, v), "fraction")
        view.add(f"{s}.bubble_ratio", fpp.bubble_ratio(P, m, v), "ratio")
        view.add(f"{s}.peak_inflight_microbatches", fpp.peak_inflight(s, P, m, v, device=0), "microbatches")
        loop = fpp.spmd_loop(s, P, m, v)
        k, T = self.spmd_key, loop["trip_count"]
        transfers = loop["shifts"] * loop["loops"] * loop["pairs"] * T  # per step, bubble iterations included
        view.add(f"{k}.trip_count", T, "iterations")
        view.add(f"{k}.p2p.count", transfers, "count")
        view.add(f"{k}.p2p.bytes", transfers * p.rows * p.hidden * F32, "bytes")
        if s == "1f1b":  # the loop's own idle share: 2 (p - 1) of its m + 2 (p - 1) ticks run no microbatch
            view.add(f"{k}.bubble_fraction", (T - m) / T, "fraction")
            view.add(f"{k}.stash_slots", loop["held"], "slots")
        if s != "interleaved":  # one collective-permute per shift, of one [rows / r, h] shard per device
            shard = p.rows // self.replicas() * p.hidden * F32
            permutes = loop["shifts"] * loop["loops"]
            view.add(f"{k}.all_reduce.in_loop.step_count", 0, "count")  # the data-parallel gradient sum: after it
            view.add(f"{k}.collective_permute.count", permutes, "count")
            view.add(f"{k}.collective_permute.bytes", permutes * shard, "bytes")
            view.add(f"{k}.collective_permute.step_count", permutes * T, "count")
            view.add(f"{k}.collective_permute.step_bytes", permutes * T * shard, "bytes")
        return view

    # --------------------------------------------------------------------------------------------- ledger
    def program(self) -> list[Program]:
        stages = _auto_stages(self.p, self.p.stages * self.v)
        _, tokens, targets = model_and_batch(self.p)
        return [(run_stages, (self.sched(), copy.deepcopy(stages.modules), stages.param_names, stages.boundary,
                             tokens, targets))]

    def reference_program(self) -> Program:
        """PyTorch's own pipelining of the same step (its ``PipelineStage`` + schedule class, the gloo warm-up
        replaced — see torch_ref) on the same stages: shapes given up front, or (1F1B) inferred at run time by its
        own metadata exchange. Only real processes run it (``harness.gloo``)."""
        stages = _auto_stages(self.p, self.p.stages * self.v)
        _, tokens, targets = model_and_batch(self.p)
        return (torch_pipeline_program, (self.schedule, self.p.microbatches, list(stages.modules),
                                         list(stages.param_names), tokens, targets, self.schedule != "1f1b"))

    def oracle(self) -> dict[str, Any]:
        model, tokens, targets = model_and_batch(self.p)
        loss, grads = dense_step(model, tokens, targets)
        return {"loss": loss, "grads": grads, "spmd": _spmd_oracle(*self.spmd_inputs())}

    def parity(self, source: str, got: Any, ref: dict[str, Any]) -> Checks:
        s = self.schedule
        if source == "ledger":
            loss, grads = merge_results(got)
            return {f"{s}.parity.ledger.loss": (torch.allclose(loss, ref["loss"], rtol=1e-6, atol=0),
                                                f"pipeline loss {loss.item():.6f} == unsplit {ref['loss'].item():.6f}"),
                    f"{s}.parity.ledger.grads": (_grads_close(grads, ref["grads"]),
                                                 f"all {len(ref['grads'])} parameter gradients == the unsplit model's")}
        want = ref["spmd"]
        checks = {f"{s}.parity.hlo.output": (torch.allclose(got[0], want["out"], rtol=1e-5, atol=1e-5),
                                             "SPMD pipeline output == its layers run one after another")}
        if self.backward:
            checks[f"{s}.parity.hlo.grads"] = (
                torch.allclose(got[1], want["loss"], rtol=1e-5, atol=0)
                and all(torch.allclose(g, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())
                        for g, r in ((got[2], want["gx"]), (got[3], want["gw"]))),
                "loss, input and weight gradients == the dense layers'")
        return checks

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        s, sched = self.schedule, self.sched()
        sends = [b for r in results for b in r["sends"]]
        view.add(f"{s}.p2p.count", len(sends), "count")
        view.add(f"{s}.p2p.bytes", sum(sends), "bytes")
        # timed from the messages the devices exchanged (the ledger), not from the schedule's dependency rule
        t = replay(sched, [r["order"] for r in results], [r["p2p"] for r in results], forward=1, backward=2)
        view.add(f"{s}.bubble_fraction", float(t.idle_fraction), "fraction")
        view.add(f"{s}.bubble_ratio", float(t.bubble_ratio), "ratio")
        view.add(f"{s}.peak_inflight_microbatches", max(r["peak_held"] for r in results), "microbatches")
        theirs = torch_orders(s, sched.p, sched.m, sched.v)
        want = p2p_of_order(theirs, sched.stages, sched.device_of)
        got = [[row for rows in r["p2p"] for row in rows] for r in results]
        view.checks[f"{s}.ledger.p2p_as_pytorch"] = (
            got == want, f"each device's sends and receives ({sum(map(len, got))} rows), in order, are the ones "
                         "torch.distributed.pipelining's order of this schedule needs")
        view.detail |= {"timeline": t}
        return view

    # ---------------------------------------------------------------------------------------------- compilers
    def spmd_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x [m, rows, h], W [v, p, h, h] on the CPU."""
        p = self.p
        return spmd.init(p.stages, p.microbatches, self.v, p.rows, p.hidden, seed=p.seed)

    def graph(self) -> Step:
        x, w = self.spmd_inputs()
        dev, n = runtime.device(), runtime.current().num_devices
        mesh = runtime.mesh((self.p.stages, n // self.p.stages), ("stage", "data"))
        if self.schedule == "1f1b":
            return Step(spmd_1f1b.one_f_one_b_step(x.to(dev), w.to(dev), mesh, data_axis="data"))
        return Step(spmd.pipeline_step(x.to(dev), w.to(dev), mesh, how="pad" if self.v == 1 else "cat",
                                  data_axis="data", backward=self.backward))

    def read(self, view: View, module: HloModule) -> View:
        src, s, k, p = view.source, self.schedule, self.spmd_key, self.p
        got = spmd.read_program(module)
        trips = got["trip_counts"]
        T = trips[0] if trips else 0
        loops = 2 if s == "gpipe" else 1
        view.checks[f"{s}.{src}.loops"] = (len(set(trips)) == 1 and len(trips) == loops,
                                           f"{'forward and backward loops' if loops == 2 else 'one loop'}, trip "
                                           f"counts {trips}")
        r = self.replicas(module.num_partitions)
        useful = self.v * p.microbatches
        if s == "1f1b":  # not the 1F1B timeline's bubble: every tick costs F + B, 2 (p - 1) of them idle
            view.add(f"{k}.bubble_fraction", (T - useful) / T, "fraction")
            held = {a.dims[1] for lp in module.while_loops for a in lp.state
                    if len(a.dims) == 4 and a.dims[0] == 1 and a.dims[2:] == (p.rows // r, p.hidden)}
            view.add(f"{k}.stash_slots", max(held) if held else 0, "slots")
        else:
            view.add(f"{s}.bubble_fraction", (T - useful) / T, "fraction")
            view.add(f"{s}.bubble_ratio", (T - useful) / useful, "ratio")
        view.add(f"{k}.trip_count", T, "iterations")
        loop = [c for c in module.collectives if c.op == "collective-permute" and c.in_while]
        transfers = sum(len(c.source_target_pairs) * (module.runs(c.computation) or 0) for c in loop)
        view.add(f"{k}.p2p.count", transfers // r, "count")
        view.add(f"{k}.p2p.bytes", sum(len(c.source_target_pairs) * (module.runs(c.computation) or 0) * c.operand_bytes
                                       for c in loop), "bytes")
        if s != "interleaved":
            view.add(f"{k}.collective_permute.count", len(loop), "count")
            view.add(f"{k}.collective_permute.bytes", sum(c.operand_bytes for c in loop), "bytes")
            view.add(f"{k}.collective_permute.step_count", sum(module.runs(c.computation) or 0 for c in loop), "count")
            view.add(f"{k}.collective_permute.step_bytes",
                     sum((module.runs(c.computation) or 0) * c.operand_bytes for c in loop), "bytes")
        if self.backward:  # data parallelism across the pipelines: W's gradient summed over `data`, once per step
            reduce = [c for c in module.collectives if c.op == "all-reduce" and c.in_while]
            runs = sum(module.runs(c.computation) or 0 for c in reduce)
            view.add(f"{k}.all_reduce.in_loop.step_count", runs, "count")
            if runs:
                view.differs[f"{k}.all_reduce.in_loop.step_count"] = (
                    f"{COMPILER[src]} sums the data-parallel weight gradient inside the "
                    f"{'loop' if s == '1f1b' else 'backward loop'}: {runs} all-reduce(s) of "
                    f"{reduce[0].operand_bytes} bytes per step, where one after the loop would do")
        others = {op: n for op in ("all-gather", "all-to-all", "reduce-scatter")
                  if (n := module.count(op, in_while=True))}
        view.checks[f"{s}.{src}.no_gathers_in_loop"] = (not others,
                                                        f"gathers / all-to-alls inside the loops: {others or 'none'}")
        outside = [c for c in module.collectives if not c.in_while]
        if outside:
            view.notes.append(f"{s}: outside the loops {len(outside)} collective(s) "
                              f"({', '.join(sorted({c.op for c in outside}))}) hand the replicated input in and the "
                              "last stage's outputs and the gradients out")
        asyn = sum(c.async_ for c in loop)
        view.notes.append(f"{s}: {len(loop)} collective-permute(s) in the loop bodies, {asyn} issued asynchronously "
                          "(start / done)")
        return view


def spmd_ledger(case: ScheduleCase) -> dict[str, Any]:
    """The per-stage GPipe program (SimulatedWorld) on the SPMD program's own layers: {loss, grads (name "w.r.s"),
    sends, message_bytes} — its sends are the compiled loop's shifts minus the bubble's."""
    p = case.p
    x, w = case.spmd_inputs()
    layers, names, boundary = spmd.stage_modules(w, p.rows)
    world = SimulatedWorld(p.stages)
    results = world.run(pipeline_program, build("gpipe", p.stages, p.microbatches), layers, names, boundary,
                        x.flatten(0, 1), torch.zeros(p.microbatches * p.rows), spmd.microbatch_loss)
    loss, grads = merge_results(results)
    sends = [e.payload_bytes for led in world.ledgers for e in led.select("send")]
    return {"loss": loss, "grads": grads, "sends": len(sends), "bytes": sum(sends)}


# --------------------------------------------------------------------------------------------------------- shifts
@dataclass(frozen=True)
class ShiftCase(Case):
    """One shift of the SPMD pipeline's state [p, rows, h] (sharded on the stage axis, rows over `data`),
    written ``how`` (cat | pad | roll | cat_zeros). The formula is the data movement: every stage's slot moves to
    the next device — one collective-permute of one shard. ``cat`` and ``pad`` are checked against it; the
    compilers' translation of ``roll`` and ``cat_zeros`` is the measurement (recorded, not checked)."""

    p: PipelineParams
    how: str = "pad"

    ops: ClassVar[tuple[str, ...]] = ()  # read in `read`: count and bytes of SHIFT_OPS
    shift_ops: ClassVar[tuple[str, ...]] = ("collective_permute", "all_to_all", "all_gather")
    size_name: ClassVar[str] = "stages"
    mesh_text: ClassVar[str] = "(stage, data) = (stages, n / stages)"

    @property
    def phase(self) -> str:
        return f"shift.{self.how}"

    def mesh_problem(self, num_devices: int) -> str | None:
        return ScheduleCase(self.p).mesh_problem(num_devices)

    def formula(self) -> View:
        r = ScheduleCase(self.p).replicas()
        shard = self.p.rows // r * self.p.hidden * F32
        view = View("formula")
        for op in self.shift_ops:
            n = int(op == "collective_permute")
            view.add(f"{self.phase}.{op}.count", n, "count")
            view.add(f"{self.phase}.{op}.bytes", n * shard, "bytes")
        return view

    def oracle(self) -> torch.Tensor:
        return torch.roll(self.state(), 1, 0)

    def parity(self, source: str, got: list[torch.Tensor], ref: torch.Tensor) -> Checks:
        out = got[0]  # slots 1..p-1 equal the circular shift; slot 0 is the last slot (cat, roll) or zeros
        ok = torch.equal(out[1:], ref[1:]) and torch.equal(out[0], ref[0] if self.how in ("cat", "roll")
                                                           else torch.zeros_like(ref[0]))
        return {f"{self.phase}.parity.hlo": (ok, "slot s + 1 holds slot s")}

    def state(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.p.seed)
        return torch.randn(self.p.stages, self.p.rows, self.p.hidden, generator=g)  # [p, rows, h]

    def graph(self) -> Step:
        n = runtime.current().num_devices
        mesh = runtime.mesh((self.p.stages, n // self.p.stages), ("stage", "data"))
        state = self.state().to(runtime.device())
        xs.mark_sharding(state, mesh, ("stage", "data", None))
        out = spmd.shift(state, self.how)
        xs.mark_sharding(out, mesh, ("stage", "data", None))  # the result sharded like the state: a shift
        return Step([out])

    def read(self, view: View, module: HloModule) -> View:
        for op in self.shift_ops:
            mine = [c for c in module.collectives if c.op == op.replace("_", "-")]
            view.add(f"{self.phase}.{op}.count", len(mine), "count")
            view.add(f"{self.phase}.{op}.bytes", sum(c.operand_bytes for c in mine), "bytes")
        want = self.formula().values
        if self.how in ("roll", "cat_zeros") and view.values != want:  # the measurement IS the lesson here
            said = ", ".join(f"{view.values[f'{self.phase}.{op}.count']} {op.replace('_', '-')}"
                             for op in self.shift_ops if view.values[f"{self.phase}.{op}.count"])
            for name in view.values:
                view.differs[name] = (f"{COMPILER[view.source]} wrote {self.how} as {said or 'no collective'} "
                                      "(the data movement: one collective-permute of one shard)")
        return view


@dataclass(frozen=True)
class FsdpCase(Case):
    """The SPMD GPipe forward on the mesh (stage, data) = (p, n / p) with W [1, p, h, h] sharded over both: each
    stage gathers its layer's n / p shards in every iteration (FSDP inside the pipeline) while the shift moves
    [rows / (n / p), h] per device."""

    p: PipelineParams

    ops: ClassVar[tuple[str, ...]] = ()  # read per loop iteration in `read`
    size_name: ClassVar[str] = "stages"
    mesh_text: ClassVar[str] = "(stage, data) = (stages, n / stages)"

    @property
    def phase(self) -> str:
        return "spmd.fsdp"

    @property
    def data(self) -> int:
        """The second axis: n / p on this process's n devices when that is 2 or more, else 2 (the TPU view then
        compiles 2 p chips in a helper process)."""
        n, stages = runtime.current().num_devices, self.p.stages
        return n // stages if n % stages == 0 and n // stages >= 2 else 2

    @property
    def devices(self) -> int:
        return self.p.stages * self.data

    def mesh_problem(self, num_devices: int) -> str | None:
        p, d = self.p, self.data
        if num_devices < 2 * p.stages or num_devices % p.stages:
            return (f"the 2-D mesh needs stages * data = {p.stages} * (2 or more) devices; this process has "
                    f"num_devices={num_devices}")
        for name, size in (("a microbatch's rows", p.rows), ("hidden", p.hidden)):
            if size % d:
                return f"{name} = {size} is not divisible by the data axis n / stages = {d}"
        return None

    def formula(self) -> View:
        p, d = self.p, self.data
        T = fpp.spmd_loop("gpipe", p.stages, p.microbatches)["trip_count"]
        view = View("formula")
        view.add(f"{self.phase}.trip_count", T, "iterations")
        view.add(f"{self.phase}.collective_permute.count", 1, "count")  # per iteration, in the loop
        view.add(f"{self.phase}.collective_permute.bytes", p.rows // d * p.hidden * F32, "bytes")
        view.add(f"{self.phase}.all_gather.step_count", T, "count")  # FSDP gathers a layer where it is used
        view.add(f"{self.phase}.all_gather.elements", p.hidden // d * p.hidden, "elements")  # one [h / d, h] shard
        view.add(f"{self.phase}.all_gather.bytes", p.hidden // d * p.hidden * F32, "bytes")
        return view

    def oracle(self) -> torch.Tensor:
        x, w = spmd.init(self.p.stages, self.p.microbatches, 1, self.p.rows, self.p.hidden, seed=self.p.seed)
        return spmd.dense_forward(x, w)

    def parity(self, source: str, got: list[torch.Tensor], ref: torch.Tensor) -> Checks:
        return {"spmd.fsdp.parity.hlo": (torch.allclose(got[0], ref, rtol=1e-5, atol=1e-5), "output == dense layers")}

    def graph(self) -> Step:
        p, n = self.p, runtime.current().num_devices
        x, w = spmd.init(p.stages, p.microbatches, 1, p.rows, p.hidden, seed=p.seed)
        mesh = runtime.mesh((p.stages, n // p.stages), ("stage", "data"))
        dev = runtime.device()
        return Step(spmd.pipeline_step(x.to(dev), w.to(dev), mesh, how="pad", data_axis="data", fsdp=True,
                                       backward=False))

    def read(self, view: View, module: HloModule) -> View:
        src, ph = view.source, self.phase
        trips = spmd.read_program(module)["trip_counts"]
        view.add(f"{ph}.trip_count", trips[0] if len(trips) == 1 else trips, "iterations")
        shifts = [c for c in module.collectives if c.op == "collective-permute" and c.in_while]
        view.add(f"{ph}.collective_permute.count", len(shifts), "count")
        view.add(f"{ph}.collective_permute.bytes", sum(c.operand_bytes for c in shifts), "bytes")
        gathers = [c for c in module.collectives if c.op == "all-gather"]
        view.add(f"{ph}.all_gather.step_count", sum(module.runs(c.computation) or 0 for c in gathers), "count")
        view.add(f"{ph}.all_gather.elements", sum(math.prod(x) for c in gathers for x in c.operand_shapes), "elements")
        view.add(f"{ph}.all_gather.bytes", sum(c.operand_bytes for c in gathers), "bytes")
        if gathers and not any(c.in_while for c in gathers):
            view.differs[f"{ph}.all_gather.step_count"] = (
                f"{COMPILER[src]} hoists the gather of the loop-invariant weight out of the loop: gathered once "
                "per step and kept whole")
        other = sorted({c.dtype for c in gathers} - {"f32"})
        if other:
            view.differs[f"{ph}.all_gather.bytes"] = (
                f"{COMPILER[src]} gathers the f32 weight shard as {'/'.join(other)} (the matmul runs at default "
                "precision, 16-bit inputs): elements agree instead")
        return view

