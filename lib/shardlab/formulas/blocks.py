"""Block-matrix partitioning: what each split rule must communicate (notebook 01).

Notation (00_welcome): x is m×k, W is k×n, Y = xW, p devices, b bytes per element.

- **Column split** ``W = [W_1 ... W_p]``: ``Y = [xW_1 ... xW_p]`` — every device owns a column block of Y,
  no collective (the concatenation is only a layout).
- **Row split** ``W = [W_1; ...; W_p]`` with ``x = [x_1 ... x_p]`` by columns: ``Y = Σ_i x_i W_i`` — every
  device holds an unreduced m×n partial sum; one all-reduce, payload m·n·b per device.
- **2-D grid** on a (p_r × p_c) mesh, x by (rows over p_r, k over p_c), W rows (k) over p_c: device (i, j)
  holds the partial ``x_ij W_j`` of Y's row block i; one all-reduce within each group of p_c devices,
  payload (m/p_r)·n·b per device.
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import dtype_bytes


def col_split_collectives() -> int:
    """Collectives needed by a column split of W (Y = [xW_1 ... xW_p])."""
    return 0


def row_split_all_reduce(m: int, n: int, dtype: Any = "float32") -> dict[str, int]:
    """One all-reduce of the m×n partial sums; payload per device in bytes."""
    return {"count": 1, "bytes": m * n * dtype_bytes(dtype)}


def grid_all_reduce(m: int, n: int, grid: tuple[int, int], dtype: Any = "float32") -> dict[str, int]:
    """2-D grid (p_r, p_c): one all-reduce over p_c devices of a (m/p_r)×n partial; payload per device."""
    p_r, p_c = grid
    if m % p_r:
        raise ValueError(f"m={m} is not divisible by the grid's row parts p_r={p_r}")
    return {"count": 1 if p_c > 1 else 0, "bytes": (m // p_r) * n * dtype_bytes(dtype) if p_c > 1 else 0,
            "group_size": p_c}
