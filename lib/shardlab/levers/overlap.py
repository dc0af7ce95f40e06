"""Overlap: what the TPU scheduler puts between an asynchronous collective's start and its done, and a model
of the communication time that is left exposed.

Design
------
XLA:TPU issues a collective asynchronously (a ``*-start`` / ``*-done`` pair, an ``async-start``, or an *async
collective fusion*) and its latency-hiding scheduler moves independent work between the two; that work runs
while the bytes travel. The parser (:meth:`shardlab.profile.hlo.HloModule.async_windows`) lists, per async
collective, the instructions scheduled in between. This module prices them:

- :func:`matmul_flops` — FLOPs of the matmul work of one instruction (a ``dot``, or a ``convolution`` — the
  TPU writes matmuls as convolutions — directly or inside the fusion it calls): ``2 · output elements · K``,
  K the contracted size (``lhs_contracting_dims`` for a dot; the input-feature dimension times the window for
  a convolution). A ``while`` (XLA:TPU's *windowed einsum*: a gradient matmul and its reduce-scatter decomposed
  into a loop of collective-permutes, each permute hidden behind one chunk of the matmul) does its body's work
  once per iteration: trip count × body (:meth:`shardlab.profile.hlo.HloModule.trip_count`). The compiler's own
  cost analysis counts a loop body once, so :func:`schedule_flops` can exceed it; the independent check is the
  step's matmul FLOPs worked out by hand.
- :func:`exposed` — the model, per chip, clearly a model: a collective takes ``wire bytes / ICI egress``
  (ring model of ``shardlab.formulas.common.wire_bytes``; a collective-permute its operand bytes; no start-up
  latency); the compute of its window takes ``FLOPs / peak bf16 FLOP/s``. Exposed time: a synchronous
  collective's whole time; an asynchronous one's ``max(0, comm − window compute)``. A collective inside a loop
  body runs once per iteration (``runs``), its window is one iteration's. "No overlap" is the sum of all
  collective times.

**The egress, per torus axis** (the JAX scaling book's model, ``ChipProfile.ici_egress_for``): a bidirectional
ring along one axis of the 2-D torus sends over 2 of the chip's 4 links, one way each (v5e: 100 GB/s); a group
whose devices span k axes gets k times that (both axes of v5e: 200 GB/s, half the published bidirectional
figure). Given the slice (``topology``, e.g. ``"v5e-8"``), :func:`axes` reads how many axes each collective's
replica groups (a permute: its source and target devices) span from where the compile-only topology places its
devices (``shardlab.formulas.hardware.group_axes``: hosts of 2 x 2 chips, checked against libtpu). Without a
slice every collective gets the all-axes egress (``ici_egress_bytes_per_s``). Not modelled: a slice smaller than
the pod has no wraparound link on an axis (a line, not a ring), and a permute's neighbours may be more than one
hop apart.

Example::

    rows, total = exposed(tpu_module, chip("v5e"), "v5e-8")
    total["exposed_s"] <= total["no_overlap_s"]      # always (by construction: not a check)
"""

from __future__ import annotations

import math
import re
from typing import Any

from shardlab.formulas import hardware
from shardlab.formulas.common import wire_bytes
from shardlab.profile.hlo import Collective, HloModule, Instruction

MATMUL_OPCODES = ("dot", "convolution")


def _matmul_instructions(module: HloModule, name: str) -> list[Instruction]:
    """The dot / convolution instructions executed by instruction ``name`` (itself, or inside its fusions; a
    ``while`` is priced by :func:`matmul_flops` with its trip count)."""
    return [i for i in module.executed(name) if i.opcode in MATMUL_OPCODES]


def _contracted(module: HloModule, ins: Instruction) -> int:
    lhs = module.instructions.get(ins.operands[0]) if ins.operands else None
    if lhs is None or not lhs.shape:
        return 0
    dims = lhs.shape[0].dims
    if ins.opcode == "dot":
        idx = [int(d) for d in re.findall(r"\d+", ins.attrs.get("lhs_contracting_dims", ""))]
        return math.prod(dims[i] for i in idx if i < len(dims))
    labels = ins.attrs.get("dim_labels", "")
    lhs_labels = labels.split("_")[0] if labels else ""
    k = dims[lhs_labels.index("f")] if "f" in lhs_labels and lhs_labels.index("f") < len(dims) else 1
    wm = re.search(r"size=([\dx]+)", ins.attrs.get("window", ""))
    window = math.prod(int(v) for v in wm.group(1).split("x")) if wm else 1
    groups = int(ins.attrs.get("feature_group_count", "1"))
    return k * window // max(groups, 1)


def matmul_flops(module: HloModule, name: str) -> int:
    """FLOPs (multiply + add) of the matmul work of instruction ``name`` in a parsed HLO module (memoised on
    the module: a TPU program has hundreds of scheduled instructions, each priced several times)."""
    cache = module.__dict__.setdefault("_matmul_flops", {})
    if name not in cache:
        ins = module.instructions[name]
        if ins.opcode == "while":  # the body's work, once per iteration (an unknown trip count: once, flagged)
            body = ins.attrs.get("body", "").lstrip("%")
            cache[name] = (module.trip_count(name) or 1) * sum(matmul_flops(module, n)
                                                                for n in module.computations.get(body, []))
        else:
            cache[name] = sum(2 * (math.prod(i.shape[0].dims) if i.shape else 0) * _contracted(module, i)
                              for i in _matmul_instructions(module, name))
    return cache[name]


def schedule_flops(module: HloModule) -> int:
    """Matmul FLOPs of every instruction the entry computation schedules (compare the compiler's cost analysis)."""
    return sum(matmul_flops(module, n) for n in module.computations[module.entry])


def _windows(module: HloModule) -> dict[str, list[str]]:
    """``{collective name: instructions scheduled between its start and done}`` (async collectives only)."""
    return {w.collective.name: list(w.between) for w in module.async_windows()}


def axes(collective: Collective, slice_name: str) -> int:
    """Torus axes the collective's groups span on the slice ``slice_name`` (e.g. ``"v5e-8"``): the most any of its
    replica groups spans (a collective-permute: all its source and target devices; no groups: every chip); at
    least 1."""
    chips = hardware.slice_chips(slice_name)[1]
    if collective.op == "collective-permute":
        groups = [sorted({d for pair in collective.source_target_pairs for d in pair})]
    else:
        groups = collective.replica_groups or [list(range(chips))]
    return max(1, *(hardware.group_axes(slice_name, g) for g in groups))


def exposed(module: HloModule, chip: hardware.ChipProfile, slice_name: str | None = None
            ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per-collective rows and totals of the exposed-communication model (see the module note); ``slice_name``
    (e.g. ``"v5e-8"``): each collective gets the egress of the torus axes it spans, else the all-axes egress."""
    wins = _windows(module)
    rows = []
    for c in module.collectives:
        group = c.group_size or 2
        wire = wire_bytes(c.op, c.operand_bytes, group) if c.op != "collective-permute" else c.operand_bytes
        runs = module.runs(c.computation)  # iterations of the loop that holds it (1 in the entry)
        k = axes(c, slice_name) if slice_name else None
        egress = chip.ici_egress_for(k) if k else chip.ici_egress_bytes_per_s
        comm_s = wire / egress
        between = wins.get(c.name, [])
        flops = sum(matmul_flops(module, n) for n in between)
        window_s = flops / chip.bf16_peak_flops_per_s
        exp = max(0.0, comm_s - window_s) if c.async_ else comm_s
        times = runs or 1
        rows.append({"collective": c.name, "op": c.op, "form": c.form, "operands": c.operands,
                     "bytes": c.operand_bytes, "group": group, "axes": k, "egress_Bps": egress, "wire_bytes": wire,
                     "runs": runs, "between": len(between),
                     "matmuls_between": sum(1 for n in between if matmul_flops(module, n)), "window_flops": flops,
                     "comm_s": times * comm_s, "window_s": times * window_s, "exposed_s": times * exp})
    comm = sum(r["comm_s"] for r in rows)
    compute = schedule_flops(module) / chip.bf16_peak_flops_per_s
    unknown = sum(module.trip_count(w.name) is None for w in module.while_loops)
    total = {"compute_s": compute, "comm_s": comm, "no_overlap_s": comm,
             "exposed_s": sum(r["exposed_s"] for r in rows), "hidden_s": comm - sum(r["exposed_s"] for r in rows),
             "step_no_overlap_s": compute + comm, "step_s": compute + sum(r["exposed_s"] for r in rows),
             "loops_unknown_trips": unknown}
    return rows, total


def schedule(module: HloModule) -> list[tuple[str, str]]:
    """The entry computation's schedule as (instruction, kind): kind ``matmul``, ``collective-start``,
    ``collective-done``, ``collective`` (synchronous), or ``other`` (bookkeeping left out)."""
    starts = {c.start: c for c in module.collectives if c.async_}
    dones = {c.done: c for c in module.collectives if c.async_}
    syncs = {c.start: c for c in module.collectives if not c.async_}
    skip = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done",
            "slice-start", "slice-done")
    out = []
    for n in module.computations[module.entry]:
        ins = module.instructions[n]
        if n in starts:
            out.append((n, "collective-start"))
        elif n in dones:
            out.append((n, "collective-done"))
        elif n in syncs:
            out.append((n, "collective"))
        elif matmul_flops(module, n):
            out.append((n, "matmul"))
        elif ins.opcode not in skip:
            out.append((n, "other"))
    return out
