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

The ring also takes *steps*: a reduce-scatter or an all-gather p − 1, an all-reduce 2(p − 1), each step one
chunk of payload/p per rank. Every step pays a fixed start-up α (latency, synchronisation) before its chunk
travels at bandwidth β, so (the α–β model)

    T_ring = steps · α + wire / β           all-reduce: 2(p − 1) α + 2(p − 1)/p · payload / β

The bytes per rank barely change with p; the steps grow with it.

Example::

    >>> wire_bytes("all-reduce", 1000, 4)
    1500.0
    >>> ring_steps("all_reduce", 8), ring_time_s("all_reduce", 4096, 8, alpha_s=1e-5, beta_Bps=1e9) * 1e6  # µs
    (14, 147.168)
"""

from __future__ import annotations

from shardlab.formulas.dtypes import DTypeLike, dtype_bytes, is_16bit_float, name

__all__ = ["RECOMPUTE_POLICIES", "ceil_div", "check_recompute", "dtype_bytes", "reduction_dtype", "ring_steps",
           "ring_time_s", "wire_bytes"]

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


def ring_steps(op: str, world_size: int) -> int:
    """Steps of the ring ``op`` over ``world_size`` ranks: p − 1 per phase (reduce-scatter, all-gather)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    phases = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
    key = op.replace("-", "_")
    if key not in phases:
        raise ValueError(f"op={op!r} is not one of {sorted(phases)}")
    return phases[key] * (world_size - 1)


def ring_time_s(op: str, payload: float, world_size: int, alpha_s: float, beta_Bps: float) -> float:
    """The α–β time of the ring ``op``: ``ring_steps`` · α + ``wire_bytes`` / β (seconds)."""
    if alpha_s < 0 or beta_Bps <= 0:
        raise ValueError(f"alpha_s={alpha_s} must be >= 0 and beta_Bps={beta_Bps} > 0")
    return ring_steps(op, world_size) * alpha_s + wire_bytes(op, payload, world_size) / beta_Bps


def reduction_dtype(dtype: DTypeLike, device_kind: str) -> str:
    """Element type a reduction collective actually carries on ``device_kind``.

    XLA:CPU's pipeline computes bf16/f16 in f32: its float-normalisation pass upcasts a bf16 dot and the
    all-reduce of its partial sums (even elementwise products) to f32 — a choice of its passes, not a missing
    instruction (the HLO shows ``all-reduce`` of ``f32[...]`` with ``to_apply=%add.clone_promoted``, then a convert
    back to bf16). TPUs reduce in bf16. Formulas that predict HLO bytes take this dtype.
    """
    if device_kind == "cpu" and is_16bit_float(dtype):
        return "float32"
    return name(dtype)
