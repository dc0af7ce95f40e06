"""The building blocks of shardlab.context against PyTorch: the einsum attention vs scaled_dot_product_attention,
the online softmax fed blocks in any order, FlashAttention's block backward vs autograd, and the layouts.
float64 throughout: the comparisons are of the same math summed in a different order (tolerance 1e-10)."""

from __future__ import annotations

import itertools

import pytest
import torch

from shardlab.context.attention import (
    SoftmaxState,
    block_backward,
    chunk_ids,
    dense_attention,
    reference_attention,
    shard_sequence,
    softmax_delta,
    unshard_sequence,
)

TOL = {"rtol": 1e-10, "atol": 1e-10}


def _qkv(b: int = 2, s: int = 16, hq: int = 4, hkv: int = 2, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, hq, d, generator=g, dtype=torch.float64),
            torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64),
            torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_einsum_attention_is_sdpa(causal: bool, hkv: int) -> None:
    q, k, v = _qkv(hkv=hkv)
    torch.testing.assert_close(reference_attention(q, k, v, causal), dense_attention(q, k, v, causal), **TOL)
    # GQA: query head n*g + i reads kv head n (the repeat_interleave convention)
    rep = dense_attention(q, k.repeat_interleave(4 // hkv, 2), v.repeat_interleave(4 // hkv, 2), causal)
    torch.testing.assert_close(dense_attention(q, k, v, causal), rep, **TOL)


def test_online_softmax_in_any_block_order() -> None:
    q, k, v = _qkv(s=12)
    want = dense_attention(q, k, v)
    for order in itertools.permutations(range(3)):
        state = SoftmaxState.empty(q, k.shape[2])
        for j in order:
            state.update(q, k[:, 4 * j:4 * j + 4], v[:, 4 * j:4 * j + 4], "full")
        out, lse = state.result()
        torch.testing.assert_close(out, want, **TOL)
    # the log-sum-exp of the scores, per kv head and group: [b, hkv, g, s]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) / 8**0.5
    torch.testing.assert_close(lse.reshape(2, 4, 12), torch.logsumexp(scores, dim=-1), **TOL)


@pytest.mark.parametrize("kind", ["full", "diagonal"])
def test_block_backward_is_autograd(kind: str) -> None:
    q, k, v = _qkv(s=8)
    dout = torch.randn_like(q)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out = dense_attention(qq, kk, vv, causal=kind == "diagonal")
    (out * dout).sum().backward()
    state = SoftmaxState.empty(q, 2)
    state.update(q, k, v, kind)
    o, lse = state.result()
    torch.testing.assert_close(o, out.detach(), **TOL)
    dq, dk, dv = block_backward(q, k, v, dout, lse, softmax_delta(o, dout, 2), kind)
    for got, want in ((dq, qq.grad), (dk, kk.grad), (dv, vv.grad)):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_layouts_round_trip(layout: str, cp: int) -> None:
    x = torch.arange(16).view(1, 16)
    parts = [shard_sequence(x, layout, r, cp) for r in range(cp)]
    assert torch.equal(unshard_sequence(parts, layout), x)
    assert sorted(i for r in range(cp) for i in chunk_ids(layout, r, cp)) == list(range(cp if layout == "contiguous"
                                                                                        else 2 * cp))
    if layout == "zigzag" and cp == 2:  # chunks of 4: rank 0 holds chunks 0, 3; rank 1 holds 1, 2
        assert parts[0].tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]


def test_errors() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="query heads hq=4 must be a multiple of kv heads hkv=3"):
        dense_attention(q, torch.zeros(2, 16, 3, 8), torch.zeros(2, 16, 3, 8))
    with pytest.raises(ValueError, match="seq=16 is not divisible by the 6 chunks of the zigzag layout"):
        shard_sequence(q, "zigzag", 0, 3)
    with pytest.raises(ValueError, match="layout='striped'"):
        shard_sequence(q, "striped", 0, 2)
