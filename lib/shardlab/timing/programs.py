"""Graphs whose step time notebook 13 prices: a matmul, and an MLP block's training step split along one axis.

Design
------
One MLP block, y = gelu(x W1) W2 with x [T, d], W1 [d, f], W2 [f, d], all bf16, trained one step: forward, the loss
½‖y‖² / T (a stand-in whose gradient depends on the output, so no backward collective can start before the forward
finished), backward, the gradients of x (the layer below needs it) and of both weights as outputs: 6·T·P matmul
FLOPs for P = 2·d·f parameters. Split three ways (one mesh axis of ``n`` devices):

- ``fsdp``: x on dim 0 (T·n tokens in all, T per chip), W1 and W2 on dim 0 (ZeRO-3): the partitioner gathers each
  weight once (one graph keeps it for the backward) and reduce-scatters its gradient — 2 · (n−1)/n · 2·d·f·2 bytes
  per chip against 6·T·2·d·f FLOPs, so the ratio falls as 1/T: the step turns compute-bound above a per-chip batch;
- ``tensor``: Megatron's MLP, W1 on columns, W2 on rows, x replicated over the axis: one all-reduce of [T, d] forward
  (g, after W2) and one backward (f, of x's gradient) — 2 · 2(n−1)/n · T·d·2 bytes against 6·T·2·d·f/n FLOPs, so
  the ratio does not depend on T but falls as f/n grows;
- ``data``: x on dim 0, weights replicated: one all-reduce of each gradient, 2(n−1)/n · 2·d·f·2 bytes.

Builders are module-level functions of a frozen config so ``shardlab.profile.tpu.compile_program`` can run them in a
helper process with the slice's device count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlab import runtime

AXES = ("fsdp", "tensor", "data")


@dataclass(frozen=True)
class MlpStep:
    """One MLP block's training step on a one-axis mesh of ``devices`` devices."""

    axis: str = "fsdp"  # fsdp | tensor | data
    devices: int = 8  # size of the mesh axis (= chips of the slice)
    tokens: int = 1024  # T: tokens per chip (tensor: tokens of the replicated batch)
    hidden: int = 2048  # d
    ffn: int = 8192  # f

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"axis={self.axis!r} must be one of {AXES}")
        for name in ("devices", "tokens", "hidden", "ffn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        if self.axis == "tensor" and self.ffn % self.devices:
            raise ValueError(f"ffn={self.ffn} is not divisible by devices={self.devices} (W1's columns split)")
        if self.axis == "fsdp" and (self.hidden % self.devices or self.ffn % self.devices):
            raise ValueError(f"hidden={self.hidden} and ffn={self.ffn} must be divisible by devices={self.devices} "
                             "(FSDP splits each weight's dim 0)")

    @property
    def global_tokens(self) -> int:
        return self.tokens if self.axis == "tensor" else self.tokens * self.devices

    @property
    def params(self) -> int:
        return 2 * self.hidden * self.ffn

    @property
    def flops_per_chip(self) -> int:
        """Model FLOPs of the step per chip: 6 · tokens · parameters, split over the axis."""
        return 6 * self.global_tokens * self.params // self.devices


def mlp_step(cfg: MlpStep) -> list[torch.Tensor]:
    """The step's gradients of x, W1 and W2 (each sharded like its tensor), traced, not run."""
    import torch_xla.distributed.spmd as xs

    mesh = runtime.mesh((cfg.devices,), (cfg.axis,))
    dev = runtime.device()
    x = torch.zeros(cfg.global_tokens, cfg.hidden, dtype=torch.bfloat16).to(dev).requires_grad_()  # [T·n, d]
    w1 = torch.zeros(cfg.hidden, cfg.ffn, dtype=torch.bfloat16).to(dev).requires_grad_()  # [d, f]
    w2 = torch.zeros(cfg.ffn, cfg.hidden, dtype=torch.bfloat16).to(dev).requires_grad_()  # [f, d]
    a = cfg.axis
    spec_x, spec_w1, spec_w2 = {
        "fsdp": ((a, None), (a, None), (a, None)),
        "tensor": ((None, None), (None, a), (a, None)),
        "data": ((a, None), (None, None), (None, None)),
    }[a]
    xs.mark_sharding(x, mesh, spec_x)
    xs.mark_sharding(w1, mesh, spec_w1)
    xs.mark_sharding(w2, mesh, spec_w2)
    y = torch.nn.functional.gelu(x @ w1) @ w2  # [T, d]
    loss = 0.5 * (y.float() ** 2).sum() / cfg.global_tokens
    gx, g1, g2 = torch.autograd.grad(loss, (x, w1, w2))
    xs.mark_sharding(gx, mesh, spec_x)
    xs.mark_sharding(g1, mesh, spec_w1)
    xs.mark_sharding(g2, mesh, spec_w2)
    return [gx, g1, g2]


@dataclass(frozen=True)
class Matmul:
    """A bf16 [m, k] @ [k, n] on ``devices`` chips, rows split (no collective): per chip [m/devices, k] @ [k, n]."""

    m: int
    k: int
    n: int
    devices: int = 8

    @property
    def flops_per_chip(self) -> int:
        return 2 * self.m * self.k * self.n // self.devices

    @property
    def bytes_per_chip(self) -> int:
        """HBM traffic if nothing stays on chip: read both operands, write the result (bf16)."""
        return 2 * (self.m // self.devices * self.k + self.k * self.n + self.m // self.devices * self.n)


def matmul(cfg: Matmul) -> list[torch.Tensor]:
    import torch_xla.distributed.spmd as xs

    mesh = runtime.mesh((cfg.devices,), ("rows",))
    a = torch.zeros(cfg.m, cfg.k, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(a, mesh, ("rows", None))
    b = torch.zeros(cfg.k, cfg.n, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(b, mesh, (None, None))
    return [a @ b]
