"""PyTorch's own FSDP as the reference: FSDP1 (one FlatParameter per unit) and FSDP2 (``fully_shard``, per-parameter).

Design note
-----------
Module-level per-rank programs for ``shardlab.comm.DistributedWorld`` (gloo, CPU): the worker has already
joined the default process group, so PyTorch FSDP just uses it; ``comm`` only supplies rank and world size.
Each takes notebook 05's case (:class:`shardlab.fsdp.train.FlatCase`). With ``case.nested`` the first Linear
becomes its own (inner, non-root) unit and the root unit keeps the rest — ``FSDP(model[0])`` then ``FSDP(model)`` /
``fully_shard(model[0])`` then ``fully_shard(model)``, what an auto-wrap policy does.

* ``torch_fsdp1_program`` wraps ``case.model()`` in ``FullyShardedDataParallel``, trains ``p.steps``
  steps on this rank's rows with ``torch.optim`` and returns the root's local shard plus its metadata —
  directly comparable with ``FlatUnit``'s shard — and every collective it issued.
* ``torch_fsdp2_program`` applies ``fully_shard``, returns per parameter the local (unpadded) and padded
  shard shapes — FSDP2 shards each parameter on dim 0 with ``torch.chunk`` semantics and pads dim 0 to
  ceil(d0 / N), the same per-parameter rule as GSPMD's dim-0 sharding
  (``shardlab.formulas.fsdp.per_param_shard``) — and the collectives of the same training run.

Collectives are recorded by :func:`logged_collectives`, which wraps the ``torch.distributed`` functions FSDP
calls (``all_gather`` — FSDP1 on gloo gathers into a list —, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_reduce``, ``broadcast``) for the duration of a block and writes one
``LedgerEntry`` per call in our own vocabulary (op, payload = the tensor this rank hands over, phase), so a
test compares PyTorch's list with our ledger row by row.
"""

from __future__ import annotations

import copy
import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._flat_param import FlatParamHandle, HandleShardingStrategy
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlab.comm import Comm, Ledger, LedgerEntry, current_phase, ring_wire_bytes
from shardlab.comm.ledger import dtype_name
from shardlab.fsdp.train import INNER, FlatCase, check_world
from shardlab.profile.stderr_filter import filtered_stderr

if TYPE_CHECKING:  # a rank unpickles this module: it imports no more than it needs
    from shardlab.core.case import Program

# torch.distributed function -> (our op name, how to find the tensor this rank hands over)
_LOGGED = {
    "all_gather": ("all_gather", lambda a, k: a[1] if len(a) > 1 else k["tensor"]),
    "all_gather_into_tensor": ("all_gather", lambda a, k: a[1] if len(a) > 1 else k["input_tensor"]),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: a[1] if len(a) > 1 else k["input"]),
    "all_reduce": ("all_reduce", lambda a, k: a[0] if a else k["tensor"]),
    "broadcast": ("broadcast", lambda a, k: a[0] if a else k["tensor"]),
}


@contextmanager
def logged_collectives(world_size: int) -> Iterator[Ledger]:
    """Record every collective PyTorch issues through ``torch.distributed`` inside the block, as a Ledger."""
    ledger = Ledger()
    originals = {name: getattr(dist, name) for name in _LOGGED}

    def wrap(name: str) -> Any:
        op, find = _LOGGED[name]
        fn = originals[name]

        def logged(*args: Any, **kwargs: Any) -> Any:
            t = find(args, kwargs)
            payload = t.numel() * t.element_size()
            ledger.append(LedgerEntry(len(ledger), op, world_size, dtype_name(t.dtype), tuple(t.shape), payload,
                                      ring_wire_bytes(op, payload, world_size), current_phase(), tag=name))
            return fn(*args, **kwargs)

        return logged

    for name in _LOGGED:
        setattr(dist, name, wrap(name))
    try:
        yield ledger
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _train(comm: Comm, case: FlatCase, model: nn.Module) -> None:
    opt = (torch.optim.Adam(model.parameters(), lr=case.lr) if case.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=case.lr))
    rows = case.p.batch // comm.world_size
    for step in range(case.p.steps):
        x, y = case.batch(step)
        sl = slice(comm.rank * rows, (comm.rank + 1) * rows)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        opt.step()


def torch_fsdp1_program(comm: Comm, case: FlatCase) -> dict[str, Any]:
    check_world(comm, case)
    model = case.model()
    kw = dict(device_id=torch.device("cpu"), use_orig_params=case.p.align)
    if case.nested:
        model[int(INNER)] = FSDP(model[int(INNER)], **kw)
    model = FSDP(model, **kw)
    fp = model._handle.flat_param  # this rank's shard of the root's FlatParameter, [c]
    meta = {
        "shard_numel": fp.numel(),
        "numel_padded": fp._shard_numel_padded,
        "flat_numel": fp._unpadded_unsharded_size.numel(),
        "infos": [tuple(i) for i in fp._shard_param_infos],
    }
    with logged_collectives(comm.world_size) as ledger:
        _train(comm, case, model)
    meta["shard"] = model._handle.flat_param.detach().clone()
    meta["collectives"] = ledger.to_records()
    return meta


def torch_fsdp2_program(comm: Comm, case: FlatCase) -> dict[str, Any]:
    check_world(comm, case)
    mesh = init_device_mesh("cpu", (comm.world_size,))
    model = case.model()
    names = {id(p): n for n, p in model.named_parameters()}
    if case.nested:
        fully_shard(model[int(INNER)], mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = []
    for module in (model[int(INNER)], model) if case.nested else (model,):
        for fsdp_param in module._get_fsdp_state()._fsdp_param_group.fsdp_params:
            params.append({
                "orig_shape": tuple(fsdp_param._orig_size),
                "local_shape": tuple(fsdp_param.sharded_param.to_local().shape),  # unpadded
                "padded_shape": tuple(fsdp_param.padded_sharded_param_size),
                "name": names.get(id(fsdp_param.sharded_param), ""),
            })
    with logged_collectives(comm.world_size) as ledger:
        _train(comm, case, model)
    return {"params": params, "collectives": ledger.to_records()}


def torch_fsdp_both_program(comm: Comm, case: FlatCase) -> tuple[dict[str, Any], dict[str, Any]]:
    """FSDP1 then FSDP2 in the same processes: one spawn instead of two (process start-up dominates)."""
    return torch_fsdp1_program(comm, case), torch_fsdp2_program(comm, case)


@dataclass(frozen=True)
class TorchFsdpCase(FlatCase):
    """A :class:`FlatCase` whose real-process run (``shardlab.core.harness.gloo``) also trains the same model with
    PyTorch's FSDP1 and FSDP2, in the same gloo processes right after FlatUnit: the framework's own implementation
    as the case's reference program. It lives here, not beside the notebook's helpers, because each rank unpickles
    the case by its module and this one imports no torch_xla."""

    def reference_program(self) -> Program:
        return (torch_fsdp_both_program, (self,))


def flat_param_handle_shards(module: nn.Module, world_size: int, use_orig_params: bool = False) -> list[dict[str, Any]]:
    """PyTorch's own ``FlatParamHandle`` for every rank of ``world_size``, built on a *fake* process group (no
    communication: the handle only reads rank and world size) and sharded: per rank its shard numel, zero
    padding, the padded segment numels of the unsharded flat parameter and the in-shard ``_ShardParamInfo``s
    ``{param_index: (offset_in_shard, numel_in_shard, intra_start, intra_end)}`` — directly comparable with
    ``shardlab.fsdp.flat_param.plan_flat_shards_for(module, world_size, use_orig_params)``."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised here: the fake group needs the default slot")
    out = []
    # The handle re-views the module's parameters; freeing it makes PyTorch warn "Deallocating Tensor that still
    # has live PyObject references" — from C++ straight to stderr, once per rank (harmless: nothing is used
    # afterwards). Free it here, with that one message filtered.
    notice = "Deallocating Tensor that still has live PyObject"
    with warnings.catch_warnings(), filtered_stderr(lambda line: notice in line):
        warnings.filterwarnings("ignore", message="Deallocating Tensor")
        for rank in range(world_size):
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            try:
                m = copy.deepcopy(module)
                h = FlatParamHandle(list(m.parameters()), m, torch.device("cpu"), HandleShardingStrategy.FULL_SHARD,
                                    False, None, None, False, dist.group.WORLD, use_orig_params)
                h.shard()
                fp = h.flat_param
                out.append({
                    "shard_numel": fp.numel(),
                    "numel_padded": fp._shard_numel_padded,
                    "segments": list(fp._numels_with_padding),
                    "infos": {i: tuple(info)[1:] for i, info in enumerate(fp._shard_param_infos) if info.in_shard},
                })
                del m, h, fp
                gc.collect()
            finally:
                dist.destroy_process_group()
    return out
