"""Context parallelism: what attention over a sequence split across cp ranks sends and holds, per rank per layer.

Liu et al. 2023 (ring attention), the zig-zag balance of ring-flash-attention / Megatron-LM / Llama 3 (2·cp
chunks; Brandon et al. 2023's striped attention is the round-robin alternative), Jacobs et al. 2023
(DeepSpeed-Ulysses), Llama 3 (all-gather CP). b batch, s sequence, hq query heads, hkv key/value heads, d head
dim, e bytes per element, cp ranks; one K (or V) block = b·(s/cp)·hkv·d·e bytes. At cp = 1 nothing moves.

    ring, forward         2(cp − 1) sends (k and v, cp − 1 steps): (cp − 1)·2·b·(s/cp)·hkv·d·e
    ring, backward        ``backward="ring"`` (``shardlab.context.ring``: the forward keeps only its own block):
                          k, v travel again (cp − 1 steps) and their gradient accumulators dk, dv travel cp
                          steps (the last one brings the finished gradient home):
                          2(cp − 1) + 2cp sends, (2cp − 1)·2·b·(s/cp)·hkv·d·e
                          ``backward="saved"`` (autograd through an unrolled ring: every visiting block is kept
                          for the backward, cp times the K/V memory): only dk, dv travel back, cp − 1 steps:
                          2(cp − 1) transfers, (cp − 1)·2·b·(s/cp)·hkv·d·e
    all-gather, forward   2 all-gathers (k, v); payload = the shard b·(s/cp)·hkv·d·e each; wire (cp − 1)·payload:
                          the SAME wire bytes as the ring's forward — the difference is memory
    all-gather, backward  2 reduce-scatters (dk, dv) of the full b·s·hkv·d·e; wire (cp − 1)/cp·payload
    Ulysses (a2a)         sequence shards -> head shards for q, k, v, and back for the output (4 all-to-alls
                          forward, 4 backward); payload b·(s/cp)·(2hq + 2hkv)·d·e, wire (cp − 1)/cp·payload;
                          needs hq divisible by cp, and hkv too unless K/V heads are replicated first

Memory per rank (:func:`memory`), in K/V blocks of b·(s/cp)·hkv·d·e:

    kv            forward: ring 4 (its own k and v, and the pair in flight); all-gather 2cp (the whole K and V)
    kv_backward   ring 10 (``shardlab.context.ring``'s backward: its saved k, v; the visiting k, v and their dk, dv
                  accumulators; the next of each in flight); all-gather 4cp (gathered K, V and the full dK, dV
                  partial sums before the reduce-scatter). Autograd through an SPMD ring saves every visiting
                  block instead: 2cp, like all-gather.
    scores        one block b·hq·(s/cp)·block·e with ``block`` keys, for a DENSE kernel (ring: s/cp, all-gather:
                  s); a flash kernel holds one tile instead, whichever variant

Causal balance (unmasked score elements per rank; chunk c):

    contiguous   c = s/cp,      rank r: r full blocks + 1 diagonal       r·c² + c(c+1)/2  (grows with r)
    zigzag       c = s/(2cp),   rank r: 2cp − 1 full + 2 diagonal        (2cp − 1)·c² + c(c + 1)  (every rank)

Example::

    >>> ring_p2p(batch=1, seq=1024, kv_heads=8, head_dim=128, cp=8, dtype="bf16")
    {'count': 14, 'bytes': 3670016}
    >>> causal_work(seq=16, cp=4, layout="contiguous"), causal_work(seq=16, cp=4, layout="zigzag")
    ([10, 26, 42, 58], [34, 34, 34, 34])
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import DTypeLike, dtype_bytes, wire_bytes

LAYOUTS = ("contiguous", "zigzag")
BACKWARD = ("ring", "saved")


def _check(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")


def _chunks(seq: int, cp: int, layout: str) -> int:
    """Chunk length of ``layout`` (cp or 2·cp chunks)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    n = cp if layout == "contiguous" else 2 * cp
    if seq % n:
        raise ValueError(f"seq={seq} is not divisible by the {n} chunks of the {layout} layout (cp={cp})")
    return seq // n


def kv_block_bytes(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, dtype: DTypeLike = "float32") -> int:
    """One rank's K (or V) shard: b·(s/cp)·hkv·d·e."""
    _check(batch=batch, seq=seq, kv_heads=kv_heads, head_dim=head_dim, cp=cp)
    if seq % cp:
        raise ValueError(f"seq={seq} is not divisible by cp={cp}")
    return batch * (seq // cp) * kv_heads * head_dim * dtype_bytes(dtype)


def ring_p2p(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, dtype: DTypeLike = "float32",
             phase: str = "forward", backward: str = "ring") -> dict[str, int]:
    """Sends one rank makes for one attention layer's ``phase`` ("forward", "backward" or "step" = both):
    ``{"count", "bytes"}`` (a send's payload is its wire bytes)."""
    if phase not in ("forward", "backward", "step"):
        raise ValueError(f"phase={phase!r} is not one of ('forward', 'backward', 'step')")
    if backward not in BACKWARD:
        raise ValueError(f"backward={backward!r} is not one of {BACKWARD}")
    block = kv_block_bytes(batch, seq, kv_heads, head_dim, cp, dtype)
    fwd = 2 * (cp - 1)
    bwd = 2 * (cp - 1) + 2 * cp if backward == "ring" else 2 * (cp - 1)
    if cp == 1:
        fwd = bwd = 0
    count = {"forward": fwd, "backward": bwd, "step": fwd + bwd}[phase]
    return {"count": count, "bytes": count * block}


def allgather_kv(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, dtype: DTypeLike = "float32",
                 backward: bool = False) -> dict[str, Any]:
    """All-gather CP of one layer: forward all-gathers of k and v (payload = the shard), backward
    reduce-scatters of dk and dv (payload = the full gradient). Per rank."""
    shard = kv_block_bytes(batch, seq, kv_heads, head_dim, cp, dtype)
    if cp == 1:
        return {"all_gather": {"count": 0, "bytes": 0, "wire_bytes": 0.0},
                "reduce_scatter": {"count": 0, "bytes": 0, "wire_bytes": 0.0}}
    out = {"all_gather": {"count": 2, "bytes": 2 * shard, "wire_bytes": 2 * wire_bytes("all_gather", shard, cp)},
           "reduce_scatter": {"count": 0, "bytes": 0, "wire_bytes": 0.0}}
    if backward:
        full = shard * cp
        out["reduce_scatter"] = {"count": 2, "bytes": 2 * full,
                                 "wire_bytes": 2 * wire_bytes("reduce_scatter", full, cp)}
    return out


def ulysses_all_to_all(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, cp: int,
                       dtype: DTypeLike = "float32", backward: bool = False) -> dict[str, Any]:
    """DeepSpeed-Ulysses: q, k, v from sequence shards to head shards, the output back (4 all-to-alls), and as
    many again backward. Per rank: payload = each all-to-all's full local input."""
    _check(batch=batch, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim, cp=cp)
    for name, h in (("heads", heads), ("kv_heads", kv_heads)):
        if h % cp:
            raise ValueError(f"{name}={h} is not divisible by cp={cp} (Ulysses gives each rank whole heads)")
    if seq % cp:
        raise ValueError(f"seq={seq} is not divisible by cp={cp}")
    if cp == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0}
    per_layer = batch * (seq // cp) * (2 * heads + 2 * kv_heads) * head_dim * dtype_bytes(dtype)
    n = 2 if backward else 1
    return {"count": 4 * n, "bytes": n * per_layer, "wire_bytes": n * wire_bytes("all_to_all", per_layer, cp)}


def memory(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, cp: int, dtype: DTypeLike = "float32",
           method: str = "ring", block: int | None = None) -> dict[str, int]:
    """Per-rank bytes of one attention layer's working set: ``kv`` (keys and values held in the forward),
    ``kv_backward`` (keys, values and their gradients held in the backward) and ``scores`` (one block of scores of
    a dense kernel: s/cp queries x ``block`` keys; default: the ring's s/cp, the all-gather's s)."""
    if method not in ("ring", "allgather"):
        raise ValueError(f"method={method!r} is not one of ('ring', 'allgather')")
    kv = kv_block_bytes(batch, seq, kv_heads, head_dim, cp, dtype)
    keys = block if block is not None else (seq // cp if method == "ring" else seq)
    _check(block=keys)
    held = 4 * kv if (method == "ring" and cp > 1) else 2 * kv * (cp if method == "allgather" else 1)
    held_bwd = 10 * kv if (method == "ring" and cp > 1) else 4 * kv * (cp if method == "allgather" else 1)
    return {"kv": held, "kv_backward": held_bwd, "scores": batch * heads * (seq // cp) * keys * dtype_bytes(dtype)}


def causal_blocks(cp: int, layout: str, causal: bool = True) -> list[dict[str, int]]:
    """Per rank, the (query chunk, key chunk) blocks its ring meets: ``{"full", "diagonal", "masked"}``."""
    _check(cp=cp)
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    per = 1 if layout == "contiguous" else 4  # blocks met per step
    if not causal:
        return [{"full": cp * per, "diagonal": 0, "masked": 0} for _ in range(cp)]
    if layout == "contiguous":
        return [{"full": r, "diagonal": 1, "masked": cp - 1 - r} for r in range(cp)]
    return [{"full": 2 * cp - 1, "diagonal": 2, "masked": 2 * cp - 1} for _ in range(cp)]


def causal_work(seq: int, cp: int, layout: str, causal: bool = True) -> list[int]:
    """Unmasked score elements each rank computes (per batch row and head)."""
    _check(seq=seq, cp=cp)
    c = _chunks(seq, cp, layout)
    return [b["full"] * c * c + b["diagonal"] * c * (c + 1) // 2 for b in causal_blocks(cp, layout, causal)]


def max_over_mean(work: list[int]) -> float:
    """Load imbalance: the busiest rank's work over the mean (1.0 = balanced; the step waits for the max)."""
    if not work or sum(work) == 0:
        raise ValueError(f"work={work!r} must be a non-empty list with a positive total")
    return max(work) * len(work) / sum(work)
