"""Expert parallelism per rank vs the dense MoE oracle (one routing group per rank): outputs, input, router and
expert gradients; the ledger's all-to-alls vs formulas.expert. float64: the same sums in another order (1e-10).
The router's gradient is summed over ranks (each rank's covers its own tokens: the data-parallel all-reduce)."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.expert.moe import MoE, moe_reference
from shardlab.expert.parallel import expert_range, moe_step
from shardlab.expert.params import ExpertParams
from shardlab.formulas import expert as fexp

T, H, F, E, K = 64, 16, 24, 8, 2
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _setup(cf: float, seed: int = 0) -> tuple[MoE, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    moe = MoE(ExpertParams(hidden=H, ffn=F, experts=E, top_k=K, capacity_factor=cf), g).double()
    return moe, torch.randn(T, H, generator=g, dtype=torch.float64), torch.randn(T, H, generator=g,
                                                                                   dtype=torch.float64)


def _dense(moe: MoE, x: torch.Tensor, target: torch.Tensor, groups: int,  # type: ignore[no-untyped-def]
           dropless: bool = False):
    moe.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_()
    ref = moe_reference(xr, moe, groups, dropless)
    (0.5 * (ref.out - target).pow(2).sum()).backward()  # the step's loss: ½‖y − target‖²
    return ref, xr.grad


def _check(results, moe, ref, grad_x, ep):  # type: ignore[no-untyped-def]
    torch.testing.assert_close(torch.cat([r["out"] for r in results]), ref.out.detach(), **TOL)
    torch.testing.assert_close(torch.cat([r["grad_x"] for r in results]), grad_x, **TOL)
    torch.testing.assert_close(sum(r["grad_router"] for r in results), moe.router.grad, **TOL)
    for name in ("w1", "w3", "w2"):
        torch.testing.assert_close(torch.cat([r["grads"][name] for r in results]), getattr(moe, name).grad, **TOL)
    assert [r["experts"] for r in results] == [list(expert_range(E, ep, r)) for r in range(ep)]
    assert [r["dropped"] for r in results] == [len(rt.dropped) for rt in ref.routings]


@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("cf", [0.5, 1.25])
def test_expert_parallel_matches_dense_and_formula(ep: int, cf: float) -> None:
    moe, x, target = _setup(cf)
    ref, grad_x = _dense(moe, x, target, groups=ep)
    world = SimulatedWorld(ep)
    results = world.run(moe_step, moe, x, target)
    _check(results, moe, ref, grad_x, ep)
    led = world.ledger
    for backward in (False, True):
        want = fexp.all_to_all(T // ep, H, E, K, cf, ep, "float64", backward=backward)
        phases = ("forward", "backward") if backward else ("forward",)
        got_count = sum(led.count("all_to_all", p) for p in phases)
        got_bytes = sum(led.payload_bytes("all_to_all", p) for p in phases)
        got_wire = sum(led.wire_bytes("all_to_all", p) for p in phases)
        assert {"count": got_count, "bytes": got_bytes, "wire_bytes": got_wire} == want
    assert led.count() == led.count("all_to_all")  # nothing else moves
    assert [e.tag for e in led.select("all_to_all", "forward")] == (["ep.dispatch", "ep.combine"] if ep > 1 else [])


def test_dropless_sizes_buffers_by_the_largest_load() -> None:
    moe, x, target = _setup(1.0, seed=1)
    ref, grad_x = _dense(moe, x, target, groups=4, dropless=True)
    world = SimulatedWorld(4)
    results = world.run(moe_step, moe, x, target, dropless=True)
    _check(results, moe, ref, grad_x, 4)
    biggest = max(max(rt.loads) for rt in ref.routings)
    assert {r["capacity"] for r in results} == {biggest} and all(r["dropped"] == 0 for r in results)
    assert biggest > 16 * K // E  # the routing is uneven: the buffers grow past the mean load (cf 1.0's C = 4)
    led = world.ledger
    assert led.count("all_reduce") == 1 and led[0].tag == "ep.capacity"  # agree on C first
    assert led.payload_bytes("all_to_all", "forward") == fexp.all_to_all(16, H, E, K, 1.0, 4, "float64",
                                                                         slots=biggest)["bytes"]


def test_gloo_matches_simulated() -> None:
    moe, x, target = _setup(1.25, seed=2)
    sim, dist = SimulatedWorld(2), DistributedWorld(2)
    a, b = sim.run(moe_step, moe, x, target), dist.run(moe_step, moe, x, target)
    for ra, rb in zip(a, b, strict=True):
        for name in ("out", "grad_x", "grad_router"):
            torch.testing.assert_close(ra[name], rb[name], rtol=0, atol=0)  # all-to-all moves, never adds
    assert dist.ledger.summary().equals(sim.ledger.summary())


def test_errors() -> None:
    moe, x, target = _setup(1.0)
    with pytest.raises(Exception, match="experts=8 is not divisible by ep=3"):
        SimulatedWorld(3).run(moe_step, moe, x[:63], target[:63])
    with pytest.raises(Exception, match="tokens=63 is not divisible by ep=2"):
        SimulatedWorld(2).run(moe_step, moe, x[:63], target[:63])
