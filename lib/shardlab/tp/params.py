"""Notebooks 02-04's parameters: a tensor-parallel degree and activation sizes (light: no torch, no torch_xla).

``TensorParallelParams`` is shared; ``MlpParams`` (02), ``AttentionParams`` (03) and ``VocabParams`` (04) add
their own sizes and rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import DTYPES, NotebookParams, divisible


@dataclass(frozen=True)
class TensorParallelParams(NotebookParams):
    """Shared by 02-04: a tensor-parallel degree and activation sizes."""

    POSITIVE = ("tp", "batch", "seq", "hidden")
    CHOICES = {"dtype": DTYPES}

    tp: int = 4  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
    batch: int = 2
    seq: int = 8
    hidden: int = 64
    dtype: str = "float32"  # "float32" or "bfloat16"


@dataclass(frozen=True)
class MlpParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "02_megatron_mlp"
    POSITIVE = ("ffn",)
    FLAGS = ("run_gloo",)

    ffn: int = 256  # MLP inner size (4 * hidden in GPT)
    run_gloo: bool = True  # also run the per-rank code in tp real processes (torch.distributed, gloo)

    def checks(self) -> None:
        divisible("ffn", self.ffn, "tp", self.tp, "ParallelMLP splits the MLP's inner dimension")


@dataclass(frozen=True)
class AttentionParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "03_megatron_attention"
    POSITIVE = ("ffn", "heads")

    ffn: int = 256  # MLP inner size of the transformer-layer section (attention + MLP)
    heads: int = 4  # head dim hidden / heads = 16 differs from seq = 8, so the [s, s] score arrays are countable

    def checks(self) -> None:
        divisible("hidden", self.hidden, "heads", self.heads, "each head has hidden / heads dimensions")
        divisible("heads", self.heads, "tp", self.tp, "whole heads per rank")
        divisible("ffn", self.ffn, "tp", self.tp, "the layer's MLP is split like notebook 02's")


@dataclass(frozen=True)
class VocabParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "04_vocab_parallel_embedding_ce"
    POSITIVE = ("vocab",)

    tp: int = 8
    batch: int = 1
    vocab: int = 50257  # GPT-2's vocabulary: NOT divisible by 8 (50257 = 8 * 6282 + 1)
    label_smoothing: float = 0.1  # for the parity section (torch's global definition)
    memory_tokens: int = 0  # b·s of an extra compile-only TPU pair (gathered vs vocab-parallel loss); 0 skips it

    def checks(self) -> None:
        if isinstance(self.memory_tokens, bool) or not isinstance(self.memory_tokens, int) or self.memory_tokens < 0:
            raise ValueError(f"memory_tokens={self.memory_tokens!r} must be an int >= 0 (0 skips the TPU memory "
                             "comparison)")
        if self.tp == 1:
            raise ValueError("tp=1 communicates nothing: choose tp >= 2 to compare vocab-parallel CE with "
                             "gathered logits")
        if self.vocab < self.tp:
            raise ValueError(f"vocab={self.vocab} is smaller than tp={self.tp}: some rank would own no rows")
        if isinstance(self.label_smoothing, bool) or not isinstance(self.label_smoothing, int | float) \
                or not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing!r} is not a number in [0, 1]")
