"""Notebook 05b through papermill: the defaults (8 devices, PyTorch FSDP1/FSDP2 on 2 gloo processes), one
device (the CPU compiler view skipped with a note, the TPU view compiled for an 8-chip slice in a helper
process), 4 devices with W = 2 and other sizes, plus a bad parameter. Every in-notebook check must pass; the
expected numbers are worked out here by hand."""

from __future__ import annotations

import pytest


def _by(record: dict) -> dict:
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


@pytest.mark.notebook
def test_notebook_05b_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("05b_fsdp_gspmd")
    by = _by(record)
    # W = 8, W1 [50, 30], b1 [50], W2 [10, 50], b2 [10]; gradients: all 2060 f32 elements, once
    for source in ("formula", "hlo", "tpu"):
        assert by[("fsdp.gspmd.step.reduce_scatter.bytes", source)] == 2060 * 4
    # CPU: f32 padded shards, forward 7·30 + 7 + 2·50 + 2, backward W2 again
    assert by[("fsdp.gspmd.step.all_gather.bytes", "hlo")] == 4 * (210 + 7 + 100 + 2 + 100)
    # TPU: weights gathered in bf16, biases by all-reduces of the padded vectors 56 and 16
    assert by[("fsdp.gspmd.step.all_gather.bytes", "tpu")] == 2 * (210 + 100 + 100)
    assert by[("fsdp.gspmd.step.unshard_all_reduce.bytes", "tpu")] == 4 * (56 + 16)
    names = {c["name"] for c in record["checks"]}
    assert "fsdp.gspmd.tpu_formula.step.collective.bytes" in names
    assert "fsdp.torch.fsdp1.collectives_row_by_row" in names


@pytest.mark.notebook
def test_notebook_05b_one_device(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("05b_fsdp_gspmd", num_devices=1, torch_fsdp_world=0)
    by = _by(record)
    assert ("fsdp.gspmd.step.all_gather.bytes", "hlo") not in by  # no 8-device mesh in this process
    assert any(s["source"] == "hlo" and "world_size=8" in s["reason"] for s in record["skipped"])
    assert by[("fsdp.gspmd.step.all_gather.bytes", "tpu")] == 2 * (210 + 100 + 100)  # an 8-chip slice


@pytest.mark.notebook
def test_notebook_05b_four_devices_w2(run_notebook) -> None:  # type: ignore[no-untyped-def]
    by = _by(run_notebook("05b_fsdp_gspmd", num_devices=4, world_size=2, layer_sizes=[19, 7, 17], batch=8,
                          torch_fsdp_world=0))
    # W1 [7, 19] -> 4 rows, b1 [7] -> 4, W2 [17, 7] -> 9 rows, b2 [17] -> 9; forward + W2 again in backward
    assert by[("fsdp.gspmd.step.all_gather.bytes", "hlo")] == 4 * (4 * 19 + 4 + 9 * 7 + 9 + 9 * 7)
    assert by[("fsdp.gspmd.step.reduce_scatter.bytes", "tpu")] == 4 * (7 * 19 + 7 + 17 * 7 + 17)


@pytest.mark.notebook
def test_notebook_05b_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"torch_fsdp_world=9 must be an int in \[0, 4\]"):
        run_notebook("05b_fsdp_gspmd", num_devices=1, torch_fsdp_world=9)
