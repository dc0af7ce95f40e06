"""Notebook 02 through papermill with small parameters: every in-notebook check must pass, and the required
measurements are present with all three sources, equal to b*s*h*4 bytes worked out here."""

from __future__ import annotations

import pytest

SMALL = dict(num_devices=4, tp=2, batch=1, seq=4, hidden=16, ffn=32, heads=4)


@pytest.mark.notebook
def test_notebook_02_small(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("02_megatron_mlp", **SMALL)
    by = {(m["name"], m["source"]): m["value"] for m in record["measurements"]}
    act = 1 * 4 * 16 * 4  # one float32 [b, s, h] activation
    for phase, n in (("fwd", 1), ("fwd_bwd", 2)):
        for source in ("formula", "ledger", "hlo", "tpu"):
            assert by[(f"mlp.{phase}.all_reduce.count", source)] == n
            assert by[(f"mlp.{phase}.all_reduce.bytes", source)] == n * act
    # sequence parallelism: b2 [h]'s partial gradients summed by one all-reduce of h elements
    assert by[("mlp.sp.fwd_bwd.all_reduce.count", "ledger")] == 1
    assert by[("mlp.sp.fwd_bwd.all_reduce.bytes", "ledger")] == 16 * 4


@pytest.mark.notebook
def test_notebook_02_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="ffn=31 is not divisible by tp=2"):
        run_notebook("02_megatron_mlp", **{**SMALL, "ffn": 31})
