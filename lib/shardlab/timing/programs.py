"""Graphs whose step time notebook 13 prices: a matmul, an MLP block's training step split along one axis, and
(for the crossover table) an attention core split along the sequence and a MoE layer split by experts.

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

:class:`AttentionStep` and :class:`MoeStep` reuse the context and expert topics' own GSPMD graphs
(:func:`shardlab.context.gspmd.allgather_attention`, :func:`shardlab.expert.gspmd.gshard_moe`) with bf16 leaves; their
FLOP and wire counts are in their docstrings.

Builders are module-level functions of a frozen config so ``shardlab.profile.tpu.compile_program`` can run them in a
helper process with the slice's device count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shardlab import runtime
from shardlab.expert.params import ExpertParams
from shardlab.formulas import expert as fexp

AXES = ("fsdp", "tensor", "data")


def _positive_ints(cfg: object, names: tuple[str, ...]) -> None:
    """A clear error for the first of ``cfg``'s fields ``names`` that is not a positive int (bool refused)."""
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


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
        _positive_ints(self, ("devices", "tokens", "hidden", "ffn"))
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

    @property
    def wire_bytes(self) -> float:
        """Per chip, the collectives the formula assumes (module note): fsdp and data move every weight twice
        (2·(n−1)/n · 2P bytes), tensor all-reduces the [T, d] activations forward and backward."""
        n = self.devices
        if self.axis == "tensor":
            return 2 * 2 * (n - 1) / n * 2 * self.tokens * self.hidden
        return 2 * (n - 1) / n * 2 * self.params

    @property
    def critical_share(self) -> float:
        """The scaling book's crossing in units of C / W (``shardlab.timing.sweep``'s note): tokens per chip
        (fsdp, data) or the inner width (tensor)."""
        n = self.devices
        return 2 / 3 * (n - 1) if self.axis == "tensor" else 2 / 3 * (n - 1) / n

    @property
    def build(self) -> Callable[[MlpStep], list[torch.Tensor]]:
        return mlp_step

    @property
    def label(self) -> str:
        return f"timing {self.axis} T{self.tokens} f{self.ffn}"


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


# ------------------------------------------------------------------------------------------ context and expert axes
@dataclass(frozen=True)
class AttentionStep:
    """One attention core's training step with the sequence split over a ``context`` axis of ``devices`` chips.

    q [b, s, hq, dh], k and v [b, s, hkv, dh] (bf16, s = ``seq`` · devices) are the step's leaves, sequence-sharded;
    the graph is :func:`shardlab.context.gspmd.allgather_attention` (no mask: under SPMD a causal mask computes
    every block anyway), the loss ½‖out‖² / s, and the gradients of q, k, v. Per chip, L = ``seq``:

    - FLOPs: scores and scores·V, 2·2·b·hq·L·s·dh forward, twice that backward: 12·b·hq·L·s·dh;
    - wire: all-gather of K and of V forward, reduce-scatter of dK and of dV backward, each (n−1)/n · b·s·hkv·dh·2
      bytes: 4 · (n−1) · b·L·hkv·dh·2 bytes.
    """

    devices: int = 8  # size of the context axis (= chips of the slice)
    seq: int = 1024  # L: sequence positions per chip (s = L · devices)
    batch: int = 1  # b
    heads: int = 8  # hq
    kv_heads: int = 8  # hkv (hq must be a multiple)
    head_dim: int = 128  # dh
    axis: str = "context"

    def __post_init__(self) -> None:
        _positive_ints(self, ("devices", "seq", "batch", "heads", "kv_heads", "head_dim"))
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} (grouped queries)")

    @property
    def flops_per_chip(self) -> int:
        """Attention matmul FLOPs per chip: 12 · b · hq · L · s · dh (forward 4, backward 8)."""
        return 12 * self.batch * self.heads * self.seq * self.seq * self.devices * self.head_dim

    @property
    def wire_bytes(self) -> float:
        """Per chip: all-gather of K and V, reduce-scatter of dK and dV (bf16), each (n−1)/n of the full [b, s, hkv,
        dh] tensor."""
        n = self.devices
        return 4 * (n - 1) / n * self.batch * self.seq * n * self.kv_heads * self.head_dim * 2

    @property
    def critical_share(self) -> float:
        """L* in units of C / W: (2/3)·(hkv/hq)·(n−1)/n positions per chip."""
        return 2 / 3 * self.kv_heads / self.heads * (self.devices - 1) / self.devices

    @property
    def build(self) -> Callable[[AttentionStep], list[torch.Tensor]]:
        return attention_step

    @property
    def label(self) -> str:
        return f"timing {self.axis} seq {self.seq}"


def attention_step(cfg: AttentionStep) -> list[torch.Tensor]:
    """The gradients of q, k and v (sequence-sharded), traced, not run."""
    from shardlab.context.gspmd import SEQ, allgather_attention, mark  # needs the world: imported after setup

    mesh = runtime.mesh((cfg.devices,), (cfg.axis,))
    s = cfg.seq * cfg.devices

    def leaf(h: int) -> torch.Tensor:
        x = torch.zeros(cfg.batch, s, h, cfg.head_dim, dtype=torch.bfloat16).to(runtime.device())
        return mark(x, mesh, SEQ).requires_grad_()  # [b, s, h, dh], positions split over the axis

    q, k, v = leaf(cfg.heads), leaf(cfg.kv_heads), leaf(cfg.kv_heads)
    out = allgather_attention(q, k, v, mesh, None, None)  # [b, s, hq, dh]
    loss = 0.5 * (out.float() ** 2).sum() / s
    grads = torch.autograd.grad(loss, (q, k, v))
    return [mark(g, mesh, SEQ) for g in grads]


@dataclass(frozen=True)
class MoeStep:
    """One MoE layer's training step (GShard's capacity-factor layer) with the experts split over an ``expert``
    axis of ``devices`` chips, one routing group of ``tokens`` tokens per chip, bf16.

    The graph is :func:`shardlab.expert.gspmd.gshard_moe` (dispatch einsum, all-to-all to the experts, SwiGLU per
    expert, all-to-all back, combine), the loss ½‖y‖² / tokens, and the gradients of x, the router and the expert
    weights. With E experts, top-k, capacity C = ceil(cf · k · S / E) slots per expert and group, n = devices
    groups, per chip:

    - expert FLOPs: E/n experts, each n·C slots through three [h, f] matmuls, forward 6·E·C·h·f, training
      18·E·C·h·f;
    - wire: four all-to-alls (dispatch and combine, forward and backward) of the chip's [E, 1, C, h] block, each
      (n−1)/n · E·C·h·2 bytes, plus the all-reduce of the replicated router's gradient [h, E].
    """

    devices: int = 8  # size of the expert axis (= chips of the slice)
    tokens: int = 1024  # S: tokens routed per chip
    hidden: int = 1024  # h
    ffn: int = 1024  # f: each expert's inner width
    experts: int = 8  # E
    top_k: int = 2
    capacity_factor: float = 1.25
    axis: str = "expert"

    def __post_init__(self) -> None:
        _positive_ints(self, ("devices", "tokens", "hidden", "ffn", "experts", "top_k"))
        if self.experts % self.devices:
            raise ValueError(f"experts={self.experts} is not divisible by devices={self.devices} (whole experts "
                             "per chip)")

    @property
    def params(self) -> ExpertParams:
        """Notebook 11's parameters for this layer (what :func:`shardlab.expert.gspmd.gshard_moe` routes by)."""
        return ExpertParams(ep=self.devices, tokens=self.tokens, hidden=self.hidden, ffn=self.ffn,
                            experts=self.experts, top_k=self.top_k, capacity_factor=self.capacity_factor)

    @property
    def capacity(self) -> int:
        return fexp.capacity(self.tokens, self.experts, self.top_k, self.capacity_factor)

    @property
    def flops_per_chip(self) -> int:
        """Expert-MLP matmul FLOPs per chip: 18 · E · C · h · f (the dispatch / combine einsums not counted)."""
        return 18 * self.experts * self.capacity * self.hidden * self.ffn

    @property
    def wire_bytes(self) -> float:
        """Per chip: the four all-to-alls of the [E, 1, C, h] block (bf16); the router's all-reduce is left out
        (the book's count: tokens to experts and back)."""
        n = self.devices
        return 4 * (n - 1) / n * self.experts * self.capacity * self.hidden * 2

    @property
    def critical_share(self) -> float:
        """f* in units of C / W: (4/9)·(n−1)/n (the expert's inner width)."""
        return 4 / 9 * (self.devices - 1) / self.devices

    @property
    def build(self) -> Callable[[MoeStep], list[torch.Tensor]]:
        return moe_step

    @property
    def label(self) -> str:
        return f"timing {self.axis} ffn {self.ffn}"


def moe_step(cfg: MoeStep) -> list[torch.Tensor]:
    """The gradients of x, the router, W1, W3 and W2 (each sharded like its tensor), traced, not run."""
    import torch_xla.distributed.spmd as xs

    from shardlab.expert.gspmd import AXIS, TOKENS, expert_mesh, gshard_moe  # needs the world: after setup

    p = cfg.params
    mesh = expert_mesh(cfg.devices)  # (data, expert) = (n / ep, ep): data is 1 when the world is the slice
    dev = runtime.device()

    def leaf(shape: tuple[int, ...], spec: tuple) -> torch.Tensor:
        x = torch.zeros(*shape, dtype=torch.bfloat16).to(dev)
        xs.mark_sharding(x, mesh, spec)
        return x.requires_grad_()

    h, f, e = cfg.hidden, cfg.ffn, cfg.experts
    x = leaf((cfg.tokens * cfg.devices, h), TOKENS)  # [G·S, h]: one group per chip
    router = leaf((h, e), (None, None))  # [h, E] replicated
    w1, w3 = leaf((e, h, f), (AXIS, None, None)), leaf((e, h, f), (AXIS, None, None))  # [E, h, f]
    w2 = leaf((e, f, h), (AXIS, None, None))  # [E, f, h]
    y = gshard_moe(x, router, w1, w3, w2, p, mesh)  # [G·S, h]
    loss = 0.5 * (y.float() ** 2).sum() / cfg.tokens
    grads = torch.autograd.grad(loss, (x, router, w1, w3, w2))
    for g, spec in zip(grads, (TOKENS, (None, None), (AXIS, None, None), (AXIS, None, None), (AXIS, None, None)),
                       strict=True):
        xs.mark_sharding(g, mesh, spec)
    return list(grads)
