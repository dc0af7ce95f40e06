"""The blocks topic's cases (``shardlab.blocks.case``) through the harness, against independent oracles.

Oracles: the block algebra done by hand in the comments (the row rule adds full m×n partial sums: m·n·e bytes
per device, over p devices; the grid adds (m/2)·n·e within groups of p/2; the column rule adds nothing), the
dense product in float64 for the values, and the element size each compiler reduces in (XLA:CPU promotes bf16
to f32, XLA:TPU keeps bf16: measured facts, stated where they are used). The 8-device world of the test
session hosts the CPU compiler (mesh (8 / p, p)) and the in-process TPU compiles (v5e-8).
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from shardlab.blocks import case as bc
from shardlab.blocks.params import BlocksParams, WelcomeParams
from shardlab.core import harness

pytestmark = pytest.mark.xla


def _case(rule: str, m: int, k: int, n: int, parts: int, dtype: str = "float32") -> bc.BlockCase:
    return bc.BlockCase(BlocksParams(m=m, k=k, n=n, parts=parts, dtype=dtype), rule)


def _agree(*views):  # type: ignore[no-untyped-def]
    rows = harness.compare(views)
    assert rows and all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]
    for v in views:
        assert all(ok for ok, _ in v.checks.values()), {k: d for k, (ok, d) in v.checks.items() if not ok}
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_row_rule_all_views(xla_world, parts: int) -> None:  # type: ignore[no-untyped-def]
    m, k, n = 6, 24, 10
    f, led, hlo, tpu = harness.views(_case("row", m, k, n, parts))
    rows = _agree(f, led, hlo, tpu)
    want = 0 if parts == 1 else 1  # p = 1: nothing to add
    assert rows["row.all_reduce.count"]["hlo"] == rows["row.all_reduce.count"]["tpu"] == want
    assert rows["row.all_reduce.bytes"]["hlo"] == want * m * n * 4  # the full m×n f32 partial sum
    assert "hlo.row.sharding_strings" in hlo.checks  # torch_xla's strings == blocks.tiles' prediction
    if parts > 1:
        assert rows["row.all_reduce.group_size"]["tpu"] == parts
        assert led["row.all_reduce.wire_bytes"] == 2 * (parts - 1) / parts * m * n * 4


def test_column_rule_needs_nothing(xla_world) -> None:  # type: ignore[no-untyped-def]
    rows = _agree(*harness.views(_case("column", 6, 24, 12, 4)))
    assert {rows["col.collective.count"][s] for s in ("formula", "ledger", "hlo", "tpu")} == {0}


def test_uneven_column_split_comes_back_whole(xla_world) -> None:  # type: ignore[no-untyped-def]
    """n = 10 over p = 4 (XLA pads to 3 columns each): both compilers all-gather Y (measured, libtpu 0.0.21 and
    torch_xla 2.9.0's XLA:CPU); the views record it as a difference with that reason, not a failed check."""
    views = harness.views(_case("column", 6, 24, 10, 4))
    _agree(*views)
    for v in views[2:]:
        assert "col.collective.count" in v.differs and v["col.collective.count"] >= 1
        assert {c.op for c in v.detail.module.collectives} == {"all-gather"}


def test_uneven_k_is_padded_by_xla_and_the_payload_does_not_change(xla_world) -> None:  # type: ignore[no-untyped-def]
    rows = _agree(*harness.views(_case("row", 6, 30, 10, 4)))  # k = 30 over 4: array_split 8,8,7,7; XLA pads to 8
    assert rows["row.all_reduce.bytes"]["hlo"] == 6 * 10 * 4


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_grid(xla_world, parts: int) -> None:  # type: ignore[no-untyped-def]
    m, n = 8, 12
    views = harness.views(_case("grid", m, 16, n, parts))
    rows = _agree(*views)
    p_c = parts // 2
    assert rows["grid.all_reduce.count"]["hlo"] == (1 if p_c > 1 else 0)  # a 1-wide c axis adds nothing
    assert rows["grid.collective.bytes"]["tpu"] == (m // 2 * n * 4 if p_c > 1 else 0)
    assert "ledger.grid.groups_alike" in views[1].checks  # two row groups, two worlds of p/2 ranks
    if p_c > 1:
        assert rows["grid.all_reduce.group_size"]["hlo"] == p_c


def test_bf16_each_compiler_against_its_own_reduction_dtype(xla_world) -> None:  # type: ignore[no-untyped-def]
    m, n = 8, 12
    case = _case("row", m, 16, n, 4, "bfloat16")
    f, led, hlo, tpu = harness.views(case)
    rows = _agree(f, led, hlo, tpu)
    assert "row.all_reduce.bytes" in hlo.differs  # XLA:CPU moves f32: recorded, not compared
    assert rows["row.all_reduce.elements"]["hlo"] == m * n
    assert (rows["row.all_reduce.bytes"]["hlo"], rows["row.all_reduce.bytes"]["tpu"]) == (m * n * 4, m * n * 2)
    carried = _agree(bc.carried(case), bc.on_device(hlo, "cpu", "row"), bc.on_device(tpu, "tpu", "row"))
    assert carried["row.all_reduce.on_cpu.dtype"]["hlo"] == "f32"
    assert carried["row.all_reduce.on_tpu.dtype"]["tpu"] == "bf16"


def test_skips_when_p_does_not_tile_the_world(xla_world) -> None:  # type: ignore[no-untyped-def]
    case = _case("row", 6, 24, 10, 3)
    hlo, tpu = harness.hlo(case), harness.tpu(case)
    assert not hlo.ran and "parts=3 does not tile num_devices=8" in hlo.skipped
    assert not tpu.ran and "num_chips=3" in tpu.skipped  # no 3-chip TPU slice exists
    assert bc.measured("row.all_reduce.count", tpu, hlo) is None


@pytest.mark.parametrize("op,shape,w", [("all_reduce", (64,), 4), ("all_gather", (16,), 8),
                                        ("reduce_scatter", (64,), 4), ("reduce_scatter", (64, 256), 8)])
def test_collective_views(xla_world, op: str, shape: tuple[int, ...], w: int) -> None:  # type: ignore[no-untyped-def]
    views = harness.views(bc.CollectiveCase(WelcomeParams(world_size=w), op, shape, label="c"))
    rows = _agree(*views)
    numel = math.prod(shape)  # what each rank hands in (all-gather: its shard)
    assert rows[f"c.{op}.bytes"]["tpu"] == rows[f"c.{op}.bytes"]["hlo"] == numel * 4
    assert rows[f"c.{op}.group_size"]["hlo"] == w
    if op == "reduce_scatter":
        (c,) = views[3].detail.module.collectives
        # measured with libtpu 0.0.21: a [64, 256] f32 block becomes a native reduce-scatter (the TPU's
        # all-reduce-scatter fusion, result 1/W of the operand); a 64-element vector stays all-reduce + slice
        native = shape == (64, 256)
        assert (c.op == "reduce-scatter") == native and (c.result_bytes == numel * 4 // w) == native


def test_case_rules() -> None:
    with pytest.raises(ValueError, match="parts=3 is odd"):
        _case("grid", 4, 8, 8, 3)
    with pytest.raises(ValueError, match="m=5 is odd"):
        _case("grid", 5, 8, 8, 2)
    with pytest.raises(ValueError, match="parts=9 is more than k=8"):
        _case("row", 4, 8, 8, 9)
    with pytest.raises(ValueError, match="rule='diagonal' must be one of"):
        _case("diagonal", 4, 8, 8, 2)
    with pytest.raises(ValueError, match="shape\\[0\\]=10 is not divisible by world_size=4"):
        bc.CollectiveCase(WelcomeParams(world_size=4), "reduce_scatter", (10,))
    with pytest.raises(ValueError, match="op='scatter' must be one of"):
        bc.CollectiveCase(WelcomeParams(world_size=4), "scatter", (8,))
    cases, skipped = bc.block_cases(BlocksParams(m=5, k=9, n=7, parts=3))
    assert list(cases) == ["column", "row"] and "parts=3 is odd" in skipped["grid"]


def test_tpu_view_skips_without_libtpu(xla_world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A hosted CPU runtime has no libtpu: the TPU view is a skip with the reason, not an exception."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    v = harness.tpu(_case("row", 4, 8, 8, 2))
    assert not v.ran and "libtpu is not installed" in v.skipped


# ------------------------------------------------------------------------------- section 7: sharded matmuls
# The scaling book's cases on the (X 2, Y 4) mesh, A [I, J], B [J, K] (5, 5b: [J, I]); C's elements per device by
# hand: 1 C[I_X, K_Y] = (I/2)(K/4); 2, 3 C replicated = I·K; 4 C keeps one X = (I/2)·K; 5 C[M_X, M] = (I/2)·I;
# 5b C[M_X, M_Y] = (I/2)(I/4). Collectives by hand: 2 gathers A's [I, J/2] shard over X (2 devices); 3 all-reduces
# the full [I, K] partial sums over X; 5 gathers B's [J/4, I/2] shard over X and all-reduces [I/2, I] over Y (4).
I, J, K = 64, 128, 32  # noqa: E741 - the scaling book's dimension names
BY_HAND = {"1": (I // 2) * (K // 4), "2": I * K, "3": I * K, "4": (I // 2) * K, "5": (I // 2) * I,
           "5b": (I // 2) * (I // 4)}


@pytest.mark.parametrize("name", list(BY_HAND))
def test_matmul_cases_formula_cpu_tpu(xla_world, name: str) -> None:  # type: ignore[no-untyped-def]
    case = bc.MatmulCase(BlocksParams(matmul=(I, J, K)), name)
    f, hlo, tpu = harness.views(case, ("formula", "hlo", "tpu"))
    rows = _agree(f, hlo, tpu)  # includes XLA:CPU's parity with A @ B (float64)
    ph = f"case{name}"
    for v in (f, hlo, tpu):
        assert v[f"{ph}.C.elements"] == BY_HAND[name]
    if name == "2":
        assert rows[f"{ph}.all_gather.elements"]["hlo"] == I * J // 2 and hlo[f"{ph}.all_gather.group_size"] == 2
    if name == "3":
        assert hlo[f"{ph}.all_reduce.bytes"] == I * K * 4 and hlo[f"{ph}.all_reduce.group_size"] == 2
    if name == "5":
        assert hlo[f"{ph}.all_gather.elements"] == (J // 4) * (I // 2) and hlo[f"{ph}.all_gather.group_size"] == 2
        assert hlo[f"{ph}.all_reduce.bytes"] == (I // 2) * I * 4 and hlo[f"{ph}.all_reduce.group_size"] == 4
    if name == "5b":  # XLA:CPU: all-reduce + dynamic-slice; XLA:TPU at these sizes a real reduce-scatter
        assert [c.op for c in tpu.detail.module.collectives if c.op != "all-gather"] == ["reduce-scatter"]
        assert any(c.feeds_dynamic_slice for c in hlo.detail.module.collectives)


def test_matmul_asked_spec_and_table(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Asking case 5's C for (X, Y) gives 5b's 2-D C; the table names the mesh axis of every collective."""
    p = BlocksParams(matmul=(I, J, K))
    assert harness.hlo(bc.MatmulCase(p, "5", ask=("X", "Y")))["case5.C.elements"] == BY_HAND["5b"]
    cases = {n: bc.MatmulCase(p, n) for n in ("3", "5")}
    table = bc.matmul_table(cases, {n: [harness.hlo(c)] for n, c in cases.items()})
    assert list(table["collectives"]) == ["all-reduce f32[64, 32] over X",
                                          "all-gather f32[32, 32] over X; all-reduce f32[32, 64] over Y"]


def test_matmul_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match=r"I=60 is not divisible by 8"):
        BlocksParams(matmul=(60, 128, 32)).validate()
    with pytest.raises(ValueError, match="three positive ints"):
        BlocksParams(matmul=(64, 128)).validate()
    with pytest.raises(ValueError, match="case='6'"):
        bc.MatmulCase(BlocksParams(), "6")
