"""Megatron's communication operators as autograd functions over a `Comm`.

Design note
-----------
The raw collectives in `shardlab.comm` are not differentiable; each operator here pairs a forward collective
with the backward collective the chain rule demands (Shoeybi et al. 2019, Fig. 3; Korthikanti et al. 2022 for
the sequence-parallel pair).  Every one returns its input unchanged at world size 1 (and records nothing).

    f        copy_to_tp_region             forward: identity          backward: all-reduce
    g        reduce_from_tp_region         forward: all-reduce        backward: identity
             gather_from_tp_region         forward: all-gather(-1)    backward: keep own chunk of the last dim
             scatter_to_tp_region          forward: keep own chunk    backward: all-gather(-1)
    g_sp     gather_from_sp_region(dim)    forward: all-gather(dim)   backward: reduce-scatter(dim)
    gbar_sp  reduce_scatter_to_sp_region   forward: reduce-scatter    backward: all-gather(dim)

The paper draws the two sequence-parallel operators as g (g_sp here, it replaces f: all-gather before a
column-parallel layer) and g with a bar (gbar_sp, it replaces g: reduce-scatter after a row-parallel layer).

f sits where a replicated activation enters a column-parallel layer: every rank uses the whole input, so the
input's gradient is the sum of the ranks' partial gradients.  g sits where a row-parallel layer's partial sums
leave: the forward needs the sum, and the sum's gradient is the same on every rank.  Ledger tags name the
operator ("f", "g", "gather", "scatter", "sp.gather", "sp.reduce_scatter").  The column-parallel layer of
Megatron's sequence parallelism does not use g_sp as an autograd op: it keeps only the s/p shard for its
backward and all-gathers it again there ("sp.regather", `shardlab.tp.layers.ColumnParallelLinear`).

Example (`ones * rank`, W = 4)::

    world.run(lambda c: g(torch.ones(2) * c.rank, c))   # every rank: tensor([6., 6.])
"""

from __future__ import annotations

import torch

from shardlab.comm import Comm


def _own_chunk(x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
    size = x.shape[dim]
    if size % comm.world_size:
        raise ValueError(f"size {size} of dim {dim} (shape {tuple(x.shape)}) is not divisible by tp={comm.world_size}")
    return x.chunk(comm.world_size, dim=dim)[comm.rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad, tag="f"), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        return comm.all_reduce(x, tag="g")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_gather(x, dim=-1, tag="gather")

    @staticmethod
    def backward(ctx, grad):
        return _own_chunk(grad, ctx.comm, -1), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _own_chunk(x, comm, -1)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_gather(grad, dim=-1, tag="scatter"), None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return comm.all_gather(x, dim=dim, tag="sp.gather")

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.reduce_scatter(grad, dim=ctx.dim, tag="sp.gather"), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return comm.reduce_scatter(x, dim=dim, tag="sp.reduce_scatter")

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_gather(grad, dim=ctx.dim, tag="sp.reduce_scatter"), None, None


def copy_to_tp_region(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """f: forward identity, backward all-reduce."""
    return x if comm.world_size == 1 else _CopyToTP.apply(x, comm)


def reduce_from_tp_region(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """g: forward all-reduce (sum), backward identity."""
    return x if comm.world_size == 1 else _ReduceFromTP.apply(x, comm)


def gather_from_tp_region(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Forward all-gather along the last dim, backward keep this rank's chunk."""
    return x if comm.world_size == 1 else _GatherFromTP.apply(x, comm)


def scatter_to_tp_region(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Forward keep this rank's chunk of the last dim, backward all-gather."""
    return x if comm.world_size == 1 else _ScatterToTP.apply(x, comm)


def gather_from_sp_region(x: torch.Tensor, comm: Comm, dim: int = 1) -> torch.Tensor:
    """g_sp — sequence parallel: forward all-gather along `dim` (seq), backward reduce-scatter."""
    return x if comm.world_size == 1 else _GatherFromSP.apply(x, comm, dim)


def reduce_scatter_to_sp_region(x: torch.Tensor, comm: Comm, dim: int = 1) -> torch.Tensor:
    """gbar_sp — sequence parallel: forward reduce-scatter along `dim` (seq), backward all-gather."""
    return x if comm.world_size == 1 else _ReduceScatterToSP.apply(x, comm, dim)


f = copy_to_tp_region
g = reduce_from_tp_region
