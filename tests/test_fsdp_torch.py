"""Our flat plan and FlatUnit vs PyTorch's own FSDP1 (FlatParameter) and FSDP2 (fully_shard) on gloo.

Oracle: PyTorch FSDP running in W real processes (torch.multiprocessing + gloo, CPU). FSDP1's shard metadata
must equal our plan exactly; after training, FSDP1's local flat shard must equal our FlatUnit's shard up to
float summation order (both average gradients over ranks). FSDP2's per-parameter shard shapes must equal the
dim-0 chunk rule we also use for GSPMD. Kept small: one spawn per case (~5 s each).
"""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.fsdp.flat_param import plan_flat_shards_for
from shardlab.fsdp.gspmd import per_param_shard
from shardlab.fsdp.torch_ref import torch_fsdp1_program, torch_fsdp2_program
from shardlab.fsdp.train import TrainConfig, fsdp_rank_program, make_model


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "use_orig_params", "optimizer"), [(2, False, "sgd"), (3, True, "adam")])
def test_fsdp1_flat_param_matches_ours(world_size: int, use_orig_params: bool, optimizer: str) -> None:
    cfg = TrainConfig(layer_sizes=(5, 7, 3), batch=6, steps=2, optimizer=optimizer, use_orig_params=use_orig_params)
    theirs = DistributedWorld(world_size).run(torch_fsdp1_program, cfg)
    plan = plan_flat_shards_for(make_model(cfg), world_size, use_orig_params=use_orig_params)
    ours = SimulatedWorld(world_size).run(fsdp_rank_program, cfg)
    for r, t in enumerate(theirs):
        rs = plan.ranks[r]
        assert (t["shard_numel"], t["numel_padded"], t["flat_numel"]) == (plan.shard_numel, rs.numel_padded,
                                                                         plan.flat_numel)
        in_shard = {i: info[1:] for i, info in enumerate(t["infos"]) if info[0]}
        assert in_shard == {p.param_index: tuple(p[1:]) for p in rs.params}
        # same layout, same data after training (float tolerance: reduction order differs)
        torch.testing.assert_close(ours[r].shard, t["shard"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_per_param_shards_match_chunk_rule() -> None:
    cfg = TrainConfig(layer_sizes=(5, 7, 3), batch=6)
    world_size = 3
    theirs = DistributedWorld(world_size).run(torch_fsdp2_program, cfg)
    shapes = [tuple(p.shape) for p in make_model(cfg).parameters()]
    for r, params in enumerate(theirs):
        assert [p["orig_shape"] for p in params] == shapes
        for p in params:
            local, padded = per_param_shard(p["orig_shape"], world_size, r)
            assert (p["local_shape"], p["padded_shape"]) == (local, padded)
