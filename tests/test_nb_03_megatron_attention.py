"""Notebook 03 through papermill: every in-notebook check must pass (including the graded answer key) at the
defaults and at non-default legal parameter sets; the measurements equal the byte counts worked out here
(b·s·h·e per all-reduce; a transformer layer issues 2 + 2)."""

from __future__ import annotations

import pytest


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


def _skipped(record):  # type: ignore[no-untyped-def]
    return {(s["name"], s["source"]): s["reason"] for s in record["skipped"]}


def _differs(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["differs"] for m in record["measurements"] if m.get("differs")}


@pytest.mark.notebook
def test_notebook_03_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("03_megatron_attention")
    by = _by(record)
    act = 2 * 8 * 64 * 4  # one float32 [b, s, h] activation at the defaults
    for phase, n in (("fwd", 1), ("fwd_bwd", 2)):
        for source in ("formula", "ledger", "hlo", "tpu"):
            assert by[(f"attention.{phase}.all_reduce.bytes", source)] == n * act
            # the loss depends on the output: f waits for g, nothing to combine — separate all-reduces on both
            assert by[(f"attention.{phase}.all_reduce.count", source)] == n
    assert ("attention.fwd_bwd.all_reduce.operands", "tpu") not in by
    for source in ("formula", "ledger", "hlo", "tpu"):
        assert by[("layer.fwd_bwd.all_reduce.bytes", source)] == 4 * act  # 2 + 2 per transformer layer
        assert by[("layer.fwd_bwd.all_reduce.count", source)] == 4
    # three separate projections: XLA:CPU all-reduces each one's input gradient (1 g + 3 f), XLA:TPU adds first
    assert by[("attention.separate_qkv.fwd_bwd.all_reduce.count", "hlo")] == 4
    assert by[("attention.separate_qkv.fwd_bwd.all_reduce.count", "tpu")] == 2
    # the attention core: XLA:TPU fuses more of the softmax chain and writes fewer [b, nh/p, s, s] arrays
    for phase in ("fwd", "fwd_bwd"):
        assert 1 <= by[(f"attention.{phase}.scores.arrays", "tpu")] < by[(f"attention.{phase}.scores.arrays", "hlo")]
    assert ("attention.fwd_bwd.compile_s", "metrics") in by and ("attention.fwd_bwd.compile_s", "tpu") in by


@pytest.mark.notebook
def test_notebook_03_one_device_bf16(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """One device, tp = 2: the CPU compiler view is skipped with a note (never a failed check); formula and
    ledger run at tp = 2 and the TPU view compiles a 2-chip slice in a helper process."""
    record = run_notebook("03_megatron_attention", num_devices=1, tp=2, heads=2, hidden=32, seq=4, batch=1,
                          ffn=64, dtype="bfloat16")
    by, skipped = _by(record), _skipped(record)
    act = 1 * 4 * 32 * 2  # bf16
    assert "num_devices=1" in skipped[("attention", "hlo")]
    assert ("attention.fwd.all_reduce.count", "hlo") not in by
    for source in ("formula", "ledger", "tpu"):
        assert by[("attention.fwd.all_reduce.bytes", source)] == act  # the TPU keeps bf16
        assert by[("layer.fwd_bwd.all_reduce.bytes", source)] == 4 * act


@pytest.mark.notebook
def test_notebook_03_four_devices_tp4_bf16(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """tp = num_devices = 4 with 8 heads (2 per device), bf16: XLA:CPU all-reduces in f32 — its bytes are
    recorded with the reason and the elements are compared instead."""
    record = run_notebook("03_megatron_attention", num_devices=4, tp=4, heads=8, hidden=64, seq=16, batch=1,
                          ffn=128, dtype="bfloat16")
    by, differs = _by(record), _differs(record)
    elements = 1 * 16 * 64
    for source in ("formula", "ledger", "hlo", "tpu"):
        assert by[("attention.fwd_bwd.all_reduce.elements", source)] == 2 * elements
    assert by[("attention.fwd_bwd.all_reduce.bytes", "hlo")] == 2 * elements * 4  # f32 on XLA:CPU
    assert by[("attention.fwd_bwd.all_reduce.bytes", "tpu")] == 2 * elements * 2  # bf16 on XLA:TPU
    assert "f32" in differs[("attention.fwd_bwd.all_reduce.bytes", "hlo")]


@pytest.mark.notebook
def test_notebook_03_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="heads=6 is not divisible by tp=4"):
        run_notebook("03_megatron_attention", tp=4, heads=6, hidden=24)
