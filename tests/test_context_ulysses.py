"""DeepSpeed-Ulysses per rank vs PyTorch's dense attention (forward and gradients) and its all-to-alls vs
formulas.context.ulysses_all_to_all; the GSPMD version on 8 virtual CPU devices likewise. float64 per rank: each
head's attention is the same computation, only moved (1e-12); float32 under XLA (2e-5)."""

from __future__ import annotations

import pytest
import torch

from shardlab import runtime
from shardlab.comm import SimulatedWorld
from shardlab.context.attention import dense_attention, unshard_sequence
from shardlab.context.ulysses import ulysses_step
from shardlab.formulas import context as fcp

runtime.setup(num_devices=8)
B, S, HQ, HKV, D = 2, 32, 8, 4, 8


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_matches_dense_and_formula(cp: int, causal: bool) -> None:
    g = torch.Generator().manual_seed(cp)
    q, target = (torch.randn(B, S, HQ, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, S, HKV, D, generator=g, dtype=torch.float64) for _ in range(2))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    ref = dense_attention(qq, kk, vv, causal)
    (0.5 * (ref - target).pow(2).sum()).backward()  # the step's loss: ½‖out − target‖²
    world = SimulatedWorld(cp)
    results = world.run(ulysses_step, q, k, v, target, causal=causal)
    for name, want in (("out", ref.detach()), ("grad_q", qq.grad), ("grad_k", kk.grad), ("grad_v", vv.grad)):
        got = unshard_sequence([r[name] for r in results], "contiguous")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    led = world.ledger
    want = fcp.ulysses_all_to_all(B, S, HQ, HKV, D, cp, "float64", backward=True)
    assert {"count": led.count("all_to_all"), "bytes": led.payload_bytes("all_to_all"),
            "wire_bytes": led.wire_bytes("all_to_all")} == want
    assert led.count("all_to_all", "backward") == want["count"] // 2


def test_heads_must_split() -> None:
    x = torch.zeros(1, 8, 2, 4)
    with pytest.raises(Exception, match="kv_heads=2 is not divisible by cp=4"):
        SimulatedWorld(4).run(ulysses_step, torch.zeros(1, 8, 4, 4), x, x)


@pytest.mark.xla
def test_gspmd_ulysses(xla_world) -> None:  # type: ignore[no-untyped-def]
    """The notebook's Ulysses case on 8 devices: outputs and gradients vs dense attention (the harness's parity),
    one all-to-all per tensor each way, each of the rank's whole local tensor (formula)."""
    from shardlab.context.case import UlyssesCase
    from shardlab.context.params import ContextParams
    from shardlab.core import harness

    case = UlyssesCase(ContextParams(batch=1, seq=64, heads=8, kv_heads=8, head_dim=8, cp=8), backward=True)
    view = harness.hlo(case)
    assert view.checks and all(ok for ok, _ in view.checks.values()), view.checks
    a2a = [c for c in view.detail.module.collectives]
    want = fcp.ulysses_all_to_all(1, 64, 8, 8, 8, 8, backward=True)
    assert {c.op for c in a2a} == {"all-to-all"} and {c.group_size for c in a2a} == {8}
    assert (len(a2a), sum(c.operand_bytes for c in a2a)) == (want["count"], want["bytes"])
    # XLA:CPU's chunk form (a tuple of cp arrays, one per destination) is one all-to-all, not cp combined ones
    assert view["ulysses.fwd_bwd.all_to_all.count"] == 8 and "ulysses.fwd_bwd.all_to_all.operands" not in view.values
