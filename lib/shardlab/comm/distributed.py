"""The same Comm protocol over `torch.distributed` (gloo on CPU), and a launcher for W real processes.

Design note
-----------
`TorchDistributedComm` maps each collective onto the matching `torch.distributed` call on a copy of the input
(torch.distributed works in place; our protocol returns a new tensor), through the same `CommBase` front half
as the simulated backend, so validation and ledger rows are identical by construction.

`DistributedWorld(W).run(fn, *args)` starts W processes, each joins a gloo group through a FileStore in a temp
dir, runs `fn(comm, *args)` and ships back `torch.save`-serialised (result, ledger rows). Start method
"forkserver" (where the platform has it, else "spawn"): the first world of a process starts one clean server
process — itself a fresh interpreter, so this is safe even when the parent holds torch_xla's runtime
threads — that imports torch and this module once (`FORKSERVER_PRELOAD`); every rank of every later world is
forked from it. A spawned rank re-imports torch (~2.6 s of CPU each; 4 ranks of a tp=4 replay took ~8 s of
CPU and ~18 s on two busy cores), a forked one starts in milliseconds. The server keeps the environment and
`sys.path` of the moment it started; nothing here reads either (the FileStore path is an argument).
`fn` and `args` must be picklable: use module-level functions (e.g. `shardlab.tp.programs`), not lambdas or
notebook-local defs.
It returns per-rank results in rank order and exposes rank 0's ledger as `world.ledger` after checking every
rank recorded the same ledger.

Point-to-point: `send` is `dist.isend` (the work handle and the tensor are kept until the work completed; every
pending send is waited for before the rank's `fn` result is shipped back, `wait_sends()`), `recv` is a blocking
`dist.recv` into a fresh buffer of the requested shape.  gloo delivers the messages of one (src, dst) pair in
order.  `all_to_all` is `dist.all_to_all_single` on dim 0 (another dim is moved to the front and back).

Results match SimulatedWorld's up to floating-point summation order: gloo's all-reduce may add the W
contributions in a different order than the simulated rank order (identical for W=2, since a+b == b+a).
"""

from __future__ import annotations

import io
import os
import pickle
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardlab.comm.base import Comm, CommBase, RankError, WorldBase
from shardlab.comm.ledger import Ledger

_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
FORKSERVER_PRELOAD = ["shardlab.comm.distributed"]     # torch, torch.distributed and this module's _worker


def _context() -> Any:
    ctx = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


class TorchDistributedComm(CommBase):
    """Comm over the default (or a given) torch.distributed process group."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
        self.group = group
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        self._pending: list[tuple[Any, torch.Tensor]] = []  # (isend work, its buffer) until completed

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank) if self.group else rank

    def _all_reduce_impl(self, x: torch.Tensor, op: str) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, op=_REDUCE[op], group=self.group)
        return out

    def _all_gather_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)

    def _reduce_scatter_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        chunks = [c.contiguous() for c in x.chunk(self.world_size, dim=dim)]
        out = torch.empty_like(chunks[self.rank])
        dist.reduce_scatter(out, chunks, group=self.group)
        return out

    def _all_to_all_impl(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        front = x.movedim(dim, 0).contiguous()  # chunks along dim == chunks along dim 0 after the move
        out = torch.empty_like(front)
        dist.all_to_all_single(out, front, group=self.group)
        return out.movedim(0, dim).contiguous()

    def _send_impl(self, x: torch.Tensor, dst: int) -> None:
        self._pending = [(w, b) for w, b in self._pending if not w.is_completed()]
        buf = x.clone()  # the caller may modify its tensor as soon as send returns
        self._pending.append((dist.isend(buf, dst=self._global(dst), group=self.group), buf))

    def _recv_impl(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        dist.recv(out, src=self._global(src), group=self.group)
        return out

    def wait_sends(self) -> None:
        """Block until every send this rank issued has been delivered."""
        for work, _ in self._pending:
            work.wait()
        self._pending = []


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank: int, world_size: int, init_file: str, timeout_s: float, fn, args, kwargs, queue) -> None:
    try:
        torch.set_num_threads(1)  # W processes share the machine's cores
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        comm = TorchDistributedComm()
        result = fn(comm, *args, **kwargs)
        comm.wait_sends()
        queue.put((rank, True, _dumps((result, comm.ledger.to_records()))))
    except BaseException:  # noqa: BLE001 — shipped to the parent
        queue.put((rank, False, traceback.format_exc().encode()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class DistributedWorld(WorldBase):
    """W real processes on gloo. Same interface as SimulatedWorld: `run(fn, *args)`, `ledger`, `ledgers`."""

    def __repr__(self) -> str:
        return f"DistributedWorld({self.world_size}, backend='gloo')"

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        w = self.world_size
        ctx = _context()
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory(prefix="shardlab-gloo-") as tmp:
            init_file = os.path.join(tmp, "store")
            procs = [
                ctx.Process(
                    target=_worker,
                    args=(r, w, init_file, self.timeout_s, fn, args, kwargs, queue),
                    daemon=True,
                )
                for r in range(w)
            ]
            for p in procs:
                p.start()
            replies: dict[int, tuple[bool, bytes]] = {}
            try:
                waited = 0.0
                while len(replies) < w and all(ok for ok, _ in replies.values()):
                    try:
                        rank, ok, payload = queue.get(timeout=1.0)
                        replies[rank] = (ok, payload)
                        continue
                    except queue_mod.Empty:
                        waited += 1.0
                    dead = [
                        r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in replies
                    ]
                    if dead:
                        replies[dead[0]] = (
                            False,
                            f"process exited with code {procs[dead[0]].exitcode}".encode(),
                        )
                    elif waited > self.timeout_s + 60:
                        raise TimeoutError(f"DistributedWorld({w}): no reply within {waited:.0f} s")
            finally:
                for p in procs:
                    p.join(timeout=5 if len(replies) == w else 1)
                    if p.is_alive():
                        p.kill()
                        p.join()
        failed = [(r, payload) for r, (ok, payload) in sorted(replies.items()) if not ok]
        if failed:
            r, tb = failed[0]
            raise RankError(f"rank {r} failed in its process:\n{tb.decode()}")
        results, ledgers = [], []
        for r in range(w):
            result, records = _loads(replies[r][1])
            results.append(result)
            ledgers.append(Ledger.from_records(records))
        self.ledgers = ledgers
        self._check_ledgers()
        return results


def run_programs(comm: Comm, jobs: list[tuple[bytes, bytes | None]]) -> list[dict[str, Any]]:
    """One rank of ``shardlab.core.harness.gloo_runs``: each pickled ``(fn, args)`` program, then its reference, on its
    own unpickled arguments; each program's collectives in a ledger of its own. It lives in this module, which the
    forkserver has already imported, so a rank imports nothing to run it. From the harness's module every rank first
    imported pandas and the core: measured, a 4-rank start-up of notebook 02's MLP step took 1.32 s, now 0.19 s."""
    out = []
    for program, reference in jobs:
        fn, args = pickle.loads(program)
        comm.ledger = Ledger()
        t0 = time.perf_counter()
        result = fn(comm, *args)
        wall_s, records = time.perf_counter() - t0, comm.ledger.to_records()
        comm.ledger = Ledger()  # the reference's own traffic (if it uses comm at all) is not the program's
        if reference is None:
            theirs = None
        else:
            ref_fn, ref_args = pickle.loads(reference)
            theirs = ref_fn(comm, *ref_args)
        out.append({"result": result, "records": records, "wall_s": wall_s, "reference": theirs})
    comm.ledger = Ledger()
    return out
