# ruff: noqa: E501  (HLO lines are long by nature)
"""Overlap and fusion on hand-written HLO: FLOPs by arithmetic, windows and the exposed-time model with round
hardware numbers, kernel kinds counted by hand."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from shardlab.levers import fusion as FU
from shardlab.levers import overlap as OV
from shardlab.profile.hlo import HloModule, parse_hlo

ASYNC_PARSER = hasattr(HloModule, "async_windows")

TEXT = """HloModule m, is_scheduled=true, num_partitions=4

%fused_mm (p0: bf16[8,64], p1: bf16[64,32]) -> bf16[8,32] {
  %p0 = bf16[8,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %conv = bf16[8,32]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%fused_ew (q0: bf16[8,32]) -> bf16[8,32] {
  %q0 = bf16[8,32]{1,0} parameter(0)
  ROOT %t = bf16[8,32]{1,0} tanh(%q0)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: bf16[8,64], w: bf16[64,32], v: f32[16,16], u: f32[16,8]) -> (bf16[8,32], f32[64,16], f32[16,16]) {
  %a = bf16[8,64]{1,0} parameter(0)
  %w = bf16[64,32]{1,0} parameter(1)
  %v = f32[16,16]{1,0} parameter(2)
  %u = f32[16,8]{1,0} parameter(3)
  %ag = (f32[16,16]{1,0}, f32[64,16]{1,0}) all-gather-start(%v), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %mm = bf16[8,32]{1,0} fusion(%a, %w), kind=kOutput, calls=%fused_mm
  %d = f32[16,8]{1,0} dot(%v, %u), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %agd = f32[64,16]{1,0} all-gather-done(%ag)
  %ew = bf16[8,32]{1,0} fusion(%mm), kind=kLoop, calls=%fused_ew
  %neg = f32[16,16]{1,0} negate(%v)
  %ar = f32[16,16]{1,0} all-reduce(%neg), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add
  ROOT %out = (bf16[8,32]{1,0}, f32[64,16]{1,0}, f32[16,16]{1,0}) tuple(%ew, %agd, %ar)
}
"""


class Chip(NamedTuple):
    ici_egress_bytes_per_s: float
    bf16_peak_flops_per_s: float


def test_matmul_flops_by_hand() -> None:
    m = parse_hlo(TEXT)
    assert OV.matmul_flops(m, "mm") == 2 * 8 * 32 * 64  # convolution bf_io->bf: K = 64 (lhs feature dim)
    assert OV.matmul_flops(m, "d") == 2 * 16 * 8 * 16  # dot: K = 16 (lhs_contracting_dims={1})
    assert OV.matmul_flops(m, "ew") == 0 and OV.matmul_flops(m, "neg") == 0
    assert OV.schedule_flops(m) == 32768 + 4096


@pytest.mark.skipif(not ASYNC_PARSER, reason="needs the TPU-aware HLO parser (async collectives, async_windows)")
def test_exposed_model_by_hand() -> None:
    m = parse_hlo(TEXT)
    chip = Chip(ici_egress_bytes_per_s=1e9, bf16_peak_flops_per_s=1e9)
    rows, tot = OV.exposed(m, chip)
    by = {r["op"]: r for r in rows}
    ag, ar = by["all-gather"], by["all-reduce"]
    # all-gather: payload 16·16·4 = 1024 B, ring wire (4-1)·1024 = 3072 B -> 3.072 µs; window: mm + d =
    # 36864 FLOPs -> 36.864 µs at 1 GFLOP/s: fully hidden
    assert (ag["bytes"], ag["wire_bytes"], ag["window_flops"]) == (1024, 3072, 36864)
    assert ag["exposed_s"] == 0.0
    # synchronous all-reduce: 2·3/4·1024 = 1536 B, all exposed
    assert ar["wire_bytes"] == 1536 and ar["exposed_s"] == pytest.approx(1.536e-6)
    assert tot["exposed_s"] == pytest.approx(1.536e-6) and tot["comm_s"] == pytest.approx(4.608e-6)
    assert [k for _, k in OV.schedule(m)] == ["collective-start", "matmul", "matmul", "collective-done", "other",
                                              "other", "collective"]


@pytest.mark.skipif(not ASYNC_PARSER, reason="needs the TPU-aware HLO parser (async collectives, async_windows)")
def test_exposed_never_exceeds_communication() -> None:
    slow = Chip(ici_egress_bytes_per_s=1.0, bf16_peak_flops_per_s=1e15)  # windows cover nothing
    rows, tot = OV.exposed(parse_hlo(TEXT), slow)
    assert tot["exposed_s"] == pytest.approx(tot["comm_s"], rel=1e-6)
    assert all(0 <= r["exposed_s"] <= r["comm_s"] for r in rows)


def test_fusion_counts_by_hand() -> None:
    c = FU.fusion_counts(parse_hlo(TEXT))
    # kernels: ag (collective), mm (matmul fusion), d (matmul), agd (its done: bookkeeping of the same
    # collective), ew (kLoop fusion: memory-bound), neg (memory-bound), ar (collective); parameters, tuple: none
    assert c["matmul"] == 2 and c["memory-bound"] == 2
    assert c["fusions"] == 2 and c["fusion.kLoop"] == 1 and c["fusion.kOutput"] == 1
    assert c["ops inside fusions"] == 2  # conv, tanh (parameters do not count)
    assert c["kernels"] == c["matmul"] + c["memory-bound"] + c["collective"]


@pytest.mark.skipif(not ASYNC_PARSER, reason="needs the TPU-aware HLO parser (async collectives, async_windows)")
def test_windowed_einsum_flops_equal_the_step_by_hand() -> None:
    """Real XLA:TPU program of notebook 08's FSDP step (4 layers [2048, 2048] bf16, batch 8192, 8 chips): the
    matmul FLOPs priced with the loops' trip counts equal 2·(B/n)·h²·(3L−1) worked out by hand; counting each
    loop body once (what the compiler's cost analysis does) would miss half of every weight-gradient matmul."""
    from pathlib import Path

    from shardlab.formulas.flops import linear_stack_step_flops

    m = parse_hlo((Path(__file__).parent / "data" / "tpu_hlo" / "fsdp4_windowed_bf16_v5e_8.txt").read_text())
    hand = 2 * (8192 // 8) * 2048 * 2048 * (3 * 4 - 1)
    assert OV.schedule_flops(m) == hand == linear_stack_step_flops(8192, 2048, 4, 8)
    body_once = sum(OV.matmul_flops(m, n) for w in m.while_loops for n in m.computations[w.body])
    assert body_once == 4 * (2 * 1024 * 2048 * 2048) // 2  # one of 2 iterations of each dW = xᵀ·dy
    rows, tot = OV.exposed(m, Chip(ici_egress_bytes_per_s=1e9, bf16_peak_flops_per_s=1e12))
    assert tot["loops_unknown_trips"] == 0
    for r in rows:  # a permute in a loop body moves its bytes once per iteration
        assert r["comm_s"] == pytest.approx((r["runs"] or 1) * r["wire_bytes"] / 1e9)


AXES_TEXT = """HloModule m, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (v: f32[1000,250]) -> (f32[1000,250], f32[1000,250], f32[1000,250]) {
  %v = f32[1000,250]{1,0} parameter(0)
  %one_axis = f32[1000,250]{1,0} all-reduce(%v), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, to_apply=%add
  %two_axes = f32[1000,250]{1,0} all-reduce(%v), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %cp = f32[1000,250]{1,0} collective-permute(%v), channel_id=3, source_target_pairs={{0,1},{1,0}}
  ROOT %out = (f32[1000,250]{1,0}, f32[1000,250]{1,0}, f32[1000,250]{1,0}) tuple(%one_axis, %two_axes, %cp)
}
"""


def test_egress_per_torus_axis_by_hand() -> None:
    """v5e-8 is a 2 x 4 torus whose devices sit in hosts of 2 x 2 chips: 0 (0,0), 1 (1,0), 2 (0,1), 3 (1,1), 4 (0,2)
    ... So {0, 2, 4, 6} varies only y (one axis: 2 links one way each = one link's bidirectional figure, the
    published 400 GB/s over 4 links = 100 GB/s), {0, 1, 2, 3} varies x and y (200 GB/s), the permute 0 <-> 1 only x.
    The devices' places are libtpu's (tests/test_formulas_hardware.py checks them)."""
    from shardlab.formulas.hardware import chip

    m = parse_hlo(AXES_TEXT)
    v5e = chip("v5e")
    rows, _ = OV.exposed(m, v5e, "v5e-8")
    by = {r["collective"]: r for r in rows}
    payload = 1000 * 250 * 4  # 1 MB
    assert (by["one_axis"]["axes"], by["two_axes"]["axes"], by["cp"]["axes"]) == (1, 2, 1)
    # ring all-reduce over 4: 2 · 3/4 · 1 MB = 1.5 MB on the wire; 15 µs at 100 GB/s, 7.5 µs at 200 GB/s
    assert by["one_axis"]["comm_s"] == pytest.approx(1.5e6 / 100e9)
    assert by["two_axes"]["comm_s"] == pytest.approx(1.5e6 / 200e9)
    assert by["cp"]["comm_s"] == pytest.approx(payload / 100e9)  # a permute sends its operand once
    # without a slice: every collective at the all-axes egress (half the published 400 GB/s)
    rows, _ = OV.exposed(m, v5e)
    assert [r["comm_s"] for r in rows] == pytest.approx([1.5e6 / 200e9, 1.5e6 / 200e9, payload / 200e9])


def test_window_table_sums_by_hand() -> None:
    from shardlab.levers import figures as VL

    rows = [{"collective": "a", "op": "all-gather", "form": "sync", "axes": 1, "bytes": 10, "matmuls_between": 0,
             "comm_s": 1e-6, "exposed_s": 1e-6},
            {"collective": "b", "op": "all-gather", "form": "sync", "axes": 2, "bytes": 30, "matmuls_between": 2,
             "comm_s": 3e-6, "exposed_s": 0.0}]
    t = VL.window_table(rows).loc[("all-gather", "sync")]
    assert (t["collectives"], t["axes"], t["bytes"], t["matmuls_between"]) == (2, 2, 40, 2)
    assert (t["comm_us"], t["exposed_us"]) == (pytest.approx(4.0), pytest.approx(1.0))
