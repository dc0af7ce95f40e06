"""formulas.expert against independent arithmetic: exact ceilings, hand-counted buffers, and the uniform-routing
expectation against a brute-force enumeration of every routing."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from shardlab.formulas import expert as fexp


def test_capacity_is_an_exact_ceiling() -> None:
    assert fexp.capacity(64, 8, 2, 1.25) == 20  # 1.25 * 2 * 64 / 8 = 20 exactly: no float spill to 21
    assert fexp.capacity(10, 4, 2, 1.1) == 6  # 5.5 -> 6
    assert fexp.capacity(24, 8, 1, 1.0) == 3
    assert fexp.capacity(3, 8, 1, 0.1) == 1  # 0.0375 -> 1
    with pytest.raises(ValueError, match="capacity_factor=0 must be a positive number"):
        fexp.capacity(8, 8, 1, 0)


def test_all_to_all_bytes_by_hand() -> None:
    # E=8, C=ceil(1.25*2*64/8)=20, h=32, f32: buffer [8, 20, 32] = 20480 bytes per all-to-all
    a = fexp.all_to_all(64, 32, 8, 2, 1.25, ep=4, backward=True)
    assert a == {"count": 4, "bytes": 4 * 20480, "wire_bytes": 4 * 20480 * 3 / 4}
    assert fexp.all_to_all(64, 32, 8, 2, 1.25, ep=1) == {"count": 0, "bytes": 0, "wire_bytes": 0.0}
    assert fexp.all_to_all(64, 32, 8, 2, 1.25, ep=4, slots=7)["bytes"] == 2 * 8 * 7 * 32 * 4
    # the usual statement, tokens * k * cf * h * e / ranks, with T = 4 ranks * 64 tokens
    assert fexp.statement_bytes(256, 32, 2, 1.25, 4) == 20480
    # ...which the ceiling exceeds when E does not divide cf * k * S: C = ceil(1.1 * 2 * 10 / 4) = 6 > 5.5
    assert fexp.all_to_all(10, 8, 4, 2, 1.1, ep=2)["bytes"] / 2 > fexp.statement_bytes(20, 8, 2, 1.1, 2)


def test_expert_params_per_chip() -> None:
    assert fexp.expert_params_per_chip(8, 4, 64, 128, "bf16") == 2 * 3 * 64 * 128 * 2
    with pytest.raises(ValueError, match="experts=8 is not divisible by ep=3"):
        fexp.expert_params_per_chip(8, 3, 64, 128)


def test_dropped_from_loads() -> None:
    assert fexp.dropped_from_loads([[5, 1, 0], [2, 2, 4]], 2) == 3 + 2
    assert fexp.dropped_from_loads([[1, 1]], 5) == 0


@pytest.mark.parametrize(("s", "e", "k", "c"), [(3, 4, 2, 1), (4, 3, 1, 1), (3, 4, 1, 2)])
def test_uniform_expectation_equals_enumeration(s: int, e: int, k: int, c: int) -> None:
    """Every token picks a uniformly random set of k distinct experts: enumerate all routings exactly."""
    choices = list(itertools.combinations(range(e), k))
    total = Fraction(0)
    for routing in itertools.product(choices, repeat=s):
        loads = [sum(ex in pick for pick in routing) for ex in range(e)]
        total += Fraction(fexp.dropped_from_loads([loads], c), s * k)
    exact = total / len(choices) ** s
    assert fexp.expected_dropped_fraction(s, e, k, c) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize(("s", "e", "k", "cf", "h", "f"), [(16, 4, 2, 1.25, 8, 12), (12, 6, 1, 1.1, 4, 6)])
def test_dispatch_cost_against_pytorchs_flop_counter(s: int, e: int, k: int, cf: float, h: int, f: int) -> None:
    """Build the [S, E, C] tensors and run the einsums and the experts; PyTorch's FlopCounterMode counts them."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    cost = fexp.dispatch_cost(s, e, k, cf, h, f)
    c = fexp.capacity(s, e, k, cf)
    mask, combine, x = torch.zeros(s, e, c), torch.rand(s, e, c), torch.randn(s, h)
    w1, w3, w2 = torch.randn(e, h, f), torch.randn(e, h, f), torch.randn(e, f, h)
    with FlopCounterMode(display=False) as einsums:
        buf = torch.einsum("sec,sh->ech", mask, x)  # [E, C, h]
        torch.einsum("sec,ech->sh", combine, buf)
    with FlopCounterMode(display=False) as experts:
        torch.bmm(torch.nn.functional.silu(torch.bmm(buf, w1)) * torch.bmm(buf, w3), w2)
    assert mask.numel() == cost["entries"] and 2 * mask.numel() * 4 == cost["tensor_bytes"]
    assert einsums.get_total_flops() == cost["einsum_flops"]
    assert experts.get_total_flops() == cost["expert_flops"]
    assert cost["einsum_over_experts"] == pytest.approx(2 * s / (3 * f))  # independent of E, k, cf
