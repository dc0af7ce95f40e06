"""The crossover cache (``data/time/crossovers.json``, written by ``tools/crossovers.py``) against oracles that do
not come from it:

- one cheap point per new axis (context, expert) recompiled live for v5e-8 equals its cached row, field by field
  (compile-only XLA:TPU is deterministic);
- the wire bytes of every cached context / expert program equal a hand count from the shapes (the ring model's
  bytes per collective, written here), and their matmul FLOPs equal a hand count too;
- each cached crossing follows from its own points by one definition for every axis (the first swept size from
  which on wire ≤ compute), re-implemented here;
- the book's critical value is recomputed from the published chip figures: the size at which the hand-counted
  FLOPs over the bf16 peak equal the hand-counted wire bytes over the slice's ICI egress.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parent.parent / "data" / "time" / "crossovers.json"
# published per-chip figures (Cloud TPU documentation): bf16 FLOP/s, bidirectional ICI bytes/s, torus links per chip
CHIPS = {"v5e": (197e12, 400e9, 4), "v6e": (918e12, 800e9, 4), "v5p": (459e12, 1200e9, 6)}
TORUS_AXES_8 = {"v5e": 2, "v6e": 2, "v5p": 3}  # 8 chips: 2x4 (v5e, v6e), 2x2x2 (v5p): a group of all spans every axis
N = 8


def _cache() -> dict:
    return json.loads(CACHE.read_text())


def _entries(axis: str | None = None) -> list[dict]:
    return [e for k, e in _cache().items() if not k.startswith("_") and axis in (None, e["axis"])]


def _egress(gen: str) -> float:
    _, ici, links = CHIPS[gen]
    return TORUS_AXES_8[gen] * ici / links  # each axis: two links, one way each, of a link's bidirectional share


def _hand(axis: str, c: dict, x: int) -> tuple[float, float]:
    """(formula FLOPs per chip, formula wire bytes per chip) of ``axis``'s program at swept size ``x``."""
    if axis == "fsdp":
        p = 2 * c["hidden"] * c["ffn"]
        return 6 * x * p, 2 * (N - 1) / N * 2 * p
    if axis == "tensor":
        return 6 * c["tokens"] * 2 * c["hidden"] * x / N, 2 * 2 * (N - 1) / N * 2 * c["tokens"] * c["hidden"]
    if axis == "context":  # x = L positions per chip, s = N·L
        flops = 12 * c["batch"] * c["heads"] * x * N * x * c["head_dim"]
        return flops, 4 * (N - 1) / N * c["batch"] * N * x * c["kv_heads"] * c["head_dim"] * 2
    cap = math.ceil(c["capacity_factor"] * c["top_k"] * c["tokens"] / c["experts"])  # x = expert width f
    return 18 * c["experts"] * cap * c["hidden"] * x, 4 * (N - 1) / N * c["experts"] * cap * c["hidden"] * 2


def test_cache_covers_every_axis_and_generation() -> None:
    keys = {k for k in _cache() if not k.startswith("_")}
    assert keys == {f"{a}.{g}" for a in ("fsdp", "tensor", "context", "expert") for g in CHIPS}
    assert _cache()["_source"]["versions"]["libtpu"]


@pytest.mark.parametrize("axis", ["fsdp", "tensor", "context", "expert"])
def test_book_critical_from_hardware(axis: str) -> None:
    for e in _entries(axis):
        peak, w = CHIPS[e["generation"]][0], _egress(e["generation"])
        # formula FLOPs and bytes are linear or quadratic in the swept size: solve flops(x)/peak = bytes(x)/w
        (f1, b1), (f2, b2) = _hand(axis, e["config"], 1), _hand(axis, e["config"], 2)
        if f2 == 4 * f1:  # quadratic FLOPs, linear bytes (context)
            x_star = (b1 / w) / (f1 / peak)
        elif b2 == b1:  # linear FLOPs, constant bytes
            x_star = (b1 / w) / (f1 / peak)
        else:
            raise AssertionError(f"{axis}: unexpected scaling")
        assert e["critical"] == pytest.approx(x_star, rel=1e-9), (e["topology"], e["critical"], x_star)
        for pt in e["points"]:  # the formula columns from the same hand counts
            f, b = _hand(axis, e["config"], pt[e["field"]])
            assert pt["formula_compute_s"] == pytest.approx(f / peak, rel=1e-12)
            assert pt["formula_comm_s"] == pytest.approx(b / w, rel=1e-12)


def _crossing(points: list[dict], field: str, comm: str, compute: str) -> int | None:
    for i, pt in enumerate(points):
        if all(q[comm] <= q[compute] for q in points[i:]):
            return pt[field]
    return None


def test_crossing_follows_from_its_points() -> None:
    for e in _entries():
        pts = e["points"]
        assert [p[e["field"]] for p in pts] == sorted(p[e["field"]] for p in pts)
        assert e["crossover"]["tpu"] == _crossing(pts, e["field"], "comm_s", "compute_s")
        assert e["crossover"]["formula"] == _crossing(pts, e["field"], "formula_comm_s", "formula_compute_s")


def test_context_program_wire_and_flops_by_hand() -> None:
    for e in _entries("context"):
        c = e["config"]
        for pt in e["points"]:
            s = N * pt["seq"]
            kv = c["batch"] * s * c["kv_heads"] * c["head_dim"] * 2  # one full K (or V) tensor, bf16 bytes
            ops = pt["collectives"]
            # K and V gathered forward (2 all-gathers); backward, dK and dV reduce-scattered — XLA:TPU may combine
            # the two into one reduce-scatter, or all-reduce one or both (then slice): 2·(n−1)/n of each such tensor
            assert set(ops) <= {"all-gather", "reduce-scatter", "all-reduce"} and ops.get("all-gather") == 2, ops
            ring = (N - 1) / N * kv  # an all-gather's or a reduce-scatter's wire bytes for one [b, s, hkv, dh]
            reduced_units = 2 if "all-reduce" not in ops else (3 if "reduce-scatter" in ops else 4)
            assert pt["wire_bytes"] == pytest.approx(ring * (2 + reduced_units), rel=1e-12), (e["topology"], ops)
            assert pt["flops"] == 12 * c["batch"] * c["heads"] * pt["seq"] * s * c["head_dim"]


def test_expert_program_wire_and_flops_by_hand() -> None:
    for e in _entries("expert"):
        c = e["config"]
        s, h, ex = c["tokens"], c["hidden"], c["experts"]
        cap = math.ceil(c["capacity_factor"] * c["top_k"] * s / ex)
        for pt in e["points"]:
            assert pt["collectives"] == {"all-to-all": 4, "all-reduce": 1}, pt["collectives"]
            a2a = (N - 1) / N * ex * cap * h * 2  # the chip's [E, 1, C, h] bf16 block, (n-1)/n of it leaves
            router = 2 * (N - 1) / N * h * ex * 2  # the replicated router's gradient [h, E], all-reduced
            assert pt["wire_bytes"] == pytest.approx(4 * a2a + router, rel=1e-12)
            # expert SwiGLU 18·E·C·h·f; dispatch and combine einsums [S, E·C] x [S, h] forward (2), the dispatch's
            # x-gradient and the combine's two gradients (3); the router [S, h] x [h, E] forward and its 2 gradients
            want = 18 * ex * cap * h * pt["ffn"] + 5 * 2 * s * ex * cap * h + 3 * 2 * s * h * ex
            assert pt["flops"] == want, (pt["flops"], want)


@pytest.mark.xla
@pytest.mark.parametrize("axis,value", [("context", 32), ("expert", 128)])
def test_live_point_equals_cache(xla_world, live_tpu_compiles, axis: str, value: int) -> None:  # type: ignore[no-untyped-def]
    from shardlab.timing import crossovers as X

    live = X.measure(axis, "v5e", (value,))["points"][0]
    cached = next(p for p in _cache()[f"{axis}.v5e"]["points"] if p[X.AXES[axis][1]] == value)
    assert live == cached
