"""All-gather CP per rank vs PyTorch's dense attention (forward and gradients, causal or not) and its ledger vs
formulas.context.allgather_kv: 2 all-gathers of a shard forward, 2 reduce-scatters of the full gradient backward.
float64: each rank computes its rows over all keys exactly like the dense code, only the dk, dv sums are
split over ranks (1e-12)."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import SimulatedWorld
from shardlab.context.allgather import allgather_attention_step
from shardlab.context.attention import dense_attention, unshard_sequence
from shardlab.formulas import context as fcp

B, S, HQ, HKV, D = 2, 32, 4, 2, 8


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_allgather_matches_dense_and_formula(cp: int, causal: bool) -> None:
    g = torch.Generator().manual_seed(cp)
    q, target = (torch.randn(B, S, HQ, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, S, HKV, D, generator=g, dtype=torch.float64) for _ in range(2))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    ref = dense_attention(qq, kk, vv, causal)
    (0.5 * (ref - target).pow(2).sum()).backward()  # the step's loss: ½‖out − target‖²
    world = SimulatedWorld(cp)
    results = world.run(allgather_attention_step, q, k, v, target, causal)
    for name, want in (("out", ref.detach()), ("grad_q", qq.grad), ("grad_k", kk.grad), ("grad_v", vv.grad)):
        got = unshard_sequence([r[name] for r in results], "contiguous")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    led, want = world.ledger, fcp.allgather_kv(B, S, HKV, D, cp, "float64", backward=True)
    for op in ("all_gather", "reduce_scatter"):
        assert (led.count(op), led.payload_bytes(op), led.wire_bytes(op)) == (
            want[op]["count"], want[op]["bytes"], want[op]["wire_bytes"])
    # by hand: a shard is B·(S/cp)·HKV·D float64 values; the gathers run forward, the reduce-scatters backward
    if cp > 1:
        assert led.payload_bytes("all_gather", "forward") == 2 * B * S // cp * HKV * D * 8
        assert led.payload_bytes("reduce_scatter", "backward") == 2 * B * S * HKV * D * 8


def test_forward_only() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 2, 4, generator=g)
    k = torch.randn(1, 16, 1, 4, generator=g)
    world = SimulatedWorld(4)
    results = world.run(allgather_attention_step, q, k, k, None, True)
    assert world.ledger.count("reduce_scatter") == 0 and results[0]["grad_k"] is None
    torch.testing.assert_close(unshard_sequence([r["out"] for r in results], "contiguous"),
                               dense_attention(q, k, k, True), rtol=1e-5, atol=1e-6)
