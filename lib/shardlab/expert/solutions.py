"""Reference solutions of notebook 11's exercises (graded by ``shardlab.core.exercises``; never printed).

Every exercise states its own sizes, so the answers do not depend on the notebook's parameters; the hand-written
key is ``data/answers/11_expert_parallel.json``. Exercise 5 is code: the learner's per-rank function runs on 4
simulated ranks whose buffers encode (source rank, expert, slot) in their values, and what each rank returns is
compared with the layout worked out by arithmetic here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardlab.comm import SimulatedWorld
from shardlab.core.topics import Solution
from shardlab.formulas import expert as fexp
from shardlab.formulas.common import wire_bytes

EP, E, C, H = 4, 8, 3, 2  # exercise 5: ranks, experts, slots per expert, width


def _value(rank: int, expert: int, slot: int) -> int:
    return 1000 * rank + 10 * expert + slot


def _buffers() -> list[torch.Tensor]:
    """Rank r's packed buffer [E, C, h]: slot c of expert e holds (value, -value), value = 1000 r + 10 e + c."""
    out = []
    for r in range(EP):
        v = torch.tensor([[_value(r, e, c) for c in range(C)] for e in range(E)], dtype=torch.float64)
        out.append(torch.stack([v, -v], dim=-1))
    return out


def _run(fn: Callable[..., Any]) -> list[Any]:
    """Each rank's result as nested ints, then how many all-to-alls each rank issued."""
    bufs = _buffers()
    world = SimulatedWorld(EP)
    got = world.run(lambda comm: fn(comm, bufs[comm.rank].clone()))
    rows = [torch.as_tensor(g).round().long().tolist() for g in got]
    return [rows, [lg.count("all_to_all") for lg in world.ledgers]]


def _expected() -> list[Any]:
    """Rank j, local expert i (global e = j·E/ep + i): row r·C + c is source rank r's slot c of expert e."""
    per = E // EP
    rows = [[[[_value(r, j * per + i, c), -_value(r, j * per + i, c)] for r in range(EP) for c in range(C)]
             for i in range(per)] for j in range(EP)]
    return [rows, [1] * EP]


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "11_expert_parallel": {
        1: Solution(lambda: fexp.expert_params_per_chip(8, 8, 4096, 14336, "bfloat16"),
                    "each chip holds E / ep whole experts; a SwiGLU expert has three [h, f] matrices"),
        2: Solution(lambda: fexp.all_to_all(4096, 4096, 8, 2, 1.25, 8, "bfloat16")["bytes"] // 2,
                    "the buffer has a row for every slot of every expert — C = ceil(cf·k·S/E) slots each, used or "
                    "not — and the whole buffer is handed to the all-to-all"),
        3: Solution(lambda: wire_bytes("all_to_all", fexp.all_to_all(4096, 4096, 8, 2, 1.25, 4,
                                                                     "bfloat16")["bytes"] // 2, 4),
                    "each device still routes its own tokens, so the payload is unchanged; of it, the block for "
                    "the device's own experts stays home"),
        4: Solution(lambda: fexp.dropped_from_loads([[6, 5, 3, 2]], fexp.capacity(8, 4, 2, 1.0)) / 16,
                    "first the capacity C = ceil(cf·k·S/E); every assignment beyond C of one expert is dropped, "
                    "whichever token it belongs to", rel_tol=1e-9),
        5: Solution(_expected,
                    "chunk j of the all-to-all's input goes to rank j, and chunk r of its output came from rank r: "
                    "the received [ep·E/ep, C, h] is ordered (source rank, local expert) — regroup it by local expert",
                    run=_run),
    },
}
