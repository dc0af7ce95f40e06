"""formulas.tp against the papers' statements, written out as arithmetic here (Shoeybi et al. 2019 §3:
"two all-reduces in the forward path and two in the backward path" per layer; Korthikanti et al. 2022 §4.2.2:
sequence parallelism keeps the communication bandwidth, plus the backward re-gather of Megatron's SP linear)."""

from __future__ import annotations

import pytest

from shardlab.formulas import tp as ftp

b, s, h, V = 4, 128, 1024, 50257


def test_mlp_attention_layer_counts_and_bytes() -> None:
    act = b * s * h * 2  # one bf16 [b, s, h] activation
    assert ftp.mlp_all_reduce(b, s, h, 8, "bf16") == {"count": 1, "bytes": act}
    assert ftp.mlp_all_reduce(b, s, h, 8, "bf16", backward=True) == {"count": 2, "bytes": 2 * act}
    assert ftp.mlp_all_reduce(b, s, h, 8, "bf16", backward=True, input_requires_grad=False)["count"] == 1
    assert ftp.attention_all_reduce(b, s, h, 8, "bf16", backward=True) == {"count": 2, "bytes": 2 * act}
    assert ftp.transformer_layer_all_reduce(b, s, h, 8, "bf16") == {"count": 4, "bytes": 4 * act}
    assert ftp.mlp_all_reduce(b, s, h, 1, backward=True) == {"count": 0, "bytes": 0}


def test_sequence_parallel_wire_bytes_are_all_reduce_plus_one_regather() -> None:
    # Korthikanti et al. 2022 §4.2.2: an all-reduce = reduce-scatter + all-gather, so the two SP collectives that
    # replace each all-reduce move the same wire bytes; Megatron's SP linear adds one all-gather of the s/p
    # input shard in the backward (it did not keep the gathered input).
    for p in (2, 4, 8):
        sp = ftp.sequence_parallel(b, s, h, p, "float32", sublayers=2)
        full = b * s * h * 4
        assert sp["all_gather.count"] == 2 * 3 and sp["reduce_scatter.count"] == 2 * 2  # 2 pairs x (1+2, 1+1)
        assert sp["all_gather.regather.count"] == 2
        assert sp["all_gather.bytes"] == 6 * full // p and sp["reduce_scatter.bytes"] == 4 * full
        assert sp["all_reduce_wire_bytes"] == pytest.approx(4 * 2 * (p - 1) / p * full)  # 4 all-reduces' ring
        assert sp["wire_bytes"] == pytest.approx(sp["all_reduce_wire_bytes"] + 2 * (p - 1) / p * full)
        fwd = ftp.sequence_parallel(b, s, h, p, "float32", sublayers=2, backward=False)
        assert fwd["wire_bytes"] == pytest.approx(fwd["all_reduce_wire_bytes"])  # forward alone: equal
    with pytest.raises(ValueError, match="seq=6 is not divisible by tp=4"):
        ftp.sequence_parallel(1, 6, 8, 4)


def test_embedding_and_cross_entropy() -> None:
    assert ftp.embedding_all_reduce(b, s, h, 4) == {"count": 1, "bytes": b * s * h * 4}
    # 3 all-reduces of [b, s] f32; ring wire of each = 2 (p-1)/p of its payload = 2 * 7/8 at p = 8
    assert ftp.vocab_parallel_ce(b, s, 8) == {"count": 3, "bytes": 3 * b * s * 4, "wire_bytes": 3 * b * s * 4 * 1.75}
    assert ftp.vocab_parallel_ce(b, s, 8, label_smoothing=0.1)["count"] == 4
    assert ftp.vocab_parallel_ce(b, s, 8, label_smoothing=0.1)["bytes"] == 4 * b * s * 4
    assert ftp.shard_width(V, 8) == 6283  # 50257 = 8 * 6282 + 1 -> the largest shard has 6283 rows
    # one all-gather: payload = this rank's padded shard; wire (ring) = p - 1 = 7 shards sent per rank
    shard = b * s * 6283 * 4
    assert ftp.gathered_logits(b, s, V, 8) == {"count": 1, "bytes": shard, "wire_bytes": 7 * shard}
    assert ftp.gathered_logits(b, s, V, 1) == {"count": 0, "bytes": 0, "wire_bytes": 0.0}
    with pytest.raises(ValueError, match="batch=0"):
        ftp.vocab_parallel_ce(0, s, 8)
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        ftp.vocab_parallel_ce(b, s, 8, label_smoothing=1.5)


def test_cross_entropy_ratios_in_both_conventions() -> None:
    """Payload: one shard / the [b, s] all-reduce inputs = ceil(V/p) / 3, shrinking with p. Wire (ring): (p-1)
    shards against 3 * 2 (p-1)/p = p ceil(V/p) / 6, about V / 6 at every p (the (p-1) cancels)."""
    assert ftp.ce_payload_ratio(V, 8) == pytest.approx(6283 / 3)
    assert ftp.ce_payload_ratio(V, 8, 0.1) == pytest.approx(6283 / 4)
    assert ftp.ce_wire_ratio(V, 8) == pytest.approx(8 * 6283 / 6)
    assert ftp.ce_wire_ratio(V, 8, 0.1) == pytest.approx(8 * 6283 / 8)
    for p in (2, 4, 8, 64):  # the wire ratio is the ratio of the two wire terms, at any b, s, dtype
        ga, vp = ftp.gathered_logits(b, s, V, p, "bf16"), ftp.vocab_parallel_ce(b, s, p, "bf16")
        assert ftp.ce_wire_ratio(V, p) == pytest.approx(ga["wire_bytes"] / vp["wire_bytes"], rel=1e-12)
        assert ftp.ce_payload_ratio(V, p) == pytest.approx(ga["bytes"] / vp["bytes"], rel=1e-12)
        assert V / 6 <= ftp.ce_wire_ratio(V, p) < (V + p) / 6  # p ceil(V/p) is V plus < p padding
    assert ftp.ce_wire_ratio(128256, 8) == ftp.ce_wire_ratio(128256, 64) == 128256 / 6  # 128256 = 64 * 2004
    assert ftp.ce_payload_ratio(128256, 64) == 2004 / 3  # while the payload ratio fell 8-fold
    with pytest.raises(ValueError, match="tp=1"):
        ftp.ce_wire_ratio(V, 1)
    with pytest.raises(ValueError, match="tp=1"):
        ftp.ce_payload_ratio(V, 1)


def test_cross_entropy_logits_memory() -> None:
    # per device: the shard [b, s, 6283] vs the gathered, padded [b, s, 8 * 6283] (~ b s V)
    assert ftp.ce_logits_bytes(b, s, V, 8, "bf16") == {"vocab_parallel": b * s * 6283 * 2,
                                                       "gathered": b * s * 50264 * 2}


def test_sequence_parallel_parameter_gradients_one_all_reduce() -> None:
    # Megatron's finalize_model_grads -> _allreduce_layernorm_grads: the gradients of the parameters that see only
    # s/p tokens (LayerNorm weight and bias, a row-parallel bias) are summed in ONE all-reduce over the TP group.
    sp = ftp.sequence_parallel(b, s, h, 8, "bf16", sp_params=3 * h)
    assert (sp["all_reduce.count"], sp["all_reduce.bytes"]) == (1, 3 * h * 2)
    assert sp["all_reduce.wire_bytes"] == 2 * 7 / 8 * 3 * h * 2
    assert ftp.sequence_parallel(b, s, h, 8, "bf16", sp_params=3 * h, backward=False)["all_reduce.count"] == 0
    assert ftp.sequence_parallel(b, s, h, 8, "bf16")["all_reduce.count"] == 0  # nothing tagged
    assert ftp.sequence_parallel(b, s, h, 1, "bf16", sp_params=h)["all_reduce.count"] == 0
    with pytest.raises(ValueError, match="sp_params"):
        ftp.sequence_parallel(b, s, h, 8, sp_params=-1)
    # per layer: a GPT layer's two LayerNorms (weight + bias) and two row biases = 6h; Llama's two RMSNorms = 2h
    assert ftp.sp_grad_elements(h, 1, final_norm=False) == 6 * h
    assert ftp.sp_grad_elements(4096, 32, norm="rmsnorm", row_biases=False) == (32 * 2 + 1) * 4096


def test_output_layer_backward_all_reduce() -> None:
    # logits_i = f(x) E_i^T: f's backward all-reduces dx [b, s, h]; the forward sends nothing
    assert ftp.output_layer_all_reduce(b, s, h, 8, "bf16") == {"count": 1, "bytes": b * s * h * 2}
    assert ftp.output_layer_all_reduce(b, s, h, 8, "bf16", backward=False)["count"] == 0
    assert ftp.output_layer_all_reduce(b, s, h, 1)["count"] == 0
