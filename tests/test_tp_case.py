"""The tensor-parallel cases of notebooks 02-04 (attention, transformer layer, embedding,
cross-entropy) on the process-wide 8-device CPU world and the XLA:TPU compiler (compile-only).

Oracles: byte counts by arithmetic in the comments (b·s·h·e per all-reduce; ⌈V/p⌉ columns per padded shard),
the dense modules / torch's cross-entropy (the views' own parity checks must all pass), and a hand-written HLO
module for the array counting. Sizes are small; every TPU compile takes well under a second here.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from shardlab.core import harness
from shardlab.core.views import View, merge
from shardlab.profile import Recorder, parse_hlo
from shardlab.tp import case as tpc
from shardlab.tp.params import AttentionParams, VocabParams

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def world(xla_world):  # type: ignore[no-untyped-def]
    return xla_world


def _checks_pass(*views: View) -> None:
    for v in views:
        bad = {n: d for n, (ok, d) in v.checks.items() if not ok}
        assert not bad, f"{v.source}: {bad}"


def test_written_arrays_and_scores_on_a_handwritten_program() -> None:
    """Aliases (bitcast, tuple, parameters) write nothing; a fusion and a dot each write their array."""
    text = """HloModule m, num_partitions=4
%fused (p: f32[2,1,8,8]) -> f32[2,1,8,8] {
  %p = f32[2,1,8,8]{3,2,1,0} parameter(0)
  ROOT %e = f32[2,1,8,8]{3,2,1,0} exponential(%p)
}
ENTRY %main (a: f32[2,8,16], b: f32[2,8,16]) -> f32[2,8,8] {
  %a = f32[2,8,16]{2,1,0} parameter(0)
  %b = f32[2,8,16]{2,1,0} parameter(1)
  %dot = f32[2,8,8]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0},
    rhs_contracting_dims={2}
  %bc = f32[2,1,8,8]{3,2,1,0} bitcast(%dot)
  %f = f32[2,1,8,8]{3,2,1,0} fusion(%bc), kind=kLoop, calls=%fused
  %q = f32[2,8,16]{2,1,0} add(%a, %b)
  ROOT %r = f32[2,8,8]{2,1,0} bitcast(%f)
}"""
    m = parse_hlo(text)
    assert [(op, a.dims) for op, a in tpc.written_arrays(m)] == [("dot", (2, 8, 8)), ("fusion", (2, 1, 8, 8)),
                                                                  ("add", (2, 8, 16))]
    cfg = tpc.AttentionCase(AttentionParams(tp=4, batch=2, seq=8, hidden=64, heads=4))  # local scores [2, 1, 8, 8]
    assert [op for op, _ in cfg.score_arrays(m)] == ["dot", "fusion"]


def test_attention_views(world) -> None:  # type: ignore[no-untyped-def]
    act = 1 * 8 * 16 * 4  # one float32 [b, s, h] activation
    for backward, n in ((False, 1), (True, 2)):
        cfg = tpc.AttentionCase(AttentionParams(tp=2, batch=1, seq=8, hidden=16, heads=4), backward)  # head dim 4
        f, led, hlo, tpu = harness.views(cfg)
        _checks_pass(led, hlo, tpu)
        ph = cfg.phase
        for v in (f, led, hlo, tpu):
            assert v[f"{ph}.all_reduce.bytes"] == n * act, v.source
        for v in (f, led, hlo, tpu):  # the loss depends on the output: g and f stay two all-reduces, also on TPU
            assert v[f"{ph}.all_reduce.count"] == n
        assert "hlo.no_all_gather" in hlo.checks and "tpu.scores_stay_local" in tpu.checks
        assert ("parity.ledger.grad_weights" in led.checks) == backward
        assert hlo[f"{ph}.scores.arrays"] >= 1 and tpu[f"{ph}.scores.arrays"] >= 1
        assert f"{ph}.scores.arrays" in hlo.differs and f"{ph}.scores.arrays" in tpu.differs


def test_attention_scores_not_counted_when_head_dim_equals_seq(world) -> None:  # type: ignore[no-untyped-def]
    cfg = tpc.AttentionCase(AttentionParams(tp=2, batch=1, seq=4, hidden=16, heads=4), backward=False)  # hd 4 = s
    hlo = harness.hlo(cfg)
    assert "fwd.scores.arrays" not in hlo.values and any("head_dim = seq" in n for n in hlo.notes)


def test_transformer_layer_views(world) -> None:  # type: ignore[no-untyped-def]
    cfg = tpc.LayerCase(AttentionParams(tp=4, batch=2, seq=4, hidden=32, heads=4, ffn=64))
    f, led, hlo, tpu = harness.views(cfg)
    _checks_pass(led, hlo, tpu)
    act = 2 * 4 * 32 * 4
    for v in (f, led, hlo, tpu):  # 2 forward (g after attention, g after the MLP) + 2 backward (their f)
        assert (v["fwd_bwd.all_reduce.count"], v["fwd_bwd.all_reduce.bytes"]) == (4, 4 * act)
    assert all(c.operands == 1 and c.form == "sync" for c in tpu.detail.module.collectives)  # one by one


def test_attention_three_projections_and_annotations(world) -> None:  # type: ignore[no-untyped-def]
    """Three separate Q/K/V projections: XLA:CPU all-reduces each one's input gradient (1 g + 3 f, recorded as
    differing), XLA:TPU adds them first (1 + 1); the per-rank code's one f gives 2. Annotations given by name
    compile like Megatron's layout when they are Megatron's layout."""
    p = AttentionParams(tp=4, batch=2, seq=8, hidden=64, heads=4)
    f, led, hlo, tpu = harness.views(tpc.AttentionCase(p, separate_qkv=True))
    _checks_pass(led, hlo, tpu)
    assert f["fwd_bwd.all_reduce.count"] == led["fwd_bwd.all_reduce.count"] == 2
    assert hlo["fwd_bwd.all_reduce.count"] == 4 and "fwd_bwd.all_reduce.count" in hlo.differs
    assert tpu["fwd_bwd.all_reduce.count"] == 2 and "fwd_bwd.all_reduce.count" not in tpu.differs
    megatron = {"q.weight": ("tensor", None), "k.weight": ("tensor", None), "v.weight": ("tensor", None),
                "out.weight": (None, "tensor")}
    spec = harness.hlo(tpc.AttentionCase(p, specs=megatron))
    assert spec["fwd_bwd.all_reduce.count"] == 2 and spec.checks["hlo.no_all_gather"][0]
    with pytest.raises(ValueError, match="'qkv.weight', which is not a parameter"):
        harness.hlo(tpc.AttentionCase(p, specs={"qkv.weight": ("tensor", None)}))


@pytest.mark.parametrize("smoothing", [False, True])
def test_tied_output_layer(world, smoothing: bool) -> None:  # type: ignore[no-untyped-def]
    """V = 1003 over tp = 4, b·s = 8: forward the embedding's g [b, s, h] and 3 (4) CE sums of [b, s]; backward
    exactly the output layer's f, [b, s, h]; the tied gradient rows == the dense model's (float64)."""
    p = VocabParams(tp=4, batch=2, seq=4, hidden=16, vocab=1003, label_smoothing=0.1)
    f, led = harness.views(tpc.TiedOutputCase(p, smoothing=smoothing), ("formula", "ledger"))
    _checks_pass(led)
    n_ce = 4 if smoothing else 3
    for v in (f, led):
        assert v["fwd_bwd.all_reduce.count"] == 1 + n_ce + 1
        assert v["fwd_bwd.all_reduce.bytes"] == (2 * 8 * 16 + n_ce * 8) * 4
        assert (v["bwd.all_reduce.count"], v["bwd.all_reduce.bytes"]) == (1, 8 * 16 * 4)


@pytest.mark.parametrize("backward", [False, True])
def test_embedding_views_uneven_vocab(world, backward: bool) -> None:  # type: ignore[no-untyped-def]
    cfg = tpc.EmbeddingCase(VocabParams(tp=4, batch=2, seq=4, hidden=16, vocab=1003), backward)  # 251/251/251/250
    views = harness.views(cfg)
    _checks_pass(*views)
    for v in views:  # one all-reduce of [b, s, h] f32, whatever the backward
        assert (v[f"{cfg.phase}.all_reduce.count"], v[f"{cfg.phase}.all_reduce.bytes"]) == (1, 2 * 4 * 16 * 4)
    if backward:
        assert views[1].checks["ledger.no_backward_collectives"][0]
        assert "parity.hlo.grad_weight" in views[2].checks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_views_uneven_vocab(world, dtype: str) -> None:  # type: ignore[no-untyped-def]
    """V = 1003 over tp = 4: shards of 251 columns (padded); b·s = 4 tokens."""
    e = 4 if dtype == "float32" else 2
    p = VocabParams(tp=4, batch=1, seq=4, vocab=1003, dtype=dtype)
    views = {key: harness.views(c) for key, c in tpc.ce_cases(p).items()}
    for vs in views.values():
        _checks_pass(*vs)
    for v in views["vocab_parallel"]:  # max, target logit, sum of exp: 3 all-reduces of [b, s]
        assert v["vocab_parallel.elements"] == 3 * 4
        assert v.get("vocab_parallel.operands", v["vocab_parallel.count"]) == 3
        if "vocab_parallel.bytes" not in v.differs:
            assert v["vocab_parallel.bytes"] == 3 * 4 * e
            assert v["vocab_parallel.wire_bytes"] == pytest.approx(3 * 4 * e * 2 * 3 / 4)  # 2 (p-1)/p
    for v in views["gather_logits"]:  # one all-gather of the padded shard [b, s, 251]
        assert (v["gather_logits.count"], v["gather_logits.elements"]) == (1, 4 * 251)
    for v in views["vocab_parallel"][2:]:  # compiled programs: the largest array is a shard, or the gathered logits
        assert v["vocab_parallel.largest_array.elements"] == 4 * 251
    for v in views["gather_logits"][2:]:
        assert v["gather_logits.largest_array.elements"] == 4 * 4 * 251
    table = tpc.ce_table_views(views["vocab_parallel"], views["gather_logits"], p)
    assert [v.source for v in table] == ["formula", "ledger", "hlo", "tpu"]
    for v in table:  # wire: 3 shards of 251 over 3 * 2 * 3/4 values = 4 * 251 / 6; payload 251 / 3
        assert v["saving_ratio"] == pytest.approx(4 * 251 / 6, rel=1e-12)
        assert v["payload_ratio"] == pytest.approx(251 / 3, rel=1e-12)


def test_cross_entropy_label_smoothing_and_placeholders(world) -> None:  # type: ignore[no-untyped-def]
    s = tpc.CrossEntropyCase(VocabParams(tp=4, batch=1, seq=4, vocab=1003, label_smoothing=0.1), smoothing=True)
    f, led = harness.formula(s), harness.ledger(s)
    _checks_pass(led)
    assert s.key == "vocab_parallel_smoothing"
    assert f["vocab_parallel_smoothing.count"] == led["vocab_parallel_smoothing.count"] == 4  # + sum of logits
    ph = dataclasses.replace(s, placeholders=True)
    assert not harness.ledger(ph).ran and not harness.hlo(ph).ran
    with pytest.raises(ValueError, match="method='mean' is not one of"):
        tpc.CrossEntropyCase(VocabParams(), method="mean")


def test_tpu_memory_of_the_gathered_logits(world) -> None:  # type: ignore[no-untyped-def]
    """512 tokens of V = 50257 in f32 over 8 chips: the gathered logits [512, 8 * 6283] are 102,940,672 bytes per
    chip, more than the on-chip memory holds: the TPU reports at least that much HBM temporary for the gathered
    loss, and less than one logits shard (512 * 6283 * 4 bytes) for the vocab-parallel loss."""
    p = VocabParams(tp=8, batch=1, seq=512, vocab=50257)
    out = {m: harness.tpu(tpc.CrossEntropyCase(p, method=m, backward=False)).detail for m in tpc.CE_METHODS}
    assert out["gather"].memory.temp >= 512 * 8 * 6283 * 4
    assert out["vocab_parallel"].memory.temp < 512 * 6283 * 4


def test_record_compile_s_and_merge() -> None:
    rec = Recorder("t")
    hlo = View("hlo", detail=SimpleNamespace(metrics=SimpleNamespace(compile_s=1.5), cached=False))
    tpu = View("tpu", detail=SimpleNamespace(fits=True, compile_s=0.25, cached=False))
    got = harness.record_compile_s(rec, "x.compile_s", hlo, tpu, View.skip("tpu", "no"))
    assert got == {"metrics": 1.5, "tpu": 0.25}
    assert {m["source"]: m["value"] for m in rec.data["measurements"]} == {"metrics": 1.5, "tpu": 0.25}
    assert all(m["kind"] == "timing" for m in rec.data["measurements"])
    # a view of two programs (FSDP's forward and backward graphs): their seconds summed, by hand 0.5 + 0.75
    parts = [SimpleNamespace(compile_s=0.5, cached=False), SimpleNamespace(compile_s=0.75)]
    two = View("tpu", detail=parts[-1], parts=parts)
    assert harness.record_compile_s(Recorder("u"), "y.compile_s", two) == {"tpu": 1.25}
    # a compile served from a cache measured nothing: no timing, a note instead
    r = Recorder("v")
    cached = View("tpu", detail=SimpleNamespace(compile_s=9.0, cached=True))
    assert harness.record_compile_s(r, "z.compile_s", cached) == {} and r.data["notes"]
    # one served from the committed store: the seconds its compile took when it was stored
    stored = View("tpu", detail=SimpleNamespace(compile_s=2.5, cached=True, stored=True))
    assert harness.record_compile_s(Recorder("w"), "s.compile_s", stored) == {"tpu": 2.5}
    with pytest.raises(ValueError, match="one source"):
        merge(View("hlo"), View("tpu"))
    with pytest.raises(ValueError, match=r"both have \['a'\]"):
        merge(View("hlo", {"a": 1}), View("hlo", {"a": 2}))
