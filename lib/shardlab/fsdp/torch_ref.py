"""PyTorch's own FSDP as the reference: FSDP1 (one FlatParameter) and FSDP2 (``fully_shard``, per-parameter).

Design note
-----------
Module-level per-rank programs for ``shardlab.comm.DistributedWorld`` (gloo, CPU): the worker has already
joined the default process group, so PyTorch FSDP just uses it; ``comm`` only supplies rank and world size.

* ``torch_fsdp1_program`` wraps ``make_model(cfg)`` in ``FullyShardedDataParallel`` (one root unit -> one
  FlatParameter), trains ``cfg.steps`` steps on this rank's rows with ``torch.optim`` (SGD/Adam on the flat
  shard) and returns the local shard plus its metadata — directly comparable with ``FlatUnit``'s shard.
* ``torch_fsdp2_program`` applies ``fully_shard`` and returns, per parameter, the local (unpadded) shard
  shape and the padded shard shape: FSDP2 shards each parameter on dim 0 with ``torch.chunk`` semantics
  and pads dim 0 to ceil(d0 / W) — the same per-parameter rule as GSPMD's dim-0 sharding
  (``shardlab.formulas.fsdp.per_param_shard``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardlab.comm import Comm
from shardlab.fsdp.train import TrainConfig, make_batch, make_model


def torch_fsdp1_program(comm: Comm, cfg: TrainConfig) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    cfg.validate(comm.world_size)
    model = FSDP(make_model(cfg), device_id=torch.device("cpu"), use_orig_params=cfg.use_orig_params)
    fp = model._handle.flat_param  # this rank's shard of the one FlatParameter, (c,)
    meta = {
        "shard_numel": fp.numel(),
        "numel_padded": fp._shard_numel_padded,
        "flat_numel": fp._unpadded_unsharded_size.numel(),
        "infos": [tuple(i) for i in fp._shard_param_infos],
    }
    opt = (torch.optim.Adam(model.parameters(), lr=cfg.lr) if cfg.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=cfg.lr))
    rows = cfg.batch // comm.world_size
    for step in range(cfg.steps):
        x, y = make_batch(cfg, step)
        sl = slice(comm.rank * rows, (comm.rank + 1) * rows)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        opt.step()
    meta["shard"] = model._handle.flat_param.detach().clone()
    return meta


def torch_fsdp2_program(comm: Comm, cfg: TrainConfig) -> list[dict[str, Any]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cfg.validate(comm.world_size)
    mesh = init_device_mesh("cpu", (comm.world_size,))
    model = make_model(cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    fully_shard(model, mesh=mesh)
    out = []
    for fsdp_param in model._get_fsdp_state()._fsdp_param_group.fsdp_params:
        out.append({
            "orig_shape": tuple(fsdp_param._orig_size),
            "local_shape": tuple(fsdp_param.sharded_param.to_local().shape),  # unpadded
            "padded_shape": tuple(fsdp_param.padded_sharded_param_size),
            "name": names.get(id(fsdp_param.sharded_param), ""),
        })
    return out


def torch_fsdp_both_program(comm: Comm, cfg: TrainConfig) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """FSDP1 then FSDP2 in the same processes: one spawn instead of two (process start-up dominates)."""
    return torch_fsdp1_program(comm, cfg), torch_fsdp2_program(comm, cfg)
