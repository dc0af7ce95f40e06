"""The XLA graphs notebook 08 compiles: one builder per lever, each a module-level function of a frozen config.

Design
------
A builder runs on the current SPMD device world (``shardlab.runtime.setup``), creates its tensors on the
CPU (or as placeholders: nothing allocated, compile-only), moves and annotates them, traces one step and returns
every tensor the step produces — *not* synced. The same builder feeds the CPU compiler
(``shardlab.profile.capture_hlo`` runs it) and the TPU compiler (``shardlab.profile.tpu.compile_program``
pickles the builder and the config by reference, so a worker with another device count can rebuild the graph).

- :func:`train_step` — ``L`` square layers ``h <- tanh(h W_l)``, loss ``mean(h²)``, forward + backward, data
  parallel (weights replicated, batch sharded over ``data``) or FSDP (weights dim-0 sharded over ``fsdp``,
  gathered before use, gradients constrained back to the weight's sharding: a reduce-scatter). Outputs
  ``[loss, *weight grads]``: L gradient reductions + 1 for the loss (its mean over the batch shards).
- :func:`order_toy` — the four-operator memory-order graph (``shardlab.levers.order.roam_toy``) as tensors:
  V0 writes ``a`` (1 unit) and ``b`` (10), V1 expands ``a`` to ``c`` (6), V2 shrinks ``b`` to ``d`` (1),
  V3 sums. Each V is a matmul (``x @ W``), which XLA:CPU never fuses into its consumer; optimisation barriers
  keep every tensor materialised on the TPU too (otherwise it fuses V1/V2 into the reductions of V3 and nothing
  large ever exists). XLA:CPU drops the barriers; the matmuls keep the graph's shape there.
- :func:`weight_update` — an L-layer step with an SGD or Adam update, either in the same graph as the
  backward (``stage="fused"``), or the backward alone (``"backward"``, gradients as outputs) and the update
  alone (``"update"``, gradients as inputs): "after a separate sync". Placeholders, so sizes can be large.
- :func:`mlp_layout` — the Megatron MLP ``gelu(x A) B`` forward + backward on a (data, fsdp, tensor) mesh with
  a named weight layout (the automatic-strategy search).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardlab import runtime

MODES = ("dp", "fsdp")
STAGES = ("fused", "backward", "update")
OPTIMIZERS = ("sgd", "adam")
LAYOUTS = ("megatron", "swapped")
LR = 0.01


def _mark(t: torch.Tensor, mesh: Any, spec: tuple) -> torch.Tensor:
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(t, mesh, spec)
    return t


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


# --------------------------------------------------------------------------------------- DP / FSDP step
@dataclass(frozen=True)
class StepConfig:
    """A data-parallel or FSDP training step of ``layers`` square [hidden, hidden] weights."""

    mode: str = "dp"  # "dp": weights replicated; "fsdp": weights dim-0 sharded, gathered before use
    layers: int = 8  # L: weight gradients to reduce
    batch: int = 64  # global batch, sharded over all devices
    hidden: int = 256
    dtype: str = "float32"
    seed: int = 0
    placeholders: bool = False  # compile-only inputs (nothing allocated; the graph must never run)

    def validate(self, devices: int) -> StepConfig:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
        for name in ("layers", "batch", "hidden"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        if self.batch % devices:
            raise ValueError(f"batch={self.batch} is not divisible by the {devices} devices (batch sharding)")
        if self.mode == "fsdp" and self.hidden % devices:
            raise ValueError(f"hidden={self.hidden} is not divisible by the {devices} devices (FSDP shards dim 0)")
        return self

    @property
    def grad_bytes(self) -> int:
        """Bytes of one weight gradient [hidden, hidden]."""
        return self.hidden * self.hidden * torch.finfo(_dtype(self.dtype)).bits // 8


class _Unshard(torch.autograd.Function):
    """FSDP's unshard as sharding constraints. Forward: a replicated copy of the sharded weight (all-gather);
    backward: the gradient constrained back to the weight's dim-0 sharding (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, mesh: Any) -> torch.Tensor:
        ctx.mesh = mesh
        return _mark(w * 1.0, mesh, (None, None))  # [h, h] everywhere

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _mark(g * 1.0, ctx.mesh, ("fsdp", None)), None  # [h / n, h] per device


def train_step(cfg: StepConfig) -> list[torch.Tensor]:
    """Forward + backward on the current world; returns ``[loss, *grads]`` (not synced)."""
    n = runtime.current().num_devices
    cfg.validate(n)
    axis = "data" if cfg.mode == "dp" else "fsdp"
    mesh = runtime.mesh((n,), (axis,))
    g = torch.Generator().manual_seed(cfg.seed)
    dt = _dtype(cfg.dtype)
    # a placeholder cannot carry a sharding itself: annotate a value computed from it (placeholder * 1)
    ws = [(_input((cfg.hidden, cfg.hidden), dt, cfg.placeholders, g) * (1.0 if cfg.placeholders
           else cfg.hidden**-0.5)).detach().requires_grad_() for _ in range(cfg.layers)]  # L x [h, h]
    x = _mark(_input((cfg.batch, cfg.hidden), dt, cfg.placeholders, g) * 1.0, mesh, (axis, None))  # [B, h]
    for w in ws:
        _mark(w, mesh, (None, None) if cfg.mode == "dp" else ("fsdp", None))
    h = x
    for w in ws:
        full = w if cfg.mode == "dp" else _Unshard.apply(w, mesh)
        h = _mark(torch.tanh(h @ full), mesh, (axis, None))  # [B, h] @ [h, h] -> [B, h], batch-sharded
    loss = h.float().pow(2).mean()  # mean over the sharded batch: one scalar all-reduce
    loss.backward()
    return [loss, *[w.grad for w in ws]]


# ----------------------------------------------------------------------------------------- memory order
@dataclass(frozen=True)
class ToyConfig:
    """The memory-order toy as tensors; one unit = [rows, cols] of ``dtype`` per device (replicated)."""

    rows: int = 262144
    cols: int = 256  # one unit = [rows, cols]: 128 MiB of bf16, too large for the TPU's on-chip memory
    dtype: str = "bfloat16"
    placeholders: bool = True  # compile-only inputs (nothing allocated); False: real CPU tensors

    @property
    def unit_bytes(self) -> int:
        return self.rows * self.cols * torch.finfo(_dtype(self.dtype)).bits // 8


def _barrier(*ts: torch.Tensor) -> list[torch.Tensor]:
    import torch_xla.core.xla_model as xm

    out = list(ts)
    xm.optimization_barrier_(out)
    return out


def _input(shape: tuple[int, ...], dtype: torch.dtype, placeholder: bool, g: torch.Generator) -> torch.Tensor:
    if placeholder:
        from torch_xla.core.xla_builder import create_placeholder_tensor

        return create_placeholder_tensor(shape, dtype)
    return torch.randn(*shape, generator=g).to(dtype).to(runtime.device())


def order_toy(cfg: ToyConfig) -> list[torch.Tensor]:
    """V0 -> (a, b); V1: a -> c; V2: b -> d; V3: (c, d) -> o. Sizes 1, 10, 6, 1 units (see the module note)."""
    g = torch.Generator().manual_seed(0)
    r, k, dt = cfg.rows, cfg.cols, _dtype(cfg.dtype)
    x = _input((r, k), dt, cfg.placeholders, g)  # [r, k]: the graph input (not counted)
    wa, wb = _input((k, k), dt, cfg.placeholders, g), _input((k, 10 * k), dt, cfg.placeholders, g)
    wc, wd = _input((k, 6 * k), dt, cfg.placeholders, g), _input((10 * k, k), dt, cfg.placeholders, g)
    a, b = _barrier(x @ wa, x @ wb)  # V0: a [r, k] (1 unit), b [r, 10k] (10 units), materialised together
    (c,) = _barrier(a @ wc)  # V1 expands: c [r, 6k] (6 units)
    (d,) = _barrier(b @ wd)  # V2 shrinks: d [r, k] (1 unit)
    return [c.float().sum() + d.float().sum()]  # V3: a scalar


# ------------------------------------------------------------------------------- memory-aware update
@dataclass(frozen=True)
class UpdateConfig:
    """An L-layer step whose optimizer update runs in the backward's graph or in a graph of its own."""

    stage: str = "fused"  # "fused" | "backward" | "update"
    optimizer: str = "adam"  # "sgd" | "adam" (two fp32-free moments of the weight dtype, for simplicity)
    layers: int = 8
    batch: int = 4096
    hidden: int = 4096
    dtype: str = "bfloat16"

    def validate(self) -> UpdateConfig:
        if self.stage not in STAGES:
            raise ValueError(f"stage={self.stage!r} must be one of {STAGES}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        return self

    @property
    def weight_bytes(self) -> int:
        return self.layers * self.hidden * self.hidden * torch.finfo(_dtype(self.dtype)).bits // 8


def _update(w: torch.Tensor, grad: torch.Tensor, state: list[torch.Tensor], optimizer: str) -> list[torch.Tensor]:
    """One SGD or Adam step (step 1, no bias correction): returns [new weight, *new state]."""
    if optimizer == "sgd":
        return [w - LR * grad]
    m, v = state
    m2 = 0.9 * m + 0.1 * grad
    v2 = 0.999 * v + 0.001 * grad * grad
    return [w - LR * m2 / (v2.sqrt() + 1e-8), m2, v2]


def weight_update(cfg: UpdateConfig) -> list[torch.Tensor]:
    """The graph of one stage (see the module note); every input is a placeholder (compile-only)."""
    from torch_xla.core.xla_builder import create_placeholder_tensor as ph

    cfg.validate()
    dt, h = _dtype(cfg.dtype), cfg.hidden
    ws = [ph((h, h), dt) for _ in range(cfg.layers)]  # L x [h, h]
    states = [[ph((h, h), dt), ph((h, h), dt)] if cfg.optimizer == "adam" else [] for _ in ws]
    if cfg.stage == "update":  # the gradients come from the previous graph: inputs here
        grads = [ph((h, h), dt) for _ in ws]
        return [t for w, gr, s in zip(ws, grads, states, strict=True) for t in _update(w, gr, s, cfg.optimizer)]
    x = ph((cfg.batch, h), dt)  # [B, h]
    params = [(w * 1.0).detach().requires_grad_() for w in ws]  # differentiable leaves over the placeholders
    act = x
    for p in params:
        act = torch.tanh(act @ p)  # [B, h] @ [h, h]
    loss = act.float().pow(2).mean()
    grads = torch.autograd.grad(loss, params)
    if cfg.stage == "backward":
        return [loss, *grads]
    return [loss, *[t for w, gr, s in zip(ws, grads, states, strict=True) for t in _update(w, gr, s, cfg.optimizer)]]


# ---------------------------------------------------------------------------------- layouts (search)
@dataclass(frozen=True)
class LayoutConfig:
    """The MLP gelu(x A) B on a (data, fsdp, tensor) mesh with a weight layout.

    - ``megatron``: A split by columns and B by rows over ``tensor`` (one all-reduce each way);
    - ``swapped``: A split by rows and B by columns (the contraction of x A is split: partial sums before GeLU).
    The other weight dimension is split over ``fsdp`` (gathered before use); the batch over ``data`` x ``fsdp``.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 8
    layout: str = "megatron"
    batch: int = 8
    seq: int = 256
    hidden: int = 512
    ffn: int = 2048
    dtype: str = "bfloat16"
    seed: int = 0

    @property
    def name(self) -> str:
        return f"d{self.data}·f{self.fsdp}·t{self.tensor} {self.layout}"

    def validate(self, devices: int) -> LayoutConfig:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} must be one of {LAYOUTS}")
        if self.data * self.fsdp * self.tensor != devices:
            raise ValueError(f"data={self.data} × fsdp={self.fsdp} × tensor={self.tensor} = "
                             f"{self.data * self.fsdp * self.tensor} does not equal the {devices} devices")
        if self.batch % (self.data * self.fsdp):
            raise ValueError(f"batch={self.batch} is not divisible by data × fsdp = {self.data * self.fsdp}")
        for name, v in (("hidden", self.hidden), ("ffn", self.ffn)):
            if v % (self.fsdp * self.tensor):
                raise ValueError(f"{name}={v} is not divisible by fsdp × tensor = {self.fsdp * self.tensor}")
        return self


def layouts(devices: int, tensor_layouts: tuple[str, ...] = LAYOUTS) -> list[tuple[int, int, int, str]]:
    """Every (data, fsdp, tensor) with data·fsdp·tensor = devices, and every layout where tensor > 1."""
    out = []
    for t in range(1, devices + 1):
        for f in range(1, devices // t + 1):
            if devices % (t * f):
                continue
            d = devices // (t * f)
            for lay in (tensor_layouts if t > 1 else ("megatron",)):
                out.append((d, f, t, lay))
    return out


def mlp_layout(cfg: LayoutConfig) -> list[torch.Tensor]:
    """Forward + backward of (out * grad_out).sum() for the layout; returns [out, grad x, grad A, grad B]."""
    from shardlab import models

    n = runtime.current().num_devices
    cfg.validate(n)
    mesh = runtime.mesh((cfg.data, cfg.fsdp, cfg.tensor), ("data", "fsdp", "tensor"))
    g = torch.Generator().manual_seed(cfg.seed)
    dt, dev = _dtype(cfg.dtype), runtime.device()
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        mlp = models.MLP(cfg.hidden, cfg.ffn, bias=False).to(dt)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt)  # [b, s, h]
    gout = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt)
    mlp = mlp.to(dev)
    # nn.Linear layout: fc1.weight = A^T [ffn, h], fc2.weight = B^T [h, ffn]
    if cfg.layout == "megatron":  # A columns (ffn) and B rows (ffn) on tensor; the h side on fsdp
        _mark(mlp.fc1.weight, mesh, ("tensor", "fsdp"))
        _mark(mlp.fc2.weight, mesh, ("fsdp", "tensor"))
    else:  # A rows (h) and B columns (h) on tensor; the ffn side on fsdp
        _mark(mlp.fc1.weight, mesh, ("fsdp", "tensor"))
        _mark(mlp.fc2.weight, mesh, ("tensor", "fsdp"))
    batch_axes = tuple(a for a, k in (("data", cfg.data), ("fsdp", cfg.fsdp)) if k > 1) or None
    x = _mark(x.to(dev), mesh, (batch_axes, None, None)).requires_grad_()  # a layer inside a network: dX needed
    gout = _mark(gout.to(dev), mesh, (batch_axes, None, None))
    out = mlp(x)  # [b, s, h]
    (out * gout).sum().backward()
    return [out, x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad]
