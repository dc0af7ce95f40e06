"""Shared vocabulary for every formula: element sizes and the ring model of wire bytes.

Bytes: *payload* is what one rank hands to a collective (all-reduce: its input; all-gather: its
shard; reduce-scatter: its full input). *Wire* bytes one rank sends with a ring algorithm:

    all-reduce      2 (W-1)/W * payload      (reduce-scatter then all-gather)
    all-gather        (W-1)   * payload      (payload is the shard)
    reduce-scatter    (W-1)/W * payload      (payload is the full input)
    all-to-all        (W-1)/W * payload      (payload is the full input; one chunk stays home)
    broadcast                   payload
    send                        payload      (point-to-point: the whole tensor to one peer)
    recv                        0            (the sender's row carries the wire)

Example::

    >>> wire_bytes("all-reduce", 1000, 4)
    1500.0
"""

from __future__ import annotations

from typing import Any

from shardlab.dtypes import dtype_bytes, is_16bit_float, name

__all__ = ["RECOMPUTE_POLICIES", "ceil_div", "check_recompute", "dtype_bytes", "reduction_dtype", "wire_bytes"]

RECOMPUTE_POLICIES = ("none", "selective", "full")
"""Activation recomputation (Korthikanti et al. 2022): keep everything, recompute the attention core, or keep
only each layer's input and run its forward again in backward."""


def check_recompute(recompute: str) -> str:
    if recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_POLICIES}")
    return recompute


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive ints, exactly (no float): the size of the largest of b near-equal shards.

    >>> ceil_div(1003, 4)
    251
    """
    if b < 1:
        raise ValueError(f"ceil_div: divisor b={b} must be >= 1")
    return -(-a // b)


def wire_bytes(op: str, payload: float, world_size: int) -> float:
    """Bytes one rank sends for a collective of ``payload`` bytes over ``world_size`` ranks (ring model)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    w = world_size
    factors = {
        "all_reduce": 2 * (w - 1) / w, "all_gather": (w - 1), "reduce_scatter": (w - 1) / w,
        "all_to_all": (w - 1) / w, "broadcast": 1.0 if w > 1 else 0.0,
        "send": 1.0, "recv": 0.0,
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
    if device_kind == "cpu" and is_16bit_float(dtype):
        return "float32"
    return name(dtype)
