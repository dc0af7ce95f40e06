"""The MoE layer's two routings (Python loops vs GShard's cumulative-sum tensors) agree slot by slot; capacity,
priority order and dropping follow GShard; the dense oracle equals a per-token computation; the drop table's
measurement equals the formula for the routing at hand."""

from __future__ import annotations

import pytest
import torch

from shardlab.expert.drops import drop_table
from shardlab.expert.moe import (
    MoE,
    capacity,
    dispatch_tensors,
    expert_ffn,
    moe_reference,
    route_loop,
    router_probs,
    top_k_gates,
)
from shardlab.expert.params import ExpertParams
from shardlab.formulas import expert as fexp


def _layer(cf: float = 1.0, k: int = 2, e: int = 4, seed: int = 0) -> MoE:
    return MoE(ExpertParams(hidden=8, ffn=12, experts=e, top_k=k, capacity_factor=cf),
               torch.Generator().manual_seed(seed)).double()


def test_priority_order_by_hand() -> None:
    # 3 tokens, k = 2, capacity 2: first choices (e0, e0, e0) claim e0's 2 slots, token 2's first choice drops;
    # then second choices (e1, e2, e1) all fit.
    experts = torch.tensor([[0, 1], [0, 2], [0, 1]])
    r = route_loop(experts, 4, capacity=2)
    assert r.kept == [(0, 0, 0, 0), (1, 0, 0, 1), (0, 1, 1, 0), (1, 1, 2, 0), (2, 1, 1, 1)]
    assert r.dropped == [(2, 0, 0)] and r.loads == [3, 2, 1, 0]
    d = dispatch_tensors(torch.ones(1, 3, 2), experts[None], 4, 2)
    assert d.kept[0].tolist() == [[True, True], [True, True], [False, True]]
    assert d.mask[0, 2, 0].sum() == 0 and d.mask[0, 2, 1, 1] == 1  # token 2 -> expert 1, slot 1


@pytest.mark.parametrize("cf", [0.5, 1.0, 2.0])
def test_vectorised_dispatch_equals_the_loops(cf: float) -> None:
    moe = _layer(cf, e=8)
    x = torch.randn(3, 20, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # 3 groups
    gates, experts = top_k_gates(router_probs(x, moe.router), 2, True)
    c = capacity(moe.p, 20)
    assert c == {0.5: 3, 1.0: 5, 2.0: 10}[cf]  # ceil(cf * 2 * 20 / 8): 2.5 -> 3, 5, 10
    d = dispatch_tensors(gates, experts, 8, c)
    for g in range(3):
        r = route_loop(experts[g], 8, c)
        want = torch.zeros(20, 8, c, dtype=torch.float64)
        for t, _j, e, slot in r.kept:
            want[t, e, slot] = 1
        assert torch.equal(d.mask[g], want)
        assert d.loads[g].tolist() == r.loads
        torch.testing.assert_close(d.combine[g], _combine(r, gates[g], c), rtol=0, atol=0)


def _combine(r, gates, c):  # type: ignore[no-untyped-def]
    out = torch.zeros(gates.shape[0], 8, c, dtype=gates.dtype)
    for t, j, e, slot in r.kept:
        out[t, e, slot] = gates[t, j]
    return out


def test_oracle_equals_per_token_sum() -> None:
    """y_t = Σ over token t's kept choices of gate · expert(x_t), computed token by token."""
    moe = _layer(cf=0.75)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref = moe_reference(x, moe, groups=2)
    gates, experts = top_k_gates(router_probs(x, moe.router), 2, True)
    want = torch.zeros_like(x)
    for g, routing in enumerate(ref.routings):
        for t, j, e, _ in routing.kept:
            tok = 8 * g + t
            want[tok] += gates[tok, j] * expert_ffn(x[tok:tok + 1], moe.w1[e], moe.w3[e], moe.w2[e])[0]
    torch.testing.assert_close(ref.out, want, rtol=1e-12, atol=1e-12)
    assert sum(len(r.dropped) for r in ref.routings) > 0  # cf 0.75 < 1: something dropped


def test_dropless_keeps_everything() -> None:
    moe = _layer(cf=0.25)  # the capacity factor is ignored by the dropless layer
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = moe_reference(x, moe, groups=2, dropless=True)
    assert all(not r.dropped and len(r.kept) == 16 for r in ref.routings)
    assert sum(len(r.dropped) for r in moe_reference(x, moe, groups=2).routings) > 0  # C = 1 drops


def test_drop_table_measured_equals_formula() -> None:
    moe = MoE(ExpertParams(hidden=16, ffn=16, experts=8, top_k=2), torch.Generator().manual_seed(0))
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
    rows = drop_table(x, moe, groups=4, factors=(0.5, 1.0, 1.25, 2.0, 4.0))
    for row in rows:
        assert row["measured"] == row["formula"]
        assert row["dropped"] == fexp.dropped_from_loads(row["loads"], row["capacity"])
    assert rows[-1]["measured"] == 0.0 and rows[0]["measured"] >= 0.5  # C = S·k/(2E): at least half drops
    assert [r["measured"] for r in rows] == sorted((r["measured"] for r in rows), reverse=True)


def test_parameter_errors() -> None:
    with pytest.raises(ValueError, match="top_k=3 must be <= experts=2"):
        ExpertParams(experts=2, top_k=3, ep=1).validate()
    with pytest.raises(ValueError, match="capacity_factor=-1 must be a positive number"):
        ExpertParams(capacity_factor=-1).validate()
    with pytest.raises(ValueError, match="experts=6 is not divisible by ep=4"):
        ExpertParams(experts=6).validate()
    with pytest.raises(ValueError, match="drop_factors entry=0 must be a positive number"):
        ExpertParams(drop_factors=[1.0, 0]).validate()
