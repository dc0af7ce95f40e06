"""shardlab.comm — collectives for per-rank (Megatron-style) code, simulated in-process or on gloo.

Stable API (other modules depend on it; only additive changes)
--------------------------------------------------------------
Per-rank code is a function `fn(comm, *args) -> result`.  `comm` satisfies the `Comm` protocol:

    comm.rank, comm.world_size, comm.ledger
    comm.all_reduce(t, op="sum"|"max", *, tag="")  -> same shape as t, reduced over ranks
    comm.all_gather(t, dim=0, *, tag="")           -> cat of every rank's t along dim, rank order
    comm.reduce_scatter(t, dim=0, *, tag="")       -> chunk `rank` of the sum over ranks (dim size % W == 0)
    comm.broadcast(t, src=0, *, tag="")            -> src's t on every rank
    comm.all_to_all(t, dim=0, *, tag="")           -> cat over j of chunk `rank` of rank j's t (dim size % W == 0)
    comm.send(t, dst, *, tag="")                   -> None; buffered (returns before dst received it)
    comm.recv(shape, dtype, src, *, tag="")        -> the next tensor src sent here (blocks; FIFO per pair)

Collectives return a NEW tensor and never modify their input.  They are raw: not differentiable (results
carry no autograd history, like torch.distributed); differentiable mappings built on them live in
`shardlab.tp.mappings` (f, g, gather/scatter) and `shardlab.fsdp`.  At world size 1 every collective
returns its input unchanged and records nothing; send / recv to the rank itself is an error.  `tag` is a free
label copied into the ledger row.

Worlds (same interface):

    world = SimulatedWorld(W)        # W threads in this process; deterministic rank-order reductions
    world = DistributedWorld(W)      # W processes on torch.distributed gloo (fn/args must pickle)
    results = world.run(fn, *args, **kwargs)   # [rank 0 result, ..., rank W-1 result]
    world.ledger                     # Ledger of the last run (rank 0's; world.ledgers holds every rank's)
    results, ledger = launch(fn, W, *args)     # DistributedWorld one-liner

Ledger (`shardlab.comm.ledger`): a list of `LedgerEntry(seq, op, group_size, dtype, shape, payload_bytes,
wire_bytes, phase, reduce_op, dim, src, tag, peer)` — `shape` is this rank's input shape (recv: the received
tensor's), `payload_bytes` its bytes (what this rank hands over; recv: what it received), `wire_bytes` the ring
model per rank (send: the payload, recv: 0), `peer` the other rank of a send / recv, `phase` "forward" or
"backward" (detected from the autograd engine, or set with `phase_scope("backward")`).  Every run checks the
ranks' ledgers: collective rows identical on every rank, sends and recvs paired (`ledger_problem`).
Helpers: `ledger.count(op, phase, tag)`, `ledger.payload_bytes(...)`,
`ledger.wire_bytes(...)`, `ledger.select(...)`, `ledger.to_frame()`, `ledger.summary()`,
`ledger.to_records()`.

Example (`ones * rank` arithmetic: 0 + 1 + 2 + 3 = 6)::

    from shardlab.comm import SimulatedWorld
    world = SimulatedWorld(4)
    out = world.run(lambda comm: comm.all_reduce(torch.ones(3) * comm.rank))
    # every rank: tensor([6., 6., 6.]);  world.ledger[0].payload_bytes == 12, wire_bytes == 18.0

Errors: mismatched collectives across ranks raise `CollectiveMismatch` naming both calls; an exception on any
rank aborts the others and is re-raised as `RankError("rank r failed: ...")`.
"""

from shardlab.comm.base import REDUCE_OPS, CollectiveMismatch, Comm, CommBase, RankError
from shardlab.comm.distributed import DistributedWorld, TorchDistributedComm, launch
from shardlab.comm.ledger import (
    COLLECTIVE_OPS,
    OPS,
    P2P_OPS,
    PHASES,
    Ledger,
    LedgerEntry,
    current_phase,
    ledger_problem,
    phase_scope,
    ring_wire_bytes,
)
from shardlab.comm.simulated import SimulatedComm, SimulatedWorld

__all__ = [
    "COLLECTIVE_OPS",
    "OPS",
    "P2P_OPS",
    "PHASES",
    "REDUCE_OPS",
    "CollectiveMismatch",
    "Comm",
    "CommBase",
    "DistributedWorld",
    "Ledger",
    "LedgerEntry",
    "RankError",
    "SimulatedComm",
    "SimulatedWorld",
    "TorchDistributedComm",
    "current_phase",
    "launch",
    "ledger_problem",
    "phase_scope",
    "ring_wire_bytes",
]
