"""Notebook 05 through papermill: the defaults, and non-default legal parameter sets (one device with
alignment padding; an uneven world size on two devices with four layers), plus a bad parameter. Every
in-notebook check must pass; the expected numbers are worked out here by hand."""

from __future__ import annotations

import pytest


def _by(record: dict) -> dict:
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


@pytest.mark.notebook
def test_notebook_05_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    by = _by(run_notebook("05_fsdp_flat_params"))
    # 30 -> 50 -> 10: N = 1500 + 50 + 500 + 10 = 2060, W = 8: c = 258, P = 2064; one root unit
    for source in ("formula", "ledger"):
        assert by[("fsdp.flat.numel", source)] == 2060
        assert by[("fsdp.step.all_gather.bytes", source)] == 258 * 4  # the root gathers once
        assert by[("fsdp.step.reduce_scatter.bytes", source)] == 2064 * 4
    # nested: the inner unit (Linear 0: 1550 -> c 194) gathers twice, the root (510 -> c 64) once
    assert by[("fsdp.nested.step.all_gather.count", "ledger")] == 3
    assert by[("fsdp.nested.step.all_gather.bytes", "ledger")] == (2 * 194 + 64) * 4


@pytest.mark.notebook
def test_notebook_05_one_device_aligned(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("05_fsdp_flat_params", num_devices=1, world_size=4, layer_sizes=[6, 10, 3], align=True,
                          steps=2, batch=8)
    by = _by(record)
    # 6·10 + 10 = 70 -> +2 align -> 72; + 30 + 3 = 105 -> +3 to a multiple of 4 = 108; c = 27
    assert by[("fsdp.flat.numel", "formula")] == by[("fsdp.flat.numel", "ledger")] == 108
    # the model is one (root) unit, which PyTorch does not reshard after forward: one all-gather of c per step
    assert by[("fsdp.step.all_gather.bytes", "ledger")] == 1 * 27 * 4
    assert by[("fsdp.step.reduce_scatter.bytes", "ledger")] == 108 * 4
    assert record["env"]["device_count"] == 1


@pytest.mark.notebook
def test_notebook_05_uneven_world(run_notebook) -> None:  # type: ignore[no-untyped-def]
    by = _by(run_notebook("05_fsdp_flat_params", num_devices=2, world_size=3, layer_sizes=[5, 7, 4, 3], batch=6,
                          steps=1))
    # 35 + 7 + 28 + 4 + 12 + 3 = 89 -> c = ceil(89/3) = 30, P = 90
    assert by[("fsdp.flat.padded_numel", "ledger")] == 90
    assert by[("fsdp.memory.per_rank.bytes", "ledger")] == 16 * 30
    # nested: inner = Linear 0 (35 + 7 = 42 -> c 14, gathered twice), root = the rest (47 -> c 16, once)
    assert by[("fsdp.nested.step.all_gather.bytes", "ledger")] == (2 * 14 + 16) * 4


@pytest.mark.notebook
def test_notebook_05_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="batch=60 is not divisible by world_size=8"):
        run_notebook("05_fsdp_flat_params", num_devices=1, batch=60)
