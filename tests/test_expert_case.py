"""MoECase through the harness on 8 virtual CPU devices and XLA:TPU: every view's values against sizes worked out
by hand here, the views' agreement, the dense-oracle parity checks, the dropless variant (buffers of the largest
load, counted here from the router's choices), and the per-rank code in real gloo processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab import runtime
from shardlab.core import harness
from shardlab.expert.drops import route_groups
from shardlab.expert.moe import inputs, layer
from shardlab.expert.params import ExpertParams

pytestmark = pytest.mark.xla
runtime.setup(num_devices=8)

P = ExpertParams(ep=4, tokens=16, hidden=32, ffn=64, experts=8, top_k=2, capacity_factor=1.25)
C = 5  # ceil(1.25 * 2 * 16 / 8)
ELEMS = 8 * C * 32  # one all-to-all carries the whole [E, C, h] buffer: 1280 elements
A2A = ELEMS * 4  # float32 bytes
EXPERT = 32 * 64 * 4  # one expert's W1 (or W3, W2) in float32


@pytest.fixture(scope="module")
def K(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.expert import case

    return case


def _loads(p: ExpertParams, groups: int) -> list[list[int]]:
    return route_groups(inputs(p, groups)[0], layer(p), groups)[2]


def test_four_views_on_a_2d_mesh(K) -> None:  # type: ignore[no-untyped-def]
    """ep 4 on 8 devices: mesh (data 2, expert 4), two ledger groups of 4 ranks."""
    pytest.importorskip("libtpu")
    case = K.MoECase(P)
    assert (case.data, case.groups) == (2, 8)
    views = {v.source: v for v in harness.views(case)}
    assert all(v.ran for v in views.values())
    for src in ("formula", "ledger", "hlo"):
        v = views[src]
        assert (v["all_to_all.count"], v["all_to_all.bytes"]) == (4, 4 * A2A), src
        assert v["expert_params.per_chip.bytes"] == 2 * 3 * EXPERT, src  # E / ep = 2 experts
    assert (views["ledger"]["fwd.all_to_all.count"], views["ledger"]["fwd.all_to_all.bytes"]) == (2, 2 * A2A)
    # TPU: the same elements, moved in bf16 (half the bytes, recorded with the reason), synchronous
    tpu = views["tpu"]
    assert (tpu["all_to_all.count"], tpu["all_to_all.elements"], tpu["all_to_all.bytes"]) == (4, 4 * ELEMS,
                                                                                              4 * ELEMS * 2)
    assert "bf16" in tpu.differs["all_to_all.bytes"] and tpu["all_to_all.async"] == 0
    # gradient sync: router over all 8 devices + W1, W3, W2 over the data axis (2 experts each)
    sync = 32 * 8 * 4 + 3 * 2 * EXPERT
    for src in ("formula", "hlo"):
        assert (views[src]["grad_sync.all_reduce.count"], views[src]["grad_sync.all_reduce.bytes"]) == (4, sync)
    assert tpu["grad_sync.all_reduce.operands"] == 4 and tpu["grad_sync.all_reduce.count"] < 4  # combined
    # dropped: counted here from the router's loads
    loads = _loads(P, 8)
    dropped = sum(max(0, n - C) for row in loads for n in row)
    for src in ("formula", "ledger"):
        assert views[src]["dropped.fraction"] == dropped / (8 * 16 * 2)
    assert all(row["agree"] for row in harness.compare(list(views.values())))
    checks = {name: ok for v in views.values() for name, (ok, _) in v.checks.items()}
    assert checks and all(checks.values()), checks
    assert {"parity.ledger.grad_experts", "parity.hlo.grads", "hlo.no_all_gather", "tpu.no_all_gather"} <= set(checks)


def test_pure_expert_axis_forward(K) -> None:  # type: ignore[no-untyped-def]
    case = K.MoECase(replace(P, ep=8), backward=False)
    views = {v.source: v for v in harness.views(case, ("formula", "ledger", "hlo"))}
    for v in views.values():
        assert (v["all_to_all.count"], v["all_to_all.bytes"]) == (2, 2 * A2A)
        assert v["expert_params.per_chip.bytes"] == 3 * EXPERT
    assert "grad_sync.all_reduce.count" not in views["hlo"].values  # forward: no gradients to sum
    assert "XLA:CPU: all-to-alls: 2 (f32, groups of 8), all synchronous, none combined" in views["hlo"].notes


def test_dropless(K) -> None:  # type: ignore[no-untyped-def]
    """No capacity: every rank pads its buffers to the largest load of any expert in any group (agreed with one
    all-reduce of a float32 scalar); nothing drops; no static program (the compiler view says why)."""
    case = K.MoECase(P, dropless=True)
    biggest = max(max(row) for row in _loads(P, 4))  # one data group of ep = 4 ranks
    assert biggest > C
    views = {v.source: v for v in harness.views(case, ("formula", "ledger", "hlo"))}
    for src in ("formula", "ledger"):
        v = views[src]
        assert (v["all_to_all.count"], v["all_to_all.bytes"]) == (4, 4 * 8 * biggest * 32 * 4)
        assert (v["all_reduce.count"], v["all_reduce.bytes"], v["dropped.fraction"]) == (1, 4, 0.0)
    assert "dropless" in views["hlo"].skipped
    assert all(ok for ok, _ in views["ledger"].checks.values())


def test_gloo_is_bit_identical(K) -> None:  # type: ignore[no-untyped-def]
    case = K.MoECase(replace(P, ep=2, tokens=8), backward=True)
    sim = harness.ledger(case)
    gloo = harness.gloo(case)
    assert gloo["ledger"] == sim.detail["ledger"]
    assert K.identical(gloo["ranks"], sim.detail["ranks"][0])
