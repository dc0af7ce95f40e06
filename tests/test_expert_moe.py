"""The MoE layer's two routings (Python loops vs GShard's cumulative-sum tensors) agree slot by slot; capacity,
priority order and dropping follow GShard; the dense oracle equals a per-token computation; the drop table's
measurement equals the formula for the routing at hand and the loops; the router's losses equal loops over tokens and
experts and transformers' Mixtral implementation."""

from __future__ import annotations

import pytest
import torch

from shardlab.expert.drops import drop_table
from shardlab.expert.moe import (
    MoE,
    capacity,
    dispatch_tensors,
    expert_ffn,
    load_balancing_loss,
    moe_reference,
    route_loop,
    router_probs,
    router_z_loss,
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


def _aux_loop(probs: torch.Tensor, experts: torch.Tensor, e: int) -> float:
    """Switch's α·E·Σ f_i·P_i with α = 1 for one group, by loops over tokens and experts."""
    s = probs.shape[0]
    total = 0.0
    for i in range(e):
        f = sum(1 for t in range(s) if i in experts[t].tolist()) / s
        big_p = sum(float(probs[t, i]) for t in range(s)) / s
        total += f * big_p
    return e * total


def test_load_balancing_loss_equals_loops_and_transformers() -> None:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    moe = _layer(e=6, k=2)
    x = torch.randn(3, 10, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)  # 3 groups of 10
    with torch.no_grad():
        logits = x @ moe.router  # [3, 10, 6]
    probs = logits.softmax(-1)
    _, experts = top_k_gates(probs, 2, True)
    got = float(load_balancing_loss(probs, experts, alpha=0.5))
    loops = [_aux_loop(probs[g], experts[g], 6) for g in range(3)]
    assert got == pytest.approx(0.5 * sum(loops) / 3, rel=1e-12)
    hf = [float(load_balancing_loss_func((logits[g],), 6, 2)) for g in range(3)]
    assert loops == pytest.approx(hf, rel=1e-6)  # transformers averages its one-hot mask in float32
    # a uniform router (equal probabilities, every expert picked equally often) scores alpha * k
    even = torch.full((6, 6), 1 / 6, dtype=torch.float64)
    assert float(load_balancing_loss(even, torch.tensor([[0, 1], [2, 3], [4, 5]] * 2), alpha=0.01)) == \
        pytest.approx(0.01 * 2, rel=1e-12)


def test_load_balancing_gradient_flows_through_p_only() -> None:
    """f_i is a count (no gradient): d aux / d p_{t,i} = α·E·f_i / S for every token t."""
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.5, 0.1, 0.4]], requires_grad=True)
    experts = probs.detach().topk(1, dim=-1).indices  # top-1: experts 0, 0, 1, 0 -> f = (3/4, 1/4, 0)
    load_balancing_loss(probs, experts, alpha=2.0).backward()
    want = torch.tensor([2.0 * 3 * f / 4 for f in (0.75, 0.25, 0.0)]).expand(4, 3)
    torch.testing.assert_close(probs.grad, want)


def test_router_z_loss_and_reference_fields() -> None:
    import math

    moe = _layer()
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    moe.requires_grad_(False)
    logits = (x @ moe.router).tolist()
    loop = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits) / 12
    assert float(router_z_loss(x @ moe.router)) == pytest.approx(loop, rel=1e-12)
    ref = moe_reference(x, moe, groups=3)
    assert float(ref.z) == pytest.approx(loop, rel=1e-12)  # equal groups: the mean of means is the mean
    probs = (x @ moe.router).softmax(-1).reshape(3, 4, -1)
    experts = probs.topk(2, dim=-1).indices
    assert float(ref.aux) == pytest.approx(sum(_aux_loop(probs[g], experts[g], 4) for g in range(3)) / 3, rel=1e-12)


def test_drop_table_loops_and_slot_bound() -> None:
    moe = MoE(ExpertParams(hidden=16, ffn=16, experts=8, top_k=2), torch.Generator().manual_seed(0))
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    rows = drop_table(x, moe, groups=4, factors=(0.5, 0.75, 1.0, 2.0))
    for row in rows:
        assert row["loops"] == row["measured"]
        s, c = 16, row["capacity"]
        assert row["lower_bound"] == max(0.0, 1 - 8 * c / (2 * s))
        assert row["measured"] >= row["lower_bound"]
    assert rows[0]["lower_bound"] == 0.5  # C = ceil(0.5·2·16/8) = 2: 16 slots for 32 assignments
    # a router that loads every expert to at least C reaches the bound: all 4 experts picked equally (k = 1)
    even = MoE(ExpertParams(hidden=4, ffn=4, experts=4, top_k=1), torch.Generator().manual_seed(0))
    with torch.no_grad():
        even.router.copy_(torch.eye(4) * 10)
    xs = torch.eye(4).repeat(4, 1)  # 16 tokens, 4 to each expert
    row = drop_table(xs, even, groups=1, factors=(0.5,))[0]  # C = 2: 2 of every 4 drop
    assert row["measured"] == row["lower_bound"] == 0.5


def test_router_training_aux_loss_holds_the_drops() -> None:
    """The claim notebook 11 teaches, at a small layer: 30 router steps on the task alone drop more than with α = 1
    (the tokens share an offset, so the router has something to collapse onto)."""
    from shardlab.expert.balance import train_router

    p = ExpertParams(tokens=64, hidden=32, ffn=64)
    task, balanced = train_router(p, groups=4, alpha=0.0), train_router(p, groups=4, alpha=1.0)
    assert len(task) == 31 and task[0] == balanced[0]  # the same start
    assert balanced[-1]["dropped"] < task[-1]["dropped"] and balanced[-1]["aux"] < task[-1]["aux"]
    with pytest.raises(ValueError, match="alpha=-1 must be >= 0"):
        train_router(p, groups=1, alpha=-1)
