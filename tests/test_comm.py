"""shardlab.comm: collectives checked with `ones * rank` arithmetic, ledger rows checked against the suite's
byte rules written out independently here, autograd through per-rank threads, and gloo vs simulated."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import (
    CollectiveMismatch,
    DistributedWorld,
    RankError,
    SimulatedWorld,
    current_phase,
    ring_wire_bytes,
)

F32 = 4  # bytes per float32 element


# ---- collectives: expected values follow from rank arithmetic ------------------------------------
@pytest.mark.parametrize("w", [2, 3, 4])
def test_all_reduce_sum_and_max(w: int) -> None:
    world = SimulatedWorld(w)
    outs = world.run(
        lambda c: (c.all_reduce(torch.ones(3) * c.rank), c.all_reduce(torch.ones(3) * c.rank, "max"))
    )
    total = sum(range(w))  # 0 + 1 + ... + (w-1), e.g. 6 for w=4
    for s, m in outs:
        assert torch.equal(s, torch.full((3,), float(total)))
        assert torch.equal(m, torch.full((3,), float(w - 1)))
    assert [e.reduce_op for e in world.ledger] == ["sum", "max"]


@pytest.mark.parametrize("w", [2, 4])
@pytest.mark.parametrize("dim", [0, -1])
def test_all_gather_concatenates_in_rank_order(w: int, dim: int) -> None:
    world = SimulatedWorld(w)
    outs = world.run(lambda c: c.all_gather(torch.ones(2, 3) * c.rank, dim=dim))
    expected = torch.cat([torch.ones(2, 3) * r for r in range(w)], dim=dim)
    for out in outs:
        assert torch.equal(out, expected)
    (e,) = world.ledger
    assert (e.op, e.shape, e.dim, e.payload_bytes) == ("all_gather", (2, 3), dim % 2, 6 * F32)
    assert e.wire_bytes == (w - 1) * 6 * F32


@pytest.mark.parametrize("w", [2, 4])
def test_reduce_scatter_gives_each_rank_its_chunk_of_the_sum(w: int) -> None:
    world = SimulatedWorld(w)
    # rank r contributes (r + 1) * [0, 1, ..., 2w-1]; the sum is w(w+1)/2 * arange.
    outs = world.run(lambda c: c.reduce_scatter(torch.arange(2.0 * w) * (c.rank + 1), dim=0))
    full = torch.arange(2.0 * w) * (w * (w + 1) // 2)
    for r, out in enumerate(outs):
        assert torch.equal(out, full[2 * r : 2 * r + 2])
    (e,) = world.ledger
    assert e.payload_bytes == 2 * w * F32  # the full input (payload convention)
    assert e.wire_bytes == pytest.approx((w - 1) / w * 2 * w * F32)


def test_inputs_are_not_modified_and_results_are_per_rank_copies() -> None:
    def fn(c):
        x = torch.ones(2) * c.rank
        y = c.all_reduce(x)
        y.add_(100 * c.rank)  # must not leak into other ranks' results
        return x, y

    outs = SimulatedWorld(2).run(fn)
    assert torch.equal(outs[0][0], torch.zeros(2)) and torch.equal(outs[1][0], torch.ones(2))
    assert torch.equal(outs[0][1], torch.ones(2)) and torch.equal(outs[1][1], torch.full((2,), 101.0))


def test_world_size_one_bypasses_and_records_nothing() -> None:
    world = SimulatedWorld(1)
    x = torch.randn(3)
    (res,) = world.run(lambda c: [c.all_reduce(x), c.all_gather(x), c.reduce_scatter(x), c.all_to_all(x)])
    assert all(r is x for r in res)
    assert len(world.ledger) == 0


# ---- ledger rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("w", [2, 4, 8])
def test_ledger_payload_and_wire_follow_design_rules(w: int) -> None:
    world = SimulatedWorld(w)
    world.run(lambda c: c.all_reduce(torch.ones(5, 7, dtype=torch.float64)))
    (e,) = world.ledger
    payload = 5 * 7 * 8  # float64 input of one rank
    assert (e.seq, e.op, e.group_size, e.dtype, e.shape, e.phase) == (
        0,
        "all_reduce",
        w,
        "float64",
        (5, 7),
        "forward",
    )
    assert e.payload_bytes == payload
    assert e.wire_bytes == pytest.approx(2 * (w - 1) / w * payload)


def test_ring_wire_bytes_rules() -> None:
    assert ring_wire_bytes("all_reduce", 100, 4) == 150.0  # 2 * 3/4 * 100
    assert ring_wire_bytes("all_gather", 100, 4) == 300.0  # 3 * 100
    assert ring_wire_bytes("reduce_scatter", 100, 4) == 75.0  # 3/4 * 100
    assert ring_wire_bytes("all_reduce", 100, 1) == 0.0
    with pytest.raises(ValueError, match="op='scatter'"):
        ring_wire_bytes("scatter", 1, 2)


def test_ledger_helpers_and_frame() -> None:
    world = SimulatedWorld(2)
    world.run(lambda c: (c.all_reduce(torch.ones(4), tag="a"), c.all_gather(torch.ones(4), tag="b")))
    led = world.ledger
    assert led.count() == 2 and led.count("all_reduce") == 1 and led.count(tag="b") == 1
    assert led.payload_bytes() == 2 * 4 * F32
    df = led.to_frame()
    assert list(df["op"]) == ["all_reduce", "all_gather"] and list(df["seq"]) == [0, 1]
    assert led.summary()["count"].sum() == 2
    with pytest.raises(ValueError, match="phase='fwd'"):
        led.count(phase="fwd")


# ---- autograd through per-rank threads -----------------------------------------------------------
class _CopyAllReduceBackward(torch.autograd.Function):
    """Test-local `f`: identity forward, all-reduce backward (the mapping under test lives in shardlab.tp)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        assert current_phase() == "backward"
        return ctx.comm.all_reduce(g, tag="f"), None


@pytest.mark.parametrize("w", [2, 4])
def test_backward_runs_in_rank_threads_and_is_labelled_backward(w: int) -> None:
    def fn(c):
        x = torch.ones(3, requires_grad=True)
        y = _CopyAllReduceBackward.apply(x, c) * (c.rank + 1)  # dy/dx on rank r = r + 1
        y.sum().backward()
        return x.grad

    world = SimulatedWorld(w)
    grads = world.run(fn)
    expected = float(w * (w + 1) // 2)  # sum over ranks of (r + 1)
    assert all(torch.equal(g, torch.full((3,), expected)) for g in grads)
    assert [(e.phase, e.tag) for e in world.ledger] == [("backward", "f")]


# ---- errors --------------------------------------------------------------------------------------
def test_bad_arguments_name_their_values() -> None:
    def fn(c, which):
        x = torch.ones(3)
        if which == "op":
            c.all_reduce(x, op="mean")
        elif which == "rs":
            c.reduce_scatter(x)
        elif which == "dst":
            c.send(x, dst=5)
        else:
            c.all_gather(x, dim=2)

    for which, msg in [
        ("op", "op='mean'"),
        ("rs", "size 3 along dim=0 is not divisible by world_size=2"),
        ("dst", "dst=5"),
        ("dim", "dim=2 is out of range"),
    ]:
        with pytest.raises(RankError, match=msg):
            SimulatedWorld(2).run(fn, which)
    with pytest.raises(ValueError, match="world_size=0"):
        SimulatedWorld(0)


def test_mismatched_collectives_are_reported_not_hung() -> None:
    def different_ops(c):
        return c.all_reduce(torch.ones(2)) if c.rank == 0 else c.all_gather(torch.ones(2))

    with pytest.raises(CollectiveMismatch, match=r"rank 0 called all_reduce.*rank 1 called all_gather"):
        SimulatedWorld(2).run(different_ops)

    def different_shapes(c):
        return c.all_reduce(torch.ones(2 + c.rank))

    with pytest.raises(CollectiveMismatch, match=r"\(2,\).*\(3,\)"):
        SimulatedWorld(2).run(different_shapes)


def test_exception_on_one_rank_releases_the_others() -> None:
    def fn(c):
        if c.rank == 1:
            raise ValueError("boom on purpose")
        return c.all_reduce(torch.ones(1))

    with pytest.raises(RankError, match="rank 1 failed: ValueError: boom on purpose"):
        SimulatedWorld(3, timeout_s=30).run(fn)


# ---- gloo: same program, real processes ----------------------------------------------------------
def _tour(comm, n: int):
    """Every collective once, plus one in backward; float64 so sums agree to rounding across backends."""
    x = torch.arange(n * comm.world_size, dtype=torch.float64) * (comm.rank + 1)
    w = torch.ones(n, dtype=torch.float64, requires_grad=True)
    y = _CopyAllReduceBackward.apply(w, comm) * (comm.rank + 1)
    y.sum().backward()
    return {
        "sum": comm.all_reduce(x),
        "max": comm.all_reduce(x, "max"),
        "gather": comm.all_gather(x[:n].reshape(1, n), dim=0),
        "scatter": comm.reduce_scatter(x),
        "grad": w.grad,
    }


@pytest.mark.slow
@pytest.mark.parametrize("w", [2, 4])
def test_gloo_matches_simulated(w: int) -> None:
    sim = SimulatedWorld(w)
    expected = sim.run(_tour, 3)
    world = DistributedWorld(w)
    got = world.run(_tour, 3)
    ledger = world.ledger
    assert len(got) == w
    for r in range(w):
        for k in expected[r]:
            # exact for W=2 (a+b == b+a); gloo may sum 4 ranks in another order -> float64 rounding only
            torch.testing.assert_close(got[r][k], expected[r][k], rtol=1e-12, atol=0)
    assert ledger == sim.ledger
    assert [e.phase for e in ledger] == ["backward"] + ["forward"] * 4


def _fails_on_rank_one(comm):
    if comm.rank == 1:
        raise ValueError("gloo boom")
    return comm.rank


@pytest.mark.slow
def test_gloo_reports_rank_errors() -> None:
    with pytest.raises(RankError, match="(?s)rank 1 failed.*gloo boom"):
        DistributedWorld(2, timeout_s=20).run(_fails_on_rank_one)
