"""formulas.context against independent arithmetic: hand-counted ring steps, a brute-force count of the causal
mask, and the validation rules (errors name the parameter and the numbers)."""

from __future__ import annotations

import pytest
import torch

from shardlab.formulas import context as fcp


def test_ring_bytes_by_hand() -> None:
    # b=2, s=64, hkv=4, d=16, f32, cp=4: one K block = 2 * 16 * 4 * 16 * 4 = 8192 bytes
    assert fcp.kv_block_bytes(2, 64, 4, 16, 4) == 8192
    # forward: 3 steps x (k, v)
    assert fcp.ring_p2p(2, 64, 4, 16, 4) == {"count": 6, "bytes": 6 * 8192}
    # backward, ringing again: k, v 3 steps + dk, dv 4 steps = 14 sends
    assert fcp.ring_p2p(2, 64, 4, 16, 4, phase="backward") == {"count": 14, "bytes": 14 * 8192}
    # backward with every visiting block saved: only dk, dv travel, 3 steps
    assert fcp.ring_p2p(2, 64, 4, 16, 4, phase="backward", backward="saved") == {"count": 6, "bytes": 6 * 8192}
    assert fcp.ring_p2p(2, 64, 4, 16, 4, phase="step")["count"] == 20
    assert fcp.ring_p2p(2, 64, 4, 16, 1, phase="step") == {"count": 0, "bytes": 0}


def test_allgather_has_the_rings_forward_wire_bytes() -> None:
    ag = fcp.allgather_kv(1, 1024, 8, 128, 8, "bf16", backward=True)
    shard = 1 * 128 * 8 * 128 * 2
    assert ag["all_gather"] == {"count": 2, "bytes": 2 * shard, "wire_bytes": 2 * 7 * shard}
    assert ag["reduce_scatter"] == {"count": 2, "bytes": 2 * 8 * shard, "wire_bytes": 2 * 7 * shard}
    assert ag["all_gather"]["wire_bytes"] == fcp.ring_p2p(1, 1024, 8, 128, 8, "bf16")["bytes"]
    assert fcp.allgather_kv(1, 1024, 8, 128, 1)["all_gather"]["count"] == 0


def test_ulysses_and_memory() -> None:
    # 4 all-to-alls of b (s/cp) (2 hq + 2 hkv) d e: 1 * 16 * (16 + 8) * 8 * 4 = 12288
    u = fcp.ulysses_all_to_all(1, 64, 8, 4, 8, 4, backward=True)
    assert u == {"count": 8, "bytes": 2 * 12288, "wire_bytes": 2 * 12288 * 3 / 4}
    with pytest.raises(ValueError, match="kv_heads=2 is not divisible by cp=4"):
        fcp.ulysses_all_to_all(1, 64, 8, 2, 8, 4)
    ring = fcp.memory(1, 64, 8, 2, 16, 4, method="ring")
    full = fcp.memory(1, 64, 8, 2, 16, 4, method="allgather")
    block = 16 * 2 * 16 * 4  # b·(s/cp)·hkv·d·e
    # forward: own + in-flight k and v; backward: saved k, v + visiting k, v, dk, dv + the next four in flight
    assert ring == {"kv": 4 * block, "kv_backward": (2 + 4 + 4) * block, "scores": 8 * 16 * 16 * 4}  # [hq, s/cp, s/cp]
    assert full == {"kv": 2 * 64 * 2 * 16 * 4, "kv_backward": 4 * 64 * 2 * 16 * 4, "scores": 8 * 16 * 64 * 4}
    assert fcp.memory(1, 64, 8, 2, 16, 4, block=4)["scores"] == 8 * 16 * 4 * 4


def _brute_force_work(seq: int, cp: int, layout: str) -> list[int]:
    """Unmasked (query, key) pairs of the causal mask whose query rank r holds (per the layout's chunks)."""
    n = cp if layout == "contiguous" else 2 * cp
    c = seq // n
    owner_of_chunk = {}
    for r in range(cp):
        for i in ([r] if layout == "contiguous" else [r, 2 * cp - 1 - r]):
            owner_of_chunk[i] = r
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()  # key <= query
    per_query = allowed.sum(dim=1)
    work = [0] * cp
    for qi in range(seq):
        work[owner_of_chunk[qi // c]] += int(per_query[qi])
    return work


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_causal_work_equals_a_brute_force_count(cp: int, layout: str) -> None:
    seq = 48 if cp == 3 else 64
    assert fcp.causal_work(seq, cp, layout) == _brute_force_work(seq, cp, layout)
    assert sum(fcp.causal_work(seq, cp, layout)) == seq * (seq + 1) // 2
    assert fcp.causal_work(seq, cp, layout, causal=False) == [seq * seq // cp] * cp


def test_balance_ratios() -> None:
    assert fcp.max_over_mean(fcp.causal_work(1024, 8, "zigzag")) == 1.0
    contiguous = fcp.max_over_mean(fcp.causal_work(1024, 8, "contiguous"))
    assert contiguous == pytest.approx(15 / 8, rel=1e-2)  # (2cp - 1) / cp for large s
    assert fcp.causal_blocks(4, "contiguous")[3] == {"full": 3, "diagonal": 1, "masked": 0}
    assert fcp.causal_blocks(4, "zigzag")[0] == {"full": 7, "diagonal": 2, "masked": 7}  # 4 steps x 4 sub-blocks


def test_errors_name_the_rule() -> None:
    with pytest.raises(ValueError, match="seq=30 is not divisible by the 8 chunks of the zigzag layout"):
        fcp.causal_work(30, 4, "zigzag")
    with pytest.raises(ValueError, match="cp=0 must be a positive int"):
        fcp.ring_p2p(1, 8, 1, 1, 0)
    with pytest.raises(ValueError, match="backward='later'"):
        fcp.ring_p2p(1, 8, 1, 1, 2, backward="later")
    with pytest.raises(ValueError, match="seq=10 is not divisible by cp=4"):
        fcp.kv_block_bytes(1, 10, 1, 1, 4)
    with pytest.raises(ValueError, match="work="):
        fcp.max_over_mean([])
