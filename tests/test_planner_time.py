"""The planner's step time on its presets beside the compiler's (``shardlab.planner.time_check``).

Oracles:
- the live compile: the stand-in row (a tiny Llama through the same trace, compile and pricing) compiled now must
  equal its cached entry — the compiler's estimates and the program's collectives are deterministic;
- the planner's side: FLOPs counted here from the model's sizes (each layer's q, k, v, o and SwiGLU matrices, the
  LM head over the padded vocabulary, the [s, s] score and value matmuls, one more forward under full recompute),
  over the chip's bf16 peak read from ``data/hardware`` — not the planner's formula module;
- the cache: every stored ratio and MFU recomputed from its own stored terms, the extrapolated rows recomputed from
  their raw 2- and 4-layer compiles, and the scan's linearity (compute(4) − compute(2) = 2 × one body) checked
  on the compiles themselves.
"""

from __future__ import annotations

import json
import math

import pytest

from shardlab.formulas import hardware
from shardlab.planner import model_from
from shardlab.planner import time_check as T


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    return T.load()


def hand_flops(key: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs with full recompute) of one step of row ``key``, counted from the sizes."""
    c = T.ALL[key]
    m = model_from(c["model"])
    h, f, L, hd = m.hidden, m.ffn, m.layers, m.hidden // m.heads
    v = -(-m.vocab // (128 * c["tensor"])) * 128 * c["tensor"]
    tokens, s = c["global_batch"] * c["seq"], c["seq"]
    layer = 2 * h * h + 2 * m.kv_heads * hd * h + 3 * h * f  # q, o; k, v; gate, up, down
    fwd_layers = 2 * tokens * L * layer
    fwd_attn = 2 * (2 * c["global_batch"] * s * s * h) * L  # q·kᵀ and p·v, full [s, s]
    fwd_head = 2 * tokens * h * v
    model = 3 * (fwd_layers + fwd_attn + fwd_head)
    return model, model + fwd_layers + fwd_attn


@pytest.mark.parametrize("key", list(T.ALL))
def test_planner_time_is_the_hand_count(key: str) -> None:
    model, hw_flops = hand_flops(key)
    chip_name = T.ALL[key]["topology"].split("-")[0]
    peak = json.loads((hardware.hardware_dir() / f"{chip_name}.json").read_text())["bf16_peak_flops_per_s"]
    chips = hardware.slice_chips(T.ALL[key]["topology"])[1]
    pl = T.row(key, {})["planner"]
    assert math.isclose(pl["model_flops"], model, rel_tol=1e-12)
    assert math.isclose(pl["compute_s"], hw_flops / chips / peak, rel_tol=1e-12)
    assert pl["step_s"] == max(pl["compute_s"], pl["comm_s"])  # perfect overlap
    assert math.isclose(pl["comm_s"], sum(pl["comm_by_axis"].values()), rel_tol=1e-12)
    assert math.isclose(pl["mfu"], model / (pl["step_s"] * chips * peak), rel_tol=1e-12)


def test_pod_rows_are_notebook_07s() -> None:
    from shardlab.planner.pod import POD

    for key in ("llama-3-70b.v6e-256", "llama-3-70b.v5p-256"):
        assert T.ROWS[key] == POD[key]


def test_stand_in_compiled_now_equals_the_cache(data, live_tpu_compiles) -> None:  # type: ignore[no-untyped-def]
    key = next(iter(T.STAND_IN))
    cached = data["compiles"][key]["full"]
    now = T.compile_row(key)
    assert now["fits"] and cached["fits"]
    assert now["step"] == cached["step"]
    assert now["exposed_by_axis"] == cached["exposed_by_axis"]
    assert (now["bound"], now["loop_body_s"], now["program_flops"]) == (
        cached["bound"], cached["loop_body_s"], cached["program_flops"])


def test_cached_rows_follow_from_their_own_terms(data) -> None:  # type: ignore[no-untyped-def]
    assert set(T.ROWS) <= set(data["rows"]), "every row compiled (tools/planner_presets_time.py all)"
    gens = set()
    for key in T.ALL:
        r = data["rows"][key]
        pl, co = r["planner"], r["compiler"]
        assert co is not None, key
        gens.add(T.ALL[key]["topology"].split("-")[0])
        assert math.isclose(r["ratio"], co["predicted_s"] / pl["step_s"], rel_tol=1e-12), key
        assert math.isclose(co["mfu"], pl["model_flops"] / (co["predicted_s"] * pl["chips"] * pl["peak_flops_per_s"]),
                            rel_tol=1e-12), key
        assert math.isclose(co["step_s"], co["compute_s"] + co["exposed_comm_s"], rel_tol=1e-9), key
        assert math.isclose(co["predicted_s"], co["step_s"] + co["derived_s"], rel_tol=1e-9) and co["derived_s"] >= 0
        assert co["compute_s"] < 1e3 * pl["compute_s"], f"{key}: an estimate left in compute that is not a time"
        assert math.isclose(co["comm_s"], sum(co["comm_by_axis"].values()), rel_tol=1e-9), key
        assert 0 <= co["exposed_comm_s"] <= co["comm_s"] * (1 + 1e-9), key
        assert T.row(key, data["compiles"][key])["planner"] == pl, f"{key}: the planner changed since the cache"
        for depth, res in data["compiles"][key].items():  # the split partitions the kernels: its parts sum up
            sp, st = res.get("compute_split"), res["step"]
            if sp:
                assert math.isclose(sum(v["estimate_s"] for v in sp.values()), st["compute_s"], rel_tol=1e-9)
                assert math.isclose(sum(v["derived_s"] for v in sp.values()), st.get("saturated_roofline_s", 0.0),
                                    rel_tol=1e-9, abs_tol=1e-15), (key, depth)
    assert len(gens - {"v5e"}) >= 2 and len(T.ROWS) >= 4  # ≥ 4 rows over ≥ 2 generations (+ the stand-in's)


def test_extrapolated_rows_are_the_line_through_their_compiles(data) -> None:  # type: ignore[no-untyped-def]
    for key in T.EXTRAPOLATED:
        comp = data["compiles"][key]
        a, b = comp["L2"]["step"], comp["L4"]["step"]
        L = model_from(T.ALL[key]["model"]).layers
        co = data["rows"][key]["compiler"]
        for f in ("compute_s", "comm_s", "exposed_comm_s", "step_s"):
            assert math.isclose(co[f], a[f] + (b[f] - a[f]) * (L - 2) / 2, rel_tol=1e-12), (key, f)
        ad = a.get("unpriced_roofline_s", 0) + a.get("saturated_roofline_s", 0)
        bd = b.get("unpriced_roofline_s", 0) + b.get("saturated_roofline_s", 0)
        assert math.isclose(co["derived_s"], ad + (bd - ad) * (L - 2) / 2, rel_tol=1e-9, abs_tol=1e-15), key
        # the line's premise: 2 more layers cost 2 executions of the scanned body, plus the AdamW update of their
        # stacked weights outside the loop (elementwise over 2 layers' parameters: more, and a few % at most)
        d, body = b["compute_s"] - a["compute_s"], 2 * comp["L2"]["loop_body_s"]
        assert 0 <= d - body <= 0.02 * body, (key, d, body)
