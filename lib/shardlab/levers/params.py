"""Notebook 08's parameters (light: no torch, no torch_xla; read before ``runtime.setup()``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import GENERATIONS, NotebookParams, divisible, int_sequence

SEARCHES = ("off", "small", "full")


@dataclass(frozen=True)
class LeversParams(NotebookParams):
    """Notebook 08: combining, overlap, memory order, automatic strategy, fusion — each off vs on."""

    NOTEBOOK: ClassVar[str] = "08_compiler_levers"
    POSITIVE = ("layers", "hidden", "batch", "gloo_repeats", "mlp_seq", "mlp_hidden", "mlp_ffn", "toy_rows",
                "big_layers", "overlap_hidden", "overlap_batch", "update_hidden", "update_batch")
    FLAGS = ("run_tpu", "auto_sharding")
    CHOICES = {"generation": GENERATIONS, "optimizer": ("sgd", "adam"), "search": SEARCHES}

    generation: str = "v5e"  # TPU generation compiled for (compile-only): "v5e" or "v6e"
    run_tpu: bool = True  # False: formula, ledger, CPU compiler and timings only (no TPU compiles)
    layers: int = 8  # L weight gradients of the data-parallel / FSDP step (combining, overlap)
    hidden: int = 256  # width of those square layers
    batch: int = 64  # global batch of that step, sharded over all devices
    bucket_bytes: int = 1048576  # hand-made gradient buckets for the ledger (DDP's bucket_cap_mb), bytes
    bucket_first_bytes: int = 1048576  # the first bucket's own limit (DDP: dist._DEFAULT_FIRST_BUCKET_BYTES)
    gloo_world: int = 2  # processes for the real all-reduce timings; 0 skips them
    gloo_repeats: int = 5  # timed samples per point (after 2 warm-up rounds)
    gloo_numels: tuple = (4096, 1048576)  # float32 elements per timed point (all m calls together)
    gloo_calls: tuple = (1, 8, 32)  # m: the point's elements are split over m all-reduces
    mlp_seq: int = 512  # Megatron MLP (bf16, batch 2, tp equal to num_devices) for overlap and fusion
    mlp_hidden: int = 512
    mlp_ffn: int = 2048
    toy_rows: int = 262144  # memory-order toy on the TPU: one unit = [toy_rows, 256] bf16 per chip
    big_layers: int = 4  # layers of the two large compile-only steps (overlap, weight update)
    overlap_hidden: int = 2048  # the FSDP step of the overlap section (compile-only, bf16): [h, h] weights
    overlap_batch: int = 8192  # and its global batch [B, h]
    update_hidden: int = 512  # the memory-aware weight update (compile-only, bf16, replicated)
    update_batch: int = 256
    optimizer: str = "adam"  # "sgd" or "adam"
    search: str = "small"  # layouts compiled for the TPU: "off", "small" (4 meshes), "full" (every mesh+layout)
    auto_sharding: bool = True  # also try XLA's auto-sharding (compile-only) on the Megatron MLP

    def checks(self) -> None:
        for name in ("bucket_bytes", "bucket_first_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0 (0: a bucket closes after one gradient)")
        if isinstance(self.gloo_world, bool) or not isinstance(self.gloo_world, int) or self.gloo_world < 0 \
                or self.gloo_world == 1:
            raise ValueError(f"gloo_world={self.gloo_world!r} must be 0 (skip the timings) or an int >= 2")
        int_sequence("gloo_numels", self.gloo_numels)
        int_sequence("gloo_calls", self.gloo_calls)
        for n in self.gloo_numels:
            for k in self.gloo_calls:
                divisible("gloo_numels entry", n, "gloo_calls entry", k, "k all-reduces of n / k elements each")
        if self.gloo_world and (len(set(self.gloo_calls)) < 2 or len(set(self.gloo_numels)) < 2):
            raise ValueError(f"gloo_numels={self.gloo_numels} and gloo_calls={self.gloo_calls} need >= 2 distinct "
                             "values each: the α–β fit separates the per-call and the per-byte cost")
        n = self.num_devices or 1
        divisible("batch", self.batch, "num_devices", n, "the step shards the batch over every device")
        divisible("hidden", self.hidden, "num_devices", n, "FSDP shards each [hidden, hidden] weight's rows")
        divisible("mlp_ffn", self.mlp_ffn, "num_devices", n, "the Megatron MLP splits ffn over tp = num_devices")
        divisible("mlp_hidden", self.mlp_hidden, "num_devices", n, "the layout search splits hidden too")
        divisible("overlap_batch", self.overlap_batch, "num_devices", n, "the FSDP step shards its batch")
        divisible("overlap_hidden", self.overlap_hidden, "num_devices", n, "FSDP shards each weight's rows")
