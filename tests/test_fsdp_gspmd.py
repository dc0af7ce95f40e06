"""Per-parameter FSDP on XLA SPMD: collectives read from the partitioned HLO vs the per-parameter algebra.

Oracle: ``per_param_step_bytes`` — padded dim-0 shards gathered in forward, the weights autograd reads for dX
gathered in backward, full gradients reduce-scattered — derived by hand (module note), compared exactly.
On CPU a reduce-scatter is emitted as all-reduce + dynamic-slice; the step counts each such all-reduce once.
The two programs are captured by the harness (``GspmdCase``: forward, then backward + SGD update); their
operands are classified here again (``gspmd.moved_operands``) and the updated parameters compared with one
unsharded SGD step written out here.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from shardlab.core import harness
from shardlab.formulas.fsdp import StepBytes, flat_step_comm, per_param_shard, per_param_step_bytes
from shardlab.fsdp import gspmd
from shardlab.fsdp.case import GspmdCase, step_operands
from shardlab.fsdp.flat_param import plan_flat_shards_for
from shardlab.fsdp.params import FsdpGspmdParams
from shardlab.fsdp.train import LR, make_batch, make_model
from shardlab.profile.hlo import HloModule


def backward_needed(model: nn.Module) -> list[bool]:
    """Which parameters backward reads for dX: weights of every Linear but the first (whose input is data)."""
    out, first = [], True
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            out.append(not first)
            if mod.bias is not None:
                out.append(False)
            first = False
    return out


class Step(NamedTuple):
    p: FsdpGspmdParams
    forward: HloModule
    backward: HloModule
    measured: StepBytes
    moved: list[gspmd.Moved]
    loss: float
    updated: list[torch.Tensor]
    values: dict[str, Any]


def _step(layer_sizes: tuple[int, ...], batch: int, world_size: int, wrapper: str = "mark_sharding") -> Step:
    """The harness's CPU compiler view of one GSPMD step, with both programs' modules and outputs."""
    case = GspmdCase(FsdpGspmdParams(world_size=world_size, layer_sizes=layer_sizes, batch=batch), wrapper)
    view = harness.hlo(case)
    fwd, bwd = view.parts  # the two captures, in program order
    moved = step_operands({"forward": fwd.module, "backward": bwd.module})
    n = 2 * (len(layer_sizes) - 1)  # the backward program returns [updated weights and biases, their grads]
    return Step(case.p, fwd.module, bwd.module, gspmd.step_bytes(moved), moved, float(fwd.result[0].detach().cpu()),
                [t.detach().cpu() for t in bwd.result[:n]], view.values)


def _unsharded_sgd(p: FsdpGspmdParams) -> tuple[nn.Module, torch.Tensor]:
    """The oracle for the hand-written FSDP backward: the unsharded model after loss.backward() (grads set)."""
    model = make_model(p)
    x, y = make_batch(p, 0)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return model, loss


def test_per_param_shard_is_torch_chunk_on_dim0() -> None:
    for d0 in range(1, 20):
        for w in range(1, 9):
            chunks = torch.zeros(d0, 3).chunk(w)
            for r in range(w):
                local, padded = per_param_shard((d0, 3), w, r)
                assert local == (tuple(chunks[r].shape) if r < len(chunks) else (0, 3))
                assert padded == tuple(chunks[0].shape)


@pytest.mark.xla
@pytest.mark.parametrize(("layer_sizes", "batch", "world_size"),
                         [((16, 32, 8), 64, 8), ((12, 20, 6), 32, 8), ((16, 32, 32, 8), 32, 4)])
def test_hlo_matches_per_param_formula(xla_world, layer_sizes, batch, world_size) -> None:  # type: ignore[no-untyped-def]
    step = _step(layer_sizes, batch, world_size)
    model = make_model(step.p)
    expect = per_param_step_bytes([tuple(p.shape) for p in model.parameters()], world_size,
                                  backward_needed(model), elem_bytes=4)
    assert step.measured == expect
    assert sum(m.nbytes for m in step.moved if m.kind == "other") == 4  # the scalar loss mean, f32
    for c in step.forward.collectives + step.backward.collectives:
        assert c.group_size == world_size
    # the flat design moves c·b twice; per-parameter padding can only add rows, never remove elements
    flat = flat_step_comm(plan_flat_shards_for(model, world_size).flat_numel, world_size)
    assert step.measured.reduce_scatter == sum(p.numel() for p in model.parameters()) * 4
    assert step.measured.all_gather_forward >= flat.all_gather_payload_bytes - 4 * (world_size - 1)
    model, _ = _unsharded_sgd(step.p)  # the hand-written FSDP backward vs torch autograd on the unsharded model
    for got, p in zip(step.updated, model.parameters(), strict=True):
        assert torch.allclose(got, (p - LR * p.grad).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.xla
@pytest.mark.parametrize("world_size", [1, 2])
def test_hlo_matches_per_param_formula_small_world(xla_world, world_size) -> None:  # type: ignore[no-untyped-def]
    """W=1: nothing sharded, no collective at all. W=2 on 8 devices (replica axis 4): the explicit unshard and
    reduce-scatter constraints keep the partitioner on FSDP (parameter-only annotations gave collective-permutes)."""
    step = _step((12, 20, 6), 16, world_size)
    model = make_model(step.p)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert step.measured == per_param_step_bytes(shapes, world_size, backward_needed(model), elem_bytes=4)
    assert not any(m.kind == "resharding" for m in step.moved)  # no collective-permute / all-to-all: FSDP's algorithm
    assert "step.resharding.bytes" not in step.values
    if world_size == 1:
        assert step.forward.collectives == [] and step.backward.collectives == []
        assert step.measured.total == 0
    else:  # independent of the formula code: shards of d0/2 rows gathered, full gradients reduced, groups of 2
        assert step.measured.all_gather_forward == sum(p.numel() for p in model.parameters()) * 4 // 2
        assert step.measured.reduce_scatter == sum(p.numel() for p in model.parameters()) * 4
        assert all(c.group_size == 2 for c in step.forward.collectives + step.backward.collectives)
    # oracle for the hand-written FSDP backward: one unsharded SGD step with torch autograd
    model, ref = _unsharded_sgd(step.p)
    assert step.loss == pytest.approx(float(ref.detach()), rel=1e-5)
    for got, p in zip(step.updated, model.parameters(), strict=True):
        assert torch.allclose(got, (p - LR * p.grad).detach(), rtol=1e-5, atol=1e-6)


# Uneven widths chosen so that some output dims d satisfy d <= W // 2 at each W (XLA then unshards with an
# all-reduce of the full tensor instead of an all-gather of the padded shard), some sit just above it, and
# d = 1 takes the partitioner's broadcast path. (7, 13, 2) at W = 4 is the notebook case where the old formula
# said 764 bytes and the HLO 760.
UNEVEN_SIZES = [(7, 13, 2), (17, 9, 2), (14, 2, 9), (14, 20, 1), (5, 3, 11, 4), (19, 7, 17), (16, 1, 6)]


@pytest.mark.xla
@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("layer_sizes", UNEVEN_SIZES)
def test_uneven_sizes_formula_equals_hlo(xla_world, layer_sizes, world_size) -> None:  # type: ignore[no-untyped-def]
    """Oracle: the real partitioned CPU HLO of both graphs, every field (bytes and counts per op and phase)."""
    step = _step(layer_sizes, 8, world_size)
    model = make_model(step.p)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert step.measured == per_param_step_bytes(shapes, world_size, backward_needed(model), elem_bytes=4)
    assert sum(m.nbytes for m in step.moved if m.kind == "other") == 4  # only the scalar loss mean is left over
    # independent of the formula code: every collective byte of both graphs is accounted for
    every = sum(c.operand_bytes for c in step.forward.collectives + step.backward.collectives)
    assert every == step.measured.total + 4
    small = [s for s in shapes if s[0] <= world_size // 2]
    assert step.measured.unshard_all_reduce_forward == 4 * sum(math.prod(s) for s in small)


def test_flat_step_comm_single_rank_has_no_collectives() -> None:
    f = flat_step_comm(2060, 1)
    assert (f.all_gather_count, f.reduce_scatter_count, f.all_gather_bytes, f.reduce_scatter_bytes) == (0, 0, 0, 0)
    assert f.wire_bytes(1) == 0


@pytest.mark.xla
@pytest.mark.parametrize(("layer_sizes", "batch", "world_size"), [((30, 50, 10), 64, 8), ((16, 32, 32, 8), 32, 4)])
def test_torch_xla_fsdpv2_matches_largest_dim_formula(xla_world, layer_sizes, batch, world_size) -> None:  # type: ignore[no-untyped-def]
    """torch_xla's SpmdFullyShardedDataParallel shards each parameter's largest dim (shard_maximal=True)."""
    step = _step(layer_sizes, batch, world_size, wrapper="torch_xla_fsdpv2")
    model = make_model(step.p)
    expect = per_param_step_bytes([tuple(p.shape) for p in model.parameters()], world_size,
                                  backward_needed(model), elem_bytes=4, rule="largest")
    assert step.measured == expect


def test_shard_dim_rules() -> None:
    assert per_param_shard((10, 50), 8, 0, rule="largest") == ((10, 7), (10, 7))
    assert per_param_shard((10, 50), 8, 7, rule="largest") == ((10, 1), (10, 7))  # 7·7 = 49 -> 1 left
    assert per_param_shard((10, 50), 8, 0, rule="dim0") == ((2, 50), (2, 50))
    with pytest.raises(ValueError, match="rule='rows'"):
        per_param_shard((4, 4), 2, 0, rule="rows")


@pytest.mark.xla
def test_bad_world_size_and_wrapper(xla_world) -> None:  # type: ignore[no-untyped-def]
    view = harness.hlo(GspmdCase(FsdpGspmdParams(world_size=3, batch=6)))
    assert not view.ran and "world_size=3 does not tile num_devices=8" in view.skipped
    with pytest.raises(ValueError, match="wrapper='fsdp3' must be one of"):
        GspmdCase(FsdpGspmdParams(), wrapper="fsdp3")
