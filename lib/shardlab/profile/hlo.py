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

On CPU, XLA lowers a reduce-scatter to ``all-reduce`` followed by ``dynamic-slice``; such an all-reduce is
flagged ``feeds_dynamic_slice`` so callers can count the pair as the reduce-scatter the formula predicts.

XLA:TPU programs (``shardlab.profile.tpu``) print one logical collective in several places, and each is
counted once (grouped by ``(op, channel_id)``):

- an *async collective fusion*: ``%async-collective-start = (...) fusion(...), kind=kCustom, calls=%c`` where
  ``%c`` holds the collective and ``custom-call(...), custom_call_target="AsyncCollectiveStart"``; continuation
  fusions (overlapped work) and the ``AsyncCollectiveDone`` fusion hold clones with the same ``channel_id``;
- ``all-reduce-start``/``-done``, ``all-gather-start``/``-done``, ``collective-permute-start``/``-done`` pairs
  (the start's tuple also carries the operands and u32 context scalars: the result is read from the done);
- ``async-start``/``async-done`` wrapping a computation that holds the collective (e.g. a ``reduce-scatter``);
- TPU's reduce-scatter from GSPMD: a ``kCustom`` fusion calling ``%all-reduce-scatter*`` (an all-reduce and its
  dynamic-slices inside), counted as ``reduce-scatter``; the native ``reduce-scatter`` instruction as itself;
- tuple collectives from the combiner: one record with ``operands`` k and the bytes of all k.

Collectives inside fusion / async computations are placed at the instruction that schedules them (entry or
while body), which gives ``in_while`` and, for async ones, :meth:`HloModule.async_windows` (what is scheduled
between start and done). An ``all-gather`` whose result is summed over the gathered dimension is flagged
``decomposed_all_reduce`` (XLA:TPU also emits all-gather + reduce over a size-1 dimension: not flagged).

Example (a hand-written per-device program: the row-parallel half of a Megatron MLP on 8 devices)::

    >>> text = '''HloModule SyncTensorsGraph.9_spmd, num_partitions=8
    ... %add (a: f32[], b: f32[]) -> f32[] {
    ...   %a = f32[] parameter(0)
    ...   %b = f32[] parameter(1)
    ...   ROOT %s = f32[] add(%a, %b)
    ... }
    ... ENTRY %main (p0: f32[32,128], p1: f32[128,256]) -> f32[32,256] {
    ...   %p0 = f32[32,128]{1,0} parameter(0)
    ...   %p1 = f32[128,256]{1,0} parameter(1)
    ...   %dot = f32[32,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    ...   ROOT %all-reduce = f32[32,256]{1,0} all-reduce(%dot), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
    ... }'''
    >>> m = parse_hlo(text)
    >>> m.count("all-reduce"), m.bytes("all-reduce"), m.collectives[0].group_size
    (1, 32768, 8)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shardlab.profile.hlo_loops import trip_count as _loop_trip_count
from shardlab.profile.hlo_text import (  # noqa: F401  (re-exported: the parser's public vocabulary)
    COMPUTATION_RE,
    Array,
    BufferAssignment,
    Instruction,
    parse_buffer_assignment,
    parse_instruction,
    parse_replica_groups,
    parse_shape,
)

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Ops an all-reduce result may pass through on its way to the dynamic-slice that makes it a reduce-scatter
# (uneven shards add a pad; bf16 adds a convert; averaging adds a multiply/divide).
_PASS_THROUGH = ("bitcast", "copy", "reshape", "get-tuple-element", "pad", "slice", "convert", "multiply",
                 "divide", "fusion")
_CALL_ATTRS = ("to_apply", "calls", "body", "condition", "true_computation", "false_computation")
# Callers whose computation runs as part of the calling instruction (not scheduled on its own).
_NESTING = ("fusion", "async-start", "async-update", "async-done")


@dataclass
class Collective:
    """One logical collective of the per-device program.

    XLA:TPU may print one collective several times: an async collective fusion holds a clone in its start,
    continuation and done computations (same ``channel_id``); ``-start``/``-done`` pairs and ``async-start``
    wrappers split it in two. Each appears here once, at the instruction that is scheduled (``computation`` is
    the entry / while body that schedules it, ``start``/``done`` the instructions there). A tuple collective
    made by the combiner is one record with ``operands`` k and the bytes of all k.
    """

    op: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    name: str  # the collective instruction (for clones: the one in the start computation)
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
    operands: int = 1  # k for a tuple (combined) collective
    async_: bool = False  # issued by a start and completed by a done, with other work possibly in between
    form: str = "sync"  # sync | start-done | async-start | async-collective-fusion | all-reduce-scatter-fusion
    channel_id: int | None = None
    clones: int = 1  # how many HLO instructions print this one collective
    start: str = ""  # scheduled instruction that issues it (== done for a sync collective)
    done: str = ""
    decomposed_all_reduce: bool = False  # an all-gather whose result is then summed over the gathered dim

    @property
    def group_size(self) -> int:
        return len(self.replica_groups[0]) if self.replica_groups else 0


@dataclass
class WhileLoop:
    name: str
    computation: str
    body: str
    state_bytes: int  # per-device bytes of the loop-carried tuple
    state: list[Array]


@dataclass
class AsyncWindow:
    """What the schedule puts between an async collective's start and done (candidates for overlap)."""

    collective: Collective
    computation: str
    between: list[str]  # instruction names, in schedule order, strictly between start and done
    compute: list[str]  # those of them that do matmul/convolution work (directly or in their fusion)


@dataclass
class HloModule:
    name: str
    text: str
    num_partitions: int
    instructions: dict[str, Instruction]
    computations: dict[str, list[str]]  # computation -> instruction names (in schedule order when scheduled)
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
        """``{op: {"count", "operands", "operand_bytes", "result_bytes", "async"}}`` for the ops present.

        ``count`` is logical collectives, ``operands`` the arrays they move (a combined 4-gradient all-reduce:
        count 1, operands 4), ``async`` how many are issued asynchronously: compare CPU and TPU programs row by row.
        """
        out: dict[str, dict[str, int]] = {}
        for c in self.collectives:
            s = out.setdefault(c.op, {"count": 0, "operands": 0, "operand_bytes": 0, "result_bytes": 0, "async": 0})
            s["count"] += 1
            s["operands"] += c.operands
            s["operand_bytes"] += c.operand_bytes
            s["result_bytes"] += c.result_bytes
            s["async"] += int(c.async_)
        return out

    def async_windows(self) -> list[AsyncWindow]:
        """For each async collective, the instructions scheduled between its start and its done.

        Only meaningful for a scheduled module (``is_scheduled=true``: XLA:TPU's output), where each
        computation's instructions are printed in execution order.
        """
        out = []
        for c in self.collectives:
            if not c.async_ or not c.start or not c.done:
                continue
            order = self.computations.get(c.computation, [])
            if c.start not in order or c.done not in order:
                continue
            between = order[order.index(c.start) + 1: order.index(c.done)]
            out.append(AsyncWindow(c, c.computation, between, [n for n in between if self._computes(n)]))
        return out

    def executed(self, name: str) -> list[Instruction]:
        """Instruction ``name`` and everything it runs: the instructions of the computations it calls (a fusion's
        body, nested fusions, an async wrapper's computation), transitively."""
        ins = self.instructions[name]
        inner = _reachable([c for c in _called(ins) if c in self.computations], self.calls)
        return [ins, *(self.instructions[n] for c in sorted(inner) for n in self.computations[c])]

    @cached_property
    def calls(self) -> dict[str, list[str]]:
        """``{computation: the computations its instructions call}``, built once per module."""
        return {c: [x for n in ns for x in _called(self.instructions[n])] for c, ns in self.computations.items()}

    def _computes(self, name: str) -> bool:
        return any(i.opcode in ("convolution", "dot") for i in self.executed(name))

    def trip_count(self, name: str) -> int | None:
        """Iterations of ``while`` instruction ``name``, read by running its integer control
        (:func:`shardlab.profile.hlo_loops.trip_count`); None when that cannot be done — never a guess.

        XLA:TPU's windowed einsum (a matmul whose reduce-scatter / all-gather it decomposes into a loop of
        collective-permutes) is such a loop: its cost analysis counts the body once, whatever the trip count.
        """
        return _loop_trip_count(self, name)

    def runs(self, computation: str) -> int | None:
        """How often ``computation``'s scheduled instructions run per execution of the entry: 1 for the entry,
        a while body its loop's trip count times the runs of the computation that holds the loop (nested loops
        multiply). None when a trip count on the way is unknown, or the computation is not scheduled code."""
        if computation == self.entry:
            return 1
        holders = [i for i in self.instructions.values()
                   if i.opcode == "while" and i.attrs.get("body", "").lstrip("%") == computation]
        if len(holders) != 1:
            return None
        trips, outer = self.trip_count(holders[0].name), self.runs(holders[0].computation)
        return None if trips is None or outer is None else trips * outer


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

    collectives = _collectives(instructions, computations, users, in_loop, num_partitions, lowered_reduce_scatter)
    loops = [WhileLoop(w.name, w.computation, w.attrs.get("body", "").lstrip("%"), w.nbytes, w.shape) for w in whiles]
    buffers = parse_buffer_assignment(buffer_assignment) if buffer_assignment else None
    return HloModule(name, text, num_partitions, instructions, computations, entry, collectives, loops, buffers)


def _collectives(instructions: dict[str, Instruction], computations: dict[str, list[str]],
                 users: dict[str, list[Instruction]], in_loop: set[str], num_partitions: int,
                 lowered_reduce_scatter: Any) -> list[Collective]:
    """One :class:`Collective` per logical collective (clones, start/done pairs and wrappers folded)."""
    callers: dict[str, list[Instruction]] = {}
    for ins in instructions.values():
        for c in _called(ins):
            callers.setdefault(c, []).append(ins)

    def host(ins: Instruction) -> Instruction:
        """The instruction that is scheduled for ``ins``: climb out of fusion / async computations."""
        while True:
            outer = [c for c in callers.get(ins.computation, []) if c.opcode in _NESTING]
            if not outer:
                return ins
            ins = next((c for c in outer if c.opcode != "async-done"), outer[0])

    def targets(computation: str) -> set[str]:
        return {instructions[n].attrs.get("custom_call_target", "").strip('"') for n in computations[computation]
                if instructions[n].opcode == "custom-call"}

    def done_of(start: Instruction) -> Instruction | None:
        """The ``*-done`` / ``async-done`` that completes ``start`` (through ``async-update`` links)."""
        for u in users.get(start.name, []):
            if u.opcode.endswith("-done"):
                return u
            if u.opcode == "async-update":
                return done_of(u)
        return None

    groups: dict[tuple[str, str], list[Instruction]] = {}
    for ins in instructions.values():
        op = ins.opcode.removesuffix("-start")
        if op in COLLECTIVES:
            cid = ins.attrs.get("channel_id")
            groups.setdefault((op, f"channel {cid}" if cid else ins.name), []).append(ins)

    out = []
    for (op, _), clones in groups.items():
        ins, result, form, start, done = clones[0], clones[0].shape, "sync", host(clones[0]), host(clones[0])
        operand_arrays = [a for o in ins.operands if o in instructions for a in instructions[o].shape]
        tgt = {c.name: targets(c.computation) for c in clones}
        if any("AsyncCollectiveStart" in t for t in tgt.values()):  # TPU async collective fusion: 3 clones
            ins = next(c for c in clones if "AsyncCollectiveStart" in tgt[c.name])
            operand_arrays = [a for o in ins.operands if o in instructions for a in instructions[o].shape]
            result, form, start = ins.shape, "async-collective-fusion", host(ins)
            done = host(next((c for c in clones if "AsyncCollectiveDone" in tgt[c.name]), ins))
        elif ins.opcode.endswith("-start"):  # all-reduce-start / all-gather-start / collective-permute-start
            form, end = "start-done", done_of(ins)
            done = end or ins
            result = end.shape if end else result[len(operand_arrays): 2 * len(operand_arrays)] or result
        elif start.opcode == "async-start":  # async-start(...), calls=%computation holding the collective
            form, end = "async-start", done_of(start)
            done = end or start
        elif op == "all-reduce" and start is not ins and _called(start)[0].startswith("all-reduce-scatter"):
            op, form, result = "reduce-scatter", "all-reduce-scatter-fusion", start.shape  # TPU's reduce-scatter
        rg = parse_replica_groups(ins.attrs.get("replica_groups"), num_partitions)
        cp = op == "collective-permute"
        operands = len(ins.operands)
        if op == "all-to-all" and "dimensions" not in ins.attrs and rg and operands == len(rg[0]):
            operands = 1  # XLA:CPU's tuple form: one array per destination of ONE all-to-all, not k combined
        out.append(Collective(
            op=op, name=ins.name, dtype=result[0].dtype if result else "?", shape=[a.dims for a in result],
            operand_shapes=[a.dims for a in operand_arrays], operand_bytes=sum(a.nbytes for a in operand_arrays),
            result_bytes=sum(a.nbytes for a in result), replica_groups=[] if cp else rg,
            computation=start.computation, in_while=start.computation in in_loop,
            feeds_dynamic_slice=form == "sync" and op == "all-reduce"
            and lowered_reduce_scatter(ins, len(rg[0]) if rg else 0),
            source_target_pairs=parse_replica_groups(ins.attrs.get("source_target_pairs"), 0) if cp else [],
            operands=operands, async_=form != "sync" and form != "all-reduce-scatter-fusion",
            form=form, channel_id=int(ins.attrs["channel_id"]) if "channel_id" in ins.attrs else None,
            clones=len(clones), start=start.name, done=done.name,
            decomposed_all_reduce=op == "all-gather"
            and _summed_over_gathered_dim(ins, users, instructions, computations),
        ))
    return out


def _summed_over_gathered_dim(ins: Instruction, users: dict[str, list[Instruction]],
                              instructions: dict[str, Instruction], computations: dict[str, list[str]]) -> bool:
    """An all-gather whose result a sum-``reduce`` collapses over the gathered dimension: an all-reduce in
    disguise. (XLA:TPU also emits all-gather + reduce over a size-1 dimension: that is a plain all-gather.)"""
    gathered = {int(d) for d in re.findall(r"\d+", ins.attrs.get("dimensions", ""))}
    for u in users.get(ins.name, []):
        if u.opcode != "reduce" or not ins.shape:
            continue
        reduced = {int(d) for d in re.findall(r"\d+", u.attrs.get("dimensions", ""))}
        body = computations.get(u.attrs.get("to_apply", "").lstrip("%"), [])
        is_add = any(instructions[n].is_root and instructions[n].opcode == "add" for n in body)
        dims = ins.shape[0].dims
        if is_add and any(d in reduced and d < len(dims) and dims[d] > 1 for d in gathered):
            return True
    return False
