"""Megatron tensor parallelism: collectives per layer per step (Shoeybi et al. 2019; Korthikanti et al. 2022).

Bytes are *payload per rank*: what one rank hands to the collective.  b batch, s seq, h hidden,
V vocab, p = tp, e bytes per element.  At p = 1 nothing is communicated (count 0, bytes 0).

    MLP, attention      forward: 1 all-reduce (g) of [b, s, h]; backward: 1 all-reduce (f) of the input
                        gradient [b, s, h] — only when the input needs a gradient
    transformer layer   2 forward + 2 backward: volume 4 b s h e
    sequence parallel   (Megatron's; per f/g pair the collectives of `tp.layers`' table) each all-reduce's wire
                        2 (p-1)/p b s h e becomes one all-gather + one reduce-scatter, and the re-gather of x
                        for the weight gradient adds (p-1)/p b s h e per pair and step; the stored layer inputs
                        are divided by p (`formulas.activations`).  Backward, one coalesced all-reduce of the n
                        elements of the parameters that act on each rank's s/p tokens: payload n e
    embedding           forward: 1 all-reduce of [b, s, h]
    output layer        (vocab-parallel, tied or not) logits_i = f(x) E_i^T: forward nothing; backward f's
                        all-reduce of the input gradient dx = sum_i dlogits_i E_i, [b, s, h]
    vocab-parallel CE   n = 3 all-reduces of [b, s]: max, target logit, sum of exponentials (n = 4 with label
                        smoothing: + the sum of logits).  Payload n b s e; wire n 2(p-1)/p b s e
    gathered logits     1 all-gather of this rank's logits [b, s, ceil(V/p)] (uneven shards padded).
                        Payload b s ceil(V/p) e (one shard); wire (p-1) b s ceil(V/p) e
    CE ratios           two conventions, both named:
                        payload ratio  ceil(V/p) / n            what one rank hands over: shrinks with p
                        wire ratio     p ceil(V/p) / (2 n)      bytes one rank sends (ring): ~ V / 6, does
                                                                not shrink with p (the saving)
    CE logits memory    per device: the vocab-parallel loss keeps its shard [b, s, ceil(V/p)]; gathering
                        builds the padded [b, s, p ceil(V/p)] (~ b s V) buffer — p times more

Bytes are payload per rank unless a term says ``wire_bytes`` (the ring model of ``formulas.common``).

Example::

    >>> mlp_all_reduce(batch=4, seq=8, hidden=64, tp=2, dtype="float32", backward=True)
    {'count': 2, 'bytes': 16384}
"""

from __future__ import annotations

from typing import Any

from shardlab.formulas.common import ceil_div, dtype_bytes, wire_bytes
from shardlab.formulas.dtypes import DTypeLike


def _check(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")


def _all_reduce(count: int, elements: int, dtype: DTypeLike, tp: int) -> dict[str, int]:
    if tp == 1:
        return {"count": 0, "bytes": 0}
    return {"count": count, "bytes": count * elements * dtype_bytes(dtype)}


def mlp_all_reduce(
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    dtype: DTypeLike = "float32",
    backward: bool = False,
    input_requires_grad: bool = True,
) -> dict[str, int]:
    """All-reduces of one Megatron MLP step: 1 forward (g), +1 backward (f) when the input needs a grad."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(1 + int(backward and input_requires_grad), batch * seq * hidden, dtype, tp)


attention_all_reduce = mlp_all_reduce  # same pattern: one g after the output projection, one f before QKV


def transformer_layer_all_reduce(
    batch: int, seq: int, hidden: int, tp: int, dtype: DTypeLike = "float32", backward: bool = True
) -> dict[str, int]:
    """Attention + MLP: 2 forward + 2 backward all-reduces of [b, s, h]: volume 4 b s h e per step."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(2 + 2 * int(backward), batch * seq * hidden, dtype, tp)


def sequence_parallel(
    batch: int, seq: int, hidden: int, tp: int, dtype: DTypeLike = "float32", sublayers: int = 1, backward: bool = True,
    sp_params: int = 0,
) -> dict[str, float]:
    """Megatron sequence parallelism for `sublayers` f/g pairs (each a column- then row-parallel layer).

    Per pair: forward 1 all-gather (payload [b, s/p, h]) + 1 reduce-scatter (payload [b, s, h]); backward 2
    all-gathers (the output gradient, and the re-gather of the saved input shard) + 1 reduce-scatter.  Returns
    counts and payload bytes, `all_gather.regather.count` (the backward re-gathers), the ring wire bytes of
    those activation collectives (`wire_bytes`) and of the all-reduces the pairs replace (plain TP: 1 forward +
    1 backward per pair).  `sp_params`: elements of the parameters that act on the s/p token shards (a
    row-parallel bias: h; a LayerNorm: 2 h) — backward, their partial gradients are summed in ONE all-reduce
    (`all_reduce.count`, `all_reduce.bytes` = sp_params e, `all_reduce.wire_bytes`).

    >>> sp = sequence_parallel(batch=2, seq=8, hidden=16, tp=4, dtype="float32", sp_params=16)
    >>> sp["all_gather.count"], sp["reduce_scatter.count"], sp["wire_bytes"] - sp["all_reduce_wire_bytes"]
    (3, 2, 768.0)
    >>> sp["all_reduce.count"], sp["all_reduce.bytes"]
    (1, 64)
    """
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp, sublayers=sublayers)
    if isinstance(sp_params, bool) or not isinstance(sp_params, int) or sp_params < 0:
        raise ValueError(f"sp_params={sp_params!r} must be an int >= 0")
    if seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tp={tp} (sequence parallelism splits the sequence)")
    full = batch * seq * hidden * dtype_bytes(dtype)
    bwd = sublayers if backward else 0
    if tp == 1:
        return {"all_gather.count": 0, "all_gather.bytes": 0, "all_gather.regather.count": 0,
                "reduce_scatter.count": 0, "reduce_scatter.bytes": 0, "wire_bytes": 0.0,
                "all_reduce_wire_bytes": 0.0, "all_reduce.count": 0, "all_reduce.bytes": 0,
                "all_reduce.wire_bytes": 0.0}
    n_ag, n_rs = sublayers + 2 * bwd, sublayers + bwd
    ag, rs = full // tp, full
    n_ar = int(backward and sp_params > 0)
    return {
        "all_reduce.count": n_ar,  # the sequence-parallel parameters' gradients, one coalesced all-reduce
        "all_reduce.bytes": n_ar * sp_params * dtype_bytes(dtype),
        "all_reduce.wire_bytes": wire_bytes("all_reduce", n_ar * sp_params * dtype_bytes(dtype), tp),
        "all_gather.count": n_ag,
        "all_gather.bytes": n_ag * ag,  # payload = the shard [b, s/p, h]
        "all_gather.regather.count": bwd,  # backward re-gathers of the saved input shard
        "reduce_scatter.count": n_rs,
        "reduce_scatter.bytes": n_rs * rs,  # payload = the full input [b, s, h]
        "wire_bytes": n_ag * wire_bytes("all_gather", ag, tp) + n_rs * wire_bytes("reduce_scatter", rs, tp),
        "all_reduce_wire_bytes": (sublayers + bwd) * wire_bytes("all_reduce", full, tp),
    }


def sp_grad_elements(hidden: int, layers: int, norm: str = "layernorm", row_biases: bool = True,
                     final_norm: bool = True) -> int:
    """Elements whose gradients the sequence-parallel all-reduce sums per step (`sequence_parallel`'s
    `sp_params`): per layer two norms (LayerNorm weight + bias: 2 h each; RMSNorm weight: h each) and, with
    `row_biases`, the biases of the attention output and MLP down projections (h each); plus the final norm.

    >>> sp_grad_elements(4096, 32, norm="rmsnorm", row_biases=False)   # Llama 3 8B: (32·2 + 1)·4096
    266240
    >>> sp_grad_elements(64, 1)   # a GPT layer: 2·2h + 2h, + the final LayerNorm 2h
    512
    """
    _check(hidden=hidden, layers=layers)
    per_norm = {"layernorm": 2 * hidden, "rmsnorm": hidden}
    if norm not in per_norm:
        raise ValueError(f"norm={norm!r} is not one of {sorted(per_norm)}")
    per_layer = 2 * per_norm[norm] + (2 * hidden if row_biases else 0)
    return layers * per_layer + (per_norm[norm] if final_norm else 0)


def embedding_all_reduce(batch: int, seq: int, hidden: int, tp: int, dtype: DTypeLike = "float32") -> dict[str, int]:
    """Vocab-parallel embedding forward: 1 all-reduce of [b, s, h] (each id's row lives on one rank)."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(1, batch * seq * hidden, dtype, tp)


def output_layer_all_reduce(batch: int, seq: int, hidden: int, tp: int, dtype: DTypeLike = "float32",
                            backward: bool = True) -> dict[str, int]:
    """Vocab-parallel output layer logits_i = f(x) E_i^T: no forward collective; backward 1 all-reduce of the input
    gradient [b, s, h] (f's: each rank's dlogits_i E_i is a partial sum of dx)."""
    _check(batch=batch, seq=seq, hidden=hidden, tp=tp)
    return _all_reduce(int(backward), batch * seq * hidden, dtype, tp)


def _ce_reductions(label_smoothing: float) -> int:
    """All-reduces of the vocab-parallel loss: max, target logit, sum of exp (+ sum of logits when smoothing)."""
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} is not a number in [0, 1]")
    return 3 + int(label_smoothing > 0)


def vocab_parallel_ce(
    batch: int, seq: int, tp: int, dtype: DTypeLike = "float32", label_smoothing: float = 0.0
) -> dict[str, Any]:
    """All-reduces of [b, s]: max, target logit, sum exp (+ sum of logits if label_smoothing > 0).

    Terms: ``count``, ``bytes`` (payload per rank) and ``wire_bytes`` (ring: 2 (p-1)/p of the payload).

    >>> vocab_parallel_ce(batch=1, seq=8, tp=8)
    {'count': 3, 'bytes': 96, 'wire_bytes': 168.0}
    """
    _check(batch=batch, seq=seq, tp=tp)
    f: dict[str, Any] = _all_reduce(_ce_reductions(label_smoothing), batch * seq, dtype, tp)
    return f | {"wire_bytes": wire_bytes("all_reduce", f["bytes"], tp)}


def shard_width(vocab: int, tp: int) -> int:
    """Largest vocab shard ceil(V / p) — all-gather pads every shard to it."""
    _check(vocab=vocab, tp=tp)
    return ceil_div(vocab, tp)


def gathered_logits(batch: int, seq: int, vocab: int, tp: int, dtype: DTypeLike = "float32") -> dict[str, Any]:
    """1 all-gather of this rank's logits shard, padded to ceil(V/p).

    Terms: ``count``, ``bytes`` (payload: the shard b s ceil(V/p) e) and ``wire_bytes`` (ring: (p-1) shards).

    >>> gathered_logits(batch=1, seq=8, vocab=50257, tp=8)
    {'count': 1, 'bytes': 201056, 'wire_bytes': 1407392.0}
    """
    _check(batch=batch, seq=seq, vocab=vocab, tp=tp)
    if tp == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0}
    shard = batch * seq * shard_width(vocab, tp) * dtype_bytes(dtype)
    return {"count": 1, "bytes": shard, "wire_bytes": float(wire_bytes("all_gather", shard, tp))}


def _ratio_check(vocab: int, tp: int) -> None:
    _check(vocab=vocab, tp=tp)
    if tp == 1:
        raise ValueError("tp=1 communicates nothing either way: the cross-entropy ratio is undefined")


def ce_payload_ratio(vocab: int, tp: int, label_smoothing: float = 0.0) -> float:
    """Payload convention: gathered-logits payload / vocab-parallel payload = ceil(V/p) / n (n = 3, or 4 with
    label smoothing); b, s, e cancel.  It divides ONE shard (what an all-gather rank hands over) by the whole
    [b, s] inputs of the all-reduces, so it shrinks with p although the wire bytes do not.

    >>> ce_payload_ratio(50257, 8)   # ceil(50257 / 8) / 3 = 6283 / 3
    2094.3333333333335
    """
    _ratio_check(vocab, tp)
    return shard_width(vocab, tp) / _ce_reductions(label_smoothing)


def ce_wire_ratio(vocab: int, tp: int, label_smoothing: float = 0.0) -> float:
    """Wire convention (the saving): bytes one rank sends, ring model, gathered / vocab-parallel

        (p-1) ceil(V/p)  /  (n 2 (p-1)/p)  =  p ceil(V/p) / (2 n)   ~ V / 6 for n = 3, whatever p.

    >>> ce_wire_ratio(50257, 8)      # 8 * 6283 / 6
    8377.333333333334
    >>> ce_wire_ratio(128256, 8) == ce_wire_ratio(128256, 64) == 128256 / 6
    True
    """
    _ratio_check(vocab, tp)
    return tp * shard_width(vocab, tp) / (2 * _ce_reductions(label_smoothing))


def ce_logits_bytes(batch: int, seq: int, vocab: int, tp: int, dtype: DTypeLike = "float32") -> dict[str, int]:
    """Per-device logits buffer: ``vocab_parallel`` keeps the shard [b, s, ceil(V/p)]; ``gathered`` builds the
    all-gather's result [b, s, p ceil(V/p)] (padded; ~ b s V), p times larger.

    >>> ce_logits_bytes(batch=1, seq=8, vocab=50257, tp=8)
    {'vocab_parallel': 201056, 'gathered': 1608448}
    """
    _check(batch=batch, seq=seq, vocab=vocab, tp=tp)
    shard = batch * seq * shard_width(vocab, tp) * dtype_bytes(dtype)
    return {"vocab_parallel": shard, "gathered": tp * shard}
