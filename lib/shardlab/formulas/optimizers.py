"""Optimizer state per trained tensor: the tensors AdamW, Adafactor and SGD keep, and their bytes.

Design note
-----------
One row per optimizer the suite traces, in two precisions:

    precision  fp32  mixed precision: the optimizer updates an fp32 **master** copy of each bf16 weight, so the
                     state torch.optim creates on it is fp32 too (ZeRO's K = 12 for Adam: master 4 + m 4 + v 4)
               bf16  the optimizer updates the bf16 weights themselves: no master, state in bf16 (what torch.optim
                     creates on bf16 parameters)

    optimizer     state per tensor (besides the master)               bytes / parameter (fp32 | bf16)
    adamw         exp_avg, exp_avg_sq, shaped like the weight          12 | 4
    sgd           none                                                  4 | 0
    sgd-momentum  momentum_buffer, shaped like the weight               8 | 2
    adafactor     >= 2-D: row_var (last dim -> 1) and col_var            4 + (rows + cols) / (rows * cols) x 4 | ...
                  (second-to-last dim -> 1), factored second moments;  (torch.optim.Adafactor's layout, beta1=None:
                  1-D: variance shaped like the weight                  no first moment)

The layouts are those of ``torch.optim.AdamW`` / ``SGD(momentum=...)`` / ``Adafactor`` (torch 2.9: ``state[p]``
after one step); every optimizer there also keeps a 0-d ``step`` counter per tensor (fp32), which is a compile-time
constant of one traced step and is left out here. Adafactor factors over the **last two** dimensions, so a
stacked ``[L, out, in]`` weight keeps ``[L, out, 1]`` and ``[L, 1, in]``: the same bytes as L separate layers.

Example::

    >>> [t.name for t in state_tensors("adafactor", "fp32", (4096, 1024))]
    ['master', 'row_var', 'col_var']
    >>> state_bytes("adafactor", "bf16", (4096, 1024)), state_bytes("adamw", "bf16", (4096, 1024))
    (10240, 16777216)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

OPTIMIZERS = ("adamw", "adafactor", "sgd", "sgd-momentum")
PRECISIONS = ("fp32", "bf16")
ITEMSIZE = {"fp32": 4, "bf16": 2}
NAMES = {"adamw": "AdamW", "adafactor": "Adafactor", "sgd": "SGD", "sgd-momentum": "SGD with momentum"}


@dataclass(frozen=True)
class StateTensor:
    """One tensor the optimizer keeps for a weight."""

    name: str  # master | exp_avg | exp_avg_sq | momentum_buffer | row_var | col_var | variance
    shape: tuple[int, ...]
    dtype: str  # fp32 | bf16
    reduced: int | None = None  # the dimension reduced to 1 (Adafactor's factors), else None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


def check(optimizer: str, precision: str) -> None:
    """ValueError naming the value and the choices (an unknown optimizer or precision)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {OPTIMIZERS}")
    if precision not in PRECISIONS:
        raise ValueError(f"optimizer dtype={precision!r} must be one of {PRECISIONS} (fp32: an fp32 master copy and "
                         "fp32 state; bf16: no master, bf16 state)")


def state_tensors(optimizer: str, precision: str, shape: tuple[int, ...]) -> list[StateTensor]:
    """The tensors ``optimizer`` keeps for one weight of ``shape``, in the order the traced step outputs them."""
    check(optimizer, precision)
    shape = tuple(shape)
    out = [StateTensor("master", shape, "fp32")] if precision == "fp32" else []
    if optimizer == "adamw":
        out += [StateTensor("exp_avg", shape, precision), StateTensor("exp_avg_sq", shape, precision)]
    elif optimizer == "sgd-momentum":
        out.append(StateTensor("momentum_buffer", shape, precision))
    elif optimizer == "adafactor":
        if len(shape) >= 2:
            n = len(shape)
            out += [StateTensor("row_var", (*shape[:-1], 1), precision, n - 1),
                    StateTensor("col_var", (*shape[:-2], 1, shape[-1]), precision, n - 2)]
        else:
            out.append(StateTensor("variance", shape, precision))
    return out


def state_bytes(optimizer: str, precision: str, shape: tuple[int, ...]) -> int:
    """Bytes of every state tensor of one weight (the master included when ``precision='fp32'``)."""
    return sum(t.nbytes for t in state_tensors(optimizer, precision, shape))


def bytes_per_param(optimizer: str, precision: str, shapes: Iterable[tuple[int, ...]] = ()) -> float:
    """State bytes per parameter (ZeRO's K) over the weights ``shapes``; for every optimizer but Adafactor a
    constant (``shapes`` may be empty), for Adafactor the factored average of ``shapes`` (required)."""
    check(optimizer, precision)
    shapes = [tuple(s) for s in shapes]
    if optimizer != "adafactor":
        return state_bytes(optimizer, precision, (1,))
    if not shapes:
        raise ValueError("Adafactor's bytes per parameter depend on the weights' shapes: pass shapes")
    return sum(state_bytes(optimizer, precision, s) for s in shapes) / sum(math.prod(s) for s in shapes)


def describe(optimizer: str, precision: str) -> str:
    """``"AdamW, fp32: master + exp_avg + exp_avg_sq"`` (the state a row of memory holds)."""
    check(optimizer, precision)
    parts = {"adamw": ["exp_avg", "exp_avg_sq"], "sgd": [], "sgd-momentum": ["momentum_buffer"],
             "adafactor": ["row_var + col_var (factored, >= 2-D)", "variance (1-D)"]}[optimizer]
    state = (["fp32 master"] if precision == "fp32" else []) + (
        [" / ".join(parts)] if optimizer == "adafactor" else parts)
    return (f"{NAMES[optimizer]}, {precision}: " + (" + ".join(state) if state else "no state") +
            ("" if precision == "fp32" else " (no master: the bf16 weights are updated directly)"))
