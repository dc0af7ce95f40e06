# ruff: noqa: E501  (HLO lines are long by nature)
"""The HLO parser on hand-written text whose answer is known (bytes by arithmetic in the comments), and on
real dumps of tiny graphs (oracle: the Megatron/partitioning algebra, not the parser's own output)."""

import pytest
import torch

from shardlab.profile.hlo import parse_buffer_assignment, parse_hlo, parse_replica_groups, parse_shape

TEXT = """HloModule SyncTensorsGraph.7, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%fused_ds (p0: f32[16,64], p1: s32[]) -> f32[8,64] {
  %p0 = f32[16,64]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %ds = f32[8,64]{1,0} dynamic-slice(%p0, %p1, %c), dynamic_slice_sizes={8,64}
}

%body (state: (s32[], bf16[2,128,256])) -> (s32[], bf16[2,128,256]) {
  %state = (s32[], bf16[2,128,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %w = bf16[2,128,256]{2,1,0} get-tuple-element(%state), index=1
  %ag = bf16[2,128,1024]{2,1,0} all-gather(%w), channel_id=3, replica_groups=[2,4]<=[8], dimensions={2}, use_global_device_ids=true
  %sl = bf16[2,128,256]{2,1,0} slice(%ag), slice={[0:2], [0:128], [0:256]}
  ROOT %t = (s32[], bf16[2,128,256]{2,1,0}) tuple(%i, %sl)
}

%cond (state.1: (s32[], bf16[2,128,256])) -> pred[] {
  %state.1 = (s32[], bf16[2,128,256]{2,1,0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %SyncTensorsGraph.7_spmd (param: f32[32,256], param.1: f32[16,64]) -> (f32[32,256], f32[8,64]) {
  %param = f32[32,256]{1,0} parameter(0), sharding={replicated}
  %param.1 = f32[16,64]{1,0} parameter(1)
  %all-reduce = f32[32,256]{1,0} all-reduce(%param), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %all-reduce.1 = f32[16,64]{1,0} all-reduce(%param.1), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add
  %pid = u32[] partition-id()
  %off = s32[] convert(%pid)
  %fusion = f32[8,64]{1,0} fusion(%all-reduce.1, %off), kind=kLoop, calls=%fused_ds
  %init = (s32[], bf16[2,128,256]{2,1,0}) tuple(%off, %off)
  %while = (s32[], bf16[2,128,256]{2,1,0}) while(%init), condition=%cond, body=%body
  %cp = f32[32,256]{1,0} collective-permute(%all-reduce), channel_id=4, source_target_pairs={{0,1},{1,0}}
  ROOT %tuple = (f32[32,256]{1,0}, f32[8,64]{1,0}) tuple(%cp, %fusion)
}
"""


def test_shapes() -> None:
    arrays = parse_shape("(s32[], bf16[2,128,256]{2,1,0:T(8,128)(2,1)})")
    assert [str(a) for a in arrays] == ["s32[]", "bf16[2,128,256]"]
    assert sum(a.nbytes for a in arrays) == 4 + 2 * 128 * 256 * 2  # 131076


def test_replica_groups_iota() -> None:
    assert parse_replica_groups("[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # iota(8).reshape(2,4).T -> columns of the 2x4 grid
    assert parse_replica_groups("[4,2]<=[2,4]T(1,0)", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert parse_replica_groups("{}", 4) == [[0, 1, 2, 3]]


def test_hand_written_module() -> None:
    m = parse_hlo(TEXT)
    assert m.num_partitions == 8 and m.entry == "SyncTensorsGraph.7_spmd"
    assert m.count("all-reduce") == 2 and m.count("all-gather") == 1 and m.count("collective-permute") == 1
    ar, ar1 = (c for c in m.collectives if c.op == "all-reduce")
    assert ar.operand_bytes == 32 * 256 * 4 == 32768 and ar.group_size == 8 and not ar.feeds_dynamic_slice
    # all-reduce over groups of 2 + dynamic-slice of half of it = CPU's lowering of a reduce-scatter
    assert ar1.group_size == 2 and ar1.feeds_dynamic_slice
    (ag,) = (c for c in m.collectives if c.op == "all-gather")
    assert ag.in_while and ag.operand_bytes == 2 * 128 * 256 * 2 and ag.result_bytes == 4 * ag.operand_bytes
    assert ag.replica_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert m.count("all-reduce", in_while=True) == 0
    (loop,) = m.while_loops
    assert loop.body == "body" and loop.state_bytes == 4 + 2 * 128 * 256 * 2
    assert m.bytes("all-reduce") == 32768 + 16 * 64 * 4
    with pytest.raises(ValueError, match="is not one of"):
        m.count("allreduce")


def test_buffer_assignment_text() -> None:
    text = """BufferAssignment:
allocation 0: size 1024, parameter 0, shape |f32[16,16]| at ShapeIndex {}:
 value: <1 p0 @0> (size=1024,offset=0): f32[16,16]{1,0}
allocation 1: size 512, maybe-live-out:
 value: <2 out @0> (size=512,offset=0): f32[8,16]{1,0}
allocation 2: size 2048, preallocated-temp:
 value: <3 t @0> (size=2048,offset=0): f32[32,16]{1,0}
allocation 3: size 8, thread-local:

Total bytes used: 3592 (3.51KiB)
"""
    ba = parse_buffer_assignment(text)
    assert (ba.parameter, ba.output, ba.temp, ba.thread_local, ba.total) == (1024, 512, 2048, 8, 3592)


@pytest.mark.xla
def test_real_dump_megatron_mlp(xla_world) -> None:  # type: ignore[no-untyped-def]
    """gelu(x@A)@B, A by columns, B by rows: one all-reduce of x's shape (measured on torch_xla 2.9), no other collective."""
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime
    from shardlab.profile import capture_hlo

    mesh = runtime.mesh(8, "model")
    x = torch.randn(16, 64).to("xla")
    a, b = torch.randn(64, 128).to("xla"), torch.randn(128, 64).to("xla")
    xs.mark_sharding(a, mesh, (None, "model"))
    xs.mark_sharding(b, mesh, ("model", None))
    cap = capture_hlo(lambda: torch.nn.functional.gelu(x @ a) @ b)
    m = cap.module
    assert m.num_partitions == 8
    assert [c.op for c in m.collectives] == ["all-reduce"]
    assert m.bytes("all-reduce") == 16 * 64 * 4 and m.collectives[0].group_size == 8
    assert m.buffers is not None and m.buffers.parameter >= (16 * 64 + 2 * 64 * 128 // 8) * 4
    assert cap.metrics.compile_count >= 1
    torch.testing.assert_close(cap.result.cpu(), torch.nn.functional.gelu(x.cpu() @ a.cpu()) @ b.cpu(),
                               rtol=1e-4, atol=1e-4)  # sharded reduction order differs: approximate


@pytest.mark.xla
def test_real_dump_grid(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Mesh (2, 4): x[M_r, K_c] @ W[K_c, N] sums over 'c' only: 2 groups of 4, payload (m/2)·n·4."""
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime
    from shardlab.profile import capture_hlo

    mesh = runtime.mesh((2, 4), ("r", "c"))
    x, w = torch.randn(8, 32).to("xla"), torch.randn(32, 16).to("xla")
    xs.mark_sharding(x, mesh, ("r", "c"))
    xs.mark_sharding(w, mesh, ("c", None))
    (c,) = capture_hlo(lambda: x @ w).module.collectives
    assert c.op == "all-reduce" and sorted(map(sorted, c.replica_groups)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert c.operand_bytes == (8 // 2) * 16 * 4


def test_reduce_scatter_through_pad() -> None:
    """Uneven shards: all-reduce f32[30] -> pad to 32 -> dynamic-slice of 4 is still CPU's reduce-scatter."""
    text = """HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

%inner (q: f32[32], o: s32[]) -> f32[4] {
  %q = f32[32]{0} parameter(0)
  %o = s32[] parameter(1)
  ROOT %ds = f32[4]{0} dynamic-slice(%q, %o), dynamic_slice_sizes={4}
}

%outer (p: f32[32], o2: s32[]) -> f32[4] {
  %p = f32[32]{0} parameter(0)
  %o2 = s32[] parameter(1)
  ROOT %c = f32[4]{0} call(%p, %o2), to_apply=%inner
}

ENTRY %e (g: f32[30]) -> f32[4] {
  %g = f32[30]{0} parameter(0)
  %ar = f32[30]{0} all-reduce(%g), replica_groups={}, to_apply=%add
  %zero = f32[] constant(0)
  %padded = f32[32]{0} pad(%ar, %zero), padding=0_2
  %off = s32[] constant(0)
  ROOT %f = f32[4]{0} fusion(%padded, %off), kind=kLoop, calls=%outer
}
"""
    (ar,) = parse_hlo(text).collectives
    assert ar.feeds_dynamic_slice and ar.group_size == 8 and ar.operand_bytes == 30 * 4


def test_max_all_reduce_is_not_a_reduce_scatter() -> None:
    """A max all-reduce (vocab-parallel CE) followed by a dynamic-slice is not a reduce-scatter (sum only)."""
    text = """HloModule m, num_partitions=4

%max (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %mx = f32[] maximum(%x, %y)
}

ENTRY %e (g: f32[8]) -> f32[2] {
  %g = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(%g), replica_groups={}, to_apply=%max
  %off = s32[] constant(0)
  ROOT %ds = f32[2]{0} dynamic-slice(%ar, %off), dynamic_slice_sizes={2}
}
"""
    (ar,) = parse_hlo(text).collectives
    assert ar.group_size == 4 and not ar.feeds_dynamic_slice
