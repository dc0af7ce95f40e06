"""SimulatedWorld: W ranks as W threads of one Python process.

Design note
-----------
`world.run(fn, *args)` starts one thread per rank, each calling `fn(comm, *args)` with its own
`SimulatedComm`.  A collective is a rendezvous on a shared `threading.Barrier`: every rank deposits its
(op, arguments, tensor) in its slot and waits; the barrier's action runs exactly once, after all ranks have
arrived, checks that they all called the same collective with matching shapes/dtypes (else every rank raises
`CollectiveMismatch` naming the values), and computes each rank's result.  Reductions add in rank order, so
all ranks get bit-identical results and the run is deterministic.  One barrier per collective is enough: the
next action cannot run before every rank has left the previous collective and read its result.

Why threads: on CPU, the autograd engine runs a backward pass in the thread that called `.backward()`, so each
rank's backward (and the collectives inside `autograd.Function.backward`) runs in that rank's thread, in that
rank's order.  Per-rank code is therefore written exactly as for real processes.

Point-to-point: one FIFO mailbox per ordered (src, dst) pair.  `send` appends a copy of the tensor and returns at
once (buffered, like an `isend` whose buffer the sender may reuse); `recv` waits until the pair's mailbox holds a
message, takes the oldest and checks it has the shape and dtype the receiver asked for.  No barrier is involved,
so only the two ranks synchronise, exactly as with real sends.

If a rank raises, the barrier and the mailboxes are aborted so the other ranks stop waiting; `run` re-raises the
first real error as `RankError` ("rank 2 failed: ...").  A rank stuck for `timeout_s` also aborts the run.

Example (a ring shift: every rank sends to the next and receives from the previous)::

    def shift(comm):
        comm.send(torch.ones(2) * comm.rank, (comm.rank + 1) % comm.world_size)
        return comm.recv((2,), torch.float32, (comm.rank - 1) % comm.world_size)
    SimulatedWorld(4).run(shift)                                          # rank r: tensor([r-1, r-1]) mod 4
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from shardlab.comm.base import CollectiveMismatch, CommBase, RankError, WorldBase

__all__ = ["CollectiveMismatch", "RankError", "SimulatedComm", "SimulatedWorld"]


class _Mailboxes:
    """FIFO queues of tensors per (src, dst); `get` blocks until a message arrives, the run aborts or times out."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.boxes: dict[tuple[int, int], deque[torch.Tensor]] = {}
        self.cond = threading.Condition()
        self.aborted = False

    def put(self, src: int, dst: int, x: torch.Tensor) -> None:
        with self.cond:
            self.boxes.setdefault((src, dst), deque()).append(x)
            self.cond.notify_all()

    def get(self, src: int, dst: int) -> torch.Tensor:
        with self.cond:
            box = self.boxes.setdefault((src, dst), deque())
            if not self.cond.wait_for(lambda: box or self.aborted, timeout=self.timeout_s):
                raise RankError(f"rank {dst}: recv from rank {src} was aborted — nothing arrived within "
                                f"timeout_s={self.timeout_s}")
            if not box:
                raise RankError(f"rank {dst}: recv from rank {src} was aborted — another rank failed")
            return box.popleft()

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.cond.notify_all()


class _Rendezvous:
    def __init__(self, world_size: int, timeout_s: float) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.slots: list[tuple[str, str | int, torch.Tensor] | None] = [None] * world_size
        self.results: list[torch.Tensor | None] = [None] * world_size
        self.error: Exception | None = None
        self.count = 0
        self.barrier = threading.Barrier(world_size, action=self._combine, timeout=timeout_s)

    def exchange(self, rank: int, op: str, arg: str | int, x: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = (op, arg, x)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise RankError(
                f"rank {rank}: collective #{self.count} ({op}) was aborted — another rank failed, or not "
                f"every rank called it within timeout_s={self.timeout_s}"
            ) from None
        if self.error is not None:
            raise CollectiveMismatch(str(self.error))
        out = self.results[rank]
        assert out is not None
        return out

    def _combine(self) -> None:  # runs once per collective, in one thread, while all ranks wait
        self.error = None
        slots = [s for s in self.slots if s is not None]
        op, arg, x0 = slots[0]
        try:
            for r, (op_r, arg_r, x_r) in enumerate(slots):
                if (op_r, arg_r) != (op, arg) or x_r.shape != x0.shape or x_r.dtype != x0.dtype:
                    raise CollectiveMismatch(
                        f"collective #{self.count}: rank 0 called {op}({arg}) with {x0.dtype} "
                        f"{tuple(x0.shape)} but rank {r} called {op_r}({arg_r}) with {x_r.dtype} "
                        f"{tuple(x_r.shape)}"
                    )
            xs = [s[2] for s in slots]
            self.results = self._compute(op, arg, xs)
        except Exception as e:  # reported on every rank by exchange()
            self.error = e
        self.slots = [None] * self.world_size
        self.count += 1

    def _compute(self, op: str, arg: str | int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        w = self.world_size
        with torch.no_grad():
            if op in ("all_reduce", "reduce_scatter"):
                acc = xs[0].clone()
                for x in xs[1:]:  # rank order: deterministic and identical on every rank
                    if op == "all_reduce" and arg == "max":
                        torch.maximum(acc, x, out=acc)
                    else:
                        acc.add_(x)
                if op == "all_reduce":
                    return [acc.clone() for _ in range(w)]
                return [c.clone() for c in acc.chunk(w, dim=arg)]
            if op == "all_gather":
                full = torch.cat(xs, dim=arg)
                return [full.clone() for _ in range(w)]
            if op == "all_to_all":  # rank j gets chunk j of every rank's input, in rank order
                chunks = [x.chunk(w, dim=arg) for x in xs]
                return [torch.cat([chunks[i][j] for i in range(w)], dim=arg) for j in range(w)]
        raise ValueError(f"unknown collective {op!r}")


class SimulatedComm(CommBase):
    """One rank's view of a SimulatedWorld."""

    def __init__(
        self, rank: int, world_size: int, rendezvous: _Rendezvous | None, mailboxes: _Mailboxes | None = None
    ) -> None:
        super().__init__(rank, world_size)
        self._rv = rendezvous
        self._mail = mailboxes

    def _exchange(self, op: str, arg: str | int, x: torch.Tensor) -> torch.Tensor:
        assert self._rv is not None  # world size 1 never reaches a transport call
        return self._rv.exchange(self.rank, op, arg, x)

    def _all_reduce_impl(self, x: torch.Tensor, op: str) -> torch.Tensor:
        return self._exchange("all_reduce", op, x)

    def _all_gather_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return self._exchange("all_gather", dim, x)

    def _reduce_scatter_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return self._exchange("reduce_scatter", dim, x)

    def _all_to_all_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return self._exchange("all_to_all", dim, x)

    def _send_impl(self, x: torch.Tensor, dst: int) -> None:
        assert self._mail is not None  # send to self is refused, so world size 1 never gets here
        self._mail.put(self.rank, dst, x.clone())

    def _recv_impl(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        assert self._mail is not None
        x = self._mail.get(src, self.rank)
        if tuple(x.shape) != shape or x.dtype != dtype:
            raise CollectiveMismatch(
                f"recv on rank {self.rank} from rank {src} expected {dtype} {shape} but rank {src} sent "
                f"{x.dtype} {tuple(x.shape)}"
            )
        return x


class SimulatedWorld(WorldBase):
    """W in-process ranks. `run(fn, *args, **kwargs)` -> [fn(comm_0, ...), ..., fn(comm_{W-1}, ...)].

    `ledger` is rank 0's ledger of the most recent run (each run starts a fresh one); `ledgers` holds every
    rank's, and `run` checks they are identical.
    """

    def __repr__(self) -> str:
        return f"SimulatedWorld({self.world_size})"

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        w = self.world_size
        rv = _Rendezvous(w, self.timeout_s) if w > 1 else None
        mail = _Mailboxes(self.timeout_s) if w > 1 else None
        comms = [SimulatedComm(r, w, rv, mail) for r in range(w)]
        self.ledgers = [c.ledger for c in comms]
        if w == 1:
            return [fn(comms[0], *args, **kwargs)]

        results: list[Any] = [None] * w
        errors: list[BaseException | None] = [None] * w

        def body(rank: int) -> None:
            try:
                results[rank] = fn(comms[rank], *args, **kwargs)
            except BaseException as e:  # noqa: BLE001 — reported by run()
                errors[rank] = e
                assert rv is not None and mail is not None
                rv.barrier.abort()
                mail.abort()

        threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(w)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            # Prefer the root cause over the "aborted" errors it triggered on the other ranks.
            root = [(r, e) for r, e in failed if not (isinstance(e, RankError) and "aborted" in str(e))]
            r, e = (root or failed)[0]
            if isinstance(e, CollectiveMismatch):
                raise e
            raise RankError(f"rank {r} failed: {type(e).__name__}: {e}") from e
        self._check_ledgers()
        return results
