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
    assert ftp.vocab_parallel_ce(b, s, 8) == {"count": 3, "bytes": 3 * b * s * 4}
    assert ftp.vocab_parallel_ce(b, s, 8, label_smoothing=0.1) == {"count": 4, "bytes": 4 * b * s * 4}
    assert ftp.shard_width(V, 8) == 6283  # 50257 = 8 * 6282 + 1 -> the largest shard has 6283 rows
    assert ftp.gathered_logits(b, s, V, 8) == {"count": 1, "bytes": b * s * 6283 * 4}
    assert ftp.ce_saving_ratio(V, 8) == pytest.approx(6283 / 3)
    assert ftp.ce_saving_ratio(V, 8, 0.1) == pytest.approx(6283 / 4)
    with pytest.raises(ValueError, match="tp=1"):
        ftp.ce_saving_ratio(V, 1)
    with pytest.raises(ValueError, match="batch=0"):
        ftp.vocab_parallel_ce(0, s, 8)
