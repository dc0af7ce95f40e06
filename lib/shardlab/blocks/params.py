"""Notebooks 00 and 01's parameters (light: no torch, no torch_xla; read before ``runtime.setup()``).

``WelcomeParams``: the collectives of notebook 00; ``BlocksParams``: notebook 01's block products."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import DTYPES, NotebookParams, divisible, positive_int


@dataclass(frozen=True)
class WelcomeParams(NotebookParams):
    """Notebook 00. ``world_size`` ranks take part in every collective shown (formula, ledger, both compilers)."""

    NOTEBOOK: ClassVar[str] = "00_welcome"
    WORLD_SIZES: ClassVar[tuple[int, ...]] = (2, 4, 8)
    POSITIVE = ("n", "world_size")

    n: int = 1024  # elements of each rank's vector in the collectives
    world_size: int = 8  # ranks in the collectives (2, 4 or 8)

    def checks(self) -> None:
        if self.world_size not in self.WORLD_SIZES:
            raise ValueError(f"world_size={self.world_size} must be one of {self.WORLD_SIZES} (a collective needs "
                             "2 or more ranks, and the TPU compiler has a slice of that many chips)")
        divisible("n", self.n, "world_size", self.world_size,
                  "the all-gather and the reduce-scatter split the vector evenly over the ranks")


@dataclass(frozen=True)
class BlocksParams(NotebookParams):
    """Notebook 01. Every view splits the product over ``parts`` = p blocks, one per device."""

    NOTEBOOK: ClassVar[str] = "01_block_matrices"
    POSITIVE = ("m", "k", "n", "parts")
    CHOICES = {"dtype": DTYPES}

    m: int = 16  # x is m×k
    k: int = 64  # inner dimension
    n: int = 32  # W is k×n
    parts: int = 4  # p, the number of blocks and of devices in the split; the 2-D grid is 2 by p/2
    dtype: str = "float32"  # "float32" or "bfloat16"
    matmul: tuple = (64, 128, 32)  # I, J, K of section 7's sharded matmuls A[I, J]·B[J, K] on the (X 2, Y 4) mesh

    def checks(self) -> None:
        if not isinstance(self.matmul, list | tuple) or len(self.matmul) != 3:
            raise ValueError(f"matmul={self.matmul!r} must be three positive ints (I, J, K)")
        for name, v, d in zip("IJK", self.matmul, (8, 4, 4), strict=True):
            positive_int(f"matmul {name}", v)
            if v % d:
                raise ValueError(f"matmul={tuple(self.matmul)}: {name}={v} is not divisible by {d} (on the (X 2, Y 4) "
                                 f"mesh {name} is split over {'X and Y' if name == 'I' else 'Y'})")
        for name in ("k", "n"):
            if self.parts > getattr(self, name):
                raise ValueError(f"parts={self.parts} is more than {name}={getattr(self, name)}: every block "
                                 "needs at least one row/column")
        if self.parts % 2 == 0 and self.m % 2:
            raise ValueError(f"m={self.m} is odd: the 2-D grid (2, parts/2) splits x's rows in 2 (choose an even m, "
                             "or an odd parts to leave the grid out)")
