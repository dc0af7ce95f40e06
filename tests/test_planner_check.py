"""The planner's validation views (shardlab.planner_check): formulas against hand arithmetic, the CPU and TPU
compiler views against the formulas on a (replica 2, world 4) mesh of the session's 8 devices, and the skips.

Oracles: Megatron-LM (Shoeybi et al. 2019) — a layer issues 2 all-reduces forward and 2 backward, each of the
[b, s, h] activation; data parallelism all-reduces every weight gradient once; ZeRO — per-device parameters Ψ
(stage 0) and Ψ/N (stage 3); PyTorch FSDP — a flat unit pads its numel to a multiple of the world size, a
non-root unit is all-gathered in forward and again in backward, the root unit once. Ring model: all-reduce
2(W-1)/W, all-gather (W-1), reduce-scatter (W-1)/W times the payload.
"""

from __future__ import annotations

import pytest

from shardlab import planner_check as pc
from shardlab.views import compare

SMALL = pc.CheckConfig(world=4, tokens=16, hidden=32, ffn=64, heads=4)


def test_formulas_by_hand() -> None:
    # layer: 4 all-reduces of [1, 16, 32] fp32 = 2048 B each; wire 4 · 2·3/4 · 2048
    layer = pc.layer_formula(SMALL)
    assert (layer["fwd_bwd.all_reduce.count"], layer["fwd_bwd.all_reduce.bytes"]) == (4, 4 * 2048)
    assert layer["fwd_bwd.all_reduce.wire_bytes"] == 4 * 1.5 * 2048
    # dp: gradients of A [32, 64] and B [64, 32] in fp32; parameters: x's [16/4, 32] shard + both matrices
    dp = pc.dp_formula(SMALL)
    assert (dp["fwd_bwd.all_reduce.count"], dp["fwd_bwd.all_reduce.bytes"]) == (2, 2 * 32 * 64 * 4)
    assert dp["param.bytes"] == 4 * 32 * 4 + 2 * 32 * 64 * 4
    assert pc.fsdp_formula(SMALL)["param.bytes"] == 4 * 32 * 4 + 2 * 32 * 64 * 4 // 4
    # units: inner Linear(32, 64) = 2048 + 64 = 2112 (= 4 · 528); root Linear(64, 33) = 2112 + 33 = 2145 -> 2148
    units = pc.units_formula(SMALL)
    assert units["fwd_bwd.all_gather.count"] == 2 + 1  # inner: forward + backward; root: forward only
    assert units["fwd_bwd.all_gather.bytes"] == (2 * 528 + 537) * 4
    assert units["fwd_bwd.reduce_scatter.bytes"] == (2112 + 2148) * 4
    assert units["fwd_bwd.wire_bytes"] == 3 * (2 * 528 + 537) * 4 + 3 / 4 * (2112 + 2148) * 4
    assert units["model_state.bytes"] == (528 + 537) * 16  # fp32 param + grad + Adam's two moments per element


def test_one_rank_communicates_nothing() -> None:
    one = pc.CheckConfig(world=1, tokens=16, hidden=32, ffn=64, heads=4)
    assert pc.layer_term(one) is None
    for view in (pc.layer_formula(one), pc.dp_formula(one)):
        assert view["fwd_bwd.all_reduce.count"] == 0 and view["fwd_bwd.all_reduce.bytes"] == 0
    units = pc.units_formula(one)
    assert units["fwd_bwd.all_gather.count"] == units["fwd_bwd.reduce_scatter.count"] == 0


def test_the_mlp_is_notebook_02s_config() -> None:
    m = pc.mlp(SMALL)
    assert (m.tp, m.batch, m.seq, m.hidden, m.ffn, m.dtype, m.backward) == (4, 1, 16, 32, 64, "float32", True)


def _agree(*views) -> None:  # type: ignore[no-untyped-def]
    for v in views:
        assert v.ran, v.skipped
        assert all(ok for ok, _ in v.checks.values()), v.checks
    rows = compare(views)
    assert rows and all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]


@pytest.mark.xla
def test_compilers_agree_with_the_formulas(xla_world) -> None:  # type: ignore[no-untyped-def]
    # world 4 on the session's 8 devices: mesh (replica 2, world 4), collectives in groups of 4
    _agree(pc.layer_formula(SMALL), pc.layer_compiler(SMALL), pc.layer_tpu(SMALL))
    dp = (pc.dp_formula(SMALL), pc.dp_compiler(SMALL), pc.dp_tpu(SMALL))
    _agree(*dp)
    # XLA:TPU combines the two independent gradient all-reduces into one tuple instruction of 2 operands
    assert dp[2]["fwd_bwd.all_reduce.count"] == 1 and dp[2]["fwd_bwd.all_reduce.operands"] == 2
    _agree(pc.fsdp_formula(SMALL), pc.fsdp_compiler(SMALL))
    tpu = pc.fsdp_tpu(SMALL)
    frame = pc.collectives_frame({"tpu": tpu})
    assert set(frame["group"]) == {4} and "all-gather" in set(frame["op"])
    _agree(pc.units_formula(SMALL), pc.units_ledger(SMALL))


@pytest.mark.xla
def test_views_skip_with_the_reason(xla_world) -> None:  # type: ignore[no-untyped-def]
    big = pc.CheckConfig(world=16, tokens=16, hidden=32, ffn=64, heads=16)
    assert "needs val_world=16 devices; this process has num_devices=8" in pc.layer_compiler(big).skipped
    odd = pc.CheckConfig(world=3, tokens=3, hidden=12, ffn=6, heads=3)
    assert "val_world=3 does not tile num_devices=8" in pc.dp_compiler(odd).skipped
    assert "no 'v5e' topology with num_chips=3" in pc.dp_tpu(odd).skipped  # no 3-chip slice exists
