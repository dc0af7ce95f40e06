"""Notebook 08b's full-size measurements — Llama 3 8B attention to 32k tokens, the longest sequence that fits, a
GPT-2 small block ordered by ROAM and compiled by both XLA compilers — measured live (``full_size=True``) or read
from the cache in ``data/memory/`` that this module writes.

Design note: the compiles take from seconds to minutes each (about 30 minutes together on this 2-core machine under
load), so the notebook shows them from ``data/memory/*.json`` (``profile.result_files``: the results and how they
were measured) unless it runs with ``full_size=True``, which calls the same functions and records what they return.

Usage (run from the repository; writes the cache, prints one line per result; ``shardlab.memory.__main__``)::

    python -m shardlab.memory flash   # attention 1k ... 32k, flash and plain (+ bf16 softmax at 4k, 8k; 8k
                                                 # without rematerialization), the longest sequence per kernel
                                                 # (peak held, and the compiler's check), the two fixes shown needed
    python -m shardlab.memory roam              # GPT-2 small block (1 and 2 blocks): ROAM, XLA:CPU, XLA:TPU, the
                                                 # update schedules; solve time vs graph size; notebook 08's update

    python -m shardlab.memory verdict           # notebook 07's Llama 3 8B step on v6e-8 with the flash kernel
                                                 # (8 devices; ~17 minutes of XLA:TPU on 2 cores)
    python -m shardlab.memory verdict-70b       # notebook 07's Llama 3 70B step on v6e-64 with the flash kernel
                                                 # (64 devices: a Pallas kernel cannot be traced small; merged)

``verdict`` compiles :class:`FlashVerdictCase` — notebook 07's ``planner.verdict.VerdictCase`` step with torch_xla's
flash kernel in place of its softmax attention — and writes ``data/memory/verdict_flash.json``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch_xla.core.xla_builder import create_placeholder_tensor as placeholder
from torch_xla.experimental.custom_kernel import flash_attention

from shardlab import runtime
from shardlab.core import harness
from shardlab.levers import case as L
from shardlab.levers import programs as P
from shardlab.levers.params import LeversParams
from shardlab.memory import case as C
from shardlab.memory import flash, pallas_tpu
from shardlab.memory.params import GPT2_SMALL_BLOCK, LLAMA3_8B_ATTENTION, MemoryParams
from shardlab.planner import PlanConfig
from shardlab.planner.verdict import PlannerCheck, VerdictCase
from shardlab.profile import tpu
from shardlab.profile.result_files import load_results, save_results

DATA = Path(__file__).resolve().parents[3] / "data" / "memory"
FLASH_FILE = DATA / "flash.json"
ROAM_FILE = DATA / "roam.json"
VERDICT_FILE = DATA / "verdict_flash.json"
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)  # the flash table's sequence lengths
RECORDED_SEQ = 8192  # the sequence whose temporaries the full-size run records (levers.flash.temp_bytes.*)
BF16_SOFTMAX_SEQS = (4096, 8192)  # plain attention with its softmax in bf16 (the planner's e bytes throughout)
FIT_START = {"flash": 65536, "plain": 4096}  # seq_max_fit's first probe per kernel (fewer compiles)
REMAT_SEQ = 8192  # plain attention compiled again with XLA's rematerialization pass disabled (its OOM figure)
UNSPLIT_LIMIT_S = 120.0  # the unsplit integer program's limit on the GPT-2 block
SIZES_UNSPLIT_LIMIT_S = 60.0  # ... on the smaller graphs of the solve-time curve
SIZES = {  # the solve-time curve: graph -> step sizes (the unsplit ILP only on the first three)
    "mlp L=1": dict(model="mlp", layers=1, hidden=16, ffn=64, step_seq=1, step_batch=8),
    "mlp L=2": dict(model="mlp", layers=2, hidden=16, ffn=64, step_seq=1, step_batch=8),
    "gpt2 L=1": GPT2_SMALL_BLOCK,
    "gpt2 L=2": {**GPT2_SMALL_BLOCK, "layers": 2},
    "gpt2 L=4": {**GPT2_SMALL_BLOCK, "layers": 4},
}
UNSPLIT_UP_TO = 3  # the unsplit ILP runs on the first SIZES entries only (beyond, it does not finish in minutes)


def attention_params(p: MemoryParams) -> MemoryParams:
    """``p`` with Llama 3 8B's attention (32 heads, 8 KV heads, hd 128) on one chip."""
    return replace(p, **LLAMA3_8B_ATTENTION)


def block_params(p: MemoryParams, layers: int = 1, unsplit_limit_s: float = UNSPLIT_LIMIT_S) -> MemoryParams:
    """``p`` with GPT-2 small blocks at 1024 tokens."""
    return replace(p, **{**GPT2_SMALL_BLOCK, "layers": layers}, unsplit_limit_s=unsplit_limit_s)


# ------------------------------------------------------------------------------------------------------ flash
@dataclass
class Fixes:
    """What torch_xla's flash kernel needs on a CPU-only host: the error without each fix (first line)."""

    without_platform: str  # tracing lowers on JAX's default (CPU) backend
    without_ir_version: str  # XLA:TPU reads the kernel's Mosaic IR
    with_both: str  # what compiled with both fixes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fixes:
        return cls(**d)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = next((ln for ln in text.splitlines() if "interpret mode" in ln or "nsupported version" in ln),
                text.splitlines()[0] if text else type(exc).__name__)
    return line.strip()[:300]


def fixes(p: MemoryParams) -> Fixes:
    """Trace the flash forward ([1, a, 1024, hd] at ``p``'s heads) without each fix, then with both, and compile."""
    topology = tpu.topology_for(runtime.current().num_devices, p.generation)

    def outputs(**kw: bool) -> list[Any]:
        q, k, v = (placeholder((1, p.heads, 1024, p.head_dim), torch.bfloat16) for _ in range(3))
        with pallas_tpu.pallas_for_tpu_compile(**kw):
            return [flash_attention(q, k, v, causal=True)]

    messages = []
    for kw in (dict(active=False), dict(ir_version=False)):
        try:
            tpu.compile_tensors(outputs(**kw), topology, label="flash without a fix")
            messages.append("compiled (the fix was not needed)")
        except Exception as exc:  # noqa: BLE001 - the failure is the measurement
            messages.append(_first_line(exc))
    c = tpu.compile_tensors(outputs(), topology, label="flash with both fixes")
    calls = c.hlo_text.count('custom_call_target="tpu_custom_call"') if c.hlo_text else 0
    return Fixes(*messages, f"compiled for {topology}: {calls} tpu_custom_call (the forward kernel)")


def flash_results(p: MemoryParams) -> dict[str, Any]:
    """Llama 3 8B attention on one chip: both kernels at :data:`SEQS`, plain with a bf16 softmax at
    :data:`BF16_SOFTMAX_SEQS`, plain at :data:`REMAT_SEQ` with the rematerialization pass disabled, the longest
    sequence per kernel by both criteria (``fit.*``: the chip holds the peak; ``fit_check.*``: XLA:TPU's capacity
    check), and the fixes (about 45 compiles)."""
    q = attention_params(p)
    out: dict[str, Any] = {"fixes": fixes(q)}
    for row in C.sweep(q, list(SEQS)):
        out[f"{row.config['kernel']}.{row.config['seq']}"] = row
    for s in BF16_SOFTMAX_SEQS:
        row = C.attention_row(replace(q, seq=s, softmax_fp32=False), "plain")
        if row is not None:
            out[f"plain_bf16.{s}"] = row
    noremat = harness.tpu(C.KernelAttentionCase(replace(q, seq=REMAT_SEQ), "plain"), q.generation,
                          disable_passes=("rematerialization",))
    row = C.attention_row(replace(q, seq=REMAT_SEQ), "plain", noremat)
    if row is not None:
        out[f"plain_noremat.{REMAT_SEQ}"] = row
    for k in flash.KERNELS:
        out[f"fit.{k}"] = C.seq_max_fit(q, k, start=FIT_START[k])  # the chip holds the peak
        out[f"fit_check.{k}"] = C.seq_max_fit(q, k, start=FIT_START[k], criterion="check")  # the compiler's check
    return out


def load_flash(path: Path = FLASH_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cached flash results (``fixes``, ``<kernel>.<seq>``, ``plain_bf16.<seq>``, ``fit.<kernel>``)."""
    def from_dict(d: dict[str, Any]) -> Any:
        if "without_platform" in d:
            return Fixes.from_dict(d)
        if "probes" in d:
            return flash.SeqFit.from_dict(d)
        return flash.AttentionMemory.from_dict(d)

    return load_results(path, from_dict, "run notebook 08b with full_size=True, or python -m "
                        "shardlab.memory flash")


# ------------------------------------------------------------------------------------------------------- ROAM
@dataclass
class RoamSummary:
    """One step's ROAM comparison, both compilers' temporaries and the update schedules (bytes, seconds)."""

    graph: str
    sizes: dict[str, Any]  # the step's parameters
    nodes: int
    parts: int
    forced_cuts: int
    live_set_cuts: int
    largest_part: int
    peaks: dict[str, int]  # program, base (program order + best schedule), greedy, ilp (split), ilp_unsplit
    solve_s: dict[str, float]  # split, unsplit, schedule, greedy
    unsplit_optimal: bool | None
    unsplit_bound: float | None
    unsplit_limit_s: float
    schedule: dict[str, int]  # eager / end / best (simulator)
    eager_units: list[str]
    xla: dict[str, int] = field(default_factory=dict)  # cpu / tpu: the step's temporaries as each compiler laid out
    schedule_tpu: dict[str, int] = field(default_factory=dict)  # eager / end / best on XLA:TPU
    topology: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoamSummary:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def saved(self, key: str = "ilp", against: str = "program") -> float | None:
        """Fraction of ``against``'s peak (an order, or "cpu" / "tpu") that ``key``'s order saves."""
        base = self.xla.get(against) if against in ("cpu", "tpu") else self.peaks.get(against)
        return 1.0 - self.peaks[key] / base if base else None


def summarize(p: MemoryParams, compilers: bool = True, schedules_tpu: bool = True) -> RoamSummary:
    """:func:`memory.case.analyze` of ``p``'s step, with (``compilers``) XLA:CPU's and XLA:TPU's temporaries and
    (``schedules_tpu``) the three update schedules compiled for XLA:TPU."""
    a = C.analyze(p)
    r = a.roam
    out = RoamSummary(r.graph, {k: getattr(p, k) for k in C.STEP_FIELDS}, r.nodes, r.split.parts, r.split.forced_cuts,
                      r.split.live_set_cuts, r.split.largest_part, dict(r.peaks), dict(r.solve_s),
                      r.unsplit.optimal if r.unsplit else None, r.unsplit.bound if r.unsplit else None,
                      r.unsplit_limit_s, {k: a.schedule[k] for k in C.CHOICES},
                      sorted(u for u, v in a.schedule["schedule"].items() if v == "eager"), notes=list(r.notes))
    if compilers:
        cpu = harness.hlo(C.RoamCase(p, executed=True))
        tv = harness.tpu(C.RoamCase(p), p.generation)
        if cpu.ran:
            out.xla["cpu"] = cpu["peak_bytes.xla"]
        if tv.ran and "peak_bytes.xla" in tv.values:
            out.xla["tpu"], out.topology = tv["peak_bytes.xla"], tv.detail.topology
    if schedules_tpu:
        for choice in C.CHOICES:
            v = harness.tpu(C.UpdateScheduleCase(p, choice=choice), p.generation)
            if v.ran and f"peak_bytes.{choice}" in v.values:
                out.schedule_tpu[choice], out.topology = v[f"peak_bytes.{choice}"], v.detail.topology
    return out


@dataclass
class WeightUpdate:
    """Notebook 08's fused vs separate weight update (``levers.case.UpdateCase`` at 08's defaults), per chip."""

    peak: dict[str, int]  # fused / separate
    temp: dict[str, int]
    topology: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WeightUpdate:
        return cls(**d)


def weight_update_08() -> WeightUpdate:
    """Notebook 08's section 3.4 at its default parameters, compiled here (three programs)."""
    lp = LeversParams(num_devices=runtime.current().num_devices)
    views = {stage: harness.tpu(L.UpdateCase(lp, stage), lp.generation) for stage in P.STAGES}
    mem = L.update_memory(views)
    return WeightUpdate(mem["peak"], mem["temp"], views["fused"].detail.topology)


def roam_results(p: MemoryParams) -> dict[str, Any]:
    """The GPT-2 small block (1 and 2 blocks), the solve-time curve and notebook 08's weight update."""
    out: dict[str, Any] = {"gpt2 L=1": summarize(block_params(p)),
                           "gpt2 L=2 schedules": summarize(block_params(p, 2, 0.0), compilers=False)}
    for i, (name, sizes) in enumerate(SIZES.items()):
        if name == "gpt2 L=1":
            out[f"sizes.{name}"] = out["gpt2 L=1"]
            continue
        limit = SIZES_UNSPLIT_LIMIT_S if i < UNSPLIT_UP_TO else 0.0
        out[f"sizes.{name}"] = summarize(replace(p, **sizes, unsplit_limit_s=limit), compilers=False,
                                         schedules_tpu=False)
    out["levers08.weight_update"] = weight_update_08()
    return out


def load_roam(path: Path = ROAM_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    def from_dict(d: dict[str, Any]) -> Any:
        return WeightUpdate.from_dict(d) if "peak" in d and "nodes" not in d else RoamSummary.from_dict(d)

    return load_results(path, from_dict, "run notebook 08b with full_size=True, or python -m "
                        "shardlab.memory roam")


# ----------------------------------------------------------------------------------------- 07's flash verdict
@dataclass
class FlashVerdict:
    """Notebook 07's Llama training step compiled by XLA:TPU with torch_xla's flash kernel (per chip)."""

    model: str
    topology: str
    mesh: list[int]  # data, fsdp, tensor
    global_batch: int
    seq: int
    recompute: str
    fits: bool
    total: int
    temp: int
    arguments: int
    capacity: int
    custom_calls: int
    compile_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlashVerdict:
        return cls(**d)


def load_verdicts(path: Path = VERDICT_FILE) -> tuple[dict[str, FlashVerdict], dict[str, Any]]:
    return load_results(path, FlashVerdict.from_dict, "run python -m shardlab.memory verdict")


@dataclass(frozen=True)
class FlashVerdictCase(VerdictCase):
    """Notebook 07's training step (``planner.verdict.VerdictCase``) with torch_xla's flash kernel as its attention:
    ``flash_attention(q, k, v, causal=True, sm_scale=1/√hd)`` on the [B, a, S, hd] heads, ``partition_spec`` the
    heads' sharding (batch over data·fsdp, heads over tensor), the whole step traced inside
    :func:`~shardlab.memory.pallas_tpu.pallas_for_tpu_compile` (no [B, a, S, S] array in the program)."""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: Any,
                  spec: tuple[Any, ...]) -> torch.Tensor:
        return flash_attention(q, k, v, causal=True, sm_scale=q.shape[-1] ** -0.5, partition_spec=spec, mesh=mesh)

    def tracing(self) -> contextlib.AbstractContextManager[Any]:
        return pallas_tpu.pallas_for_tpu_compile(active=runtime.current().kind != "tpu")

    @property
    def config(self) -> dict[str, Any]:
        return {**super().config, "attention": "flash"}


VERDICT_PLAN = PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192)  # 07's matrix row, full recompute
# 07's 70B row on v6e-64 (fsdp 16 x tensor 4, 16 x 8192 tokens): the planner says "at risk" with flash and the compiler
# without flash is out of memory. The Pallas kernel is traced for per-device blocks, so the step cannot be traced on
# a few devices and retargeted (``profile.retarget`` refuses ``tpu_custom_call``): traced on 64 CPU devices.
VERDICT_70B_PLAN = PlanConfig("llama-3-70b", "v6e-64", fsdp=16, tensor=4, global_batch=16, seq=8192)
VERDICT_PLANS = {f"{p.model}.{p.topology}": p for p in (VERDICT_PLAN, VERDICT_70B_PLAN)}


def flash_verdict(p: PlanConfig = VERDICT_PLAN) -> FlashVerdict:
    """Compile :class:`FlashVerdictCase` of the plan ``p`` (the harness's TPU view) and read its per-chip bytes."""
    case = FlashVerdictCase(p)
    view = harness.tpu(case, case.generation)
    if not view.ran:
        raise ValueError(f"{p.topology}: {view.skipped}")
    c = view.detail
    cap = tpu.get_topology(c.topology).hbm_bytes or case.plan().hbm_bytes
    mesh = [p.data, p.fsdp, p.tensor]
    if c.fits and c.memory is not None:
        m = c.memory
        calls = c.hlo_text.count('custom_call_target="tpu_custom_call"') if c.hlo_text else 0
        return FlashVerdict(case.model.name, c.topology, mesh, p.global_batch, p.seq, p.recompute, True, m.checked,
                            m.checked_temp, m.argument, cap, calls, c.compile_s)
    o = c.oom
    return FlashVerdict(case.model.name, c.topology, mesh, p.global_batch, p.seq, p.recompute, False, o.used,
                        o.program or 0, o.arguments or 0, cap, 0, c.compile_s)


def _verdict(fits: bool, at_risk: bool) -> str:
    return "fits" if fits else "at risk" if at_risk else "no"


def flash_verdicts(checks: dict[str, PlannerCheck], compiled: dict[str, FlashVerdict]) -> list[dict[str, Any]]:
    """Notebook 07's configurations (its compiles without flash, ``checks``), the planner's flash verdict on each,
    and how far it is checked: **checked** by a compile with the flash kernel (``compiled``), **inferred** from a
    fact that holds whatever the attention kernel — the parameters and AdamW state alone exceed HBM; the step fits
    without flash (flash only removes the s × s buffers); the same per-chip program compiled with flash for another
    chip needs more than this one has — or **unchecked**. ``agrees``: the planner's verdict is the compiler's
    (None when the planner says "at risk", or nothing is known)."""
    gb = 1e9
    rows = []
    for key, c in checks.items():
        cfg, cap = c.config, c.capacity_bytes
        planner = _verdict(c.planner_fits, c.planner_at_risk["flash"])
        state = sum(c.planner.get(k, 0.0) for k in ("params", "optimizer", "padding"))
        same = [v for v in compiled.values() if v.model == cfg["model"] and v.global_batch == cfg["global_batch"]
                and v.seq == cfg["seq"] and v.recompute == cfg["recompute"]
                and v.mesh == [cfg["data"], cfg["fsdp"], cfg["tensor"]]]
        here = next((v for v in same if v.topology == cfg["topology"]), None)
        other = next((v for v in same if v.topology != cfg["topology"] and v.total > cap), None)
        if here is not None:
            status, fits = "checked", here.fits
            why = (f"compiled with the flash kernel ({here.custom_calls} custom calls): "
                   f"{'fits' if here.fits else 'does not fit'}, {here.total / gb:.2f} GB of {here.capacity / gb:.2f}")
        elif state > cap:
            status, fits = "inferred", False
            why = (f"parameters + AdamW state alone are {state / gb:.1f} GB per chip, more than its {cap / gb:.1f} GB: "
                   "no attention kernel changes them")
        elif c.compiler_fits:
            status, fits = "inferred", True
            why = (f"fits without flash ({(c.total or 0) / gb:.2f} GB of {cap / gb:.2f}); flash only removes the "
                   "s × s buffers")
        elif other is not None:
            status, fits = "inferred", False
            why = (f"the same per-chip step compiled with flash for {other.topology} needs {other.total / gb:.2f} GB, "
                   f"more than this chip's {cap / gb:.2f} GB")
        else:
            status, fits = "unchecked", None
            why = (f"does not fit without flash ({(c.total or 0) / gb:.2f} GB of {cap / gb:.2f}); only a compile with "
                   f"the flash kernel ({cfg['data'] * cfg['fsdp'] * cfg['tensor']} devices) can say whether removing "
                   "the s × s buffers is enough")
        agrees = None if planner == "at risk" or fits is None else (planner == "fits") == fits
        rows.append({"configuration": key, "planner (flash)": planner,
                     "planner GB": round(sum(c.planner.values()) / gb, 2), "HBM GB": round(cap / gb, 2),
                     "compiler with flash": {True: "fits", False: "no", None: "?"}[fits], "status": status,
                     "agrees": agrees, "why": why})
    return rows


# ------------------------------------------------------------------------------------------------------- tool
WHAT = {"flash": 1, "roam": 1, "verdict": 8, "verdict-70b": 64}  # what `python -m shardlab.memory` measures -> devices


def write(what: str) -> Path:
    """Measure ``what`` (:data:`WHAT`) in this process and write its cache file (``python -m shardlab.memory``)."""
    p = MemoryParams(num_devices=runtime.current().num_devices).validate()
    started = time.time()
    if what == "flash":
        results, path = flash_results(p), FLASH_FILE
    elif what == "roam":
        results, path = roam_results(p), ROAM_FILE
    elif what in ("verdict", "verdict-70b"):
        plan_ = VERDICT_PLAN if what == "verdict" else VERDICT_70B_PLAN
        key = f"{plan_.model}.{plan_.topology}"
        results, path = {key: flash_verdict(plan_)}, VERDICT_FILE
    else:
        raise ValueError(f"what={what!r} must be one of {WHAT}")
    for k, r in results.items():
        print(k, flash.table([r])[0] if isinstance(r, flash.AttentionMemory) else r.as_dict(), flush=True)
    source = {"command": f"python -m shardlab.memory {what}",
              "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
              "wall_s": round(time.time() - started, 1), "versions": tpu.check_backend(), "cpus": os.cpu_count(),
              "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "machine": platform.machine(),
              "num_devices": p.num_devices}
    if what.startswith("verdict") and path.exists():  # one row per command: merged, the first row's source kept
        cached, first = load_verdicts(path)
        added = [a for a in first.get("added", []) if not set(a["rows"]) & set(results)]
        source = {**first, "added": [*added, {"rows": sorted(results), **source}]}
        results = dict(sorted({**cached, **results}.items()))
    save_results(results, path, **source)
    return path
