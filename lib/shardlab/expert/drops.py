"""Tokens dropped vs capacity factor: measured from the dispatch, predicted from the router's loads.

Design note
-----------
For one routing (a router's top-k choices for G groups of S tokens) and a capacity factor cf:

- **measured** — the assignments the vectorised dispatch (``moe.dispatch_tensors``, the code the expert-parallel
  layer runs) left without a slot;
- **formula** — Σ_{g,e} max(0, L_{g,e} − C) with the loads L counted from the router's choices and
  C = ceil(cf·k·S/E) (``formulas.expert.dropped_from_loads``): exact for the routing at hand, whatever the
  priority order (it decides *which* assignments drop, not how many);
- **uniform** — what a router that spreads tokens uniformly at random would drop on average
  (``formulas.expert.expected_dropped_fraction``). A learned (or random-weight) router is not uniform: it drops
  more.
- **loops** — the count of ``moe.route_loop`` (the dense oracle's routing: Python loops over the assignments in
  priority order), an implementation independent of the cumulative-sum dispatch the measured column uses;
- **lower bound** — max(0, 1 − E·C/(k·S)): the E·C slots of a group hold at most E·C of its k·S assignments,
  whatever the router does; equal only when every expert of every group is at least full (at cf 0.5 and
  C = k·S/(2E) exactly, *at least* half drops: a router that leaves one slot empty drops more).

Fractions are of all G·S·k assignments.

Example::

    >>> from shardlab.expert.params import ExpertParams
    >>> moe = MoE(ExpertParams(hidden=8, ffn=8, experts=4, top_k=1), torch.Generator().manual_seed(0))
    >>> x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    >>> rows = drop_table(x, moe, groups=2, factors=(1.0, 4.0))
    >>> rows[-1]["measured"], rows[0]["measured"] == rows[0]["formula"]       # cf = 4 = E / k: nothing drops
    (0.0, True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from shardlab.expert.moe import MoE, dispatch_tensors, route_loop, router_probs, top_k_gates
from shardlab.formulas import expert as fexp


def route_groups(x: torch.Tensor, moe: MoE, groups: int) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """x [T, h] routed by ``moe``'s router in ``groups`` equal groups: (gates [G, S, k], experts [G, S, k],
    loads[g][e] = assignments of group g to expert e, kept or not)."""
    p = moe.p
    t = x.shape[0]
    if t % groups:
        raise ValueError(f"tokens={t} is not divisible by groups={groups}")
    with torch.no_grad():
        gates, experts = top_k_gates(router_probs(x.reshape(groups, t // groups, -1), moe.router), p.top_k,
                                     p.normalize)
    return gates, experts, [torch.bincount(experts[g].flatten(), minlength=p.experts).tolist() for g in range(groups)]


def drop_table(x: torch.Tensor, moe: MoE, groups: int, factors: Iterable[float]) -> list[dict[str, Any]]:
    """x [T, h] routed by ``moe``'s router in ``groups`` equal groups; one row per capacity factor."""
    p = moe.p
    gates, experts, loads = route_groups(x, moe, groups)
    s = x.shape[0] // groups
    rows = []
    for cf in factors:
        c = fexp.capacity(s, p.experts, p.top_k, cf)
        kept = int(dispatch_tensors(gates, experts, p.experts, c).kept.sum())
        total = x.shape[0] * p.top_k
        loops = sum(len(route_loop(experts[g], p.experts, c).dropped) for g in range(groups))
        rows.append({"capacity_factor": cf, "capacity": c, "assignments": total, "dropped": total - kept,
                     "measured": (total - kept) / total, "loops": loops / total,
                     "lower_bound": max(0.0, 1 - p.experts * c / (s * p.top_k)),
                     "formula": fexp.dropped_from_loads(loads, c) / total,
                     "uniform": fexp.expected_dropped_fraction(s, p.experts, p.top_k, c), "loads": loads})
    return rows
