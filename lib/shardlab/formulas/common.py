"""Shared vocabulary for every formula: element sizes and the ring model of wire bytes.

Bytes (design.md): *payload* is what one rank hands to a collective (all-reduce: its input; all-gather: its
shard; reduce-scatter: its full input). *Wire* bytes one rank sends with a ring algorithm:

    all-reduce      2 (W-1)/W * payload      (reduce-scatter then all-gather)
    all-gather        (W-1)   * payload      (payload is the shard)
    reduce-scatter    (W-1)/W * payload      (payload is the full input)
    all-to-all        (W-1)/W * payload
    broadcast                   payload

Example::

    >>> wire_bytes("all-reduce", 1000, 4)
    1500.0
"""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "f32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "f16": 2, "half": 2,
    "float64": 8, "f64": 8, "double": 8,
    "int64": 8, "s64": 8, "int32": 4, "s32": 4, "int8": 1, "s8": 1, "uint8": 1, "bool": 1, "pred": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a string ('bf16', 'float32') or a torch dtype."""
    if not isinstance(dtype, str):
        itemsize = getattr(dtype, "itemsize", None)
        if isinstance(itemsize, int):
            return itemsize
        dtype = str(dtype)
    key = dtype.removeprefix("torch.").lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is unknown; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def wire_bytes(op: str, payload: float, world_size: int) -> float:
    """Bytes one rank sends for a collective of ``payload`` bytes over ``world_size`` ranks (ring model)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    w = world_size
    factors = {
        "all_reduce": 2 * (w - 1) / w, "all_gather": (w - 1), "reduce_scatter": (w - 1) / w,
        "all_to_all": (w - 1) / w, "broadcast": 1.0 if w > 1 else 0.0,
    }
    key = op.replace("-", "_")
    if key not in factors:
        raise ValueError(f"op={op!r} is not one of {sorted(factors)}")
    return factors[key] * payload


def reduction_dtype(dtype: Any, device_kind: str) -> str:
    """Element type a reduction collective actually carries on ``device_kind``.

    XLA:CPU has no bf16/f16 arithmetic: its float-normalization pass promotes a bf16 dot and the all-reduce
    of its partial sums to f32 (the HLO shows ``all-reduce`` of ``f32[...]`` with ``to_apply=%add.clone_promoted``,
    then a convert back to bf16). TPUs reduce in bf16. Formulas that predict HLO bytes take this dtype.
    """
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if device_kind == "cpu" and dtype_bytes(name) == 2 and name.lower() in ("bfloat16", "bf16", "float16", "fp16",
                                                                             "f16", "half"):
        return "float32"
    return name
