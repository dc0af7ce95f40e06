"""Our flat plan and FlatUnit vs PyTorch's own FSDP1 (FlatParameter) and FSDP2 (fully_shard) on gloo.

Oracle: PyTorch FSDP running in W real processes (torch.multiprocessing + gloo, CPU). FSDP1's shard metadata
must equal our plan exactly; after training, FSDP1's local flat shard must equal our FlatUnit's shard up to
float summation order (both average gradients over ranks). FSDP2's per-parameter shard shapes must equal the
dim-0 chunk rule we also use for GSPMD. Kept small: one spawn per case runs both FSDP1 and FSDP2.
"""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.fsdp.flat_param import plan_flat_shards_for
from shardlab.formulas.fsdp import per_param_shard
from shardlab.fsdp.torch_ref import torch_fsdp_both_program
from shardlab.fsdp.train import TrainConfig, fsdp_rank_program, make_model


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "use_orig_params", "optimizer"), [(2, False, "sgd"), (3, True, "adam")])
def test_torch_fsdp1_and_fsdp2_match_ours(world_size: int, use_orig_params: bool, optimizer: str) -> None:
    cfg = TrainConfig(layer_sizes=(5, 7, 3), batch=6, steps=2, optimizer=optimizer, use_orig_params=use_orig_params)
    both = DistributedWorld(world_size).run(torch_fsdp_both_program, cfg)
    plan = plan_flat_shards_for(make_model(cfg), world_size, use_orig_params=use_orig_params)
    ours = SimulatedWorld(world_size).run(fsdp_rank_program, cfg)
    shapes = [tuple(p.shape) for p in make_model(cfg).parameters()]
    for r, (fsdp1, fsdp2) in enumerate(both):
        # FSDP1: one FlatParameter with exactly our shard metadata
        rs = plan.ranks[r]
        assert (fsdp1["shard_numel"], fsdp1["numel_padded"], fsdp1["flat_numel"]) == (
            plan.shard_numel, rs.numel_padded, plan.flat_numel)
        in_shard = {i: info[1:] for i, info in enumerate(fsdp1["infos"]) if info[0]}
        assert in_shard == {p.param_index: tuple(p[1:]) for p in rs.params}
        # same layout, same data after training (float tolerance: reduction order differs)
        torch.testing.assert_close(ours[r].shard, fsdp1["shard"], rtol=1e-5, atol=1e-6)
        # FSDP2: every parameter sharded on dim 0 with torch.chunk semantics, padded to ceil(d0 / W)
        assert [p["orig_shape"] for p in fsdp2] == shapes
        for p in fsdp2:
            assert (p["local_shape"], p["padded_shape"]) == per_param_shard(p["orig_shape"], world_size, r)
