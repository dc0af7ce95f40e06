"""The combining views: the formula worked out by hand; XLA:CPU (no combiner) against the formula; XLA:TPU with
its combiner passes on and off against the formula's logical count (skipped without the TPU compile module)."""

from __future__ import annotations

import importlib.util

import pytest

from shardlab.levers import programs as P
from shardlab.levers import views as LV

SMALL = dict(layers=3, batch=16, hidden=16)
HAS_TPU = importlib.util.find_spec("shardlab.profile.tpu") is not None


def test_formula_by_hand() -> None:
    dp = LV.formula(P.StepConfig("dp", **SMALL), 8)
    # 3 gradients of 16·16 float32 = 1024 B each, + the 4-byte loss: 4 all-reduces, 3·1024 + 4 = 3076 bytes
    assert (dp["all_reduce.count"], dp["all_reduce.bytes"], dp["all_reduce.elements"]) == (4, 3076, 769)
    fs = LV.formula(P.StepConfig("fsdp", **SMALL), 8)
    # all-gather payload = the [16/8, 16] shard: 128 B each; reduce-scatter payload = the full 1024 B gradient
    assert (fs["all_gather.count"], fs["all_gather.bytes"]) == (3, 384)
    assert (fs["reduce_scatter.count"], fs["reduce_scatter.bytes"]) == (3, 3072)
    assert (fs["all_reduce.count"], fs["all_reduce.bytes"]) == (1, 4)
    one = LV.formula(P.StepConfig("fsdp", **SMALL), 1)  # nothing sharded: no collective at all
    assert all(v == 0 for v in one.values.values())


def test_step_config_rules() -> None:
    with pytest.raises(ValueError, match="batch=10 is not divisible by the 8 devices"):
        P.StepConfig("dp", batch=10).validate(8)
    with pytest.raises(ValueError, match="hidden=12 is not divisible by the 8 devices"):
        P.StepConfig("fsdp", hidden=12).validate(8)
    with pytest.raises(ValueError, match="mode='tp' must be one of"):
        P.StepConfig("tp").validate(8)


@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_cpu_compiler_has_no_combiner(xla_world, mode: str) -> None:  # type: ignore[no-untyped-def]
    cfg = P.StepConfig(mode, **SMALL)
    f, h = LV.formula(cfg, xla_world.num_devices), LV.compiler(cfg)
    for op in LV.ops(cfg):
        assert h[f"{op}.count"] == f[f"{op}.count"], op
        assert h[f"{op}.elements"] == f[f"{op}.elements"], op


@pytest.mark.skipif(not HAS_TPU, reason="needs shardlab.profile.tpu (the compile-only TPU view)")
@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_tpu_combiner_on_and_off(xla_world, mode: str) -> None:  # type: ignore[no-untyped-def]
    cfg = P.StepConfig(mode, **SMALL)
    f = LV.formula(cfg, xla_world.num_devices)
    on, off = LV.tpu(cfg, combiners=True), LV.tpu(cfg, combiners=False)
    assert on["reductions"] == f["reductions"] == off["reductions.combiner_off"]  # every reduction is carried
    assert on["operands"] == off["operands.combiner_off"]  # combining keeps every operand ...
    assert on["instructions"] < off["instructions.combiner_off"]  # ... in fewer instructions
    assert off["instructions.combiner_off"] == off["operands.combiner_off"]  # no tuples without the passes
    if mode == "dp":  # the verified fact the notebook rests on: one tuple all-reduce of L + 1 operands
        assert (on["all_reduce.count"], on["all_reduce.operands"]) == (1, f["all_reduce.count"])
        assert on["all_reduce.elements"] == f["all_reduce.elements"]


@pytest.mark.skipif(not HAS_TPU, reason="needs shardlab.profile.tpu (the compile-only TPU view)")
def test_pass_names_verified_by_effect(xla_world) -> None:  # type: ignore[no-untyped-def]
    frame, _ = LV.pass_effects(P.StepConfig("dp", **SMALL), passes=("all-reduce-combiner", "no-such-pass"))
    assert bool(frame.loc["all-reduce-combiner", "changes the program"])  # the real pass
    assert not bool(frame.loc["no-such-pass", "changes the program"])  # XLA ignores unknown names silently
