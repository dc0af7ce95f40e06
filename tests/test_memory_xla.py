"""The step on the XLA compilers: XLA:CPU executes it (updated parameters equal eager PyTorch's on the CPU, for
both update schedules) and reports its buffers; XLA:TPU compiles it compile-only with every parameter and moment
donated (the aliased bytes equal the state's bytes, worked out from the shapes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardlab.memory import graph as G
from shardlab.memory import xla_step as X

pytestmark = pytest.mark.xla
CFG = G.StepConfig(model="mlp", layers=2, hidden=128, ffn=256, seq=1, batch=8)


def eager_cpu(cfg: G.StepConfig) -> list[torch.Tensor]:
    """The oracle: the same step in eager PyTorch on the CPU, same seeds as xla_step.build."""
    model = G.build_model(cfg)
    params = [p.detach().clone() for p in model.parameters()]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g)
    target = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g)
    with torch.device("meta"):
        structure = G.build_model(cfg)
    loss = G.train_step(cfg, structure, x, target, params, ms, vs)
    return [*loss, *params, *ms, *vs]


@pytest.mark.parametrize("update", ["end", "eager"])
def test_xla_cpu_step_matches_eager_pytorch(xla_world, update: str) -> None:  # type: ignore[no-untyped-def]
    from shardlab.profile import capture_hlo

    cfg = replace(CFG, update=update)
    cap = capture_hlo(X.build, X.XlaStep(cfg, placeholders=False))
    want = eager_cpu(CFG)  # the schedule does not change the arithmetic
    got = [t.cpu() for t in cap.result]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        # XLA:CPU vs ATen kernels differ in float rounding; Adam's first step is lr * g / (|g| + eps), so where
        # |g| is near eps a rounding difference moves a parameter by a fraction of lr = 1e-3
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    step = G.trace_step(cfg)
    buffers = cap.module.buffers
    assert buffers is not None and buffers.parameter >= step.resident_bytes()  # + torch_xla's lifted scalars


def test_tpu_step_donates_the_state(xla_world) -> None:  # type: ignore[no-untyped-def]
    step = G.trace_step(CFG)
    mem, topo, _ = X.tpu_memory(X.XlaStep(CFG))
    h, f = CFG.hidden, CFG.ffn_size
    state = 3 * 4 * CFG.layers * (h * f + f + f * h + h)  # p, m, v of fc1 (W, b) and fc2 (W, b), fp32
    assert mem["alias"] == state == 3 * sum(step.param_bytes.values())
    assert topo == "v5e:2x4"
