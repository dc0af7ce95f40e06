"""Notebook 13's parameters: which TPU generation to price, the MLP block and the sizes swept.

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``.

The sweeps compile for a ``chips``-chip slice of ``generation`` compile-only (in a helper process when the kernel has
another device count), so every legal parameter set runs on 1, 4 or 8 CPU devices alike.

Example::

    >>> TimingParams(chips=6).validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: chips=6 must be a power of two in [2, 64]...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import NotebookParams

GENERATIONS = ("v5e", "v6e", "v5p")


@dataclass(frozen=True)
class TimingParams(NotebookParams):
    """Notebook 13 (see the module note)."""

    NOTEBOOK: ClassVar[str] = "13_step_time"
    POSITIVE: ClassVar[tuple[str, ...]] = ("chips", "hidden", "ffn")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"generation": GENERATIONS}
    FLAGS: ClassVar[tuple[str, ...]] = ("full_size",)

    generation: str = "v5e"  # TPU generation the programs are compiled for: "v5e", "v6e" or "v5p"
    chips: int = 8  # chips of the slice (one mesh axis over all of them)
    hidden: int = 2048  # d: the MLP block's model width
    ffn: int = 8192  # f: its inner width (fsdp / data sweeps)
    tokens: tuple = (256, 1024, 4096)  # tokens per chip swept for the fsdp axis (ascending)
    ffns: tuple = (2048, 8192, 32768)  # inner widths swept for the tensor axis (ascending)
    full_size: bool = False  # compile the published v5e-256 runs live (tens of minutes); False: their cached results

    def checks(self) -> None:
        c = self.chips
        if c < 2 or c > 64 or c & (c - 1):
            raise ValueError(f"chips={c} must be a power of two in [2, 64] (a slice of 2, 4, 8, ... chips; one chip "
                             "has no ICI to price)")
        if self.generation == "v5p" and c < 4:
            raise ValueError(f"chips={c}: the smallest v5p slice has 4 chips (v5p-8, 2x2x1)")
        for name, values in (("tokens", self.tokens), ("ffns", self.ffns)):
            if not isinstance(values, tuple | list) or len(values) < 2:
                raise ValueError(f"{name}={values!r} must list at least two sizes")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name}={values!r}: {v!r} is not a positive int")
            if list(values) != sorted(set(values)):
                raise ValueError(f"{name}={values!r} must be strictly ascending")
        for f in (self.ffn, *self.ffns):
            if f % c:
                raise ValueError(f"ffn={f} is not divisible by chips={c} (FSDP splits W2's rows, tensor W1's columns)")
        if self.hidden % c:
            raise ValueError(f"hidden={self.hidden} is not divisible by chips={c} (FSDP splits W1's rows)")

    @property
    def topology(self) -> str:
        """The slice's Cloud TPU name: chips for v5e / v6e, TensorCores (2 per chip) for v5p."""
        return f"{self.generation}-{self.chips * (2 if self.generation == 'v5p' else 1)}"

    num_devices: int = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
    results_dir: str | None = None  # where the JSON record goes (the report runner sets it)
    seed: int = 0  # seed of every random tensor
    answers: dict | None = None  # exercise answer key (the tests and the report inject it); leave None
