"""Expert parallelism as GShard's annotated einsums on 8 virtual CPU devices, and compiled by XLA:TPU: the
all-to-alls against sizes worked out by hand (count, bytes, elements; exact), the expert weights per chip, and the
outputs and gradients vs the dense MoE oracle with one routing group per device (float32, other summation order:
rtol 1e-4 — measured <= 4e-5 absolute on values up to ~80)."""

from __future__ import annotations

import pytest
import torch

from shardlab import runtime
from shardlab.expert.moe import inputs, layer, moe_reference
from shardlab.expert.params import ExpertParams

pytestmark = pytest.mark.xla
runtime.setup(num_devices=8)

P = ExpertParams(tokens=16, hidden=32, ffn=64, experts=8, top_k=2, capacity_factor=1.25)
C = 5  # ceil(1.25 * 2 * 16 / 8) = ceil(5.0)
ELEMS = P.experts * C * P.hidden  # one all-to-all carries the whole [E, C, h] buffer: 8 * 5 * 32 = 1280 elements
A2A = ELEMS * 4  # float32: 5120 bytes
EXPERT_BYTES = P.hidden * P.ffn * 4  # one expert's W1 (or W3, or W2) in float32


@pytest.fixture(scope="module")
def G(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.expert import gspmd

    return gspmd


def _dense(p: ExpertParams) -> list[torch.Tensor]:
    """moe_reference with 8 groups (one per device): [y, dx, dW_r, dW1, dW3, dW2]."""
    moe = layer(p)
    x, target = inputs(p, 8)
    x.requires_grad_()
    y = moe_reference(x, moe, 8).out
    (0.5 * (y - target).pow(2).sum()).backward()  # the step's loss: ½‖y − target‖²
    return [y.detach(), x.grad, moe.router.grad, moe.w1.grad, moe.w3.grad, moe.w2.grad]


@pytest.mark.parametrize("ep", [8, 4])
def test_all_to_alls_and_parity(G, ep: int) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from shardlab.profile import capture_hlo

    p = replace(P, ep=ep)
    cap = capture_hlo(G.step, p)
    for got, want in zip(cap.result, _dense(p), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    m = cap.module
    t = G.all_to_all_traffic(m)
    # 2 forward (dispatch, combine) + 2 backward, each the whole buffer, within the ep devices of an expert group
    assert (t["count"], t["bytes"], t["elements"], t["group_sizes"], t["operands"]) == (4, 4 * A2A, 4 * ELEMS, [ep], 4)
    # the rest of the backward: the replicated router's gradient over all 8 devices, and with a data axis
    # (8 / ep = 2) the three expert-weight gradients over it (E/ep experts each)
    others = sorted((c.op, c.group_size, c.operand_bytes) for c in m.collectives if c.op != "all-to-all")
    router = ("all-reduce", 8, P.hidden * P.experts * 4)
    experts = [("all-reduce", 8 // ep, P.experts // ep * EXPERT_BYTES)] * 3 if ep < 8 else []
    assert others == sorted([router, *experts])
    assert G.expert_weight_bytes(m, p) == P.experts // ep * 3 * EXPERT_BYTES


def test_forward_only_and_no_expert_axis(G) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace
    from functools import partial

    from shardlab.profile import capture_hlo

    fwd = capture_hlo(partial(G.step, backward=False), replace(P, ep=8)).module
    t = G.all_to_all_traffic(fwd)
    assert (t["count"], t["bytes"]) == (2, 2 * A2A)
    assert [c.op for c in fwd.collectives] == ["all-to-all"] * 2
    one = capture_hlo(partial(G.step, backward=False), replace(P, ep=1)).module  # every device all experts
    assert one.collectives == []


def test_mesh_errors(G) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    with pytest.raises(ValueError, match="ep=3 does not tile num_devices=8"):
        G.expert_mesh(3)
    with pytest.raises(ValueError, match="the mesh needs ep=16 devices"):
        G.step(replace(P, ep=16, experts=16))


def test_tpu_compiler(G) -> None:  # type: ignore[no-untyped-def]
    """XLA:TPU (v5e-8): the same 4 all-to-alls and elements (it moves them in bf16), none asynchronous, and
    nothing else but the router gradient's all-reduce (the gates are read without top-k's scatter)."""
    pytest.importorskip("libtpu")
    from dataclasses import replace

    from shardlab.profile import tpu

    p = replace(P, ep=8)
    c = tpu.compile_program(G.step, p, "v5e-8")
    t = G.all_to_all_traffic(c.module)
    assert (t["count"], t["elements"], t["dtypes"], t["async"], t["operands"]) == (4, 4 * ELEMS, ["bf16"], 0, 4)
    assert [(x.op, x.operand_bytes) for x in c.module.collectives if x.op != "all-to-all"] == [
        ("all-reduce", P.hidden * P.experts * 4)]
    assert G.expert_weight_bytes(c.module, p) == 3 * EXPERT_BYTES
