"""Compute FLOPs per training step of a decoder-only transformer.

Design note
-----------
Only matrix multiplications are counted (2 FLOPs per multiply-add); backward costs twice the forward.
For the GPT block of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", arXiv:2104.04473, eq. 2 / appendix) and Korthikanti et al. 2022 (arXiv:2205.05198,
section 6), with batch B, sequence s, L layers, hidden h, vocabulary V:

    model FLOPs        72·B·L·s·h²·(1 + s/(6h) + V/(12hL))        forward + backward, no recompute
    full recompute     96·B·L·s·h²·(1 + s/(6h) + V/(16hL))        the layers' forward runs twice
    selective, paper   72·B·L·s·h²·(1 + s/(3h) + V/(12hL))        Korthikanti et al.'s closed form
    selective, count   72·B·L·s·h²·(1 + 2s/(9h) + V/(12hL))       one more forward of QKᵀ and AV

Selective recompute — where the two lines differ. The attention core's matmuls (QKᵀ and AV) cost 4·B·s²·h per
layer in the forward and 12·B·s²·h forward + backward; that is the s/(6h) term (72·B·s·h²·s/(6h) = 12·B·s²·h).
Re-running the core's forward in the backward adds 4·B·s²·h per layer: s/(6h) -> s/(6h) + s/(18h) = 2s/(9h)
(:func:`transformer_flops`, term by term). The paper's expression doubles s/(6h) instead, i.e. adds another
12·B·s²·h per layer — a full forward+backward of the core. Its published overheads follow from it exactly:
GPT-3 175B (s 2048, h 12288, L 96, V 51200) 2.7 %, MT-NLG 530B (h 20480, L 105) 1.6 %; the forward-only count
gives a third of each, 0.9 % and 0.5 %. :func:`selective_recompute_overhead` returns either; the planner's
hardware FLOPs use the forward-only count (what the hardware executes when the core's forward runs once more).

`transformer_flops` counts the same matmuls for any block shape (GQA: kv_heads < heads; SwiGLU: three ffn
matrices) and reduces exactly to the 72·B·L·s·h² line for a GPT block (ffn = 4h, kv_heads = heads, two MLP
matrices) — the tests use that identity. MFU uses *model* FLOPs (recompute is not useful work), HFU would use
the recompute lines.

Per layer, forward, per token (GPT block):  QKV 2·3h² + out-proj 2·h² + MLP 2·8h² = 24h²;
attention scores QK^T and AV: 2·2·s·h;  logits once per token: 2·h·V.

Example: Narayanan et al. estimate GPT-3 (175B, 300B tokens) on 1024 A100s at 140 TFLOP/s as ~34 days
using 8·T·P FLOPs (training with full recompute): see `training_days`.

    >>> round(100 * selective_recompute_overhead(2048, 12288, 96, 51200, count="paper"), 1)   # GPT-3, %
    2.7
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas.common import check_recompute

SELECTIVE_COUNTS = ("forward_only", "paper")


def gpt_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """72·B·L·s·h²·(1 + s/(6h) + V/(12hL)) — Narayanan et al. 2021 / Korthikanti et al. 2022."""
    B, s, L, h, V = batch, seq, layers, hidden, vocab
    return 72.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def korthikanti_selective_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al.'s FLOPs with selective recompute: 72·B·L·s·h²·(1 + s/(3h) + V/(12hL)).

    Its ratio to :func:`gpt_model_flops` is the paper's published overhead (2.7 % for GPT-3 175B). It counts
    the attention core's matmuls twice over (see the module note); :func:`gpt_hardware_flops` counts one
    more forward.
    """
    B, s, L, h, V = batch, seq, layers, hidden, vocab
    return 72.0 * B * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L))


def gpt_hardware_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: str) -> float:
    """FLOPs the hardware executes, including recomputation ("full" is Narayanan et al.'s 96·B·L·s·h² line;
    "selective" adds one forward of the attention core, 4·B·s²·h per layer: 1 + 2s/(9h))."""
    B, s, L, h, V = batch, seq, layers, hidden, vocab
    check_recompute(recompute)
    if recompute == "none":
        return gpt_model_flops(B, s, L, h, V)
    if recompute == "selective":
        return 72.0 * B * L * s * h * h * (1 + 2 * s / (9 * h) + V / (12 * h * L))
    return 96.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))


def selective_recompute_overhead(seq: int, hidden: int, layers: int, vocab: int, count: str = "paper") -> float:
    """Extra FLOPs of selective recompute as a fraction of model FLOPs (B cancels).

    count="paper": Korthikanti et al.'s closed form (GPT-3 175B: 0.027); count="forward_only": one more
    forward of QKᵀ and AV (GPT-3 175B: 0.009).
    """
    if count not in SELECTIVE_COUNTS:
        raise ValueError(f"count={count!r} is not one of {SELECTIVE_COUNTS}")
    model = gpt_model_flops(1, seq, layers, hidden, vocab)
    extra = (korthikanti_selective_flops(1, seq, layers, hidden, vocab) if count == "paper"
             else gpt_hardware_flops(1, seq, layers, hidden, vocab, "selective"))
    return extra / model - 1.0


class FlopTerms(NamedTuple):
    """FLOPs of one training step (all chips together)."""

    matmul_params: float  # weight matmuls of all layers (fwd + bwd)
    attention: float  # QK^T and AV (fwd + bwd)
    logits: float  # output projection to the vocabulary (fwd + bwd)
    recompute: float  # extra forward work from recomputation (0 for "none")
    model: float  # matmul_params + attention + logits (MFU numerator)
    hardware: float  # model + recompute (HFU numerator)


def transformer_flops(
    batch: int,
    seq: int,
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    gated_mlp: bool = True,
    recompute: str = "none",
) -> FlopTerms:
    """Matmul FLOPs of one step for a decoder-only transformer of any shape.

    gated_mlp: SwiGLU (3 matrices h×ffn, Llama) if True, GeLU MLP (2 matrices, GPT) if False.
    Training = forward + backward = 3 × forward. Causal masking is not subtracted (as in the paper).
    """
    check_recompute(recompute)
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads}")
    tokens = batch * seq
    head_dim = hidden // heads
    # weights per layer: Q [h,h], K,V [h, kv·hd] each, O [h,h], MLP (2 or 3)·[h, ffn]
    w_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + (3 if gated_mlp else 2) * hidden * ffn
    fwd_params = 2.0 * tokens * w_layer * layers
    # scores: Q[s,hd]·K^T[hd,s] per head and probs[s,s]·V[s,hd]: 2 matmuls × 2·s·s·hd·heads per sequence
    fwd_attn = 2.0 * 2.0 * batch * seq * seq * hidden * layers
    fwd_logits = 2.0 * tokens * hidden * vocab  # [tokens, h] @ [h, V]
    matmul_params, attention, logits = 3 * fwd_params, 3 * fwd_attn, 3 * fwd_logits
    model = matmul_params + attention + logits
    if recompute == "none":
        extra = 0.0
    elif recompute == "selective":
        extra = fwd_attn  # attention core recomputed in backward
    else:
        extra = fwd_params + fwd_attn  # whole layer forward again (logits are not inside a layer)
    return FlopTerms(matmul_params, attention, logits, extra, model, model + extra)


def training_days(total_flops: float, chips: int, flops_per_chip_per_s: float) -> float:
    """Wall-clock days for `total_flops` at a sustained per-chip rate."""
    return total_flops / (chips * flops_per_chip_per_s) / 86400.0


def mfu(model_flops_per_step: float, step_time_s: float, chips: int, peak_flops_per_chip: float) -> float:
    """Model FLOPs utilisation: useful FLOPs per second over the peak of all chips."""
    if step_time_s <= 0:
        raise ValueError(f"step_time_s={step_time_s} must be > 0")
    return model_flops_per_step / (step_time_s * chips * peak_flops_per_chip)


def linear_stack_step_flops(batch: int, hidden: int, layers: int, chips: int = 1) -> int:
    """Matmul FLOPs per chip of one training step of ``layers`` square linear layers ``h <- tanh(h @ W)`` on a
    batch split over ``chips`` (data parallel or FSDP: every chip multiplies its batch shard by whole weights).

    Per layer, forward ``2·(B/n)·h²``; backward ``dW = hᵀ·dy`` another ``2·(B/n)·h²`` and ``dx = dy·Wᵀ`` another,
    except for the first layer, whose input needs no gradient: ``2·(B/n)·h²·(3L − 1)``.

    >>> linear_stack_step_flops(batch=8192, hidden=2048, layers=4, chips=8)
    94489280512
    """
    if batch % chips:
        raise ValueError(f"batch={batch} must be divisible by chips={chips}")
    return 2 * (batch // chips) * hidden * hidden * (3 * layers - 1)
