"""Parameter counts, Megatron vocabulary padding and per-device model state (ZeRO composed with TP).

Oracles: ZeRO paper Figure 1 / Table 1 (Ψ = 7.5B), Megatron-LM's padding log lines (GPT-2 vocabulary),
published Llama 3 parameter counts (model cards: 8.03B, 70.6B, 405B), and the FSDP padding rule written
as arithmetic.
"""

import pytest

from shardlab.formulas import memory as M

GB = 1e9


@pytest.mark.parametrize(
    "n,expected",
    [
        # ZeRO (Rajbhandari et al. 2020) Table 1, Ψ = 7.5B, K = 12: baseline / P_os / P_os+g / P_os+g+p in GB
        (64, (120, 31.4, 16.6, 1.88)),  # Figure 1: 120 / 31.4 / 16.6 / 1.9 GB
        (4, (120, 52.5, 41.3, 30)),
        (1024, (120, 30.1, 15.1, 0.12)),
    ],
)
def test_zero_table1(n, expected):
    got = [M.model_state_bytes(int(7.5e9), fsdp=n, stage=s).total / GB for s in range(4)]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=0.051 if e >= 1 else 0.006)


def test_tensor_parallel_divides_before_zero():
    # Ψ/t on each tensor rank, then ZeRO-3 over fsdp: 16·Ψ/(t·N)
    st = M.model_state_bytes(8_000_000_000, tensor=4, fsdp=8, stage=3)
    assert st.total == 16 * 8_000_000_000 / 32


def test_flat_unit_padding():
    # one unit of 10 elements, tensor 1, fsdp 4: padded to 12 -> each rank holds 3, 0.5 of them padding
    # (2 pad elements / 4 ranks) · (2 + 2 + 12) bytes = 8 bytes of padding per rank
    st = M.model_state_bytes(10, fsdp=4, stage=3, flat_units=[10])
    assert st.padding == 2 / 4 * 16
    # 8 divides evenly: no padding
    assert M.model_state_bytes(8, fsdp=4, stage=3, flat_units=[8]).padding == 0


@pytest.mark.parametrize(
    "vocab,tp,expected",
    [
        (50257, 8, 51200),  # GPT-2 vocab, 128 × 8 = 1024 -> 51200 (Megatron GPT-3 / Korthikanti runs)
        # Megatron log: "padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)"
        (50257, 1, 50304),
        (51200, 8, 51200),
    ],
)
def test_megatron_vocab_padding(vocab, tp, expected):
    assert M.padded_vocab(vocab, tp) == expected
    assert M.padded_vocab(vocab, tp) % (128 * tp) == 0


@pytest.mark.parametrize(
    "cfg,published",
    [
        ((32, 4096, 14336, 32, 8, 128256), 8.03e9),  # Llama 3 8B model card: 8.03B
        ((80, 8192, 28672, 64, 8, 128256), 70.6e9),  # Llama 3 70B: 70.6B
        ((126, 16384, 53248, 128, 8, 128256), 405.9e9),  # Llama 3.1 405B: 405.9B
    ],
)
def test_llama_param_counts(cfg, published):
    assert M.param_count(*cfg).total == pytest.approx(published, rel=0.002)


def test_param_count_layout():
    # tiny: L=2, h=8, ffn=16, a=2, kv=1 (hd=4), V=10: attn 2·64 + 2·8·4 = 192, mlp 3·128 = 384, norms 16
    p = M.param_count(2, 8, 16, 2, 1, 10)
    assert p.per_layer == 192 + 384 + 16
    assert p.total == 10 * 8 + 2 * (192 + 384 + 16) + 8 + 10 * 8


def test_bad_input():
    with pytest.raises(ValueError, match="heads=32 is not divisible by kv_heads=5"):
        M.param_count(1, 4096, 1, 32, 5, 10)


def test_mixture_of_experts_param_count():
    # Mixtral 8x7B (config.json: 32 layers, h 4096, ffn 14336, 32 heads, 8 KV heads, V 32000, 8 experts): the
    # published "46.7B" total; by hand per layer attention 2·4096² + 2·4096·1024, router 4096·8, norms 2·4096,
    # 8 SwiGLU experts 8·3·4096·14336
    pc = M.param_count(32, 4096, 14336, 32, 8, 32000, experts=8)
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096 + 8 * 3 * 4096 * 14336
    assert pc.per_layer == per_layer and pc.expert_per_layer == 8 * 3 * 4096 * 14336
    assert pc.total == 32 * per_layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert round(pc.total / 1e9, 1) == 46.7
    assert pc.dense_per_layer == per_layer - pc.expert_per_layer
    with pytest.raises(ValueError, match=r"experts=-1 must be an int >= 0"):
        M.param_count(2, 64, 128, 4, 4, 100, experts=-1)
