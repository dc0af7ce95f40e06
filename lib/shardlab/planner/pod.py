"""The planner's verdict at pod scale: one full-size compile per TPU generation (v4, v5e, v5p, v6e) at ≥ 128 chips.

Design note
-----------
Notebook 07's verdict step (:class:`shardlab.planner.verdict.VerdictCase`: embedding, ``scan`` over the real
decoder layers, LM head, fp32 loss, backward, AdamW donated) is traced on one virtual CPU device per chip, so its
compiles stop at 64 chips. Its placeholders have **global** shapes — ``[B, S]`` tokens, ``[L, out, in]`` stacked
weights — and the mesh enters only through the sharding annotations, so the same step traced on the mesh
(data 1, fsdp 2, tensor t) of ``2·t`` CPU devices and compiled with its shardings rewritten to
(1, fsdp, t) is the full-size program (:mod:`shardlab.profile.retarget`; the tests compare the two routes at 8
chips, program text included). :func:`trace_case` is that trace: the plan with ``fsdp`` replaced and nothing else
(checked: the padded vocabulary, the only plan-derived size the step reads, depends on ``tensor`` alone).

The rows (:data:`POD`): Llama 3 70B, 2-D mesh (fsdp = chips / 4, tensor 4), one 8192-token sequence per fsdp
rank, full recompute — the per-chip work of 07's 70B v6e-64 row, on 256 v6e chips, 256 v5e chips, and 128 chips of
v5p and v4 (``v5p-256`` and ``v4-256`` count TensorCores: 128 chips each). The planner's no-flash verdicts differ
between them (v5e's 16 GB chip cannot hold the plan; on v4's 30.75 GiB it fits with room to spare), so the four
compiles test the verdict, not one answer four times. Measured: the v4 verdict is the one they disagree on — the
v4 / v5p compiler keeps more of the traced attention's ``[a/t, s, s]`` arrays than the planner's terms, fitted to
v5e / v6e compiles, count; :data:`CONTROL` compiles the same 128-chip program for v6e, where the planner is right.

Cached in ``data/scale/planner_pod.json`` (``tools/retarget_full_size.py planner``: each compile in its own process,
its trace and compile seconds and peak host memory recorded); notebook 07 reads the cache unless ``full_size``.

    compiled for      mesh (data, fsdp, tensor)   traced on (1, 2, 4): 8 CPU devices
    v6e-256, v5e-256  (1, 64, 4)                  global batch 64 × 8192 tokens
    v5p-256, v4-256   (1, 32, 4)                  global batch 32 × 8192 tokens (128 chips)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from shardlab.core.case import build_graph
from shardlab.planner import PlanConfig
from shardlab.planner.verdict import MATRIX_FILE, PlannerCheck, VerdictCase, compiler_side, measure_verdict
from shardlab.profile import tpu
from shardlab.profile.record import Recorder
from shardlab.profile.result_files import CompileResult, load_results

GIB = 2**30
TENSOR = 4
TRACE_FSDP = 2  # the trace mesh (1, TRACE_FSDP, TENSOR): 8 CPU devices
TRACE_TOPOLOGY = "v6e-8"  # the trace's plan validates the 8-device mesh against some 8-chip slice; the step ignores it
# slice -> chips (v5p and v4 names count TensorCores, two per chip)
SLICES = {"v6e-256": 256, "v5e-256": 256, "v5p-256": 128, "v4-256": 128}
MODEL = "llama-3-70b"
SEQ = 8192
POD: dict[str, dict[str, Any]] = {
    f"{MODEL}.{s}": dict(model=MODEL, topology=s, fsdp=n // TENSOR, tensor=TENSOR, global_batch=n // TENSOR, seq=SEQ)
    for s, n in SLICES.items()}
POD_FILE = MATRIX_FILE.with_name("planner_pod.json")
# A control: the 128-chip program of the v4 / v5p rows (mesh (1, 32, 4), the same trace) compiled for 128 v6e chips
# (a catalogue slice the planner's hardware table does not list): which of chip count and generation moves the bytes.
CONTROL = ("llama-3-70b.v4-256", "v6e-128")
CONTROL_FILE = MATRIX_FILE.with_name("planner_pod_control.json")


@dataclass
class PodCheck(PlannerCheck):
    """A :class:`PlannerCheck` compiled from a small trace, with what the trace and the compile cost the host."""

    trace_mesh: list[int] = field(default_factory=list)  # (data, fsdp, tensor) the step was traced on
    target_mesh: list[int] = field(default_factory=list)  # the mesh it was compiled for
    trace_s: float = 0.0
    host_peak_bytes: int | None = None  # the compiling process's peak resident memory (ru_maxrss)

    @property
    def verdict_rests_on(self) -> str:
        """Which of the compiler's numbers decided the verdict."""
        if self.compiler_fits:
            return "arguments + temporaries the capacity check counts (peak - outputs + aliased) <= capacity"
        if self.arguments_evaluated:
            return "the out-of-memory message's 'Used' (arguments + program) > capacity"
        return "the out-of-memory message's program alone > capacity (arguments not evaluated: a lower bound)"


def pod_cases() -> dict[str, VerdictCase]:
    """``{"llama-3-70b.<slice>": VerdictCase}`` for every row of :data:`POD` (full recompute, donated)."""
    return {k: VerdictCase(PlanConfig(**kw)) for k, kw in POD.items()}


def trace_case(case: VerdictCase, trace_fsdp: int = TRACE_FSDP) -> VerdictCase:
    """``case``'s step with the fsdp degree ``trace_fsdp`` (same global shapes, same tensor degree): what is traced
    on ``data · trace_fsdp · tensor`` CPU devices before its shardings are rewritten to ``case``'s mesh."""
    p = case.p
    n = p.data * trace_fsdp * p.tensor
    topo = TRACE_TOPOLOGY if n == 8 else f"v6e-{n}"
    small = VerdictCase(replace(p, topology=topo, fsdp=trace_fsdp), case.layers, case.donate)
    if small.plan().padded_vocab != case.plan().padded_vocab:  # the one plan-derived size the step reads
        raise ValueError(f"padded vocab {small.plan().padded_vocab} != {case.plan().padded_vocab}: the traced "
                         "step would not be the target's")
    return small


def meshes(case: VerdictCase, trace_fsdp: int = TRACE_FSDP) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(trace mesh, target mesh), both (data, fsdp, tensor)."""
    p = case.p
    return (p.data, trace_fsdp, p.tensor), (p.data, p.fsdp, p.tensor)


def compile_step(case: VerdictCase, topology: str | None = None, trace_fsdp: int = TRACE_FSDP, label: str = ""
                 ) -> tuple[tpu.TpuCompile, tuple[int, ...], tuple[int, ...]]:
    """``case``'s step compiled for ``topology`` (default: the case's slice), traced on the small mesh (this process
    when it has that many devices, else a helper) with the shardings rewritten to the slice's — or traced as it is
    when the two meshes are the same. The one place the planner's verdict steps compile: returns the compile and
    (trace mesh, target mesh)."""
    small, big = meshes(case, trace_fsdp)
    topology = topology or case.p.topology
    if small == big:
        return tpu.compile_program(build_graph, case, topology, donate=case.donate, label=label), small, big
    return (tpu.compile_program(build_graph, trace_case(case, trace_fsdp), topology, donate=case.donate,
                                retarget=(small, big), label=label), small, big)


def compile_retargeted(case: VerdictCase, trace_fsdp: int = TRACE_FSDP) -> PodCheck:
    """Trace ``case``'s step on the small mesh, compile it for the case's slice with the shardings rewritten
    (:func:`compile_step`), and put the planner's terms beside it."""
    t0 = time.perf_counter()
    c, small, big = compile_step(case, trace_fsdp=trace_fsdp, label=f"planner pod {case.p.topology}")
    wall = time.perf_counter() - t0
    flash, no_flash = case.plan(True), case.plan(False)
    res = PodCheck(case.config, c.topology, c.compile_s, case.donate, c.fits, flash.fits, no_flash.fits,
                   {"flash": flash.at_risk, "no_flash": no_flash.at_risk}, dict(flash.memory),
                   dict(no_flash.memory), tpu.get_topology(c.topology).hbm_bytes or flash.hbm_bytes,
                   trace_mesh=list(small), target_mesh=list(big), trace_s=round(wall - c.compile_s, 1))
    return replace(res, **compiler_side(c))


def compile_control(row: str = CONTROL[0], topology: str = CONTROL[1]) -> CompileResult:
    """``row``'s traced step compiled, with the same mesh, for another slice of as many chips (no planner side)."""
    case = pod_cases()[row]
    if tpu.get_topology(topology).chips != tpu.get_topology(case.p.topology).chips:
        raise ValueError(f"topology={topology!r} must have the chips of {case.p.topology!r}")
    c, _small, big = compile_step(case, topology, label=f"planner pod control {topology}")
    return CompileResult.read({**case.config, "topology": topology, "mesh": list(big)}, c)


def load_control(path: Path = CONTROL_FILE) -> tuple[dict[str, CompileResult], dict[str, Any]]:
    return load_results(path, CompileResult.from_dict, "run tools/retarget_full_size.py planner-control")


def load_pod(path: Path = POD_FILE) -> tuple[dict[str, PodCheck], dict[str, Any]]:
    """The cached pod compiles, the planner's side recomputed now."""
    results, source = load_results(path, PodCheck.from_dict, "run tools/retarget_full_size.py planner (minutes "
                                   "per compile) to measure the pod-scale verdicts")
    return {k: r.replanned() for k, r in results.items()}, source


def compiled_or_cached(rec: Recorder, live: bool) -> tuple[dict[str, PodCheck], str]:
    """The four pod verdicts compiled now (``live``: tens of minutes) or read from the cache, recorded (the planner's
    bytes and verdict per row, formula; the compiler's too, tpu, when ``live``) and checked (:func:`record_pod`), and
    where the compiler's numbers come from."""
    if live:
        results, about = {k: compile_retargeted(c) for k, c in pod_cases().items()}, "compiled now"
    else:
        results, source = load_pod()
        about = (f"compiler numbers cached: {source.get('command', '?')}, {source.get('measured', '?')}, "
                 f"libtpu {source.get('versions', {}).get('libtpu', '?')}")
        rec.note("planner.pod", f"pod-scale compiles not run (full_size=False); {about}")
    record_pod(rec, results, live)
    return results, about


def undercount(r: PodCheck) -> float | None:
    """compiler / planner (no flash) - 1 for the total, where the compiler evaluated the arguments; None else."""
    return r.total / sum(r.planner_no_flash.values()) - 1 if r.total and r.arguments_evaluated else None


def record_pod(rec: Recorder, results: dict[str, PodCheck], live: bool) -> None:
    """``planner.pod.<row>.{per_chip.bytes,fits}`` (formula always; tpu when ``live``) and the checks the section's
    text rests on: the compiler's model state is the planner's (2 + 12 bytes per parameter on the chip); a verdict
    the two disagree on is one where the planner's total falls short of the compiler's by more than its fit margin
    (the plan is not near the line — the bytes are missing); on v6e, whose compiles the planner's terms were fitted
    to, the totals agree within the margin."""
    for key, r in results.items():
        name = f"planner.pod.{key}"
        measure_verdict(rec, name, r, live)
        if r.compiler_fits:
            state = {k: r.compiler[k] / r.planner[k] for k in ("params", "optimizer")}
            rec.check(f"{name}: the compiler's parameters and AdamW state are the planner's (within 1 %)",
                      all(abs(v - 1) <= 0.01 for v in state.values()), str(state))
        margin, u = r.config["fit_margin"], undercount(r)
        if not r.agrees():
            rec.check(f"{name}: the verdicts disagree because the planner's total is short by more than its margin",
                      r.compiler_fits is False and u is not None and u > margin, f"compiler / planner - 1 = {u}")
        if r.topology.startswith("v6e"):
            rec.check(f"{name}: on v6e the planner's verdict is the compiler's and its total within the fit margin",
                      r.agrees() and u is not None and abs(u) <= margin, f"compiler / planner - 1 = {u}")


def pod_frame(results: dict[str, PodCheck]) -> pd.DataFrame:
    """One row per slice: chips, mesh, the compiler's per-chip bytes (arguments, outputs, temporaries, peak) and
    verdict, the planner's total and verdict (no flash: the traced attention), and what the compile cost."""
    rows = []
    for r in results.values():
        c = r.compiler
        planner = sum(r.planner_no_flash.values())
        rows.append({
            "slice": r.topology, "chips": tpu.get_topology(r.topology).chips,
            "mesh (d, f, t)": tuple(r.target_mesh), "traced on": tuple(r.trace_mesh),
            "HBM usable GiB": round(r.capacity_bytes / GIB, 2),
            "args GiB": _g(c.get("arguments")), "out GiB": _g(c.get("outputs")),
            "temp GiB": _g(c.get("temp")), "peak GiB": _g(c.get("peak")),
            "compiler GiB": ("" if r.arguments_evaluated else "≥ ") + (_g(r.total) if r.total else "–"),
            "compiler": "fits" if r.compiler_fits else "out of memory",
            "planner no flash GiB": round(planner / GIB, 2),
            "compiler / planner": round(r.total / planner, 3) if r.total and r.arguments_evaluated else None,
            "planner": "fits" if r.planner_no_flash_fits else ("at risk" if r.planner_at_risk["no_flash"] else "no"),
            "agree": r.agrees(), "compile s": round(r.compile_s, 1), "trace s": r.trace_s,
            "host peak GiB": _g(r.host_peak_bytes),
        })
    return pd.DataFrame(rows).set_index("slice")


def pod_text(results: dict[str, PodCheck], control: dict[str, CompileResult] | None = None) -> str:
    """One line per slice (Markdown, from the data): the two verdicts, the totals and what the verdict rests on; and
    the ``control`` compiles (:data:`CONTROL`) beside the row whose program they compiled for another chip."""
    lines = []
    for r in results.values():
        planner = sum(r.planner_no_flash.values())
        at_least = "" if r.arguments_evaluated else "≥ "
        ratio = f", compiler / planner {r.total / planner:.3f}" if r.total and r.arguments_evaluated else ""
        lines.append(f"- **{r.topology}** ({tpu.get_topology(r.topology).chips} chips, mesh {tuple(r.target_mesh)}): "
                     f"compiler {'fits' if r.compiler_fits else 'out of memory'} at {at_least}{_g(r.total)} of "
                     f"{_g(r.capacity_bytes)} GiB ({r.verdict_rests_on}); planner (no flash) "
                     f"{'fits' if r.planner_no_flash_fits else 'no'} at {_g(planner)} GiB{ratio} — "
                     f"{'agree' if r.agrees() else 'DISAGREE'}.")
    for key, c in (control or {}).items():
        same = [r for r in results.values() if r.target_mesh == c.config["mesh"]]
        held = "; ".join(f"{r.topology} {'fits at' if r.compiler_fits else 'out of memory at'} "
                         f"{'' if r.arguments_evaluated else '≥ '}{_g(r.total)} GiB" for r in same)
        lines.append(f"- Control **{key}**: the same program (mesh {tuple(c.config['mesh'])}) compiled for "
                     f"{c.topology} ({tpu.get_topology(c.topology).chips} chips): "
                     f"{'fits at' if c.fits else 'out of memory at'} {_g(c.per_chip_bytes)} of {_g(c.capacity_bytes)} "
                     f"GiB (temporaries {_g(c.temp_bytes if c.fits else c.program_bytes)}); {held}.")
    return "\n".join(lines)


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x / GIB:.2f}"
