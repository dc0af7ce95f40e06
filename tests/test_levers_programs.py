"""The lever graphs on the CPU compiler: the memory-order toy's schedule priced by the order module against
XLA's own heap simulation; the layouts enumerated and the Megatron layout's all-reduces worked out by hand;
the search's candidates, ranking and the planner's choice; the notebook's parameter rules."""

from __future__ import annotations

import dataclasses
import math

import pytest

from shardlab.core import harness
from shardlab.levers import case as L
from shardlab.levers import programs as P
from shardlab.levers import search as S
from shardlab.levers.params import LeversParams
from shardlab.planner import PlanConfig, plan
from shardlab.profile import order as O


@pytest.mark.xla
def test_order_toy_on_cpu(xla_world) -> None:  # type: ignore[no-untyped-def]
    case = L.OrderToyCase(LeversParams(), compile_only=False)
    assert (case.rows, case.cols, case.dtype) == (64, 64, "float32")
    cap = harness.hlo(case).detail
    g = O.graph_from_hlo(cap.module)
    ext, xla = O.extremes(g), O.peak(g)
    assert ext.best.peak <= xla.peak <= ext.worst.peak
    u = 64 * 64 * 4
    assert case.unit_bytes == u
    # the four matmuls write 1 (small), 10 (large), 6 (expanded), 1 (shrunk) units: every order holds large with
    # shrunk or with small, so the best order over the CPU graph (V0 split into its two matmuls) is large + shrunk
    # = 11 units; the worst small + large + expanded = 17
    assert (ext.best.peak, ext.worst.peak) == (11 * u, 17 * u)
    # XLA's heap simulation of its own schedule never exceeds our (no buffer sharing) model of the same order
    assert cap.module.buffers.temp <= xla.peak + 64 * len(g.ops)  # + allocation alignment


def test_layouts_enumerated() -> None:
    eight = P.layouts(8)
    # ordered (d, f, t) with d·f·t = 8: 10; those with t > 1 (6 of them) come in both layouts
    assert len(eight) == 16
    assert all(d * f * t == 8 for d, f, t, _ in eight)
    assert {lay for *_, t, lay in [(0, 0, t, lay) for _, _, t, lay in eight if t == 1]} == {"megatron"}
    assert P.layouts(1) == [(1, 1, 1, "megatron")]
    assert "does not equal the 8 devices" in P.layout_problem(2, 2, 1, "megatron", 8, 512, 2048, 8)
    assert P.layout_problem(1, 1, 8, "megatron", 8, 100, 2048, 8) == \
        "hidden=100 is not divisible by fsdp × tensor = 8"
    assert P.layout_problem(1, 8, 1, "megatron", 4, 512, 2048, 8) == "batch=4 is not divisible by data × fsdp = 8"
    assert P.layout_problem(1, 1, 8, "megatron", 8, 512, 2048, 8) is None
    with pytest.raises(ValueError, match="must be one of"):
        P.mlp_layout(1, 1, 8, "diagonal", 8, 4, 16, 64)


@pytest.mark.xla
def test_megatron_layout_on_cpu(xla_world) -> None:  # type: ignore[no-untyped-def]
    p = LeversParams(mlp_seq=32, mlp_hidden=16, mlp_ffn=64)  # batch 8, seq 32 / 8 = 4
    case = L.LayoutCase(p, 1, 1, 8, "megatron")
    h = harness.hlo(case)
    ar = [c for c in h.detail.module.collectives if c.op == "all-reduce"]
    # g forward + f backward, each of the [b, s, h] activation: 8·4·16 = 512 elements (no combiner on CPU)
    assert [sum(math.prod(s) for s in c.operand_shapes) for c in ar] == [512, 512]
    assert h[f"{case.phase}.all_reduce.elements"] == 1024


def test_search_candidates() -> None:
    p = LeversParams()
    small = [(c.data, c.fsdp, c.tensor, c.layout) for c in S.candidates(p, (2, 1, 4))]
    assert small == [(8, 1, 1, "megatron"), (1, 8, 1, "megatron"), (2, 1, 4, "megatron"), (1, 1, 8, "megatron")]
    assert len(S.candidates(p, (8, 1, 1))) == 3  # the planner chose pure data parallel: nothing to add
    full = S.candidates(dataclasses.replace(p, search="full"), None)
    assert [(c.data, c.fsdp, c.tensor, c.layout) for c in full] == P.layouts(8)
    assert S.candidates(dataclasses.replace(p, search="off"), (8, 1, 1)) == []
    assert L.LayoutCase(p, 1, 8, 1).problem() is None and L.LayoutCase(p, 2, 2, 1).devices == 4


def test_rank_and_marks() -> None:
    rows = [
        {"data": 8, "fsdp": 1, "tensor": 1, "layout": "megatron", "fits": True, "wire_bytes": 300, "memory_bytes": 9},
        {"data": 1, "fsdp": 1, "tensor": 8, "layout": "megatron", "fits": True, "wire_bytes": 100, "memory_bytes": 5},
        {"data": 2, "fsdp": 1, "tensor": 4, "layout": "swapped", "fits": True, "wire_bytes": 100, "memory_bytes": 4},
        {"data": 1, "fsdp": 8, "tensor": 1, "layout": "megatron", "fits": False, "wire_bytes": None,
         "memory_bytes": 99},
    ]
    frame = S.rank(rows, planner=(8, 1, 1))
    assert list(frame["mesh"]) == ["2·1·4", "1·1·8", "8·1·1", "1·8·1"]  # bytes, then memory; misfits last
    assert list(frame["megatron"]) == [False, True, False, False]
    assert list(frame["planner"]) == [False, False, True, False]


def test_formula_wire_bytes_by_hand() -> None:
    p = LeversParams()  # batch 8, seq 512 / 8 = 64, h 512, F 2048, bf16, 8 chips
    # Megatron: 2 all-reduces of [8, 64, 512] bf16 = 524288 B; ring 2·7/8 of it each: 2 · 917504
    assert S.formula_wire_bytes(L.LayoutCase(p, 1, 1, 8, "megatron")) == 2 * 917504 == 1835008
    # pure data parallel: 2 weight gradients [512, 2048] bf16 = 2 MiB each, ring 2·7/8: 2 · 3670016
    assert S.formula_wire_bytes(L.LayoutCase(p, 8, 1, 1)) == 2 * 3670016
    assert S.formula_wire_bytes(L.LayoutCase(p, 1, 8, 1)) is None  # FSDP: no closed form here
    assert S.formula_wire_bytes(L.LayoutCase(p, 1, 1, 8, "swapped")) is None


def test_planner_choice_is_a_legal_fitting_mesh() -> None:
    d, f, t = S.planner_choice(8, 64, 512, 2048, heads=8, topology="v5e-8", devices=8)
    assert d * f * t == 8
    model = {"name": "x", "layers": 1, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 128,
             "gated_mlp": False}
    assert plan(PlanConfig(model, "v5e-8", data=d, fsdp=f, tensor=t, recompute="none", global_batch=8,
                           seq=64)).fits


def test_weight_update_rules() -> None:
    with pytest.raises(ValueError, match="stage='later' must be one of"):
        P.weight_update("later", "adam", 2, 4, 8)
    with pytest.raises(ValueError, match="optimizer='lion' must be one of"):
        P.weight_update("fused", "lion", 2, 4, 8)


@pytest.mark.parametrize("change, words", [
    ({"gloo_world": 1}, "gloo_world=1 must be 0 (skip the timings) or an int >= 2"),
    ({"gloo_calls": (3, 8)}, "gloo_numels entry=4096 is not divisible by gloo_calls entry=3"),
    ({"gloo_calls": (8,)}, "need >= 2 distinct values each"),
    ({"batch": 12}, "batch=12 is not divisible by num_devices=8"),
    ({"search": "huge"}, "search='huge' must be one of"),
    ({"generation": "v4"}, "generation='v4' must be one of"),
    ({"bucket_bytes": -1}, "bucket_bytes=-1 must be an int >= 0"),
    ({"bucket_first_bytes": 1.5}, "bucket_first_bytes=1.5 must be an int >= 0"),
    ({"optimizer": "lion"}, "optimizer='lion' must be one of"),
    ({"mlp_ffn": 100}, "mlp_ffn=100 is not divisible by num_devices=8"),
])
def test_params_name_the_rule(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(LeversParams(), **change).validate()


def test_params_defaults_and_lists() -> None:
    assert LeversParams().validate().layers == 8
    assert LeversParams(gloo_numels=[64, 128], gloo_calls=[1, 2]).validate()  # papermill passes lists
    assert LeversParams(gloo_world=0, gloo_calls=(1,)).validate()  # no timings: no fit to feed
