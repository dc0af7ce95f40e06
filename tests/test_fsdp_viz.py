"""The flat-buffer figure's pieces tile [0, P) exactly and agree with the plan's ownership and metadata."""

from __future__ import annotations

import pytest

from shardlab.core.explorer import explorer_for
from shardlab.fsdp.figures import flat_buffer_figure, parse_sizes, pieces
from shardlab.fsdp.flat_param import plan_flat_shards
from shardlab.fsdp.params import FsdpParams


@pytest.mark.parametrize(("numels", "w", "align"), [([10], 4, 0), ([6], 4, 0), ([5, 3, 10], 4, 4), ([7, 1, 9], 3, 4)])
def test_pieces_tile_the_padded_buffer(numels: list[int], w: int, align: int) -> None:
    plan = plan_flat_shards(numels, w, align)
    ps = pieces(plan)
    assert ps[0]["start"] == 0 and ps[-1]["end"] == plan.padded_numel
    assert all(a["end"] == b["start"] for a, b in zip(ps, ps[1:], strict=False))
    for p in ps:  # every piece sits inside one rank's slice
        assert p["start"] // plan.shard_numel == p["rank"] == (p["end"] - 1) // plan.shard_numel
    # param pieces are exactly the plan's ShardParamInfos (intra range inclusive)
    got = sorted((p["rank"], p["param_index"], *p["intra"]) for p in ps if p["kind"] == "param")
    want = sorted((r.rank, i.param_index, i.intra_start, i.intra_end) for r in plan.ranks for i in r.params)
    assert got == want
    assert sum(p["end"] - p["start"] for p in ps if p["kind"] == "shard_pad") == plan.shard_padding_numel
    fig = flat_buffer_figure(plan)
    assert len(fig.data) == len(ps) + w


def test_explorer_headless_and_errors() -> None:
    ui, update = explorer_for(FsdpParams(), layer_sizes=(4, 6, 2), world_size=3, use_orig_params=False)
    shown = update(world_size=5, use_orig_params=True)
    assert shown["ok"] and shown["plan"].world_size == 5 and shown["plan"].align == 4
    assert update(layer_sizes="4, x")["ok"] is False
    with pytest.raises(ValueError, match="at least two widths"):
        parse_sizes("7")
