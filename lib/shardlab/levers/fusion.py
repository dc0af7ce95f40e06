"""Fusion: how many kernels a compiled program launches, and how many of them only move memory.

Design
------
Each instruction the entry computation schedules (plus while bodies) is one kernel that reads its operands
from memory and writes its result. A *fusion* is several HLO ops compiled into one such kernel, so its
intermediates never touch memory. We classify every scheduled instruction:

- ``matmul`` — a dot / convolution, or a fusion that contains one (compute-bound for large sizes);
- ``memory-bound`` — any other kernel that reads and writes arrays: elementwise, reduce, transpose, copy,
  broadcast, and fusions without a matmul (``kLoop`` / ``kInput`` fusions);
- ``collective`` — communication (counted by the combining and overlap sections);
- left out: ``parameter``, ``constant``, ``tuple``, ``get-tuple-element``, ``bitcast`` (no kernel) and the TPU's
  own memory-system bookkeeping (``copy-start``/``copy-done`` prefetches to on-chip memory, ``slice-start``...).

The counts of the CPU and TPU programs of the same graph differ because the TPU compiler fuses more
aggressively (and fuses collectives and matmuls into async collective fusions).
"""

from __future__ import annotations

from collections import Counter

from shardlab.levers.overlap import matmul_flops
from shardlab.profile.hlo import COLLECTIVES, HloModule

NO_KERNEL = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "add-dependency",
             "opt-barrier", "optimization-barrier", "partition-id", "replica-id")
BOOKKEEPING = ("copy-start", "copy-done", "slice-start", "slice-done", "async-done", "async-update")


def _scheduled(module: HloModule) -> list[str]:
    names = list(module.computations[module.entry])
    for loop in module.while_loops:
        names += module.computations.get(loop.body, [])
    return names


def _collective_names(module: HloModule) -> set[str]:
    """Names of collective instructions and of the instructions that issue them (a TPU async start)."""
    return {n for c in module.collectives for n in (c.name, getattr(c, "start", ""), getattr(c, "done", "")) if n}


def kernel_kind(module: HloModule, name: str, collective_names: set[str] | None = None) -> str | None:
    """``matmul`` | ``memory-bound`` | ``collective`` | None (no kernel / bookkeeping)."""
    ins = module.instructions[name]
    op = ins.opcode
    if op in NO_KERNEL or op in BOOKKEEPING:
        return None
    if collective_names is None:
        collective_names = _collective_names(module)
    if op.removesuffix("-start").removesuffix("-done") in COLLECTIVES or name in collective_names:
        return "collective"
    if op in ("while", "call", "conditional"):
        return None  # their bodies are counted themselves
    return "matmul" if matmul_flops(module, name) else "memory-bound"


def fusion_counts(module: HloModule) -> dict[str, int]:
    """Kernels by kind, fusions by XLA fusion kind, and the instructions fused away."""
    kinds: Counter[str] = Counter()
    fusion_kinds: Counter[str] = Counter()
    fused_ops = 0
    colls = _collective_names(module)
    for n in _scheduled(module):
        k = kernel_kind(module, n, colls)
        if k is None:
            continue
        kinds[k] += 1
        ins = module.instructions[n]
        if ins.opcode == "fusion":
            fusion_kinds[ins.attrs.get("kind", "?")] += 1
            comp = ins.attrs.get("calls", "").lstrip("%")
            fused_ops += sum(1 for m in module.computations.get(comp, [])
                             if module.instructions[m].opcode not in NO_KERNEL)
    return {"kernels": sum(kinds.values()), "matmul": kinds["matmul"], "memory-bound": kinds["memory-bound"],
            "collective": kinds["collective"], "fusions": sum(fusion_kinds.values()),
            **{f"fusion.{k}": v for k, v in sorted(fusion_kinds.items())}, "ops inside fusions": fused_ops}
