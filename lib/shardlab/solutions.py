"""Reference solutions of the notebooks' exercises (graded by ``shardlab.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.formulas import tp as ftp


@dataclass(frozen=True)
class Solution:
    expected: Callable[..., Any]  # (**measured) -> the reference answer
    hint: str  # what to think about; never the answer itself
    rel_tol: float = 0.0  # numbers: accepted relative error (0: exact)


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "02_megatron_mlp": {
        1: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16")["bytes"],
                    "the forward all-reduce (g) sums the full activation [b, s, h]; payload = elements × bytes "
                    "per element, and tp does not appear"),
        2: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16", backward=True,
                                               input_requires_grad=False)["count"],
                    "f's backward all-reduce sums the INPUT gradient — is there one to sum?"),
        3: Solution(lambda: 2,
                    "GeLU(a + b) ≠ GeLU(a) + GeLU(b): with A split by rows, where must the partial sums be added?"),
    },
}
