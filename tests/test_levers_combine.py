"""Combining: the α–β fit recovers known α, β from synthetic timings; the bucketing rule and its formula against
PyTorch's own DDP bucket assignment (``torch.distributed._compute_bucket_assignment_by_size``) and by hand; the
ledger's bucketed all-reduce against the formula and against rank arithmetic."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.distributed as dist

from shardlab.comm import SimulatedWorld
from shardlab.levers import combine as C


@pytest.mark.parametrize("alpha, beta", [(50e-6, 1e9), (2e-3, 2e8), (5e-6, 4e10)])
def test_fit_recovers_known_alpha_beta(alpha: float, beta: float) -> None:
    rng = random.Random(0)
    calls, nbytes, times = [], [], []
    for k in (1, 4, 16, 64):
        for n in (2**12, 2**16, 2**20):
            calls.append(k)
            nbytes.append(n)
            times.append((k * alpha + n / beta) * (1 + rng.uniform(-0.02, 0.02)))  # ±2 % noise
    fit = C.fit_alpha_beta(calls, nbytes, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)
    assert fit.beta_Bps == pytest.approx(beta, rel=0.05)
    assert fit.r2 > 0.99 and fit.rel_rms < 0.03 and fit.points == 12
    exact = C.fit_alpha_beta([1, 2], [10, 1000], [1 * alpha + 10 / beta, 2 * alpha + 1000 / beta])
    assert (exact.alpha_s, exact.beta_Bps) == (pytest.approx(alpha), pytest.approx(beta))
    assert exact.time_s(3, 500) == pytest.approx(3 * alpha + 500 / beta)


def test_fit_rejects_degenerate_and_unphysical_data() -> None:
    with pytest.raises(ValueError, match="not proportional"):
        C.fit_alpha_beta([1, 2], [100, 200], [1.0, 2.0])
    with pytest.raises(ValueError, match="same length"):
        C.fit_alpha_beta([1], [1, 2], [1.0])
    with pytest.raises(ValueError, match="not physical"):
        C.fit_alpha_beta([1, 8], [1e3, 1e6], [1e-3, 1e-3])  # 8x the calls and 1000x the bytes in the same time


def test_saving_is_alpha_per_removed_call() -> None:
    fit = C.AlphaBeta(1e-4, 1e9, 1.0, 0.0, 4)
    assert C.combining_saving_s(fit, 8, 1) == pytest.approx(7e-4)
    assert fit.time_s(8, 1e6) - fit.time_s(1, 1e6) == pytest.approx(C.combining_saving_s(fit, 8, 1))
    with pytest.raises(ValueError, match="not a combination"):
        C.combining_saving_s(fit, 2, 3)


@pytest.mark.parametrize("num, g, cap", [(8, 100, 0), (8, 100, 100), (8, 100, 250), (8, 100, 10_000),
                                         (7, 64, 129), (1, 4, 4), (12, 48, 96)])
def test_bucket_formula_matches_the_rule(num: int, g: int, cap: int) -> None:
    groups = C.buckets([g] * num, cap)
    assert sorted(i for grp in groups for i in grp) == list(range(num))
    assert len(groups) == C.bucket_count(num, g, cap)
    # by hand: a bucket closes after max(1, ceil(cap / g)) gradients
    per = max(1, -(-cap // g))
    assert len(groups) == -(-num // per)


def _pytorch_buckets(sizes: list[int], cap: int, first: int | None) -> list[list[int]]:
    """DDP's bucket assignment by PyTorch itself: limits [first, cap] as DDP passes them when bucket_cap_mb is left at
    its default, [cap] when it is passed. uint8 tensors, so a size is its bytes (one dtype, one device: DDP would
    also split buckets by those)."""
    tensors = [torch.empty(s, dtype=torch.uint8) for s in sizes]
    return dist._compute_bucket_assignment_by_size(tensors, [cap] if first is None else [first, cap])[0]


def test_ddp_first_bucket_constant_is_pytorchs() -> None:
    assert C.DDP_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES == 2**20


def test_buckets_match_pytorch_ddp() -> None:
    mib = 2**20
    # the worked case: 24 gradients of 4 MiB, DDP's defaults (1 MiB first bucket, 25 MiB cap) -> [1, 7, 7, 7, 2];
    # bucket_cap_mb=25 passed explicitly -> [7, 7, 7, 3]
    for first, lengths in ((mib, [1, 7, 7, 7, 2]), (None, [7, 7, 7, 3])):
        ours = C.buckets([4 * mib] * 24, 25 * mib, first)
        assert ours == _pytorch_buckets([4 * mib] * 24, 25 * mib, first)
        assert [len(b) for b in ours] == lengths
        assert C.bucket_count(24, 4 * mib, 25 * mib, first) == len(lengths)
    rng = random.Random(0)
    for _ in range(300):  # uneven sizes, every kind of limit (0 included)
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(1, 12))]
        cap, first = rng.choice([0, 1, 7, 20, 64, 200]), rng.choice([None, 0, 1, 10, 30, 500])
        assert C.buckets(sizes, cap, first) == _pytorch_buckets(sizes, cap, first), (sizes, cap, first)


@pytest.mark.parametrize("g", [1, 3, 4, 7])
def test_bucket_count_matches_pytorch_ddp(g: int) -> None:
    for num in range(1, 30):
        for cap in (0, 1, 5, 12, 25):
            for first in (None, 0, 2, 4, 9, 40):
                assert C.bucket_count(num, g, cap, first) == len(_pytorch_buckets([g] * num, cap, first)), \
                    (num, g, cap, first)


def test_buckets_uneven_sizes_by_hand() -> None:
    # sizes 3, 5, 1, 9, 2 with cap 6: [3, 5] = 8 >= 6 closes; [1, 9] = 10 closes; [2] left open -> 3 buckets
    assert C.buckets([3, 5, 1, 9, 2], 6) == [[0, 1], [2, 3], [4]]
    # with a first limit of 2: [3] closes at once, then [5, 1] = 6, [9], [2]
    assert C.buckets([3, 5, 1, 9, 2], 6, 2) == [[0], [1, 2], [3], [4]]
    with pytest.raises(ValueError, match="bucket_bytes=-1"):
        C.buckets([1], -1)
    with pytest.raises(ValueError, match="first_bucket_bytes=-2"):
        C.bucket_count(3, 4, 8, -2)


@pytest.mark.parametrize("world, num, numel, cap, first", [(4, 6, 10, 0, None), (4, 6, 10, 80, None),
                                                           (2, 5, 3, 1000, None), (3, 4, 8, 33, None),
                                                           (4, 7, 10, 80, 40), (2, 5, 3, 1000, 0)])
def test_ledger_bucketing_matches_formula_and_rank_arithmetic(world: int, num: int, numel: int, cap: int,
                                                              first: int | None) -> None:
    sim = SimulatedWorld(world)
    out = sim.run(C.bucket_program, num, numel, cap, first)
    assert sim.ledger.count("all_reduce") == C.bucket_count(num, numel * 4, cap, first)
    assert sim.ledger.count("all_reduce") == len(_pytorch_buckets([numel * 4] * num, cap, first))
    assert sim.ledger.payload_bytes("all_reduce") == num * numel * 4  # combining never changes the bytes
    tri = world * (world + 1) // 2  # sum over ranks of (rank + 1)
    for rank in out:
        for i, g in enumerate(rank):
            assert torch.equal(g, torch.full((numel,), float((i + 1) * tri)))


def test_validation_names_the_numbers() -> None:
    with pytest.raises(ValueError, match="numel=10 is not divisible by k=4"):
        C.time_all_reduces(2, [10], [4])
    with pytest.raises(ValueError, match="needs >= 2 processes"):
        C.time_all_reduces(1, [8], [1])


def test_gloo_timing_small() -> None:
    """Two real processes, tiny sizes: one sample per repeat per point, every sample positive; more calls of
    the same bytes never cost less than ~one call (a loose, noise-proof check of the α term)."""
    pts = C.time_all_reduces(2, [64, 4096], [1, 16], repeats=3, warmup=1)
    assert [(p.calls, p.numel) for p in pts] == [(1, 64), (16, 64), (1, 4096), (16, 4096)]
    assert all(len(p.timing.samples) == 3 and min(p.timing.samples) > 0 for p in pts)
    assert math.isfinite(sum(p.timing.median_s for p in pts))
