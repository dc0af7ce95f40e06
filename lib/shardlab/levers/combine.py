"""Combining collectives: why k small all-reduces cost more than one big one, measured and modelled.

Design
------
**The α–β model.** One collective of ``n`` payload bytes takes ``α + n / β``: a fixed start-up latency α
(software, synchronisation, the first hop) plus the bytes over a bandwidth β. k collectives carrying n bytes in
total take ``k·α + n / β``: the bytes cost the same, every extra call costs another α. Combining (XLA's
``all-reduce-combiner``, DDP's gradient buckets) therefore saves ``(k - c)·α`` when it turns k calls into c.
β here is *payload* bandwidth (bytes one rank hands over per second); the ring algorithm actually sends
``2 (W-1)/W`` of that per rank, which β absorbs.

- :func:`fit_alpha_beta` — least squares of ``T = α·calls + bytes/β`` (no intercept) over timings of
  different (calls, bytes), in *relative* terms (each point weighted by 1/T, since the timings span orders of
  magnitude and a 1 ms point must not drown a 50 µs one); reports R² and the relative RMS residual.
- :func:`time_all_reduces` — real timings: ``W`` processes on gloo (``torch.distributed``) run, for every
  total size n and every k, k all-reduces of n/k float32 elements, ``repeats`` times after a barrier; a
  repeat's time is the slowest rank's (a collective is done when every rank is). Median and spread per point.
- :func:`buckets` / :func:`bucket_count` / :func:`bucketed_all_reduce` — hand-made bucketing, DDP's rule (torch 2.9:
  ``dist._compute_bucket_assignment_by_size``, which ``Reducer::rebuild_buckets`` applies after the first
  iteration): take the gradients in the order they become ready (about reverse parameter order), close the open
  bucket once it holds at least its limit — :data:`DDP_FIRST_BUCKET_BYTES` (1 MiB) for the first bucket when
  ``bucket_cap_mb`` is left at its default, ``bucket_cap_mb`` (25 MiB) for every later one — and all-reduce each
  bucket as one flat tensor. Passing ``bucket_cap_mb`` explicitly makes the first limit the cap too. The formula
  for L equal gradients, and a per-rank program whose ledger shows one all-reduce per bucket; the tests compare
  the rule with PyTorch's own function.

Example::

    >>> fit = fit_alpha_beta([1, 4, 1, 4], [1e3, 1e3, 1e6, 1e6], [1.01e-4, 4.01e-4, 1.1e-3, 1.4e-3])
    >>> round(fit.alpha_s * 1e6), round(fit.beta_Bps / 1e9, 2)
    (100, 1.0)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from shardlab.comm import Comm, DistributedWorld, SimulatedWorld
from shardlab.profile.timer import Timing

ELEMENT_BYTES = 4  # the timings move float32
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (torch 2.9; the tests compare)


class AlphaBeta(NamedTuple):
    alpha_s: float  # seconds per collective call
    beta_Bps: float  # payload bytes per second
    r2: float  # 1 - SS_res / SS_tot of the timings
    rel_rms: float  # RMS of (fit - measured) / measured
    points: int

    def time_s(self, calls: float, payload_bytes: float) -> float:
        """Predicted seconds for ``calls`` collectives carrying ``payload_bytes`` in total."""
        return calls * self.alpha_s + payload_bytes / self.beta_Bps


def fit_alpha_beta(calls: Sequence[float], payload_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Relative least-squares α, β of ``T = α·calls + bytes/β`` (>= 2 points varying calls and bytes apart)."""
    if not len(calls) == len(payload_bytes) == len(times_s):
        raise ValueError(f"calls ({len(calls)}), payload_bytes ({len(payload_bytes)}) and times_s ({len(times_s)}) "
                         "must have the same length")
    x = np.column_stack([np.asarray(calls, float), np.asarray(payload_bytes, float)])  # [points, 2]
    t = np.asarray(times_s, float)
    if len(t) < 2 or np.linalg.matrix_rank(x) < 2:
        raise ValueError("the fit needs timings at >= 2 (calls, bytes) points that are not proportional "
                         "(vary the number of calls and the bytes independently)")
    if (t <= 0).any():
        raise ValueError("timings must be > 0 s")
    (alpha, gamma), *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)  # min Σ((x·p - t) / t)²
    if alpha <= 0 or gamma <= 0:
        raise ValueError(f"the α–β fit is not physical (α={alpha:.3g} s, 1/β={gamma:.3g} s/B): the timings are "
                         "dominated by noise; use more repeats or larger sizes")
    pred = x @ np.array([alpha, gamma])
    ss_res = float(((t - pred) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    rel = float(np.sqrt((((pred - t) / t) ** 2).mean()))
    return AlphaBeta(float(alpha), float(1.0 / gamma), r2, rel, len(t))


def combining_saving_s(fit: AlphaBeta, calls_before: int, calls_after: int) -> float:
    """What the model says combining ``calls_before`` collectives into ``calls_after`` saves: the bytes are the
    same, so only the start-ups go: ``(calls_before - calls_after)·α``."""
    if calls_after < 1 or calls_before < calls_after:
        raise ValueError(f"combining {calls_before} calls into {calls_after} is not a combination")
    return (calls_before - calls_after) * fit.alpha_s


# ------------------------------------------------------------------------------------------------ buckets
def _limit(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an int >= 0")
    return value


def buckets(sizes_bytes: Sequence[int], bucket_bytes: int, first_bucket_bytes: int | None = None) -> list[list[int]]:
    """Indices of the gradients in each bucket, DDP's rule: fill the open bucket in the given order (DDP's: the
    order gradients become ready, about reverse parameter order) until it holds >= its limit, then close it. The
    first bucket's limit is ``first_bucket_bytes`` (DDP's default :data:`DDP_FIRST_BUCKET_BYTES`; None: the same
    as ``bucket_bytes``, DDP with ``bucket_cap_mb`` passed explicitly), every later one's ``bucket_bytes``. A
    limit 0 closes a bucket after one gradient. (DDP also keeps dtypes and devices in separate buckets; one of
    each here.)"""
    later = _limit("bucket_bytes", bucket_bytes)
    first = later if first_bucket_bytes is None else _limit("first_bucket_bytes", first_bucket_bytes)
    out: list[list[int]] = []
    cur: list[int] = []
    held = 0
    for i, s in enumerate(sizes_bytes):
        cur.append(i)
        held += s
        if held >= (later if out else first):
            out.append(cur)
            cur, held = [], 0
    if cur:
        out.append(cur)
    return out


def bucket_count(num_grads: int, grad_bytes: int, bucket_bytes: int, first_bucket_bytes: int | None = None) -> int:
    """Formula: all-reduces for ``num_grads`` equal gradients of ``grad_bytes`` each. The first bucket closes after
    ``m1 = max(1, ceil(first_bucket_bytes / grad_bytes))`` gradients, every later one after ``m = max(1,
    ceil(bucket_bytes / grad_bytes))``: 1 bucket if ``num_grads <= m1``, else ``1 + ceil((num_grads - m1) / m)``
    (``first_bucket_bytes`` None: the same limit as the others, ``ceil(num_grads / m)``)."""
    if num_grads < 1 or grad_bytes < 1:
        raise ValueError(f"num_grads={num_grads} and grad_bytes={grad_bytes} must be >= 1")
    per = max(1, math.ceil(_limit("bucket_bytes", bucket_bytes) / grad_bytes))
    first = per if first_bucket_bytes is None else \
        max(1, math.ceil(_limit("first_bucket_bytes", first_bucket_bytes) / grad_bytes))
    return 1 if num_grads <= first else 1 + math.ceil((num_grads - first) / per)


def bucketed_all_reduce(comm: Comm, grads: Sequence[torch.Tensor], bucket_bytes: int,
                        first_bucket_bytes: int | None = None) -> list[torch.Tensor]:
    """Per-rank program: sum ``grads`` over ranks with one all-reduce per bucket (flatten, reduce, unflatten).

    The ledger shows one all_reduce per bucket whose payload is the bucket's bytes; the results equal
    per-gradient all-reduces exactly (the same additions, elementwise)."""
    groups = buckets([g.numel() * g.element_size() for g in grads], bucket_bytes, first_bucket_bytes)
    out: list[torch.Tensor | None] = [None] * len(grads)
    for b, idx in enumerate(groups):
        flat = torch.cat([grads[i].reshape(-1) for i in idx])  # [sum of numels]
        flat = comm.all_reduce(flat, tag=f"bucket{b}")
        off = 0
        for i in idx:
            n = grads[i].numel()
            out[i] = flat[off:off + n].view_as(grads[i])
            off += n
    return out  # type: ignore[return-value]


def rank_grads(rank: int, num_grads: int, numel: int) -> list[torch.Tensor]:
    """Rank r's L gradients for the bucketing demo: ``ones * (rank + 1) * (i + 1)`` — the sum over W ranks of
    gradient i is ``(i + 1)·W(W+1)/2`` everywhere (rank arithmetic, an oracle that needs no reference run)."""
    return [torch.full((numel,), float((rank + 1) * (i + 1))) for i in range(num_grads)]


def bucket_program(comm: Comm, num_grads: int, numel: int, bucket_bytes: int,
                   first_bucket_bytes: int | None = None) -> list[torch.Tensor]:
    """``bucketed_all_reduce`` of :func:`rank_grads` (module level: picklable for real processes)."""
    return bucketed_all_reduce(comm, rank_grads(comm.rank, num_grads, numel), bucket_bytes, first_bucket_bytes)


# -------------------------------------------------------------------------------------------- gloo timings
class CombinePoint(NamedTuple):
    calls: int  # k
    numel: int  # n, elements in total over the k calls
    timing: Timing  # seconds for the k calls, one sample per repeat (slowest rank)

    @property
    def payload_bytes(self) -> int:
        return self.numel * ELEMENT_BYTES


def timing_program(comm: Comm, numels: Sequence[int], ks: Sequence[int], repeats: int,
                   warmup: int) -> dict[tuple[int, int], list[float]]:
    """Per-rank: seconds for k all-reduces of n/k float32 zeros, per (n, k), ``repeats`` samples each.

    Calls ``torch.distributed`` directly (no ledger bookkeeping inside the timed region); a barrier aligns
    the ranks before every sample. Repeats go round-robin over the points, so a burst of load from elsewhere on
    the machine spreads over all of them instead of spoiling one. Zeros stay zeros however often they are summed.
    """
    bufs = {(n, k): [torch.zeros(n // k) for _ in range(k)] for n in numels for k in ks}  # k x [n / k]
    out: dict[tuple[int, int], list[float]] = {key: [] for key in bufs}
    for r in range(warmup + repeats):
        for key, tensors in bufs.items():
            dist.barrier()
            t0 = time.perf_counter()
            for b in tensors:
                dist.all_reduce(b)
            dt = time.perf_counter() - t0
            if r >= warmup:
                out[key].append(dt)
    return out


def time_all_reduces(world_size: int, numels: Sequence[int], ks: Sequence[int], repeats: int = 7,
                     warmup: int = 2) -> list[CombinePoint]:
    """Real timings on ``world_size`` gloo processes (see the module note)."""
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: timing a collective needs >= 2 processes")
    for n in numels:
        for k in ks:
            if k < 1 or n % k:
                raise ValueError(f"numel={n} is not divisible by k={k} (k all-reduces of n/k elements each)")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    per_rank = DistributedWorld(world_size).run(timing_program, list(numels), list(ks), repeats, warmup)
    points = []
    for n in numels:
        for k in ks:
            slowest = tuple(max(r[(n, k)][i] for r in per_rank) for i in range(repeats))
            points.append(CombinePoint(k, n, Timing(slowest)))
    return points


def fit_points(points: Sequence[CombinePoint]) -> AlphaBeta:
    """α, β from the medians of timed points."""
    return fit_alpha_beta([p.calls for p in points], [p.payload_bytes for p in points],
                          [p.timing.median_s for p in points])


def fit_spread(points: Sequence[CombinePoint]) -> dict[str, dict[str, float]]:
    """α and β fitted on each repeat separately: ``{"alpha_s": {min, max, n}, "beta_Bps": {...}}`` (repeats whose
    fit is not physical are left out and counted in ``n``'s absence)."""
    reps = len(points[0].timing.samples)
    alphas, betas = [], []
    for i in range(reps):
        try:
            f = fit_alpha_beta([p.calls for p in points], [p.payload_bytes for p in points],
                               [p.timing.samples[i] for p in points])
        except ValueError:
            continue
        alphas.append(f.alpha_s)
        betas.append(f.beta_Bps)
    if not alphas:
        return {}
    return {"alpha_s": {"min": min(alphas), "max": max(alphas), "n": len(alphas),
                        "median": statistics.median(alphas)},
            "beta_Bps": {"min": min(betas), "max": max(betas), "n": len(betas), "median": statistics.median(betas)}}


def bucket_sizes(num_grads: int, grad_bytes: int) -> list[int]:
    """The bucket sizes of the curve: 0 (one all-reduce per gradient), then 1, 2, 4 ... gradients per bucket
    until one bucket holds them all."""
    out, per = [0], 1
    while True:
        out.append(per * grad_bytes)
        if per >= num_grads:
            return out
        per *= 2


def bucket_curve(num_grads: int, numel: int, world_size: int, fit: AlphaBeta | None = None,
                 sizes: Sequence[int] | None = None, first_bucket_bytes: int | None = None) -> list[dict[str, Any]]:
    """For each bucket size: the formula's all-reduces, the ledger's (``bucket_program`` in a SimulatedWorld),
    the payload bytes, whether every rank got the rank-arithmetic sums, and the α–β time of the bucketed step.
    ``first_bucket_bytes``: the first bucket's own limit (None: each size is also the first bucket's limit — DDP
    with ``bucket_cap_mb`` passed)."""
    grad_bytes = numel * ELEMENT_BYTES
    tri = world_size * (world_size + 1) // 2  # sum over ranks of (rank + 1)
    rows = []
    for b in (sizes if sizes is not None else bucket_sizes(num_grads, grad_bytes)):
        sim = SimulatedWorld(world_size)
        out = sim.run(bucket_program, num_grads, numel, b, first_bucket_bytes)
        # compared in numpy (one thread): measured on the shared 2-core machine, torch's 2 OpenMP threads spin ~4 ms
        # of CPU per 64k-element comparison (0.1 ms with one thread) — 2 s of the notebook for these checks
        exact = all(g.shape == (numel,) and bool(np.all(g.numpy() == (i + 1) * tri))
                    for r in out for i, g in enumerate(r))
        count = sim.ledger.count("all_reduce")
        rows.append({"bucket_bytes": b, "formula": bucket_count(num_grads, grad_bytes, b, first_bucket_bytes),
                     "ledger": count,
                     "payload_bytes": sim.ledger.payload_bytes("all_reduce"), "sums_exact": exact,
                     "model_ms": fit.time_s(count, num_grads * grad_bytes) * 1e3 if fit else None})
    return rows
