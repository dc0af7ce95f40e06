"""Notebook 07 through papermill with small parameters: every in-notebook check passes and the record holds
the measurement names the planner notebook promises, with the published values where it names them.

Oracles for the asserted values: ZeRO Figure 1 (7.5B, 64 devices: 120 / 31.4 / 16.6 / 1.9 GB after
rounding) and pytorch/xla#8883 (per-device stacked gradient [126, 4K, 16K], bf16).
"""

from __future__ import annotations

import pytest

REQUIRED = (
    "planner.zero.stage0.bytes", "planner.zero.stage1.bytes", "planner.zero.stage2.bytes",
    "planner.zero.stage3.bytes", "planner.stacked_grad.per_chip.bytes.1d", "planner.stacked_grad.per_chip.bytes.2d",
    "planner.memory.per_chip.bytes", "planner.step.comm.bytes", "planner.step.flops",
)


@pytest.mark.notebook
def test_notebook_07_small(run_notebook) -> None:  # type: ignore[no-untyped-def]
    custom = {"layers": 4, "hidden": 1024, "ffn": 4096, "heads": 16, "kv_heads": 16, "vocab": 50257,
              "gated_mlp": False}  # a custom model through the `model` parameter
    record = run_notebook("07_planner", num_devices=8, model=custom, topology="v5e-8", data=2, fsdp=4,
                          tensor=1, recompute="selective", global_batch=8, seq=2048, val_tokens=16,
                          val_hidden=32, val_ffn=64, val_heads=8)
    by = {(m["name"], m["source"]): m["value"] for m in record["measurements"]}
    for name in REQUIRED:
        assert (name, "formula") in by, name
    for stage, gb in enumerate((120, 31.4, 16.6, 1.9)):
        assert round(by[(f"planner.zero.stage{stage}.bytes", "formula")] / 1e9, 1) == gb
    assert by[("planner.stacked_grad.per_chip.bytes.1d", "formula")] == 126 * 4096 * 16384 * 2
    assert by[("planner.stacked_grad.per_chip.bytes.2d", "formula")] == 126 * 4096 * 256 * 2
    # the validation section compared formula and HLO for every term (rec.agree raised otherwise)
    assert record["params"]["model"] == custom
    validated = {m["name"] for m in record["measurements"] if m["source"] in ("hlo", "ledger")}
    assert {"planner.validate.tp_mlp.all_reduce.bytes", "planner.validate.dp.all_reduce.bytes",
            "planner.validate.tp_layer.all_reduce.bytes", "planner.validate.fsdp.model_state.bytes",
            "planner.validate.fsdp.param.bytes"} <= validated


@pytest.mark.notebook
def test_notebook_07_bad_degrees(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError,
                       match="data=1 × fsdp=4 × tensor=1 = 4 does not equal the 8 chips of v5e-8"):
        run_notebook("07_planner", num_devices=8, topology="v5e-8", data=1, fsdp=4, tensor=1)
