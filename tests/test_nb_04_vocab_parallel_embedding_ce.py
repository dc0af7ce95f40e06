"""Notebook 04 through papermill with small parameters and an uneven vocabulary (1003 over tp=4: rows 251, 251,
251, 250): every in-notebook check must pass; the required measurements are present with all three sources and
equal the byte counts worked out here."""

from __future__ import annotations

import pytest

SMALL = dict(num_devices=4, tp=4, batch=1, seq=4, hidden=16, ffn=32, heads=4, vocab=1003)


@pytest.mark.notebook
def test_notebook_04_small_uneven_vocab(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("04_vocab_parallel_embedding_ce", **SMALL)
    by = {(m["name"], m["source"]): m["value"] for m in record["measurements"]}
    tokens = 1 * 4
    for source in ("formula", "ledger", "hlo"):
        assert by[("embedding.fwd.all_reduce.count", source)] == 1
        assert by[("embedding.fwd.all_reduce.bytes", source)] == tokens * 16 * 4
        assert by[("ce.vocab_parallel.bytes", source)] == 3 * tokens * 4  # max, target logit, sum of exp
        assert by[("ce.gather_logits.bytes", source)] == tokens * 251 * 4  # shard padded to ceil(1003/4)
        assert by[("ce.saving_ratio", source)] == pytest.approx(251 / 3)


@pytest.mark.notebook
def test_notebook_04_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="tp=8 is larger than the device count num_devices=4"):
        run_notebook("04_vocab_parallel_embedding_ce", **{**SMALL, "tp": 8})
