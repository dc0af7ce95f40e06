"""Notebook 03 through papermill with small parameters: every in-notebook check must pass; the required
measurements are present with all three sources and equal b*s*h*4 bytes per all-reduce (worked out here)."""

from __future__ import annotations

import pytest

SMALL = dict(num_devices=4, tp=2, batch=1, seq=4, hidden=16, ffn=32, heads=4)


@pytest.mark.notebook
def test_notebook_03_small(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("03_megatron_attention", **SMALL)
    by = {(m["name"], m["source"]): m["value"] for m in record["measurements"]}
    act = 1 * 4 * 16 * 4  # one float32 [b, s, h] activation
    for phase, n in (("fwd", 1), ("fwd_bwd", 2)):
        for source in ("formula", "ledger", "hlo"):
            assert by[(f"attention.{phase}.all_reduce.count", source)] == n
            assert by[(f"attention.{phase}.all_reduce.bytes", source)] == n * act
    assert by[("layer.fwd_bwd.all_reduce.bytes", "ledger")] == 4 * act  # 2 + 2 per transformer layer


@pytest.mark.notebook
def test_notebook_03_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="heads=6 is not divisible by tp=4"):
        run_notebook("03_megatron_attention", **{**SMALL, "tp": 4, "heads": 6, "hidden": 24})
