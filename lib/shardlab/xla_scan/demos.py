"""Two small demos: ``shard_as`` on its own, and the ``nn.Linear`` flattening trap vs einsum.

Design note
-----------
``shard_as(a, b)`` (torch_xla, via JAX's ``shard_alike``) says "a and b end up sharded the same way" without
naming a sharding: the partitioner picks one (here: ``a``'s, since ``a`` is annotated and ``b`` is not).
That is exactly what ``Scan.backward`` needs — the gradient of layer i must be sharded like layer i's
weight, whatever that is.

The flattening trap: ``F.linear(x, W)`` on ``x: [B, S, H]`` lowers to ``reshape -> [B·S, H]``, a 2-D dot,
``reshape`` back.  If x is sharded on *two* leading dims (``x[B_fsdp, S_tensor, H]``), the merged ``B·S``
dim cannot carry both tilings, so the partitioner all-gathers S and every device computes 4× the rows.
torch_xla's ``XLAPatchedLinear`` uses ``einsum('...n,mn->...m')``: a 3-D dot that keeps both shardings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardlab import runtime
from shardlab.profile import capture_hlo
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.patches import lowered_hlo


@dataclass
class ShardAsDemo:
    a_spec: str  # the annotated tensor
    b_spec_without: str  # b computed on its own (no annotation, no shard_as)
    b_spec_with: str  # b after shard_as(a, b)


def shard_as_demo(mesh_fsdp: int, mesh_tensor: int, rows: int = 16, cols: int = 32) -> ShardAsDemo:
    """``a[rows_fsdp, cols_tensor]`` annotated, ``b = 2·ones`` not; after ``shard_as(a, b)`` b is tiled like a."""
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.spmd.xla_sharding import shard_as

    for name, size, n in (("rows", rows, mesh_fsdp), ("cols", cols, mesh_tensor)):
        if size % n:
            raise ValueError(f"{name}={size} is not divisible by the mesh axis size {n}")
    mesh = S.make_mesh(mesh_fsdp, mesh_tensor)
    dev = runtime.device()
    a = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols).to(dev)  # [rows, cols]
    xs.mark_sharding(a, mesh, ("fsdp", "tensor"))
    ones = torch.ones(rows, cols).to(dev)

    without = capture_hlo(lambda: [ones * 2.0]).result[0]
    with_ = capture_hlo(lambda: list(shard_as(a, ones * 2.0))).result[1]
    return ShardAsDemo(S.spec_of(a), S.spec_of(without), S.spec_of(with_))


@dataclass
class LinearTrap:
    kind: str  # "linear" (F.linear) or "einsum" (torch_xla XLAPatchedLinear)
    dot_before: str  # the dot's operand shapes in the pre-partitioning HLO (global shapes)
    dot_per_device: str  # the dot's operand shapes in the partitioned per-device HLO
    out_spec: str  # sharding of the [B, S, O] output
    collectives: dict[str, dict[str, int]]  # per-device collectives in the partitioned HLO


def _dot_shapes(m: Any) -> str:
    dots = [i for i in m.instructions.values() if i.opcode == "dot"]
    return "; ".join(
        " x ".join(str(a) for o in d.operands if o in m.instructions for a in m.instructions[o].shape)
        + " -> " + " ".join(str(a) for a in d.shape) for d in dots)


def linear_trap(mesh_fsdp: int, mesh_tensor: int, batch: int, seq: int, hidden: int, out: int) -> list[LinearTrap]:
    """``x[B_fsdp, S_tensor, H] · W[O, H]ᵀ`` with ``F.linear`` and with the einsum patch; HLO shapes of both."""
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.spmd.xla_sharding import XLAPatchedLinear

    for name, size, axis, n in (("batch", batch, "fsdp", mesh_fsdp), ("seq", seq, "tensor", mesh_tensor)):
        if size % n:
            raise ValueError(f"{name}={size} is not divisible by {axis}={n} (it is sharded over {axis})")
    mesh = S.make_mesh(mesh_fsdp, mesh_tensor)
    dev = runtime.device()
    g = torch.Generator().manual_seed(0)
    results = []
    for kind in ("linear", "einsum"):
        x = torch.randn(batch, seq, hidden, generator=g).to(dev)  # [B, S, H]
        xs.mark_sharding(x, mesh, ("fsdp", "tensor", None))
        w = torch.randn(out, hidden, generator=g).to(dev)  # [O, H], replicated
        if kind == "linear":
            def fn(x: torch.Tensor = x, w: torch.Tensor = w) -> list[torch.Tensor]:
                return [torch.nn.functional.linear(x, w)]  # reshape [B·S, H] · [H, O] -> [B, S, O]
        else:
            def fn(x: torch.Tensor = x, w: torch.Tensor = w) -> list[torch.Tensor]:
                return [XLAPatchedLinear.apply(x, w, None)]  # einsum [B,S,H] · [O,H] -> [B,S,O]
        before = [ln.strip() for ln in lowered_hlo(fn()).splitlines() if " dot(" in ln]
        cap = capture_hlo(fn)
        dot_before = before[0].split(" dot(")[1].split(")")[0] if before else ""
        results.append(LinearTrap(kind, dot_before, _dot_shapes(cap.module), S.spec_of(cap.result[0]),
                                  cap.module.summary()))
    return results
