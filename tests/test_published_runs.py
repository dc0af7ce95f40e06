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


# ------------------------------------------------------------------------------------------------ v6e runs
# Published figures typed from the sources: torchprime e2e_testing/step_time_bounds.yaml (llama-3-8b on v6e-4,
# mean step), tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md (step and MFU).
V6E_PEAK, V6E_HBM_GIB = 918e12, 31.25  # Cloud TPU documentation: 918 TFLOP/s bf16, 32 GB HBM (31.25 GiB usable)
PUBLISHED_V6E = {"torchprime_8b_v6e4": (2.7352, 4, 8), "maxtext_8b_v6e8": (3.443, 8, 24)}  # step, chips, batch
S8, L8, H8, D8 = 8192, 32, 32, 128
# Llama 3 8B by hand: q and o 4096 x 4096, k and v 4096 x 1024 (8 kv heads of 128), MLP 3 x 4096 x 14336, output
# projection 4096 x 128256
N8 = L8 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4096 * 128256


def test_v6e_settings() -> None:
    assert P.llama8b_matmul_params() == N8 == 7_504_658_432
    for key, (step, chips, batch) in PUBLISHED_V6E.items():
        run = P.V6E_RUNS[key]
        assert (run.published_step_s, run.chips, run.batch, run.seq) == (step, chips, batch, S8)
    # MaxText's published MFU is its step under the non-causal attention count (12·L·s·q_dim per token)
    tokens = 24 * S8
    flops = 6 * N8 * tokens + 12 * L8 * S8 * H8 * D8 * tokens
    assert P.V6E_RUNS["maxtext_8b_v6e8"].published_mfu == pytest.approx(flops / (3.443 * 8 * V6E_PEAK), abs=0.005)
    assert P.v6e_model_flops("maxtext_8b_v6e8", causal=False) == pytest.approx(flops, rel=1e-12)


def test_cached_v6e_rows() -> None:
    """Each cached v6e row: predicted = measured compute + exposed communication + the flash kernels at their FLOP
    roofline, that last term recounted by hand from the shapes; the ratio against the published step typed above."""
    cache = P.load()
    rows = {r["run"]: r for r in P.v6e_rows(cache)}
    assert set(rows) == set(PUBLISHED_V6E)
    priced = [k for k, r in rows.items() if r["predicted step (s)"] is not None]
    assert priced, "no v6e run priced in the cache"
    for key in priced:
        r, res = rows[key], cache[key]
        step, chips, batch = PUBLISHED_V6E[key]
        b = batch // chips  # sequences per chip; kv heads repeated to 32 query heads before the kernel
        # per layer: forward 2 matmuls, recomputed in the backward (2), dq 3, dk/dv 4; each 2·b·h·s²·d, halved
        flash = L8 * (2 + 2 + 3 + 4) * 2 * b * H8 * S8 * S8 * D8 / 2 / V6E_PEAK
        assert r["flash, derived roofline (s)"] == pytest.approx(flash, rel=1e-9)
        assert res["step"]["unpriced_flash"] == {"forward": 2 * L8, "dq": L8, "dkv": L8}
        assert r["predicted step (s)"] == pytest.approx(r["compute (s)"] + r["exposed (s)"] + flash, rel=1e-9)
        assert r["ratio"] == pytest.approx(step / r["predicted step (s)"], rel=1e-12)
        # no kernel beats the MXU: the compiler's compute holds at least the 6·N·tokens weight FLOPs at peak
        assert r["compute (s)"] >= 6 * N8 * batch * S8 / (chips * V6E_PEAK)
        assert res["fits"] and res["checked_gib"] <= res["capacity_gib"] == pytest.approx(V6E_HBM_GIB)
        # "fits" rests on the peak (arguments + outputs not donated + temporaries), at least the checked bytes
        assert res["checked_gib"] <= res["peak_gib"] <= res["capacity_gib"]
