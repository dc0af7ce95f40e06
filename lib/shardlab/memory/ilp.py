"""The operator order with the smallest peak memory, as an integer program (scipy ``milp``, HiGHS); greedy; simulator.

Design note
-----------
**Problem.** n operators with precedences, and tensors: each has a size, a producer (or none: *resident* — it is
live when the (sub)graph starts, e.g. produced by an earlier part), its consumers, and ``keep`` (live to the end:
a graph output, or read by a later part). The memory model is ``shardlab.profile.order``'s: during the operator at
position t, live = every tensor produced at or before t whose consumers have not all run before t (a tensor is
freed right after its last consumer; one nobody reads is freed right after its producer), plus kept tensors.
:func:`problem_from_graph` builds a Problem from a ``profile.order.Graph`` (a whole graph, or a part of an order with
the tensors that cross its borders); :func:`simulate` gives the memory at every step of an order.

**Integer program** (:func:`solve`). Position-indexed, cumulative form (the time-indexed formulation of MODeL /
OLLA, Steiner et al. 2022, written with "has run by position t" variables):

    C[i,t] ∈ {0,1}   operator i has run at a position <= t     (t = 0 .. n-1)
    C[i,t] <= C[i,t+1],   sum_i C[i,t] = t + 1                  (one operator per position)
    C[j,t] <= C[i,t-1]    for every edge i -> j                 (j runs after i)
    L[k,t] >= C[p,t] - C[c,t-1]   for each consumer c of tensor k (producer p): live while a consumer is pending
    L[k,t] >= C[p,t] - C[p,t-1]                                   live during its producer's own step
    L[k,t] >= C[p,t]              if k is kept                    (resident: C[p,·] = 1)
    sum_k size_k · L[k,t] <= P   for every t;      minimise P       (L continuous in [0,1])

Each C[i,t] is fixed outside operator i's window [asap(i), alap(i)] (ancestors before it, descendants after it),
and every L[k,t] that the windows already decide is a constant: chains cost almost nothing. Sizes are divided by
their greatest common divisor. The order is read back from C (position of i = #t with C[i,t] = 0) and its peak
recomputed by :func:`simulate`, so the reported peak is always that of a real order. With a time limit HiGHS
returns its best order and a lower bound (``bound``); ``optimal`` says whether the gap closed.

**Greedy** (:func:`greedy`): run, among the ready operators, the one after which the fewest bytes are live (ties:
the smaller step memory, then program order) — the list-scheduling heuristic ROAM and MODeL compare with.

Example (``profile.order.roam_toy``: the best of its 2 orders needs 12 MB, program order 17)::

    >>> from shardlab.profile.order import roam_toy
    >>> p = problem_from_graph(roam_toy())
    >>> solve(p).peak, peak(p, p.ops)
    (12, 17)
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from shardlab.profile.stderr_filter import filtered_fd

if TYPE_CHECKING:
    from shardlab.profile.order import Graph

DEFAULT_TIME_LIMIT_S = 60.0
HIGHS_DEBUG = "HighsMipSolverData::"  # a debug line HiGHS (scipy 1.17.1) prints to stdout from C++ on some solves


@dataclass(frozen=True)
class Tensor:
    name: str
    size: int
    producer: int | None  # operator index, or None: resident when the problem starts
    consumers: tuple[int, ...]
    keep: bool  # live to the end (graph output, or read after this part)


@dataclass
class Problem:
    """Operators (names, program order) with predecessor sets and the tensors they produce and read."""

    ops: tuple[str, ...]
    preds: tuple[frozenset[int], ...]
    tensors: tuple[Tensor, ...]
    name: str = "problem"

    @property
    def n(self) -> int:
        return len(self.ops)

    def index(self, order: Sequence[str]) -> list[int]:
        idx = {o: i for i, o in enumerate(self.ops)}
        missing = sorted(set(self.ops) - set(order))
        extra = [o for o in order if o not in idx]
        if missing or extra or len(order) != self.n:
            raise ValueError(f"{self.name}: an order must list every operator once (missing {missing[:5]}, unknown "
                             f"{extra[:5]}, {len(order)} given for {self.n})")
        out, done = [idx[o] for o in order], set()
        for i in out:
            need = self.preds[i] - done
            if need:
                raise ValueError(f"{self.name}: {self.ops[i]!r} runs before its predecessors "
                                 f"{[self.ops[j] for j in sorted(need)][:5]}")
            done.add(i)
        return out


def problem_from_graph(graph: Graph, ops: Sequence[str] | None = None, name: str | None = None,
                       context: Sequence[str] | None = None) -> Problem:
    """A Problem for ``ops`` (default: every operator, in the graph's program order) of a ``profile.order.Graph``.

    Tensors produced by an operator outside ``ops`` but read inside are resident; tensors read after the part
    (by an operator outside it that comes later) or graph outputs are kept; tensors live across the part without
    being read in it become resident + kept (a constant). "Later" is decided by the part's position: ``ops`` must
    be a contiguous stretch of some topological order, so everything outside is either before or after it:
    ``context`` is that order (default: outside operators that are ancestors of the part count as before).
    """
    all_ops = [o.name for o in graph.ops]
    ops = tuple(ops if ops is not None else (graph.order or all_ops))
    inside = {graph.index[o] for o in ops}
    local = {graph.index[o]: k for k, o in enumerate(ops)}
    before: set[int] = set()  # operators outside the part that run before it
    if context is not None:
        first = min(k for k, o in enumerate(context) if graph.index[o] in inside)
        before = {graph.index[o] for o in context[:first]}
    stack = [j for i in inside for j in _bits(graph.pred[i]) if j not in inside]
    while stack:
        j = stack.pop()
        if j not in before:
            before.add(j)
            stack.extend(b for b in _bits(graph.pred[j]) if b not in inside)
    preds = tuple(frozenset(local[j] for j in _bits(graph.pred[graph.index[o]]) if j in inside) for o in ops)
    tensors = []
    for t, prod in graph.producer.items():
        if not graph.counted(t):
            continue
        cons = graph.consumers[t]
        inner = tuple(sorted(local[c] for c in cons if c in inside))
        outer_after = any(c not in inside and c not in before for c in cons)
        out = t in graph.outputs
        if prod in inside:
            tensors.append(Tensor(t, graph.size[t], local[prod], inner, out or outer_after))
        elif prod in before and (inner or outer_after or out):
            tensors.append(Tensor(t, graph.size[t], None, inner, out or outer_after))
    return Problem(ops, preds, tuple(tensors), name or graph.name)


def _bits(mask: int) -> Iterable[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


# ------------------------------------------------------------------------------------------------ simulator
def simulate(problem: Problem, order: Sequence[str]) -> list[int]:
    """Bytes live during each step of ``order`` (the memory model of the module note)."""
    idx = problem.index(order)
    pos = {i: k for k, i in enumerate(idx)}
    n = problem.n
    delta = [0] * (n + 1)  # +size at the first step it is live, -size after its last
    for t in problem.tensors:
        start = 0 if t.producer is None else pos[t.producer]
        if t.keep:
            end = n - 1
        elif t.consumers:
            end = max(pos[c] for c in t.consumers)
        else:
            end = start if t.producer is not None else -1
        if end >= start:
            delta[start] += t.size
            delta[end + 1] -= t.size
    out, live = [], 0
    for k in range(n):
        live += delta[k]
        out.append(live)
    return out


def peak(problem: Problem, order: Sequence[str]) -> int:
    return max(simulate(problem, order), default=0)


# --------------------------------------------------------------------------------------------- reductions
@dataclass
class Reduced:
    """A smaller problem with the same optimal peak, and how to map its orders back."""

    problem: Problem
    members: dict[str, tuple[str, ...]]  # reduced operator -> the original operators it runs, in order
    prefix: tuple[str, ...]  # original operators run first (they allocate nothing and wait for nothing)

    def expand(self, order: Sequence[str]) -> tuple[str, ...]:
        return self.prefix + tuple(o for r in order for o in self.members[r])


def reduce_problem(problem: Problem) -> Reduced:
    """Merge every operator that allocates nothing into its single predecessor, and run first the ones that
    allocate nothing and wait for nothing (in-place updates, 0-byte tokens: Adam's ``lerp_``, ``mul_`` ...).

    Exact: an operator that allocates nothing, run right after its last predecessor, holds no more than that
    predecessor did (its step's live set is what the predecessor left) and frees its inputs as early as possible;
    moving it there never raises any step of an order. Repeated until nothing changes.
    """
    n = problem.n
    alloc = [0] * n
    reads_counted = [False] * n
    for t in problem.tensors:
        if t.producer is not None:
            alloc[t.producer] += t.size
        for c in t.consumers:
            if t.size:
                reads_counted[c] = True
    preds = [set(p) for p in problem.preds]
    succ: list[set[int]] = [set() for _ in range(n)]
    for j, ps in enumerate(preds):
        for i in ps:
            succ[i].add(j)
    owner = list(range(n))  # union-find root: the operator an op was merged into
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    prefix: list[int] = []
    alive = set(range(n))

    def root(i: int) -> int:
        while owner[i] != i:
            owner[i] = owner[owner[i]]
            i = owner[i]
        return owner[i]

    changed = True
    while changed:
        changed = False
        for i in sorted(alive):
            if alloc[i] or i not in alive:
                continue
            if not preds[i] and not reads_counted[i]:
                prefix.extend(members.pop(i))
            elif len(preds[i]) == 1:
                (u,) = preds[i]
                members[u].extend(members.pop(i))
                owner[i] = u
                reads_counted[u] = reads_counted[u] or reads_counted[i]
                for j in succ[i]:
                    preds[j].discard(i)
                    if j != u:
                        preds[j].add(u)
                        succ[u].add(j)
                succ[u].discard(i)
            else:
                continue
            for j in succ[i]:
                preds[j].discard(i)
            alive.discard(i)
            changed = True
    keep = sorted(alive, key=lambda i: i)
    local = {i: k for k, i in enumerate(keep)}
    tensors = []
    for t in problem.tensors:
        p = None if t.producer is None else root(t.producer)
        if p is not None and p not in local:  # a 0-byte tensor of a prefix operator (it allocates nothing)
            continue
        cons = tuple(sorted({local[root(c)] for c in t.consumers if root(c) in local}))
        tensors.append(Tensor(t.name, t.size, None if p is None else local[p], cons, t.keep))
    reduced = Problem(tuple(problem.ops[i] for i in keep),
                      tuple(frozenset(local[root(j)] for j in preds[i] if root(j) in local) - {local[i]}
                            for i in keep), tuple(tensors), problem.name)
    return Reduced(reduced, {problem.ops[i]: tuple(problem.ops[m] for m in members[i]) for i in keep},
                   tuple(problem.ops[i] for i in prefix))


# --------------------------------------------------------------------------------------------------- greedy
def greedy(problem: Problem) -> tuple[str, ...]:
    """Memory-greedy list scheduling (module note)."""
    n = problem.n
    succ: list[list[int]] = [[] for _ in range(n)]
    for j, ps in enumerate(problem.preds):
        for i in ps:
            succ[i].append(j)
    waiting = [len(ps) for ps in problem.preds]
    produced: list[list[Tensor]] = [[] for _ in range(n)]
    reads: list[list[int]] = [[] for _ in range(n)]
    pending = []
    for k, t in enumerate(problem.tensors):
        pending.append(len(t.consumers))
        if t.producer is not None:
            produced[t.producer].append(t)
        for c in t.consumers:
            reads[c].append(k)
    live = sum(t.size for t in problem.tensors if t.producer is None)
    ready = {i for i in range(n) if waiting[i] == 0}
    order = []
    while ready:
        def score(i: int, live: int = live) -> tuple[int, int, int]:
            out = sum(t.size for t in produced[i])
            freed = sum(problem.tensors[k].size for k in reads[i]
                        if pending[k] == 1 and not problem.tensors[k].keep)
            freed += sum(t.size for t in produced[i] if not t.consumers and not t.keep)
            return (live + out - freed, live + out, i)

        i = min(ready, key=score)
        after, _, _ = score(i)
        live = after
        ready.remove(i)
        order.append(i)
        for k in reads[i]:
            pending[k] -= 1
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.add(j)
    if len(order) != n:
        raise ValueError(f"{problem.name}: the precedences have a cycle")
    return tuple(problem.ops[i] for i in order)


# ------------------------------------------------------------------------------------------------------ ILP
@dataclass
class IlpSolution:
    order: tuple[str, ...]
    peak: int  # simulated peak of `order` (bytes)
    optimal: bool  # HiGHS closed the gap (within its tolerances)
    bound: float  # HiGHS's lower bound on the optimum (bytes)
    seconds: float
    status: str
    variables: int = 0
    binaries: int = 0
    constraints: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _windows(problem: Problem) -> tuple[list[int], list[int]]:
    """(asap, alap) positions: number of ancestors, n - 1 - number of descendants."""
    n = problem.n
    anc = [0] * n
    topo = _topological(problem)
    for i in topo:
        m = 0
        for p in problem.preds[i]:
            m |= anc[p] | 1 << p
        anc[i] = m
    desc_count = [0] * n
    for i in range(n):
        for j in _bits(anc[i]):
            desc_count[j] += 1
    return [bin(a).count("1") for a in anc], [n - 1 - d for d in desc_count]


def _topological(problem: Problem) -> list[int]:
    n = problem.n
    waiting = [len(ps) for ps in problem.preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for j, ps in enumerate(problem.preds):
        for i in ps:
            succ[i].append(j)
    stack = [i for i in range(n) if waiting[i] == 0]
    out = []
    while stack:
        i = stack.pop()
        out.append(i)
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                stack.append(j)
    if len(out) != n:
        raise ValueError(f"{problem.name}: the precedences have a cycle")
    return out


def solve(problem: Problem, time_limit_s: float = DEFAULT_TIME_LIMIT_S, mip_rel_gap: float = 0.0,
          reduce: bool = True) -> IlpSolution:
    """The order of smallest peak (module note), after :func:`reduce_problem` (exact) unless ``reduce=False``.

    The greedy order's peak bounds P from above, so HiGHS only searches for better orders; if it finds none in
    ``time_limit_s`` the greedy order is returned (``optimal`` False, ``bound`` HiGHS's lower bound).
    """
    if time_limit_s <= 0:
        raise ValueError(f"time_limit_s={time_limit_s} must be > 0")
    t0 = time.perf_counter()
    red = reduce_problem(problem) if reduce else Reduced(problem, {o: (o,) for o in problem.ops}, ())
    sol = _solve(red.problem, time_limit_s, mip_rel_gap)
    order = red.expand(sol.order)
    best = peak(problem, order)
    if sol.optimal and best != sol.peak:
        raise AssertionError(f"{problem.name}: the reduced problem's optimum {sol.peak} is not the expanded order's "
                             f"peak {best}")
    sol.extra["reduced_ops"] = red.problem.n
    return IlpSolution(order, best, sol.optimal, sol.bound, time.perf_counter() - t0, sol.status, sol.variables,
                    sol.binaries, sol.constraints, sol.extra)


def _solve(problem: Problem, time_limit_s: float, mip_rel_gap: float) -> IlpSolution:
    t0 = time.perf_counter()
    n = problem.n
    if n == 0:
        return IlpSolution((), 0, True, 0.0, 0.0, "empty")
    asap, alap = _windows(problem)
    sizes = [t.size for t in problem.tensors if t.size > 0]
    unit = reduce(math.gcd, sizes) if sizes else 1
    cvar: dict[tuple[int, int], int] = {}
    nvar = 0
    for i in range(n):
        for t in range(asap[i], alap[i]):
            cvar[i, t] = nvar
            nvar += 1
    n_bin = nvar

    def C(i: int, t: int) -> int | tuple[int]:
        """A variable index, or a constant wrapped in a 1-tuple."""
        if t < 0 or t < asap[i]:
            return (0,)
        if t >= alap[i]:
            return (1,)
        return cvar[i, t]

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(terms: list[tuple[int | tuple[int], float]], lb: float, ub: float) -> None:
        const = 0.0
        r = len(lo)
        seen: dict[int, float] = {}
        for v, coef in terms:
            if isinstance(v, tuple):
                const += coef * v[0]
            else:
                seen[v] = seen.get(v, 0.0) + coef
        seen = {v: c for v, c in seen.items() if c != 0.0}
        if not seen:
            if not (lb - 1e-9 <= const <= ub + 1e-9):
                raise AssertionError(f"{problem.name}: infeasible constant row ({lb} <= {const} <= {ub})")
            return
        for v, c in seen.items():
            rows.append(r)
            cols.append(v)
            vals.append(c)
        lo.append(lb - const)
        hi.append(ub - const)

    for (i, t), v in cvar.items():  # monotone
        if (i, t + 1) in cvar:
            add([(v, 1.0), (cvar[i, t + 1], -1.0)], -np.inf, 0.0)
    for t in range(n):  # one operator per position
        add([(C(i, t), 1.0) for i in range(n) if asap[i] <= t], t + 1, t + 1)
    for j in range(n):  # precedence
        for i in problem.preds[j]:
            for t in range(asap[j], alap[i] + 1):
                add([(C(j, t), 1.0), (C(i, t - 1), -1.0)], -np.inf, 0.0)
    # live variables and memory rows
    mem_terms: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    mem_const = [0.0] * n
    for tensor in problem.tensors:
        if tensor.size == 0:
            continue
        s = tensor.size / unit
        p = tensor.producer
        first = 0 if p is None else asap[p]
        if tensor.keep:
            last = n - 1
        elif tensor.consumers:
            last = max(alap[c] for c in tensor.consumers)
        else:
            last = first if p is None else alap[p]
        if p is None and not tensor.consumers and not tensor.keep:
            continue
        for t in range(first, last + 1):
            exprs: list[list[tuple[int | tuple[int], float]]] = []
            created: int | tuple[int] = (1,) if p is None else C(p, t)
            for c in tensor.consumers:
                exprs.append([(created, 1.0), (C(c, t - 1), -1.0)])
            if p is not None:
                exprs.append([(C(p, t), 1.0), (C(p, t - 1), -1.0)])
            if tensor.keep:
                exprs.append([(created, 1.0)])
            lower = []  # expressions whose value is not decided by the windows
            fixed = 0.0
            for e in exprs:
                if all(isinstance(v, tuple) for v, _ in e):
                    fixed = max(fixed, sum(c * v[0] for v, c in e))  # type: ignore[index]
                else:
                    lower.append(e)
            if fixed >= 1.0:
                mem_const[t] += s
                continue
            if not lower:
                continue
            lv = nvar
            nvar += 1
            for e in lower:
                add([(lv, 1.0), *[(v, -c) for v, c in e]], 0.0, np.inf)
            mem_terms[t].append((lv, s))
    pvar = nvar
    nvar += 1
    for t in range(n):
        add([*mem_terms[t], (pvar, -1.0)], -np.inf, -mem_const[t])
    A = coo_array((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
    c = np.zeros(nvar)
    c[pvar] = 1.0
    integrality = np.zeros(nvar)
    integrality[:n_bin] = 1
    lb = np.zeros(nvar)
    ub = np.ones(nvar)
    fallback = greedy(problem)
    ub[pvar] = peak(problem, fallback) / unit  # only orders at least as good as greedy's
    with filtered_fd(1, lambda line: line.startswith(HIGHS_DEBUG)):
        res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
                   options={"time_limit": float(time_limit_s), "mip_rel_gap": mip_rel_gap, "presolve": True})
    seconds = time.perf_counter() - t0
    bound = float(getattr(res, "mip_dual_bound", np.nan) or 0.0) * unit
    if res.x is None:
        optimal = res.status == 2  # infeasible below greedy's peak: greedy's order is optimal
        return IlpSolution(fallback, peak(problem, fallback), optimal, bound, seconds,
                        f"greedy's order ({res.message})", nvar, n_bin, len(lo), {"fallback": "greedy"})
    x = res.x
    pos = []
    for i in range(n):
        before = asap[i] + sum(1 for t in range(asap[i], alap[i]) if x[cvar[i, t]] < 0.5)
        pos.append((before, i))
    order = tuple(problem.ops[i] for _, i in sorted(pos))
    best = peak(problem, order)
    optimal = res.status == 0
    if optimal:
        bound = max(bound, float(res.fun) * unit)
    return IlpSolution(order, best, optimal, bound, seconds, str(res.message), nvar, n_bin, len(lo))
