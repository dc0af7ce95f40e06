"""pipeline.figures: the timeline figure draws every action once and every idle interval, and the idle it draws adds
up to the bubble the simulator measured (p - 1 bubble slots per device at unit costs, counted by hand)."""

from __future__ import annotations

from fractions import Fraction

from shardlab.formulas.pipeline import bubble_ratio
from shardlab.pipeline.figures import KIND_COLOR, idle_intervals, timeline_figure
from shardlab.pipeline.schedules import build
from shardlab.pipeline.timeline import simulate


def test_idle_intervals_add_up_to_the_bubble() -> None:
    p, m = 4, 6
    t = simulate(build("1f1b", p, m), forward=1, backward=2)
    for r in range(p):
        idle = sum(hi - lo for d, lo, hi in idle_intervals(t) if d == r)
        assert idle == (p - 1) * (1 + 2)  # fill and drain: p - 1 forward + backward slots
    # GPipe's device 0 waits once, between its last forward and its first backward
    g = simulate(build("gpipe", p, m), forward=1, backward=2)
    assert [(lo, hi) for d, lo, hi in idle_intervals(g) if d == 0] == [(m, m + 3 * (p - 1))]


def test_figure_has_one_bar_per_action_and_per_idle_interval() -> None:
    sched = build("interleaved", 2, 4, 2)
    t = simulate(sched, forward=1, backward=2)
    fig = timeline_figure(t, formula=bubble_ratio(2, 4, 2))
    actions = [b for b in fig.data if b.marker.color in (KIND_COLOR["F"], KIND_COLOR["B"])]  # a trace per kind
    assert sum(len(b.x) for b in actions) == sum(len(d) for d in sched.devices)
    idle = [b for b in fig.data if b not in actions]
    assert sum(len(b.x) for b in idle) == len(idle_intervals(t))
    assert {x for b in actions for x in b.text} >= {"0·0", "3·1"}  # microbatch·chunk labels
    assert t.bubble_ratio == Fraction(1, 8) and "0.125 (formula 0.125)" in fig.layout.title.text


def test_explorer_update_reports_a_bad_combination_instead_of_raising() -> None:
    from shardlab.core.explorer import explorer_for
    from shardlab.pipeline.params import PipelineParams

    ui, update = explorer_for(PipelineParams(), p=4, m=8, v=2, message_bytes=100)
    good = update()
    assert good["ok"] and not good["errors"]
    rows = {r["schedule"]: r for r in good["rows"]}
    assert rows["interleaved"]["messages"] == 2 * 8 * (4 * 2 - 1)  # 2 m (p v - 1)
    assert rows["gpipe"]["bytes"] == 2 * 8 * 3 * 100
    theirs = update(m=6)  # Megatron-LM's rule (m % p == 0) refuses; PyTorch's ScheduleInterleaved1F1B runs it
    assert theirs["ok"] and not theirs["errors"] and theirs["torch"] == ["interleaved"]
    assert "PyTorch's order runs" in ui.children[1].value  # the status line says so
    bad = update(m=9)  # PyTorch too: 9 % (9 // 4) != 0; GPipe and 1F1B still run
    assert not bad["ok"] and len(bad["errors"]) == 1 and "m=9 must be a multiple of p=4" in bad["errors"][0]
    assert "multiple of the number of rounds" in bad["errors"][0]
    assert {r["schedule"] for r in bad["rows"] if "error" not in r} == {"gpipe", "1f1b"}
    assert not update(p=0)["ok"]  # no schedule at all: reported too

