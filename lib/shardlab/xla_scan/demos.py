"""``shard_as`` on its own.

Design note
-----------
``shard_as(a, b)`` (torch_xla, via JAX's ``shard_alike``) says "a and b end up sharded the same way" without
naming a sharding: the partitioner picks one (here: ``a``'s, since ``a`` is annotated and ``b`` is not).
That is exactly what ``Scan.backward`` needs — the gradient of layer i must be sharded like layer i's
weight, whatever that is. (The ``nn.Linear`` flattening trap has views of its own: ``views.linear_trap``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlab import runtime
from shardlab.profile import capture_hlo
from shardlab.xla_scan import sharding as S


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
