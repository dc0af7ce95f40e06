"""Activation memory per transformer layer: the paper's GPT block and Llama-style blocks (GQA, SwiGLU, flash).

Design note
-----------
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
section 4) count, for ONE layer on ONE tensor-parallel rank, the tensors the backward pass reads: s sequence,
b micro-batch, h hidden, a heads, t tensor-parallel degree, e bytes per activation element (the paper: 2),
dropout masks 1 byte per element. :func:`block_activation_bytes` writes that accounting out term by term
for any decoder block, so the GPT block of the paper and a Llama block are two settings of one function:

    term                         GPT (paper)            Llama (GQA, SwiGLU, RMSNorm)     divided by
    attention input (norm out)   e·sbh                  e·sbh                             t only with SP
    Q                            e·sbh                  e·sbh                             t
    K and V                      2e·sbh                 2e·sb·kv·hd  (kv KV-heads)        t (kv >= t)
    out-projection input (= O)   e·sbh                  e·sbh                             t
    attention core, no flash     e·as²b softmax         e·as²b softmax                    t
                                 + as²b mask + e·as²b dropout out (dropout only)
    attention core, flash        —                      4·asb  (fp32 log-sum-exp)         t
    dropout mask after out-proj  sbh                    — (no dropout)                    t only with SP
    MLP input (norm out)         e·sbh                  e·sbh                             t only with SP
    MLP inner                    GeLU: 2e·sb·ffn        SwiGLU: 4e·sb·ffn                 t
                                 (GeLU input, fc2 input) (gate, up, silu(gate), gate·up)
    dropout mask after MLP       sbh                    —                                 t only with SP
    two norm inputs              2e·sbh                 2e·sbh                            t only with SP

With e = 2, ffn = 4h, kv = a, GeLU, dropout and no flash the total is the paper's eq. (1) sbh(34 + 5as/h); with
t-way tensor parallelism eq. (2) sbh(10 + 24/t + 5as/(ht)); with sequence parallelism eq. (4)
(sbh/t)(34 + 5as/h) — the tests check all three. Sequence parallelism here is Megatron's: the column-parallel
layer keeps only its s/t slice of the input and all-gathers it again in the backward (``shardlab.tp``), which
is what lets the "t only with SP" rows divide by t. Recompute: "selective" drops the attention core (it is
recomputed in the backward), "full" keeps only the layer input e·sbh (/t with SP).

The Llama column is eager PyTorch on CPU as measured by the tests (``saved_tensors_hooks`` on a bf16 block
with ``scaled_dot_product_attention`` — the flash kernel keeps Q, K, V at their own head counts, O and the
log-sum-exp — and ``F.silu(gate) * up``, which keeps four [b, s, ffn] tensors; a fused SwiGLU kernel keeps
three). RMSNorm's per-token statistic (4·sb bytes per norm, h/2 times smaller than its input) is left out, as
the paper leaves out LayerNorm's.

**What is stored vs what the backward holds.** The table counts the tensors *kept* for the backward. While one
layer's backward runs, attention without a flash kernel also holds the gradients of the softmax output (dP) and
of the scores (dS), [b, a/t, s, s] each, next to the kept softmax P: 3·e·a·s²·b/t bytes of s² buffers at that
moment, 6·a·s²·b/t in 16 bits (Llama has no dropout; the paper's 5·a·s²·b is what a GPT block with dropout *keeps*).
:func:`attention_backward_bytes` is that extra 2·e·a·s²·b/t; a flash kernel works through the scores in tiles
and adds none. Measured with the XLA:TPU compiler (Llama 3 8B, s = 8192, one chip's 32 heads, full recompute):
the largest buffers of the step are three bf16 [32, 8192, 8192] arrays of 4 GiB each, at the recomputed layer's
backward.

Example (GPT-3: a = 96, s = 2048, h = 12288)::

    >>> attention_score_ratio(heads=96, seq=2048, hidden=12288)   # 5as/h
    80.0
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas import expert as fexpert
from shardlab.formulas.common import RECOMPUTE_POLICIES, check_recompute

__all__ = ["ACT_BYTES", "MASK_BYTES", "RECOMPUTE_POLICIES", "ActivationTerms",
           "attention_backward_bytes", "attention_score_ratio", "block_activation_bytes",
           "llama_activation_bytes_per_layer", "mlp_activation_bytes", "moe_mlp_activation_bytes",
           "selective_recompute_saving"]

ACT_BYTES = 2  # 16-bit activations (the paper's assumption)
MASK_BYTES = 1  # dropout masks stored as bytes (the paper's assumption)
LSE_BYTES = 4  # flash attention keeps one fp32 log-sum-exp per (token, head)


class ActivationTerms(NamedTuple):
    """Bytes of activations stored for backward, one layer, one tensor-parallel rank."""

    attention: float  # attention block, incl. the core (0 when recomputed)
    attention_core: float  # the part selective recompute drops: softmax (+ dropout) or flash's log-sum-exp
    mlp: float  # MLP block
    norms: float  # the two norm inputs
    total: float  # attention + mlp + norms


def attention_score_ratio(heads: int, seq: int, hidden: int) -> float:
    """5as/h: how much the attention-score term weighs against the linear terms (80 for GPT-3)."""
    return 5.0 * heads * seq / hidden


def selective_recompute_saving(heads: int, seq: int, hidden: int) -> float:
    """Fraction of the paper's activation memory removed by selective recompute: (5as/h) / (34 + 5as/h).

    GPT-3 (5as/h = 80): 80/114 = 0.70 — the paper's "70 %"; MT-NLG 530B (a=128, h=20480): 64/98 = 0.65.
    This is the GPT-block accounting (softmax + dropout kept); with flash attention the scores are never
    stored and selective recompute saves almost nothing (see :func:`block_activation_bytes`).
    """
    r = attention_score_ratio(heads, seq, hidden)
    return r / (34 + r)


def _check(**sizes: int) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


def block_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    ffn: int,
    heads: int,
    kv_heads: int | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    gated_mlp: bool = False,
    flash_attention: bool = False,
    dropout: bool = True,
    act_bytes: int = ACT_BYTES,
) -> ActivationTerms:
    """Stored activation bytes of one decoder layer on one tensor-parallel rank (table in the module note).

    kv_heads defaults to heads (no GQA). With tp > kv_heads each rank keeps one (replicated) KV head.
    """
    kv = heads if kv_heads is None else kv_heads
    _check(seq=seq, batch=batch, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv, tp=tp, act_bytes=act_bytes)
    check_recompute(recompute)
    s, b, h, a, t, e = seq, batch, hidden, heads, tp, act_bytes
    for name, v in (("heads", a), ("hidden", h), ("ffn", ffn)):
        if v % t:
            raise ValueError(f"{name}={v} is not divisible by tp={t}")
    if h % a:
        raise ValueError(f"hidden={h} is not divisible by heads={a}")
    if a % kv:
        raise ValueError(f"heads={a} is not divisible by kv_heads={kv}")
    if kv % t and t % kv:
        raise ValueError(f"kv_heads={kv} and tp={t}: one must divide the other")
    if sequence_parallel and s % t:
        raise ValueError(f"seq={s} is not divisible by tp={t} (sequence parallelism splits the sequence)")
    sbh = s * b * h
    sp = t if sequence_parallel else 1  # divisor of the terms plain TP leaves replicated
    if recompute == "full":  # only the layer input is kept (sequence-sharded with SP)
        return ActivationTerms(0.0, 0.0, 0.0, 0.0, e * sbh / sp)
    hd = h // a
    kv_local = max(kv // t, 1)  # KV heads one rank keeps: kv/t, or one replicated head when t > kv
    mask = MASK_BYTES * sbh if dropout else 0.0
    if flash_attention:
        core = LSE_BYTES * a * s * b / t
    else:
        core = (e + (MASK_BYTES + e if dropout else 0)) * a * s * s * b / t  # softmax (+ mask, dropout output)
    core = 0.0 if recompute == "selective" else core
    qkv = e * sbh / t + 2 * e * s * b * kv_local * hd  # Q [b,s,a/t,hd]; K, V [b,s,kv_local,hd]
    attention = (e * sbh + mask) / sp + qkv + e * sbh / t + core  # input, Q K V, out-proj input (O), core
    mlp = mlp_activation_bytes(s, b, h, ffn, t, sequence_parallel, gated_mlp, dropout, e)
    norms = 2 * e * sbh / sp
    return ActivationTerms(attention, core, mlp, norms, attention + mlp + norms)


def attention_backward_bytes(seq: int, batch: int, heads: int, tp: int = 1, flash_attention: bool = False,
                             act_bytes: int = ACT_BYTES) -> float:
    """Bytes one layer's attention backward holds beyond its kept activations: dP and dS, [b, a/t, s, s] each,
    without a flash kernel (e·a·s²·b/t each); none with one (it tiles the scores).

    With the kept softmax P that is 3·e·a·s²·b/t = 6·a·s²·b/t bytes of s² buffers in 16 bits. Llama 3 8B, s = 8192,
    b = 1, t = 1: two bf16 [32, 8192, 8192] arrays of 4 GiB each:
    >>> attention_backward_bytes(8192, 1, 32) / 2**30
    8.0
    """
    _check(seq=seq, batch=batch, heads=heads, tp=tp, act_bytes=act_bytes)
    if heads % tp:
        raise ValueError(f"heads={heads} is not divisible by tp={tp}")
    return 0.0 if flash_attention else 2.0 * act_bytes * heads * seq * seq * batch / tp


def mlp_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    ffn: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    gated_mlp: bool = False,
    dropout: bool = False,
    act_bytes: int = ACT_BYTES,
) -> float:
    """The MLP rows of the table: input e·sbh (/t with SP) + inner tensors (/t) (+ dropout mask sbh).

    ``shardlab.tp.ParallelMLP`` (GeLU, no dropout) stores exactly this — its input (the s/t shard with
    sequence parallelism, which re-gathers it in the backward), the GeLU input and the fc2 input.
    >>> mlp_activation_bytes(8, 2, 16, 64, tp=4, sequence_parallel=True, act_bytes=4)  # 4·(256/4 + 2·1024/4)
    2304.0
    """
    _check(seq=seq, batch=batch, hidden=hidden, ffn=ffn, tp=tp, act_bytes=act_bytes)
    if ffn % tp:
        raise ValueError(f"ffn={ffn} is not divisible by tp={tp}")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tp={tp} (sequence parallelism splits the sequence)")
    s, b, e = seq, batch, act_bytes
    sbh = s * b * hidden
    mask = MASK_BYTES * sbh if dropout else 0.0
    inner = (4 if gated_mlp else 2) * e * s * b * ffn / tp  # SwiGLU: gate, up, silu(gate), gate·up; GeLU: 2
    return (e * sbh + mask) / (tp if sequence_parallel else 1) + inner


def moe_mlp_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    ffn: int,
    experts: int,
    top_k: int,
    capacity_factor: float,
    tp: int = 1,
    sequence_parallel: bool = False,
    gated_mlp: bool = True,
    act_bytes: int = ACT_BYTES,
) -> float:
    """The MLP rows of the table for a mixture-of-experts layer (GShard / Switch dispatch, one routing group of the
    s·b tokens a device holds): its input e·sbh (/t with SP), the router's fp32 probabilities 4·sb·E, the
    dispatched buffer and the experts' output [E·C, h] (e each: the down projection's and the combine's inputs
    for the backward), and each expert's inner tensors over its C slots (SwiGLU 4, GeLU 2, of width ffn / t).
    C = ceil(cf·k·sb/E) (``formulas.expert.capacity``): the slots are kept whether a token fills them or not.

    >>> moe_mlp_activation_bytes(8, 1, 16, 32, experts=4, top_k=2, capacity_factor=1.0, act_bytes=2)  # C = 4
    5504.0

    (input 2·8·16 = 256, router 4·8·4 = 128, two [16, 16] buffers 1024, SwiGLU 4·2·16·32 = 4096.)
    """
    _check(seq=seq, batch=batch, hidden=hidden, ffn=ffn, experts=experts, top_k=top_k, tp=tp, act_bytes=act_bytes)
    if ffn % tp:
        raise ValueError(f"ffn={ffn} is not divisible by tp={tp}")
    tokens = seq * batch
    slots = experts * fexpert.capacity(tokens, experts, top_k, capacity_factor)  # E·C rows
    e = act_bytes
    inner = (4 if gated_mlp else 2) * e * slots * ffn / tp
    return e * tokens * hidden / (tp if sequence_parallel else 1) + 4 * tokens * experts + 2 * e * slots * hidden \
        + inner


def llama_activation_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    ffn: int,
    heads: int,
    kv_heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = True,
) -> ActivationTerms:
    """A Llama block (GQA, SwiGLU, RMSNorm, no dropout, 16-bit), flash attention by default.

    Llama 3 8B, s = 8192, b = 1, no TP, flash: 2·sbh·(1 + 1 + 2·kv/a + 1 + 1 + 2) + 8·sb·ffn + 4·a·s·b bytes
    (attention input, Q, K+V, O, MLP input, two norms; SwiGLU's four [s, ffn]; the log-sum-exp):
    >>> llama_activation_bytes_per_layer(8192, 1, 4096, 14336, 32, 8).total / 2**20   # MiB
    1313.0
    """
    return block_activation_bytes(seq, batch, hidden, ffn, heads, kv_heads, tp, sequence_parallel, recompute,
                                  gated_mlp=True, flash_attention=flash_attention, dropout=False)
