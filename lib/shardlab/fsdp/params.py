"""Notebooks 05 and 05b's parameters: an MLP trained data-parallel on FSDP ranks (light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import NotebookParams, divisible, layer_widths


@dataclass(frozen=True)
class FsdpParamsBase(NotebookParams):
    """Shared by 05 and 05b: an MLP Linear(d0, d1) -> tanh -> ... trained data-parallel on ``world_size`` FSDP
    ranks."""

    POSITIVE = ("world_size", "batch")

    world_size: int = 8  # FSDP ranks N (SimulatedWorld ranks; the GSPMD mesh's fsdp axis)
    layer_sizes: tuple[int, ...] = (30, 50, 10)  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
    batch: int = 64  # global batch b, split evenly over the N ranks

    def __post_init__(self) -> None:
        if isinstance(self.layer_sizes, list):  # papermill injects YAML lists
            object.__setattr__(self, "layer_sizes", tuple(self.layer_sizes))

    def checks(self) -> None:
        layer_widths("layer_sizes", self.layer_sizes)
        divisible("batch", self.batch, "world_size", self.world_size, "every rank trains on batch / world_size rows")


@dataclass(frozen=True)
class FsdpParams(FsdpParamsBase):
    NOTEBOOK: ClassVar[str] = "05_fsdp_flat_params"
    POSITIVE = ("steps",)
    FLAGS = ("align",)

    align: bool = False  # True: alignment padding like use_orig_params (16-byte parameter starts)
    steps: int = 3  # training steps for the parity check


@dataclass(frozen=True)
class FsdpGspmdParams(FsdpParamsBase):
    """``world_size`` must tile ``num_devices`` for the CPU compiler view (else it is skipped with a note)."""

    NOTEBOOK: ClassVar[str] = "05b_fsdp_gspmd"

    torch_fsdp_world: int = 2  # ranks (gloo processes) for PyTorch FSDP1 / FSDP2; 0 skips them (process start-up)

    def checks(self) -> None:
        super().checks()
        if isinstance(self.torch_fsdp_world, bool) or not isinstance(self.torch_fsdp_world, int) \
                or not 0 <= self.torch_fsdp_world <= 4:
            raise ValueError(f"torch_fsdp_world={self.torch_fsdp_world!r} must be an int in [0, 4] "
                             "(0 skips PyTorch FSDP)")
