"""Every tensor-parallel layer against its dense `shardlab.models` oracle: outputs, input gradients and each
rank's parameter-gradient slice, for tp in {1, 2, 4}.

float64 throughout: the parallel code sums the same products in a different order (per-rank partial sums,
then the all-reduce), so results agree to rounding, not bitwise — rtol 1e-10 is far below any real error.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from shardlab import models
from shardlab.comm import SimulatedWorld
from shardlab.formulas.activations import mlp_activation_bytes
from shardlab.tp import ColumnParallelLinear, ParallelAttention, ParallelMLP, RowParallelLinear, vocab_range
from shardlab.tp.programs import _step, attention_step, embedding_step, mlp_step, transformer_layer_step

B, S, H, NH, FFN = 2, 4, 8, 4, 16
TOL = dict(rtol=1e-10, atol=1e-12)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, **TOL)


def dense_step(module: nn.Module, x: torch.Tensor, target: torch.Tensor, input_grad: bool = True):
    x = x.detach().clone().requires_grad_(input_grad)
    out = module(x)
    (0.5 * ((out - target) ** 2).sum()).backward()  # the steps' loss, written out here (the oracle)
    return out.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}


@pytest.fixture
def data():
    torch.manual_seed(0)
    return torch.randn(B, S, H, dtype=torch.float64), torch.randn(B, S, H, dtype=torch.float64)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parallel_mlp_matches_dense(tp: int, data) -> None:
    x, go = data
    dense = models.MLP(H, FFN).double()
    out, gx, grads = dense_step(dense, x, go)
    c = FFN // tp
    for r, res in enumerate(SimulatedWorld(tp).run(mlp_step, dense, x, go)):
        close(res["out"], out)
        close(res["grad_x"], gx)
        close(res["grads"]["fc1.weight"], grads["fc1.weight"][r * c : (r + 1) * c])  # column block r of A
        close(res["grads"]["fc1.bias"], grads["fc1.bias"][r * c : (r + 1) * c])
        close(res["grads"]["fc2.weight"], grads["fc2.weight"][:, r * c : (r + 1) * c])  # row block r of B
        close(res["grads"]["fc2.bias"], grads["fc2.bias"])  # replicated, added once after the reduction


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_mlp_matches_dense(tp: int, data) -> None:
    x, go = data
    dense = models.MLP(H, FFN).double()
    out, gx, grads = dense_step(dense, x, go)
    c, sc = FFN // tp, S // tp
    res = SimulatedWorld(tp).run(mlp_step, dense, x, go, sequence_parallel=True)
    for r, rr in enumerate(res):
        close(rr["out"], out[:, r * sc : (r + 1) * sc])  # this rank's sequence chunk
        close(rr["grad_x"], gx[:, r * sc : (r + 1) * sc])
        close(rr["grads"]["fc1.weight"], grads["fc1.weight"][r * c : (r + 1) * c])
        close(rr["grads"]["fc2.weight"], grads["fc2.weight"][:, r * c : (r + 1) * c])
        # the row bias saw only this rank's tokens; the sp.grads all-reduce summed the partials: dense on every rank
        close(rr["grads"]["fc2.bias"], grads["fc2.bias"])
        close(rr["grads"]["fc1.bias"], grads["fc1.bias"][r * c : (r + 1) * c])


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_bias_grad_is_one_all_reduce(tp: int, data) -> None:
    """Without the sp.grads all-reduce each rank's b2 gradient is a partial sum over its s/p tokens (they add up to
    the dense gradient); with it, one backward all-reduce of the h bias elements, tagged sp.grads."""
    x, go = data
    dense = models.MLP(H, FFN).double()
    _, _, grads = dense_step(dense, x, go)
    world = SimulatedWorld(tp)
    world.run(mlp_step, dense, x, go, sequence_parallel=True)
    sums = world.ledger.select("all_reduce")
    assert [(e.tag, e.shape, e.phase) for e in sums] == [("sp.grads", (H,), "backward")]

    def no_sum(comm, dense, x, go):  # the same step, the sum switched off: each rank keeps its partial gradient
        mlp = ParallelMLP.from_dense(dense, comm, sequence_parallel=True)
        xs, gs = (t.chunk(comm.world_size, dim=1)[comm.rank] for t in (x, go))
        return _step(mlp, xs, gs)["grads"]["fc2.bias"]

    partial = SimulatedWorld(tp).run(no_sum, dense, x, go)
    assert not any(torch.allclose(g, grads["fc2.bias"]) for g in partial)
    close(sum(partial), grads["fc2.bias"])


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_mlp_stores_the_input_shard(tp: int, data) -> None:
    """Activation memory, measured (saved_tensors_hooks) vs formulas.activations.mlp_activation_bytes: with SP
    the MLP keeps its [b, s/p, h] input shard (re-gathered in the backward), not the gathered [b, s, h]."""
    x, go = data
    dense = models.MLP(H, FFN).double()
    plain = SimulatedWorld(tp).run(mlp_step, dense, x, go)
    sp = SimulatedWorld(tp).run(mlp_step, dense, x, go, sequence_parallel=True)
    e = 8  # float64
    for r in range(tp):
        assert plain[r]["saved_bytes"] == mlp_activation_bytes(S, B, H, FFN, tp, act_bytes=e)
        assert sp[r]["saved_bytes"] == mlp_activation_bytes(S, B, H, FFN, tp, sequence_parallel=True, act_bytes=e)
        # by hand: input B·S·H (SP: /tp) + GeLU input and fc2 input B·S·FFN/tp each
        assert plain[r]["saved_bytes"] - sp[r]["saved_bytes"] == e * B * S * H * (tp - 1) // tp


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parallel_attention_matches_dense(tp: int, data) -> None:
    x, go = data
    dense = models.Attention(H, NH).double()
    out, gx, grads = dense_step(dense, x, go)
    c = H // tp  # this rank's heads occupy columns [r*c, (r+1)*c) of Q, K and V
    for r, res in enumerate(SimulatedWorld(tp).run(attention_step, dense, x, go)):
        close(res["out"], out)
        close(res["grad_x"], gx)
        cols = slice(r * c, (r + 1) * c)
        close(res["grads"]["qkv.weight"], torch.cat([grads[f"{n}.weight"][cols] for n in "qkv"]))
        close(res["grads"]["qkv.bias"], torch.cat([grads[f"{n}.bias"][cols] for n in "qkv"]))
        close(res["grads"]["out.weight"], grads["out.weight"][:, cols])
        close(res["grads"]["out.bias"], grads["out.bias"])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parallel_transformer_block_matches_dense(tp: int, data) -> None:
    """LayerNorm + attention + residual + LayerNorm + MLP + residual: each rank's output and input gradient equal
    the dense block's; its attention/MLP gradients are its slices; the replicated LayerNorms' gradients are the
    dense ones on every rank (their inputs are the full activations)."""
    x, go = data
    torch.manual_seed(1)
    dense = models.TransformerBlock(H, NH, FFN).double()
    with torch.no_grad():  # non-trivial LayerNorm parameters (defaults are ones and zeros)
        for ln in (dense.ln1, dense.ln2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    out, gx, grads = dense_step(dense, x, go)
    c, f = H // tp, FFN // tp
    for r, res in enumerate(SimulatedWorld(tp).run(transformer_layer_step, dense, x, go)):
        close(res["out"], out)
        close(res["grad_x"], gx)
        cols = slice(r * c, (r + 1) * c)
        close(res["grads"]["attn.qkv.weight"], torch.cat([grads[f"attn.{n}.weight"][cols] for n in "qkv"]))
        close(res["grads"]["attn.out.weight"], grads["attn.out.weight"][:, cols])
        close(res["grads"]["mlp.fc1.weight"], grads["mlp.fc1.weight"][r * f : (r + 1) * f])
        close(res["grads"]["mlp.fc2.weight"], grads["mlp.fc2.weight"][:, r * f : (r + 1) * f])
        for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
            close(res["grads"][name], grads[name])


@pytest.mark.parametrize("tp,vocab", [(1, 10), (2, 10), (4, 10), (4, 13), (2, 7)])
def test_vocab_parallel_embedding_matches_dense(tp: int, vocab: int) -> None:
    torch.manual_seed(1)
    dense = nn.Embedding(vocab, H).double()
    ids = torch.randint(0, vocab, (B, S))
    ids[0, :2] = torch.tensor([0, vocab - 1])  # both ends of the table
    go = torch.randn(B, S, H, dtype=torch.float64)
    out = dense(ids)
    (0.5 * ((out - go) ** 2).sum()).backward()
    for r, res in enumerate(SimulatedWorld(tp).run(embedding_step, dense, ids, go)):
        start, end = vocab_range(vocab, r, tp)
        close(res["out"], out.detach())  # exact in fact: one rank contributes each row, the others add 0
        close(res["grads"]["weight"], dense.weight.grad[start:end])


def test_vocab_range_is_contiguous_and_covers_uneven_vocab() -> None:
    for vocab, p in [(10, 4), (50257, 8), (50257, 4), (8, 8), (7, 2)]:
        ranges = [vocab_range(vocab, r, p) for r in range(p)]
        assert ranges[0][0] == 0 and ranges[-1][1] == vocab
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        sizes = [e - s for s, e in ranges]
        assert max(sizes) - min(sizes) <= 1 and max(sizes) == math.ceil(vocab / p)
    assert vocab_range(10, 2, 4) == (6, 8)  # sizes 3, 3, 2, 2
    with pytest.raises(ValueError, match="vocab=3 is smaller than tp=4"):
        vocab_range(3, 0, 4)
    with pytest.raises(ValueError, match="rank=4"):
        vocab_range(10, 4, 4)


@pytest.mark.parametrize("tp", [2, 4])
def test_column_gather_output_and_row_parallel_compose_to_dense(tp: int, data) -> None:
    x, _ = data
    lin1, lin2 = nn.Linear(H, FFN).double(), nn.Linear(FFN, H).double()

    def fn(c):
        col = ColumnParallelLinear.from_dense(lin1, c, gather_output=True)
        row = RowParallelLinear.from_dense(lin2, c)
        full = col(x)  # [b, s, ffn], gathered
        part = full.chunk(c.world_size, dim=-1)[c.rank]
        return full.detach(), row(part).detach()

    for full, y in SimulatedWorld(tp).run(fn):
        close(full, lin1(x).detach())
        close(y, lin2(lin1(x)).detach())


def test_bad_sizes_name_the_values() -> None:
    for build, msg in [
        (lambda c: ParallelMLP(8, 10, c), "ffn=10 is not divisible by tp=4"),
        (lambda c: ParallelAttention(8, 2, c), "heads=2 is not divisible by tp=4"),
        (lambda c: ParallelAttention(10, 4, c), "hidden=10 is not divisible by heads=4"),
        (lambda c: ColumnParallelLinear(8, 6, c), "out_features=6 is not divisible by tp=4"),
        (lambda c: RowParallelLinear(6, 8, c), "in_features=6 is not divisible by tp=4"),
    ]:
        with pytest.raises(Exception, match=msg):
            SimulatedWorld(4).run(build)


def test_embedding_rejects_ids_outside_vocab() -> None:
    dense = nn.Embedding(10, H)
    with pytest.raises(Exception, match=r"token ids \[10\] are outside \[0, vocab=10\)"):
        SimulatedWorld(2).run(embedding_step, dense, torch.tensor([[1, 10]]))


def test_sequence_parallel_rejects_an_uneven_sequence() -> None:
    dense = models.MLP(H, FFN)
    x = torch.randn(B, 6, H)  # 6 tokens over tp = 4
    with pytest.raises(Exception, match=r"seq=6 is not divisible by tp=4"):
        SimulatedWorld(4).run(mlp_step, dense, x, None, sequence_parallel=True)
