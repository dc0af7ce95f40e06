"""f, g, gather/scatter and the sequence-parallel pair: `ones * rank` inputs, expected values by arithmetic."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import SimulatedWorld
from shardlab.tp import mappings as M


def _fwd_bwd(op, make_x, make_grad):
    """Per-rank: y = op(x); backward with upstream gradient make_grad(rank) -> (y, x.grad)."""

    def fn(c):
        x = make_x(c).requires_grad_(True)
        y = op(x, c)
        (y * make_grad(c, y)).sum().backward()
        return y.detach(), x.grad

    return fn


@pytest.mark.parametrize("w", [1, 2, 4])
def test_f_copies_forward_and_all_reduces_backward(w: int) -> None:
    world = SimulatedWorld(w)
    out = world.run(_fwd_bwd(M.f, lambda c: torch.ones(3) * c.rank, lambda c, y: torch.ones(3) * (c.rank + 1)))
    for r, (y, gx) in enumerate(out):
        assert torch.equal(y, torch.ones(3) * r)  # identity
        assert torch.equal(gx, torch.full((3,), float(w * (w + 1) // 2)))  # sum_r (r + 1)
    assert [(e.op, e.phase, e.tag) for e in world.ledger] == ([("all_reduce", "backward", "f")] if w > 1 else [])


@pytest.mark.parametrize("w", [1, 2, 4])
def test_g_all_reduces_forward_and_is_identity_backward(w: int) -> None:
    world = SimulatedWorld(w)
    out = world.run(_fwd_bwd(M.g, lambda c: torch.ones(3) * c.rank, lambda c, y: torch.ones(3) * (c.rank + 1)))
    for r, (y, gx) in enumerate(out):
        assert torch.equal(y, torch.full((3,), float(sum(range(w)))))  # 0 + 1 + ... + (w-1)
        assert torch.equal(gx, torch.ones(3) * (r + 1))  # identity: own upstream gradient
    assert [(e.op, e.phase, e.tag) for e in world.ledger] == ([("all_reduce", "forward", "g")] if w > 1 else [])


@pytest.mark.parametrize("w", [2, 4])
def test_gather_and_scatter_last_dim(w: int) -> None:
    world = SimulatedWorld(w)
    upstream = torch.arange(2.0 * 2 * w).view(2, 2 * w)  # same on every rank
    out = world.run(_fwd_bwd(M.gather_from_tp_region, lambda c: torch.ones(2, 2) * c.rank, lambda c, y: upstream))
    full = torch.cat([torch.ones(2, 2) * r for r in range(w)], dim=-1)
    for r, (y, gx) in enumerate(out):
        assert torch.equal(y, full)
        assert torch.equal(gx, upstream[:, 2 * r : 2 * r + 2])  # backward keeps own chunk, no collective
    assert [(e.op, e.phase) for e in world.ledger] == [("all_gather", "forward")]

    world = SimulatedWorld(w)
    out = world.run(
        _fwd_bwd(M.scatter_to_tp_region, lambda c: upstream.clone(), lambda c, y: torch.ones(2, 2) * c.rank)
    )
    for r, (y, gx) in enumerate(out):
        assert torch.equal(y, upstream[:, 2 * r : 2 * r + 2])
        assert torch.equal(gx, full)  # backward all-gathers the ranks' gradients
    assert [(e.op, e.phase) for e in world.ledger] == [("all_gather", "backward")]


@pytest.mark.parametrize("w", [2, 4])
def test_sequence_parallel_pair(w: int) -> None:
    # gather along dim 1 forward; reduce-scatter backward: upstream ones * (rank + 1) sums to w(w+1)/2.
    world = SimulatedWorld(w)
    out = world.run(
        _fwd_bwd(
            M.gather_from_sp_region,
            lambda c: torch.ones(1, 2, 3) * c.rank,
            lambda c, y: torch.ones(1, 2 * w, 3) * (c.rank + 1),
        )
    )
    for y, gx in out:
        assert torch.equal(y, torch.cat([torch.ones(1, 2, 3) * r for r in range(w)], dim=1))
        assert torch.equal(gx, torch.full((1, 2, 3), float(w * (w + 1) // 2)))
    assert [(e.op, e.phase) for e in world.ledger] == [("all_gather", "forward"), ("reduce_scatter", "backward")]

    world = SimulatedWorld(w)
    out = world.run(
        _fwd_bwd(
            M.reduce_scatter_to_sp_region,
            lambda c: torch.ones(1, 2 * w, 3) * c.rank,
            lambda c, y: torch.ones(1, 2, 3) * c.rank,
        )
    )
    for y, gx in out:
        assert torch.equal(y, torch.full((1, 2, 3), float(sum(range(w)))))
        assert torch.equal(gx, torch.cat([torch.ones(1, 2, 3) * r for r in range(w)], dim=1))
    assert [(e.op, e.phase) for e in world.ledger] == [("reduce_scatter", "forward"), ("all_gather", "backward")]


def test_scatter_names_indivisible_size() -> None:
    with pytest.raises(Exception, match="size 5 of dim -1 .* is not divisible by tp=2"):
        SimulatedWorld(2).run(lambda c: M.scatter_to_tp_region(torch.ones(5), c))
