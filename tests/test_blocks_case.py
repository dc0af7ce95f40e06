"""The blocks topic's cases (``shardlab.blocks.case``) through the harness, against independent oracles.

Oracles: the block algebra done by hand in the comments (the row rule adds full m×n partial sums: m·n·e bytes
per device, over p devices; the grid adds (m/2)·n·e within groups of p/2; the column rule adds nothing), the
dense product in float64 for the values, and the element size each compiler reduces in (XLA:CPU promotes bf16
to f32, XLA:TPU keeps bf16: measured facts, stated where they are used). The 8-device world of the test
session hosts the CPU compiler (mesh (8 / p, p)) and the in-process TPU compiles (v5e:2x4).
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from shardlab import harness
from shardlab.blocks import case as bc
from shardlab.params import BlocksParams, WelcomeParams

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
