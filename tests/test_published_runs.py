"""MaxText's published v5e-256 runs beside the compiler's step time: the settings and the cached predictions.

Oracles written here, not read from the code under test: the model widths of each run worked out by hand from
MaxText's scripts (global_parameter_scale over base.yml's emb 2048, 16 heads, MLP 7168, 16 layers); the published
MFU against the published TFLOP/s/chip over v5e's 197 TFLOP/s (Cloud TPU documentation); each cached prediction's
MFU recomputed from hand-counted model FLOPs (MaxText's convention) and the cached step time; the scan's linearity
(the 2 → 4 layer difference in compute is 2 × the scanned body's estimate, both read from the program, within 1 %:
the rest is work outside the loop that also grows with the layers, such as the optimizer's update of the stacked
weights).
"""

from __future__ import annotations

import pytest

from shardlab.timing import published as P

V5E_PEAK = 197e12
SEQ, VOCAB, CHIPS = 2048, 32000, 256
# (emb, heads, mlp, layers, per-chip batch) by hand from configs/tpu/v5e/*.sh: scale 16 = 2^4: heads+mlp x4,
# emb x2, layers x2; 32 = 2^5: heads+mlp x4, emb x4, layers x2; 64: all x4; 128 = 2^7: heads+mlp x8, emb x4, layers x4
HAND = {"16b": (4096, 64, 28672, 32, 6), "32b": (8192, 64, 28672, 32, 4), "64b": (8192, 64, 28672, 64, 2),
        "128b": (8192, 128, 57344, 64, 1)}
NOMINAL = {"16b": 16e9, "32b": 32e9, "64b": 64e9, "128b": 128e9}


def hand_flops(key: str, layers: int | None = None) -> float:
    emb, heads, mlp, n_layers, b = HAND[key]
    n_layers = layers or n_layers
    weights = n_layers * (4 * emb * heads * 128 + 3 * emb * mlp) + emb * VOCAB
    tokens = b * CHIPS * SEQ
    return 6 * weights * tokens + n_layers * 6 * SEQ * heads * 128 * tokens


@pytest.mark.parametrize("key", sorted(HAND))
def test_settings(key: str) -> None:
    w = P.maxtext_widths(P.RUNS[key].scale)
    emb, heads, mlp, layers, b = HAND[key]
    assert (w["emb"], w["heads"], w["mlp"], w["layers"], P.RUNS[key].per_device_batch) == (emb, heads, mlp, layers, b)
    assert 0.9 < P.matmul_params(key) / NOMINAL[key] < 1.0  # "16B" etc.: the nominal size, rounded up
    assert P.maxtext_model_flops(key) == pytest.approx(hand_flops(key), rel=1e-12)
    assert abs(P.RUNS[key].tflops_per_chip * 1e12 / V5E_PEAK - P.RUNS[key].mfu) < 0.01


def test_cached_predictions() -> None:
    cache = P.load()
    rows = {r["run"]: r for r in P.table_rows(cache)}
    assert set(rows) == set(HAND)
    priced = [k for k, r in rows.items() if r["predicted step (s)"] is not None]
    assert priced, "no run priced in the cache"
    for key in priced:
        r = rows[key]
        assert r["predicted MFU"] == pytest.approx(hand_flops(key) / (r["predicted step (s)"] * CHIPS * V5E_PEAK),
                                                   rel=1e-9)
        assert r["ratio"] == pytest.approx(r["predicted MFU"] / P.RUNS[key].mfu, rel=1e-12)
        assert r["predicted step (s)"] == pytest.approx(r["compute (s)"] + r["exposed (s)"], rel=1e-9)
        # no kernel beats the MXU: compute at least the model's FLOPs at peak (recompute and eager attention add)
        assert r["compute (s)"] >= hand_flops(key) / (CHIPS * V5E_PEAK)
        assert r["tokens / s / chip"] * r["predicted step (s)"] == pytest.approx(HAND[key][4] * SEQ, rel=1e-12)
    for key, v in cache.items():
        if ".L" in key and v.get("step"):  # a shallow compile: the scan kept (its body runs once per layer)
            assert v["loop_runs"] == [v["layers"]], (key, v["loop_runs"])


def test_scan_linearity_of_the_cached_compiles() -> None:
    lin = P.linearity(P.load())
    assert lin
    for key, (delta, body) in lin.items():  # the rest: work outside the loop that grows with the layers (the
        assert delta == pytest.approx(body, rel=0.01), key  # optimizer's update of the stacked weights)


def test_batch_line_keeps_fsdp_wire() -> None:
    """FSDP moves the weights, not the activations: the wire time of 16B's 2-layer step is the same at 1, 2 and 6
    sequences per chip, so the batch line's wire equals the compiled one exactly; its step is reported, not checked."""
    check = P.batch_line_check(P.load())
    assert check is not None and check["from batches"] == (1, 2) and check["to batch"] == 6
    assert check["comm_s (line)"] == pytest.approx(check["comm_s (compiled)"], rel=1e-9)
