"""FlatUnit (FULL_SHARD over a Comm) vs unsharded full-batch training, and its ledger vs the formula.

Oracle: the same model trained without sharding on the full batch with torch.optim (SGD / Adam). The
comparison is approximate (float tolerance): per-rank means averaged over ranks sum in a different order
than one full-batch mean. Ledger vs formula is exact (integer bytes).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.formulas.fsdp import flat_rank_memory, flat_step_comm
from shardlab.fsdp.flat_param import plan_flat_shards, plan_flat_shards_for
from shardlab.fsdp.train import TrainConfig, fsdp_rank_program, make_model, reference_train
from shardlab.fsdp.unit import FlatUnit, unflatten


def _parity(results, cfg: TrainConfig, world_size: int) -> None:
    plan = plan_flat_shards_for(make_model(cfg), world_size, use_orig_params=cfg.use_orig_params)
    ours = unflatten(plan, [r.shard for r in results], results[0].shapes)
    ref, ref_losses = reference_train(cfg)
    assert len(ours) == len(ref)
    for name, a, b in zip(results[0].names, ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    # the mean of the per-rank losses of step 0 is the full-batch loss (same parameters before any update)
    assert sum(r.losses[0] for r in results) / world_size == pytest.approx(ref_losses[0], rel=1e-5)
    # and the parameters moved: the test is not comparing two untouched initialisations
    init = [p.detach() for p in dict.fromkeys(make_model(cfg).parameters())]
    assert any(not torch.allclose(a, b) for a, b in zip(ours, init, strict=True))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("optimizer", "use_orig_params", "tied"),
                         [("sgd", False, False), ("adam", False, True), ("adam", True, False), ("sgd", True, True)])
def test_parity_with_unsharded_training(world_size: int, optimizer: str, use_orig_params: bool, tied: bool) -> None:
    cfg = TrainConfig(layer_sizes=(5, 7, 5), batch=12, steps=3, optimizer=optimizer,
                      use_orig_params=use_orig_params, tied=tied)
    world = SimulatedWorld(world_size)
    _parity(world.run(fsdp_rank_program, cfg), cfg, world_size)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ledger_and_memory_match_formula(world_size: int) -> None:
    cfg = TrainConfig(layer_sizes=(6, 9, 3), batch=12, steps=2, optimizer="adam")
    world = SimulatedWorld(world_size)
    results = world.run(fsdp_rank_program, cfg)
    plan = plan_flat_shards_for(make_model(cfg), world_size)
    f = flat_step_comm(plan.flat_numel, world_size, elem_bytes=4)
    led = world.ledger
    # per step: forward all-gather, backward all-gather, backward reduce-scatter, in that order
    assert [(e.op, e.phase) for e in led] == [("all_gather", "forward"), ("all_gather", "backward"),
                                             ("reduce_scatter", "backward")] * cfg.steps
    assert led.payload_bytes("all_gather") == f.all_gather_bytes * cfg.steps
    assert led.payload_bytes("reduce_scatter") == f.reduce_scatter_bytes * cfg.steps
    assert all(e.payload_bytes == f.all_gather_payload_bytes for e in led.select("all_gather"))
    assert all(e.payload_bytes == f.reduce_scatter_payload_bytes for e in led.select("reduce_scatter"))
    assert led.wire_bytes() == pytest.approx(f.wire_bytes(world_size) * cfg.steps, rel=1e-12)
    mem = flat_rank_memory(plan.flat_numel, world_size, elem_bytes=4, optimizer="adam")
    for r in results:  # measured tensor storages vs the formula
        assert r.persistent_bytes == {"param_shard": mem.param_shard, "grad_shard": mem.grad_shard,
                                      "optimizer": mem.optimizer}
        assert r.peak_unsharded_bytes == mem.unsharded_param + mem.unsharded_grad


def test_unsharded_copy_is_freed_between_forward_and_backward() -> None:
    cfg = TrainConfig(layer_sizes=(4, 6, 2), batch=4)

    def program(comm):
        unit = FlatUnit(make_model(cfg), comm)
        out = unit(torch.randn(2, 4))
        after_forward = unit._full.untyped_storage().nbytes()
        out.sum().backward()
        return after_forward, unit._full.untyped_storage().nbytes(), unit.shard.grad is not None

    for after_fwd, after_bwd, has_grad in SimulatedWorld(2).run(program):
        assert (after_fwd, after_bwd, has_grad) == (0, 0, True)


def test_gloo_matches_simulated_and_oracle() -> None:
    cfg = TrainConfig(layer_sizes=(5, 7, 5), batch=8, steps=2, optimizer="adam", use_orig_params=True)
    dist_world = DistributedWorld(2)
    res_dist = dist_world.run(fsdp_rank_program, cfg)
    sim_world = SimulatedWorld(2)
    res_sim = sim_world.run(fsdp_rank_program, cfg)
    _parity(res_dist, cfg, 2)
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
    with pytest.raises(Exception, match="batch=10 is not divisible by world_size=4"):
        SimulatedWorld(4).run(fsdp_rank_program, TrainConfig(batch=10))
    half = nn.Linear(2, 2)
    half.register_buffer("b", torch.ones(1))
    half.weight = nn.Parameter(torch.ones(2, 2, dtype=torch.int32), requires_grad=False)
    with pytest.raises(Exception, match="'weight' has dtype torch.int32"):
        run(lambda comm: FlatUnit(half, comm))
