"""Notebook 09's cases through the harness at small sizes: the schedules' formula and ledger views against hand
arithmetic (sends 2 m (p v - 1) of [b/m, s, h]; bubble (p - 1)/(v m + p - 1); peak in flight m / p / chunks) with
parity to the unsplit model; the SPMD program's views on the 8-device world (trip count, loop shifts, the
data-parallel gradient sum); the shift written four ways; and the parameter rules."""

from __future__ import annotations

import pytest

from shardlab.core import harness
from shardlab.pipeline.params import PipelineParams

SMALL = PipelineParams(stages=2, microbatches=4, virtual=2, batch=4, seq=8, hidden=32, heads=2, ffn=64, layers=4,
                       vocab=256)
MESSAGE = 4 // 4 * 8 * 32 * 4  # one float32 [b/m, s, h] activation


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_formula_and_ledger_agree_with_hand_arithmetic(schedule: str, v: int) -> None:
    from shardlab.pipeline.case import ScheduleCase

    case = ScheduleCase(SMALL, schedule)
    p, m = 2, 4
    f, led = harness.formula(case), harness.ledger(case)
    sends = 2 * m * (p * v - 1)
    inflight = {"gpipe": m, "1f1b": p, "interleaved": min((v - 1) * p + 2 * (p - 1) + 1, v * m)}[schedule]
    for view in (f, led):
        assert view[f"{schedule}.p2p.count"] == sends
        assert view[f"{schedule}.p2p.bytes"] == sends * MESSAGE
        assert view[f"{schedule}.bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1))
        assert view[f"{schedule}.bubble_ratio"] == pytest.approx((p - 1) / (v * m))
        assert view[f"{schedule}.peak_inflight_microbatches"] == inflight
    assert all(ok for ok, _ in led.checks.values()), led.checks  # parity with the unsplit model, the order run


@pytest.mark.xla
def test_compiled_gpipe_and_circular_programs(xla_world) -> None:
    """p = 2 on 8 devices: four pipelines side by side on the data axis (rows / 4 each)."""
    from shardlab.pipeline.case import ScheduleCase

    p, m, v, r = 2, 4, 2, 4
    views = {}
    for schedule in ("gpipe", "interleaved"):
        view = views[schedule] = harness.hlo(ScheduleCase(SMALL, schedule))
        assert all(ok for ok, _ in view.checks.values()), view.checks  # parity with the dense layers
        vv = v if schedule == "interleaved" else 1
        T = vv * m + p - 1
        key = "spmd" if schedule == "gpipe" else "spmd.circular"
        assert view[f"{key}.trip_count"] == T
        assert view[f"{schedule}.bubble_fraction"] == pytest.approx((p - 1) / T)
        per_iteration = p - 1 if schedule == "gpipe" else p  # pad: p - 1 slots move; the circular cat: p
        directions = 2 if schedule == "gpipe" else 1  # the circular program is compiled forward only
        assert view[f"{key}.p2p.count"] == directions * per_iteration * T
        assert view[f"{key}.p2p.bytes"] == directions * per_iteration * T * MESSAGE
    gp = views["gpipe"]
    assert gp["spmd.collective_permute.bytes"] == 2 * MESSAGE // r  # a quarter slot per device, each way
    assert gp["spmd.all_reduce.in_loop.step_count"] in (0, m + p - 1)  # XLA:CPU: 0 or once per iteration
    assert "spmd.all_reduce.in_loop.step_count" in gp.differs or gp["spmd.all_reduce.in_loop.step_count"] == 0


@pytest.mark.xla
@pytest.mark.parametrize("how", ["cat", "pad", "roll"])
def test_shift_case(xla_world, how: str) -> None:
    from shardlab.pipeline.case import ShiftCase

    case = ShiftCase(SMALL, how)
    view = harness.hlo(case)
    assert all(ok for ok, _ in view.checks.values())  # slot s + 1 holds slot s
    if how in ("cat", "pad"):  # recognised as a shift: one permute of one shard, checked against the formula
        assert not view.differs
        assert view[f"shift.{how}.collective_permute.count"] == 1
        assert view[f"shift.{how}.collective_permute.bytes"] == MESSAGE // 4
    else:  # recorded as measured, with the reason
        assert view.differs and view[f"shift.{how}.all_to_all.count"] >= 1


def test_parameter_rules_name_the_parameter() -> None:
    bad = {"stages": (1, "stages=1: a pipeline of one stage"), "virtual": (1, "virtual=1: the interleaved"),
           "microbatches": (6, "microbatches=6 is not divisible by stages=4"),
           "layers": (7, "layers=7 is fewer than stages \\* virtual = 8"),
           "batch": (12, "batch=12 is not divisible by microbatches=8"), "run_gloo": (1, "run_gloo=1 must be")}
    for name, (value, msg) in bad.items():
        with pytest.raises(ValueError, match=msg):
            PipelineParams(**{name: value}).validate()
