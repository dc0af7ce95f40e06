"""Our schedules against PyTorch's own (torch.distributed.pipelining, torch 2.9.0): the action order each rank
executes must be identical.  GPipe / 1F1B orders come from PyTorch's `_step_microbatches` run on a recording
stage, interleaved ones from `pipeline_order` of a schedule built on a fake process group.  Plus the checks a
schedule must pass and the timeline's deadlock detection."""

from __future__ import annotations

from fractions import Fraction

import pytest

from shardlab.pipeline.schedules import Action, Schedule, build, peak_inflight
from shardlab.pipeline.timeline import simulate
from shardlab.pipeline.torch_ref import as_schedule, torch_drawn_order, torch_orders


@pytest.mark.parametrize(
    "name,p,m,v",
    [
        ("gpipe", 2, 2, 1), ("gpipe", 4, 8, 1), ("gpipe", 3, 5, 1),
        ("1f1b", 2, 2, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 5, 1), ("1f1b", 4, 4, 1),
        ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 2), ("interleaved", 4, 8, 3),
        ("interleaved", 2, 6, 4), ("interleaved", 3, 9, 2), ("interleaved", 3, 3, 2),
    ],
)
def test_our_order_is_pytorchs(name: str, p: int, m: int, v: int) -> None:
    ours = build(name, p, m, v)
    ours.validate()
    assert [list(d) for d in ours.devices] == torch_orders(name, p, m, v)


def test_pytorchs_1f1b_drawing_is_not_what_it_runs() -> None:
    # torch 2.9.0: Schedule1F1B._get_pipeline_order() starts the last rank at F1 and ends it at F{m}; the
    # schedule's _step_microbatches (what runs) starts at F0.  Our order is the executed one.
    p, m = 4, 8
    drawn = [a for a in torch_drawn_order("1f1b", p, m)[p - 1] if a is not None]
    ran = torch_orders("1f1b", p, m)[p - 1]
    assert ran[0] == Action("F", p - 1, 0) and drawn[0] == Action("F", p - 1, 1)
    assert Action("F", p - 1, m) in drawn  # a microbatch that does not exist
    assert list(build("1f1b", p, m).devices[p - 1]) == ran


def test_zero_bubble_orders_from_pytorch_are_valid_and_have_a_smaller_bubble() -> None:
    p, m, v = 4, 8, 2
    interleaved = simulate(build("interleaved", p, m, v), forward=1, backward=2)
    for name in ("interleaved_zb", "zbv"):
        zb = as_schedule(name, p, m, v)
        zb.validate()  # every (stage, microbatch) gets F, I and W once, in dependency order
        assert {a.kind for d in zb.devices for a in d} == {"F", "I", "W"}
        t = simulate(zb, forward=1, backward=2)  # F = I = W per chunk: the zero-bubble papers' setting
        assert t.bubble_ratio < interleaved.bubble_ratio == Fraction(3, 16)


def test_validate_rejects_broken_orders() -> None:
    good = build("1f1b", 2, 2)
    bad_orders = {
        "before its F": ((Action("B", 0, 0), Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 1)),),
        "out of order": ((Action("F", 0, 1), Action("F", 0, 0), Action("B", 0, 0), Action("B", 0, 1)),),
        "incomplete": ((Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 0)),),
        "lives on device 1": ((Action("F", 1, 0),) + good.devices[0],),
    }
    for msg, dev0 in bad_orders.items():
        with pytest.raises(ValueError, match=msg):
            Schedule("bad", 2, 2, 1, dev0 + good.devices[1:]).validate()


def test_timeline_reports_a_deadlocking_order() -> None:
    # device 0 waits in B(0, 0) for device 1's B(1, 0), which device 1 runs only after F(1, 1), which needs
    # device 0's F(0, 1) — queued after B(0, 0).  Each action list alone is valid.
    d0 = (Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1))
    d1 = (Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0), Action("B", 1, 1))
    sched = Schedule("cycle", 2, 2, 1, (d0, d1))
    sched.validate()
    with pytest.raises(ValueError, match=r"deadlocks.*0B0.*1F1"):
        simulate(sched)


def test_p2p_latency_lengthens_the_step_by_the_hops_it_waits_for() -> None:
    # GPipe, p stages, all F = 1, B = 2: the first microbatch crosses p - 1 boundaries going forward and p - 1
    # coming back before the last backward can start on stage 0: 2 (p - 1) latencies on the critical path.
    p, m = 4, 4
    base = simulate(build("gpipe", p, m), 1, 2).makespan
    assert simulate(build("gpipe", p, m), 1, 2, p2p=Fraction(1, 10)).makespan == base + 2 * (p - 1) * Fraction(1, 10)


def test_peak_inflight_of_pytorch_orders_matches_ours() -> None:
    for name, p, m, v in [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2)]:
        assert peak_inflight(as_schedule(name, p, m, v)) == peak_inflight(build(name, p, m, v))


def test_compare_times_every_schedule_to_its_formula() -> None:
    from shardlab.pipeline.timeline import compare

    for p, m, v in [(4, 8, 2), (3, 6, 3), (2, 2, 2), (5, 5, 1)]:
        for r in compare(p, m, v):
            vv = v if r["schedule"] == "interleaved" else 1
            assert r["bubble_fraction"] == Fraction(p - 1, vv * m + p - 1) == r["formula_fraction"]
            assert r["bubble_ratio"] == Fraction(p - 1, vv * m) == r["formula_ratio"]
            assert r["inflight"] == r["formula_inflight"]
    one_f = next(r for r in compare(4, 8, 2) if r["schedule"] == "1f1b")
    assert one_f["inflight"] == 4  # p on stage 0, not m


def test_pytorch_interleaved_runs_where_megatrons_rule_refuses_and_keeps_the_bubble_while_m_ge_p() -> None:
    """PyTorch 2.9's ScheduleInterleaved1F1B accepts m % max(1, m // p) == 0 (Megatron-LM: m % p == 0). Timed
    (F = 1, B = 2), its order has the interleaved bubble (p - 1)/(v m + p - 1) exactly when m >= p, a larger
    one below (the formula written by hand here; 72 (p, m, v) it accepts, p 2..5, v 2..3, m 1..3p)."""
    from shardlab.pipeline.timeline import compare

    seen = 0
    for p in range(2, 6):
        for v in (2, 3):
            for m in range(1, 3 * p + 1):
                if m % max(1, m // p):
                    with pytest.raises(ValueError, match="multiple of the number of rounds"):
                        as_schedule("interleaved", p, m, v)
                    continue
                t = simulate(as_schedule("interleaved", p, m, v), 1, 2)
                assert (t.idle_fraction == Fraction(p - 1, v * m + p - 1)) == (m >= p), (p, m, v)
                seen += 1
    assert seen == 72
    row = next(r for r in compare(4, 6, 2) if r["schedule"] == "interleaved")
    assert row["order"] == "PyTorch" and row["bubble_fraction"] == Fraction(3, 15)
