"""Ring attention per rank vs PyTorch's dense attention (forward and gradients), its ledger vs the formula, and the
causal work it counted vs the closed form. float64: the ring sums the same terms in another order (1e-10)."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.context.attention import dense_attention, unshard_sequence
from shardlab.context.balance import measure, work_from_trace
from shardlab.context.ring import TAGS, ring_attention_step
from shardlab.formulas import context as fcp

B, S, HQ, D = 2, 32, 4, 8
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _data(hkv: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, S, hkv, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, torch.randn(B, S, HQ, D, generator=g, dtype=torch.float64)


def _dense(q, k, v, target, causal):  # type: ignore[no-untyped-def]
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = dense_attention(q, k, v, causal)
    (0.5 * (out - target).pow(2).sum()).backward()  # the step's loss: ½‖out − target‖²
    return out.detach(), q.grad, k.grad, v.grad


def _check_parity(results, want, layout):  # type: ignore[no-untyped-def]
    for name, w in zip(("out", "grad_q", "grad_k", "grad_v"), want, strict=True):
        torch.testing.assert_close(unshard_sequence([r[name] for r in results], layout), w, **TOL)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_matches_dense_and_formula(cp: int, causal: bool, layout: str) -> None:
    q, k, v, target = _data(hkv=2)
    world = SimulatedWorld(cp)
    results = world.run(ring_attention_step, q, k, v, target, causal=causal, layout=layout)
    _check_parity(results, _dense(q, k, v, target, causal), layout)
    led = world.ledger
    for phase in ("forward", "backward"):
        want = fcp.ring_p2p(B, S, 2, D, cp, "float64", phase=phase)  # backward="ring": what this code does
        assert {"count": led.count("send", phase), "bytes": led.payload_bytes("send", phase)} == want
        assert led.count("recv", phase) == want["count"]
    assert {e.tag for e in led} <= set(TAGS)
    assert all(e.peer == (0 + 1) % cp for e in led.select("send"))  # rank 0 only ever sends to rank 1
    # the blocks each rank computed: the closed forms
    work = [work_from_trace(r["trace"]) for r in results]
    assert [w["elements"] for w in work] == fcp.causal_work(S, cp, layout, causal)
    blocks = fcp.causal_blocks(cp, layout, causal)
    assert [(w["full"], w["diagonal"], w["masked"]) for w in work] == [(b["full"], b["diagonal"], b["masked"])
                                                                       for b in blocks]
    assert [work_from_trace(r["trace"], "backward") for r in results] == work  # the backward ring skips the same


def test_gqa_and_mha() -> None:
    for hkv in (1, 4):
        q, k, v, target = _data(hkv=hkv, seed=hkv)
        results = SimulatedWorld(4).run(ring_attention_step, q, k, v, target, causal=True, layout="zigzag")
        _check_parity(results, _dense(q, k, v, target, True), "zigzag")


def test_forward_only_sends_nothing_backward() -> None:
    q, k, v, _ = _data(hkv=2)
    world = SimulatedWorld(4)
    results = world.run(ring_attention_step, q, k, v, None, causal=True)
    assert world.ledger.count("send", "backward") == 0 and results[0]["grad_q"] is None
    torch.testing.assert_close(unshard_sequence([r["out"] for r in results], "contiguous"),
                               dense_attention(q, k, v, True), **TOL)


def test_balance_rows() -> None:
    rows = measure(seq=64, cp=4)
    assert [r["layout"] for r in rows] == ["contiguous", "zigzag"]
    for r in rows:
        assert r["elements"] == r["formula_elements"] and r["blocks"] == r["formula_blocks"]
    # contiguous, c = 16: rank r computes r * 256 + 136 elements; max / mean = 904 / 520
    assert rows[0]["elements"] == [136, 392, 648, 904]
    assert rows[0]["max_over_mean"] == pytest.approx(904 / 520)
    assert rows[1]["max_over_mean"] == 1.0
    # rank 0's forward sends: 2(cp - 1) = 6 blocks of 1·(64/4)·1·8 float32 values each
    assert [(r["sends"], r["send_bytes"]) for r in rows] == [(6, 6 * 16 * 8 * 4)] * 2


def test_gloo_matches_simulated() -> None:
    """The same per-rank code across 2 real processes (gloo): same results and the same ledger."""
    q, k, v, target = _data(hkv=2)
    sim, dist = SimulatedWorld(2), DistributedWorld(2)
    a = sim.run(ring_attention_step, q, k, v, target, causal=True, layout="zigzag")
    b = dist.run(ring_attention_step, q, k, v, target, causal=True, layout="zigzag")
    for ra, rb in zip(a, b, strict=True):
        for name in ("out", "grad_q", "grad_k", "grad_v"):
            torch.testing.assert_close(ra[name], rb[name], rtol=0, atol=0)  # point-to-point: no reduction order
    assert dist.ledger.summary().equals(sim.ledger.summary())


def test_errors() -> None:
    q, k, v, target = _data(hkv=2)
    with pytest.raises(Exception, match="seq=32 is not divisible by the 6 chunks of the zigzag layout"):
        SimulatedWorld(3).run(ring_attention_step, q, k, v, target, causal=True, layout="zigzag")
