"""Memory order: the same dataflow graph needs more or less memory depending on the order its operators run in.

Design
------
A :class:`Graph` is a list of operators :class:`Op`; each reads tensors and writes tensors of known sizes.
The memory model is the one operator-ordering work (ROAM, OLLA/MODeL) and XLA's heap simulator share, without
buffer sharing:

- while operator v runs, its inputs are still live and its outputs are allocated:
  ``memory during v = live tensors + v's outputs``;
- a tensor is freed right after its last consumer ran (an output nobody reads is freed at once); a graph
  output stays live to the end;
- *external* tensors (graph inputs — XLA's parameters) are never counted; graph outputs are counted unless
  ``count_outputs=False`` (XLA reports parameters and outputs apart from its temporaries).

Three ways to look at every order of a graph:

- :func:`peak` — the memory profile of one given order (step by step: live before, during, after);
- :func:`all_orders` — brute force: every topological order and its peak (at most
  :data:`MAX_BRUTE_FORCE_OPS` operators and :data:`MAX_ORDERS` orders, a clear error beyond);
- :func:`extremes` — the exact best and worst peak and the number of orders, by dynamic programming over the
  set of operators already run (the live memory depends only on that set); it visits each reachable set once
  and is limited to :data:`MAX_STATES` of them, which covers narrow graphs of a few tens of operators.

:func:`graph_from_hlo` turns the entry computation of a scheduled HLO module into a Graph whose
``order`` is XLA's own schedule, so XLA's choice can be placed between the best and the worst order.
``bitcast``, ``get-tuple-element``, ``tuple`` and ``optimization-barrier`` only rename buffers and are
folded away. The model never lets an output reuse an input's buffer (XLA's heap simulator may, for
elementwise ops) and ignores allocation alignment, so it is an upper bound of XLA's heap-simulated peak for the
same order, usually within a few per cent on graphs of dots and reductions.

Example (ROAM's effect on a hand-built four-operator graph, sizes in MB)::

    >>> g = roam_toy()
    >>> peak(g, ("V0", "V1", "V2", "V3")).peak, peak(g, ("V0", "V2", "V1", "V3")).peak
    (17, 12)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.profile.hlo import HloModule

MAX_BRUTE_FORCE_OPS = 10  # 10! = 3.6 M orders for ten independent operators: the brute force's ceiling
MAX_ORDERS = 200_000  # orders the brute force enumerates before giving up
MAX_STATES = 500_000  # executed-operator sets the dynamic programme may visit
ALIAS_OPCODES = ("bitcast", "get-tuple-element", "tuple", "optimization-barrier", "add-dependency", "after-all")


@dataclass(frozen=True)
class Op:
    """One operator: reads ``inputs``, writes ``outputs`` (tensor name, bytes)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]


@dataclass
class Graph:
    """A dataflow graph of operators (see the module note for the memory model)."""

    ops: tuple[Op, ...]
    outputs: frozenset[str] = frozenset()  # tensors that stay live to the end
    external: Mapping[str, int] = field(default_factory=dict)  # graph inputs: never counted
    count_outputs: bool = True  # False: graph outputs are not counted (XLA's "temp" excludes them)
    order: tuple[str, ...] | None = None  # a program order to compare with (e.g. XLA's schedule)
    name: str = "graph"

    def __post_init__(self) -> None:
        self.ops = tuple(self.ops)
        self.outputs = frozenset(self.outputs)
        names = [o.name for o in self.ops]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: operator names must be distinct, got {names}")
        self.index = {o.name: i for i, o in enumerate(self.ops)}
        self.producer: dict[str, int] = {}
        self.size: dict[str, int] = {}
        for i, o in enumerate(self.ops):
            for t, b in o.outputs:
                if t in self.producer or t in self.external:
                    raise ValueError(f"{self.name}: tensor {t!r} is written twice (by {o.name!r} and before)")
                if not isinstance(b, int) or b < 0:
                    raise ValueError(f"{self.name}: tensor {t!r} has size {b!r}; sizes are non-negative ints")
                self.producer[t], self.size[t] = i, b
        self.consumers: dict[str, set[int]] = {t: set() for t in self.producer}
        for i, o in enumerate(self.ops):
            for t in o.inputs:
                if t in self.producer:
                    self.consumers[t].add(i)
                elif t not in self.external:
                    raise ValueError(f"{self.name}: operator {o.name!r} reads {t!r}, which no operator writes and "
                                     "which is not an external input")
        unknown = sorted(self.outputs - set(self.producer) - set(self.external))
        if unknown:
            raise ValueError(f"{self.name}: outputs {unknown} are written by no operator")
        # predecessor masks: operator i may run once every operator in pred[i] has run
        self.pred = [0] * len(self.ops)
        for i, o in enumerate(self.ops):
            for t in o.inputs:
                if t in self.producer:
                    self.pred[i] |= 1 << self.producer[t]
        if self.order is not None:
            self.check_order(self.order)

    # ------------------------------------------------------------------------------------------- helpers
    def counted(self, t: str) -> bool:
        return t in self.producer and (self.count_outputs or t not in self.outputs)

    def check_order(self, order: Sequence[str]) -> list[int]:
        """Indices of ``order``; ValueError unless it is a topological order of every operator."""
        missing = sorted(set(self.index) - set(order))
        extra = [n for n in order if n not in self.index]
        if missing or extra or len(order) != len(self.ops):
            raise ValueError(f"{self.name}: an order must list every operator once (missing {missing}, "
                             f"unknown {extra}, {len(order)} given for {len(self.ops)})")
        done, idx = 0, []
        for n in order:
            i = self.index[n]
            if self.pred[i] & ~done:
                need = [self.ops[j].name for j in range(len(self.ops)) if self.pred[i] >> j & 1 and not done >> j & 1]
                raise ValueError(f"{self.name}: {n!r} runs before its producers {need}")
            done |= 1 << i
            idx.append(i)
        return idx

    def freeable(self, i: int) -> list[tuple[int, int]]:
        """``(bytes, consumer mask)`` of each counted, non-output tensor operator ``i`` reads or writes: freed
        after ``i`` once every consumer in the mask has run (an output nobody reads: mask 0, freed at once)."""
        o = self.ops[i]
        return [(self.size[t], sum(1 << c for c in self.consumers[t]))
                for t in dict.fromkeys([*o.inputs, *(t for t, _ in o.outputs)])
                if t in self.producer and t not in self.outputs and self.counted(t)]

    def freed_after(self, i: int, done: int) -> int:
        """Bytes freed once operator ``i`` has run, given the operators in ``done`` (which include ``i``)."""
        return sum(b for b, consumers in self.freeable(i) if not consumers & ~done)

    def step_bytes(self, i: int) -> int:
        return sum(b for t, b in self.ops[i].outputs if self.counted(t))


@dataclass(frozen=True)
class OpMemory:
    op: str
    before: int  # live bytes before the operator runs
    during: int  # live + its outputs
    after: int  # after its dead inputs (and unread outputs) are freed


@dataclass(frozen=True)
class Profile:
    order: tuple[str, ...]
    steps: tuple[OpMemory, ...]

    @property
    def peak(self) -> int:
        return max((s.during for s in self.steps), default=0)

    @property
    def peak_op(self) -> str:
        return max(self.steps, key=lambda s: s.during).op


def peak(graph: Graph, order: Sequence[str] | None = None) -> Profile:
    """The memory profile of running ``graph`` in ``order`` (default: ``graph.order``, else the listed order)."""
    order = tuple(order if order is not None else graph.order or [o.name for o in graph.ops])
    idx = graph.check_order(order)
    live, done, steps = 0, 0, []
    for i in idx:
        during = live + graph.step_bytes(i)
        done |= 1 << i
        after = during - graph.freed_after(i, done)
        steps.append(OpMemory(graph.ops[i].name, live, during, after))
        live = after
    return Profile(order, tuple(steps))


def _ready(graph: Graph, done: int) -> Iterator[int]:
    for i in range(len(graph.ops)):
        if not done >> i & 1 and graph.pred[i] & ~done == 0:
            yield i


def topological_orders(graph: Graph) -> Iterator[tuple[str, ...]]:
    """Every topological order (generator; no limit — :func:`all_orders` applies the limits)."""
    n, path = len(graph.ops), []

    def rec(done: int) -> Iterator[tuple[str, ...]]:
        if len(path) == n:
            yield tuple(graph.ops[i].name for i in path)
            return
        for i in _ready(graph, done):
            path.append(i)
            yield from rec(done | 1 << i)
            path.pop()

    yield from rec(0)


def all_orders(graph: Graph, max_ops: int = MAX_BRUTE_FORCE_OPS, max_orders: int = MAX_ORDERS) -> list[Profile]:
    """Brute force: the profile of every topological order (sorted by peak, then order)."""
    if len(graph.ops) > max_ops:
        raise ValueError(f"{graph.name}: {len(graph.ops)} operators; the brute force enumerates every order and is "
                         f"limited to max_ops={max_ops} — use extremes() (exact, dynamic programming)")
    out = []
    for k, order in enumerate(topological_orders(graph)):
        if k >= max_orders:
            raise ValueError(f"{graph.name}: more than max_orders={max_orders} topological orders — use extremes()")
        out.append(peak(graph, order))
    return sorted(out, key=lambda p: (p.peak, p.order))


@dataclass(frozen=True)
class Extremes:
    best: Profile  # an order with the smallest peak
    worst: Profile  # an order with the largest peak
    orders: int  # how many topological orders the graph has
    states: int  # executed-operator sets visited

    @property
    def ratio(self) -> float:
        """best / worst peak (1.0 when the order cannot matter)."""
        return self.best.peak / self.worst.peak if self.worst.peak else 1.0


def extremes(graph: Graph, max_states: int = MAX_STATES) -> Extremes:
    """Exact smallest and largest peak over all topological orders, and how many orders there are.

    After running the operators in a set S the live bytes are fixed, so ``best(S) = min over ready v of
    max(live(S) + out(v), best(S + v))`` (and max for the worst); memoised on S as a bit mask.
    """
    n = len(graph.ops)
    full = (1 << n) - 1
    pred = graph.pred
    out_bytes = [graph.step_bytes(i) for i in range(n)]
    frees = [graph.freeable(i) for i in range(n)]  # (bytes, consumer mask) per tensor operator i may free
    live_of: dict[int, int] = {0: 0}
    memo: dict[int, tuple[int, int, int, int, int]] = {}  # S -> (best, best_next, worst, worst_next, count)

    def solve(done: int) -> tuple[int, int, int, int, int]:
        if done in memo:
            return memo[done]
        if done == full:
            memo[done] = (0, -1, 0, -1, 1)
            return memo[done]
        if len(memo) >= max_states:
            raise ValueError(f"{graph.name}: more than max_states={max_states} executed-operator sets; the graph "
                             f"({n} operators) is too wide for the exact search")
        live = live_of[done]
        best, bnext, worst, wnext, count = math.inf, -1, -1, -1, 0
        for i in range(n):
            if done >> i & 1 or pred[i] & ~done:
                continue  # run, or not ready
            during = live + out_bytes[i]
            nxt = done | 1 << i
            if nxt not in live_of:  # freed: tensors whose every consumer has run (graph.freed_after)
                live_of[nxt] = during - sum(b for b, consumers in frees[i] if not consumers & ~nxt)
            b, _, w, _, c = memo[nxt] if nxt in memo else solve(nxt)
            if max(during, b) < best:
                best, bnext = max(during, b), i
            if max(during, w) > worst:
                worst, wnext = max(during, w), i
            count += c
        if bnext < 0:
            raise ValueError(f"{graph.name}: no operator can run after {bin(done)} — the graph has a cycle")
        memo[done] = (int(best), bnext, worst, wnext, count)
        return memo[done]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 100))
    try:
        _, _, _, _, count = solve(0)
    finally:
        sys.setrecursionlimit(limit)

    def walk(slot: int) -> tuple[str, ...]:
        done, out = 0, []
        while done != full:
            i = memo[done][slot]
            out.append(graph.ops[i].name)
            done |= 1 << i
        return tuple(out)

    return Extremes(peak(graph, walk(1)), peak(graph, walk(3)), count, len(memo))


# ----------------------------------------------------------------------------------------------- the toy
def graph(spec: Mapping[str, tuple[Sequence[str], Mapping[str, int]]], outputs: Sequence[str] = (),
          name: str = "graph", **kw: Any) -> Graph:
    """Build a Graph from ``{op: (inputs, {output: bytes})}`` in that (program) order."""
    ops = tuple(Op(k, tuple(ins), tuple(outs.items())) for k, (ins, outs) in spec.items())
    return Graph(ops, frozenset(outputs), name=name, **kw)


def roam_toy() -> Graph:
    """Four operators V0 → V3 where V0-V2-V1-V3 needs 12/17 ≈ 71 % of the memory of V0-V1-V2-V3 (sizes in MB).

    Built for this suite after the ROAM paper's motivating example (Shu et al. 2023, TorchAcc), whose exact
    sizes we could not obtain: V0 writes a ``small`` tensor (1) and a ``large`` one (10); V1 *expands* ``small``
    into ``expanded`` (6); V2 *shrinks* ``large`` into ``shrunk`` (1); V3 combines ``expanded`` and ``shrunk``
    into the output ``out`` (1). Running the shrinking branch first frees ``large`` before ``expanded`` exists::

        V0-V1-V2-V3: during V1  small + large + expanded = 1 + 10 + 6 = 17   (large still waits for V2)
        V0-V2-V1-V3: during V2  small + large + shrunk   = 1 + 10 + 1 = 12   (then large is freed: 2, + expanded = 8)
    """
    return graph({
        "V0": ((), {"small": 1, "large": 10}),
        "V1": (("small",), {"expanded": 6}),
        "V2": (("large",), {"shrunk": 1}),
        "V3": (("expanded", "shrunk"), {"out": 1}),
    }, outputs=("out",), name="roam-toy")


# ------------------------------------------------------------------------------------------- from XLA HLO
def graph_from_hlo(module: HloModule, count_outputs: bool = False) -> Graph:
    """The entry computation of a parsed, scheduled HLO module as a Graph; ``order`` = XLA's schedule.

    Parameters and constants are external; renaming ops (``bitcast``, ``get-tuple-element``, ``tuple`` ...)
    are folded into the buffers they rename; every other instruction is one operator writing one buffer of its
    result's bytes (a tuple-shaped result counts all its elements). The ROOT's buffers are graph outputs, not
    counted by default (XLA's temporaries exclude them).
    """
    names = module.computations[module.entry]
    ins = module.instructions
    under: dict[str, tuple[str, ...]] = {}  # instruction -> the buffers it stands for
    external: dict[str, int] = {}
    ops: list[Op] = []
    root = None
    for n in names:
        i = ins[n]
        srcs = tuple(dict.fromkeys(b for o in i.operands if o in under for b in under[o]))  # operands' buffers
        if i.is_root:
            root = n
        if i.opcode in ("parameter", "constant"):  # "parameter(2)": the text in brackets is no operand
            external[n] = i.nbytes
            under[n] = (n,)
        elif i.opcode in ALIAS_OPCODES:
            under[n] = srcs
        else:
            ops.append(Op(n, srcs, ((n, i.nbytes),)))
            under[n] = (n,)
    outs = frozenset(b for b in under.get(root, ()) if b not in external) if root else frozenset()
    scheduled = "is_scheduled=true" in module.text.split("\n", 1)[0]
    return Graph(tuple(ops), outs, external, count_outputs=count_outputs,
                 order=tuple(o.name for o in ops) if scheduled else None, name=module.name)
