"""The memory figures draw what they are given: one trace per order with the order's peak, the phases of the
program order, flash vs plain points on a log axis."""

from __future__ import annotations

from shardlab.memory import figures as V
from shardlab.memory import flash as F
from shardlab.memory import ilp
from shardlab.profile import order as O


def test_order_profiles_figure() -> None:
    g = O.roam_toy()
    p = ilp.problem_from_graph(g)
    orders = {"program": ("V0", "V1", "V2", "V3"), "ilp": ilp.solve(p).order}
    fig = V.order_profiles_figure(g, orders, {"V0": "forward", "V1": "forward", "V2": "backward:0",
                                              "V3": "update:w"})
    assert [t.name for t in fig.data] == ["program (peak 0.00 MiB)", "ilp (peak 0.00 MiB)"]
    assert max(fig.data[0].y) * V.MIB == 17 and max(fig.data[1].y) * V.MIB == 12  # the toy's 17 vs 12
    assert len(fig.layout.shapes) == 3  # forward, backward, update


def test_flash_figure_and_bars() -> None:
    rows = [F.AttentionMemory({"kernel": k, "seq": s, "tensor": 1}, "v5e-1", fits, temp, 0, 0, 0, 1.0,
                              [F.Buffer(temp, "bf16[2,2]", "x", k == "plain")])
            for k, s, fits, temp in (("plain", 1024, True, 2**30), ("plain", 2048, False, 2**33),
                                     ("flash", 1024, True, 2**20), ("flash", 2048, True, 2**21))]
    fig = V.flash_figure(rows)
    names = [t.name for t in fig.data]
    assert names[:2] == ["plain: XLA:TPU", "plain: planner"] and "flash: XLA:TPU" in names
    assert list(fig.data[0].marker.symbol) == ["circle", "circle-open"]  # the second did not fit
    bars = V.schedule_figure({"eager": 3 * V.MIB, "end": 5 * V.MIB, "best": 3 * V.MIB})
    assert list(bars.data[0].y) == [3, 5, 3]
