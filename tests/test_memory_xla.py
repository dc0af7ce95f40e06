"""The step on the XLA compilers: XLA:CPU executes it (updated parameters equal eager PyTorch's on the CPU, for
both update schedules) and reports its buffers; XLA:TPU compiles it compile-only with every parameter and moment
donated (the aliased bytes equal the state's bytes, worked out from the shapes); the cases' views hold the
simulator's peaks (checked against the traced DAG) beside the compilers'."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardlab.core import harness
from shardlab.memory import case as C
from shardlab.memory import graph as G
from shardlab.memory import update_schedule as U
from shardlab.memory import xla_step as X
from shardlab.memory.params import MemoryParams
from shardlab.profile import capture_hlo
from shardlab.profile import order as O

pytestmark = pytest.mark.xla
P = MemoryParams(model="mlp", layers=2, hidden=128, ffn=256, step_seq=1, step_batch=8)


def eager_cpu(p: MemoryParams) -> list[torch.Tensor]:
    """The oracle: the same step in eager PyTorch on the CPU, same seeds as xla_step.build."""
    model = G.build_model(p)
    params = [w.detach().clone() for w in model.parameters()]
    ms = [torch.zeros_like(w) for w in params]
    vs = [torch.zeros_like(w) for w in params]
    g = torch.Generator().manual_seed(p.seed)
    x = torch.randn(p.step_batch, p.step_seq, p.hidden, generator=g)
    target = torch.randn(p.step_batch, p.step_seq, p.hidden, generator=g)
    with torch.device("meta"):
        structure = G.build_model(p)
    loss = G.train_step(structure, x, target, params, ms, vs)
    return [*loss, *params, *ms, *vs]


@pytest.mark.parametrize("update", ["end", "eager"])
def test_xla_cpu_step_matches_eager_pytorch(xla_world, update: str) -> None:  # type: ignore[no-untyped-def]
    step = G.trace_step(P)
    cap = capture_hlo(X.build, P, {n: update for n in step.params}, False)
    want = eager_cpu(P)  # the schedule does not change the arithmetic
    got = [t.cpu() for t in cap.result.outputs]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        # XLA:CPU vs ATen kernels differ in float rounding; Adam's first step is lr * g / (|g| + eps), so where
        # |g| is near eps a rounding difference moves a parameter by a fraction of lr = 1e-3
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    buffers = cap.module.buffers
    assert buffers is not None and buffers.parameter >= step.resident_bytes()  # + torch_xla's lifted scalars


def test_tpu_step_donates_the_state(xla_world) -> None:  # type: ignore[no-untyped-def]
    step = G.trace_step(P)
    view = harness.tpu(C.RoamCase(P))
    mem = view.detail.memory
    h, f = P.hidden, P.ffn
    state = 3 * 4 * P.layers * (h * f + f + f * h + h)  # p, m, v of fc1 (W, b) and fc2 (W, b), fp32
    assert mem.alias == state == 3 * sum(step.param_bytes.values())
    assert view.detail.topology == "v5e-8" and view["peak_bytes.xla"] == mem.checked_temp


def test_case_views_hold_the_simulators_peaks(xla_world) -> None:  # type: ignore[no-untyped-def]
    p = replace(P, hidden=16, ffn=64)
    a = C.analyze(p)
    step = a.step
    formula = harness.formula(C.RoamCase(p))
    assert formula["nodes"] == len(step.graph.ops)
    assert formula["peak_bytes.program"] == O.peak(step.graph).peak  # the traced program order, simulated
    assert all(ok for ok, _ in formula.checks.values()), formula.checks
    up = U.plan(step)
    for choice in ("eager", "end"):
        assert harness.formula(C.UpdateScheduleCase(p, choice=choice))[f"peak_bytes.{choice}"] == \
            U.peak_of(step, up, U.uniform(up, choice))
    assert harness.formula(C.UpdateScheduleCase(p, choice="best"))["peak_bytes.best"] == U.brute_force(step, up).peak
    cpu = harness.hlo(C.RoamCase(p, executed=True))
    assert cpu["peak_bytes.xla"] == cpu.detail.module.buffers.temp > 0
