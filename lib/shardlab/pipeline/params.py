"""Notebook 09's parameters: the pipeline (stages, microbatches, virtual stages) and the model it splits.

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``.

One parameter set drives every section: the schedules and their formulas (p = ``stages``, m = ``microbatches``,
v = ``virtual``), the automatic split and the per-stage programs on a small language model with heavy ends
(``vocab`` large next to ``hidden``), and the SPMD pipeline the compilers see, whose stage hands over the same
[batch / m · seq, hidden] activation as the language model's cut.  ``stages`` may exceed ``num_devices``: the
formulas and the ledger need no devices, the CPU compiler view is then skipped with a note, and the TPU view
compiles for a ``stages``-chip slice in a helper process.

Example::

    >>> PipelineParams(microbatches=6).validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: microbatches=6 is not divisible by stages=4 (our interleaved order, Megatron-LM's, sends ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import NotebookParams, boolean, divisible, positive_int


@dataclass(frozen=True)
class PipelineParams(NotebookParams):
    """Notebook 09 (see the module note)."""

    NOTEBOOK: ClassVar[str] = "09_pipeline"

    stages: int = 4  # p: pipeline stages, the devices of the `stage` mesh axis and the ranks of the ledger
    microbatches: int = 8  # m: microbatches per step (a multiple of stages: Megatron-LM's interleaved rule)
    virtual: int = 2  # v: model chunks per device in the interleaved schedule (at least 2)
    batch: int = 8  # sequences per step; one microbatch holds batch / microbatches of them
    seq: int = 16  # tokens per sequence
    hidden: int = 64  # h: the activation every cut hands over is [batch / m, seq, hidden]
    heads: int = 4
    ffn: int = 256  # MLP width of each transformer block
    layers: int = 8  # transformer blocks, at least stages * virtual (a block's worth for every chunk)
    vocab: int = 4096  # large next to hidden: the embedding and the LM head make the model's ends heavy
    fsdp: bool = True  # also compile the SPMD pipeline with its weights sharded over the second mesh axis
    run_gloo: bool = False  # also run the pipeline in `stages` real processes (gloo): ours and PyTorch's (slow)

    def checks(self) -> None:
        for name in ("stages", "microbatches", "virtual", "batch", "seq", "hidden", "heads", "ffn", "layers",
                     "vocab"):
            positive_int(name, getattr(self, name))
        boolean("fsdp", self.fsdp)
        boolean("run_gloo", self.run_gloo)
        if self.stages < 2:
            raise ValueError(f"stages={self.stages}: a pipeline of one stage sends nothing (choose stages >= 2)")
        if self.virtual < 2:
            raise ValueError(f"virtual={self.virtual}: the interleaved schedule needs v >= 2 chunks per device "
                             "(v = 1 is plain 1F1B)")
        divisible("microbatches", self.microbatches, "stages", self.stages,
                  "our interleaved order, Megatron-LM's, sends microbatches round the stages in groups of p; "
                  "PyTorch's ScheduleInterleaved1F1B runs more, see the explorer")
        divisible("batch", self.batch, "microbatches", self.microbatches, "every microbatch holds batch / m sequences")
        divisible("hidden", self.hidden, "heads", self.heads, "each head has hidden / heads dimensions")
        if self.layers < self.stages * self.virtual:
            raise ValueError(f"layers={self.layers} is fewer than stages * virtual = {self.stages * self.virtual} "
                             "(every model chunk of the interleaved schedule gets at least one block's worth)")

    @property
    def rows(self) -> int:
        """Rows of one microbatch's activation as the SPMD pipeline holds it: (batch / m) · seq."""
        return self.batch // self.microbatches * self.seq
