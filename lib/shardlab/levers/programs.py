"""The XLA graphs notebook 08 compiles: one builder per lever, each a plain function of its sizes.

Design
------
A builder runs on the current SPMD device world (``shardlab.runtime.setup``), creates its tensors on the
CPU (or as placeholders: nothing allocated, compile-only), moves and annotates them, traces one step and returns
every tensor the step produces — *not* synced. The cases of :mod:`shardlab.levers.case` call them from
``graph()``; :mod:`shardlab.core.harness` hands that graph to both compilers.

- :func:`train_step` — ``L`` square layers ``h <- tanh(h W_l)``, loss ``mean(h²)``, forward + backward, data
  parallel (weights replicated, batch sharded over ``data``) or FSDP (weights dim-0 sharded over ``fsdp``,
  gathered before use, gradients constrained back to the weight's sharding: a reduce-scatter). Outputs
  ``[loss, *weight grads]``: L gradient reductions + 1 for the loss (its mean over the batch shards).
- :func:`order_toy` — the four-operator memory-order graph (``shardlab.profile.order.roam_toy``) as tensors:
  V0 writes ``small`` (1 unit) and ``large`` (10), V1 expands ``small`` to ``expanded`` (6), V2 shrinks ``large``
  to ``shrunk`` (1), V3 sums. Each V is a matmul (``x @ W``), which XLA:CPU never fuses into its consumer;
  optimisation barriers keep every tensor materialised on the TPU too (otherwise it fuses V1/V2 into the
  reductions of V3 and nothing large ever exists). XLA:CPU drops the barriers; the matmuls keep the graph's shape
  there.
- :func:`weight_update` — an L-layer step with an SGD or Adam update, either in the same graph as the
  backward (``stage="fused"``), or the backward alone (``"backward"``, gradients as outputs) and the update
  alone (``"update"``, gradients as inputs): "after a separate sync". Placeholders, so sizes can be large.
- :func:`mlp_layout` — the Megatron MLP ``gelu(x A) B`` forward + backward (loss ½‖out − target‖²) on a (data,
  fsdp, tensor) mesh with a named weight layout (the automatic-strategy search); :func:`layouts` lists every mesh
  and layout.
"""

from __future__ import annotations

import torch
import torch_xla.core.xla_model as xm  # levers modules are imported after runtime.setup() (the notebooks' order)
import torch_xla.distributed.spmd as xs
from torch.autograd.function import FunctionCtx
from torch_xla.core.xla_builder import create_placeholder_tensor

from shardlab import models, runtime

MODES = ("dp", "fsdp")
STAGES = ("fused", "backward", "update")
OPTIMIZERS = ("sgd", "adam")
LAYOUTS = ("megatron", "swapped")
LR = 0.01


def _mark(t: torch.Tensor, mesh: xs.Mesh, spec: tuple) -> torch.Tensor:
    xs.mark_sharding(t, mesh, spec)
    return t


def _input(shape: tuple[int, ...], dtype: torch.dtype, placeholder: bool, g: torch.Generator) -> torch.Tensor:
    if placeholder:
        return create_placeholder_tensor(shape, dtype)
    return torch.randn(*shape, generator=g).to(dtype).to(runtime.device())


# --------------------------------------------------------------------------------------- DP / FSDP step
class _Unshard(torch.autograd.Function):
    """FSDP's unshard as sharding constraints. Forward: a replicated copy of the sharded weight (all-gather);
    backward: the gradient constrained back to the weight's dim-0 sharding (reduce-scatter)."""

    @staticmethod
    def forward(ctx: FunctionCtx, w: torch.Tensor, mesh: xs.Mesh) -> torch.Tensor:
        ctx.mesh = mesh
        return _mark(w * 1.0, mesh, (None, None))  # [h, h] everywhere

    @staticmethod
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _mark(g * 1.0, ctx.mesh, ("fsdp", None)), None  # [h / n, h] per device


def train_step(mode: str, layers: int, batch: int, hidden: int, dtype: str = "float32", seed: int = 0,
               placeholders: bool = False) -> list[torch.Tensor]:
    """Forward + backward of ``layers`` [hidden, hidden] weights on the current world, batch [batch, hidden]
    sharded over every device; ``placeholders``: compile-only inputs. Returns ``[loss, *grads]`` (not synced)."""
    n = runtime.current().num_devices
    axis = "data" if mode == "dp" else "fsdp"
    mesh = runtime.mesh((n,), (axis,))
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    # a placeholder cannot carry a sharding itself: annotate a value computed from it (placeholder * 1)
    ws = [(_input((hidden, hidden), dt, placeholders, g) * (1.0 if placeholders else hidden**-0.5))
          .detach().requires_grad_() for _ in range(layers)]  # L x [h, h]
    x = _mark(_input((batch, hidden), dt, placeholders, g) * 1.0, mesh, (axis, None))  # [B, h]
    for w in ws:
        _mark(w, mesh, (None, None) if mode == "dp" else ("fsdp", None))
    h = x
    for w in ws:
        full = w if mode == "dp" else _Unshard.apply(w, mesh)
        h = _mark(torch.tanh(h @ full), mesh, (axis, None))  # [B, h] @ [h, h] -> [B, h], batch-sharded
    loss = h.float().pow(2).mean()  # mean over the sharded batch: one scalar all-reduce
    loss.backward()
    return [loss, *[w.grad for w in ws]]


# ----------------------------------------------------------------------------------------- memory order
def _barrier(*ts: torch.Tensor) -> list[torch.Tensor]:
    out = list(ts)
    xm.optimization_barrier_(out)
    return out


def order_toy(rows: int, cols: int, dtype: str, placeholders: bool) -> list[torch.Tensor]:
    """V0 -> (small, large); V1: small -> expanded; V2: large -> shrunk; V3: (expanded, shrunk) -> a scalar; one
    unit = [rows, cols] of ``dtype`` per device (replicated). Sizes 1, 10, 6, 1 units (see the module note)."""
    g = torch.Generator().manual_seed(0)
    r, k, dt = rows, cols, getattr(torch, dtype)
    x = _input((r, k), dt, placeholders, g)  # [r, k]: the graph input (not counted)
    w_small, w_large = _input((k, k), dt, placeholders, g), _input((k, 10 * k), dt, placeholders, g)
    w_expand, w_shrink = _input((k, 6 * k), dt, placeholders, g), _input((10 * k, k), dt, placeholders, g)
    small, large = _barrier(x @ w_small, x @ w_large)  # V0: [r, k] (1 unit), [r, 10k] (10), together
    (expanded,) = _barrier(small @ w_expand)  # V1 expands: [r, 6k] (6 units)
    (shrunk,) = _barrier(large @ w_shrink)  # V2 shrinks: [r, k] (1 unit)
    return [expanded.float().sum() + shrunk.float().sum()]  # V3: a scalar


# ------------------------------------------------------------------------------- memory-aware update
def _update(w: torch.Tensor, grad: torch.Tensor, state: list[torch.Tensor], optimizer: str) -> list[torch.Tensor]:
    """One SGD or Adam step (step 1, no bias correction): returns [new weight, *new state]."""
    if optimizer == "sgd":
        return [w - LR * grad]
    m, v = state
    m2 = 0.9 * m + 0.1 * grad
    v2 = 0.999 * v + 0.001 * grad * grad
    return [w - LR * m2 / (v2.sqrt() + 1e-8), m2, v2]


def weight_update(stage: str, optimizer: str, layers: int, batch: int, hidden: int,
                  dtype: str = "bfloat16") -> list[torch.Tensor]:
    """The graph of one stage (see the module note) of ``layers`` [hidden, hidden] weights, replicated, with
    Adam's two moments in the weight dtype (for simplicity); every input is a placeholder (compile-only)."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} must be one of {STAGES}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {OPTIMIZERS}")
    dt, h, ph = getattr(torch, dtype), hidden, create_placeholder_tensor
    ws = [ph((h, h), dt) for _ in range(layers)]  # L x [h, h]
    states = [[ph((h, h), dt), ph((h, h), dt)] if optimizer == "adam" else [] for _ in ws]
    if stage == "update":  # the gradients come from the previous graph: inputs here
        grads = [ph((h, h), dt) for _ in ws]
        return [t for w, gr, s in zip(ws, grads, states, strict=True) for t in _update(w, gr, s, optimizer)]
    x = ph((batch, h), dt)  # [B, h]
    params = [(w * 1.0).detach().requires_grad_() for w in ws]  # differentiable leaves over the placeholders
    act = x
    for p in params:
        act = torch.tanh(act @ p)  # [B, h] @ [h, h]
    loss = act.float().pow(2).mean()
    grads = torch.autograd.grad(loss, params)
    if stage == "backward":
        return [loss, *grads]
    return [loss, *[t for w, gr, s in zip(ws, grads, states, strict=True) for t in _update(w, gr, s, optimizer)]]


# ---------------------------------------------------------------------------------- layouts (search)
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


def layout_problem(data: int, fsdp: int, tensor: int, layout: str, batch: int, hidden: int, ffn: int,
                   devices: int) -> str | None:
    """Why the (data, fsdp, tensor) mesh and ``layout`` cannot hold the MLP on ``devices`` devices, or None."""
    if layout not in LAYOUTS:
        return f"layout={layout!r} must be one of {LAYOUTS}"
    if data * fsdp * tensor != devices:
        return f"data={data} × fsdp={fsdp} × tensor={tensor} = {data * fsdp * tensor} does not equal the " \
               f"{devices} devices"
    if batch % (data * fsdp):
        return f"batch={batch} is not divisible by data × fsdp = {data * fsdp}"
    for name, v in (("hidden", hidden), ("ffn", ffn)):
        if v % (fsdp * tensor):
            return f"{name}={v} is not divisible by fsdp × tensor = {fsdp * tensor}"
    return None


def mlp_layout(data: int, fsdp: int, tensor: int, layout: str, batch: int, seq: int, hidden: int, ffn: int,
               dtype: str = "bfloat16", seed: int = 0) -> list[torch.Tensor]:
    """The MLP gelu(x A) B on a (data, fsdp, tensor) mesh of every device with a weight layout:

    - ``megatron``: A split by columns and B by rows over ``tensor`` (one all-reduce each way);
    - ``swapped``: A split by rows and B by columns (the contraction of x A is split: partial sums before GeLU).
    The other weight dimension is split over ``fsdp`` (gathered before use); the batch over ``data`` x ``fsdp``.
    Forward + backward of ½‖out − target‖² (notebook 02's step: the output gradient out − target depends on the
    forward, so the backward waits for it; a fixed random target); returns [out, grad x, grad A, grad B] (not
    synced)."""
    n = runtime.current().num_devices
    problem = layout_problem(data, fsdp, tensor, layout, batch, hidden, ffn, n)
    if problem:
        raise ValueError(problem)
    mesh = runtime.mesh((data, fsdp, tensor), ("data", "fsdp", "tensor"))
    g = torch.Generator().manual_seed(seed)
    dt, dev = getattr(torch, dtype), runtime.device()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        mlp = models.MLP(hidden, ffn, bias=False).to(dt)
    x = torch.randn(batch, seq, hidden, generator=g).to(dt)  # [b, s, h]
    target = torch.randn(batch, seq, hidden, generator=g).to(dt)  # [b, s, h]
    mlp = mlp.to(dev)
    # nn.Linear layout: fc1.weight = A^T [ffn, h], fc2.weight = B^T [h, ffn]
    if layout == "megatron":  # A columns (ffn) and B rows (ffn) on tensor; the h side on fsdp
        _mark(mlp.fc1.weight, mesh, ("tensor", "fsdp"))
        _mark(mlp.fc2.weight, mesh, ("fsdp", "tensor"))
    else:  # A rows (h) and B columns (h) on tensor; the ffn side on fsdp
        _mark(mlp.fc1.weight, mesh, ("fsdp", "tensor"))
        _mark(mlp.fc2.weight, mesh, ("tensor", "fsdp"))
    batch_axes = tuple(a for a, k in (("data", data), ("fsdp", fsdp)) if k > 1) or None
    x = _mark(x.to(dev), mesh, (batch_axes, None, None)).requires_grad_()  # a layer inside a network: dX needed
    target = _mark(target.to(dev), mesh, (batch_axes, None, None))
    out = mlp(x)  # [b, s, h]
    (0.5 * (out - target).pow(2).sum()).backward()
    return [out, x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad]
