"""Block-matrix partitioning and the three basic collectives: what each must communicate (notebooks 00, 01).

Notation (00_welcome): x is m×k, W is k×n, y = xW, p devices (blocks), e bytes per element.

- **Column split** ``W = [W_1 ... W_p]``: ``y = [xW_1 ... xW_p]`` — every device owns a column block of y,
  no collective (the concatenation is only a layout).
- **Row split** ``W = [W_1; ...; W_p]`` with ``x = [x_1 ... x_p]`` by columns: ``y = Σ_i x_i W_i`` — every
  device holds an unreduced m×n partial sum; one all-reduce over the p devices, payload m·n·e per device
  (none when p = 1: there is nothing to add).
- **2-D grid** on a (p_r × p_c) mesh, x by (rows over p_r, k over p_c), W rows (k) over p_c: device (i, j)
  holds the partial ``x_ij W_j`` of y's row block i; one all-reduce within each group of p_c devices,
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
from shardlab.formulas.dtypes import DTypeLike

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def col_split_collectives() -> int:
    """Collectives needed by a column split of W (y = [xW_1 ... xW_p])."""
    return 0


def _positive(**kw: int) -> None:
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


def row_split_all_reduce(m: int, n: int, parts: int, dtype: DTypeLike = "float32") -> dict[str, Any]:
    """One all-reduce over ``parts`` devices of the m×n partial sums: count, payload and ring wire bytes per device."""
    _positive(m=m, n=n, parts=parts)
    if parts == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0, "group_size": 1}
    payload = m * n * dtype_bytes(dtype)
    return {"count": 1, "bytes": payload, "wire_bytes": wire_bytes("all_reduce", payload, parts), "group_size": parts}


def grid_all_reduce(m: int, n: int, grid: tuple[int, int], dtype: DTypeLike = "float32") -> dict[str, Any]:
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


def collective(op: str, numel: int, world_size: int, dtype: DTypeLike = "float32") -> dict[str, Any]:
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


# ------------------------------------------------------------------------------ sharded matmuls on a 2-D mesh
MATMUL_CASES = ("1", "2", "3", "4", "5", "5b")
"""The scaling book's cases (How to Scale Your Model, part 3) for C = A·B on a mesh (X, Y), plus the conflict::

    1   A[I_X, J] · B[J, K_Y]   no contracting dim split        C[I_X, K_Y], nothing to send
    2   A[I, J_X] · B[J, K]     one contracting dim split       all-gather A over X, then C[I, K]
    3   A[I, J_X] · B[J_X, K]   both contracting dims split     C{U_X}: all-reduce over X
    4   A[I_X, J] · B[J, K_X]   both output dims on X           not a tiling: gather one operand; C keeps one X
    5   A[M_X, N_Y] · B[N_Y, M_X]   3 and 4 at once             gather B over X, all-reduce over Y: C[M_X, M], 1-D
    5b  the same, C asked for as C[M_X, M_Y]                  gather B over X, reduce-scatter over Y: 2-D

Case 5 is the weight gradient of a 2-D sharded model whose activations are split over the tensor axis too
(pytorch/xla#8883): the contracted N takes Y with it (partial sums over Y), and the result can keep X on one of
its two M's only.
"""


def sharded_matmul(case: str, i: int, j: int, k: int, mesh: tuple[int, int] = (2, 4),
                   dtype: DTypeLike = "float32") -> dict[str, int]:
    """What the algebra fixes for matmul ``case`` (:data:`MATMUL_CASES`) with A [i, j], B [j, k] (cases 5, 5b:
    B [j, i]) on a mesh (X, Y) = ``mesh``: ``C.elements`` (C's elements per device) and, per collective,
    ``<op>.count`` and — where the rule fixes them — ``<op>.elements`` / ``.bytes`` (payload per device) and
    ``.group_size``. Case 4 fixes only that one operand is gathered: which one, and over which axis, is the
    partitioner's choice. A case without a collective gives ``collective.count`` 0.

    >>> sharded_matmul("5", 64, 128, 32)["C.elements"], sharded_matmul("5b", 64, 128, 32)["C.elements"]
    (2048, 512)
    >>> sharded_matmul("5", 64, 128, 32)["all_reduce.group_size"]   # the partial sums run over Y
    4
    """
    if case not in MATMUL_CASES:
        raise ValueError(f"case={case!r} is not one of {MATMUL_CASES}")
    _positive(i=i, j=j, k=k, X=mesh[0], Y=mesh[1])
    x, y = mesh
    e = dtype_bytes(dtype)

    def op(name: str, elements: int | None, group: int | None) -> dict[str, int]:
        out = {f"{name}.count": 1}
        if elements is not None:
            out |= {f"{name}.elements": elements, f"{name}.bytes": elements * e}
        if group is not None:
            out[f"{name}.group_size"] = group
        return out

    if case == "1":
        return {"C.elements": (i // x) * (k // y), "collective.count": 0}
    if case == "2":
        return {"C.elements": i * k} | op("all_gather", i * (j // x), x)  # A's shard gathered over X
    if case == "3":
        return {"C.elements": i * k} | op("all_reduce", i * k, x)  # full-size partial sums over X
    if case == "4":
        return {"C.elements": (i // x) * k} | op("all_gather", None, None)  # one operand gathered, one X kept
    gather = op("all_gather", (j // y) * (i // x), x)  # B's [j/Y, i/X] shard over X: C keeps A's X
    if case == "5":
        return {"C.elements": (i // x) * i} | gather | op("all_reduce", (i // x) * i, y)
    return {"C.elements": (i // x) * (i // y)} | gather | op("reduce_scatter", (i // x) * i, y)
