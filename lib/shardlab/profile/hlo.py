"""Parse the per-device HLO that XLA's SPMD partitioner produced (the "compiler" view).

Design
------
We read XLA's text dumps (``--xla_dump_hlo_as_text``): ``*after_optimizations.txt`` holds the partitioned,
optimised per-device program and ``*after_optimizations-buffer-assignment.txt`` its buffer assignment.
The text is parsed in three passes:

1. split into computations (``[ENTRY] %name (...) -> type {`` ... ``}``) and instructions
   (``[ROOT] %name = <shape> <opcode>(<operands>), <attributes>``); shapes may be tuples, and after
   optimisation operands are printed as bare names, so every operand is resolved to its defining instruction;
2. build the call graph (``to_apply``, ``calls``, ``body``, ``condition``, ``branch_computations`` ...) to know
   which collectives sit inside a ``while`` body (scan layers);
3. collect collectives with per-device operand/result bytes and explicit replica groups (the iota form
   ``[G,S]<=[d0,d1]T(1,0)`` is expanded).

On CPU, XLA lowers a reduce-scatter to ``all-reduce`` followed by ``dynamic-slice`` (no reduce-scatter); such an
all-reduce is flagged ``feeds_dynamic_slice`` so callers can count the pair as the reduce-scatter the formula
predicts.

Example (hand-written HLO)::

    >>> m = parse_hlo(TEXT)
    >>> m.count("all-reduce"), m.bytes("all-reduce")
    (1, 32768)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from shardlab.profile.hlo_text import (  # noqa: F401  (re-exported: the parser's public vocabulary)
    COMPUTATION_RE,
    DTYPE_BYTES,
    Array,
    BufferAssignment,
    Instruction,
    parse_buffer_assignment,
    parse_instruction,
    parse_replica_groups,
    parse_shape,
)

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ASYNC_SUFFIX = ("-start",)
# Ops an all-reduce result may pass through on its way to the dynamic-slice that makes it a reduce-scatter
# (uneven shards add a pad; bf16 adds a convert; averaging adds a multiply/divide).
_PASS_THROUGH = ("bitcast", "copy", "reshape", "get-tuple-element", "pad", "slice", "convert", "multiply",
                 "divide", "fusion")
_CALL_ATTRS = ("to_apply", "calls", "body", "condition", "true_computation", "false_computation")


@dataclass
class Collective:
    op: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    name: str
    dtype: str
    shape: list[tuple[int, ...]]  # per-device result shape(s)
    operand_shapes: list[tuple[int, ...]]
    operand_bytes: int
    result_bytes: int
    replica_groups: list[list[int]]
    computation: str
    in_while: bool
    feeds_dynamic_slice: bool = False
    source_target_pairs: list[list[int]] = field(default_factory=list)

    @property
    def group_size(self) -> int:
        return len(self.replica_groups[0]) if self.replica_groups else 0

    def as_dict(self) -> dict[str, object]:
        return {
            "op": self.op, "name": self.name, "dtype": self.dtype, "shape": self.shape,
            "operand_bytes": self.operand_bytes, "result_bytes": self.result_bytes,
            "group_size": self.group_size, "groups": len(self.replica_groups), "in_while": self.in_while,
            "feeds_dynamic_slice": self.feeds_dynamic_slice,
        }


@dataclass
class WhileLoop:
    name: str
    computation: str
    body: str
    state_bytes: int  # per-device bytes of the loop-carried tuple
    state: list[Array]


@dataclass
class HloModule:
    name: str
    text: str
    num_partitions: int
    instructions: dict[str, Instruction]
    computations: dict[str, list[str]]  # computation -> instruction names
    entry: str
    collectives: list[Collective]
    while_loops: list[WhileLoop]
    buffers: BufferAssignment | None = None

    @property
    def instruction_count(self) -> int:
        return len(self.instructions)

    def count(self, op: str, in_while: bool | None = None) -> int:
        return len(self._select(op, in_while))

    def bytes(self, op: str, which: str = "operand", in_while: bool | None = None) -> int:
        if which not in ("operand", "result"):
            raise ValueError(f"which={which!r} must be 'operand' or 'result'")
        return sum(c.operand_bytes if which == "operand" else c.result_bytes for c in self._select(op, in_while))

    def _select(self, op: str, in_while: bool | None) -> list[Collective]:
        if op not in COLLECTIVES and op != "any":
            raise ValueError(f"op={op!r} is not one of {COLLECTIVES} (or 'any')")
        return [c for c in self.collectives
                if (op == "any" or c.op == op) and (in_while is None or c.in_while == in_while)]

    def summary(self) -> dict[str, dict[str, int]]:
        """``{op: {"count", "operand_bytes", "result_bytes"}}`` for the ops present."""
        out: dict[str, dict[str, int]] = {}
        for c in self.collectives:
            s = out.setdefault(c.op, {"count": 0, "operand_bytes": 0, "result_bytes": 0})
            s["count"] += 1
            s["operand_bytes"] += c.operand_bytes
            s["result_bytes"] += c.result_bytes
        return out


def _called(ins: Instruction) -> list[str]:
    names = [ins.attrs[a].lstrip("%") for a in _CALL_ATTRS if a in ins.attrs]
    if "branch_computations" in ins.attrs:
        names += [n.strip().lstrip("%") for n in ins.attrs["branch_computations"].strip("{}").split(",")]
    return names


def _reachable(start: list[str], calls: dict[str, list[str]]) -> set[str]:
    seen, stack = set(), list(start)
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            stack.extend(calls.get(c, []))
    return seen


def parse_hlo(text: str, buffer_assignment: str | None = None) -> HloModule:
    """Parse one HLO module's text (optionally with its buffer-assignment dump)."""
    hm = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M)
    name = hm.group(1) if hm else "unknown"
    pm = re.search(r"num_partitions=(\d+)", text)
    num_partitions = int(pm.group(1)) if pm else 1
    instructions: dict[str, Instruction] = {}
    computations: dict[str, list[str]] = {}
    entry, current = "", None
    for line in text.splitlines():
        cm = COMPUTATION_RE.match(line.strip()) if not line.startswith("  ") else None
        if cm:
            current = cm.group(2)
            computations[current] = []
            if cm.group(1):
                entry = current
            continue
        if current is None or line.strip() in ("", "}"):
            if line.strip() == "}":
                current = None
            continue
        ins = parse_instruction(line, current)
        if ins:
            instructions[ins.name] = ins
            computations[current].append(ins.name)

    calls = {c: [n for i in names for n in _called(instructions[i])] for c, names in computations.items()}
    whiles = [i for i in instructions.values() if i.opcode == "while"]
    in_loop = _reachable([w.attrs.get("body", "").lstrip("%") for w in whiles]
                         + [w.attrs.get("condition", "").lstrip("%") for w in whiles], calls)
    users: dict[str, list[Instruction]] = {}
    for ins in instructions.values():
        for op in ins.operands:
            users.setdefault(op, []).append(ins)

    def fusion_ds(ins: Instruction) -> list[Instruction]:
        inner = _reachable([ins.attrs.get("calls", "").lstrip("%")], calls)
        return [instructions[n] for c in inner for n in computations.get(c, [])
                if instructions[n].opcode == "dynamic-slice"]

    def reached_ds(name: str, hops: int = 3) -> list[Instruction]:
        """Dynamic-slices this value reaches through at most ``hops`` layout/elementwise/pad steps."""
        found: list[Instruction] = []
        for u in users.get(name, []):
            if u.opcode == "dynamic-slice":
                found.append(u)
            elif u.opcode == "fusion":
                found += fusion_ds(u)
            if hops and u.opcode in _PASS_THROUGH:
                found += reached_ds(u.name, hops - 1)
        return found

    def is_sum(ins: Instruction) -> bool:
        body = computations.get(ins.attrs.get("to_apply", "").lstrip("%"), [])
        return any(instructions[n].is_root and instructions[n].opcode == "add" for n in body)

    def lowered_reduce_scatter(ins: Instruction, group: int) -> bool:
        """A sum all-reduce whose result is cut to its 1/group share (padding allowed) by a dynamic-slice."""
        if group < 2 or not is_sum(ins) or not ins.shape:
            return False
        n = math.prod(ins.shape[0].dims)
        return any(n <= math.prod(d.shape[0].dims) * group <= 2 * n for d in reached_ds(ins.name) if d.shape)

    collectives = []
    for ins in instructions.values():
        op = ins.opcode.removesuffix("-start") if ins.opcode.endswith(_ASYNC_SUFFIX) else ins.opcode
        if op not in COLLECTIVES:
            continue
        operand_arrays = [a for o in ins.operands if o in instructions for a in instructions[o].shape]
        result = ins.shape
        if ins.opcode.endswith("-start") and len(result) > len(operand_arrays):
            result = result[len(operand_arrays):]  # async start returns (operands, results)
        groups = parse_replica_groups(ins.attrs.get("replica_groups"), num_partitions)
        pairs = parse_replica_groups(ins.attrs.get("source_target_pairs"), 0) if op == "collective-permute" else []
        collectives.append(Collective(
            op=op, name=ins.name, dtype=result[0].dtype if result else "?",
            shape=[a.dims for a in result], operand_shapes=[a.dims for a in operand_arrays],
            operand_bytes=sum(a.nbytes for a in operand_arrays), result_bytes=sum(a.nbytes for a in result),
            replica_groups=groups if op != "collective-permute" else [], computation=ins.computation,
            in_while=ins.computation in in_loop,
            feeds_dynamic_slice=op == "all-reduce" and lowered_reduce_scatter(ins, len(groups[0]) if groups else 0),
            source_target_pairs=pairs,
        ))
    loops = [WhileLoop(w.name, w.computation, w.attrs.get("body", "").lstrip("%"), w.nbytes, w.shape) for w in whiles]
    buffers = parse_buffer_assignment(buffer_assignment) if buffer_assignment else None
    return HloModule(name, text, num_partitions, instructions, computations, entry, collectives, loops, buffers)
