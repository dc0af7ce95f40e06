"""Our flat plan and FlatUnit vs PyTorch's own FSDP1 (FlatParameter) and FSDP2 (fully_shard) on gloo.

Oracle: PyTorch FSDP running in W real processes (torch.multiprocessing + gloo, CPU). FSDP1's shard metadata
must equal our plan exactly; after training, FSDP1's local flat shard must equal our FlatUnit's shard up to
float summation order (both average gradients over ranks). FSDP2's per-parameter shard shapes must equal the
dim-0 chunk rule we also use for GSPMD.

Collectives: every collective PyTorch issued (``torch_ref.logged_collectives``) against our ledger — FSDP1
row by row (op, phase, payload bytes, order), for a model that is one root unit and for a nested model (an
inner unit + the root). FSDP2 issues the same collectives per unit and phase (op, phase counts) with
per-parameter payloads (every parameter's dim-0 shard padded to ceil(d0/W): ``formulas.fsdp.per_param_shard``);
its backward reduce-scatters come out root first, FSDP1's and ours inner first (autograd reaches the
root's flat parameter last). Kept small: one spawn per case runs both FSDP1 and FSDP2.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from shardlab.comm import DistributedWorld, Ledger, SimulatedWorld
from shardlab.formulas.fsdp import per_param_shard
from shardlab.fsdp.params import FsdpParams
from shardlab.fsdp.torch_ref import torch_fsdp_both_program
from shardlab.fsdp.train import FlatCase, fsdp_rank_program


def _rows(ledger: Ledger) -> list[tuple[str, str, int]]:
    return [(e.op, e.phase, e.payload_bytes) for e in ledger]


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "use_orig_params", "optimizer", "nested"),
                         [(2, False, "sgd", False), (3, True, "adam", False), (2, False, "sgd", True),
                          (3, False, "adam", True)])
def test_torch_fsdp1_and_fsdp2_match_ours(world_size: int, use_orig_params: bool, optimizer: str,
                                          nested: bool) -> None:
    case = FlatCase(FsdpParams(world_size=world_size, layer_sizes=(5, 7, 3), batch=6, steps=2, align=use_orig_params),
                    nested=nested, optimizer=optimizer)
    both = DistributedWorld(world_size).run(torch_fsdp_both_program, case)
    plan = case.plans()[""]
    sim = SimulatedWorld(world_size)
    ours = sim.run(fsdp_rank_program, case)
    model = case.model()
    shapes = [tuple(p.shape) for p in model.parameters()]
    for r, (fsdp1, fsdp2) in enumerate(both):
        # FSDP1: the root's FlatParameter has exactly our shard metadata
        rs = plan.ranks[r]
        assert (fsdp1["shard_numel"], fsdp1["numel_padded"], fsdp1["flat_numel"]) == (
            plan.shard_numel, rs.numel_padded, plan.flat_numel)
        in_shard = {i: info[1:] for i, info in enumerate(fsdp1["infos"]) if info[0]}
        assert in_shard == {p.param_index: tuple(p[1:]) for p in rs.params}
        # same layout, same data after training (float tolerance: reduction order differs)
        torch.testing.assert_close(ours[r].shard, fsdp1["shard"], rtol=1e-5, atol=1e-6)
        # FSDP1's collectives, row by row: our ledger (the root issues one all-gather per step, not two)
        assert _rows(Ledger.from_records(fsdp1["collectives"])) == _rows(sim.ledger)
        # FSDP2: every parameter sharded on dim 0 with torch.chunk semantics, padded to ceil(d0 / W)
        assert sorted(p["orig_shape"] for p in fsdp2["params"]) == sorted(shapes)
        for p in fsdp2["params"]:
            assert (p["local_shape"], p["padded_shape"]) == per_param_shard(p["orig_shape"], world_size, r)
        # FSDP2's collectives: the same ops per phase as ours ...
        t2 = Ledger.from_records(fsdp2["collectives"])
        assert Counter((e.op, e.phase) for e in t2) == Counter((e.op, e.phase) for e in sim.ledger)
        assert [(e.op, e.phase) for e in t2 if e.op == "all_gather"] == [
            (e.op, e.phase) for e in sim.ledger if e.op == "all_gather"]
        # ... with per-parameter payloads: each unit's all-gather = its parameters' padded dim-0 shards
        units = [[(7, 5), (7,)], [(3, 7), (3,)]] if nested else [[(7, 5), (7,), (3, 7), (3,)]]
        padded = {4 * sum(math.prod(per_param_shard(s, world_size, 0)[1]) for s in u) for u in units}
        assert {e.payload_bytes for e in t2 if e.op == "all_gather"} == padded
        assert {e.payload_bytes for e in t2 if e.op == "reduce_scatter"} == {world_size * b for b in padded}
