# ruff: noqa: E501  (HLO lines are long by nature)
"""The HLO parser on hand-written text whose answer is known (bytes by arithmetic in the comments), and on
real dumps of tiny graphs (oracle: the Megatron/partitioning algebra, not the parser's own output)."""

import re
from pathlib import Path

import pytest
import torch

from shardlab.profile.hlo import parse_buffer_assignment, parse_hlo, parse_replica_groups, parse_shape

TPU_HLO = Path(__file__).parent / "data" / "tpu_hlo"  # real XLA:TPU programs; what each holds: README.md there

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


# ------------------------------------------------------------------------------------------- XLA:TPU programs
# Real per-chip programs from XLA:TPU (v5e-8, 8 chips); graphs and sizes in tests/data/tpu_hlo/README.md.
# Expected values follow from the graph's shapes (arithmetic in the comments), not from the parser.


def _tpu(name: str):  # type: ignore[no-untyped-def]
    text = (TPU_HLO / name).read_text()
    return text, parse_hlo(text)


def test_tpu_tiled_layouts_and_tuple_all_reduce() -> None:
    """Megatron MLP bf16, tp 8: forward y and backward dx all-reduces combined into one tuple all-reduce."""
    text, m = _tpu("mlp_bf16_v5e_8.txt")
    assert "{1,0:T(8,128)(2,1)}" in text and m.num_partitions == 8 and m.entry.startswith("main")
    (ar,) = m.collectives
    assert (ar.op, ar.operands, ar.dtype, ar.group_size, ar.async_) == ("all-reduce", 2, "bf16", 8, False)
    assert ar.shape == [(64, 256), (64, 256)] and ar.operand_bytes == 2 * 64 * 256 * 2  # bf16 stays bf16
    assert m.summary() == {"all-reduce": {"count": 1, "operands": 2, "operand_bytes": 65536, "result_bytes": 65536,
                                          "async": 0}}


def test_tpu_all_reduce_combiner_snippets() -> None:
    """4 weight gradients [256, 256] f32: one all-reduce with 4 operands; without the combiner, 4 all-reduces."""
    _, combined = _tpu("dp4_f32_v5e_8.txt")
    _, split = _tpu("dp4_f32_no_combiner_v5e_8.txt")
    (ar,) = combined.collectives
    assert ar.operands == 4 and ar.operand_bytes == 4 * 256 * 256 * 4 and combined.count("all-reduce") == 1
    assert split.count("all-reduce") == 4 and [c.operands for c in split.collectives] == [1, 1, 1, 1]
    assert split.bytes("all-reduce") == combined.bytes("all-reduce")
    assert combined.summary()["all-reduce"]["operands"] == split.summary()["all-reduce"]["operands"] == 4


def test_tpu_async_collective_fusion_counted_once() -> None:
    """ZeRO-3 step: the async all-gather is printed 3 times (start / continuation / done fusions, one channel)."""
    text, m = _tpu("zero3_f32_v5e_8.txt")
    assert len(re.findall(r"= \S+ all-gather\(", text)) == 4  # 3 clones of channel 3 + one sync all-gather
    assert m.count("all-gather") == 2
    fused = next(c for c in m.collectives if c.form == "async-collective-fusion")
    sync = next(c for c in m.collectives if c.op == "all-gather" and c.form == "sync")
    assert fused.clones == 3 and fused.async_ and fused.channel_id == 3 and not sync.async_
    assert (fused.start, fused.done) == ("async-collective-start", "async-collective-done")
    assert fused.computation == sync.computation == m.entry
    # a [32, 256] shard per chip gathered to [256, 256], in bf16 although the weights are f32 (default precision)
    for c in (fused, sync):
        assert c.dtype == "bf16" and c.operand_bytes == 32 * 256 * 2 and c.result_bytes == 256 * 256 * 2
    (window,) = m.async_windows()
    assert window.collective is fused and window.compute  # the continuation fusion holds a convolution
    assert all(m.computations[m.entry].index(fused.start) < m.computations[m.entry].index(n)
               < m.computations[m.entry].index(fused.done) for n in window.between)


def test_tpu_all_reduce_scatter_fusion_is_a_reduce_scatter() -> None:
    """ZeRO-3 gradients: 2 x [256, 256] f32 reduced and scattered to 2 x [32, 256] by one kCustom fusion."""
    _, m = _tpu("zero3_f32_v5e_8.txt")
    (rs,) = (c for c in m.collectives if c.op == "reduce-scatter")
    assert m.count("all-reduce") == 0 and rs.form == "all-reduce-scatter-fusion" and rs.operands == 2
    assert rs.operand_bytes == 2 * 256 * 256 * 4 and rs.result_bytes == 2 * 32 * 256 * 4 and rs.group_size == 8
    assert not rs.feeds_dynamic_slice  # already counted as the reduce-scatter it is


def test_tpu_native_reduce_scatter() -> None:
    """JAX psum_scatter of f32[256, 256] over 8 chips: the reduce-scatter instruction itself."""
    _, m = _tpu("jax_reduce_scatter_f32_v5e_8.txt")
    (rs,) = m.collectives
    assert (rs.op, rs.form, rs.group_size) == ("reduce-scatter", "sync", 8)
    assert rs.operand_bytes == 256 * 256 * 4 and rs.result_bytes == 32 * 256 * 4


def test_tpu_collective_permute_start_done() -> None:
    """roll of sharded rows: 3 collective-permute-start/done pairs; the start tuple's u32 context scalars are
    not payload (result bytes = operand bytes)."""
    _, m = _tpu("roll_f32_v5e_8.txt")
    cps = [c for c in m.collectives if c.op == "collective-permute"]
    assert len(cps) == 3 and all(c.form == "start-done" and c.async_ for c in cps)
    assert all(c.operand_bytes == c.result_bytes and c.done.startswith("collective-permute-done") for c in cps)
    assert sorted(c.shape[0] for c in cps) == [(1, 256), (7, 256), (16, 256)]
    assert {w.collective.name for w in m.async_windows()} == {c.name for c in cps}
    assert not any(c.decomposed_all_reduce for c in m.collectives)


def test_tpu_all_gather_plus_reduce_over_size_one_dim_is_not_an_all_reduce() -> None:
    """Without output propagation: `all-gather` [1,1,256] -> [4,1,256] (dim 0), then reduce over dim 1 (size 1):
    a plain all-gather, so it is not flagged as a decomposed all-reduce."""
    text, m = _tpu("mlp_bf16_no_output_propagation_v5e_8.txt")
    assert "to_apply=%all-gather.3.reduce_sub_computation" in text
    ag3 = next(c for c in m.collectives if c.name == "all-gather.3")
    assert ag3.shape == [(4, 1, 256)] and ag3.group_size == 4 and not ag3.decomposed_all_reduce
    assert m.count("all-gather") == 2 and m.count("all-reduce") == 1


def test_tpu_scan_collectives_in_while_bodies() -> None:
    """2 scanned blocks, mesh (fsdp 2, tensor 4), W_up [H_fsdp, F_tensor], W_down [F_tensor, H_fsdp] with H 256,
    F 1024, x [B 4 over fsdp, S 16, H]: every collective sits in the forward or backward while body."""
    _, m = _tpu("scan_fsdp2_tp4_f32_v5e_8.txt")
    fwd, bwd = (w.body for w in m.while_loops)
    assert all(c.in_while for c in m.collectives) and m.count("any", in_while=False) == 0
    by_body = {b: sorted((c.op, c.form) for c in m.collectives if c.computation == b) for b in (fwd, bwd)}
    assert by_body[fwd] == [("all-gather", "async-collective-fusion"), ("all-gather", "sync"), ("all-reduce", "sync")]
    assert by_body[bwd] == [("all-gather", "async-collective-fusion"), ("all-gather", "async-collective-fusion"),
                            ("all-reduce", "sync"), ("reduce-scatter", "all-reduce-scatter-fusion")]
    for ag in (c for c in m.collectives if c.op == "all-gather"):  # a weight shard [128, 256] over fsdp, in bf16
        assert ag.group_size == 2 and ag.operand_bytes == 128 * 256 * 2 and ag.result_bytes == 256 * 256 * 2
    for ar in (c for c in m.collectives if c.op == "all-reduce"):  # Megatron's activation sum over tensor
        assert ar.group_size == 4 and ar.dtype == "f32" and ar.operand_bytes == 2 * 16 * 256 * 4
    (rs,) = (c for c in m.collectives if c.op == "reduce-scatter")  # both layer gradients over fsdp, f32
    assert rs.operands == 2 and rs.group_size == 2 and sorted(rs.shape) == [(128, 256), (256, 128)]
    assert rs.operand_bytes == 2 * 256 * 256 * 4 and rs.result_bytes == 2 * 128 * 256 * 4
    assert {w.computation for w in m.async_windows()} == {fwd, bwd}


ASYNC_TEXT = """HloModule hand_written_async, is_scheduled=true, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%rs_computation (p: f32[64,128]) -> f32[16,128] {
  %p = f32[64,128]{1,0} parameter(0)
  ROOT %rs = f32[16,128]{1,0} reduce-scatter(%p), channel_id=5, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}

%gather_body (s: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %s = (s32[], f32[8,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %w = f32[8,32]{1,0} get-tuple-element(%s), index=1
  %f = f32[32,32]{1,0:T(8,128)} fusion(%w), kind=kLoop, calls=%fused_gather
  %sl = f32[8,32]{1,0} slice(%f), slice={[0:8], [0:32]}
  ROOT %t = (s32[], f32[8,32]{1,0}) tuple(%i, %sl)
}

%fused_gather (q: f32[8,32]) -> f32[32,32] {
  %q = f32[8,32]{1,0} parameter(0)
  ROOT %ag.in = f32[32,32]{1,0} all-gather(%q), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}
}

%cond (c: (s32[], f32[8,32])) -> pred[] {
  %c = (s32[], f32[8,32]{1,0}) parameter(0)
  ROOT %true = pred[] constant(true)
}

ENTRY %e (a: f32[64,128], b: f32[16], g: f32[2,16]) -> (f32[16,128], f32[64,128], f32[16], f32[4,16]) {
  %a = f32[64,128]{1,0} parameter(0)
  %b = f32[16]{0} parameter(1)
  %g = f32[2,16]{1,0} parameter(2)
  %ars = (f32[64,128]{1,0}, f32[16]{0}) all-reduce-start(%a, %b), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %rs-start = ((f32[64,128]{1,0}), f32[16,128]{1,0}, s32[]) async-start(%a), calls=%rs_computation
  %busy = f32[64,128]{1,0} multiply(%a, %a)
  %dot = f32[64,64]{1,0} dot(%busy, %busy), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %rs-done = f32[16,128]{1,0} async-done(%rs-start), calls=%rs_computation
  %ard = (f32[64,128]{1,0}, f32[16]{0}) all-reduce-done(%ars)
  %ag = f32[4,2,16]{2,1,0} all-gather(%g), channel_id=9, replica_groups={{0,1,2,3}}, dimensions={0}
  %zero = f32[] constant(0)
  %summed = f32[2,16]{1,0} reduce(%ag, %zero), dimensions={0}, to_apply=%add
  %init = (s32[], f32[8,32]{1,0}) tuple(%zero, %zero)
  %loop = (s32[], f32[8,32]{1,0}) while(%init), condition=%cond, body=%gather_body
  %a0 = f32[64,128]{1,0} get-tuple-element(%ard), index=0
  %b0 = f32[16]{0} get-tuple-element(%ard), index=1
  ROOT %out = (f32[16,128]{1,0}, f32[64,128]{1,0}, f32[16]{0}, f32[2,16]{1,0}) tuple(%rs-done, %a0, %b0, %summed)
}
"""


def test_async_forms_hand_written() -> None:
    """Forms this compiler did not emit for our graphs but XLA prints: a tuple all-reduce-start/done (k=2), an
    async-start wrapping a reduce-scatter, an all-gather summed over its gathered dim (an all-reduce in
    disguise), and an all-gather inside a fusion inside a while body."""
    m = parse_hlo(ASYNC_TEXT)
    assert m.count("all-reduce") == 1 and m.count("reduce-scatter") == 1 and m.count("all-gather") == 2
    ar = next(c for c in m.collectives if c.op == "all-reduce")
    assert (ar.operands, ar.form, ar.async_, ar.done) == (2, "start-done", True, "ard")
    assert ar.operand_bytes == ar.result_bytes == (64 * 128 + 16) * 4
    rs = next(c for c in m.collectives if c.op == "reduce-scatter")
    assert (rs.form, rs.start, rs.done, rs.computation) == ("async-start", "rs-start", "rs-done", "e")
    assert rs.operand_bytes == 64 * 128 * 4 and rs.result_bytes == 16 * 128 * 4 and rs.group_size == 4
    windows = {w.collective.op: w for w in m.async_windows()}
    assert windows["reduce-scatter"].between == ["busy", "dot"] and windows["reduce-scatter"].compute == ["dot"]
    assert windows["all-reduce"].between == ["rs-start", "busy", "dot", "rs-done"]
    summed = next(c for c in m.collectives if c.name == "ag")
    assert summed.decomposed_all_reduce and not summed.in_while
    looped = next(c for c in m.collectives if c.name == "ag.in")
    assert looped.in_while and looped.computation == "gather_body" and looped.start == "f"
    assert looped.operand_bytes == 8 * 32 * 4 and looped.group_size == 4


LOOP = """HloModule loop, is_scheduled=true, num_partitions=1

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(BOUND)
  ROOT %lt = pred[] compare(CMP), direction=DIR
}

%body (b: (s32[], f32[4])) -> (s32[], f32[4]) {
  %b = (s32[], f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%b), index=0
  %x = f32[4]{0} get-tuple-element(%b), index=1
  %s = s32[] constant(STEP)
  %next = s32[] add(%j, %s)
  %y = f32[4]{0} negate(%x)
  ROOT %t = (s32[], f32[4]{0}) tuple(%next, %y)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %zero = s32[] constant(START)
  %init = (s32[], f32[4]{0}) tuple(%zero, %p)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%bodyCONFIG
  ROOT %out = f32[4]{0} get-tuple-element(%w), index=1
}
"""


@pytest.mark.parametrize(("start", "bound", "step", "form", "trips"), [
    (0, 5, 1, "LT", 5), (1, 5, 1, "LT", 4), (0, 4, 2, "LT", 2), (0, 7, 2, "LT", 4), (0, 5, 1, "GT", 5),
    (6, 5, 1, "LT", 0), (0, 5, 1, "NE", 5), (0, 5, 0, "LT", None),  # a step of 0 never ends: no count
])
def test_trip_count_read_from_the_loop(start: int, bound: int, step: int, form: str, trips: int | None) -> None:
    """Iterations counted by hand from the loop's start, bound and step (a Python range is the oracle)."""
    cmp, direction = ("%n, %i", "GT") if form == "GT" else ("%i, %n", form)
    text = (LOOP.replace("START", str(start)).replace("BOUND", str(bound)).replace("STEP", str(step))
            .replace("CMP", cmp).replace("DIR", direction).replace("CONFIG", ""))
    m = parse_hlo(text)
    assert m.trip_count("w") == trips
    if trips is not None:
        assert trips == len(range(start, bound, step)) if form != "NE" else trips == bound - start
    assert m.runs("body") == trips and m.runs("main") == 1


def test_trip_count_of_a_data_dependent_loop_is_unknown() -> None:
    text = (LOOP.replace("START", "0").replace("BOUND", "5").replace("STEP", "1").replace("CONFIG", "")
            .replace("%n = s32[] constant(5)", "%x = f32[4]{0} get-tuple-element(%c), index=1\n"
                     "  %r = f32[] reduce(%x, %x), dimensions={0}, to_apply=%body\n  %n = s32[] convert(%r)")
            .replace("CMP", "%i, %n").replace("DIR", "LT"))
    m = parse_hlo(text)
    assert m.trip_count("w") is None and m.runs("body") is None


def test_trip_count_from_backend_config_wins() -> None:
    text = (LOOP.replace("START", "0").replace("BOUND", "5").replace("STEP", "1").replace("CMP", "%i, %n")
            .replace("DIR", "LT").replace("CONFIG", ', backend_config={"known_trip_count":{"n":"3"}}'))
    assert parse_hlo(text).trip_count("w") == 3
    with pytest.raises(ValueError, match="not a while"):
        parse_hlo(text).trip_count("init")


def test_tpu_scan_loops_run_once_per_layer() -> None:
    """torch_xla's scan over 2 layers: the forward and the backward while loop each run 2 times."""
    _, m = _tpu("scan_fsdp2_tp4_f32_v5e_8.txt")
    assert [m.trip_count(w.name) for w in m.while_loops] == [2, 2]
    assert {m.runs(c.computation) for c in m.collectives} == {2}


def test_tpu_windowed_einsum_loops() -> None:
    """Notebook 08's FSDP step (4 layers of [2048, 2048] bf16, batch 8192 over 8 chips): each weight gradient's
    matmul and reduce-scatter become a loop of collective-permutes; every loop covers the 8 row chunks of the
    gradient, 2 matmul fusions of 2 chunks each per iteration -> 2 iterations."""
    _, m = _tpu("fsdp4_windowed_bf16_v5e_8.txt")
    loops = m.while_loops
    assert len(loops) == 4 and all("windowed_dot_general" in w.body for w in loops)
    assert [m.trip_count(w.name) for w in loops] == [2, 2, 2, 2]
    permutes = [c for c in m.collectives if c.op == "collective-permute" and c.in_while]
    assert permutes and {m.runs(c.computation) for c in permutes} == {2}


def test_cpu_tuple_all_to_all_is_one_collective() -> None:
    """XLA:CPU writes an all-to-all as a tuple, one [2, 8] chunk per destination of 4: ONE all-to-all of
    4 × 2 × 8 × 4 = 256 bytes, not 4 combined; with `dimensions=` the array form is one operand anyway."""
    text = """HloModule m, num_partitions=4
ENTRY %main (p: f32[8,8]) -> (f32[2,8], f32[2,8], f32[2,8], f32[2,8]) {
  %p = f32[8,8]{1,0} parameter(0)
  %a = f32[2,8]{1,0} slice(%p), slice={[0:2], [0:8]}
  %b = f32[2,8]{1,0} slice(%p), slice={[2:4], [0:8]}
  %c = f32[2,8]{1,0} slice(%p), slice={[4:6], [0:8]}
  %d = f32[2,8]{1,0} slice(%p), slice={[6:8], [0:8]}
  ROOT %x = (f32[2,8]{1,0}, f32[2,8]{1,0}, f32[2,8]{1,0}, f32[2,8]{1,0}) all-to-all(%a, %b, %c, %d), channel_id=1, replica_groups={{0,1,2,3}}
}"""
    (c,) = parse_hlo(text).collectives
    assert (c.op, c.operands, c.operand_bytes) == ("all-to-all", 1, 256)
