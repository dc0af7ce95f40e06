"""Block matrix partitioning: the algebra every sharding scheme is built from (notebooks 00 and 01).

The package: this module is the algebra (pure torch, no devices) and the per-rank code of the splits and of the
three collectives; :mod:`shardlab.blocks.case` answers "what does this split communicate" four ways (formula,
ledger, CPU compiler, TPU compiler); :mod:`shardlab.blocks.ring` runs the ring schedule of the collectives step by
step; :mod:`shardlab.blocks.tiles` predicts and reads XLA's sharding strings (which device holds which block).

Notation (00_welcome): x is m×k, W is k×n, y = xW; ``A[I_X, J_Y]`` means A's rows split over mesh axis X
and columns over Y; ``{U_X}`` marks a partial sum still to be reduced over X. The column split is ``W[K, N_X]``
(pieces concatenated, nothing summed), the row split ``x[M, K_X]`` · ``W[K_X, N]`` (each piece a full m×n
partial sum ``y{U_X}``), the grid SUMMA-style (``Y_ij = Σ_l x_il W_lj``); ``col_rank`` / ``row_rank`` are what
rank r runs for the first two (the ledger's per-rank programs).

Uneven splits follow one rule everywhere (``numpy.array_split``): n rows into p parts gives the first
``n mod p`` parts one extra row, so sizes differ by at most one and are non-increasing; p > n is an error
(an empty block would be meaningless here). Every function returns the per-block pieces so notebooks can
draw them, and its ``result`` equals the dense product (tests compare with ``x @ W``).

Example::

    >>> x, W = torch.ones(2, 4), torch.ones(4, 6)
    >>> p = row_parallel(x, W, 2)
    >>> p.partials[0][0][0].unique()     # x_1 @ W_1: every entry sums two of the four products
    tensor([2.])
    >>> p.pieces[0][0].unique(), p.result.unique()   # the sum of the partials: the dense product
    (tensor([4.]), tensor([4.]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlab.comm import Comm, SimulatedWorld


def split_sizes(n: int, parts: int, what: str = "n") -> list[int]:
    """Block sizes of ``n`` items over ``parts`` blocks: the first ``n % parts`` blocks get one extra."""
    if isinstance(parts, bool) or not isinstance(parts, int):
        raise TypeError(f"parts={parts!r} must be an int")
    if parts < 1:
        raise ValueError(f"parts={parts} must be >= 1")
    if parts > n:
        raise ValueError(f"parts={parts} is more than {what}={n}: every block needs at least one row/column")
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_rows(a: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``[A_1; …; A_p]``: row blocks of a 2-D tensor."""
    _check_2d(a, "a")
    return list(torch.split(a, split_sizes(a.shape[0], parts, "rows"), dim=0))


def split_cols(a: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``[A_1 … A_p]``: column blocks of a 2-D tensor."""
    _check_2d(a, "a")
    return list(torch.split(a, split_sizes(a.shape[1], parts, "columns"), dim=1))


@dataclass
class BlockProduct:
    """Per-block pieces of a partitioned product and how they combine."""

    kind: str  # "column" | "row" | "grid"
    pieces: list[list[torch.Tensor]]  # pieces[i][j] = Σ_l x_il W_lj (grid) / single products
    partials: list[list[list[torch.Tensor]]]  # partials[i][j][l] = x_il @ W_lj, before summing
    result: torch.Tensor  # equals x @ W


def _check_2d(a: torch.Tensor, name: str) -> None:
    if a.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(a.shape)}")


def _check_pair(x: torch.Tensor, w: torch.Tensor) -> None:
    _check_2d(x, "x")
    _check_2d(w, "W")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x is {tuple(x.shape)} and W is {tuple(w.shape)}: x's k={x.shape[1]} must equal W's rows")


def grid_parallel(x: torch.Tensor, w: torch.Tensor, grid: tuple[int, int], k_parts: int = 1) -> BlockProduct:
    """SUMMA-style: x in (p_r × k_parts) blocks, W in (k_parts × p_c) blocks; ``Y_ij = Σ_l x_il W_lj``."""
    _check_pair(x, w)
    p_r, p_c = grid
    xb = [split_cols(row, k_parts) for row in split_rows(x, p_r)]  # xb[i][l]: [m_i, k_l]
    wb = [split_cols(row, p_c) for row in split_rows(w, k_parts)]  # wb[l][j]: [k_l, n_j]
    partials = [[[xb[i][q] @ wb[q][j] for q in range(k_parts)]  # each [m_i, n_j]
                 for j in range(p_c)] for i in range(p_r)]
    pieces = [[torch.stack(p).sum(0) for p in row] for row in partials]
    result = torch.cat([torch.cat(row, dim=1) for row in pieces], dim=0)  # [m, n]
    kind = "grid"
    if p_r == 1 and k_parts == 1:
        kind = "column"
    elif p_r == 1 and p_c == 1:
        kind = "row"
    return BlockProduct(kind, pieces, partials, result)


def column_parallel(x: torch.Tensor, w: torch.Tensor, parts: int) -> BlockProduct:
    """``y = x[W_1 … W_p] = [xW_1 … xW_p]``: concatenate the pieces (no reduction)."""
    return grid_parallel(x, w, (1, parts), k_parts=1)


def row_parallel(x: torch.Tensor, w: torch.Tensor, parts: int) -> BlockProduct:
    """``y = [x_1 … x_p][W_1; …; W_p] = Σ_i x_i W_i``: sum the partial products (an all-reduce)."""
    return grid_parallel(x, w, (1, 1), k_parts=parts)


def owner_map(n_rows: int, n_cols: int, row_parts: int, col_parts: int) -> list[list[int]]:
    """``owner[r][c]``: which device (row-major over the grid) holds element (r, c) of a blocked matrix."""
    rows = [i for i, s in enumerate(split_sizes(n_rows, row_parts, "rows")) for _ in range(s)]
    cols = [j for j, s in enumerate(split_sizes(n_cols, col_parts, "columns")) for _ in range(s)]
    return [[rows[r] * col_parts + cols[c] for c in range(n_cols)] for r in range(n_rows)]


# ------------------------------------------------------------------------------------------- per-rank code
def col_rank(comm: Comm, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Column rule, rank r: y's column block r is x @ W_r — no collective."""
    w_r = split_cols(w, comm.world_size)[comm.rank]  # [k, n_r]
    return x @ w_r  # [m, n_r]


def row_rank(comm: Comm, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Row rule, rank r: the partial sum x_r @ W_r (full size, y{U}), then one all-reduce adds them."""
    x_r = split_cols(x, comm.world_size)[comm.rank]  # [m, k_r]
    w_r = split_rows(w, comm.world_size)[comm.rank]  # [k_r, n]
    return comm.all_reduce(x_r @ w_r)  # [m, n]: Σ_r x_r W_r


def collective_rank(comm: Comm, data: torch.Tensor, op: str) -> torch.Tensor:
    """Rank r hands ``data[r]`` to one collective."""
    mine = data[comm.rank]  # [*shape]
    if op == "all_reduce":
        return comm.all_reduce(mine)  # [*shape]: the sum over ranks
    if op == "reduce_scatter":
        return comm.reduce_scatter(mine, dim=0)  # [shape0 / W, ...]: rank r's block of the sum
    return comm.all_gather(mine.unsqueeze(0), dim=0)  # [W, *shape]: every rank's tensor


def rank_arithmetic(op: str, world_size: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(before, after) per rank for ``op`` on data where rank r holds r + 1 (all-gather: a 1-element shard).

    After an all-reduce every entry is 1 + 2 + ... + W = W (W + 1) / 2; after a reduce-scatter rank r holds
    element r of that sum; after an all-gather every rank holds [1, 2, ..., W].
    """
    w = world_size
    if op == "all_gather":
        data = torch.arange(1, w + 1, dtype=torch.float32).reshape(w, 1)  # rank r: [r + 1]
    else:
        data = torch.arange(1, w + 1, dtype=torch.float32).reshape(w, 1).expand(w, w).contiguous()  # [r + 1] * W
    outs = SimulatedWorld(w).run(collective_rank, data, op)
    return list(data), [o.reshape(-1) for o in outs]
