"""Context parallelism as GSPMD programs (the notebook's cases) on 8 virtual CPU devices, and compiled by XLA:TPU
(compile-only): the collectives the partitioners emit vs formulas.context (exact: counts, bytes, elements, trip
counts), and the outputs and gradients vs PyTorch's dense attention on the CPU (float32, other summation order:
2e-5, checked by the harness's parity)."""

from __future__ import annotations

import pytest

from shardlab import runtime
from shardlab.context.params import ContextParams
from shardlab.formulas import context as fcp

pytestmark = pytest.mark.xla
runtime.setup(num_devices=8)  # before any CPU backward in this process (see tests/conftest.py)

SIZES = dict(batch=1, seq=64, heads=4, kv_heads=2, head_dim=16)
KV = dict(batch=1, seq=64, kv_heads=2, head_dim=16)  # what the K/V traffic depends on


@pytest.fixture(scope="module")
def C(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.context import case

    return case


def _hlo(case):  # type: ignore[no-untyped-def]
    """XLA:CPU's program of the case, after the harness checked its outputs against dense attention."""
    from shardlab.core import harness

    view = harness.hlo(case)
    assert view.ran, view.skipped
    failed = {n: d for n, (ok, d) in view.checks.items() if not ok}
    assert not failed and any(n.startswith("parity.hlo") for n in view.checks), failed
    return view


@pytest.mark.parametrize(("scan", "cp", "layout", "remat"),
                         [(True, 8, "zigzag", True), (False, 4, "contiguous", False)])
def test_spmd_ring_permutes(C, scan: bool, cp: int, layout: str, remat: bool) -> None:  # type: ignore[no-untyped-def]
    """(The scan case with its backward recomputing the loop body: the same permutes, the same answers.)"""
    from shardlab.context.gspmd import permute_traffic

    p = ContextParams(cp=cp, layout=layout, **SIZES)
    fwd = permute_traffic(_hlo(C.RingCase(p, scan=scan, remat=remat)).detail.module)
    step_view = _hlo(C.RingCase(p, backward=True, scan=scan, remat=remat))
    step = permute_traffic(step_view.detail.module)
    want_f = fcp.ring_p2p(**KV, cp=cp)  # k and v sent separately: 2(cp-1) sends of one block
    want_b = fcp.ring_p2p(**KV, cp=cp, phase="backward", backward="saved")
    # k and v travel stacked: one permute of two blocks per step, every device sends on every step
    assert fwd["executed"] == want_f["count"] // 2 and fwd["sent_bytes"] == want_f["bytes"]
    assert step["executed"] == (want_f["count"] + want_b["count"]) // 2
    assert step["sent_bytes"] == want_f["bytes"] + want_b["bytes"]
    assert step["sent_elements"] == (want_f["bytes"] + want_b["bytes"]) // 4
    assert step["pairs"] == {8: step["count"]} and step["async"] == 0  # XLA:CPU: whole cyclic shifts, synchronous
    key = "ring.scan.fwd_bwd" if scan else "ring.spmd.fwd_bwd"
    assert step_view[f"{key}.p2p.count"] == (want_f["count"] + want_b["count"])  # block transfers
    if scan:  # one permute per loop body, the loops run cp - 1 times
        assert fwd["count"] == 1 and step["count"] == 2
        assert [trips for _, trips in step["loops"]] == [cp - 1, cp - 1] == step_view[f"{key}.while.trip_count"]
    else:
        assert step["count"] == step["executed"] and step["loops"] == []


def test_allgather_cp_collectives(C) -> None:  # type: ignore[no-untyped-def]
    view = _hlo(C.AllGatherCase(ContextParams(cp=8, **SIZES), backward=True))
    m = view.detail.module
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
    assert view["allgather.reduce_scatter.count"] == 2  # the harness counts the pair as a reduce-scatter


def test_two_data_rows(C) -> None:  # type: ignore[no-untyped-def]
    """cp = 2 on 8 devices: mesh (data 4, context 2); every permute pairs devices of one context group."""
    from shardlab.context.gspmd import permute_traffic

    view = _hlo(C.RingCase(ContextParams(cp=2, **SIZES)))
    t = permute_traffic(view.detail.module)
    perm = next(c for c in view.detail.module.collectives if c.op == "collective-permute")
    assert sorted(map(tuple, perm.source_target_pairs)) == [(0, 1), (1, 0), (2, 3), (3, 2), (4, 5), (5, 4), (6, 7),
                                                            (7, 6)]
    assert t["sent_bytes"] == fcp.ring_p2p(**KV, cp=2)["bytes"] and view.checks["hlo.ring.within_context_groups"][0]


def test_mesh_rule_and_ulysses_rule(C) -> None:  # type: ignore[no-untyped-def]
    from shardlab.core import harness

    skipped = harness.hlo(C.RingCase(ContextParams(cp=16, **{**SIZES, "seq": 64})))
    assert not skipped.ran and "cp=16" in skipped.skipped
    with pytest.raises(ValueError, match="kv_heads=2 is not divisible by cp=4"):
        C.UlyssesCase(ContextParams(cp=4, **SIZES))
    assert C.ulysses_params(ContextParams(cp=4, **SIZES))[0].kv_heads == 4  # multi-head attention instead
    assert C.ulysses_params(ContextParams(cp=8, **SIZES))[0] is None  # heads = 4 < cp: no whole heads


def test_tpu_compiler(C) -> None:  # type: ignore[no-untyped-def]
    """XLA:TPU (v5e-8, compile-only): the scan ring keeps one asynchronous permute per loop, forward in bf16
    (default matmul precision) — the same elements as the formula; the unrolled ring's later shifts are each split
    into a shift without the wrap-around pair and a one-pair permute; all-gather CP keeps 2 all-gathers and reduces
    dk and dv in one combined instruction."""
    pytest.importorskip("libtpu")
    from shardlab.context.gspmd import permute_traffic
    from shardlab.core import harness

    p = ContextParams(cp=8, **SIZES)
    t = permute_traffic(harness.tpu(C.RingCase(p, backward=True, scan=True)).detail.module)
    want = fcp.ring_p2p(**KV, cp=8, phase="step", backward="saved")
    assert t["count"] == 2 and t["async"] == 2 and [n for _, n in t["loops"]] == [7, 7]
    assert t["sent_elements"] == want["bytes"] // 4
    unrolled = harness.tpu(C.RingCase(p))
    u = permute_traffic(unrolled.detail.module)
    assert u["sent_elements"] == fcp.ring_p2p(**KV, cp=8)["bytes"] // 4 and u["dtypes"] == ["bf16"]
    assert u["pairs"] == {8: 1, 7: 6, 1: 6} and u["async"] == 13 == u["count"]
    assert unrolled["ring.p2p.count"] == 14 and "ring.collective_permute.count" in unrolled.differs
    ag = harness.tpu(C.AllGatherCase(p, backward=True))
    s = ag.detail.module.summary()
    block = KV["batch"] * KV["seq"] // 8 * KV["kv_heads"] * KV["head_dim"]
    assert s["all-gather"]["count"] == 2 and s["all-gather"]["operand_bytes"] == 2 * block * 2  # bf16
    assert ag["allgather.reduce_scatter.operands"] == 2 and ag["allgather.reduce_scatter.bytes"] \
        == 2 * 8 * block * 4  # one instruction carries the full dk and dv, f32
