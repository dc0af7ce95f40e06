"""Notebook 01 through papermill: its own three-way checks must pass, and the recorded numbers must match
the block algebra computed here independently (m·n·b for the row rule, (m/2)·n·b on the 2-D mesh)."""

import pytest


@pytest.mark.notebook
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_notebook_01(run_notebook, dtype: str) -> None:  # type: ignore[no-untyped-def]
    m, k, n = 8, 32, 16
    rec = run_notebook("01_block_matrices", m=m, k=k, n=n, parts=4, dtype=dtype)
    values = {(r["name"], r["source"]): r["value"] for r in rec["measurements"]}
    b = 4  # XLA:CPU promotes bf16 partial sums to f32 before the all-reduce (on TPU bf16 would be 2)
    assert values[("blocks.row.all_reduce.bytes", "hlo")] == m * n * b
    assert values[("blocks.grid.collective.bytes", "hlo")] == (m // 2) * n * b
    assert values[("blocks.col.collective.count", "hlo")] == 0
    assert values[("blocks.row.all_reduce.count", "hlo")] == 1


@pytest.mark.notebook
def test_notebook_01_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"n=30 is not divisible by num_devices=8"):
        run_notebook("01_block_matrices", n=30)
