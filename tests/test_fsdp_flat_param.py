"""Flat-parameter shard math vs PyTorch's own FlatParamHandle (the oracle) and worked cases by hand.

The oracle: for every (layer sizes, world size, rank, use_orig_params) we build PyTorch's FlatParamHandle on
a fake process group (no communication; FlatParamHandle only reads rank/size), call ``shard()`` and compare
every shard-metadata field with our plan. Comparisons are exact: it is all integer arithmetic.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._flat_param import (
    _FLAT_PARAM_PADDING_VALUE,
    FlatParamHandle,
    HandleShardingStrategy,
    _get_aligned_numel,
)
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlab.fsdp.flat_param import (
    ALIGNMENT_BYTES,
    FLAT_PARAM_PADDING_VALUE,
    ShardParamInfo,
    aligned_numel,
    chunk_bounds,
    module_params,
    plan_flat_shards,
    plan_flat_shards_for,
)


def _torch_handle(module: nn.Module, rank: int, world_size: int, use_orig_params: bool) -> FlatParamHandle:
    """PyTorch's FlatParamHandle for ``rank`` of ``world_size`` on a fake process group, sharded."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        h = FlatParamHandle(
            list(module.parameters()), module, torch.device("cpu"), HandleShardingStrategy.FULL_SHARD,
            False, None, None, False, dist.group.WORLD, use_orig_params,
        )
        h.shard()
        h.init_flat_param_attributes()
        return h
    finally:
        dist.destroy_process_group()


def _random_mlp(rng: random.Random) -> nn.Module:
    layers: list[nn.Module] = []
    d = rng.randint(1, 9)
    for _ in range(rng.randint(1, 4)):
        d2 = rng.randint(1, 9)
        layers.append(nn.Linear(d, d2, bias=rng.random() < 0.7))
        d = d2
    if rng.random() < 0.5:
        layers.append(nn.LayerNorm(d))
    return nn.Sequential(*layers)


class _Tied(nn.Module):
    """Embedding and output head share one weight: flattened once, at its first registration."""

    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight


def _compare(module: nn.Module, world_size: int, use_orig_params: bool) -> None:
    plan = plan_flat_shards_for(module, world_size, use_orig_params=use_orig_params)
    flat = torch.cat([p.detach().reshape(-1) for _, p in module_params(module)])
    for r in range(world_size):
        # FlatParamHandle replaces the module's parameters by views: give it a fresh copy per rank
        fp = _torch_handle(copy.deepcopy(module), r, world_size, use_orig_params).flat_param
        ctx = f"W={world_size} rank={r} orig={use_orig_params} numels={plan.numels}"
        # flat layout: padding segments and parameters in PyTorch's order
        assert [s.numel for s in plan.segments] == list(fp._numels_with_padding), ctx
        assert [s.kind == "align_pad" for s in plan.segments] == list(fp._is_padding_mask), ctx
        assert list(plan.numels) == list(fp._numels), ctx
        assert plan.flat_numel == fp._unpadded_unsharded_size.numel(), ctx
        assert plan.padded_numel == fp._padded_unsharded_size.numel(), ctx
        assert plan.shard_numel == fp._sharded_size.numel() == fp.numel(), ctx
        rs = plan.ranks[r]
        assert rs.numel_padded == fp._shard_numel_padded, ctx
        ours = {i.param_index: i for i in rs.params}
        assert len(fp._shard_param_infos) == len(plan.numels), ctx
        for i, info in enumerate(fp._shard_param_infos):
            if not info.in_shard:
                assert i not in ours, ctx
                continue
            theirs = (info.offset_in_shard, info.numel_in_shard, info.intra_param_start_idx,
                      info.intra_param_end_idx)
            assert ours[i] == ShardParamInfo(i, *theirs), ctx
        assert len(ours) == sum(i.in_shard for i in fp._shard_param_infos), ctx
        # data: our index arithmetic reproduces PyTorch's shard tensor element by element
        expect = torch.zeros(plan.shard_numel)
        for info in rs.params:
            seg = plan.segments[[s.param_index for s in plan.segments].index(info.param_index)]
            expect[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard] = flat[
                sum(plan.numels[: info.param_index]) + info.intra_start : sum(plan.numels[: info.param_index])
                + info.intra_end + 1
            ]
            assert seg.numel == plan.numels[info.param_index]
        for seg in plan.segments:  # alignment padding is a named fill value
            if seg.kind == "align_pad":
                lo, hi = max(seg.start, rs.start), min(seg.start + seg.numel, rs.end + 1)
                if lo < hi:
                    expect[lo - rs.start : hi - rs.start] = FLAT_PARAM_PADDING_VALUE
        torch.testing.assert_close(fp.detach(), expect, rtol=0, atol=0, msg=ctx)


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("world_size", range(1, 9))
def test_matches_flat_param_handle_random_mlps(world_size: int, use_orig_params: bool) -> None:
    rng = random.Random(1000 * world_size + use_orig_params)
    for _ in range(3):
        _compare(_random_mlp(rng), world_size, use_orig_params)


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("world_size", [3, 8])
def test_matches_flat_param_handle_shared_weight(world_size: int, use_orig_params: bool) -> None:
    m = _Tied(vocab=7, d=3)
    # emb.weight 21, mid.weight 9, mid.bias 3; head.weight is emb.weight again: 21 + 9 + 3 = 33
    assert plan_flat_shards_for(m, world_size).numels == (21, 9, 3)
    _compare(m, world_size, use_orig_params)


def test_constants_match_pytorch() -> None:
    assert FLAT_PARAM_PADDING_VALUE == _FLAT_PARAM_PADDING_VALUE
    assert ALIGNMENT_BYTES == 16
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert aligned_numel(dt) == _get_aligned_numel(dt)


def test_worked_case_10_over_4() -> None:
    plan = plan_flat_shards([10], 4)  # c = ceil(10/4) = 3: 3,3,3,1 + 2 pad
    assert (plan.flat_numel, plan.shard_numel, plan.padded_numel) == (10, 3, 12)
    assert [r.numel_unpadded for r in plan.ranks] == [3, 3, 3, 1]
    assert [r.numel_padded for r in plan.ranks] == [0, 0, 0, 2]
    assert plan.ranks[3].params == (ShardParamInfo(0, 0, 1, 9, 9),)  # intra_end inclusive


def test_worked_case_6_over_4_leaves_last_rank_empty() -> None:
    plan = plan_flat_shards([6], 4)  # c = 2: chunk() gives 3 chunks, so 2,2,2,0 + 2 pad (not 2,2,1,1)
    assert [r.numel_unpadded for r in plan.ranks] == [2, 2, 2, 0]
    assert [r.numel_padded for r in plan.ranks] == [0, 0, 0, 2]
    assert plan.ranks[3].params == ()
    assert [len(c) for c in torch.arange(6).chunk(4)] == [2, 2, 2]  # the torch.chunk rule itself


def test_param_straddling_ranks() -> None:
    plan = plan_flat_shards([5, 3], 2)  # 5 + 3 = 8, c = 4: rank0 = p0[0..3]; rank1 = p0[4] + p1[0..2]
    assert plan.ranks[0].params == (ShardParamInfo(0, 0, 4, 0, 3),)
    assert plan.ranks[1].params == (ShardParamInfo(0, 0, 1, 4, 4), ShardParamInfo(1, 1, 3, 0, 2))


def test_alignment_padding() -> None:
    plan = plan_flat_shards([5, 3], 4, align=4)  # 5 + (3 pad) + 3 = 11, + 1 pad to a multiple of W=4 -> 12
    assert [(s.kind, s.numel) for s in plan.segments] == [("param", 5), ("align_pad", 3), ("param", 3),
                                                          ("align_pad", 1)]
    assert (plan.flat_numel, plan.shard_numel, plan.padded_numel) == (12, 3, 12)
    assert plan.align_padding_numel == 4 and plan.shard_padding_numel == 0


def test_chunk_bounds_matches_torch_chunk() -> None:
    for n in range(1, 40):
        for w in range(1, 9):
            chunks = torch.arange(n).chunk(w)
            for r in range(w):
                start, real, pad = chunk_bounds(n, w, r)
                got = chunks[r].tolist() if r < len(chunks) else []
                assert list(range(start, start + real)) == got
                assert real + pad == len(chunks[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(numels=[4], world_size=0), "world_size=0"),
        (dict(numels=[], world_size=2), r"numels=\[\] is empty"),
        (dict(numels=[4, -1], world_size=2), r"numels\[1\]=-1"),
        (dict(numels=[4], world_size=2, align=-4), "align=-4"),
        (dict(numels=[0, 0], world_size=2), "hold no elements"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_flat_shards(**kwargs)


def test_bad_modules() -> None:
    with pytest.raises(ValueError, match="has no parameters"):
        plan_flat_shards_for(nn.ReLU(), 2)
    m = nn.Linear(2, 2)
    m.register_parameter("idx", nn.Parameter(torch.ones(2, dtype=torch.int64), requires_grad=False))
    with pytest.raises(TypeError, match="'idx' has dtype torch.int64"):
        plan_flat_shards_for(m, 2)
