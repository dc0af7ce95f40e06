"""Notebook 05 through papermill with small parameters: every in-notebook check must pass.

The small run uses alignment (use_orig_params) and an uneven world size so the padding paths are exercised;
PyTorch's own FSDP on gloo is skipped here (tests/test_fsdp_torch.py covers it) to keep the run short.
"""

from __future__ import annotations

import pytest


@pytest.mark.notebook
def test_notebook_05_small(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("05_fsdp_flat_params", num_devices=4, world_size=4, layer_sizes=[6, 10, 3], align=True,
                          steps=2, batch=8, torch_fsdp_world=0)
    names = {m["name"] for m in record["measurements"]}
    for required in ("fsdp.flat.numel", "fsdp.flat.padded_numel", "fsdp.flat.shard_numel",
                     "fsdp.step.all_gather.bytes", "fsdp.step.reduce_scatter.bytes", "fsdp.memory.per_rank.bytes",
                     "fsdp.gspmd.step.collective.bytes"):
        assert required in names
    by = {(m["name"], m["source"]): m["value"] for m in record["measurements"]}
    # 6·10 + 10 = 70 -> +2 align -> 72; + 30 + 3 = 105 -> +3 to a multiple of 4 = 108; c = 27
    assert by[("fsdp.flat.numel", "formula")] == 108
    # the model is one (root) unit, which PyTorch does not reshard after forward: one all-gather of c per step
    assert by[("fsdp.step.all_gather.bytes", "ledger")] == 1 * 27 * 4
    assert by[("fsdp.step.reduce_scatter.bytes", "ledger")] == 108 * 4


@pytest.mark.notebook
def test_notebook_05_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="world_size=3 does not divide num_devices=4"):
        run_notebook("05_fsdp_flat_params", num_devices=4, world_size=3, torch_fsdp_world=0)
