"""What a compiled step holds and sends, per chip, next to the planner's prediction.

Design note
-----------
Pure functions of a :class:`shardlab.profile.tpu.TpuCompile` (or its out-of-memory message), the run's
:class:`~shardlab.inspect.config.InspectConfig` and the planner's :class:`~shardlab.planner.Plan`:

memory      the entry arguments are classified exactly: the step's outputs are ``[loss] + [weight, *state]`` per
            trained tensor (the optimizer's state tensors: ``step.output_kinds``) and each is donated into its
            input, so the compiler's ``input_output_alias`` (``TpuCompile.options["donated"]``) names the kind of
            every donated entry parameter; its per-chip bytes come from the program's ``entry_computation_layout``
            (the optimizer state also per state tensor: ``master``, ``exp_avg``, ``row_var``, ...). The rest are the
            inputs (tokens, labels, buffers). The compiler reports its temporaries as one number (the HBM the
            capacity check counts, ``TpuMemory.checked_temp``): the gradients' share is **derived** from the plan's
            layout (bf16, sharded like their weights: what donation turns into temporaries), the rest is
            activations and other temporaries (also derived: temporaries - gradients). Every row says whether it
            was measured (read from the program) or derived (``measured``). Out of memory: the message's figures
            (``used``, ``program``, arguments when evaluated) and the layout's arithmetic for the kinds.
collectives every logical collective of the per-chip program (``HloModule.collectives``), its mesh axes read from
            its replica groups (:func:`group_axes`: the device ids of ``np.arange(n).reshape(mesh)`` varying
            along a subset of axes), its runs per step (a collective in a scanned layer body runs L times:
            ``HloModule.runs``); summed per (axes, op) beside the planner's ``CommTerm`` on the same axes.
largest     out of memory: the compiler's own list (size, shape, XLA label, operator); fits: the largest values
            the scheduled program computes (entry and loop bodies; a value need not be live at the peak).
planner     ``plan(PlanConfig(...))`` with the HF config's sizes (``models.planner_model``), the mesh's (data, fsdp,
            tensor) degrees, the same batch, sequence and recompute, flash attention only when the flash kernel
            is traced (``attention='flash'``; eager and sdpa form the scores); :func:`nearest_fit` searches the
            planner for the closest plan that fits.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardlab import planner as P
from shardlab.formulas import hardware
from shardlab.formulas.optimizers import bytes_per_param, describe, state_tensors
from shardlab.inspect import sharding as S
from shardlab.inspect.config import InspectConfig, layout
from shardlab.inspect.models import planner_model
from shardlab.inspect.step import output_kinds
from shardlab.profile import tpu
from shardlab.profile.hlo import HloModule
from shardlab.profile.hlo_text import parse_shape

GIB = 1024**3
PARAM_BYTES = 2  # bf16 weights (and gradients)


# ------------------------------------------------------------------------------------------------- mesh axes

def group_axes(groups: Sequence[Sequence[int]], mesh: Sequence[tuple[str, int]]) -> tuple[str, ...] | None:
    """The mesh axes a collective's replica groups span, or None when no set of axes gives exactly them.

    >>> group_axes([[0, 2], [1, 3]], (("data", 2), ("tensor", 2)))      # ids np.arange(4).reshape(2, 2)
    ('data',)
    """
    names = [a for a, _ in mesh]
    ids = np.arange(math.prod(n for _, n in mesh)).reshape([n for _, n in mesh])
    want = {frozenset(g) for g in groups}
    real = [i for i, (_, n) in enumerate(mesh) if n > 1]
    for r in range(1, len(real) + 1):
        for axes in itertools.combinations(real, r):
            rest = [i for i in range(len(names)) if i not in axes]
            moved = np.transpose(ids, rest + list(axes)).reshape(-1, math.prod(ids.shape[i] for i in axes))
            if {frozenset(int(x) for x in row) for row in moved} == want:
                return tuple(names[i] for i in axes)
    return None


def sub_axes(groups: Sequence[Sequence[int]], mesh: Sequence[tuple[str, int]]) -> str:
    """Groups that are parts of axes (XLA:TPU splits an axis, e.g. an all-to-all over 2 of fsdp's 4 devices):
    ``"fsdp (groups of 2)"``; ``"irregular"`` otherwise.

    >>> sub_axes([[0, 2], [1, 3], [4, 6], [5, 7]], (("fsdp", 4), ("tensor", 2)))
    'fsdp (groups of 2)'
    """
    shape = [n for _, n in mesh]
    moved: set[int] = set()
    for g in groups:
        coords = [np.unravel_index(i, shape) for i in g]
        moved |= {k for k in range(len(shape)) if len({c[k] for c in coords}) > 1}
    if not moved:
        return "irregular"
    return f"{'+'.join(mesh[k][0] for k in sorted(moved))} (groups of {len(groups[0])})"


def pair_axes(pairs: Sequence[Sequence[int]], mesh: Sequence[tuple[str, int]]) -> tuple[str, ...] | None:
    """The mesh axes along which a collective-permute's (source, target) pairs move data."""
    shape = [n for _, n in mesh]
    moved: set[int] = set()
    for s, t in pairs:
        a, b = np.unravel_index(s, shape), np.unravel_index(t, shape)
        moved |= {i for i in range(len(shape)) if a[i] != b[i]}
    return tuple(mesh[i][0] for i in sorted(moved)) or None


def collective_rows(module: HloModule, cfg: InspectConfig) -> list[dict[str, Any]]:
    """One row per logical collective: op, dtype, mesh axes, per-chip operand bytes, runs per step."""
    rows = []
    for c in module.collectives:
        axes = pair_axes(c.source_target_pairs, cfg.mesh) if c.op == "collective-permute" else \
            group_axes(c.replica_groups, cfg.mesh) if c.replica_groups else tuple(a for a, n in cfg.mesh if n > 1)
        runs = module.runs(c.computation)
        name = "+".join(axes) if axes else sub_axes(c.replica_groups, cfg.mesh) if c.replica_groups else "irregular"
        rows.append({"op": c.op, "dtype": c.dtype, "axes": name,
                     "operands": c.operands, "operand_bytes": c.operand_bytes, "result_bytes": c.result_bytes,
                     "in_loop": c.in_while, "runs": runs, "async": c.async_, "name": c.name})
    return rows


def planner_axes(cfg: InspectConfig) -> dict[str, str]:
    """The planner's axis roles -> this mesh's axis names (``"data+fsdp"`` when a role spans several)."""
    data = [a for a, n in cfg.mesh if n > 1 and a != cfg.tensor and a not in cfg.fsdp]
    return {"data": "+".join(data), "fsdp": "+".join(a for a in cfg.fsdp if cfg.mesh_dict[a] > 1),
            "tensor": cfg.tensor or ""}


def collective_summary(rows: Sequence[Mapping[str, Any]], plan: P.Plan | None, cfg: InspectConfig,
                       program: bool = True) -> list[dict[str, Any]]:
    """Per (axes, op): the compiler's instructions, runs per step and bytes per step beside the planner's
    (``program=False``: out of memory, the compiler returned no program: no ratios)."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        runs = r["runs"] if r["runs"] is not None else 1
        t = table.setdefault((r["axes"], r["op"]), {"axes": r["axes"], "op": r["op"], "instructions": 0,
                                                    "per_step": 0, "bytes_per_step": 0, "runs_unknown": 0,
                                                    "dtypes": set()})
        t["instructions"] += 1
        t["per_step"] += runs
        t["bytes_per_step"] += r["operand_bytes"] * runs
        t["runs_unknown"] += r["runs"] is None
        t["dtypes"].add(r["dtype"])
    roles = planner_axes(cfg)
    for term in (plan.comm if plan is not None else []):
        axes = roles.get(term.axis, term.axis) or term.axis
        t = table.setdefault((axes, term.op), {"axes": axes, "op": term.op, "instructions": 0, "per_step": 0,
                                               "bytes_per_step": 0, "runs_unknown": 0, "dtypes": set()})
        t["planner_count"] = t.get("planner_count", 0) + term.count
        t["planner_bytes"] = t.get("planner_bytes", 0) + term.count * term.payload_bytes
        t.setdefault("planner_what", []).append(term.what)
    out = []
    for t in table.values():
        t["dtypes"] = sorted(t["dtypes"])
        pb = t.get("planner_bytes")
        t["ratio"] = t["bytes_per_step"] / pb if pb and program else None
        out.append(t)
    order = {"all-gather": 0, "reduce-scatter": 1, "all-reduce": 2, "all-to-all": 3, "collective-permute": 4}
    return sorted(out, key=lambda t: (t["axes"], order.get(t["op"], 9)))


# ------------------------------------------------------------------------------------------------------ memory

def entry_parameters(hlo_text: str) -> list[Any]:
    """Per-chip shapes of the entry parameters, from the compiled program's ``entry_computation_layout``."""
    head = hlo_text.split("\n", 1)[0]
    m = re.search(r"entry_computation_layout=\{\((.*?)\)->", head)
    if not m:
        raise ValueError("no entry_computation_layout in the program's header")
    return parse_shape(m.group(1))


def layout_bytes(cfg: InspectConfig) -> dict[str, int]:
    """Per-chip bytes by kind from the plan's layout (the arithmetic: sharded shapes, uneven dims padded)."""
    lay = layout(cfg)
    out = {"params": 0, "optimizer": 0, "grads": 0}
    for _, shape, spec in lay.trained(cfg.layers == "scan"):
        n = math.prod(S.local_shape(shape, spec, cfg.mesh_dict))
        out["params"] += n * PARAM_BYTES
        out["grads"] += n * PARAM_BYTES
    out["optimizer"] = sum(layout_state_bytes(cfg).values())
    out["inputs"] = 2 * (cfg.batch // cfg.batch_degree) * cfg.seq * 8  # tokens, labels: int64 [B/batch, S]
    return out


def layout_state_bytes(cfg: InspectConfig) -> dict[str, int]:
    """Per-chip optimizer-state bytes per state tensor kind (``master``, ``exp_avg``, ``row_var``, ...) from the
    layout: each state tensor sharded like its weight, an Adafactor factor's reduced dimension unsplit."""
    out: dict[str, int] = {}
    for _, shape, spec in layout(cfg).trained(cfg.layers == "scan"):
        for t in state_tensors(cfg.optimizer, cfg.optimizer_dtype, shape):
            local = S.local_shape(t.shape, tuple(None if i == t.reduced else a for i, a in enumerate(spec)),
                                  cfg.mesh_dict)
            out[t.name] = out.get(t.name, 0) + math.prod(local) * (4 if t.dtype == "fp32" else 2)
    return out


def optimizer_summary(compiled: tpu.TpuCompile, cfg: InspectConfig) -> dict[str, Any]:
    """Which optimizer and precision was traced, its state per tensor kind (measured: the donated entry
    parameters of the program; out of memory: the layout's arithmetic, derived) and the planner's bytes/parameter."""
    measured = bool(compiled.fits and compiled.memory is not None)
    if measured:
        by = {k.split(".", 1)[1]: v for k, v in argument_kinds(compiled, cfg).items() if k.startswith("optimizer.")}
    else:
        by = layout_state_bytes(cfg)
    return {"optimizer": cfg.optimizer, "dtype": cfg.optimizer_dtype,
            "what": describe(cfg.optimizer, cfg.optimizer_dtype), "by_state": by, "measured": measured,
            "source": "compiler (donated entry parameters)" if measured else "layout (derived: out of memory)",
            "planner_bytes_per_param": optimizer_k(cfg)}


def argument_kinds(compiled: tpu.TpuCompile, cfg: InspectConfig) -> dict[str, int]:
    """Per-chip argument bytes by kind, read from the compiled program (donation names each parameter):
    ``params``, ``optimizer``, ``inputs``, and ``optimizer.<state tensor>`` (``optimizer.master``, ...)."""
    params = entry_parameters(compiled.hlo_text)
    kinds = output_kinds(cfg)
    out = {"params": 0, "optimizer": 0, "inputs": 0}
    donated = {p: o for o, p in compiled.options.get("donated", [])}
    for k, arr in enumerate(params):
        if k in donated:
            kind = kinds[donated[k] - 1][1]
            out["params" if kind == "param" else "optimizer"] += arr.nbytes
            if kind != "param":
                out[f"optimizer.{kind}"] = out.get(f"optimizer.{kind}", 0) + arr.nbytes
        else:
            out["inputs"] += arr.nbytes
    return out


def optimizer_k(cfg: InspectConfig) -> float:
    """The planner's optimizer bytes per parameter for this run (``formulas.optimizers``; Adafactor's factored
    average over the model's weight shapes, unsharded)."""
    shapes = [shape for _, shape, _ in layout(cfg).trained(cfg.layers == "scan")]
    return bytes_per_param(cfg.optimizer, cfg.optimizer_dtype, shapes)


def memory_rows(compiled: tpu.TpuCompile, cfg: InspectConfig,
                plan: P.Plan | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows ``{kind, compiler, source, planner, ratio}`` (per chip, bytes) and the compiler's totals."""
    lay_b = layout_bytes(cfg)
    totals: dict[str, Any] = {"capacity": None}
    if compiled.fits and compiled.memory is not None:
        m = compiled.memory
        args = argument_kinds(compiled, cfg)
        temp, total = m.checked_temp, m.checked
        totals = {"arguments": m.argument, "temporaries": temp, "checked": total, "peak": m.peak,
                  "outputs": m.output, "aliased": m.alias, "temp_size": m.temp, "capacity": m.capacity}
        src = "compiler"
    else:  # out of memory: the message's figures
        o = compiled.oom
        args = {k: lay_b[k] for k in ("params", "optimizer", "inputs")}
        temp, total = o.program, o.used
        if not o.arguments_evaluated:  # the program alone was over: "used" is the program; add the arguments it
            total = o.used + sum(args.values())  # skipped (the layout's): a lower bound of what the check counts
        totals = {"arguments": o.arguments, "temporaries": o.program, "checked": total, "capacity": o.capacity,
                  "used": o.used, "exceeded": o.exceeded, "fragmentation": o.fragmentation,
                  "arguments_evaluated": o.arguments_evaluated, "lower_bound": not o.arguments_evaluated}
        src = "layout"
    grads = lay_b["grads"]
    rest = None if temp is None else temp - grads
    if rest is not None and rest < 0:  # the compiler stopped before the gradients' temporaries were placed
        rest = None
    values = [(args["params"], src), (args["optimizer"], src), (args["inputs"], src),
              (grads, "layout (inside the temporaries)"),
              (rest, "compiler - gradients" if rest is not None else "not evaluated"),
              (temp, "compiler" if compiled.fits else "compiler (message: program)"),
              (totals.get("arguments"), "compiler" if totals.get("arguments") is not None else "not evaluated"),
              (total, "compiler" if compiled.fits else "compiler (message: used)" if not totals.get("lower_bound")
               else ">= message's program + layout arguments")]
    rows = [{"kind": kind, "compiler": value, "source": source, "measured": measured(kind, compiled.fits),
             **planner_cell(kind, value, plan)}
            for (kind, _), (value, source) in zip(PLANNER_TERMS, values, strict=True)]
    for r in rows:  # which optimizer and precision the state row holds
        if r["kind"] == "optimizer state":
            r["what"] = describe(cfg.optimizer, cfg.optimizer_dtype)
    return rows, totals


# Rows read from the compiled program (when it fits): the rest is layout arithmetic (gradients) or the program's
# temporaries minus that arithmetic (activations + other temporaries). Out of memory the compiler gives only its
# message's figures: temporaries ("program") and the total ("used"); parameters and optimizer state are layout.
DERIVED = ("gradients", "activations")


def measured(kind: str, fits: bool) -> bool:
    """Whether the memory row ``kind`` is read from the compiler (True) or derived (False)."""
    if kind.startswith(DERIVED):
        return False
    return fits or kind.startswith(("temporaries", "total"))


# The memory rows (kinds, in order) and the planner's terms beside each (None: the planner has no such term; "*":
# all of them). The planner counts no inputs; its "padding" is FSDP's flat-unit padding, part of the arguments.
PLANNER_TERMS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("parameters", ("params",)),
    ("optimizer state", ("optimizer",)),
    ("inputs (tokens, labels, buffers)", None),
    ("gradients", ("grads",)),
    ("activations + other temporaries", ("activations", "logits", "fsdp_gathered_unit")),
    ("temporaries (gradients + activations + ...)", ("grads", "activations", "logits", "fsdp_gathered_unit")),
    ("arguments (parameters + optimizer + inputs)", ("params", "optimizer", "padding")),
    ("total (what the capacity check counts)", ("*",)),
)


def planner_cell(kind: str, value: int | None, plan: P.Plan | None) -> dict[str, Any]:
    """``{planner, ratio}`` of one memory row: the planner's bytes for ``kind`` and compiler / planner."""
    keys = dict(PLANNER_TERMS)[kind]
    planned = None if plan is None or keys is None else \
        sum(plan.memory.values()) if keys == ("*",) else sum(plan.memory[k] for k in keys)
    return {"planner": planned, "ratio": value / planned if value is not None and planned else None}


def largest(compiled: tpu.TpuCompile, n: int = 8) -> list[dict[str, Any]]:
    """The largest buffers: the compiler's own list when out of memory, else the largest scheduled values."""
    if not compiled.fits and compiled.oom is not None:
        return [{"bytes": b.size, "shape": b.shape, "op": b.operator, "label": b.label,
                 "allocation": b.allocation_type} for b in compiled.oom.buffers[:n]]
    m = compiled.module
    scheduled = {m.entry, *(w.body for w in m.while_loops)}
    skip = ("parameter", "tuple", "get-tuple-element", "bitcast", "while", "constant", "copy-done", "opt-barrier")
    vals = [i for i in m.instructions.values()
            if i.computation in scheduled and i.opcode not in skip and len(i.shape) == 1]
    out = []
    for i in sorted(vals, key=lambda i: -i.nbytes)[:n]:
        meta = re.search(r'op_name="([^"]*)"', i.attrs.get("metadata", ""))
        out.append({"bytes": i.nbytes, "shape": ", ".join(str(a) for a in i.shape), "op": meta.group(1) if meta
                    else i.opcode, "label": f"{i.name} = {i.opcode}", "allocation": "value (program)"})
    return out


# ------------------------------------------------------------------------------------------------- host memory

HOST_SPACE = "S(5)"  # XLA:TPU's host memory space in a layout (``{...:T(8,128)(2,1)S(5)}``)


def host_offload(compiled: tpu.TpuCompile) -> dict[str, Any] | None:
    """What the compiled program keeps in host memory and moves across, read from its own instructions: the arrays
    in memory space ``S(5)`` (shape and per-chip bytes), the asynchronous transfers (``dynamic-update-slice-start``
    into a host buffer: device -> host; ``dynamic-slice-start`` out of one: host -> device; ``copy-start``), each
    with its runs per step (a transfer in a scanned layer body runs L times) and bytes per step, and the compiler's
    host temporaries (``host_temp_size_in_bytes``). None when nothing is in host memory (or no program)."""
    if compiled.hlo_text is None or compiled.module is None or HOST_SPACE not in compiled.hlo_text:
        return None
    m = compiled.module
    arrays = sorted(set(re.findall(r"(\w+\[[\d,]*\])\{[^}]*" + re.escape(HOST_SPACE) + r"\}", compiled.hlo_text)))
    transfers: dict[str, dict[str, int]] = {}
    for line in compiled.hlo_text.splitlines():
        if HOST_SPACE not in line:
            continue
        name = re.match(r"\s*(?:ROOT\s+)?%?([^\s=]+)\s*=", line)
        ins = m.instructions.get(name.group(1)) if name else None
        if ins is None or ins.opcode not in ("dynamic-update-slice-start", "dynamic-slice-start", "copy-start"):
            continue
        runs = m.runs(ins.computation) or 1
        if ins.opcode == "dynamic-update-slice-start":  # the update (operand 1) goes into the host buffer
            moved = m.instructions[ins.operands[1]].nbytes if len(ins.operands) > 1 and \
                ins.operands[1] in m.instructions else 0
            way = "device -> host"
        elif ins.opcode == "dynamic-slice-start":  # the slice (the start's second-to-last tuple element)
            moved = ins.shape[-2].nbytes if len(ins.shape) >= 2 else 0
            way = "host -> device"
        else:
            moved = ins.shape[-2].nbytes if len(ins.shape) >= 2 else 0
            way = "copy (host memory space)"
        t = transfers.setdefault(f"{ins.opcode} ({way})", {"instructions": 0, "per_step": 0, "bytes_per_step": 0})
        t["instructions"] += 1
        t["per_step"] += runs
        t["bytes_per_step"] += moved * runs
    host = [(a, parse_shape(a)[0].nbytes) for a in arrays]
    return {"arrays": [{"shape": a, "bytes": b} for a, b in host], "transfers": transfers,
            "host_temp": compiled.memory.host_temp if compiled.memory is not None else None,
            "space": HOST_SPACE}


# ------------------------------------------------------------------------------------------------------ planner

def plan_config(cfg: InspectConfig, **changes: Any) -> Any:
    """The planner's configuration of this run (flash attention as traced: only ``attention='flash'``)."""
    d, f, t = cfg.degrees
    model, _ = planner_model(cfg.hf_config(), cfg.model_name)
    kw = {"data": d, "fsdp": f, "tensor": t, "recompute": "full" if cfg.recompute == "offload" else cfg.recompute,
          "offload": cfg.recompute == "offload", "global_batch": cfg.batch, "seq": cfg.seq,
          "flash_attention": cfg.attention == "flash", "fit_margin": cfg.fit_margin, "optimizer_k": optimizer_k(cfg),
          **changes}
    return P.PlanConfig(model, kw.pop("topology", cfg.topology), **kw)


def planner_for(cfg: InspectConfig) -> tuple[Any, str]:
    """``(plan, "")`` or ``(None, why the planner cannot model this run)``."""
    try:
        return P.plan(plan_config(cfg)), ""
    except ValueError as exc:
        return None, f"planner: {exc}"


def nearest_fit(cfg: InspectConfig, max_tensor: int = 8) -> Any:
    """The planner's closest plan that fits: on this slice first (fewest changes among data / fsdp / tensor /
    recompute, then least memory), else the smallest larger slice of the same generation; None if none fits."""
    chip, chips = hardware.topology(cfg.topology)
    d0, f0, t0 = cfg.degrees
    slices = sorted((n, s) for s, n in chip.slices.items() if n >= chips)
    for n, name in slices:
        if name not in tpu.TOPOLOGIES:  # no compile-only topology to confirm it on
            continue
        best = None
        for t in (x for x in range(1, min(n, max_tensor) + 1) if n % x == 0):
            for f in (x for x in range(1, n // t + 1) if (n // t) % x == 0):
                d = n // (t * f)
                for rc in ("full", "none"):
                    try:
                        pl = P.plan(plan_config(cfg, topology=name, data=d, fsdp=f, tensor=t, recompute=rc))
                    except ValueError:
                        continue
                    if not pl.fits or pl.model.heads % t:
                        continue
                    key = ((d != d0) + (f != f0) + (t != t0) + (rc != cfg.recompute), pl.memory_total)
                    if best is None or key < best[0]:
                        best = (key, pl)
        if best is not None:
            return best[1]
    return None
