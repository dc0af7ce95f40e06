"""A timeline simulator: when each action of a schedule runs, given costs, and the bubble it leaves.

Design note
-----------
Each device runs its action list in order; an action starts as soon as its device is free and its inputs exist:

    F(s, i)   needs F(s - 1, i)  (the activation from the previous stage; none for s = 0)
    B(s, i)   needs F(s, i) (its own saved activations) and B(s + 1, i) (the output gradient; none for the last
              stage, whose backward starts from the loss)

    I(s, i)   like B (a zero-bubble schedule's input gradient); W(s, i) needs I(s, i)

plus `p2p` time units when the dependency sits on another device.  `replay` times what devices *did* instead:
their executed action lists, each action waiting for the actions whose messages it received (read from the
ledger), so the ledger's bubble is measured without this dependency rule.  A split backward costs `weight_share` of
the backward in W and the rest in I.  Starting times follow from the order alone
(an as-soon-as-possible list schedule), so the simulator never reorders; if no device can start its next action
the order deadlocks and `simulate` raises, naming the blocked actions.

Costs: `forward` and `backward` are one microbatch through one *device's* share of the model (a stage at v = 1);
a virtual stage costs 1/v of that, so schedules with different v are timed in the same units.  Integer (or
`Fraction`) costs are timed exactly in `Fraction`s, so a measured bubble can be compared with a formula exactly.
`stage_costs` overrides them per (virtual) stage: [(forward, backward), ...] — an uneven split.

Measured bubble, per device: idle = makespan - busy;  `idle_fraction` = idle / makespan (GPipe's
(p - 1)/(m + p - 1)), `bubble_ratio` = idle / busy (Narayanan et al.'s (p - 1)/(v m)).

    >>> from shardlab.pipeline.schedules import gpipe
    >>> t = simulate(gpipe(4, 8), forward=1.0, backward=2.0)
    >>> t.makespan, t.bubble_ratio, t.idle_fraction
    (33.0, 0.375, 0.2727272727272727)
    >>> simulate(gpipe(4, 8), 1, 2).idle_fraction             # exact: 3/11
    Fraction(3, 11)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from shardlab.formulas import pipeline as fpp
from shardlab.pipeline.schedules import Action, Schedule, build, peak_inflight

__all__ = ["Event", "Timeline", "compare", "replay", "simulate"]


@dataclass(frozen=True)
class Event:
    device: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    schedule: Schedule
    events: tuple[Event, ...]  # in the order they were placed

    @property
    def makespan(self) -> float:
        return max(e.end for e in self.events)

    def busy(self, device: int) -> float:
        return sum(e.end - e.start for e in self.events if e.device == device)

    def idle(self, device: int) -> float:
        return self.makespan - self.busy(device)

    @property
    def idle_fractions(self) -> list[float]:
        return [self.idle(r) / self.makespan for r in range(self.schedule.p)]

    @property
    def bubble_ratios(self) -> list[float]:
        return [self.idle(r) / self.busy(r) for r in range(self.schedule.p)]

    @property
    def idle_fraction(self) -> float:
        """The largest per-device idle share of the step (all devices equal when stages cost the same)."""
        return max(self.idle_fractions)

    @property
    def bubble_ratio(self) -> float:
        return max(self.bubble_ratios)


def _per_chunk(cost: float, v: int) -> float:
    return Fraction(cost) / v if isinstance(cost, int | Fraction) else cost / v


def simulate(
    schedule: Schedule,
    forward: float = 1.0,
    backward: float = 2.0,
    *,
    stage_costs: Sequence[tuple[float, float]] | None = None,
    p2p: float = 0,
    weight_share: float = Fraction(1, 2),
) -> Timeline:
    """Place every action of `schedule` on a time axis (see the module note)."""
    n = schedule.stages
    if stage_costs is None:
        stage_costs = [(_per_chunk(forward, schedule.v), _per_chunk(backward, schedule.v))] * n
    if len(stage_costs) != n:
        raise ValueError(f"stage_costs has {len(stage_costs)} entries, the schedule has {n} stages")
    if any(c < 0 for fb in stage_costs for c in fb) or p2p < 0:
        raise ValueError("costs and p2p must be >= 0")

    end: dict[tuple[str, int, int], float] = {}
    free: list[float] = [0] * schedule.p
    nxt = [0] * schedule.p
    events: list[Event] = []

    def deps(a: Action) -> list[tuple[str, int, int]]:  # "G": the input gradient exists (after B or I)
        if a.kind == "F":
            return [("F", a.stage - 1, a.microbatch)] if a.stage > 0 else []
        if a.kind == "W":
            return [("G", a.stage, a.microbatch)]
        out = [("F", a.stage, a.microbatch)]
        if a.stage < n - 1:
            out.append(("G", a.stage + 1, a.microbatch))
        return out

    def cost(a: Action) -> float:
        f, b = stage_costs[a.stage]
        return {"F": f, "B": b, "I": b * (1 - weight_share), "W": b * weight_share}[a.kind]

    remaining = sum(len(d) for d in schedule.devices)
    while remaining:
        progressed = False
        for r, acts in enumerate(schedule.devices):
            while nxt[r] < len(acts):
                a = acts[nxt[r]]
                need = deps(a)
                if any(d not in end for d in need):
                    break
                ready = max(
                    [free[r]]
                    + [end[d] + p2p if p2p and schedule.device_of(d[1]) != r else end[d] for d in need]
                )
                finish = ready + cost(a)
                end[("G" if a.kind in "BI" else a.kind, a.stage, a.microbatch)] = finish
                free[r] = finish
                events.append(Event(r, a, ready, finish))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [str(acts[nxt[r]]) for r, acts in enumerate(schedule.devices) if nxt[r] < len(acts)]
            raise ValueError(f"{schedule.name}: the order deadlocks; every device waits (next: {blocked})")
    return Timeline(schedule, tuple(events))


def replay(schedule: Schedule, orders: Sequence[Sequence[Action]],
           messages: Sequence[Sequence[Sequence[tuple[str, int]]]], forward: float = 1,
           backward: float = 2) -> Timeline:
    """Time what the devices *did*, from their messages instead of the schedule's dependency rule: device r ran
    ``orders[r]`` in order, and action j issued ``messages[r][j]`` = [(op, peer), ...] ("send" / "recv" rows of
    its ledger).  The k-th receive on device d from device r takes the k-th send from r to d (FIFO per pair, as
    the simulated world and gloo deliver them); an action starts when its device is free and the actions whose
    sends it receives have finished.  Costs as in `simulate` (equal stages, a chunk 1/v).  Raises ValueError when
    a receive has no matching send or every device waits."""
    p, v = schedule.p, schedule.v
    f, b = _per_chunk(forward, v), _per_chunk(backward, v)
    sent: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (src, dst) -> [(src, action index) per send]
    for r, acts in enumerate(messages):
        for j, rows in enumerate(acts):
            for op, peer in rows:
                if op == "send":
                    sent.setdefault((r, peer), []).append((r, j))
    needs: list[list[list[tuple[int, int]]]] = []  # per device, per action: the sending actions it waits for
    for r, acts in enumerate(messages):
        taken: dict[int, int] = {}
        mine = []
        for rows in acts:
            deps = []
            for op, peer in rows:
                if op == "recv":
                    k = taken.get(peer, 0)
                    taken[peer] = k + 1
                    queue = sent.get((peer, r), [])
                    if k >= len(queue):
                        raise ValueError(f"device {r} received message {k} from device {peer}, which sent "
                                         f"{len(queue)}")
                    deps.append(queue[k])
            mine.append(deps)
        needs.append(mine)
    end: dict[tuple[int, int], float] = {}
    free: list[float] = [0] * p
    nxt = [0] * p
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, acts in enumerate(orders):
            while nxt[r] < len(acts):
                j = nxt[r]
                if any(d not in end for d in needs[r][j]):
                    break
                start = max([free[r], *(end[d] for d in needs[r][j])])
                a = acts[j]
                end[(r, j)] = free[r] = start + (f if a.kind == "F" else b)
                events.append(Event(r, a, start, end[(r, j)]))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"{schedule.name}: the recorded messages deadlock: every device waits")
    ran = Schedule(schedule.name, p, schedule.m, v, tuple(tuple(o) for o in orders), schedule.placement)
    return Timeline(ran, tuple(events))


def compare(p: int, m: int, v: int, message_bytes: int = 0) -> list[dict[str, object]]:
    """Per schedule (gpipe, 1f1b, interleaved at v): the bubble by formula and measured from the order (both
    conventions), the activations device 0 holds at most (formula and counted; in stage-microbatches: one chunk
    is 1/v of a stage), point-to-point messages and bytes per step (`message_bytes` each), and ``order``: whose
    order was timed ("ours", written from the papers' rules, or "PyTorch").  Our interleaved order follows
    Megatron-LM's rule m % p == 0; where only that rule fails, PyTorch 2.9's ScheduleInterleaved1F1B may still run
    (it needs m % max(1, m // p) == 0): its own order is timed instead, with no formula for its memory.  A
    schedule that neither can run at (p, m, v) gets ``{"schedule", "error"}`` — the explorer reports it, nothing
    raises.

    >>> [(r["schedule"], r["bubble_fraction"]) for r in compare(4, 8, 2)][:2]
    [('gpipe', Fraction(3, 11)), ('1f1b', Fraction(3, 11))]
    """
    rows: list[dict[str, object]] = []
    for name in fpp.SCHEDULES:
        vv = v if name == "interleaved" else 1
        order, formula_inflight = "ours", None
        try:
            sched = build(name, p, m, vv)
            formula_inflight = Fraction(fpp.peak_inflight(name, p, m, vv, device=0), vv)
        except ValueError as exc:
            if name != "interleaved" or p < 1 or m < 1 or v < 2 or m % p == 0:
                rows.append({"schedule": name, "error": str(exc)})
                continue
            from shardlab.pipeline.torch_ref import as_schedule  # torch.distributed.pipelining: imported on demand

            try:
                sched, order = as_schedule(name, p, m, vv), "PyTorch"
            except ValueError as torch_exc:
                rows.append({"schedule": name, "error": f"{exc}; PyTorch: {torch_exc}"})
                continue
        t = simulate(sched, forward=1, backward=2)
        traffic = fpp.p2p_traffic(p, m, 1, 1, 1, v=vv)
        rows.append({
            "schedule": name, "v": vv, "order": order,
            "bubble_fraction": t.idle_fraction, "formula_fraction": Fraction(p - 1, vv * m + p - 1),
            "bubble_ratio": t.bubble_ratio, "formula_ratio": Fraction(p - 1, vv * m),
            "inflight": Fraction(peak_inflight(sched)[0], vv), "formula_inflight": formula_inflight,
            "messages": int(traffic["count"]), "bytes": int(traffic["count"]) * message_bytes,
        })
    return rows
