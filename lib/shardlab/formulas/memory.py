"""Parameter counts, vocabulary padding and per-device model-state memory on a (data, fsdp, tensor) mesh.

Design note
-----------
This module *composes* the ZeRO algebra of `formulas.zero` and the flat-parameter padding of
`formulas.zero.padded_numel`; it adds what the planner needs on top:

* `param_count` — exact parameter count of a decoder-only transformer (GQA, SwiGLU or GeLU MLP, norms),
  split by where it lives (embedding, one layer, final norm, LM head).
* `padded_vocab` — Megatron-LM's `_vocab_size_with_padding`: pad V up to a multiple of
  make_vocab_size_divisible_by × tp, so every tensor-parallel rank gets an equal, aligned vocabulary slice
  (GPT-2's 50257 with 128 × 8 = 1024 -> 51200).
* `model_state_bytes` — per-device bytes of parameters, gradients and optimizer state. Tensor parallelism
  divides every weight by t (Megatron shards all large matrices); ZeRO stage `stage` then shards over the
  fsdp axis (Ψ_local = Ψ/t, N = fsdp) via `zero.zero_memory`; the data axis replicates. When parameters
  are flat-sharded (stage 3, one flat unit per layer) each unit is padded to fsdp·ceil(n/fsdp) elements
  (`zero.padded_numel`); the padding is reported as its own category.

Bytes per parameter default to ZeRO's mixed-precision Adam: 2 (bf16 param) + 2 (bf16 grad) + K = 12
(fp32 master, momentum, variance).
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas.common import ceil_div
from shardlab.formulas.zero import ZERO_K, padded_numel, zero_memory

MEGATRON_VOCAB_DIVISIBLE_BY = 128  # Megatron-LM default of --make-vocab-size-divisible-by


class ParamCounts(NamedTuple):
    embedding: int  # V·h
    per_layer: int  # one decoder layer: attention + MLP + norms
    layers: int  # L · per_layer
    final_norm: int  # h
    lm_head: int  # V·h (0 when tied to the embedding)
    total: int
    expert_per_layer: int = 0  # of per_layer: the experts' weights (E SwiGLU / GeLU MLPs) of a mixture-of-experts layer

    @property
    def dense_per_layer(self) -> int:
        """One layer's parameters outside the experts (attention, norms, a dense MLP or the router)."""
        return self.per_layer - self.expert_per_layer


def param_count(
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    gated_mlp: bool = True,
    tied_embeddings: bool = False,
    norm_params_per_layer: int | None = None,
    experts: int = 0,
) -> ParamCounts:
    """Exact parameter count of a bias-free decoder (Llama layout by default).

    Per layer: Q [h, h], K and V [h, kv·hd] each, O [h, h], MLP 3·[h, ffn] (SwiGLU) or 2·[h, ffn] (GeLU),
    and two RMSNorm weights (2h). Llama 3 8B (L=32, h=4096, ffn=14336, a=32, kv=8, V=128256) -> 8_030_261_248.
    ``experts`` > 0: a mixture-of-experts layer (Mixtral, GShard) — ``experts`` MLPs of width ``ffn`` in place of
    the one MLP, and a router [h, E]: Mixtral 8x7B (L 32, h 4096, ffn 14336, 32 heads, 8 KV heads, V 32000, 8
    experts) -> 46_702_792_704.
    """
    for name, v in (("layers", layers), ("hidden", hidden), ("ffn", ffn), ("heads", heads),
                    ("kv_heads", kv_heads), ("vocab", vocab)):
        if v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads}")
    hd = hidden // heads
    norms = 2 * hidden if norm_params_per_layer is None else norm_params_per_layer
    attn = 2 * hidden * hidden + 2 * hidden * kv_heads * hd  # Q, O: [h, h]; K, V: [h, kv·hd]
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
        raise ValueError(f"experts={experts!r} must be an int >= 0 (0: a dense MLP)")
    mlp = (3 if gated_mlp else 2) * hidden * ffn
    expert = experts * mlp  # E expert MLPs
    router = hidden * experts  # [h, E]
    per_layer = attn + norms + (expert + router if experts else mlp)
    emb = vocab * hidden
    head = 0 if tied_embeddings else vocab * hidden
    total = emb + layers * per_layer + hidden + head
    return ParamCounts(emb, per_layer, layers * per_layer, hidden, head, total, expert)


def padded_vocab(vocab: int, tp: int = 1, divisible_by: int = MEGATRON_VOCAB_DIVISIBLE_BY) -> int:
    """Megatron's rule: round V up to a multiple of divisible_by × tp.

    >>> padded_vocab(50257, tp=8)    # multiple of 128 · 8 = 1024
    51200
    """
    if vocab < 1 or tp < 1 or divisible_by < 1:
        raise ValueError(f"vocab={vocab}, tp={tp}, divisible_by={divisible_by} must all be >= 1")
    multiple = divisible_by * tp
    return ceil_div(vocab, multiple) * multiple


class ModelState(NamedTuple):
    """Persistent per-device model-state bytes."""

    params: float
    grads: float
    optimizer: float
    padding: float  # flat-parameter padding (all three kinds of state), 0 unless stage 3 flat units
    total: float


def model_state_bytes(
    num_params: int,
    tensor: int = 1,
    fsdp: int = 1,
    stage: int = 3,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    k: float = ZERO_K,
    flat_units: list[int] | None = None,
) -> ModelState:
    """Per-device bytes of parameters, gradients and optimizer state.

    num_params: Ψ of the whole model. tensor: TP degree t (Ψ_local = Ψ/t). fsdp: ZeRO degree N. stage: ZeRO
    stage over the fsdp axis (0 = replicate). flat_units: numel of each flat unit *before* TP division
    (e.g. [per_layer] * L + [embedding, lm_head]); with stage 3 each is padded to a multiple of fsdp.

    ZeRO Fig. 1 check: model_state_bytes(7.5e9, fsdp=64, stage=s).total -> 120 / 31.4 / 16.6 / 1.9 GB.
    """
    if tensor < 1 or fsdp < 1:
        raise ValueError(f"tensor={tensor}, fsdp={fsdp} must be >= 1")
    z = zero_memory(num_params / tensor, fsdp, stage, k=k, param_bytes=param_bytes, grad_bytes=grad_bytes)
    pad = 0.0
    if flat_units and stage == 3 and fsdp > 1:
        pad_elems = 0
        for n in flat_units:
            local = ceil_div(int(n), tensor)
            pad_elems += padded_numel(local, fsdp) - local
        pad = pad_elems / fsdp * (param_bytes + grad_bytes + k)  # per rank: its share of every padded unit
    return ModelState(z.params, z.grads, z.optimizer, pad, z.params + z.grads + z.optimizer + pad)
