"""The attention kernel of an inspected step: HF's eager or sdpa implementation, or torch_xla's Pallas flash kernel.

Design note
-----------
``eager`` (the default) is HF's own ``eager_attention_forward``: the ``[b, heads, s, s]`` scores exist in the
program, as the planner's no-flash prediction assumes. ``sdpa`` is HF's ``sdpa_attention_forward``:
``torch.nn.functional.scaled_dot_product_attention``, which torch_xla 2.9 lowers to the same matmul-softmax-matmul
(its scores exist too; the mask is HF's boolean one). ``flash`` registers an attention function with
``transformers.AttentionInterface`` that calls ``torch_xla.experimental.custom_kernel.flash_attention`` (causal,
HF's scaling, grouped key / value heads repeated to the query heads) — the Pallas kernel notebook 08b compiles
compile-only: traced for the TPU inside ``memory.pallas_tpu.pallas_for_tpu_compile`` (the forward and the
backward's dq / dkv kernels), inserted as ``tpu_custom_call``\\ s, each wrapped by torch_xla in a manual-sharding
region split like the activations (batch over the batch axes, heads over the tensor axis). No ``[s, s]`` array is
formed. HF builds no mask for a registered kernel (it is causal by construction).

The kernel implements causal softmax attention and nothing else: :func:`flash_refusal` names what a family adds
(a sliding window, logit soft-capping, attention sinks, a value head of another width) and inspect refuses flash
for it before tracing.
"""

from __future__ import annotations

from typing import Any

ATTENTION = ("eager", "sdpa", "flash")
FLASH_NAME = "shardlab_flash"


def flash_refusal(config: Any, windows: list[int | None]) -> str | None:
    """Why torch_xla's flash kernel cannot compute this model's attention, or None."""
    t = config.model_type
    if any(w is not None for w in windows):
        return f"{t} uses a sliding window of {next(w for w in windows if w)} tokens, which the kernel does not mask"
    for field in ("attn_logit_softcapping",):
        if getattr(config, field, None):
            return f"{t} soft-caps its attention logits ({field}={getattr(config, field)}), which the kernel does not"
    if t == "gpt_oss":
        return "gpt_oss adds learned attention sinks to the softmax, which the kernel does not"
    v, qk = getattr(config, "v_head_dim", None), getattr(config, "qk_head_dim", None)
    if v is not None and qk is not None and v != qk:
        return f"{t}'s value heads ({v}) are narrower than its query / key heads ({qk}); the kernel needs one width"
    return None


LANES = 128  # measured: seq=64 fails in the kernel's trace ("sub got incompatible shapes (64, 64), (64, 0)")
FLASH_BLOCKS = (256, 512, 1024)  # torch_xla 2.9's default block sizes, each min(block, seq): dkv 512, dq 1024 / 256


def flash_seq_refusal(seq: int) -> str | None:
    """The kernel tiles the sequence by its blocks (each ``min(block, seq)``), which must divide it and each other
    (measured: seq=384 fails in the kernel with "block_k=384 should be divisible by block_k_dq=256")."""
    blocks = [min(b, seq) for b in FLASH_BLOCKS]
    if seq % LANES or any(seq % b for b in blocks) or blocks[1] % blocks[0]:
        return (f"seq={seq} is not tiled by the kernel's blocks min(b, seq) for b in {FLASH_BLOCKS} (torch_xla's "
                f"defaults) and its {LANES} lanes: use 128, 256, 512 or a multiple of 1024")
    return None


def register_flash(mesh: Any, batch: Any, tensor: str | None) -> str:
    """Register (again) the flash attention function for this mesh; returns its ``attn_implementation`` name."""
    import torch
    from torch_xla.experimental.custom_kernel import flash_attention
    from transformers import AttentionInterface

    spec = (batch, tensor, None, None)  # [b, heads, s, d]: batch over the batch axes, heads over tensor

    def flash(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
              scaling: float | None = None, dropout: float = 0.0, **_: Any) -> tuple[torch.Tensor, None]:
        b, heads, s, d = query.shape  # [b, a, s, hd]
        rep = heads // key.shape[1]
        if rep > 1:  # [b, kv, s, hd] -> [b, a, s, hd], as HF's repeat_kv
            key = key[:, :, None].expand(b, key.shape[1], rep, s, d).reshape(b, heads, s, d)
            value = value[:, :, None].expand(b, value.shape[1], rep, s, d).reshape(b, heads, s, d)
        out = flash_attention(query, key, value, causal=True, sm_scale=scaling if scaling is not None else d ** -0.5,
                              partition_spec=spec, mesh=mesh)  # [b, a, s, hd]
        return out.transpose(1, 2).contiguous(), None  # [b, s, a, hd], as HF's kernels return it

    AttentionInterface.register(FLASH_NAME, flash)
    return FLASH_NAME
