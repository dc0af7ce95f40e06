"""shardlab.comm — collectives for per-rank (Megatron-style) code, simulated in-process or on gloo.

Per-rank code is a function ``fn(comm, *args)``; ``comm`` satisfies :class:`Comm` (``base``: all_reduce,
all_gather, reduce_scatter, all_to_all, send, recv — their semantics are listed there). Collectives return a new
tensor and are not differentiable; the autograd mappings built on them live in ``shardlab.tp.mappings`` and
``shardlab.fsdp``. Two worlds run ``fn`` on W ranks with the same interface — ``SimulatedWorld(W)`` (threads,
``simulated``) and ``DistributedWorld(W)`` (gloo processes, ``distributed``): ``world.run(fn, *args)`` returns the
ranks' results and ``world.ledger`` rank 0's :class:`Ledger` (``ledger``: one row per collective, payload and
ring-wire bytes, phase). Every run checks that the ranks' ledgers agree.

Example (``ones * rank`` arithmetic: 0 + 1 + 2 + 3 = 6)::

    world = SimulatedWorld(4)
    out = world.run(lambda comm: comm.all_reduce(torch.ones(3) * comm.rank))
    # every rank: tensor([6., 6., 6.]);  world.ledger[0].payload_bytes == 12, wire_bytes == 18.0
"""

from shardlab.comm.base import REDUCE_OPS, CollectiveMismatch, Comm, CommBase, RankError
from shardlab.comm.distributed import DistributedWorld, TorchDistributedComm
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
    "ledger_problem",
    "phase_scope",
    "ring_wire_bytes",
]
