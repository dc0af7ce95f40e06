"""Block algebra vs the dense product (oracle: ``x @ W`` in float64, so equality is to rounding only)."""

import pytest
import torch

from shardlab import blocks
from shardlab.blocks import collective_figures as vc
from shardlab.blocks import figures as vb
from shardlab.blocks import rank_arithmetic, ring
from shardlab.blocks.params import BlocksParams
from shardlab.core.explorer import explorer_for


@pytest.mark.parametrize("m,k,n,parts", [(8, 12, 6, 3), (5, 7, 9, 4), (3, 5, 2, 1), (6, 6, 6, 6)])
def test_column_and_row_equal_dense(m: int, k: int, n: int, parts: int) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(m, k, dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    dense = x @ w
    if parts <= n:
        col = blocks.column_parallel(x, w, parts)
        assert len(col.pieces[0]) == parts and len(col.partials[0]) == parts
        torch.testing.assert_close(col.result, dense)
        # concatenation: piece j is exactly dense's column block j
        torch.testing.assert_close(torch.cat(col.pieces[0], dim=1), dense)
    row = blocks.row_parallel(x, w, parts)
    assert len(row.partials[0][0]) == parts
    for p in row.partials[0][0]:
        assert p.shape == (m, n)  # every partial is a full-size unreduced Y{U}
    torch.testing.assert_close(row.result, dense)


@pytest.mark.parametrize("grid,k_parts", [((2, 2), 2), ((3, 2), 4), ((2, 3), 1)])
def test_grid_equals_dense(grid: tuple[int, int], k_parts: int) -> None:
    x, w = torch.randn(7, 9, dtype=torch.float64), torch.randn(9, 5, dtype=torch.float64)
    g = blocks.grid_parallel(x, w, grid, k_parts)
    torch.testing.assert_close(g.result, x @ w)
    assert sum(len(p) for row in g.partials for p in row) == grid[0] * grid[1] * k_parts


def test_uneven_rule_is_array_split() -> None:
    import numpy as np

    for n in range(1, 20):
        for p in range(1, n + 1):
            assert blocks.split_sizes(n, p) == [len(a) for a in np.array_split(np.arange(n), p)]


def test_rank_arithmetic() -> None:
    # x = ones, W = ones: each of the p partials holds k_l (the rows it owns), so the sum is k everywhere.
    x, w = torch.ones(2, 10), torch.ones(10, 3)
    row = blocks.row_parallel(x, w, 4)  # k split 3,3,2,2
    assert [float(p[0, 0]) for p in row.partials[0][0]] == [3.0, 3.0, 2.0, 2.0]
    assert torch.equal(row.result, torch.full((2, 3), 10.0))


def test_owner_map() -> None:
    own = blocks.owner_map(4, 4, 2, 2)
    assert own[0] == [0, 0, 1, 1] and own[3] == [2, 2, 3, 3]


@pytest.mark.parametrize("call,msg", [
    (lambda: blocks.split_sizes(3, 4), "parts=4 is more than n=3"),
    (lambda: blocks.split_sizes(3, 0), "parts=0 must be >= 1"),
    (lambda: blocks.row_parallel(torch.ones(2, 3), torch.ones(4, 2), 2), "must equal W's rows"),
    (lambda: blocks.split_rows(torch.ones(3), 1), "must be 2-D"),
])
def test_bad_input(call, msg: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((ValueError, TypeError), match=msg):
        call()


def test_viz_owner_maps_and_explorer_headless() -> None:
    """The picture's owner maps follow the split rules; the explorer's update recomputes against dense."""
    own = vb.owners(4, 6, 8, 2, "row")
    assert own["x"][0] == [0, 0, 0, 1, 1, 1] and [r[0] for r in own["W"]] == [0, 0, 0, 1, 1, 1]
    assert all(v == -1 for row in own["y"] for v in row)  # after the all-reduce every device holds all of y
    own = vb.owners(4, 6, 8, 2, "column")
    assert own["W"][0] == [0] * 4 + [1] * 4 and all(v == -1 for row in own["x"] for v in row)
    _ui, update = explorer_for(BlocksParams(), m=6, k=8, n=4, parts=4, kind="grid")
    shown = update()
    assert shown["ok"] and shown["max_abs_err"] < 1e-12
    bad = update(parts=3)  # odd parts cannot form a (2 x parts/2) grid
    assert not bad["ok"] and "even number of parts" in bad["error"]


def test_collective_pictures_show_what_the_per_rank_code_returned() -> None:
    """Rank arithmetic (rank r holds r + 1): all-reduce gives 1 + ... + W = W(W+1)/2 everywhere, reduce-scatter
    rank r that sum in slot r, all-gather [1, ..., W] on every rank."""
    w = 4
    _, after = rank_arithmetic("all_reduce", w)
    assert all(a.tolist() == [10.0] * w for a in after)
    _, after = rank_arithmetic("reduce_scatter", w)
    assert [a.tolist() for a in after] == [[10.0]] * w
    _, after = rank_arithmetic("all_gather", w)
    assert all(a.tolist() == [1.0, 2.0, 3.0, 4.0] for a in after)
    assert len(vc.before_after(w).data) == 6
    trace = ring.simulate("all_reduce", [torch.ones(8)] * w)
    assert len(vc.ring_figure(trace).data) == 2 * (w - 1) + 1  # one panel per step, plus "before"
    strings = {"cols": "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", "all": "{replicated}"}
    assert len(vc.tiles_figure(strings, (8, 8), 8).data) == 2
