"""Notebook 00 through papermill: the three views of one all-reduce agree, and equal n·4 bytes computed here."""

import pytest


@pytest.mark.notebook
def test_notebook_00(run_notebook) -> None:  # type: ignore[no-untyped-def]
    rec = run_notebook("00_welcome", n=256)
    values = {(r["name"], r["source"]): r["value"] for r in rec["measurements"]}
    assert values[("welcome.sum.all_reduce.bytes", "hlo")] == 256 * 4
    assert values[("welcome.sum.all_reduce.wire_bytes", "ledger")] == 2 * 7 / 8 * 256 * 4
