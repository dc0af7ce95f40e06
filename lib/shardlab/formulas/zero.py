"""ZeRO model-state memory and data-parallel communication (Rajbhandari et al., "ZeRO", SC'20).

Design note
-----------
Notation from the paper: Ψ parameters, N data-parallel devices, mixed-precision Adam keeps
2Ψ bytes of fp16 parameters, 2Ψ of fp16 gradients and KΨ of optimizer state (fp32 master copy,
momentum, variance: K = 4 + 4 + 4 = 12). Per device (paper Figure 1 / Table 1)::

    stage 0  (DP)        (2 + 2 + K) Ψ
    stage 1  (P_os)      2Ψ + 2Ψ + KΨ/N
    stage 2  (P_os+g)    2Ψ + (2 + K)Ψ/N
    stage 3  (P_os+g+p)  (2 + 2 + K)Ψ/N

Ψ = 7.5e9, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB (GB = 1e9 bytes), the paper's numbers.
``param_bytes``/``grad_bytes``/``k`` are parameters so the same algebra covers fp32 Adam
(4 + 4 + 8 = 16 bytes per parameter as well) — what shardlab's CPU FSDP unit actually holds.

Communication per step, in parameter *elements* per rank (section 7): plain DP all-reduces the
gradients = reduce-scatter Ψ + all-gather Ψ = 2Ψ; ZeRO-1/2 the same 2Ψ; ZeRO-3 adds one more
all-gather of the parameters (forward and backward each gather, gradients are reduce-scattered) = 3Ψ.
The paper quotes the bandwidth-optimal ring volumes rounded up ((N-1)/N ≈ 1); ``exact=True`` keeps the
(N-1)/N factor (the wire bytes of the ring model, ``formulas.common.wire_bytes``).

Padding waste of a flat parameter (FSDP1 / ZeRO-3 flat buffers): the numel N is padded to
W·ceil(N/W) so every rank holds an equal shard: waste = W·ceil(N/W) - N < W elements.
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas.common import ceil_div

ZERO_K = 12
"""Optimizer-state bytes per parameter for mixed-precision Adam: fp32 master + momentum + variance."""


class ZeroMemory(NamedTuple):
    params: float  # bytes per device
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


class ZeroComm(NamedTuple):
    all_gather: float  # elements per rank sent (ring) for the step
    reduce_scatter: float
    all_reduce: float

    @property
    def total(self) -> float:
        return self.all_gather + self.reduce_scatter + self.all_reduce


def _check(psi: float, n: int, stage: int) -> None:
    if psi <= 0:
        raise ValueError(f"psi={psi} (number of parameters) must be > 0")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} (data-parallel degree) must be an integer >= 1")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r} must be one of 0, 1, 2, 3")


def zero_memory(
    psi: float, n: int, stage: int, k: float = ZERO_K, param_bytes: float = 2, grad_bytes: float = 2
) -> ZeroMemory:
    """Model-state bytes per device for ZeRO ``stage`` (0 = plain data parallelism).

    >>> round(zero_memory(7.5e9, 64, 1).total / 1e9, 1)   # 4Ψ + KΨ/N
    31.4
    """
    _check(psi, n, stage)
    p = param_bytes * psi / (n if stage >= 3 else 1)
    g = grad_bytes * psi / (n if stage >= 2 else 1)
    o = k * psi / (n if stage >= 1 else 1)
    return ZeroMemory(p, g, o)


def zero_comm(psi: float, n: int, stage: int, exact: bool = False) -> ZeroComm:
    """Elements each rank sends per training step (ring algorithms).

    Stage 0 all-reduces gradients (2Ψ), stages 1-2 reduce-scatter gradients and all-gather updated
    parameters (Ψ + Ψ), stage 3 all-gathers parameters twice (forward, backward) and reduce-scatters
    gradients (Ψ + Ψ + Ψ = 3Ψ; PyTorch FSDP's root unit skips the backward all-gather: 2Ψ for it,
    ``formulas.fsdp.flat_step_comm(..., root=True)``). ``exact`` multiplies each by (N-1)/N.
    """
    _check(psi, n, stage)
    f = (n - 1) / n if exact else 1.0
    if stage == 0:
        return ZeroComm(0.0, 0.0, 2 * psi * f)
    if stage in (1, 2):
        return ZeroComm(psi * f, psi * f, 0.0)
    return ZeroComm(2 * psi * f, psi * f, 0.0)


def padded_numel(numel: int, world_size: int) -> int:
    """W·ceil(N/W): what a flat parameter of ``numel`` elements occupies once sharded over W ranks."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel={numel!r} must be an integer >= 1")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer >= 1")
    return world_size * ceil_div(numel, world_size)


def padding_waste(numel: int, world_size: int) -> int:
    """Zero-padding elements: W·ceil(N/W) - N, always in [0, W-1].

    >>> padding_waste(10, 4), padding_waste(6, 4), padding_waste(8, 4)
    (2, 2, 0)
    """
    return padded_numel(numel, world_size) - numel

