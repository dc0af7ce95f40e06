"""The lever cases: the combining formula worked out by hand; XLA:CPU (no combiner) against the formula; XLA:TPU with
its combiner passes on and off against the formula's logical count; the pass names verified by their effect; the
compile-seconds and weight-update bookkeeping and the tables against sums done here by hand."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from types import SimpleNamespace

import pytest

from shardlab.core import harness
from shardlab.core.views import View
from shardlab.levers import case as L
from shardlab.levers import figures as VL
from shardlab.levers.params import LeversParams
from shardlab.profile.tpu import TpuCompile
from shardlab.profile.tpu_memory import TpuMemory

P_SMALL = LeversParams(layers=3, batch=16, hidden=16)
HAS_TPU = importlib.util.find_spec("libtpu") is not None
needs_tpu = pytest.mark.skipif(not HAS_TPU, reason="needs libtpu (the compile-only TPU view)")


def test_formula_by_hand() -> None:
    dp = L.StepCase(P_SMALL, "dp").formula()
    # 3 gradients of 16·16 float32 = 1024 B each, + the 4-byte loss: 4 all-reduces, 3·1024 + 4 = 3076 bytes
    assert (dp["all_reduce.count"], dp["all_reduce.bytes"], dp["all_reduce.elements"]) == (4, 3076, 769)
    fs = L.StepCase(P_SMALL, "fsdp").formula()
    # all-gather payload = the [16/8, 16] shard: 128 B each; reduce-scatter payload = the full 1024 B gradient
    assert (fs["all_gather.count"], fs["all_gather.bytes"]) == (3, 384)
    assert (fs["reduce_scatter.count"], fs["reduce_scatter.bytes"]) == (3, 3072)
    assert (fs["all_reduce.count"], fs["all_reduce.bytes"]) == (1, 4)
    one = L.StepCase(replace(P_SMALL, num_devices=1), "fsdp").formula()  # nothing sharded: no collective at all
    assert all(v == 0 for v in one.values.values())
    big = L.StepCase(replace(P_SMALL, big_layers=2, overlap_hidden=64, overlap_batch=32), "dp", big=True)
    assert (big.layers, big.hidden, big.batch, big.dtype, big.grad_bytes) == (2, 64, 32, "bfloat16", 64 * 64 * 2)


def test_effect_passes_follow_the_collectives() -> None:
    assert L.effect_passes(L.StepCase(P_SMALL, "dp")) == ("all-reduce-combiner", "no-such-pass")
    assert L.effect_passes(L.StepCase(P_SMALL, "fsdp")) == (*L.COMBINER_PASSES, "no-such-pass")


def test_step_case_rules() -> None:
    with pytest.raises(ValueError, match="batch=10 is not divisible by the 8 devices"):
        L.StepCase(replace(P_SMALL, batch=10), "dp")
    with pytest.raises(ValueError, match="hidden=12 is not divisible by the 8 devices"):
        L.StepCase(replace(P_SMALL, hidden=12), "fsdp")
    with pytest.raises(ValueError, match="mode='tp' must be one of"):
        L.StepCase(P_SMALL, "tp")
    with pytest.raises(ValueError, match="stage='later' must be one of"):
        L.UpdateCase(P_SMALL, "later")
    assert L.UpdateCase(replace(P_SMALL, big_layers=2, update_hidden=8)).weight_bytes == 2 * 8 * 8 * 2


@pytest.mark.xla
@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_cpu_compiler_has_no_combiner(xla_world, mode: str) -> None:  # type: ignore[no-untyped-def]
    case = L.StepCase(P_SMALL, mode)
    f, h = harness.formula(case), harness.hlo(case)
    for op in case.ops:
        assert h[f"{op}.count"] == f[f"{op}.count"], op
        assert h[f"{op}.elements"] == f[f"{op}.elements"], op
    assert h["reductions"] == f["reductions"] == P_SMALL.layers + 1


@pytest.mark.xla
@needs_tpu
@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_tpu_combiner_on_and_off(xla_world, mode: str) -> None:  # type: ignore[no-untyped-def]
    case = L.StepCase(P_SMALL, mode)
    f, t = case.formula(), L.tpu_on_off(case)
    off = L.OFF
    assert t["reductions"] == f["reductions"] == t["reductions" + off]  # every reduction is carried
    assert t["operands"] == t["operands" + off]  # combining keeps every operand ...
    assert t["instructions"] < t["instructions" + off]  # ... in fewer instructions
    assert t["instructions" + off] == t["operands" + off]  # no tuples without the passes
    assert all(ok for ok, _ in t.checks.values()) and len(t.checks) == 3
    if mode == "dp":  # the verified fact the notebook rests on: one tuple all-reduce of L + 1 operands
        assert (t["all_reduce.count"], t["all_reduce.operands"]) == (1, f["all_reduce.count"])
        assert t["all_reduce.elements"] == f["all_reduce.elements"]
        summary = VL.combining_summary({"formula": f, "tpu": t}).set_index("collective")
        assert summary.loc["all-reduce", "XLA:TPU"] == f"1 (carrying {f['all_reduce.count']})"
        assert summary.loc["all-reduce", "XLA:TPU combiners off"] == str(f["all_reduce.count"])


@pytest.mark.xla
@needs_tpu
def test_pass_names_verified_by_effect(xla_world) -> None:  # type: ignore[no-untyped-def]
    frame, views = L.pass_effects(L.StepCase(P_SMALL, "dp"), passes=("all-reduce-combiner", "no-such-pass"))
    assert len(views) == 3
    assert bool(frame.loc["all-reduce-combiner", "changes the program"])  # the real pass
    assert not bool(frame.loc["no-such-pass", "changes the program"])  # XLA ignores unknown names silently


def _compile(seconds: float, cached: bool, memory: TpuMemory | None = None) -> TpuCompile:
    return TpuCompile("v5e-8", 8, True, seconds, None, None, memory, None, cached=cached)


def test_compile_seconds_skip_cached_and_formula_views() -> None:
    a, b, c = _compile(1.5, False), _compile(2.0, True), _compile(0.25, False)
    tpu_two = View("tpu", detail=b, parts=[a, b])  # a merged view: two programs
    skipped = View.skip("tpu", "no libtpu")
    got = harness.compile_seconds({"x": {"formula": View("formula", detail={"g": 1}), "tpu": tpu_two}},
                                  ("frame", [View("tpu", detail=c), skipped]), None, c)
    assert got == (1.5 + 0.25 + 0.25, 4)  # b served from the cache adds 0 s; c counted each time it is passed
    stored = TpuCompile("v5e-8", 8, True, 3.0, None, None, None, None, cached=True, stored=True)
    assert harness.compile_seconds([a, stored]) == (1.5 + 3.0, 2)  # the store's: the seconds measured when stored


def test_update_memory_by_hand() -> None:
    def mem(argument: int, output: int, temp: int, alias: int = 0) -> View:
        return View("tpu", detail=SimpleNamespace(memory=TpuMemory(argument, output, temp, alias, 0, None)))

    got = L.update_memory({"fused": mem(100, 90, 7, 80), "backward": mem(50, 60, 5), "update": mem(70, 40, 3)})
    assert got == {"temp": {"fused": 7, "separate": 5},
                   "peak": {"fused": 100 + 90 - 80 + 7, "separate": max(50 + 60 + 5, 70 + 40 + 3)}}


@pytest.mark.xla
@needs_tpu
def test_update_and_toy_compile_replicated(xla_world) -> None:  # type: ignore[no-untyped-def]
    p = replace(P_SMALL, big_layers=2, update_hidden=128, update_batch=16, optimizer="adam", toy_rows=256)
    wu = {s: harness.tpu(L.UpdateCase(p, s)) for s in ("fused", "backward", "update")}
    w = L.UpdateCase(p).weight_bytes  # 2 x [128, 128] bf16
    # the update graph takes weights, gradients and Adam's two moments — 4 x the weights — plus the step's Python
    # scalars, which torch_xla passes as device-data parameters (a few small padded buffers)
    assert 4 * w <= wu["update"].detail.memory.argument < 4 * w + 4096
    assert wu["backward"].detail.memory.output >= w  # the separate backward hands every gradient out
    toy = harness.tpu(L.OrderToyCase(p))
    assert toy.ran and toy.detail.memory is not None and L.OrderToyCase(p).unit_bytes == 256 * 256 * 2
