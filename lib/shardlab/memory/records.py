"""The numbers a notebook records for the memory levers, each from one function call, at a small and a large size.

Design note
-----------
:class:`MemoryConfig` holds every size (one object per run); :data:`SMALL` is the quick default (tests, the
report's default run), :data:`LARGE` the real sizes (Llama 3 8B attention on one v5e chip, 1k ... 32k tokens; a
GPT-2 small block at 1024 tokens). Each ``*_numbers`` function returns plain values; :func:`records` flattens them
into ``{"name", "value", "unit", "source", "kind"}`` rows (``shardlab.profile.record``'s shape):

    levers.flash.temp_bytes.{flash,plain}        tpu (checked temporaries), formula (the planner's terms)
    levers.flash.seq_max_fit.{flash,plain}       tpu (longest sequence that compiles within one chip's HBM)
    levers.roam.peak_bytes.{program,greedy,ilp}  formula (the DAG simulator: program order, greedy, split ILP)
    levers.roam.peak_bytes.xla                   hlo (XLA:CPU heap-simulated temporaries), tpu (checked temporaries)
    levers.roam.solve_s.{split,unsplit}          timer
    levers.roam.nodes                            formula (operators of the DAG)
    levers.update_schedule.peak_bytes.{eager,end,best}   formula (simulator), tpu (barrier-forced graphs)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.memory import flash as F
from shardlab.memory import graph as G


@dataclass(frozen=True)
class MemoryConfig:
    attention: F.AttentionConfig = F.AttentionConfig(seq=2048, heads=8, kv_heads=8, tensor=1)
    seqs: tuple[int, ...] = (1024, 2048)  # the flash table's sequence lengths
    fit_step: int = 1024  # seq_max_fit resolution (a multiple of 1024: the flash kernel's tile)
    fit_start: tuple[int, int] = (1024, 1024)  # seq_max_fit's first probe: (flash, plain)
    fit: bool = False  # search the longest sequence that fits: about 2 log2(s / fit_step) compiles per kernel
    step: G.StepConfig = G.StepConfig(model="mlp", layers=2, hidden=128, ffn=256, seq=1, batch=8)
    max_ops: int = 20  # ROAM: largest part before a live-set cut
    min_ops: int = 8
    part_limit_s: float = 30.0
    unsplit_limit_s: float | None = 5.0  # None: skip the unsplit integer program
    xla: bool = True  # XLA:CPU and XLA:TPU views of the step
    topology: str | None = None  # the step's TPU slice (default: this process's device count)


SMALL = MemoryConfig()
LARGE = MemoryConfig(attention=F.AttentionConfig(seq=8192), seqs=(1024, 2048, 4096, 8192, 16384, 32768),
                     fit=True, fit_start=(65536, 4096), step=G.GPT2_SMALL_BLOCK, unsplit_limit_s=120.0)


def flash_numbers(cfg: MemoryConfig) -> dict[str, Any]:
    """The table (every seq x kernel), the recorded seq's temporaries, and the longest sequence per kernel."""
    t0 = time.perf_counter()
    rows = F.sweep(cfg.attention, cfg.seqs)
    at = {k: F.measure(replace(cfg.attention, kernel=k)) for k in F.KERNELS}
    start = dict(zip(F.KERNELS, cfg.fit_start, strict=True))
    fits = {k: F.seq_max_fit(replace(cfg.attention, kernel=k), step=cfg.fit_step, start=start[k])
            for k in F.KERNELS} if cfg.fit else {}
    return {"rows": rows, "at": at, "fits": fits, "seconds": time.perf_counter() - t0}


def roam_numbers(cfg: MemoryConfig) -> dict[str, Any]:
    """ROAM's comparison on the traced step, and the two compilers' temporaries for the same step."""
    from shardlab.memory import roam
    from shardlab.memory import xla_step as X

    t0 = time.perf_counter()
    step = G.trace_step(cfg.step)
    res = roam.compare(step, cfg.max_ops, cfg.min_ops, cfg.part_limit_s, cfg.unsplit_limit_s)
    out: dict[str, Any] = {"step": step, "result": res, "seconds": time.perf_counter() - t0}
    if cfg.xla:
        out["xla"] = X.measure(X.XlaStep.of(cfg.step), topology=cfg.topology)
    return out


def schedule_numbers(cfg: MemoryConfig, step: G.StepGraph | None = None) -> dict[str, Any]:
    """Peaks of all-eager, all-end and the best schedule: simulator, and XLA:TPU with barrier-forced orders."""
    from shardlab.memory import update_schedule as us
    from shardlab.memory import xla_step as X

    step = step or G.trace_step(cfg.step)
    res = us.compare(step)
    if cfg.xla:
        up = us.plan(step)
        tpu = {}
        for name, sched in (("eager", us.uniform(up, "eager")), ("end", us.uniform(up, "end")),
                            ("best", res["schedule"])):
            mem, topo, _ = X.tpu_memory(X.XlaStep.of(cfg.step, sched), cfg.topology)
            tpu[name] = int(mem["checked_temp"])
        res["tpu"], res["tpu_topology"] = tpu, topo
    return res


@dataclass
class Row:
    name: str
    value: float
    unit: str
    source: str
    kind: str = "structural"


@dataclass
class Numbers:
    rows: list[Row] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float | None, unit: str, source: str, kind: str = "structural") -> None:
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            self.rows.append(Row(name, value, unit, source, kind))

    def as_dicts(self) -> list[dict[str, Any]]:
        return [r.__dict__ for r in self.rows]


def records(cfg: MemoryConfig = SMALL) -> Numbers:
    """Every measurement of the module note, at ``cfg``'s sizes."""
    out = Numbers()
    fl = flash_numbers(cfg)
    for k, m in fl["at"].items():
        out.add(f"levers.flash.temp_bytes.{k}", m.temp, "bytes", "tpu")
        out.add(f"levers.flash.temp_bytes.{k}", m.formula, "bytes", "formula")
    for k, fit in fl["fits"].items():
        out.add(f"levers.flash.seq_max_fit.{k}", fit.seq, "tokens", "tpu")
    ro = roam_numbers(cfg)
    r = ro["result"]
    for k in ("program", "greedy", "ilp"):
        out.add(f"levers.roam.peak_bytes.{k}", r.peaks[k], "bytes", "formula")
    if "xla" in ro:
        out.add("levers.roam.peak_bytes.xla", ro["xla"].cpu_temp, "bytes", "hlo")
        out.add("levers.roam.peak_bytes.xla", ro["xla"].tpu_temp, "bytes", "tpu")
    out.add("levers.roam.solve_s.split", r.solve_s["split"], "s", "timer", "timing")
    out.add("levers.roam.solve_s.unsplit", r.solve_s.get("unsplit"), "s", "timer", "timing")
    out.add("levers.roam.nodes", r.nodes, "operators", "formula")
    sc = schedule_numbers(cfg, ro["step"])
    for k in ("eager", "end", "best"):
        out.add(f"levers.update_schedule.peak_bytes.{k}", sc[k], "bytes", "formula")
        if "tpu" in sc:
            out.add(f"levers.update_schedule.peak_bytes.{k}", sc["tpu"][k], "bytes", "tpu")
    out.detail = {"flash": fl, "roam": ro, "schedule": sc}
    return out
