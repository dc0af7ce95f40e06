"""Notebook 10's parameters: one attention layer (sizes, mask, layout) split over cp context-parallel ranks.

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``.

One parameter set drives every section: the formulas, the per-rank ring and all-gather programs (``cp`` ranks of a
``SimulatedWorld``), the GSPMD programs both compilers see (mesh (data, context) = (n / cp, cp)) and the causal
balance count. ``cp`` may exceed ``num_devices``: formulas and ledger need no devices, the CPU compiler view is then
skipped with a note, and the TPU view compiles for a ``cp``-chip slice in a helper process. The model's element type
is float32 throughout (XLA:TPU still moves the forward's K/V in bf16: its default matmul precision).

Example::

    >>> ContextParams(seq=100).validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: seq=100 is not divisible by 2·cp = 16 (the zig-zag layout cuts the sequence into 2·cp chunks...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import NotebookParams, boolean, divisible, one_of, positive_int

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class ContextParams(NotebookParams):
    """Notebook 10 (see the module note)."""

    NOTEBOOK: ClassVar[str] = "10_context_parallel"

    cp: int = 8  # context-parallel degree: ranks of the ring, size of the `context` mesh axis
    batch: int = 1  # b
    seq: int = 128  # s: the whole sequence, split into cp chunks (contiguous) or 2·cp chunks (zig-zag)
    heads: int = 8  # hq: query heads
    kv_heads: int = 2  # hkv: key/value heads (grouped-query attention when fewer than heads)
    head_dim: int = 16  # d
    causal: bool = True  # causal mask (a decoder); False: every query sees every key
    layout: str = "zigzag"  # how the ring ranks hold the sequence: "contiguous" or "zigzag" (2·cp chunks)
    ulysses: bool = False  # also DeepSpeed-Ulysses (all-to-alls; with kv_heads = heads when kv_heads < cp)
    run_gloo: bool = False  # also run the per-rank ring in cp real processes (torch.distributed, gloo)

    def checks(self) -> None:
        for name in ("cp", "batch", "seq", "heads", "kv_heads", "head_dim"):
            positive_int(name, getattr(self, name))
        for name in ("causal", "ulysses", "run_gloo"):
            boolean(name, getattr(self, name))
        one_of("layout", self.layout, LAYOUTS)
        if self.cp == 1:
            raise ValueError("cp=1 splits nothing: choose cp >= 2 to see context parallelism move keys and values")
        divisible("heads", self.heads, "kv_heads", self.kv_heads, "grouped-query attention: each key/value head "
                  "serves heads / kv_heads query heads")
        if self.seq % (2 * self.cp):
            raise ValueError(f"seq={self.seq} is not divisible by 2·cp = {2 * self.cp} (the zig-zag layout cuts the "
                             "sequence into 2·cp chunks, and the causal-balance section compares both layouts)")
