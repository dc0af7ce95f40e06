"""Reference solutions of notebook 09's exercises (graded by ``shardlab.core.exercises``; never printed).

Every exercise states its own sizes, so the answers do not depend on the notebook's parameters; the hand-written
key is ``data/answers/09_pipeline.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardlab.core.topics import Solution
from shardlab.formulas import pipeline as fpp
from shardlab.pipeline.schedules import one_f_one_b
from shardlab.pipeline.spmd import iterations

# (p, m, stage) cases the code exercise's function is run on: warm-up longer than, equal to and shorter than m
ORDER_CASES = ((4, 8, 0), (4, 8, 3), (3, 5, 1), (2, 2, 0), (4, 2, 0), (4, 2, 2))


def _orders(fn: Callable[[int, int, int], Any]) -> list[list[tuple[str, int]]]:
    return [[(str(kind), int(i)) for kind, i in fn(p, m, s)] for p, m, s in ORDER_CASES]


def _library_orders() -> list[list[tuple[str, int]]]:
    return [[(a.kind, a.microbatch) for a in one_f_one_b(p, m).devices[s]] for p, m, s in ORDER_CASES]


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "09_pipeline": {
        1: Solution(lambda: fpp.idle_fraction(8, 32),
                    "in GPipe every device idles for p - 1 stage-steps of forward and of backward, out of m + p - 1",
                    rel_tol=1e-3),
        2: Solution(lambda: int(fpp.p2p_traffic(8, 32, 1, 1, 1, v=4)["count"]),
                    "count stage boundaries first: p v stages in a row have p v - 1 of them; each microbatch crosses "
                    "every boundary once forward and once backward"),
        3: Solution(lambda: fpp.peak_inflight("1f1b", 8, 32, device=0),
                    "stage 0 runs p - 1 warm-up forwards, then one more forward before its first backward frees "
                    "anything"),
        4: Solution(_library_orders,
                    "stage s first runs min(p - s - 1, m) forwards, then alternates one forward and one backward "
                    "(the oldest microbatch first), then drains the remaining backwards",
                    run=_orders),
        5: Solution(lambda: 2 * iterations(8, 24),
                    "the loop runs once per time step of the pipeline, bubble steps included, and moves one shard "
                    "in every iteration; the backward loop mirrors the forward one"),
    },
}
