"""Activation memory (Korthikanti et al. 2022) against the paper's own numbers and equations.

Oracles: the paper's quoted values (5as/h = 80 for GPT-3, ~70 % saving of selective recompute for GPT-3 and
65 % for MT-NLG 530B) and its closed forms eq. (1), (2), (4), written out again here from the paper — the
per-term implementation must add up to them exactly (integer arithmetic in floats < 2^53: exact).
"""

import pytest
import torch

from shardlab.formulas import activations as A

GPT3 = dict(seq=2048, hidden=12288, heads=96)  # Korthikanti Table 3 / Brown et al.
MTNLG = dict(seq=2048, hidden=20480, heads=128)  # MT-NLG 530B


def gpt_block(s, b, h, a, **kw):
    """The paper's GPT block: ffn = 4h, GeLU, dropout, 16-bit, no GQA."""
    return A.block_activation_bytes(s, b, h, 4 * h, a, **kw)


def test_gpt3_attention_ratio_is_80():
    # paper, section 4.1: "for GPT-3 ... 5as/h = 80"
    assert A.attention_score_ratio(GPT3["heads"], GPT3["seq"], GPT3["hidden"]) == 80.0


def test_selective_recompute_saves_70_percent_gpt3_and_65_percent_mtnlg():
    # paper, section 5: selective recomputation reduces activation memory by 70 % (GPT-3), 65 % (MT-NLG)
    assert round(A.selective_recompute_saving(GPT3["heads"], GPT3["seq"], GPT3["hidden"]), 2) == 0.70
    assert round(A.selective_recompute_saving(MTNLG["heads"], MTNLG["seq"], MTNLG["hidden"]), 2) == 0.65


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("t", [1, 2, 8])
def test_terms_add_up_to_paper_equations(t, b):
    s, h, a = GPT3["seq"], GPT3["hidden"], GPT3["heads"]
    sbh = s * b * h
    eq1 = sbh * (34 + 5 * a * s / h)
    eq2 = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    eq4 = sbh / t * (34 + 5 * a * s / h)
    assert gpt_block(s, b, h, a).total == eq1
    assert gpt_block(s, b, h, a, tp=t).total == pytest.approx(eq2, rel=1e-12)
    assert gpt_block(s, b, h, a, tp=t, sequence_parallel=True).total == pytest.approx(
        eq4, rel=1e-12
    )
    # selective recompute with TP + SP: 34·sbh/t ; full recompute keeps 2·sbh (layer input)
    sel = gpt_block(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective")
    assert sel.total == pytest.approx(34 * sbh / t, rel=1e-12)
    assert gpt_block(s, b, h, a, tp=t, recompute="full").total == 2 * sbh


def test_per_term_breakdown_without_parallelism():
    # section 4.1: attention 11sbh + 5as²b, MLP 19sbh, layer norms 4sbh
    s, b, h, a = 2048, 2, 12288, 96
    terms = gpt_block(s, b, h, a)
    assert terms.attention == 11 * s * b * h + 5 * a * s * s * b
    assert terms.mlp == 19 * s * b * h
    assert terms.norms == 4 * s * b * h


def test_bad_input_names_values():
    with pytest.raises(ValueError, match="heads=96 is not divisible by tp=5"):
        gpt_block(2048, 1, 12288, 96, tp=5)
    with pytest.raises(ValueError, match="recompute='some'"):
        gpt_block(2048, 1, 12288, 96, recompute="some")


class _RMSNorm(torch.autograd.Function):
    """A fused RMSNorm: keeps its input and the per-token rstd (fp32 [b, s, 1]) for the backward, as fused
    kernels do (eager PyTorch's composite rms_norm keeps fp32 copies instead)."""

    @staticmethod
    def forward(ctx, x, w):
        rstd = x.float().pow(2).mean(-1, keepdim=True).add(1e-5).rsqrt()  # [b, s, 1] fp32
        ctx.save_for_backward(x, rstd)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, g):  # not run here: only what forward stores is measured
        raise NotImplementedError


def _llama_block_saved_bytes(b: int, s: int, h: int, ffn: int, a: int, kv: int) -> tuple[int, int]:
    """Bytes autograd keeps for one bf16 Llama block (RMSNorm, GQA via SDPA's CPU flash kernel, SwiGLU),
    parameters excluded, each storage once; and the bytes of the norms' [b, s, 1] statistics among them."""
    import torch.nn.functional as F
    from torch import nn

    hd, dt = h // a, torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, h, dtype=dt, generator=g, requires_grad=True)
    w = {n: nn.Parameter(torch.randn(*shape, generator=g).to(dt) * 0.1) for n, shape in
         {"q": (h, h), "k": (kv * hd, h), "v": (kv * hd, h), "o": (h, h), "gate": (ffn, h), "up": (ffn, h),
          "down": (h, ffn), "n1": (h,), "n2": (h,)}.items()}
    params = {p.untyped_storage().data_ptr() for p in w.values()}
    saved: dict[int, tuple[int, tuple[int, ...]]] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = _RMSNorm.apply(x, w["n1"])
        q = F.linear(y, w["q"]).view(b, s, a, hd).transpose(1, 2)  # [b, a, s, hd]
        k = F.linear(y, w["k"]).view(b, s, kv, hd).transpose(1, 2)  # [b, kv, s, hd]
        v = F.linear(y, w["v"]).view(b, s, kv, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # flash on CPU: O + lse
        x2 = x + F.linear(o.transpose(1, 2).reshape(b, s, h), w["o"])  # O's layout is [b, s, a, hd]: a view
        z = _RMSNorm.apply(x2, w["n2"])
        _ = x2 + F.linear(F.silu(F.linear(z, w["gate"])) * F.linear(z, w["up"]), w["down"])
    stats = sum(n for n, shape in saved.values() if shape == (b, s, 1))
    return sum(n for n, _ in saved.values()), stats


@pytest.mark.parametrize("b,s,h,ffn,a,kv", [(2, 16, 64, 96, 8, 2), (1, 32, 128, 352, 4, 4), (2, 8, 96, 256, 12, 3)])
def test_llama_formula_is_what_a_bf16_block_stores(b, s, h, ffn, a, kv):
    """Oracle: the tensors autograd actually keeps for a bf16 Llama block (GQA + SwiGLU + flash attention)."""
    measured, norm_stats = _llama_block_saved_bytes(b, s, h, ffn, a, kv)
    formula = A.llama_activation_bytes_per_layer(s, b, h, ffn, a, kv)
    assert formula.total == measured - norm_stats  # the formula leaves RMSNorm's 4·sb-byte statistics out
    assert norm_stats == 2 * 4 * b * s
    assert formula.attention_core == 4 * a * s * b  # flash keeps only the fp32 log-sum-exp
    assert A.llama_activation_bytes_per_layer(s, b, h, ffn, a, kv, recompute="selective").total == (
        formula.total - formula.attention_core)


def test_gqa_and_tp_beyond_kv_heads():
    # Llama 3 70B: 64 heads, 8 KV heads; with tp=16 each rank keeps one (replicated) KV head, not half of one
    t8 = A.llama_activation_bytes_per_layer(8192, 1, 8192, 28672, 64, 8, tp=8)
    t16 = A.llama_activation_bytes_per_layer(8192, 1, 8192, 28672, 64, 8, tp=16)
    kv_bytes = 2 * 2 * 8192 * 128  # K and V, one head of hd = 128, 16-bit
    q_etc = 2 * 8192 * 8192 * 2 + 8 * 8192 * 28672 + 4 * 64 * 8192  # Q, O, SwiGLU, log-sum-exp: all /t
    assert t8.total - t16.total == pytest.approx(q_etc / 8 - q_etc / 16)  # K, V: one head per rank either way
    sh2 = 2 * 8192 * 8192  # one 16-bit [s, h]
    assert t16.attention - t16.attention_core == sh2 + 2 * sh2 / 16 + kv_bytes  # input; Q, O (/t); one KV head
    with pytest.raises(ValueError, match="kv_heads=2 and tp=3: one must divide the other"):
        A.llama_activation_bytes_per_layer(8192, 1, 8190, 28674, 6, 2, tp=3)


def test_attention_backward_holds_dp_and_ds_without_flash():
    from shardlab.formulas.activations import attention_backward_bytes

    # [b, a/t, s, s] twice in 16 bits: b 2, a 32 over t 4 -> 8 heads, s 1024
    assert attention_backward_bytes(1024, 2, 32, tp=4) == 2 * 2 * 2 * 8 * 1024 * 1024
    assert attention_backward_bytes(1024, 2, 32, tp=4, flash_attention=True) == 0
    with pytest.raises(ValueError, match=r"heads=32 is not divisible by tp=3"):
        attention_backward_bytes(1024, 2, 32, tp=3)


def test_moe_mlp_activations_by_hand():
    """A mixture-of-experts MLP keeps its input [T, h], the router's fp32 probabilities [T, E], the dispatched buffer
    and the experts' output [E·C, h], and each expert's SwiGLU inner tensors over its C slots (4 of [C, ffn / t]);
    C = ceil(cf·k·T/E). T = 16 tokens, h 8, ffn 24, E 4, k 2, cf 1.5: C = ceil(12) = 12, E·C = 48 slots."""
    e, T, h, f, E, slots = 2, 16, 8, 24, 4, 48
    want = e * T * h + 4 * T * E + 2 * e * slots * h + 4 * e * slots * f
    assert A.moe_mlp_activation_bytes(16, 1, 8, 24, experts=4, top_k=2, capacity_factor=1.5) == want
    # tensor 2 splits the inner width, sequence parallelism the input; GeLU keeps 2 inner tensors, not 4
    assert A.moe_mlp_activation_bytes(16, 1, 8, 24, 4, 2, 1.5, tp=2, sequence_parallel=True, gated_mlp=False) == \
        e * T * h / 2 + 4 * T * E + 2 * e * slots * h + 2 * e * slots * f / 2
