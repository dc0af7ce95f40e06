"""The traced step: Adam against torch.optim.Adam, buffer sizes against the shapes worked out by hand, in-place
ordering, the update-schedule integer program against brute force over every schedule, ROAM's comparison on a
small step against the exact search."""

from __future__ import annotations

import pytest
import torch

from shardlab.memory import graph as G
from shardlab.memory import roam
from shardlab.memory import update_schedule as U
from shardlab.memory.params import MemoryParams
from shardlab.profile import order as O

MLP2 = MemoryParams(model="mlp", layers=2, hidden=16, ffn=64, step_seq=1, step_batch=8)


def test_adam_matches_torch_optim() -> None:
    torch.manual_seed(0)
    p0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(3)]
    ref = p0.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=1e-3, foreach=False)
    p, m, v = p0.clone(), torch.zeros(5, 3), torch.zeros(5, 3)
    for step, g in enumerate(grads, start=1):
        ref.grad = g.clone()
        opt.step()
        G.adam_(p, g, m, v, step=step)
    torch.testing.assert_close(p, ref.detach(), rtol=0, atol=1e-7)  # same arithmetic, same order: ~exact


@pytest.fixture(scope="module")
def mlp2() -> G.StepGraph:
    return G.trace_step(MLP2)


def test_buffer_sizes_follow_the_shapes(mlp2: G.StepGraph) -> None:
    g = mlp2.graph
    f32, b, h, ffn = 4, 8, 16, 64
    first = g.ops[g.index[g.order[0]]]  # addmm: x @ W1^T + b1 -> [b, ffn]
    assert first.outputs[0][1] == b * ffn * f32
    # every parameter: 7 update operators (lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_), 2 of them allocate
    ups = mlp2.update_ops()
    assert len(ups) == 8 and all(len(v) == 7 for v in ups.values())
    for p, ops in ups.items():
        alloc = [s for o in ops for _, s in g.ops[g.index[o]].outputs if s]
        assert alloc == [mlp2.param_bytes[p]] * 2, p  # sqrt(v) and its division: parameter-sized temporaries
    # resident: parameters, two moments each, batch and target (never counted)
    params = 2 * (h * ffn + ffn + ffn * h + h) * f32
    assert mlp2.resident_bytes() == 3 * params + 2 * b * h * f32
    assert g.outputs == frozenset({next(o.outputs[0][0] for o in g.ops if o.name == "mean")})


def test_in_place_update_waits_for_every_read(mlp2: G.StepGraph) -> None:
    g = mlp2.graph
    for p, ops in mlp2.update_ops().items():
        write = g.index[ops[-1]]  # addcdiv_: writes the parameter
        param_buf = [t for t in g.ops[write].inputs if t in g.external][0]
        readers = [i for i, o in enumerate(g.ops) if param_buf in o.inputs and i != write]
        ancestors = 0
        stack = [write]
        while stack:  # every reader of the old value is an ancestor of the write
            i = stack.pop()
            for j in range(len(g.ops)):
                if g.pred[i] >> j & 1 and not ancestors >> j & 1:
                    ancestors |= 1 << j
                    stack.append(j)
        assert all(ancestors >> r & 1 for r in readers if mlp2.phase[g.ops[r].name] != mlp2.phase[ops[-1]]), p


def test_schedule_ilp_equals_brute_force(mlp2: G.StepGraph) -> None:
    up = U.plan(mlp2)
    best = U.best_schedule(mlp2, up)
    brute = U.brute_force(mlp2, up)  # all 2^8 schedules simulated
    assert best.peak == brute.peak == round(best.ilp_peak)
    assert best.peak <= min(U.peak_of(mlp2, up, U.uniform(up, c)) for c in ("eager", "end"))


def test_gpt2_fused_qkv_weights_are_one_unit() -> None:
    step = G.trace_step(MemoryParams(model="gpt2", layers=1, hidden=32, step_heads=2, step_seq=8, step_batch=1))
    up = U.plan(step)
    assert "0.attn.q.weight+0.attn.k.weight+0.attn.v.weight" in up.updates  # one stacked gradient buffer
    assert len(up.params) == 16 - 2 - 2  # q/k/v weights and biases: two units of three
    best = U.best_schedule(step, up)
    assert best.peak == round(best.ilp_peak)  # the implied order, simulated, has the program's objective
    assert best.peak <= min(U.peak_of(step, up, U.uniform(up, c)) for c in ("eager", "end"))


def test_roam_compare_small_step_reaches_the_optimum() -> None:
    step = G.trace_step(MemoryParams(model="mlp", layers=1, hidden=16, ffn=64, step_seq=1, step_batch=8))
    r = roam.compare(step, max_ops=20, unsplit_limit_s=120)
    best = O.extremes(step.graph).best.peak  # exact search over executed-operator sets
    assert r.unsplit is not None and r.unsplit.optimal and r.peaks["ilp_unsplit"] == best
    assert best <= r.peaks["ilp"] <= r.peaks["base"] <= r.peaks["program"]
    assert r.nodes == len(step.graph.ops)


def test_bad_parameters_name_the_rule() -> None:
    with pytest.raises(ValueError, match="model='bert'"):
        MemoryParams(model="bert").validate()
    with pytest.raises(ValueError, match="hidden=10 is not divisible by step_heads=4"):
        MemoryParams(model="gpt2", hidden=10, step_heads=4).validate()
    with pytest.raises(ValueError, match="min_ops=30 is more than max_ops=20"):
        MemoryParams(min_ops=30).validate()
    with pytest.raises(ValueError, match="values one of \\('eager', 'end'\\)"):
        G.trace_step(MLP2, {"0.fc1.weight": "soon"})
