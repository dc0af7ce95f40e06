"""Notebook 06's parameters (light: no torch, no torch_xla; read before ``runtime.setup()``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from shardlab.core.params import NotebookParams, divisible, int_list


@dataclass(frozen=True)
class ScanParams(NotebookParams):
    """Notebook 06. The CPU sections need exactly fsdp·tensor devices (the mesh spans all of them)."""

    NOTEBOOK: ClassVar[str] = "06_scan_shard_as"
    POSITIVE = ("hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor", "layers")
    FLAGS = ("full_size",)

    layers_sweep: list = field(default_factory=lambda: [2, 8, 64])  # L values of the compile curves, each >= 2
    layers: int = 4  # L of the shard_as sections, the small seed story and the trace transfers (>= 2)
    hidden: int = 64  # h: W_up [h, F] is split h over fsdp
    ffn: int = 256  # F: split over tensor
    batch: int = 8  # b: split over fsdp
    seq: int = 8  # s: split over tensor in the nn.Linear trap
    mesh_fsdp: int = 2  # mesh (fsdp, tensor); the CPU sections need fsdp × tensor devices
    mesh_tensor: int = 4
    devices_sweep: list = field(default_factory=list)  # compile time vs device count, one fresh process per count
    placeholder_hiddens: list = field(default_factory=lambda: [64, 256])  # model widths for the trace-transfer growth
    full_size: bool = False  # compile the 405B-size seed with XLA:TPU (minutes); False: show the cached compiles

    def checks(self) -> None:
        int_list("layers_sweep", self.layers_sweep, least=2)  # XLA removes a While that runs once
        if self.layers < 2:
            raise ValueError(f"layers={self.layers} must be >= 2 (XLA removes a While loop that runs once)")
        if self.mesh_fsdp == 1:
            raise ValueError("mesh_fsdp=1 leaves shard_as nothing to do (the gradient's 1-D and 2-D shardings "
                             "coincide when the batch is not split): choose mesh_fsdp >= 2")
        f, t = self.mesh_fsdp, self.mesh_tensor
        for name, size, axis, n in (("hidden", self.hidden, "mesh_fsdp", f), ("ffn", self.ffn, "mesh_tensor", t),
                                    ("batch", self.batch, "mesh_fsdp", f), ("seq", self.seq, "mesh_tensor", t)):
            divisible(name, size, axis, n, f"it is split over {axis.removeprefix('mesh_')}")
        for name, size, axis, n in (("hidden", self.hidden, "mesh_tensor", t), ("ffn", self.ffn, "mesh_fsdp", f),
                                    ("batch", self.batch, "mesh_tensor", t)):
            divisible(name, size, axis, n, "the transposed mesh (fsdp and tensor sizes swapped) splits it so")
        int_list("devices_sweep", self.devices_sweep, empty_ok=True)
        for n in self.devices_sweep:
            if n > 8 or self.hidden % n or self.batch % n:
                raise ValueError(f"devices_sweep entry {n}: must be <= 8 CPU devices and divide hidden={self.hidden} "
                                 f"and batch={self.batch} (it runs mesh (fsdp={n}, tensor=1))")
        int_list("placeholder_hiddens", self.placeholder_hiddens)
        for h in self.placeholder_hiddens:
            if h % f or (4 * h) % t:
                raise ValueError(f"placeholder_hiddens entry {h}: must be divisible by mesh_fsdp={f}, and ffn = 4·{h} "
                                 f"by mesh_tensor={t} (the traced stack is split like the notebook's)")
