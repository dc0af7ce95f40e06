"""Notebook 08b's parameters: one attention core (FlashAttention vs plain softmax on the TPU compiler) and one
training step (ROAM's operator order, the weight-update schedule).

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``.

One parameter set drives every section. The **attention core** — ``seq``, ``heads``, ``kv_heads``, ``head_dim``,
one sequence per chip, bf16, forward + backward — is compiled for a slice of ``tensor`` chips with the heads split
over them (``tensor`` may exceed ``num_devices``: the TPU view then compiles in a helper process). The **step** —
``model``, ``layers``, ``hidden``, ``ffn``, ``step_heads``, ``step_seq``, ``step_batch``, float32, Adam — is traced as
an operator DAG, ordered by ROAM, and compiled by both XLA compilers (replicated: the per-chip program is the whole
step). Full sizes (Llama 3 8B attention up to 32k tokens, a GPT-2 small block) are other parameter objects:
``dataclasses.replace(p, **LLAMA3_8B_ATTENTION)``, ``replace(p, **GPT2_SMALL_BLOCK)``.

Example::

    >>> MemoryParams(seq=1536).validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: seq=1536 is not divisible by 1024 (the flash kernel tiles the sequence ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import GENERATIONS, NotebookParams, boolean, divisible, one_of, positive_int

MODELS = ("mlp", "gpt2")
FLASH_BLOCK = 1024  # torch_xla's flash kernel tiles the sequence by its dq block, min(1024, s) (measured: s = 179712
# fails "q_seq_len=179712 should be divisible by block_q_dq=1024")
LANES = 128  # a TPU vreg's lanes: the flash kernel's head dimension is tiled by it

# Named sizes (plain constants, applied with dataclasses.replace): Llama 3 8B's attention on one chip, and one
# GPT-2 small block (Radford et al. 2019: h 768, 12 heads, ffn 3072) at 1024 tokens.
LLAMA3_8B_ATTENTION = dict(heads=32, kv_heads=8, head_dim=128, tensor=1)
GPT2_SMALL_BLOCK = dict(model="gpt2", layers=1, hidden=768, step_heads=12, ffn=3072, step_seq=1024, step_batch=1)


@dataclass(frozen=True)
class MemoryParams(NotebookParams):
    """Notebook 08b (see the module note)."""

    NOTEBOOK: ClassVar[str] = "08b_memory"

    generation: str = "v5e"  # TPU generation compiled for (compile-only): "v5e" or "v6e"
    seq: int = 2048  # s: tokens of the attention core's one sequence (a multiple of 1024: the flash kernel's tile)
    heads: int = 4  # a: query heads of the attention core
    kv_heads: int = 2  # key/value heads (GQA), expanded to `heads` before the kernel
    head_dim: int = 128  # hd: at most 128, or a multiple of 128 (the TPU's lanes)
    tensor: int = 1  # t: chips the heads are split over; the TPU view compiles a t-chip slice
    softmax_fp32: bool = True  # plain attention's softmax in fp32 (notebook 07's step, HF Llama); False: in bf16
    model: str = "mlp"  # the training step: "mlp" (Linear, GeLU, Linear) or "gpt2" (pre-LN attention + MLP blocks)
    layers: int = 2  # blocks of the step
    hidden: int = 16  # h: width of the step's activations [step_batch, step_seq, h]
    ffn: int = 64  # MLP inner size
    step_heads: int = 2  # attention heads of a gpt2 block
    step_seq: int = 1  # tokens per sequence of the step
    step_batch: int = 8  # sequences of the step
    max_ops: int = 20  # ROAM: a part longer than this is cut again where the fewest bytes are live
    min_ops: int = 8  # ROAM: ... but not shorter than this
    unsplit_limit_s: float = 0.5  # time limit of the unsplit integer program (0 skips it)
    full_size: bool = False  # compile Llama 3 8B attention to 32k and a GPT-2 block live (~30 min); False: cached

    def checks(self) -> None:
        one_of("generation", self.generation, GENERATIONS)
        for name in ("seq", "heads", "kv_heads", "head_dim", "tensor", "layers", "hidden", "ffn", "step_heads",
                     "step_seq", "step_batch", "max_ops", "min_ops"):
            positive_int(name, getattr(self, name))
        for name in ("softmax_fp32", "full_size"):
            boolean(name, getattr(self, name))
        one_of("model", self.model, MODELS)
        if self.seq % FLASH_BLOCK:
            raise ValueError(f"seq={self.seq} is not divisible by {FLASH_BLOCK} (the flash kernel tiles the sequence "
                             f"by its {FLASH_BLOCK}-token dq block)")
        if self.head_dim > LANES and self.head_dim % LANES:
            raise ValueError(f"head_dim={self.head_dim} is more than {LANES} and not divisible by {LANES} (the flash "
                             f"kernel repeats its softmax statistics over the head dimension in {LANES}-lane tiles)")
        divisible("heads", self.heads, "kv_heads", self.kv_heads, "grouped-query attention: each key/value head "
                  "serves heads / kv_heads query heads")
        divisible("kv_heads", self.kv_heads, "tensor", self.tensor, "whole key/value heads per chip")
        divisible("heads", self.heads, "tensor", self.tensor, "whole query heads per chip")
        if self.model == "gpt2":
            divisible("hidden", self.hidden, "step_heads", self.step_heads, "each head has hidden / heads dims")
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops={self.min_ops} is more than max_ops={self.max_ops} (ROAM cuts a long part "
                             "every min_ops to max_ops operators)")
        if isinstance(self.unsplit_limit_s, bool) or not isinstance(self.unsplit_limit_s, int | float) \
                or self.unsplit_limit_s < 0:
            raise ValueError(f"unsplit_limit_s={self.unsplit_limit_s!r} must be a number of seconds >= 0 (0 skips "
                             "the unsplit integer program)")
