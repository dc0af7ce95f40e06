"""formulas.pipeline against the papers' definitions written out here and against brute force: the timeline
simulation of every schedule (exact, in Fractions), in-flight microbatches counted along the action lists, and
point-to-point messages counted stage boundary by stage boundary."""

from __future__ import annotations

from fractions import Fraction

import pytest

from shardlab.formulas import pipeline as fp
from shardlab.pipeline.schedules import build, peak_inflight
from shardlab.pipeline.timeline import simulate

CONFIGS = [  # (schedule, p, m, v)
    ("gpipe", 1, 3, 1), ("gpipe", 2, 4, 1), ("gpipe", 4, 8, 1), ("gpipe", 4, 2, 1), ("gpipe", 3, 7, 1),
    ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("1f1b", 5, 7, 1),
    ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 2), ("interleaved", 4, 8, 3),
    ("interleaved", 2, 6, 4), ("interleaved", 3, 3, 2), ("interleaved", 1, 3, 2),
]


def test_narayanan_bubble_written_from_the_paper() -> None:
    # Section 2.2: t_id = m (t_f + t_b), t_pb = (p - 1)(t_f + t_b); interleaved t_pb = (p - 1)(t_f + t_b) / v.
    for p, m, v in [(4, 8, 1), (8, 32, 1), (4, 8, 2), (8, 64, 4)]:
        t_f, t_b = Fraction(1), Fraction(2)
        t_id = m * (t_f + t_b)
        t_pb = (p - 1) * (t_f + t_b) / v
        assert fp.bubble_ratio(p, m, v) == pytest.approx(float(t_pb / t_id), rel=1e-15)
        assert fp.idle_fraction(p, m, v) == pytest.approx(float(t_pb / (t_pb + t_id)), rel=1e-15)
    assert fp.idle_fraction(4, 8) == pytest.approx(3 / 11)  # GPipe (Huang et al. 2019): (K - 1) / (M + K - 1)


@pytest.mark.parametrize("name,p,m,v", CONFIGS)
@pytest.mark.parametrize("t_b", [1, 2, 3])
def test_simulated_bubble_equals_the_formula_exactly(name: str, p: int, m: int, v: int, t_b: int) -> None:
    t = simulate(build(name, p, m, v), forward=1, backward=t_b)  # integer costs: timed in Fractions
    assert t.bubble_ratios == [Fraction(p - 1, v * m)] * p
    assert t.idle_fractions == [Fraction(p - 1, v * m + p - 1)] * p
    # the step: ideal + bubble, in per-device units (1 + t_b per microbatch and device)
    assert t.makespan == (m + Fraction(p - 1, v)) * (1 + t_b)
    assert t.makespan == pytest.approx(fp.uniform_step_time(p, m, p * 1, p * t_b, v))


@pytest.mark.parametrize("name,p,m,v", CONFIGS)
def test_peak_inflight_formula_counts_what_the_order_holds(name: str, p: int, m: int, v: int) -> None:
    assert fp.peak_inflight_per_device(name, p, m, v) == peak_inflight(build(name, p, m, v))


def test_1f1b_holds_at_most_p_microbatches_gpipe_holds_m() -> None:
    assert max(fp.peak_inflight_per_device("1f1b", 4, 32)) == 4
    assert min(fp.peak_inflight_per_device("gpipe", 4, 32)) == 32


@pytest.mark.parametrize("name,p,m,v", CONFIGS)
def test_p2p_traffic_counts_every_cross_device_boundary(name: str, p: int, m: int, v: int) -> None:
    sched = build(name, p, m, v)
    mb, seq, h, f32 = 2, 4, 8, 4
    got = fp.p2p_traffic(p, m, mb, seq, h, "float32", v=v)
    # brute force: each microbatch crosses stage s -> s + 1 forward and back, when the two differ in device
    per_device = [0] * p
    for s in range(sched.stages - 1):
        if sched.device_of(s) != sched.device_of(s + 1):
            per_device[sched.device_of(s)] += m  # activations sent forward
            per_device[sched.device_of(s + 1)] += m  # gradients sent backward
    assert got["count"] == sum(per_device)
    assert got["bytes"] == sum(per_device) * mb * seq * h * f32
    assert [got[f"device.{r}.count"] for r in range(p)] == per_device
    if p > 1:  # every one of the p v - 1 boundaries crosses devices: v times GPipe's (p v - 1) / (p - 1)
        assert got["count"] == 2 * m * (p * v - 1)


def test_pipeline_step_time_is_gpipe_with_uneven_stages() -> None:
    f = [3, 1, 2, 5]
    for b in ([6, 2, 4, 10], [1, 4, 1, 2]):  # proportional, and not
        for m in (1, 4, 9):
            sim = simulate(build("gpipe", 4, m), stage_costs=list(zip(f, b, strict=True)))
            assert sim.makespan == fp.pipeline_step_time(f, b, m)
    # proportional backward: sum(f + b) + (m - 1) max(f + b)
    assert fp.pipeline_step_time(f, [2 * x for x in f], 8) == 3 * (sum(f) + 7 * max(f))


def test_bad_arguments_name_the_rule() -> None:
    with pytest.raises(ValueError, match="m=6 must be a multiple of p=4"):
        fp.check_pipeline(4, 6, 2, "interleaved")
    with pytest.raises(ValueError, match="v=2: only the interleaved"):
        fp.peak_inflight("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="p=0 must be an int >= 1"):
        fp.bubble_ratio(0, 4)
    with pytest.raises(ValueError, match="schedule='zb'"):
        fp.check_pipeline(2, 2, 1, "zb")
    with pytest.raises(ValueError, match="device=4 is not in"):
        fp.peak_inflight("gpipe", 4, 8, device=4)
