"""ZeRO formulas vs the paper's published numbers, and padding waste vs PyTorch's own chunk/pad rule.

Oracles: Rajbhandari et al. (ZeRO, SC'20) Figure 1 — 7.5B parameters, N = 64, K = 12 -> 120 / 31.4 / 16.6 /
1.9 GB per device — and section 7's 2Ψ / 3Ψ communication volumes; ``torch.chunk`` for the padding rule.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardlab.formulas.fsdp import flat_rank_memory, flat_step_comm
from shardlab.formulas.zero import padded_numel, padding_waste, zero_comm, zero_memory


@pytest.mark.parametrize(("stage", "paper_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_paper_figure_1(stage: int, paper_gb: float) -> None:
    assert round(zero_memory(7.5e9, 64, stage).total / 1e9, 1) == paper_gb


def test_stage_terms() -> None:
    psi, n = 1000.0, 10
    assert zero_memory(psi, n, 0) == (2 * psi, 2 * psi, 12 * psi)
    assert zero_memory(psi, n, 3) == (2 * psi / n, 2 * psi / n, 12 * psi / n)
    assert zero_memory(psi, 1, 3).total == zero_memory(psi, 1, 0).total  # N = 1: nothing to shard


def test_comm_volumes() -> None:
    psi = 7.5e9
    assert zero_comm(psi, 64, 0).total == 2 * psi  # DP all-reduce
    assert zero_comm(psi, 64, 2).total == 2 * psi  # ZeRO-2: same volume as DP
    assert zero_comm(psi, 64, 3).total == 3 * psi  # ZeRO-3: 1.5x
    assert zero_comm(psi, 4, 3, exact=True).total == pytest.approx(3 * psi * 3 / 4, rel=1e-12)


def test_padding_waste_matches_torch_chunk_and_pad() -> None:
    for n in range(1, 50):
        for w in range(1, 9):
            chunks = torch.arange(n).chunk(w)
            c = len(chunks[0])
            # every rank pads its chunk (or an empty one) to c with F.pad, as FlatParamHandle._get_shard does
            total = sum(F.pad(chunks[r] if r < len(chunks) else torch.empty(0, dtype=torch.int64),
                              [0, c - (len(chunks[r]) if r < len(chunks) else 0)]).numel() for r in range(w))
            assert padded_numel(n, w) == total
            assert padding_waste(n, w) == total - n
            assert 0 <= padding_waste(n, w) < w
    assert padding_waste(10, 4) == 2 and padding_waste(6, 4) == 2


def test_flat_step_comm_is_zero3_three_psi() -> None:
    # 3 collectives per step; ring wire bytes = 3 (W-1)/W · P · b = ZeRO-3's 3Ψ with Ψ = padded numel
    n, w = 1000, 8
    fc = flat_step_comm(n, w, elem_bytes=4)
    assert fc.wire_bytes(w) == pytest.approx(zero_comm(padded_numel(n, w), w, 3, exact=True).total * 4)


def test_flat_memory_is_zero3_for_fp32_adam() -> None:
    # fp32 params + fp32 grads + Adam (2 fp32 states) = 4 + 4 + 8 = 16 bytes/param = ZeRO's 2 + 2 + 12
    n, w = 1001, 8
    mem = flat_rank_memory(n, w, elem_bytes=4, optimizer="adam")
    assert mem.persistent == zero_memory(padded_numel(n, w), w, 3, k=8, param_bytes=4, grad_bytes=4).total


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: zero_memory(0, 4, 3), "psi=0"),
        (lambda: zero_memory(10, 0, 3), "n=0"),
        (lambda: zero_memory(10, 4, 5), "stage=5"),
        (lambda: padding_waste(10, 0), "world_size=0"),
        (lambda: padding_waste(0, 4), "numel=0"),
        (lambda: flat_rank_memory(10, 4, optimizer="lamb"), "optimizer='lamb'"),
    ],
)
def test_bad_input(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
