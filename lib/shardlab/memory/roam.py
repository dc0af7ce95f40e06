"""ROAM at a real graph's size: split the step at memory-insensitive operators, order each part exactly.

Design note
-----------
ROAM (Shu et al. 2023, arXiv 2310.19295; TorchAcc) orders the operators of a training step for the smallest peak:
it decides when each weight update runs (``shardlab.memory.update_schedule``), cuts the graph into subgraphs at
operators whose position cannot change the peak, and solves each subgraph's order exactly; the whole graph at once
is an integer program that does not finish at this size. Our reading of "memory-insensitive", in two kinds of cut:

- **forced** (exact): a cut after position k of the base order is forced when every operator after it has every
  operator before it among its ancestors — no topological order can move anything across it. Operators that wait
  for nothing (constants, ``stack`` of weights) are left out of the test and pinned to the part of their first
  reader (running such an operator later, right before its first reader, never raises a step). The parts of forced
  cuts are independent: the best order of the whole is the best order of each part, concatenated.
- **small live set** (heuristic, ROAM's cost-bounded split): a forced part longer than ``max_ops`` is cut again,
  every ``min_ops`` to ``max_ops`` operators, where the fewest bytes are live across the cut in the base order.
  Operators cannot cross these cuts, so the result is an upper bound of the unsplit optimum and at most the base
  order's peak; :func:`compare` cuts along two base orders (the update schedule's and greedy's) and keeps the
  better. The unsplit integer program (where it finishes) measures the gap.

Each part becomes a ``memory.ilp.Problem`` with the tensors that cross its borders (resident when it starts, kept
when read later) and is solved by ``ilp.solve``; the concatenated order is simulated on the whole graph, and its
peak must equal the largest part's (checked). :func:`compare` puts beside it the program order (PyTorch's: forward,
backward, every update at the end), the base order (the update schedule applied), the greedy heuristic, and the
unsplit integer program under a time limit (its lower bound says how far from optimal an unfinished run is).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardlab.memory import ilp
from shardlab.memory import update_schedule as us
from shardlab.profile import order as order_mod

if TYPE_CHECKING:
    from shardlab.memory.graph import StepGraph

DEFAULT_MAX_OPS = 20
DEFAULT_MIN_OPS = 8


@dataclass
class Part:
    ops: tuple[str, ...]
    cut: str  # how the part ends: "forced" (exact), "live-set" (heuristic) or "end"
    crossing_bytes: int  # live across the cut after it, in the base order


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def split(graph: order_mod.Graph, base: Sequence[str], max_ops: int = DEFAULT_MAX_OPS,
          min_ops: int = DEFAULT_MIN_OPS) -> list[Part]:
    """Parts of ``base`` (a topological order of ``graph``) at forced and small-live-set cuts (module note)."""
    if isinstance(max_ops, bool) or not isinstance(max_ops, int) or max_ops < 1:
        raise ValueError(f"max_ops={max_ops!r} must be a positive int")
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"min_ops={min_ops} must be in [1, max_ops={max_ops}]")
    idx = [graph.index[o] for o in base]
    graph.check_order(base)
    n = len(idx)
    pos = {i: k for k, i in enumerate(idx)}
    sources = {i for i in idx if graph.pred[i] == 0}
    anc = {}
    for i in idx:  # base is topological: predecessors first
        m = 0
        for j in _bits(graph.pred[i]):
            m |= anc[j] | 1 << j
        anc[i] = m
    src_mask = sum(1 << s for s in sources)
    common = [0] * (n + 1)  # AND of ancestor sets of the non-source operators after position k
    acc = -1
    for k in range(n - 1, -1, -1):
        common[k + 1] = acc
        if idx[k] not in sources:
            acc &= anc[idx[k]]
    forced = []
    prefix = 0
    for k in range(n - 1):
        if idx[k] not in sources:
            prefix |= 1 << idx[k]
        need = prefix & ~src_mask
        if common[k + 1] != -1 and common[k + 1] & need == need:
            forced.append(k)
    # live bytes across each position of the base order (tensors produced at <= k, read after k or kept)
    delta = [0] * (n + 1)
    for t, prod in graph.producer.items():
        if not graph.counted(t) or not graph.size[t]:
            continue
        start = pos[prod]
        cons = [pos[c] for c in graph.consumers[t]]
        end = n - 1 if t in graph.outputs else max(cons, default=start)
        delta[start] += graph.size[t]
        delta[end] -= graph.size[t]  # live across cut k for start <= k < end
    crossing, live = [], 0
    for k in range(n):
        live += delta[k]
        crossing.append(live)
    cuts: list[tuple[int, str]] = []
    start = 0
    for f in [*forced, n - 1]:
        while f - start + 1 > max_ops:  # cut this forced part again where the fewest bytes cross
            window = range(start + min_ops - 1, min(start + max_ops, f))
            k = min(window, key=lambda j: (crossing[j], -j))
            cuts.append((k, "live-set"))
            start = k + 1
        cuts.append((f, "forced" if f < n - 1 else "end"))
        start = f + 1
    part_of = {}
    lo = 0
    for p, (k, _) in enumerate(cuts):
        for j in range(lo, k + 1):
            part_of[idx[j]] = p
        lo = k + 1
    for s in sources:  # pinned to the part of their first reader
        readers = [part_of[c] for t, _ in graph.ops[s].outputs for c in graph.consumers.get(t, ())]
        if readers:
            part_of[s] = min(readers)
    parts = [[] for _ in cuts]
    for i in idx:
        parts[part_of[i]].append(graph.ops[i].name)
    return [Part(tuple(ops), how, crossing[k]) for ops, (k, how) in zip(parts, cuts, strict=True) if ops]


@dataclass
class SplitSolution:
    order: tuple[str, ...]
    peak: int  # simulated on the whole graph
    parts: int
    forced_cuts: int
    live_set_cuts: int
    largest_part: int  # operators in the largest part
    seconds: float  # total solve time of the parts
    all_optimal: bool  # every part proved optimal
    part_seconds: list[float] = field(default_factory=list)


def solve_split(graph: order_mod.Graph, base: Sequence[str], max_ops: int = DEFAULT_MAX_OPS,
                min_ops: int = DEFAULT_MIN_OPS, time_limit_s: float = 30.0) -> SplitSolution:
    """Split ``base`` and solve every part with ``ilp.solve`` (each within ``time_limit_s``)."""
    t0 = time.perf_counter()
    parts = split(graph, base, max_ops, min_ops)
    full = tuple(o for p in parts for o in p.ops)
    order: list[str] = []
    part_peaks, secs, optimal = [], [], True
    for p in parts:
        prob = ilp.problem_from_graph(graph, p.ops, context=full)
        sol = ilp.solve(prob, time_limit_s)
        order.extend(sol.order)
        part_peaks.append(sol.peak)
        secs.append(sol.seconds)
        optimal = optimal and sol.optimal
    whole = ilp.problem_from_graph(graph)
    pk = ilp.peak(whole, order)
    if pk != max(part_peaks, default=0):
        raise AssertionError(f"{graph.name}: whole-graph peak {pk} != largest part peak {max(part_peaks)}")
    return SplitSolution(tuple(order), pk, len(parts), sum(p.cut == "forced" for p in parts),
                         sum(p.cut == "live-set" for p in parts), max(len(p.ops) for p in parts),
                         time.perf_counter() - t0, optimal, secs)


@dataclass
class RoamResult:
    """Peaks (bytes of temporaries; parameters, moments, batch resident) of one step by each order."""

    graph: str
    nodes: int  # operators of the DAG (views folded)
    fx_nodes: int
    peaks: dict[str, int]  # program, base, greedy, ilp (split), ilp_unsplit
    orders: dict[str, tuple[str, ...]]
    solve_s: dict[str, float]  # split, unsplit, schedule
    split: SplitSolution
    unsplit: ilp.IlpSolution | None
    schedule: dict[str, str]
    unsplit_limit_s: float
    notes: list[str] = field(default_factory=list)

    def saved(self, key: str = "ilp", against: str = "program") -> float:
        """Fraction of ``against``'s peak that ``key`` saves."""
        return 1.0 - self.peaks[key] / self.peaks[against] if self.peaks.get(against) else 0.0


PAPER_SAVING = {"PyTorch": 0.357, "heuristic": 0.133, "MODeL (ILP)": 0.272}  # ROAM's abstract, arXiv 2310.19295v1


def compare(step: StepGraph, max_ops: int = DEFAULT_MAX_OPS, min_ops: int = DEFAULT_MIN_OPS, part_limit_s: float = 30.0,
            unsplit_limit_s: float | None = 60.0, schedule: str = "best") -> RoamResult:
    """Program order, greedy, ROAM (schedule + split ILP) and the unsplit ILP for one traced step.

    ``schedule``: "best" (the update-schedule ILP), "end" or "eager" for every unit. ``unsplit_limit_s=None``
    skips the unsplit integer program.
    """
    if schedule not in ("best", "end", "eager"):
        raise ValueError(f"schedule={schedule!r} must be 'best', 'end' or 'eager'")
    g = step.graph
    whole = ilp.problem_from_graph(g)
    program = g.order or tuple(o.name for o in g.ops)
    peaks = {"program": order_mod.peak(g, program).peak}
    orders = {"program": tuple(program)}
    solve_s: dict[str, float] = {}
    notes = []
    if any(ph.startswith("update:") for ph in step.phase.values()):
        up = us.plan(step)
        if schedule == "best":
            res = us.best_schedule(step, up)
            sched, solve_s["schedule"] = res.schedule, res.seconds
        else:
            sched = us.uniform(up, schedule)
        base = us.order_for(up, sched)
    else:
        sched, base = {}, tuple(program)
    peaks["base"] = order_mod.peak(g, base).peak
    orders["base"] = tuple(base)
    t0 = time.perf_counter()
    gr = ilp.greedy(whole)
    solve_s["greedy"] = time.perf_counter() - t0
    peaks["greedy"], orders["greedy"] = ilp.peak(whole, gr), gr
    # the split is cut along a base order; live-set cuts keep operators on their side, so the result is at most
    # the base order's peak: cut along the schedule's order and along greedy's, keep the better
    sp = solve_split(g, base, max_ops, min_ops, part_limit_s)
    sp_greedy = solve_split(g, gr, max_ops, min_ops, part_limit_s)
    split_s = sp.seconds + sp_greedy.seconds
    if sp_greedy.peak < sp.peak:
        notes.append(f"the split along greedy's order ({sp_greedy.peak} B) beat the split along the update "
                     f"schedule's order ({sp.peak} B)")
        sp = sp_greedy
    peaks["ilp"], orders["ilp"], solve_s["split"] = sp.peak, sp.order, split_s
    if not sp.all_optimal:
        notes.append(f"some parts hit the {part_limit_s} s limit: their greedy/incumbent order was used")
    un = None
    if unsplit_limit_s is not None:
        un = ilp.solve(whole, unsplit_limit_s)
        peaks["ilp_unsplit"], orders["ilp_unsplit"], solve_s["unsplit"] = un.peak, un.order, un.seconds
        if not un.optimal:
            notes.append(f"the unsplit integer program did not finish in {unsplit_limit_s} s: best order found "
                         f"{un.peak} B, lower bound {un.bound:.0f} B")
    for k, o in orders.items():
        if order_mod.peak(g, o).peak != peaks[k]:
            raise AssertionError(f"{k}: the levers.order simulator disagrees with memory.ilp's")
    return RoamResult(g.name, len(g.ops), step.fx_nodes, peaks, orders, solve_s, sp, un, sched,
                      unsplit_limit_s or 0.0, notes)


def quick(step: StepGraph) -> dict[str, int]:
    """The peaks a slider can afford (no integer program over operators): program order, greedy, every update eager,
    every update at the end, the best update schedule (its integer program has one binary per update unit)."""
    whole = ilp.problem_from_graph(step.graph)
    sched = us.compare(step)
    return {"nodes": len(step.graph.ops), "program": order_mod.peak(step.graph).peak,
            "greedy": ilp.peak(whole, ilp.greedy(whole)), "eager": sched["eager"], "end": sched["end"],
            "best": sched["best"]}
