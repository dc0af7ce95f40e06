"""The planner's validation views (shardlab.planner.check): formulas against hand arithmetic, the CPU and TPU
compiler views against the formulas on a (replica 2, world 4) mesh of the session's 8 devices, and the skips.

Oracles: Megatron-LM (Shoeybi et al. 2019) — a layer issues 2 all-reduces forward and 2 backward, each of the
[b, s, h] activation; data parallelism all-reduces every weight gradient once; ZeRO — per-device parameters Ψ
(stage 0) and Ψ/N (stage 3); PyTorch FSDP — a flat unit pads its numel to a multiple of the world size, a
non-root unit is all-gathered in forward and again in backward, the root unit once. Ring model: all-reduce
2(W-1)/W, all-gather (W-1), reduce-scatter (W-1)/W times the payload.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.core import harness
from shardlab.planner import check as pc
from shardlab.planner.params import PlannerParams

# the validation sizes: T = 16 tokens of width 32, ffn 64, 4 heads, on 4 ranks
SMALL = PlannerParams(val_world=4, val_tokens=16, val_hidden=32, val_ffn=64, val_heads=4)


def test_formulas_by_hand() -> None:
    # layer: 4 all-reduces of [1, 16, 32] fp32 = 2048 B each; wire 4 · 2·3/4 · 2048
    layer = harness.formula(pc.LayerTermCase(pc.tp_params(SMALL)))
    assert (layer["fwd_bwd.all_reduce.count"], layer["fwd_bwd.all_reduce.bytes"]) == (4, 4 * 2048)
    assert layer["fwd_bwd.all_reduce.wire_bytes"] == 4 * 1.5 * 2048
    # dp: gradients of A [32, 64] and B [64, 32] in fp32; parameters: x's and the target's [16/4, 32] shards +
    # both matrices
    dp = harness.formula(pc.DataCase(SMALL))
    assert (dp["fwd_bwd.all_reduce.count"], dp["fwd_bwd.all_reduce.bytes"]) == (2, 2 * 32 * 64 * 4)
    assert dp["param.bytes"] == 2 * 4 * 32 * 4 + 2 * 32 * 64 * 4
    assert harness.formula(pc.DataCase(SMALL, sharded=True))["param.bytes"] == 2 * 4 * 32 * 4 + 2 * 32 * 64 * 4 // 4
    # units: inner Linear(32, 64) = 2048 + 64 = 2112 (= 4 · 528); root Linear(64, 33) = 2112 + 33 = 2145 -> 2148
    units = harness.formula(pc.UnitsCase(SMALL))
    assert units["fwd_bwd.all_gather.count"] == 2 + 1  # inner: forward + backward; root: forward only
    assert units["fwd_bwd.all_gather.bytes"] == (2 * 528 + 537) * 4
    assert units["fwd_bwd.reduce_scatter.bytes"] == (2112 + 2148) * 4
    assert units["fwd_bwd.wire_bytes"] == 3 * (2 * 528 + 537) * 4 + 3 / 4 * (2112 + 2148) * 4
    assert units["model_state.bytes"] == (528 + 537) * 16  # fp32 param + grad + Adam's two moments per element


def test_one_rank_communicates_nothing() -> None:
    one = replace(SMALL, val_world=1)
    assert pc.layer_term(pc.tp_params(one)) is None
    for view in (harness.formula(pc.LayerTermCase(pc.tp_params(one))), harness.formula(pc.DataCase(one))):
        assert view["fwd_bwd.all_reduce.count"] == 0 and view["fwd_bwd.all_reduce.bytes"] == 0
    units = harness.formula(pc.UnitsCase(one))
    assert units["fwd_bwd.all_gather.count"] == units["fwd_bwd.reduce_scatter.count"] == 0


def test_the_tp_parts_are_notebook_02_and_03s_parameters() -> None:
    m = pc.tp_params(SMALL)
    assert (m.tp, m.batch, m.seq, m.hidden, m.ffn, m.heads, m.dtype) == (4, 1, 16, 32, 64, 4, "float32")
    m.validate()  # notebook 03's own rules hold at these sizes


def _agree(*views) -> None:  # type: ignore[no-untyped-def]
    for v in views:
        assert v.ran, v.skipped
        assert all(ok for ok, _ in v.checks.values()), v.checks
    rows = harness.compare(views)
    assert rows and all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]


@pytest.mark.xla
def test_compilers_agree_with_the_formulas(xla_world) -> None:  # type: ignore[no-untyped-def]
    # world 4 on the session's 8 devices: mesh (replica 2, world 4), collectives in groups of 4
    _agree(*harness.views(pc.LayerTermCase(pc.tp_params(SMALL)), ("formula", "hlo", "tpu")))
    dp = harness.views(pc.DataCase(SMALL), ("formula", "hlo", "tpu"))
    _agree(*dp)
    # XLA:TPU combines the two independent gradient all-reduces into one tuple instruction of 2 operands
    assert dp[2]["fwd_bwd.all_reduce.count"] == 1 and dp[2]["fwd_bwd.all_reduce.operands"] == 2
    formula, cpu, tpu = harness.views(pc.DataCase(SMALL, sharded=True), ("formula", "hlo", "tpu"))
    _agree(formula, cpu)
    frame = pc.collectives_frame({"tpu": tpu})
    assert set(frame["group"]) == {4} and "all-gather" in set(frame["op"])
    _agree(*harness.views(pc.UnitsCase(SMALL), ("formula", "ledger")))


@pytest.mark.xla
def test_views_skip_with_the_reason(xla_world) -> None:  # type: ignore[no-untyped-def]
    big = replace(SMALL, val_world=16, val_heads=16)
    assert "needs val_world=16 devices; this process has num_devices=8" in \
        harness.hlo(pc.LayerTermCase(pc.tp_params(big))).skipped
    odd = replace(SMALL, val_world=3, val_tokens=3, val_hidden=12, val_ffn=6, val_heads=3)
    assert "val_world=3 does not tile num_devices=8" in harness.hlo(pc.DataCase(odd)).skipped
    assert "no 'v5e' topology with num_chips=3" in harness.tpu(pc.DataCase(odd), "v5e").skipped  # no 3-chip slice


def test_pipeline_check_arithmetic():
    """The cached pipeline check's planner side by hand: a stage's weights h² fp32; one more microbatch in flight
    on a GPipe stage keeps the tanh layer's input and output (2 [rows, h] fp32), and the SPMD loop one more
    iteration's input-stream and output slots (2 more). The compiler's side: the weight argument is exact and the
    temporaries grow within 5 % of the SPMD figure."""
    pipe, source = pc.load_pipeline()
    msg = pipe.rows * pipe.hidden * 4
    f, c = pipe.formula(), pipe.measured()
    weights, gpipe, spmd = f
    assert (f[weights], f[gpipe], f[spmd]) == (pipe.hidden**2 * 4, 2 * msg, 4 * msg)
    assert c[weights] == f[weights] and abs(c[spmd] / f[spmd] - 1) < 0.05
    assert "tools/scale_full_size.py pipeline" in source["command"]


@pytest.mark.xla
@pytest.mark.slow
def test_pipeline_check_compiles_as_cached(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Compile notebook 09's SPMD GPipe pipeline at the check's sizes (two compiles, ~30 s here) and find the
    cached per-chip bytes exactly (compile-only results are deterministic)."""
    from shardlab.profile import tpu

    tpu.check_backend()
    cached, _ = pc.load_pipeline()
    assert pc.pipeline_check().compiler == cached.compiler
