"""Block-matrix partitioning and the three basic collectives: what each must communicate (notebooks 00, 01).

Notation (00_welcome): x is m×k, W is k×n, Y = xW, p devices (blocks), e bytes per element.

- **Column split** ``W = [W_1 ... W_p]``: ``Y = [xW_1 ... xW_p]`` — every device owns a column block of Y,
  no collective (the concatenation is only a layout).
- **Row split** ``W = [W_1; ...; W_p]`` with ``x = [x_1 ... x_p]`` by columns: ``Y = Σ_i x_i W_i`` — every
  device holds an unreduced m×n partial sum; one all-reduce over the p devices, payload m·n·e per device
  (none when p = 1: there is nothing to add).
- **2-D grid** on a (p_r × p_c) mesh, x by (rows over p_r, k over p_c), W rows (k) over p_c: device (i, j)
  holds the partial ``x_ij W_j`` of Y's row block i; one all-reduce within each group of p_c devices,
  payload (m/p_r)·n·e per device.

The element type ``e`` is the one the reduction carries, which depends on the compiler: pass
``reduction_dtype(dtype, device_kind)`` (XLA:CPU adds bf16 partial sums in f32, the TPU in bf16).

:func:`collective` gives count, payload and ring wire bytes of one all-reduce / all-gather / reduce-scatter
(payload: all-reduce and reduce-scatter hand in the full tensor, all-gather its shard).

Example::

    >>> row_split_all_reduce(16, 32, 4, "float32")
    {'count': 1, 'bytes': 2048, 'wire_bytes': 3072.0, 'group_size': 4}
    >>> row_split_all_reduce(16, 32, 1, "float32")["count"]
    0
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import dtype_bytes, wire_bytes

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def col_split_collectives() -> int:
    """Collectives needed by a column split of W (Y = [xW_1 ... xW_p])."""
    return 0


def _positive(**kw: int) -> None:
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


def row_split_all_reduce(m: int, n: int, parts: int, dtype: Any = "float32") -> dict[str, Any]:
    """One all-reduce over ``parts`` devices of the m×n partial sums: count, payload and ring wire bytes per device."""
    _positive(m=m, n=n, parts=parts)
    if parts == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0, "group_size": 1}
    payload = m * n * dtype_bytes(dtype)
    return {"count": 1, "bytes": payload, "wire_bytes": wire_bytes("all_reduce", payload, parts), "group_size": parts}


def grid_all_reduce(m: int, n: int, grid: tuple[int, int], dtype: Any = "float32") -> dict[str, Any]:
    """2-D grid (p_r, p_c): one all-reduce over p_c devices of a (m/p_r)×n partial; payload per device.

    >>> grid_all_reduce(16, 32, (2, 4))["bytes"], grid_all_reduce(16, 32, (2, 4))["group_size"]
    (1024, 4)
    """
    p_r, p_c = grid
    _positive(m=m, n=n, p_r=p_r, p_c=p_c)
    if m % p_r:
        raise ValueError(f"m={m} is not divisible by the grid's row parts p_r={p_r}")
    if p_c == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0, "group_size": 1}
    payload = (m // p_r) * n * dtype_bytes(dtype)
    return {"count": 1, "bytes": payload, "wire_bytes": wire_bytes("all_reduce", payload, p_c), "group_size": p_c}


def collective(op: str, numel: int, world_size: int, dtype: Any = "float32") -> dict[str, Any]:
    """One ``op`` over ``world_size`` ranks where each rank hands in ``numel`` elements.

    ``numel`` is the payload in elements: the full tensor for all-reduce / reduce-scatter, the shard for
    all-gather. World size 1 communicates nothing (count 0).

    >>> collective("all_gather", 128, 8)
    {'count': 1, 'bytes': 512, 'wire_bytes': 3584, 'group_size': 8}
    """
    if op not in COLLECTIVES:
        raise ValueError(f"op={op!r} is not one of {COLLECTIVES}")
    _positive(numel=numel, world_size=world_size)
    if world_size == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0, "group_size": 1}
    payload = numel * dtype_bytes(dtype)
    return {"count": 1, "bytes": payload, "wire_bytes": wire_bytes(op, payload, world_size), "group_size": world_size}
