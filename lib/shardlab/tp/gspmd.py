"""The same Megatron layers as GSPMD annotations: `mark_sharding` on the dense modules' weights.

Design note
-----------
No per-rank code here: we move a dense `shardlab.models` module to the XLA device, annotate its weights over
the `tensor` axis of a mesh, run the ordinary dense forward/backward, and let XLA's SPMD partitioner insert
the collectives — which `shardlab.profile.capture_hlo` then reads from the partitioned HLO.

Mesh: (data = num_devices / tp, tensor = tp).  Inputs are replicated, so the data axis only holds copies and
every collective runs within groups of tp devices.  Specs in nn.Linear layout (weight [out, in]):

    MLP          fc1.weight [ffn, h]  ("tensor", None)  fc1.bias ("tensor",)    column-parallel A
                 fc2.weight [h, ffn]  (None, "tensor")  fc2.bias replicated     row-parallel B
    Attention    q/k/v.weight [h, h]  ("tensor", None)  (heads stay whole: h/tp is a multiple of hd)
                 out.weight [h, h]    (None, "tensor")
                 Two details of `models.Attention` keep this at 1 + 1 all-reduces on both compilers (measured,
                 torch_xla 2.9, libtpu 0.0.21): Q/K/V come from ONE einsum with the stacked weights (three
                 separate projections, `SeparateQkvAttention`, gave XLA:CPU three backward all-reduces of the
                 input gradient, one per projection; XLA:TPU adds the three partial gradients first and issues
                 one), and the attention core uses einsum with (b, nh) as separate batch dims (`@` merges them;
                 a merged [b*nh] dim cannot be heads-sharded, and the partitioner all-gathered q, k and v).
    Embedding    weight [V, h]        ("tensor", None)  vocab rows split (uneven V: padded per device)
    logits       [b, s, V]            (None, None, "tensor")
    Block        `shard_transformer_block`: attention + MLP as above, LayerNorms replicated

The cross-entropy comes in two dense spellings (both torch's definition, with label smoothing and
ignore_index): `vocab_parallel_ce` writes the loss from row reductions (max, masked target-logit sum, sum of
exp, + sum of logits when smoothing) so the partitioner can keep the logits sharded and all-reduce [b, s]
values; `gathered_ce` first re-annotates the logits as replicated, which forces an all-gather.

Example::

    mesh = tensor_mesh(8)
    mlp = shard_mlp(models.MLP(256, 1024).to(runtime.device()), mesh)
    cap = capture_hlo(lambda: mlp(x))      # cap.module.count("all-reduce") == 1
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (by tp.case and the tests)

from shardlab import models, runtime
from shardlab.models import loss

AXIS = "tensor"


def tensor_mesh(tp: int) -> xs.Mesh:
    """Mesh (data = n / tp, tensor = tp) over all devices; errors name tp and the device count."""
    n = runtime.current().num_devices
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive int")
    if tp > n:
        raise ValueError(f"tp={tp} is larger than the device count num_devices={n}")
    if n % tp:
        raise ValueError(f"num_devices={n} is not divisible by tp={tp}")
    return runtime.mesh((n // tp, tp), ("data", AXIS))


def shard_mlp(mlp: models.MLP, mesh: xs.Mesh) -> models.MLP:
    xs.mark_sharding(mlp.fc1.weight, mesh, (AXIS, None))  # A columns -> [ffn/tp, h] per device
    if mlp.fc1.bias is not None:
        xs.mark_sharding(mlp.fc1.bias, mesh, (AXIS,))
    xs.mark_sharding(mlp.fc2.weight, mesh, (None, AXIS))  # B rows -> [h, ffn/tp] per device
    return mlp


def shard_attention(attn: models.Attention, mesh: xs.Mesh) -> models.Attention:
    tp = mesh.mesh_shape[mesh.get_axis_name_idx(AXIS)]
    if attn.heads % tp:
        raise ValueError(f"heads={attn.heads} is not divisible by tp={tp}")
    for lin in (attn.q, attn.k, attn.v):
        xs.mark_sharding(lin.weight, mesh, (AXIS, None))  # whole heads per device: [h/tp, h]
        if lin.bias is not None:
            xs.mark_sharding(lin.bias, mesh, (AXIS,))
    xs.mark_sharding(attn.out.weight, mesh, (None, AXIS))
    return attn


class SeparateQkvAttention(models.Attention):
    """`models.Attention` with Q, K and V as three separate projections (three nn.Linear calls) instead of the one
    stacked einsum — what notebook 03 compiles to show what each partitioner makes of three projections."""

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        q, k, v = (lin(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [b, s, h] -> [b, nh, s, hd]
                   for lin in (self.q, self.k, self.v))
        return q, k, v


def shard_params(module: torch.nn.Module, mesh: xs.Mesh, specs: dict[str, tuple]) -> torch.nn.Module:
    """Annotate ``module``'s parameters by name (``{"q.weight": ("tensor", None), ...}``); errors name the
    parameter."""
    names = dict(module.named_parameters())
    for name, spec in specs.items():
        if name not in names:
            raise ValueError(f"specs names {name!r}, which is not a parameter of {type(module).__name__} "
                             f"(its parameters: {sorted(names)})")
        xs.mark_sharding(names[name], mesh, tuple(spec))
    return module


def shard_embedding(emb: torch.nn.Embedding, mesh: xs.Mesh) -> torch.nn.Embedding:
    xs.mark_sharding(emb.weight, mesh, (AXIS, None))  # vocab rows
    return emb


def shard_logits(logits: torch.Tensor, mesh: xs.Mesh) -> torch.Tensor:
    xs.mark_sharding(logits, mesh, (None,) * (logits.dim() - 1) + (AXIS,))
    return logits


def shard_transformer_block(block: models.TransformerBlock, mesh: xs.Mesh) -> models.TransformerBlock:
    """Attention heads and the MLP's inner dimension over `tensor`; the LayerNorms stay replicated."""
    shard_attention(block.attn, mesh)
    shard_mlp(block.mlp, mesh)
    return block


def vocab_parallel_ce(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                      ignore_index: int = -100) -> torch.Tensor:
    """Per-token CE from row reductions only (torch's definition, global V): the partitioner keeps the
    vocab-sharded logits in place and all-reduces [b, s] partials — 3, or 4 with label smoothing."""
    v = logits.shape[-1]
    m = logits.max(dim=-1, keepdim=True).values.detach()  # [b, s, 1]   all-reduce max
    zs = logits - m  # [b, s, V]
    hit = torch.arange(v, device=logits.device) == target.unsqueeze(-1)  # [b, s, V] (no hit for ignore_index)
    zt = (zs * hit).sum(dim=-1)  # [b, s]   all-reduce sum
    loss = zs.exp().sum(dim=-1).log() - (1.0 - label_smoothing) * zt  # [b, s]   all-reduce sum (of exp)
    if label_smoothing > 0:
        loss = loss - label_smoothing / v * zs.sum(dim=-1)  # [b, s]   all-reduce sum (of logits)
    return loss.masked_fill(target == ignore_index, 0.0)


def gathered_ce(logits: torch.Tensor, target: torch.Tensor, mesh: xs.Mesh, label_smoothing: float = 0.0,
                ignore_index: int = -100) -> torch.Tensor:
    """Replicate the logits first (an all-gather of [b, s, V/tp] per device), then torch's cross-entropy."""
    full = logits * 1.0  # a new value to annotate
    xs.mark_sharding(full, mesh, (None,) * full.dim())
    return F.cross_entropy(full.flatten(0, 1), target.flatten(), reduction="none", label_smoothing=label_smoothing,
                           ignore_index=ignore_index).view_as(target)


def step(module: torch.nn.Module, x: torch.Tensor, target: torch.Tensor | None = None) -> list[torch.Tensor]:
    """One forward (+ backward of :func:`loss` against ``target``) on device tensors.  Returns [out, input grad,
    *parameter grads] — every tensor the step produces, as `capture_hlo` needs to identify the graph."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(target is not None and x.is_floating_point())
    out = module(x)
    if target is None:
        return [out]
    loss(out, target).backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return [out, *([x.grad] if x.grad is not None else []), *grads]
