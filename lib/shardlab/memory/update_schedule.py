"""The memory-aware weight-update schedule: per parameter, Adam as soon as its gradient exists, or at the end.

Design note
-----------
A traced step (``shardlab.memory.graph.trace_step``) lists the forward and backward operators in PyTorch's order,
then every parameter's Adam update U_p (``lerp_``, ``mul_``, ``addcmul_``, ``sqrt``, ``div``, ``add_``,
``addcdiv_``). The *base* order is the forward and backward alone. A schedule y (y_p = 1: eager) places U_p

- eager: right after q_p, the last base operator U_p depends on (its gradient, and every read of p, m, v that must
  come before the in-place write) — "as soon as its gradient exists";
- end: after the backward, in the program's parameter order (``optimizer.step()`` after ``loss.backward()``).

Only the time the gradient dies moves with y_p: g_p (and whatever else only U_p reads; ``f_p`` bytes) is freed
after U_p. So, with the all-end order simulated once (``profile.order.peak``), the peak of *any* schedule is a
maximum of affine functions of y — an integer program in P binaries, exact for the base order:

    min P
    base step t:     during0[t] - sum_{p: q_p < t} f_p y_p                      <= P
    eager U_p:       after0[q_p] - sum_{p' placed before p at q} f_p' y_p' + D_p <= P + M_p (1 - y_p)
    end U_p:         E0_p + D_p - sum_{p' after p in the end order} f_p' y_p'    <= P + M_p y_p

``during0`` / ``after0``: live bytes during / after each base step with every update at the end; ``E0_p``: live
bytes before U_p at the end; ``D_p``: U_p's own high-water mark above its start (its temporaries: ``sqrt``, ``div``);
``M_p`` a bound that switches the row off. :func:`best_schedule` solves it with scipy ``milp``; the order it
implies is simulated again and must have exactly the integer program's peak (checked; tested against brute force
over all 2^P schedules on small steps).

Memory model: the one of ``shardlab.memory.graph`` (parameters, moments and batch resident, not counted; in-place
updates allocate nothing).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from shardlab.profile import order as order_mod

if TYPE_CHECKING:
    from shardlab.memory.graph import StepGraph


@dataclass
class UpdatePlan:
    """What the schedule integer program needs, read off one traced step."""

    base: tuple[str, ...]  # forward + backward operators, program order
    updates: dict[str, tuple[str, ...]]  # unit (a parameter, or "a+b+c") -> its update's operators (program order)
    q: dict[str, int]  # unit -> index in `base` after which its eager update may run
    freed: dict[str, int]  # f_p: bytes that die with U_p (its gradient)
    params: tuple[str, ...]  # the units, in the end order


def plan(step: StepGraph) -> UpdatePlan:
    """Split a :class:`shardlab.memory.graph.StepGraph` into base and updates; find q_p and f_p.

    Parameters whose updates read one gradient buffer (GPT-2's fused Q/K/V weight: three views of one stacked
    gradient) are one scheduling unit, named ``"a+b+c"``: the buffer dies after the last of their updates.
    """
    g = step.graph
    prog = g.order or tuple(o.name for o in g.ops)
    per_param = {p: tuple(ops) for p, ops in step.update_ops().items() if ops}
    if not per_param:
        raise ValueError(f"{g.name}: the step has no update operators (optimizer='none'?)")
    in_update = {o: p for p, ops in per_param.items() for o in ops}
    # parameters sharing a gradient buffer: one unit (union-find over the tensors their updates read)
    parent = {p: p for p in per_param}

    def find(p: str) -> str:
        while parent[p] != p:
            p = parent[p]
        return p

    readers: dict[str, str] = {}
    for p, ops in per_param.items():
        for o in ops:
            for t in g.ops[g.index[o]].inputs:
                if t in g.producer and g.size[t] and g.ops[g.producer[t]].name not in in_update:
                    if t in readers:
                        parent[find(p)] = find(readers[t])
                    else:
                        readers[t] = p
    units: dict[str, list[str]] = {}
    for p in step.params:
        if p in per_param:
            units.setdefault(find(p), []).append(p)
    updates = {"+".join(ps): tuple(o for p in ps for o in per_param[p]) for ps in units.values()}
    base = tuple(o for o in prog if o not in in_update)
    pos = {o: k for k, o in enumerate(base)}
    q, freed = {}, {}
    for u, ops in updates.items():
        members = {g.index[o] for o in ops}
        deps = [j for o in ops for j in _bits(g.pred[g.index[o]]) if j not in members]
        foreign = [g.ops[j].name for j in deps if g.ops[j].name in in_update]
        if foreign:
            raise ValueError(f"{g.name}: the update of {u} depends on another update ({foreign[:3]})")
        q[u] = max((pos[g.ops[j].name] for j in deps), default=-1)
        f, seen = 0, set()
        for o in ops:
            for t in g.ops[g.index[o]].inputs:
                if (t in seen or t not in g.producer or not g.size[t] or g.producer[t] in members
                        or not g.counted(t) or t in g.outputs):
                    continue
                seen.add(t)
                cons = g.consumers[t]
                if cons <= members:
                    f += g.size[t]
                elif cons & members and any(g.ops[c].name in in_update for c in cons - members):
                    raise ValueError(f"{g.name}: {t} is read by the updates of {u} and others: not one unit")
        freed[u] = f
    return UpdatePlan(base, updates, q, freed, tuple(updates))


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def order_for(up: UpdatePlan, schedule: Mapping[str, str]) -> tuple[str, ...]:
    """The full order of a schedule (parameter -> "eager" | "end"; missing parameters: "end")."""
    eager_at: dict[int, list[str]] = {}
    for p in up.params:
        if schedule.get(p, "end") == "eager":
            eager_at.setdefault(up.q[p], []).append(p)
    out: list[str] = [o for p in eager_at.get(-1, []) for o in up.updates[p]]
    for k, op in enumerate(up.base):
        out.append(op)
        for p in eager_at.get(k, []):
            out.extend(up.updates[p])
    for p in up.params:
        if schedule.get(p, "end") != "eager":
            out.extend(up.updates[p])
    return tuple(out)


def uniform(up: UpdatePlan, choice: str) -> dict[str, str]:
    return {p: choice for p in up.params}


@dataclass
class ScheduleResult:
    schedule: dict[str, str]  # parameter -> "eager" | "end"
    peak: int  # simulated peak of the implied order (bytes)
    ilp_peak: float  # the integer program's objective (equals `peak`)
    seconds: float
    order: tuple[str, ...]


def peak_of(step: StepGraph, up: UpdatePlan, schedule: Mapping[str, str]) -> int:
    return order_mod.peak(step.graph, order_for(up, schedule)).peak


def best_schedule(step: StepGraph, up: UpdatePlan | None = None, time_limit_s: float = 60.0) -> ScheduleResult:
    """The schedule of smallest peak for the base order (module note), from scipy ``milp``."""
    t0 = time.perf_counter()
    up = up or plan(step)
    g = step.graph
    params = up.params
    P = len(params)
    idx = {p: i for i, p in enumerate(params)}
    end_order = order_for(up, uniform(up, "end"))
    prof = order_mod.peak(g, end_order).steps
    nb = len(up.base)
    during0 = [s.during for s in prof[:nb]]
    after0 = [s.after for s in prof[:nb]]
    starts, D = {}, {}
    k = nb
    for p in params:  # the end phase: U_p's steps in the all-end order
        n_ops = len(up.updates[p])
        steps = prof[k:k + n_ops]
        starts[p] = steps[0].before
        D[p] = max(s.during for s in steps) - steps[0].before
        k += n_ops
    scale = max(max(during0, default=1), 1) / 1e6  # keep coefficients near 1e6 for HiGHS
    rows, lo, hi = [], [], []
    nv = P + 1  # y_0 .. y_{P-1}, then peak

    def row(coefs: dict[int, float], const: float, ub_extra: float = 0.0) -> None:
        r = np.zeros(nv)
        for i, c in coefs.items():
            r[i] += c
        r[P] = -1.0
        rows.append(r / scale)
        lo.append(-np.inf)
        hi.append((ub_extra - const) / scale)

    for t in range(nb):  # base steps: gradients of parameters eagerly updated before t are gone
        row({idx[p]: -float(up.freed[p]) for p in params if up.q[p] < t}, during0[t])
    for p in params:
        i = idx[p]
        m = after0[up.q[p]] + D[p] if up.q[p] >= 0 else D[p] + during0[0]
        same = [p2 for p2 in params if up.q[p2] < up.q[p] or (up.q[p2] == up.q[p] and idx[p2] < i)]
        start = after0[up.q[p]] if up.q[p] >= 0 else 0
        coefs = {idx[p2]: -float(up.freed[p2]) for p2 in same}
        coefs[i] = coefs.get(i, 0.0) + m  # + M (y_p - 1) on the left: row off when y_p = 0
        row(coefs, start + D[p] - m)
        later = params[i + 1:]
        m2 = starts[p] + D[p]
        coefs = {idx[p2]: -float(up.freed[p2]) for p2 in later}
        coefs[i] = coefs.get(i, 0.0) - m2  # - M y_p: row off when y_p = 1
        row(coefs, starts[p] + D[p])
    c = np.zeros(nv)
    c[P] = 1.0
    integrality = np.r_[np.ones(P), 0]
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(nv), np.r_[np.ones(P), np.inf]),
               options={"time_limit": time_limit_s, "mip_rel_gap": 0.0})
    if res.x is None:
        raise RuntimeError(f"{g.name}: the schedule integer program found no solution ({res.message})")
    sched = {p: "eager" if res.x[idx[p]] > 0.5 else "end" for p in params}
    order = order_for(up, sched)
    pk = order_mod.peak(g, order).peak
    return ScheduleResult(sched, pk, float(res.fun), time.perf_counter() - t0, order)


def brute_force(step: StepGraph, up: UpdatePlan | None = None, max_params: int = 12) -> ScheduleResult:
    """Every one of the 2^P schedules simulated (the oracle for small steps)."""
    t0 = time.perf_counter()
    up = up or plan(step)
    if len(up.params) > max_params:
        raise ValueError(f"{len(up.params)} parameters: 2^{len(up.params)} schedules exceed max_params={max_params}")
    best: tuple[int, dict[str, str]] | None = None
    for bits in itertools.product(("end", "eager"), repeat=len(up.params)):
        sched = dict(zip(up.params, bits, strict=True))
        pk = peak_of(step, up, sched)
        if best is None or pk < best[0]:
            best = (pk, sched)
    assert best is not None
    return ScheduleResult(best[1], best[0], float(best[0]), time.perf_counter() - t0, order_for(up, best[1]))


def compare(step: StepGraph, time_limit_s: float = 60.0) -> dict[str, Any]:
    """Peaks of all-eager, all-end and the best per-parameter schedule (bytes), and the best schedule."""
    up = plan(step)
    best = best_schedule(step, up, time_limit_s)
    return {"eager": peak_of(step, up, uniform(up, "eager")), "end": peak_of(step, up, uniform(up, "end")),
            "best": best.peak, "schedule": best.schedule, "solve_s": best.seconds,
            "eager_params": sorted(p for p, v in best.schedule.items() if v == "eager")}
