"""Small graph builders for the TPU compile tests (module-level, so the TPU compile worker can import them).

Each ``build(cfg)`` sets up its mesh on the current device world (all devices on one axis) and returns every
tensor the step produces, as ``compile_tensors`` / ``compile_program`` expect.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MlpCfg:
    tokens: int = 64  # b*s
    hidden: int = 256
    ffn: int = 1024
    dtype: str = "float32"


def _mesh(axis: str):  # type: ignore[no-untyped-def]
    from shardlab import runtime

    return runtime.mesh(runtime.current().num_devices, axis)


def megatron_mlp(cfg: MlpCfg) -> list[torch.Tensor]:
    """y = gelu(x @ W1) @ W2, x [tokens, h] replicated, W1 [h, ffn] by columns, W2 [ffn, h] by rows;
    backward of y.sum(). Returns [y, dx, dW1, dW2]."""
    import torch_xla.distributed.spmd as xs

    mesh, dt = _mesh("model"), getattr(torch, cfg.dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, dtype=dt).to("xla").requires_grad_()
    w1 = torch.randn(cfg.hidden, cfg.ffn, dtype=dt).to("xla").requires_grad_()
    w2 = torch.randn(cfg.ffn, cfg.hidden, dtype=dt).to("xla").requires_grad_()
    xs.mark_sharding(w1, mesh, (None, "model"))
    xs.mark_sharding(w2, mesh, ("model", None))
    y = torch.nn.functional.gelu(x @ w1) @ w2  # [tokens, h] @ [h, ffn/tp] -> [tokens, ffn/tp] @ [ffn/tp, h]
    y.sum().backward()
    return [y, x.grad, w1.grad, w2.grad]


def data_parallel_step(cfg: MlpCfg) -> list[torch.Tensor]:
    """4 replicated [h, h] weights, x [tokens, h] sharded by rows: 4 weight gradients to all-reduce."""
    import torch_xla.distributed.spmd as xs

    mesh, dt = _mesh("data"), getattr(torch, cfg.dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, dtype=dt).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    ws = [torch.randn(cfg.hidden, cfg.hidden, dtype=dt).to("xla").requires_grad_() for _ in range(4)]
    y = x
    for w in ws:
        y = torch.tanh(y @ w)  # [tokens/n, h] per device
    y.sum().backward()
    return [w.grad for w in ws]


def zero3_step(cfg: MlpCfg) -> list[torch.Tensor]:
    """2 [h, h] weights sharded by rows (ZeRO-3 / FSDP), x sharded by rows; gradients kept sharded like the
    weights: forward all-gathers the weights, backward reduce-scatters the gradients."""
    import torch_xla.distributed.spmd as xs

    mesh, dt = _mesh("data"), getattr(torch, cfg.dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, dtype=dt).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    ws = [torch.randn(cfg.hidden, cfg.hidden, dtype=dt).to("xla").requires_grad_() for _ in range(2)]
    for w in ws:
        xs.mark_sharding(w, mesh, ("data", None))
    y = x
    for w in ws:
        y = torch.tanh(y @ w)
    y.sum().backward()
    grads = [w.grad for w in ws]
    for g in grads:
        xs.mark_sharding(g, mesh, ("data", None))
    return grads


def _placeholder(*shape: int) -> torch.Tensor:
    from torch_xla.core.xla_builder import create_placeholder_tensor

    return create_placeholder_tensor(shape, torch.float32)  # allocates nothing; lowers to a parameter


def big_argument(gib: int) -> list[torch.Tensor]:
    """One f32 placeholder argument of ``gib`` GiB (replicated: ``gib`` GiB per chip), summed."""
    return [_placeholder(gib * 2**18, 1024).sum()]  # [gib * 2^18, 1024] f32 = gib GiB


def many_outputs(n: int) -> list[torch.Tensor]:
    """A 1 GiB argument and ``n`` distinct 1 GiB outputs (a * 2, a * 3, ...)."""
    a = _placeholder(2**18, 1024)  # f32: 1 GiB
    return [a * (i + 2) for i in range(n)]


def big_temporary() -> list[torch.Tensor]:
    """gelu(x @ W) @ W^T with x [2^17, 1024], W [1024, 32768] f32: the hidden activation is a 16 GiB temporary."""
    x, w = _placeholder(2**17, 1024), _placeholder(1024, 32768)
    return [torch.nn.functional.gelu(x @ w) @ w.T]  # [131072, 32768] (16 GiB) -> [131072, 1024]


def mlp_replicated_grads(cfg: MlpCfg) -> list[torch.Tensor]:
    """Mesh (data n/4, tensor 4); W1 [ffn, h] by rows, W2 [h, ffn] by columns (nn.Linear layout), x replicated;
    backward of y.sum() with both weight gradients annotated *replicated*: the TPU program all-gathers them."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime

    n = runtime.current().num_devices
    mesh = xs.Mesh(np.arange(n), (n // 4, 4), ("data", "tensor"))
    dt = getattr(torch, cfg.dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, dtype=dt).to("xla")
    w1 = torch.randn(cfg.ffn, cfg.hidden, dtype=dt).to("xla").requires_grad_()
    w2 = torch.randn(cfg.hidden, cfg.ffn, dtype=dt).to("xla").requires_grad_()
    xs.mark_sharding(w1, mesh, ("tensor", None))
    xs.mark_sharding(w2, mesh, (None, "tensor"))
    y = torch.nn.functional.gelu(x @ w1.T) @ w2.T  # [tokens, h] @ [h, ffn/4] -> [tokens, ffn/4] @ [ffn/4, h]
    y.sum().backward()
    grads = [w1.grad, w2.grad]
    for g in grads:
        xs.mark_sharding(g, mesh, (None, None))
    return [y, *grads]


def roll_rows(cfg: MlpCfg) -> list[torch.Tensor]:
    """torch.roll by one row of x [tokens, h] sharded by rows: a halo exchange (collective-permute)."""
    import torch_xla.distributed.spmd as xs

    mesh, dt = _mesh("data"), getattr(torch, cfg.dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, dtype=dt).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    return [torch.roll(x, shifts=1, dims=0) * 2]


def scan_stack(cfg: MlpCfg) -> list[torch.Tensor]:
    """The scan helper's stack (2 MLP blocks through torch_xla's ``scan``), mesh (fsdp 2, tensor 4), fwd + bwd:
    the collectives sit inside the forward and backward ``while`` bodies."""
    from shardlab import runtime
    from shardlab.xla_scan import model as M
    from shardlab.xla_scan import sharding as S

    mesh = S.make_mesh(2, 4)
    model = M.build("scan", M.init_weights(2, cfg.hidden, cfg.ffn), annotate=S.annotator(mesh), device=runtime.device())
    S.shard_model(model, mesh)
    x = M.init_input(4, 16, cfg.hidden).to(runtime.device())  # [B, S, H]
    S.shard_input(x, mesh)
    x.requires_grad_(True)
    out = model(x)
    M.loss_fn(out).backward()
    return [out, x.grad, *[w.grad for ws in model.weights().values() for w in ws]]  # type: ignore[operator]


@dataclass(frozen=True)
class UpdateCfg:
    rows: int = 1024  # W [rows, cols] f32, sharded by rows over all devices
    cols: int = 512
    tokens: int = 64


def momentum_update(cfg: UpdateCfg):  # type: ignore[no-untyped-def]
    """A momentum-SGD step on placeholder state: m' = 0.9·m + g, W' = W - 0.01·m' with g = dL/dW of
    tanh(x @ W).sum(). Returns a ``tpu.Step``: output 1 (W') donated into W's buffer, output 2 (m') into m's —
    torch_xla's in-place update. W and m are placeholders (graph parameters); their products carry the sharding."""
    import torch_xla.distributed.spmd as xs

    from shardlab.profile.tpu import Step

    mesh = _mesh("fsdp")
    w, m = _placeholder(cfg.rows, cfg.cols), _placeholder(cfg.rows, cfg.cols)
    ws, ms = w * 1, m * 1
    for t in (ws, ms):
        xs.mark_sharding(t, mesh, ("fsdp", None))
    ws.requires_grad_(True)
    x = torch.randn(cfg.tokens, cfg.rows).to("xla")
    loss = torch.tanh(x @ ws).sum()  # [tokens, rows] @ [rows, cols]
    (g,) = torch.autograd.grad(loss, [ws])
    new_m = 0.9 * ms + g
    new_w = ws.detach() - 0.01 * new_m
    for t in (new_w, new_m):
        xs.mark_sharding(t, mesh, ("fsdp", None))
    return Step([loss, new_w, new_m], {1: w, 2: m})


def sort_temporary(arg_mib: int) -> list[torch.Tensor]:
    """One chip: an ``arg_mib`` MiB f32 argument (only 8 elements read) and a bf16 [2^18, 1024] argument sorted by
    rows — the sort's result is a 512 MiB temporary (its first 8 columns summed)."""
    a = _placeholder(arg_mib * 2**18)  # arg_mib MiB of f32
    x = create_bf16(2**18, 1024)  # 512 MiB
    s = torch.sort(x, dim=1).values
    return [a[:8].sum(), s[:, :8].float().sum()]


def create_bf16(*shape: int) -> torch.Tensor:
    from torch_xla.core.xla_builder import create_placeholder_tensor

    return create_placeholder_tensor(shape, torch.bfloat16)
