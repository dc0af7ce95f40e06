"""``inspect(model, mesh=..., topology=...)``: trace, compile for the slice, compare with the planner.

Design note
-----------
:func:`run` validates the config (every bad input raises :class:`InspectInputError` here, before any trace),
traces ``step.build`` and compiles it with XLA:TPU compile-only (``shardlab.profile.tpu``) — in this process
when its device world has the slice's chip count (the CLI sets its world up that way, so it can report each
stage), otherwise in the suite's helper process with that many devices (``tpu.compile_program``) — then reads
the program (``analysis``) and the planner's prediction. A slice with more chips than a CPU trace may have
(``runtime.MAX_CPU_DEVICES``) is traced on a small mesh and compiled for the real one (:func:`trace_config`,
:mod:`shardlab.profile.retarget`). Then and, when the step does not fit, the planner's nearest
plan that fits (compiled too with ``confirm=True``). The result is plain data (:class:`InspectResult`, JSON
round trip) so a notebook can show cached full-size runs without recompiling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shardlab import runtime
from shardlab.inspect import analysis as A
from shardlab.inspect import step
from shardlab.inspect.config import (
    InspectConfig,
    InspectInputError,
    MeshSpec,
    RulesSpec,
    layout,
    make_config,
    with_mesh,
)
from shardlab.inspect.models import ModelSpec, planner_model
from shardlab.inspect.timing import time_summary
from shardlab.planner import Plan
from shardlab.profile import retarget as R
from shardlab.profile import tpu
from shardlab.profile.tpu_memory import parse_oom
from shardlab.report.datatypes import EXIT_FAILED, EXIT_OK

Progress = Callable[[str], None]


@dataclass
class InspectResult:
    """One inspected training step: verdict, per-chip memory by kind, collectives, planner beside each number."""

    config: dict[str, Any]  # the InspectConfig's fields (model_json as the config dict: "model_config")
    label: str
    topology: str  # the slice compiled for (v6e-8)
    fits: bool
    message: str  # the compiler's one-line verdict when out of memory ("RESOURCE_EXHAUSTED: ...")
    compile_s: float
    trace_s: float | None  # None when traced in a helper process (included in its compile call)
    where: str  # "this process" | "a helper process with N devices"
    memory: list[dict[str, Any]]  # rows: kind, compiler, source, planner, ratio (bytes per chip)
    totals: dict[str, Any]  # arguments, temporaries, checked, peak, outputs, capacity, ... (bytes per chip)
    largest: list[dict[str, Any]]  # bytes, shape, op, label, allocation
    collectives: list[dict[str, Any]]  # per (axes, op): instructions, per_step, bytes_per_step, planner_*, ratio
    planner: dict[str, Any] | None  # fits, at_risk, verdict, memory, total, num_params, degrees (None: cannot plan)
    params: dict[str, Any]  # model / planner parameter counts
    rules: dict[str, int]  # parameters per rule origin
    notes: list[str] = field(default_factory=list)
    oom_message: str = ""  # the compiler's full message (largest allocations included)
    collective_list: list[dict[str, Any]] = field(default_factory=list)  # every logical collective
    nearest: dict[str, Any] | None = None  # the planner's nearest plan that fits
    confirmed: dict[str, Any] | None = None  # that plan inspected (InspectResult.as_dict), with confirm=True
    optimizer: dict[str, Any] = field(default_factory=dict)  # analysis.optimizer_summary: name, dtype, by_state
    host: dict[str, Any] | None = None  # analysis.host_offload: host-memory arrays and transfers (offload)
    time: dict[str, Any] | None = None  # step time / MFU / bound, compiler and planner (inspect.timing)

    @property
    def exit_status(self) -> int:
        return EXIT_OK if self.fits else EXIT_FAILED

    def row(self, kind: str) -> dict[str, Any]:
        return next(r for r in self.memory if r["kind"].startswith(kind))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InspectResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def config_object(self) -> InspectConfig:
        """The :class:`InspectConfig` this result was made from."""
        d = {k: v for k, v in self.config.items() if k != "model_config"}
        d["mesh"] = tuple((a, n) for a, n in d["mesh"])
        d["fsdp"] = tuple(d["fsdp"])
        d["rules"] = tuple((p, tuple(tuple(a) if isinstance(a, list) else a for a in s)) for p, s in d["rules"])
        d["overrides"] = tuple((k, v) for k, v in d["overrides"])
        return InspectConfig(model_json=json.dumps(self.config["model_config"], sort_keys=True), **d)

    def reread(self) -> InspectResult:
        """The result with the planner's side recomputed by today's planner (its columns, verdict, collective terms
        and nearest plan that fits; a cached compile keeps the compiler's numbers), and an out-of-memory result's
        memory rows recomputed from the stored compiler message by today's analysis (a fitting program is not
        stored)."""
        cfg = self.config_object()
        plan, _ = A.planner_for(cfg)
        rows, totals, big = self.memory, self.totals, self.largest
        if not self.fits and self.oom_message:
            compiled = _Compiled(False, parse_oom(self.oom_message))
            rows, totals = A.memory_rows(compiled, cfg, plan)
            big = A.largest(compiled)
        else:
            rows = [{**r, **A.planner_cell(r["kind"], r["compiler"], plan)} for r in rows]
        program = bool(self.collective_list) or self.fits
        return replace(self, memory=rows, totals=totals, largest=big, planner=planner_summary(plan, self.fits, cfg),
                       collectives=A.collective_summary(self.collective_list, plan, cfg, program),
                       nearest=self.nearest if self.fits else nearest_summary(A.nearest_fit(cfg)))


@dataclass
class _Compiled:
    """The parts of a ``TpuCompile`` the analysis reads for an out-of-memory result."""

    fits: bool
    oom: Any
    memory: Any = None
    module: Any = None


def human_bytes(x: float | None) -> str:
    """``0.25 MiB`` (notes; the tables use ``output``'s units)."""
    return "–" if x is None else f"{x / 2**30:.2f} GiB" if x >= 2**30 / 10 else f"{x / 2**20:.2f} MiB"


def planner_summary(plan: Plan | None, fits: bool, cfg: InspectConfig) -> dict[str, Any] | None:
    """The planner's side of a result: verdict, per-term memory, total, and whether it agrees with ``fits``."""
    if plan is None:
        return None
    return {"fits": plan.fits, "at_risk": plan.at_risk, "verdict": plan.verdict, "memory": dict(plan.memory),
            "total": plan.memory_total, "hbm_bytes": plan.hbm_bytes, "num_params": plan.num_params,
            "degrees": dict(zip(("data", "fsdp", "tensor"), cfg.degrees, strict=True)), "agrees": plan.fits == fits}


def nearest_summary(near: Plan | None) -> dict[str, Any] | None:
    """The planner's nearest plan that fits (a ``Plan`` or None) as the result stores it."""
    if near is None:
        return None
    c = near.config
    return {"topology": c.topology, "data": c.data, "fsdp": c.fsdp, "tensor": c.tensor, "recompute": c.recompute,
            "total": near.memory_total, "verdict": near.verdict}


def _config_dict(cfg: InspectConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["model_config"] = cfg.config_dict()
    del d["model_json"]
    if d.get("rules_mesh") is None:
        d.pop("rules_mesh", None)
    return d


def trace_config(cfg: InspectConfig) -> tuple[InspectConfig, tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """Trace small, compile big: ``(the same config on the trace mesh, (trace mesh, real mesh))`` when the slice has
    more chips than a CPU trace may (``runtime.MAX_CPU_DEVICES``), else None. The sharding rules must give every
    parameter the same spec on both meshes (a rule that depends on the axis size would trace another graph)."""
    if cfg.chips <= runtime.MAX_CPU_DEVICES:
        return None
    sizes = tuple(n for _, n in cfg.mesh)
    try:
        small = R.trace_mesh(sizes)
    except R.RetargetError as exc:
        raise InspectInputError(f"{cfg.topology}: {exc}") from None
    small_cfg = replace(cfg, mesh=tuple((a, k) for (a, _), k in zip(cfg.mesh, small, strict=True)),
                        rules_mesh=cfg.mesh)  # the rules pick the real mesh's specs (their choice can depend on it)
    differ = [n for n, spec in layout(cfg).specs.items() if layout(small_cfg).specs.get(n) != spec]
    if differ:  # cannot happen while rules_mesh is honoured: a guard, not a rule
        raise InspectInputError(f"{cfg.topology}: the sharding rules give {differ[:3]} other specs on the trace mesh "
                                f"{small} than on {sizes}; the step cannot be traced small (give explicit rules)")
    return small_cfg, (small, sizes)


def run(cfg: InspectConfig, progress: Progress | None = None, confirm: bool = False) -> InspectResult:
    """Validate, trace, compile and analyse one configuration (see the module note)."""
    say = progress or (lambda _s: None)
    say("validating (model on the meta device, sharding rules)")
    cfg.validate()
    topology = cfg.topology
    try:
        world = runtime.current()
    except RuntimeError:
        world = None
    label = f"inspect {cfg.label}"
    trace_s: float | None = None
    small = trace_config(cfg)
    if small is not None:
        small_cfg, meshes = small
        where = f"a {'x'.join(map(str, meshes[0]))} trace mesh, compiled for {'x'.join(map(str, meshes[1]))}"
        if world is not None and world.num_devices == small_cfg.chips:
            say(f"tracing the training step on {where}")
            t0 = time.perf_counter()
            built = step.build(small_cfg)
            trace_s = time.perf_counter() - t0
            say(f"compiling for {topology} with XLA:TPU (compile-only)")
            compiled = tpu.compile_built(built, topology, donate=cfg.donate, label=label, retarget=meshes)
            where = f"this process ({where})"
        else:
            say(f"tracing and compiling for {topology} in a helper process ({where})")
            compiled = tpu.compile_program(step.build, small_cfg, topology, donate=cfg.donate, label=label,
                                           retarget=meshes)
            where = f"a helper process ({where})"
    elif world is not None and world.num_devices == cfg.chips:
        say(f"tracing the training step ({cfg.layers}, recompute {cfg.recompute}, attention {cfg.attention}) with "
            "placeholders")
        t0 = time.perf_counter()
        built = step.build(cfg)
        trace_s = time.perf_counter() - t0
        say(f"compiling for {topology} with XLA:TPU (compile-only)")
        compiled = tpu.compile_built(built, topology, donate=cfg.donate, label=label)
        where = "this process"
    else:
        where = f"a helper process with {cfg.chips} devices"
        say(f"tracing and compiling for {topology} in {where}")
        compiled = tpu.compile_program(step.build, cfg, topology, donate=cfg.donate, label=label)
    say("reading the program and asking the planner")
    lay = layout(cfg)
    plan, why = A.planner_for(cfg)
    _, model_notes = planner_model(lay.hf_config, cfg.model_name)
    notes = list(model_notes)
    if why:
        notes.append(why)
    if lay.hf_config.model_type == "mixtral":
        notes.append("MoE dispatch traced in its static form (every expert on every token, weighted by the router; "
                     "HF's expert loop has data-dependent shapes a placeholder trace cannot follow)")
    notes.append({"eager": "attention: HF eager (the [b, a, s, s] scores exist): the planner's no-flash prediction "
                           "is compared",
                  "sdpa": "attention: HF sdpa (torch_xla lowers it to matmul-softmax-matmul: the [b, a, s, s] "
                          "scores exist): the planner's no-flash prediction is compared",
                  "flash": "attention: torch_xla's Pallas flash kernel (compile-only, as notebook 08b; no [s, s] "
                           "array): the planner's flash prediction is compared"}[cfg.attention])
    rows, totals = A.memory_rows(compiled, cfg, plan)
    coll = A.collective_rows(compiled.module, cfg) if compiled.module is not None else []
    real = sum(p.numel for p in lay.params)
    origins: dict[str, int] = {}
    for o in lay.origins.values():
        origins[o] = origins.get(o, 0) + 1
    planner = planner_summary(plan, compiled.fits, cfg)
    result = InspectResult(
        _config_dict(cfg), cfg.label, topology, compiled.fits,
        compiled.oom.first_line if compiled.oom else "", compiled.compile_s, trace_s, where, rows, totals,
        A.largest(compiled), A.collective_summary(coll, plan, cfg, compiled.module is not None), planner,
        {"model": real, "planner": plan.num_params if plan else None,
         "ratio": real / plan.num_params if plan else None}, origins, notes,
        compiled.oom.message if compiled.oom else "", coll, optimizer=A.optimizer_summary(compiled, cfg),
        host=A.host_offload(compiled))
    if cfg.optimizer == "adafactor":
        result.notes.append("optimizer: Adafactor's factors are reduced over one dimension of the weight, so a factor "
                            "is split only along the weight's other dimension (FSDP splits dim 0: each chip holds "
                            "the whole column factor); the planner divides every byte of state by the FSDP degree")
    if cfg.recompute == "offload":
        h = result.host
        result.notes.append(
            "recompute offload: full recompute with each layer's hidden-state input kept in host memory (torch_xla's "
            "place_to_host / place_to_device around the scan's saved input); " + (
                f"the program holds {', '.join(a['shape'] for a in h['arrays'])} in host memory space "
                f"{h['space']} ({human_bytes(h['host_temp'])} host temporaries per chip, measured) and moves it by "
                + "; ".join(f"{v['per_step']} x {k}" for k, v in h['transfers'].items()) + " per step; the planner "
                "counts no layer inputs in HBM" if h else
                "out of memory: no program to read the host placement from" if not compiled.fits else
                "the compiled program holds nothing in host memory (the compiler dropped the placement)"))
    result.time = time_summary(compiled.module, cfg, plan, lay)
    if not compiled.fits:
        say("searching the planner for the nearest plan that fits")
        near = A.nearest_fit(cfg)
        result.nearest = nearest_summary(near)
        if near is not None:
            c = near.config
            if confirm:
                mesh = tuple((a, n) for a, n in (("data", c.data), ("fsdp", c.fsdp), ("tensor", c.tensor)) if n > 1)
                other = with_mesh(cfg, mesh or (("fsdp", 1),), topology=c.topology, recompute=c.recompute)
                say(f"confirming the nearest plan: {other.label}")
                result.confirmed = run(other, progress).as_dict()
    return result


def inspect(model_or_config: ModelSpec, *, mesh: MeshSpec = "fsdp=8", topology: str = "v6e-8", batch: int = 8,
            seq: int = 2048, optimizer: str = "adamw", optimizer_dtype: str = "fp32", recompute: str = "full",
            rules: RulesSpec = None,
            layers: str = "scan", fsdp: str | Sequence[str] | None = "auto", tensor: str | None = "auto",
            strict: bool = False,
            num_layers: int | None = None, overrides: dict[str, Any] | None = None, confirm: bool = False,
            progress: Progress | None = None, **kw: Any) -> InspectResult:
    """Will this HF model's training step fit on ``topology``, and what does it send? (see the package note)"""
    cfg = make_config(model_or_config, mesh=mesh, topology=topology, fsdp=fsdp, tensor=tensor, rules=rules,
                      batch=batch, seq=seq, optimizer=optimizer, optimizer_dtype=optimizer_dtype, recompute=recompute,
                      layers=layers, strict=strict,
                      num_layers=num_layers, overrides=overrides or {}, **kw)
    return run(cfg, progress, confirm)


__all__ = ["InspectInputError", "InspectResult", "inspect", "run"]
