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
    all_to_all(t, dim)       -> cat over j of chunk `rank` of rank j's t (W equal chunks along dim): rank r's
                                chunk j goes to rank j (dist.all_to_all_single's semantics, on any dim)

Point-to-point (only the two ranks involved take part):

    send(t, dst)             -> None; buffered: returns without waiting for dst to receive (the tensor is copied)
    recv(shape, dtype, src)  -> the next tensor src sent to this rank; blocks until it arrived.  Messages
                                between one (src, dst) pair arrive in the order they were sent (FIFO).

A rank may not send to or receive from itself (there is no world-size-1 bypass for them: it is a bug in the
caller's rank arithmetic).  `all_to_all` at world size 1 returns its input like the other collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from shardlab.comm.ledger import Ledger, LedgerEntry, current_phase, dtype_name, ledger_problem, ring_wire_bytes

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

    def all_to_all(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor: ...

    def send(self, t: torch.Tensor, dst: int, *, tag: str = "") -> None: ...

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int, *, tag: str = "") -> torch.Tensor: ...


class CollectiveMismatch(RuntimeError):
    """Ranks called different collectives, or the same one with incompatible tensors (or a send and its recv
    disagree on shape / dtype)."""


class RankError(RuntimeError):
    """A rank's function raised; the original exception is chained as __cause__."""


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

    # ---- public collectives: validate, bypass at world size 1, record the row, hand over to the transport ----
    def all_reduce(self, t: torch.Tensor, op: str = "sum", *, tag: str = "") -> torch.Tensor:
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce: op={op!r} is not one of {REDUCE_OPS}")
        return self._collective("all_reduce", t, op, tag, reduce_op=op)

    def all_gather(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor:
        d = _normalise_dim(t, dim, "all_gather")
        return self._collective("all_gather", t, d, tag, dim=d)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor:
        d = self._split_dim(t, dim, "reduce_scatter")
        return self._collective("reduce_scatter", t, d, tag, reduce_op="sum", dim=d)

    def all_to_all(self, t: torch.Tensor, dim: int = 0, *, tag: str = "") -> torch.Tensor:
        d = self._split_dim(t, dim, "all_to_all")
        return self._collective("all_to_all", t, d, tag, dim=d)

    def _split_dim(self, t: torch.Tensor, dim: int, what: str) -> int:
        """``dim`` normalised, after checking it splits into world_size equal chunks."""
        d = _normalise_dim(t, dim, what)
        if t.dim() == 0 or t.shape[d] % self.world_size:
            size = t.shape[d] if t.dim() else "a 0-d tensor"
            raise ValueError(f"{what}: size {size} along dim={dim} is not divisible by world_size={self.world_size}")
        return d

    def _collective(self, op: str, t: torch.Tensor, arg: str | int, tag: str, **fields: Any) -> torch.Tensor:
        if self.world_size == 1:
            return t
        x = self._prepare(t)
        self._record(op, x, tag=tag, **fields)
        return getattr(self, f"_{op}_impl")(x, arg)

    # ---- point-to-point -----------------------------------------------------------------------------
    def _check_peer(self, what: str, name: str, peer: int) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size:
            raise ValueError(f"{what}: {name}={peer!r} is not in [0, world_size={self.world_size})")
        if peer == self.rank:
            raise ValueError(f"{what}: {name}={peer} is this rank itself (rank {self.rank}); a rank cannot "
                             f"{what} to or from itself")

    def send(self, t: torch.Tensor, dst: int, *, tag: str = "") -> None:
        self._check_peer("send", "dst", dst)
        x = self._prepare(t)
        self._record("send", x, peer=dst, tag=tag)
        self._send_impl(x, dst)

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int, *, tag: str = "") -> torch.Tensor:
        self._check_peer("recv", "src", src)
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"recv: shape={shape} has a negative size")
        out = self._recv_impl(shape, dtype, src)
        self._record("recv", out, peer=src, tag=tag)
        return out

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

    def _all_to_all_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    def _send_impl(self, x: torch.Tensor, dst: int) -> None:
        raise NotImplementedError

    def _recv_impl(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
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
    def ledger(self) -> Ledger:
        """Rank 0's ledger of the most recent run (``run`` checks that every rank's collective rows are
        identical and that sends and recvs pair up: `ledger.ledger_problem`)."""
        return self.ledgers[0]

    def _check_ledgers(self) -> None:
        problem = ledger_problem(self.ledgers)
        if problem is not None:
            raise CollectiveMismatch(problem)
