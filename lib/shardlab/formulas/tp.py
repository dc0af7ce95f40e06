"""Megatron tensor parallelism: collectives per layer per step (Shoeybi et al. 2019; Korthikanti et al. 2022).

Bytes are *payload per rank* (design.md): what one rank hands to the collective.  b batch, s seq, h hidden,
V vocab, p = tp, e bytes per element.  At p = 1 nothing is communicated (count 0, bytes 0).

    MLP, attention      forward: 1 all-reduce (g) of [b, s, h]; backward: 1 all-reduce (f) of the input
                        gradient [b, s, h] — only when the input needs a gradient
    transformer layer   2 forward + 2 backward: volume 4 b s h e
    sequence parallel   every all-reduce becomes reduce-scatter (payload b s h e) + all-gather (payload
                        b s h e / p): wire (p-1)/p b s h e + (p-1) b s h e / p = 2 (p-1)/p b s h e, the same
                        wire bytes as the all-reduce it replaces
    embedding           forward: 1 all-reduce of [b, s, h]
    vocab-parallel CE   all-reduces of [b, s]: max, target logit, sum of exponentials (+ sum of logits with
                        label smoothing): 3 (or 4) b s e
    gathered logits     1 all-gather of this rank's logits [b, s, ceil(V/p)] (uneven shards padded)
    saving ratio        gathered / vocab-parallel = ceil(V/p) / 3 (or / 4)

Example::

    >>> mlp_all_reduce(batch=4, seq=8, hidden=64, tp=2, dtype="float32", backward=True)
    {'count': 2, 'bytes': 16384}
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import dtype_bytes, wire_bytes


def _check(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")


def _all_reduce(count: int, elements: int, dtype: Any, tp: int) -> dict[str, int]:
    if tp == 1:
        return {"count": 0, "bytes": 0}
    return {"count": count, "bytes": count * elements * dtype_bytes(dtype)}


def mlp_all_reduce(
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    dtype: Any = "float32",
    backward: bool = False,
    input_requires_grad: bool = True,
) -> dict[str, int]:
    """All-reduces of one Megatron MLP step: 1 forward (g), +1 backward (f) when the input needs a grad."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(1 + int(backward and input_requires_grad), batch * seq * hidden, dtype, tp)


attention_all_reduce = mlp_all_reduce  # same pattern: one g after the output projection, one f before QKV


def transformer_layer_all_reduce(
    batch: int, seq: int, hidden: int, tp: int, dtype: Any = "float32", backward: bool = True
) -> dict[str, int]:
    """Attention + MLP: 2 forward + 2 backward all-reduces of [b, s, h]: volume 4 b s h e per step."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(2 + 2 * int(backward), batch * seq * hidden, dtype, tp)


def sequence_parallel(
    batch: int, seq: int, hidden: int, tp: int, dtype: Any = "float32", sublayers: int = 1, backward: bool = True
) -> dict[str, float]:
    """Sequence-parallel version of `sublayers` f/g pairs: all-gathers + reduce-scatters and their wire bytes,
    next to the wire bytes of the all-reduces they replace (equal)."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp, sublayers=sublayers)
    if seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tp={tp} (sequence parallelism splits the sequence)")
    full = batch * seq * hidden * dtype_bytes(dtype)
    n = sublayers * (2 if backward else 1)  # each of fwd and bwd: one all-gather and one reduce-scatter
    if tp == 1:
        return {
            "all_gather.count": 0,
            "all_gather.bytes": 0,
            "reduce_scatter.count": 0,
            "reduce_scatter.bytes": 0,
            "wire_bytes": 0.0,
            "all_reduce_wire_bytes": 0.0,
        }
    ag, rs = full // tp, full
    return {
        "all_gather.count": n,
        "all_gather.bytes": n * ag,  # payload = the shard [b, s/p, h]
        "reduce_scatter.count": n,
        "reduce_scatter.bytes": n * rs,  # payload = the full input [b, s, h]
        "wire_bytes": n * (wire_bytes("all_gather", ag, tp) + wire_bytes("reduce_scatter", rs, tp)),
        "all_reduce_wire_bytes": n * wire_bytes("all_reduce", full, tp),
    }


def embedding_all_reduce(batch: int, seq: int, hidden: int, tp: int, dtype: Any = "float32") -> dict[str, int]:
    """Vocab-parallel embedding forward: 1 all-reduce of [b, s, h] (each id's row lives on one rank)."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(1, batch * seq * hidden, dtype, tp)


def vocab_parallel_ce(
    batch: int, seq: int, tp: int, dtype: Any = "float32", label_smoothing: float = 0.0
) -> dict[str, int]:
    """All-reduces of [b, s]: max, target logit, sum exp (+ sum of logits if label_smoothing > 0)."""
    _check(batch=batch, seq=seq, tp=tp)
    return _all_reduce(3 + int(label_smoothing > 0), batch * seq, dtype, tp)


def shard_width(vocab: int, tp: int) -> int:
    """Largest vocab shard ceil(V / p) — all-gather pads every shard to it."""
    _check(vocab=vocab, tp=tp)
    return -(-vocab // tp)


def gathered_logits(batch: int, seq: int, vocab: int, tp: int, dtype: Any = "float32") -> dict[str, int]:
    """1 all-gather of this rank's logits shard, padded to ceil(V/p): payload b s ceil(V/p) e per rank."""
    _check(batch=batch, seq=seq, vocab=vocab, tp=tp)
    if tp == 1:
        return {"count": 0, "bytes": 0}
    return {"count": 1, "bytes": batch * seq * shard_width(vocab, tp) * dtype_bytes(dtype)}


def ce_saving_ratio(vocab: int, tp: int, label_smoothing: float = 0.0) -> float:
    """Payload of gathered logits / payload of vocab-parallel CE = ceil(V/p) / (3 or 4); b, s, e cancel."""
    _check(vocab=vocab, tp=tp)
    if tp == 1:
        raise ValueError("tp=1 communicates nothing either way: the saving ratio is undefined")
    return shard_width(vocab, tp) / (3 + int(label_smoothing > 0))
