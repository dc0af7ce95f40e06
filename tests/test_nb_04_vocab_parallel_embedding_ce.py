"""Notebook 04 through papermill: every in-notebook check must pass (including the graded answer key) at the
defaults and at non-default legal parameter sets with uneven vocabularies; the measurements equal the byte
counts and ratios worked out here (3 all-reduces of [b, s]; one all-gather of a ⌈V/p⌉-column shard)."""

from __future__ import annotations

import pytest


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


@pytest.mark.notebook
def test_notebook_04_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("04_vocab_parallel_embedding_ce")
    by = _by(record)
    tokens, shard = 1 * 8, 6283  # ceil(50257 / 8)
    for source in ("formula", "ledger", "hlo", "tpu"):
        assert by[("embedding.fwd.all_reduce.bytes", source)] == tokens * 64 * 4
        assert by[("ce.vocab_parallel.bytes", source)] == 3 * tokens * 4  # max, target logit, sum of exp
        assert by[("ce.gather_logits.bytes", source)] == tokens * shard * 4
        assert by[("ce.gather_logits.wire_bytes", source)] == 7 * tokens * shard * 4  # (p - 1) shards
        assert by[("ce.saving_ratio", source)] == pytest.approx(8 * shard / 6)  # wire convention
        assert by[("ce.payload_ratio", source)] == pytest.approx(shard / 3)
    for source in ("formula", "hlo", "tpu"):  # memory: the shard vs the gathered, padded logits
        assert by[("ce.vocab_parallel.largest_array.elements", source)] == tokens * shard
        assert by[("ce.gather_logits.largest_array.elements", source)] == tokens * 8 * shard
    assert by[("ce.vocab_parallel_smoothing.count", "ledger")] == 4  # + the sum of the logits
    assert by[("ce.vocab_parallel.operands", "tpu")] == 3
    # the tied ends: embedding g [b, s, h], 3 CE sums [b, s] forward; the output layer's f [b, s, h] backward
    assert by[("tied.fwd_bwd.all_reduce.bytes", "ledger")] == (2 * tokens * 64 + 3 * tokens) * 4
    assert by[("tied.bwd.all_reduce.bytes", "ledger")] == tokens * 64 * 4


@pytest.mark.notebook
def test_notebook_04_four_devices_uneven_bf16(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """V = 1003 over tp = 4 (251/251/251/250) in bf16: XLA:CPU reduces in f32 (bytes recorded, elements compared);
    the ratios come from elements and hold for every source. The TPU memory pair runs at 64 tokens."""
    record = run_notebook("04_vocab_parallel_embedding_ce", num_devices=4, tp=4, batch=1, seq=4, hidden=16,
                          vocab=1003, dtype="bfloat16", memory_tokens=64)
    by = _by(record)
    tokens = 4
    for source in ("formula", "ledger", "hlo", "tpu"):
        assert by[("ce.vocab_parallel.elements", source)] == 3 * tokens
        assert by[("ce.gather_logits.elements", source)] == tokens * 251
        assert by[("ce.saving_ratio", source)] == pytest.approx(4 * 251 / 6)
    assert by[("ce.vocab_parallel.bytes", "hlo")] == 3 * tokens * 4  # f32 on XLA:CPU
    assert by[("ce.vocab_parallel.bytes", "tpu")] == 3 * tokens * 2  # bf16 on XLA:TPU


@pytest.mark.notebook
def test_notebook_04_one_device_no_smoothing(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """One device, tp = 2, V = 1001 (501/500), no label smoothing: the CPU compiler views are skipped with a
    note; the TPU view compiles a 2-chip slice in a helper process."""
    record = run_notebook("04_vocab_parallel_embedding_ce", num_devices=1, tp=2, batch=2, seq=4, hidden=16,
                          vocab=1001, label_smoothing=0.0)
    by = _by(record)
    skipped = {(s["name"], s["source"]) for s in record["skipped"]}
    assert ("ce", "hlo") in skipped and ("embedding", "hlo") in skipped
    for source in ("formula", "ledger", "tpu"):
        assert by[("ce.gather_logits.bytes", source)] == 2 * 4 * 501 * 4
        assert by[("ce.saving_ratio", source)] == pytest.approx(2 * 501 / 6)
    assert not any(name.startswith("ce.vocab_parallel_smoothing") for name, _ in by)


@pytest.mark.notebook
@pytest.mark.parametrize("change, words", [({"tp": 1}, "tp=1 communicates nothing"),
                                           ({"memory_tokens": -1}, "memory_tokens=-1 must be an int >= 0")])
def test_notebook_04_bad_parameter(run_notebook, change, words) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=words):
        run_notebook("04_vocab_parallel_embedding_ce", **change)
