"""The automatic stage split: node FLOPs against shardlab.formulas.flops, the dynamic programme against brute force
over every cut set, the split modules' composition against the unsplit model (bit for bit), and the auto split
against the even split by layer count on a model whose ends are heavy."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from shardlab.formulas.flops import transformer_flops
from shardlab.formulas.pipeline import pipeline_step_time
from shardlab.pipeline.model import TinyLM, batch, lm_loss
from shardlab.pipeline.split import best_cuts, brute_force_cuts, even_cuts, split, stage_costs, trace

HEAVY = SimpleNamespace(vocab=4096, hidden=64, heads=4, ffn=256, layers=8, seq=16)  # head ~ 2.6 blocks of FLOPs
SMALL = SimpleNamespace(vocab=256, hidden=32, heads=2, ffn=64, layers=4, seq=8)


@pytest.fixture(scope="module")
def heavy():
    model = TinyLM(HEAVY.vocab, HEAVY.hidden, HEAVY.heads, HEAVY.ffn, HEAVY.layers)
    tokens, _ = batch(HEAVY.vocab, HEAVY.seq, 4)
    return model, tokens, trace(model, tokens)


def test_node_flops_add_up_to_the_formula(heavy) -> None:
    model, tokens, traced = heavy
    c = HEAVY
    # formulas.flops counts forward + backward = 3 x forward, matmuls only, GeLU MLP (2 matrices)
    f = transformer_flops(4, c.seq, c.layers, c.hidden, c.ffn, c.heads, c.heads, c.vocab, gated_mlp=False)
    assert sum(n.flops for n in traced.nodes) == f.model / 3
    head = next(n for n in traced.nodes if n.layer == "head")
    assert head.flops == 2 * 4 * c.seq * c.hidden * c.vocab  # [b s, h] @ [h, V]
    assert sum(n.param_bytes for n in traced.nodes) == 4 * sum(p.numel() for p in model.parameters())


def test_cut_positions_hand_over_one_activation(heavy) -> None:
    _, _, traced = heavy
    c = HEAVY
    # after the embedding, after each block's attention residual and after each block, after the final norm
    assert len(traced.frontier) == 1 + 2 * c.layers + 1
    assert {traced.boundary[k] for k in traced.frontier} == {((4, c.seq, c.hidden), torch.float32)}


def test_dynamic_programme_equals_brute_force_on_random_graphs() -> None:
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(3, 14)
        costs = [rng.choice([0, 1, 2, 3, 5, 8, 13]) for _ in range(n)]
        cands = sorted(rng.sample(range(n - 1), rng.randint(1, n - 1)))
        for p in range(1, len(cands) + 2):
            dp, bf = best_cuts(costs, cands, p), brute_force_cuts(costs, cands, p)
            assert dp.max_cost == bf.max_cost
            bounds = [-1, *dp.cuts, n - 1]  # the DP's cuts really achieve its value
            assert max(sum(costs[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:], strict=False)) == dp.max_cost


@pytest.mark.parametrize("p", [2, 3, 4])
def test_dynamic_programme_equals_brute_force_on_the_traced_model(heavy, p: int) -> None:
    _, _, traced = heavy
    assert best_cuts(traced.train_costs, traced.frontier, p).max_cost == \
        brute_force_cuts(traced.train_costs, traced.frontier, p).max_cost


def test_auto_split_beats_the_even_split_when_the_ends_are_heavy(heavy) -> None:
    _, _, traced = heavy
    p, m = 4, 8
    auto = stage_costs(traced, best_cuts(traced.train_costs, traced.frontier, p).cuts)
    even = stage_costs(traced, even_cuts(traced, p))
    assert [s.layers for s in even] == [("embed", "blocks.0", "blocks.1"), ("blocks.2", "blocks.3"),
                                        ("blocks.4", "blocks.5"), ("blocks.6", "blocks.7", "norm", "head")]
    assert max(s.flops for s in auto) < max(s.flops for s in even) == even[-1].flops  # the head's stage
    step = {name: pipeline_step_time([s.flops for s in st], [2 * s.flops for s in st], m)
            for name, st in (("auto", auto), ("even", even))}
    assert step["auto"] < step["even"]


@pytest.mark.parametrize("rule", ["auto", "even"])
def test_split_stages_compose_to_the_unsplit_model_exactly(rule: str) -> None:
    model = TinyLM(SMALL.vocab, SMALL.hidden, SMALL.heads, SMALL.ffn, SMALL.layers)
    tokens, targets = batch(SMALL.vocab, SMALL.seq, 4)
    traced = trace(model, tokens)
    cuts = best_cuts(traced.train_costs, traced.frontier, 3).cuts if rule == "auto" else even_cuts(traced, 3)
    stages = split(traced, cuts)
    assert len(stages.modules) == 3
    x = tokens
    for mod, shape in zip(stages.modules, [*stages.boundary, None], strict=True):
        x = mod(x)
        if shape is not None:
            assert (tuple(x.shape), x.dtype) == shape
    ref = model(tokens)
    assert torch.equal(x, ref)  # the same ops in the same order
    # every parameter is in exactly one stage, under its unsplit name
    names = [n for d in stages.param_names for n in d.values()]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    # gradients through the composition, bit for bit
    lm_loss(x, targets).backward()
    grads = {d[k]: prm.grad for mod, d in zip(stages.modules, stages.param_names, strict=True)
             for k, prm in mod.named_parameters()}
    model.zero_grad()
    lm_loss(model(tokens), targets).backward()
    assert all(torch.equal(grads[n], prm.grad) for n, prm in model.named_parameters())


def test_bad_splits_are_refused() -> None:
    model = TinyLM(SMALL.vocab, SMALL.hidden, SMALL.heads, SMALL.ffn, SMALL.layers)
    tokens, _ = batch(SMALL.vocab, SMALL.seq, 2)
    traced = trace(model, tokens)
    with pytest.raises(ValueError, match="need 11 cuts but the graph has only 10"):
        best_cuts(traced.train_costs, traced.frontier, 12)
    with pytest.raises(ValueError, match="p=5 must be in \\[1, 4\\]"):
        even_cuts(traced, 5)
    inside = next(k for k in range(len(traced.nodes)) if k not in traced.boundary)
    with pytest.raises(ValueError, match="not single-tensor cut positions"):
        split(traced, [inside])


def test_compare_splits_predicts_the_even_split_slower(heavy) -> None:
    from shardlab.pipeline.split import compare_splits

    _, _, traced = heavy
    got = compare_splits(traced, 4, 8)
    assert got["auto"].max_cost == best_cuts(traced.train_costs, traced.frontier, 4).max_cost
    assert got["even"].max_cost == 3 * got["even"].stages[-1].flops  # the head's stage is the slowest
    for c in got.values():  # the flow-shop formula with b = 2 f, and the 1F1B order timed: same step
        f = [s.flops / 8 for s in c.stages]
        assert c.gpipe_step == pytest.approx(sum(3 * x for x in f) + 7 * 3 * max(f))
        assert c.one_f_one_b_step == pytest.approx(c.gpipe_step)
    assert got["auto"].gpipe_step < got["even"].gpipe_step


def test_saved_bytes_counts_what_autograd_keeps() -> None:
    """Linear -> tanh on x [n, h]: autograd keeps the Linear's input (the weight is a parameter, excluded) and
    tanh's output — (n h + n f) float32, counted by hand. The traced nodes' output sizes do not bound it: one
    block of notebook 09's default model outputs 458,752 B over its nodes, autograd keeps more."""
    from shardlab.pipeline.split import saved_bytes

    n, h, f = 6, 5, 7
    mlp = nn.Sequential(nn.Linear(h, f), nn.Tanh())
    assert saved_bytes(mlp, torch.randn(n, h, requires_grad=True)) == (n * h + n * f) * 4

    model = TinyLM(4096, 64, 4, 256, 8)
    tokens, _ = batch(4096, 16, 8)
    traced = trace(model, tokens)
    outputs = sum(node.act_bytes for node in traced.nodes if node.layer == "blocks.0")
    x = model.embed(tokens).detach().requires_grad_(True)
    assert outputs == 458_752 == 8 * 16 * 64 * 4 * 14  # 14 [b, s, h]-sized outputs' worth
    assert saved_bytes(model.blocks[0], x) > outputs


def test_stage_saved_bytes_puts_the_loss_on_the_last_stage() -> None:
    """The last stage keeps the head's input and the loss's log-probabilities [b s, V] (at least b s V float32);
    the stages' sum stays within 0.1 % of the whole model + loss measured in one piece (the stage inputs are
    fresh leaves)."""
    from shardlab.pipeline.split import saved_bytes, stage_saved_bytes

    vocab, seq = 512, 8
    model = TinyLM(vocab, 32, 2, 64, 4)
    tokens, targets = batch(vocab, seq, 2)
    traced = trace(model, tokens)
    stages = split(traced, best_cuts(traced.train_costs, traced.frontier, 3).cuts)
    per_stage = stage_saved_bytes(stages, tokens, targets)
    assert per_stage[-1] >= 2 * seq * vocab * 4

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return lm_loss(self.model(t), targets)

    whole = saved_bytes(WithLoss(), tokens)
    assert abs(sum(per_stage) - whole) <= 1e-3 * whole
