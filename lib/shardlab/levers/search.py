"""Automatic strategy, by brute force: every (data, fsdp, tensor) mesh and weight layout of one block, compiled
for the TPU, ranked by what it communicates and what it holds per chip; and XLA's own auto-sharding.

Design
------
:func:`shardlab.levers.programs.layouts` lists the candidates; :func:`search` compiles each
(:class:`shardlab.levers.case.LayoutCase` through ``harness.tpu``) and hands the results to :func:`rank`. Per
candidate and per chip:

- ``collectives`` / ``payload_bytes`` — logical collectives in the TPU program and the bytes each chip hands
  to them (a combined tuple collective is one, with all its operands' bytes);
- ``wire_bytes`` — the ring model per collective (``shardlab.formulas.common.wire_bytes``, group size from
  its replica groups), times the iterations of the loop that holds it: what the interconnect must carry;
- ``memory_bytes`` — arguments + outputs − aliased + temporaries (``TpuMemory.total`` minus generated code).

Ranking: wire bytes, then memory, then the name. Megatron's plan (all chips on ``tensor``, megatron
layout) and the planner's choice (``shardlab.planner``: the fitting mesh with the smallest roofline step for
a one-layer model of the same sizes — the planner also counts attention, embedding and logits) are marked.
:func:`auto_sharding` compiles a case with XLA's auto-sharding pass in place of sharding propagation.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import pandas as pd

from shardlab.core import harness
from shardlab.core.case import Case
from shardlab.core.views import View
from shardlab.formulas.common import wire_bytes
from shardlab.levers import programs as P
from shardlab.levers.case import LayoutCase, devices
from shardlab.levers.params import LeversParams
from shardlab.planner import PlanConfig, plan
from shardlab.profile.tpu import TpuCompile

AUTO_OPTIONS = {"debug_options": {"xla_tpu_auto_spmd_remove_all_user_shardings": True}, "label": "auto-sharding"}


def metrics(comp: TpuCompile) -> dict[str, Any]:
    """Communication and memory of one TPU compile; ``fits`` False when out of memory."""
    if not comp.fits:
        return {"fits": False, "collectives": None, "payload_bytes": None, "wire_bytes": None,
                "memory_bytes": comp.oom.used if comp.oom else None, "compile_s": comp.compile_s}
    colls = comp.module.collectives
    # a collective in a loop body (XLA:TPU's windowed einsum) moves its bytes once per iteration
    wire = sum((comp.module.runs(c.computation) or 1)
               * (wire_bytes(c.op, c.operand_bytes, c.group_size or 2) if c.op != "collective-permute"
                  else c.operand_bytes) for c in colls)
    ops: dict[str, int] = {}
    for c in colls:
        ops[c.op] = ops.get(c.op, 0) + 1
    m = comp.memory
    return {"fits": True, "collectives": len(colls), "ops": ", ".join(f"{v}×{k}" for k, v in sorted(ops.items())),
            "payload_bytes": sum(c.operand_bytes for c in colls), "wire_bytes": int(wire),
            "memory_bytes": m.argument + m.output - m.alias + m.temp, "compile_s": comp.compile_s}


def formula_wire_bytes(case: LayoutCase) -> int | None:
    """Per-chip wire bytes of a plan whose collectives follow from its layout alone (None for the others), by the
    ring model: Megatron (every chip on ``tensor``, megatron layout) all-reduces the [b, s, h] activation twice — g
    on the output, f on the input gradient; pure data parallelism (every chip on ``data``) all-reduces the two
    weight gradients [h, F]. bf16 (2 bytes per element)."""
    p, n = case.p, case.devices
    if case.layout == "megatron" and case.tensor == n:
        return 2 * int(wire_bytes("all_reduce", case.batch * (p.mlp_seq // 8) * p.mlp_hidden * 2, n))
    if case.data == n:
        return 2 * int(wire_bytes("all_reduce", p.mlp_hidden * p.mlp_ffn * 2, n))
    return None


def planner_choice(batch: int, seq: int, hidden: int, ffn: int, heads: int, topology: str = "v5e-8",
                   devices: int = 8) -> tuple[int, int, int] | None:
    """The planner's (data, fsdp, tensor) for a one-layer model of these sizes: among the meshes that fit, the
    smallest roofline step time (ties: less memory). None when no mesh is legal for the planner."""
    model = {"name": "levers-mlp", "layers": 1, "hidden": hidden, "ffn": ffn, "heads": heads, "kv_heads": heads,
             "vocab": 128, "gated_mlp": False}
    best: tuple[float, float, tuple[int, int, int]] | None = None
    for d, f, t, _ in P.layouts(devices, ("megatron",)):
        try:
            p = plan(PlanConfig(model, topology, data=d, fsdp=f, tensor=t, recompute="none",
                                global_batch=batch, seq=seq))
        except ValueError:
            continue
        if p.fits:
            key = (p.roofline.step_s, p.memory_total, (d, f, t))
            best = key if best is None or key < best else best
    return best[2] if best else None


def rank(rows: list[dict[str, Any]], planner: tuple[int, int, int] | None = None) -> pd.DataFrame:
    """A DataFrame of candidates (each row: data, fsdp, tensor, layout + :func:`metrics`), best first, with
    ``megatron`` and ``planner`` marks and ``mesh`` = the degrees data·fsdp·tensor (``"1·1·8"``)."""
    frame = pd.DataFrame(rows)
    frame["megatron"] = (frame["data"] == 1) & (frame["fsdp"] == 1) & (frame["layout"] == "megatron") \
        & (frame["tensor"] == frame[["data", "fsdp", "tensor"]].prod(axis=1))
    frame["planner"] = [planner is not None and (d, f, t) == tuple(planner) and lay == "megatron"
                        for d, f, t, lay in zip(frame["data"], frame["fsdp"], frame["tensor"], frame["layout"],
                                                strict=True)]
    frame["mesh"] = [f"{d}·{f}·{t}" for d, f, t in zip(frame["data"], frame["fsdp"], frame["tensor"], strict=True)]
    fits = frame[frame["fits"]].sort_values(["wire_bytes", "memory_bytes", "mesh", "layout"])
    rest = frame[~frame["fits"]]
    out = pd.concat([fits, rest]).reset_index(drop=True)
    out.index += 1
    return out


class Search(NamedTuple):
    frame: pd.DataFrame  # :func:`rank`'s table
    planner: tuple[int, int, int] | None  # the planner's (data, fsdp, tensor)
    views: dict[str, View]  # candidate name -> its tpu view
    skipped: dict[str, str]  # candidate name -> why its sizes do not split over it


def candidates(p: LeversParams, planner: tuple[int, int, int] | None) -> list[LayoutCase]:
    """``p.search == "full"``: every mesh and layout of the devices; ``"small"``: pure data parallel, pure FSDP,
    Megatron, and the planner's mesh; ``"off"``: none."""
    n = devices(p)
    cands = P.layouts(n) if p.search != "off" else []
    if p.search == "small":
        want = {(n, 1, 1, "megatron"), (1, n, 1, "megatron"), (1, 1, n, "megatron"),
                (*(planner or (n, 1, 1)), "megatron")}
        cands = [c for c in cands if c in want]
    return [LayoutCase(p, d, f, t, lay) for d, f, t, lay in cands]


def search(p: LeversParams, generation: str = "v5e") -> Search:
    """Every candidate of :func:`candidates` compiled for the TPU, ranked (see the module note)."""
    n = devices(p)
    planner = planner_choice(LayoutCase.batch, p.mlp_seq // 8, p.mlp_hidden, p.mlp_ffn, heads=8,
                             topology=f"{generation}-{n}", devices=n)
    rows, views, skipped = [], {}, {}
    for case in candidates(p, planner):
        why = case.problem()
        view = View.skip("tpu", why) if why else harness.tpu(case, generation)
        if not view.ran:
            skipped[case.phase] = view.skipped or ""
            continue
        views[case.phase] = view
        rows.append({"data": case.data, "fsdp": case.fsdp, "tensor": case.tensor, "layout": case.layout,
                     **metrics(view.detail)})
    return Search(rank(rows, planner) if rows else pd.DataFrame(), planner, views, skipped)


def auto_sharding(case: Case, generation: str = "v5e") -> View:
    """XLA's auto-sharding (``use_auto_spmd_partitioning``) on the case's graph, compile-only, over a 1-D mesh of
    its chips, with the user's shardings removed so the solver chooses every array's sharding. A compiler that
    rejects it gives a skipped view with its message."""
    try:
        return harness.tpu(case, generation, auto_spmd_mesh=(case.devices,), **AUTO_OPTIONS)
    except Exception as exc:  # noqa: BLE001 — the compiler's refusal is the finding
        return View.skip("tpu", f"the TPU compiler rejected auto-sharding: {type(exc).__name__}: {str(exc)[:300]}")


def parameter_shardings(comp: TpuCompile) -> list[str]:
    """The sharding of every entry parameter of a compiled program (``{devices=[8,1]0,1,...}``)."""
    return [m.group(1) for ln in (comp.hlo_text or "").splitlines() if " parameter(" in ln
            for m in [re.search(r"sharding=(\{[^}]*\})", ln)] if m]
