"""Expert parallelism as GShard's annotated einsums on 8 virtual CPU devices, and compiled by XLA:TPU: the
all-to-alls vs formulas.expert (count, bytes, elements; exact), the expert weights per chip, and the outputs and
gradients vs the dense MoE oracle with one routing group per device (float32, other summation order: 2e-5)."""

from __future__ import annotations

import pytest
import torch

from shardlab import runtime
from shardlab.formulas import expert as fexp

pytestmark = pytest.mark.xla
runtime.setup(num_devices=8)

SIZES = dict(tokens=128, hidden=32, ffn=64, experts=8, top_k=2, capacity_factor=1.25)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny tensors: intra-op threads only contend on a shared 2-core machine (measured 100x slower under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def G(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.expert import gspmd

    return gspmd


def _formula(ep: int, backward: bool) -> dict:
    return fexp.all_to_all(SIZES["tokens"] // 8, SIZES["hidden"], SIZES["experts"], SIZES["top_k"],
                           SIZES["capacity_factor"], ep, backward=backward)


@pytest.mark.parametrize("ep", [8, 4])
def test_all_to_alls_and_parity(G, ep: int) -> None:  # type: ignore[no-untyped-def]
    from shardlab.profile import capture_hlo

    cfg = G.EPGraphConfig(ep=ep, **SIZES)
    cap = capture_hlo(G.build_graph, cfg)
    for got, want in zip(cap.result, G.oracle(cfg, groups=8), strict=True):
        torch.testing.assert_close(got.cpu().reshape(want.shape), want, rtol=2e-5, atol=2e-5)
    m = cap.module
    t = G.all_to_all_traffic(m)
    want = _formula(ep, backward=True)
    assert (t["count"], t["bytes"], t["group_sizes"]) == (want["count"], want["bytes"], [ep])
    # the rest of the backward: the replicated router's gradient over all 8 devices, and with a data axis
    # (8 / ep = 2) the three expert-weight gradients over it (E/ep experts each)
    others = sorted((c.op, c.group_size, c.operand_bytes) for c in m.collectives if c.op != "all-to-all")
    router = ("all-reduce", 8, SIZES["hidden"] * SIZES["experts"] * 4)
    expert = fexp.expert_params_per_chip(SIZES["experts"], ep, SIZES["hidden"], SIZES["ffn"]) // 3
    assert others == sorted([router] + ([("all-reduce", 8 // ep, expert)] * 3 if ep < 8 else []))
    assert G.expert_weight_bytes(m, cfg, 8) == fexp.expert_params_per_chip(SIZES["experts"], ep, SIZES["hidden"],
                                                                         SIZES["ffn"])


def test_forward_only_and_no_expert_axis(G) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from shardlab.profile import capture_hlo

    cfg = G.EPGraphConfig(ep=8, backward=False, **SIZES)
    t = G.all_to_all_traffic(capture_hlo(G.build_graph, cfg).module)
    assert (t["count"], t["bytes"]) == (_formula(8, False)["count"], _formula(8, False)["bytes"])
    one = capture_hlo(G.build_graph, replace(cfg, ep=1)).module  # every device all experts: nothing moves
    assert one.collectives == []


def test_config_errors(G) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="experts=6 is not divisible by ep=4"):
        G.EPGraphConfig(ep=4, **{**SIZES, "experts": 6}).validate(8)
    with pytest.raises(ValueError, match="dropless"):
        G.EPGraphConfig(**{**SIZES, "capacity_factor": None}).validate(8)
    with pytest.raises(ValueError, match="tokens=100 is not divisible by the 8 devices"):
        G.EPGraphConfig(**{**SIZES, "tokens": 100}).validate(8)


def test_tpu_compiler(G) -> None:  # type: ignore[no-untyped-def]
    """XLA:TPU (v5e:2x4): the same 4 all-to-alls and elements (it moves them in bf16), none asynchronous, and
    nothing else but the router gradient's all-reduce (the gates are read without top-k's scatter)."""
    pytest.importorskip("libtpu")
    from shardlab.profile import tpu

    c = tpu.compile_program(G.build_graph, G.EPGraphConfig(ep=8, **SIZES), "v5e:2x4")
    t = G.all_to_all_traffic(c.module)
    want = _formula(8, backward=True)
    assert t["count"] == want["count"] and t["elements"] == want["bytes"] // 4
    assert [(x.op, x.operand_bytes) for x in c.module.collectives if x.op != "all-to-all"] == [
        ("all-reduce", SIZES["hidden"] * SIZES["experts"] * 4)]
    assert G.expert_weight_bytes(c.module, G.EPGraphConfig(ep=8, **SIZES), 8) == fexp.expert_params_per_chip(
        SIZES["experts"], 8, SIZES["hidden"], SIZES["ffn"])
