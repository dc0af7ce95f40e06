"""Automatic strategy, by brute force: every (data, fsdp, tensor) mesh and weight layout of one block, compiled
for the TPU, ranked by what it communicates and what it holds per chip.

Design
------
:func:`shardlab.levers.programs.layouts` lists the candidates; the notebook compiles each with
``shardlab.profile.tpu`` and hands the results to :func:`rank`. Per candidate and per chip:

- ``collectives`` / ``payload_bytes`` — logical collectives in the TPU program and the bytes each chip hands
  to them (a combined tuple collective is one, with all its operands' bytes);
- ``wire_bytes`` — the ring model per collective (``shardlab.formulas.common.wire_bytes``, group size from
  its replica groups), times the iterations of the loop that holds it: what the interconnect must carry;
- ``memory_bytes`` — arguments + outputs − aliased + temporaries (``TpuMemory.total`` minus generated code).

Ranking: wire bytes, then memory, then the name. Megatron's plan (all 8 chips on ``tensor``, megatron
layout) and the planner's choice (``shardlab.planner``: the fitting mesh with the smallest roofline step for
a one-layer model of the same sizes — the planner also counts attention, embedding and logits) are marked.
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import wire_bytes


def metrics(comp: Any) -> dict[str, Any]:
    """Communication and memory of one TPU compile (a ``TpuCompile``); ``fits`` False when out of memory."""
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


def planner_choice(batch: int, seq: int, hidden: int, ffn: int, heads: int, topology: str = "v5e-8",
                   devices: int = 8) -> tuple[int, int, int] | None:
    """The planner's (data, fsdp, tensor) for a one-layer model of these sizes: among the meshes that fit, the
    smallest roofline step time (ties: less memory). None when no mesh is legal for the planner."""
    from shardlab.planner import PlanConfig, plan

    model = {"name": "levers-mlp", "layers": 1, "hidden": hidden, "ffn": ffn, "heads": heads, "kv_heads": heads,
             "vocab": 128, "gated_mlp": False}
    best: tuple[float, float, tuple[int, int, int]] | None = None
    for t in range(1, devices + 1):
        for f in range(1, devices // t + 1):
            if devices % (t * f):
                continue
            d = devices // (t * f)
            try:
                p = plan(PlanConfig(model, topology, data=d, fsdp=f, tensor=t, recompute="none",
                                    global_batch=batch, seq=seq))
            except ValueError:
                continue
            if p.fits:
                key = (p.roofline.step_s, p.memory_total, (d, f, t))
                best = key if best is None or key < best else best
    return best[2] if best else None


def rank(rows: list[dict[str, Any]], planner: tuple[int, int, int] | None = None) -> Any:
    """A DataFrame of candidates (each row: data, fsdp, tensor, layout + :func:`metrics`), best first, with
    ``megatron`` and ``planner`` marks."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame["megatron"] = (frame["data"] == 1) & (frame["fsdp"] == 1) & (frame["layout"] == "megatron") \
        & (frame["tensor"] == frame[["data", "fsdp", "tensor"]].prod(axis=1))
    frame["planner"] = [planner is not None and (d, f, t) == tuple(planner) and lay == "megatron"
                        for d, f, t, lay in zip(frame["data"], frame["fsdp"], frame["tensor"], frame["layout"],
                                                strict=True)]
    frame["mesh"] = [f"d{d}·f{f}·t{t}" for d, f, t in zip(frame["data"], frame["fsdp"], frame["tensor"], strict=True)]
    fits = frame[frame["fits"]].sort_values(["wire_bytes", "memory_bytes", "mesh", "layout"])
    rest = frame[~frame["fits"]]
    out = pd.concat([fits, rest]).reset_index(drop=True)
    out.index += 1
    return out


def auto_sharding(build: Any, cfg: Any, generation: str = "v5e") -> dict[str, Any]:
    """XLA's auto-sharding (``use_auto_spmd_partitioning``) on the graph of ``build(cfg)``, compile-only, over a
    1-D mesh of all chips, with the user's shardings removed so the solver chooses every array's sharding.

    Returns ``{"compile": TpuCompile, "metrics": ...}`` or ``{"skipped": reason}`` when the TPU compile module of
    this installation has no auto-sharding option, or the compiler rejects it.
    """
    import inspect

    from shardlab import runtime
    from shardlab.profile import tpu as T

    n = runtime.current().num_devices
    if "auto_spmd_mesh" not in inspect.signature(T.compile_program).parameters:
        return {"skipped": "shardlab.profile.tpu.compile_program has no auto_spmd_mesh option in this version "
                           "(the build option use_auto_spmd_partitioning is not reachable)"}
    try:
        comp = T.compile_program(build, cfg, T.topology_for(n, generation), auto_spmd_mesh=(n,),
                                 debug_options={"xla_tpu_auto_spmd_remove_all_user_shardings": True},
                                 label="auto-sharding")
    except Exception as exc:  # noqa: BLE001 — the compiler's refusal is the finding
        return {"skipped": f"the TPU compiler rejected auto-sharding: {type(exc).__name__}: {str(exc)[:300]}"}
    return {"compile": comp, "metrics": {"what": "auto-sharding", **metrics(comp)}}
