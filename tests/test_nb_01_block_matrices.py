"""Notebook 01 through papermill: its own four-way checks must pass, and the recorded numbers must match the
block algebra computed here independently: the row rule all-reduces the m×n partial sums (m·n·e bytes per
device, over p devices), the grid (m/2)·n·e within groups of p/2, the column rule nothing. XLA:CPU reduces bf16
in f32 (e = 4), the TPU in bf16 (e = 2)."""

from __future__ import annotations

import pytest


def _values(rec):  # type: ignore[no-untyped-def]
    return {(r["name"], r["source"]): r["value"] for r in rec["measurements"]}


@pytest.mark.notebook
def test_notebook_01_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    m, n, p = 16, 32, 4
    v = _values(run_notebook("01_block_matrices"))
    for src in ("formula", "ledger", "hlo", "tpu"):
        assert v[("blocks.row.all_reduce.bytes", src)] == m * n * 4
        assert v[("blocks.row.all_reduce.group_size", src)] == p
        assert v[("blocks.grid.collective.bytes", src)] == (m // 2) * n * 4
        assert v[("blocks.grid.all_reduce.group_size", src)] == p // 2
        assert v[("blocks.col.collective.count", src)] == 0
    # section 7 at matmul = (64, 128, 32) on (X 2, Y 4): case 5's C keeps X on one dim only; asked 2-D, 4x smaller
    for src in ("formula", "hlo", "tpu"):
        assert v[("blocks.matmul.case5.C.elements", src)] == (64 // 2) * 64
        assert v[("blocks.matmul.case5b.C.elements", src)] == (64 // 2) * (64 // 4)
        assert v[("blocks.matmul.case5.all_reduce.group_size", src)] == 4  # the partial sums run over Y
        assert v[("blocks.matmul.case1.collective.count", src)] == 0


@pytest.mark.notebook
def test_notebook_01_one_device_bf16(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """One device, p = 4: the CPU compiler is skipped, the TPU compiles a 4-chip slice and adds in bf16."""
    m, n = 8, 16
    rec = run_notebook("01_block_matrices", num_devices=1, m=m, k=32, n=n, parts=4, dtype="bfloat16")
    v = _values(rec)
    assert not any(src == "hlo" for (_, src) in v)
    assert v[("blocks.matmul.case5b.C.elements", "tpu")] == 32 * 16  # an 8-chip slice in a helper process
    assert v[("blocks.row.all_reduce.bytes", "tpu")] == v[("blocks.row.all_reduce.bytes", "ledger")] == m * n * 2
    assert v[("blocks.carried.row.all_reduce.on_cpu.bytes", "formula")] == m * n * 4  # predicted, not measured here
    assert v[("blocks.carried.row.all_reduce.on_tpu.dtype", "tpu")] == "bf16"


@pytest.mark.notebook
def test_notebook_01_four_devices_uneven(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """p = 2 on 4 devices (mesh (2, 2)), k = 30 and n = 9 split unevenly over 2, bf16 on XLA:CPU: f32 sums."""
    m, n = 6, 9
    rec = run_notebook("01_block_matrices", num_devices=4, m=m, k=30, n=n, parts=2, dtype="bfloat16")
    v = _values(rec)
    assert v[("blocks.row.all_reduce.bytes", "hlo")] == m * n * 4  # XLA:CPU promotes the bf16 partial sums
    assert v[("blocks.row.all_reduce.bytes", "tpu")] == m * n * 2
    assert v[("blocks.grid.all_reduce.count", "hlo")] == 0  # the (2, 1) grid: nothing to add along k
    assert v[("blocks.col.collective.count", "hlo")] >= 1  # n = 9 over 2 comes back whole (an all-gather)
    assert any(r["name"] == "blocks.col.collective.count" and r["source"] == "hlo" and "all-gathers y" in r["differs"]
               for r in rec["measurements"] if "differs" in r)


@pytest.mark.notebook
def test_notebook_01_odd_parts(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """p = 3 on 2 devices: no grid, no CPU mesh, no 3-chip TPU slice: formula and ledger alone, every skip noted."""
    rec = run_notebook("01_block_matrices", num_devices=2, m=5, k=9, n=7, parts=3)
    v = _values(rec)
    assert v[("blocks.row.all_reduce.bytes", "ledger")] == 5 * 7 * 4
    assert not any(src in ("hlo", "tpu") and name.startswith("blocks.row") for (name, src) in v)
    assert any(n_["name"] == "blocks.grid" for n_ in rec["notes"])


@pytest.mark.notebook
def test_notebook_01_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """The error names the parameter and the rule (every rule: tests/test_params.py, on the dataclass)."""
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="m=15 is odd"):
        run_notebook("01_block_matrices", m=15)
