"""FlatUnit (FULL_SHARD over a Comm) vs unsharded full-batch training, and its ledger vs the formula.

Oracle: the same model trained without sharding on the full batch with torch.optim (SGD / Adam). The
comparison is approximate (float tolerance): per-rank means averaged over ranks sum in a different order
than one full-batch mean. Ledger vs formula is exact (integer bytes).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.formulas.fsdp import flat_rank_memory, flat_step_comm
from shardlab.fsdp.flat_param import module_params, plan_flat_shards, plan_flat_shards_for
from shardlab.fsdp.params import FsdpParams
from shardlab.fsdp.train import FlatCase, fsdp_rank_program, gather_params, make_model, reference_train
from shardlab.fsdp.unit import FlatUnit


def _case(world_size: int, layer_sizes: tuple[int, ...], batch: int, steps: int = 1, align: bool = False,
          **variant: Any) -> FlatCase:
    return FlatCase(FsdpParams(world_size=world_size, layer_sizes=layer_sizes, batch=batch, steps=steps, align=align),
                    **variant)


def _parity(results, case: FlatCase) -> None:  # type: ignore[no-untyped-def]
    ours = gather_params(case, results)
    ref, ref_losses = reference_train(case)
    assert len(ours) == len(ref)
    names = [n for n, _ in module_params(case.model())]
    for name, a, b in zip(names, ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    # the mean of the per-rank losses of step 0 is the full-batch loss (same parameters before any update)
    assert sum(r.losses[0] for r in results) / case.p.world_size == pytest.approx(ref_losses[0], rel=1e-5)
    # and the parameters moved: the test is not comparing two untouched initialisations
    init = [p.detach() for p in dict.fromkeys(case.model().parameters())]
    assert any(not torch.allclose(a, b) for a, b in zip(ours, init, strict=True))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("optimizer", "use_orig_params", "tied", "nested"),
                         [("sgd", False, False, False), ("adam", False, True, False), ("adam", True, False, False),
                          ("sgd", True, True, False), ("adam", False, False, True), ("sgd", True, False, True)])
def test_parity_with_unsharded_training(world_size: int, optimizer: str, use_orig_params: bool, tied: bool,
                                        nested: bool) -> None:
    case = _case(world_size, (5, 7, 5), 12, steps=3, align=use_orig_params, optimizer=optimizer, tied=tied,
                 nested=nested)
    world = SimulatedWorld(world_size)
    _parity(world.run(fsdp_rank_program, case), case)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ledger_and_memory_match_formula(world_size: int) -> None:
    case = _case(world_size, (6, 9, 3), 12, steps=2, optimizer="adam")
    world = SimulatedWorld(world_size)
    results = world.run(fsdp_rank_program, case)
    plan = plan_flat_shards_for(case.model(), world_size)
    f = flat_step_comm(plan.flat_numel, world_size, elem_bytes=4, root=True)
    led = world.ledger
    # per step of a model that is one (root) unit: forward all-gather, backward reduce-scatter — the root is not
    # resharded after forward, so no backward all-gather (PyTorch's rule; test_fsdp_torch compares with it)
    steps = case.p.steps
    assert [(e.op, e.phase) for e in led] == [("all_gather", "forward"), ("reduce_scatter", "backward")] * steps
    assert led.payload_bytes("all_gather") == f.all_gather_bytes * steps
    assert led.payload_bytes("reduce_scatter") == f.reduce_scatter_bytes * steps
    assert all(e.payload_bytes == f.all_gather_payload_bytes for e in led.select("all_gather"))
    assert all(e.payload_bytes == f.reduce_scatter_payload_bytes for e in led.select("reduce_scatter"))
    assert led.wire_bytes() == pytest.approx(f.wire_bytes(world_size) * steps, rel=1e-12)
    mem = flat_rank_memory(plan.flat_numel, world_size, elem_bytes=4, optimizer="adam")
    for r in results:  # measured tensor storages vs the formula
        assert r.persistent_bytes == {"param_shard": mem.param_shard, "grad_shard": mem.grad_shard,
                                      "optimizer": mem.optimizer}
        assert r.peak_unsharded_bytes == mem.unsharded_param + mem.unsharded_grad


@pytest.mark.parametrize("world_size", [2, 3])
def test_nested_units_ledger_match_formula(world_size: int) -> None:
    """Inner unit (first Linear, non-root): all-gather in forward AND backward; root: forward only."""
    case = _case(world_size, (6, 9, 3), 12, steps=2, optimizer="sgd", nested=True)
    world = SimulatedWorld(world_size)
    world.run(fsdp_rank_program, case)
    plans = case.plans()
    steps = case.p.steps
    root = flat_step_comm(plans[""].flat_numel, world_size, root=True)
    inner = flat_step_comm(plans["0"].flat_numel, world_size)
    led = world.ledger
    assert led.count("all_gather") == (root.all_gather_count + inner.all_gather_count) * steps == 3 * steps
    assert led.payload_bytes() == (root.all_gather_bytes + root.reduce_scatter_bytes + inner.all_gather_bytes
                                   + inner.reduce_scatter_bytes) * steps
    assert [(e.op, e.phase, e.payload_bytes) for e in led][:5] == [
        ("all_gather", "forward", root.all_gather_payload_bytes),  # the root unshards first (outermost forward)
        ("all_gather", "forward", inner.all_gather_payload_bytes),
        ("all_gather", "backward", inner.all_gather_payload_bytes),  # only the inner unit was resharded
        ("reduce_scatter", "backward", inner.reduce_scatter_payload_bytes),
        ("reduce_scatter", "backward", root.reduce_scatter_payload_bytes),
    ]


@pytest.mark.parametrize(("reshard", "expect_after_forward"), [(None, "kept"), (True, "freed")])
def test_root_keeps_the_unsharded_copy_from_forward_to_backward(reshard, expect_after_forward) -> None:
    p = FsdpParams(layer_sizes=(4, 6, 2), batch=4)

    def program(comm):
        unit = FlatUnit(make_model(p), comm, reshard_after_forward=reshard)
        out = unit(torch.randn(2, 4))
        after_forward = unit._full.untyped_storage().nbytes()
        out.sum().backward()
        return unit.is_root, after_forward, unit._full.untyped_storage().nbytes(), unit.shard.grad is not None

    for is_root, after_fwd, after_bwd, has_grad in SimulatedWorld(2).run(program):
        assert is_root and (after_bwd, has_grad) == (0, True)  # always freed after backward
        assert (after_fwd > 0) == (expect_after_forward == "kept")


def test_gloo_matches_simulated_and_oracle() -> None:
    case = _case(2, (5, 7, 5), 8, steps=2, align=True, optimizer="adam")
    dist_world = DistributedWorld(2)
    res_dist = dist_world.run(fsdp_rank_program, case)
    sim_world = SimulatedWorld(2)
    res_sim = sim_world.run(fsdp_rank_program, case)
    _parity(res_dist, case)
    for a, b in zip(res_dist, res_sim, strict=True):  # W=2: a + b == b + a, so bit-identical
        torch.testing.assert_close(a.shard, b.shard, rtol=0, atol=0)
    assert dist_world.ledger == sim_world.ledger


def test_bad_input() -> None:
    def run(fn):
        return SimulatedWorld(1).run(fn)[0]

    with pytest.raises(Exception, match="has no parameters"):
        run(lambda comm: FlatUnit(nn.ReLU(), comm))
    with pytest.raises(Exception, match="plan does not match the module"):
        run(lambda comm: FlatUnit(nn.Linear(3, 2), comm, plan=plan_flat_shards([6, 3], 1)))
    with pytest.raises(ValueError, match="batch=10 is not divisible by world_size=4"):
        FlatCase(FsdpParams(world_size=4, batch=10))
    with pytest.raises(Exception, match="world_size=4 but the program runs on 2 ranks"):
        SimulatedWorld(2).run(fsdp_rank_program, _case(4, (4, 6, 2), 8))
    with pytest.raises(ValueError, match="optimizer='lamb' must be one of"):
        _case(2, (4, 6, 2), 8, optimizer="lamb")
    with pytest.raises(ValueError, match="tied=True needs layer_sizes"):
        _case(2, (4, 6, 2), 8, tied=True)
    with pytest.raises(ValueError, match="nested=True needs"):
        _case(2, (4, 6), 8, nested=True)
    half = nn.Linear(2, 2)
    half.register_buffer("b", torch.ones(1))
    half.weight = nn.Parameter(torch.ones(2, 2, dtype=torch.int32), requires_grad=False)
    with pytest.raises(Exception, match="'weight' has dtype torch.int32"):
        run(lambda comm: FlatUnit(half, comm))
