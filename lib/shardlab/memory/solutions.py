"""Reference solutions of notebook 08b's exercises (graded by ``shardlab.core.exercises``; never printed).

Every exercise states its own sizes, so the answers do not depend on the notebook's parameters; exercises 2 and 3
are graded against what the compiler produced (the cached Llama 3 8B flash program, the notebook's own flash
compile) when the notebook passes it. The hand-written key is ``data/answers/08b_memory.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.core.topics import Solution
from shardlab.memory import flash
from shardlab.memory.params import LLAMA3_8B_ATTENTION, MemoryParams
from shardlab.profile import order as order_mod
from shardlab.profile.tpu import get_topology

LLAMA_8K = MemoryParams(seq=8192, **LLAMA3_8B_ATTENTION)
LANES = 128  # torch_xla's flash kernel keeps its softmax statistics l and m 128 lanes wide


def update_toy() -> order_mod.Graph:
    """Exercise 5's graph (MB): the backward of two layers and their Adam updates, in PyTorch's program order —
    backward first (``loss.backward()``), then every update (``optimizer.step()``). ``dW`` writes a weight gradient
    g, ``dx2`` the gradient flowing into layer 1, ``adam`` Adam's parameter-sized temporary u (√v̂ + ε and the step),
    ``apply`` the in-place write of the weight (allocates nothing)."""
    return order_mod.graph({
        "loss_grad": ((), {"dy": 2}),
        "dW2": (("dy",), {"gW2": 8}),
        "dx2": (("dy",), {"dh": 4}),
        "dW1": (("dh",), {"gW1": 8}),
        "adam2": (("gW2",), {"u2": 8}),
        "apply2": (("u2",), {}),
        "adam1": (("gW1",), {"u1": 8}),
        "apply1": (("u1",), {}),
    }, name="two layers' backward + Adam")


def price(order: Sequence[str]) -> int:
    """The peak (MB) of the learner's order of :func:`update_toy` (an invalid order raises, naming the rule)."""
    return order_mod.peak(update_toy(), tuple(order)).peak


def plain_fit(heads: int = 32, arrays: int = 3, elem: int = 4, topology: str = "v5e-1", step: int = 1024) -> int:
    """The longest multiple of ``step`` whose ``arrays`` fp32 [heads, s, s] arrays fit one chip's HBM."""
    cap = get_topology(topology).hbm_bytes
    s = step
    while arrays * elem * heads * (s + step) ** 2 <= cap:
        s += step
    return s


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "08b_memory": {
        1: Solution(lambda: flash.formula_temp_bytes(LLAMA_8K, "plain"),
                    "the planner keeps the softmax P for the backward and holds dP and dS beside it: three [a, s, s] "
                    "arrays of e = 2 bytes per chip"),
        2: Solution(lambda largest=None: 2 * 4 * 32 * 8192 * LANES if largest is None
                    else largest - 2 * 32 * 8192 * 128,
                    "l and m are fp32 [b, a, s, 128] each — the running max and sum, broadcast over the 128 lanes"),
        3: Solution(lambda count=None: 3 if count is None else count,
                    "the kernel is a forward plus a backward; how many Pallas kernels does torch_xla's backward "
                    "call (one for dq, and?)"),
        4: Solution(plain_fit,
                    "three fp32 [32, s, s] arrays: 3·4·32·s² bytes must stay within the chip's 15.75 GiB; round s "
                    "down to a multiple of 1024"),
        5: Solution(lambda: order_mod.extremes(update_toy()).best.peak,
                    "an update frees its gradient and its temporary: run each layer's Adam right after its dW, and "
                    "do not hold two weight gradients at once", run=price),
    },
}
