"""Activation memory per transformer layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198, section 4).

Design note
-----------
Notation follows the paper: s = sequence length, b = micro-batch size, h = hidden size, a = attention heads,
t = tensor-parallel degree, L = layers. Activations are 16-bit (2 bytes per element) and dropout masks are
1 byte per element, exactly as the paper assumes; every function returns **bytes** for ONE layer on ONE
tensor-parallel rank, split into the paper's named terms so a notebook can show where the memory goes:

    attention block   11·sbh + 5·as²b      (QKV input 2sbh, Q,K 4sbh, softmax 2as²b, dropout mask as²b,
                                            dropout output 2as²b, V 2sbh, out-proj input 2sbh, mask sbh)
    MLP block         19·sbh               (fc1 input 2sbh, GeLU input 8sbh, fc2 input 8sbh, mask sbh)
    layer norms        4·sbh               (two LNs, input 2sbh each)
    total             sbh·(34 + 5as/h)                                           eq. (1)

With t-way tensor parallelism the parallel parts divide by t and 10·sbh stay replicated (the two LN inputs,
the QKV / fc1 inputs and the two dropout masks):          sbh·(10 + 24/t + 5as/(ht))        eq. (2)
Adding sequence parallelism shards the replicated 10·sbh as well:  (sbh/t)·(34 + 5as/h)      eq. (4)
Selective recompute drops the 5as²b attention-core term (recomputed in backward):  34·sbh/t  (with SP)
Full recompute keeps only the layer input:                          2·sbh  (2·sbh/t with SP)

The formulas describe the paper's GPT block (4h MLP, GeLU, dropout, LayerNorm). For Llama-style blocks
(SwiGLU, GQA, RMSNorm, no dropout) they are an approximation the planner states as such.

Example (GPT-3 175B: a=96, s=2048, h=12288):
    >>> attention_score_ratio(heads=96, seq=2048, hidden=12288)   # 5as/h
    80.0
"""

from __future__ import annotations

from typing import NamedTuple

ACT_BYTES = 2  # 16-bit activations (paper's assumption)
MASK_BYTES = 1  # dropout masks stored as bytes (paper's assumption)

RECOMPUTE_POLICIES = ("none", "selective", "full")


class ActivationTerms(NamedTuple):
    """Bytes of activations stored for backward, one layer, one tensor-parallel rank."""

    attention: float  # attention block incl. the 5as²b core (0 when recomputed)
    mlp: float  # MLP block
    layernorm: float  # the two layer norms
    total: float  # sum of the three


def attention_score_ratio(heads: int, seq: int, hidden: int) -> float:
    """5as/h: how much the attention-score term weighs against the linear terms (80 for GPT-3)."""
    return 5.0 * heads * seq / hidden


def _check(seq: int, batch: int, hidden: int, heads: int, tp: int) -> None:
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads), ("tp", tp)):
        if v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    if heads % tp:
        raise ValueError(f"heads={heads} is not divisible by tp={tp}")
    if hidden % tp:
        raise ValueError(f"hidden={hidden} is not divisible by tp={tp}")


def activation_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> ActivationTerms:
    """Stored activation bytes of one transformer layer on one tensor-parallel rank.

    recompute: "none" (eq. 1/2/4), "selective" (attention core recomputed), "full" (only the layer input).
    Example: s=2048, b=1, h=12288, a=96, t=1 -> total = sbh·(34 + 80) = 2048·12288·114 = 2_868_903_936 B.
    """
    if recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_POLICIES}")
    _check(seq, batch, hidden, heads, tp)
    s, b, h, a, t = seq, batch, hidden, heads, tp
    sbh = s * b * h
    sp = t if sequence_parallel else 1  # divisor for the otherwise-replicated terms
    if recompute == "full":
        # only the layer input (2 bytes/element) is kept; with SP it is sequence-sharded
        return ActivationTerms(attention=0.0, mlp=0.0, layernorm=0.0, total=2.0 * sbh / sp)
    # attention: replicated = QKV input 2sbh + out-proj dropout mask sbh ; parallel = Q,K 4sbh + V 2sbh +
    # out-proj input 2sbh ; core = softmax 2as²b + mask as²b + dropout output 2as²b
    core = 0.0 if recompute == "selective" else 5.0 * a * s * s * b / t
    attention = (2.0 * sbh + MASK_BYTES * sbh) / sp + 8.0 * sbh / t + core
    # MLP: replicated = fc1 input 2sbh + dropout mask sbh ; parallel = GeLU input 8sbh + fc2 input 8sbh
    mlp = (2.0 * sbh + MASK_BYTES * sbh) / sp + 16.0 * sbh / t
    # two layer norms, input 2sbh each, replicated across TP unless SP
    layernorm = 4.0 * sbh / sp
    return ActivationTerms(attention, mlp, layernorm, attention + mlp + layernorm)


def activation_bytes_eq1(seq: int, batch: int, hidden: int, heads: int) -> float:
    """Paper eq. (1), no parallelism: sbh·(34 + 5as/h)."""
    return seq * batch * hidden * (34 + attention_score_ratio(heads, seq, hidden))


def activation_bytes_eq2(seq: int, batch: int, hidden: int, heads: int, tp: int) -> float:
    """Paper eq. (2), t-way tensor parallelism: sbh·(10 + 24/t + 5as/(ht))."""
    return seq * batch * hidden * (10 + 24 / tp + attention_score_ratio(heads, seq, hidden) / tp)


def activation_bytes_eq4(seq: int, batch: int, hidden: int, heads: int, tp: int) -> float:
    """Paper eq. (4), tensor + sequence parallelism: (sbh/t)·(34 + 5as/h)."""
    return seq * batch * hidden / tp * (34 + attention_score_ratio(heads, seq, hidden))


def selective_recompute_saving(heads: int, seq: int, hidden: int) -> float:
    """Fraction of activation memory removed by selective recompute: (5as/h) / (34 + 5as/h).

    GPT-3 (5as/h = 80): 80/114 = 0.70 — the paper's "70 %"; MT-NLG 530B (a=128, h=20480): 64/98 = 0.65.
    """
    r = attention_score_ratio(heads, seq, hidden)
    return r / (34 + r)


def activation_bytes_model(
    layers: int,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """All L layers on one rank (no pipeline parallelism); embeddings / logits are left out, as in eq. (1)."""
    if layers < 1:
        raise ValueError(f"layers={layers} must be >= 1")
    per = activation_bytes_per_layer(seq, batch, hidden, heads, tp, sequence_parallel, recompute)
    return layers * per.total
