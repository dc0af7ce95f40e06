"""Context parallelism as GSPMD programs on 8 virtual CPU devices, and compiled by XLA:TPU (compile-only): the
collectives the partitioners emit vs formulas.context (exact: counts, bytes, elements, trip counts), and the
outputs and gradients vs PyTorch's dense attention on the CPU (float32, other summation order: 2e-5)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardlab import runtime
from shardlab.formulas import context as fcp

pytestmark = pytest.mark.xla
runtime.setup(num_devices=8)  # before any CPU backward in this process (see tests/conftest.py)

BASE = dict(batch=1, seq=64, heads=4, kv_heads=2, head_dim=16)
KV = dict(batch=1, seq=64, kv_heads=2, head_dim=16)  # what the K/V traffic depends on


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny tensors: intra-op threads only contend on a shared 2-core machine (measured 100x slower under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def G(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.context import gspmd

    return gspmd


def _capture(G, cfg):  # type: ignore[no-untyped-def]
    from shardlab.profile import capture_hlo

    cap = capture_hlo(G.build_graph, cfg)
    for got, want in zip(cap.result, G.oracle(cfg), strict=True):
        torch.testing.assert_close(G.to_sequence(got.cpu(), cfg), want, rtol=2e-5, atol=2e-5)
    return cap.module


def _block_elements(cp: int) -> int:
    return BASE["batch"] * BASE["seq"] // cp * BASE["kv_heads"] * BASE["head_dim"]


@pytest.mark.parametrize(("method", "cp", "layout", "remat"), [("ring_scan", 8, "zigzag", True),
                                                               ("ring", 4, "contiguous", False)])
def test_spmd_ring_permutes(G, method: str, cp: int, layout: str, remat: bool) -> None:  # type: ignore[no-untyped-def]
    """(The scan case with its backward recomputing the loop body: the same permutes, the same answers.)"""
    cfg = G.CPGraphConfig(method=method, cp=cp, layout=layout, causal=True, remat=remat, **BASE)
    fwd = G.permute_traffic(_capture(G, replace(cfg, backward=False)))
    step = G.permute_traffic(_capture(G, cfg))
    want_f = fcp.ring_p2p(**KV, cp=cp)  # k and v sent separately: 2(cp-1) sends of one block
    want_b = fcp.ring_p2p(**KV, cp=cp, phase="backward", backward="saved")
    # k and v travel stacked: one permute of two blocks per step
    assert fwd["executed"] == want_f["count"] // 2 and fwd["executed_bytes"] == want_f["bytes"]
    assert step["executed"] == (want_f["count"] + want_b["count"]) // 2
    assert step["executed_bytes"] == want_f["bytes"] + want_b["bytes"]
    assert step["sent_elements"] == (want_f["bytes"] + want_b["bytes"]) // 4  # every device sends on every step
    if method == "ring_scan":  # one permute per loop body, the loops run cp - 1 times
        assert fwd["count"] == 1 and step["count"] == 2
        assert [trips for _, trips in step["loops"]] == [cp - 1, cp - 1]
    else:
        assert step["count"] == step["executed"] and step["loops"] == []


def test_allgather_cp_collectives(G) -> None:  # type: ignore[no-untyped-def]
    cfg = G.CPGraphConfig(method="allgather", cp=8, causal=True, **BASE)
    m = _capture(G, cfg)
    want = fcp.allgather_kv(**KV, cp=8, backward=True)
    ag = [c for c in m.collectives if c.op == "all-gather"]
    ar = [c for c in m.collectives if c.op == "all-reduce"]
    assert {c.op for c in m.collectives} == {"all-gather", "all-reduce"}
    assert (len(ag), sum(c.operand_bytes for c in ag)) == (want["all_gather"]["count"], want["all_gather"]["bytes"])
    # XLA:CPU has no reduce-scatter: an all-reduce of the full gradient feeding a dynamic-slice
    assert all(c.feeds_dynamic_slice for c in ar)
    assert (len(ar), sum(c.operand_bytes for c in ar)) == (want["reduce_scatter"]["count"],
                                                           want["reduce_scatter"]["bytes"])
    assert all(c.group_size == 8 for c in m.collectives)


def test_one_device_moves_nothing(G) -> None:  # type: ignore[no-untyped-def]
    """cp = 1 on the 8-device mesh (data = 8): every device holds the whole sequence; no collective."""
    for method in ("allgather", "ring"):
        m = _capture(G, G.CPGraphConfig(method=method, cp=1, causal=True, **BASE))
        assert m.collectives == []


def test_config_errors(G) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="cp=3 does not tile num_devices=8"):
        G.CPGraphConfig(cp=3, **BASE).validate(8)
    with pytest.raises(ValueError, match="seq=48 is not divisible by the 32 chunks of the zigzag layout"):
        G.CPGraphConfig(cp=16, layout="zigzag", **{**BASE, "seq": 48}).validate(16)
    with pytest.raises(ValueError, match="method='striped'"):
        G.CPGraphConfig(method="striped", **BASE).validate(8)


def test_tpu_compiler(G) -> None:  # type: ignore[no-untyped-def]
    """XLA:TPU (v5e:2x4, compile-only): the scan ring keeps one asynchronous permute per loop, forward in bf16
    (default matmul precision) — the same elements as the formula; all-gather CP keeps 2 all-gathers and reduces
    dk and dv in one combined all-reduce."""
    pytest.importorskip("libtpu")
    from shardlab.profile import tpu

    ring = tpu.compile_program(G.build_graph, G.CPGraphConfig(method="ring_scan", cp=8, **BASE), "v5e:2x4")
    t = G.permute_traffic(ring.module)
    want = fcp.ring_p2p(**KV, cp=8, phase="step", backward="saved")
    assert t["count"] == 2 and t["async"] == 2 and [n for _, n in t["loops"]] == [7, 7]
    assert t["sent_elements"] == want["bytes"] // 4
    ag = tpu.compile_program(G.build_graph, G.CPGraphConfig(method="allgather", cp=8, **BASE), "v5e:2x4")
    s = ag.module.summary()
    assert s["all-gather"]["count"] == 2 and s["all-gather"]["operand_bytes"] == 2 * _block_elements(8) * 2  # bf16
    assert s["all-reduce"]["operands"] == 2 and s["all-reduce"]["operand_bytes"] == 2 * _block_elements(1) * 4
