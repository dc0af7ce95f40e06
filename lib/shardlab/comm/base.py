"""The Comm protocol and the shared front half of every backend.

Design note
-----------
`CommBase` does everything that does not depend on the transport: argument validation with errors that name
the values, the world-size-1 bypass (return the input, record nothing), detaching (raw collectives are not
differentiable, exactly like `torch.distributed`; the autograd mappings live in `shardlab.tp.mappings` and
`shardlab.fsdp`), and the ledger row.  A backend implements four `_impl` methods that receive a detached,
contiguous tensor and return a fresh tensor.

Semantics (all collectives RETURN a new tensor; inputs are never modified):

    all_reduce(t, op)        -> elementwise sum / max over ranks, same shape as t
    all_gather(t, dim)       -> torch.cat([t_0, ..., t_{W-1}], dim); every rank must pass the same shape
    reduce_scatter(t, dim)   -> chunk `rank` (of W equal chunks along dim) of the sum over ranks
    broadcast(t, src)        -> src's t on every rank (every rank passes a tensor of the same shape/dtype)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from shardlab.comm.ledger import Ledger, LedgerEntry, current_phase, dtype_name, ring_wire_bytes

REDUCE_OPS = ("sum", "max")


@runtime_checkable
class Comm(Protocol):
    """What per-rank code may use. Implemented by SimulatedComm and TorchDistributedComm."""

    rank: int
    world_size: int
    ledger: Ledger

    def all_reduce(self, t: torch.Tensor, op: str = "sum", *, tag: str = "") -> torch.Tensor: ...

    def all_gather(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor: ...

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor: ...

    def broadcast(self, t: torch.Tensor, src: int = 0, *, tag: str = "") -> torch.Tensor: ...


def _normalise_dim(t: torch.Tensor, dim: int, what: str) -> int:
    if not -t.dim() <= dim < max(t.dim(), 1):
        raise ValueError(f"{what}: dim={dim} is out of range for a tensor of shape {tuple(t.shape)}")
    return dim % max(t.dim(), 1)


class CommBase:
    """Validation, world-size-1 bypass and ledger recording; subclasses implement the `_impl` methods."""

    def __init__(self, rank: int, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
        self.rank = rank
        self.world_size = world_size
        self.ledger = Ledger()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"

    # ---- public collectives -------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor, op: str = "sum", *, tag: str = "") -> torch.Tensor:
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce: op={op!r} is not one of {REDUCE_OPS}")
        if self.world_size == 1:
            return t
        x = self._prepare(t)
        self._record("all_reduce", x, reduce_op=op, tag=tag)
        return self._all_reduce_impl(x, op)

    def all_gather(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor:
        d = _normalise_dim(t, dim, "all_gather")
        if self.world_size == 1:
            return t
        x = self._prepare(t)
        self._record("all_gather", x, dim=d, tag=tag)
        return self._all_gather_impl(x, d)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor:
        d = _normalise_dim(t, dim, "reduce_scatter")
        if t.dim() == 0 or t.shape[d] % self.world_size:
            size = t.shape[d] if t.dim() else "a 0-d tensor"
            raise ValueError(
                f"reduce_scatter: size {size} along dim={dim} is not divisible by "
                f"world_size={self.world_size}"
            )
        if self.world_size == 1:
            return t
        x = self._prepare(t)
        self._record("reduce_scatter", x, reduce_op="sum", dim=d, tag=tag)
        return self._reduce_scatter_impl(x, d)

    def broadcast(self, t: torch.Tensor, src: int = 0, *, tag: str = "") -> torch.Tensor:
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast: src={src} is not in [0, world_size={self.world_size})")
        if self.world_size == 1:
            return t
        x = self._prepare(t)
        self._record("broadcast", x, src=src, tag=tag)
        return self._broadcast_impl(x, src)

    # ---- helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _prepare(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"collectives take a torch.Tensor, got {type(t).__name__}")
        return t.detach().contiguous()

    def _record(self, op: str, x: torch.Tensor, **extra) -> None:
        payload = x.numel() * x.element_size()
        self.ledger.append(
            LedgerEntry(
                seq=len(self.ledger),
                op=op,
                group_size=self.world_size,
                dtype=dtype_name(x.dtype),
                shape=tuple(x.shape),
                payload_bytes=payload,
                wire_bytes=ring_wire_bytes(op, payload, self.world_size),
                phase=current_phase(),
                **extra,
            )
        )

    # ---- transport (subclasses) ---------------------------------------------------------------------
    def _all_reduce_impl(self, x: torch.Tensor, op: str) -> torch.Tensor:
        raise NotImplementedError

    def _all_gather_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    def _reduce_scatter_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    def _broadcast_impl(self, x: torch.Tensor, src: int) -> torch.Tensor:
        raise NotImplementedError


class WorldBase:
    """What SimulatedWorld and DistributedWorld share: the size, the timeout, one ledger per rank."""

    def __init__(self, world_size: int, timeout_s: float = 120.0) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be a positive int")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.ledgers: list[Ledger] = [Ledger() for _ in range(world_size)]

    @property
    def ledger(self) -> Any:
        """Rank 0's ledger of the most recent run (``run`` checks every rank's is identical)."""
        return self.ledgers[0]
