"""Notebook 11's parameters: one top-k routed MoE layer and the expert-parallel degree it is split over.

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``.

Every device (and every ledger rank) routes its own group of ``tokens`` tokens; the mesh is (data, expert) =
(n / ep, ep) over the process's n devices, so the default ep = 4 on 8 devices is a 2-D mesh: all-to-alls within
each expert group of 4, expert gradients summed over the data axis. ``ep`` may exceed ``num_devices``: formula and
ledger need no devices, the CPU compiler view is then skipped with a note, and the TPU view compiles for an
``ep``-chip slice in a helper process. The layer itself (:class:`shardlab.expert.moe.MoE`) is built from these
fields; nothing copies them.

Example::

    >>> ExpertParams(experts=6).validate()
    Traceback (most recent call last):
    ValueError: experts=6 is not divisible by ep=4 (each rank holds E/ep whole experts)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardlab.core.params import NotebookParams, boolean, divisible, positive_int


def positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number")


@dataclass(frozen=True)
class ExpertParams(NotebookParams):
    """Notebook 11 (see the module note)."""

    NOTEBOOK: ClassVar[str] = "11_expert_parallel"

    ep: int = 4  # expert-parallel degree: ranks of the ledger, size of the `expert` mesh axis (data: n / ep)
    tokens: int = 128  # S: tokens each device (and each rank) routes — one routing group each
    hidden: int = 64  # h: token width
    ffn: int = 256  # f: each expert's inner width (SwiGLU: 3·h·f weights per expert)
    experts: int = 8  # E, split over ep: E / ep whole experts per device
    top_k: int = 2  # k: experts per token
    capacity_factor: float = 1.25  # cf: C is ceil(cf·k·S/E) slots per expert and group; the rest is dropped
    normalize: bool = True  # renormalise each token's k gates to sum to 1 (GShard top-2, Mixtral)
    drop_factors: list = field(default_factory=lambda: [0.5, 0.75, 1.0, 1.25, 1.5, 2.0])  # cf of the drop table
    run_gloo: bool = False  # also run the per-rank code in ep real processes (gloo all_to_all_single; ~5 s)
    async_flag: bool = False  # also compile with XLA:TPU's xla_tpu_enable_async_all_to_all (one more compile)

    def checks(self) -> None:
        for name in ("ep", "tokens", "hidden", "ffn", "experts", "top_k"):
            positive_int(name, getattr(self, name))
        positive_number("capacity_factor", self.capacity_factor)
        boolean("normalize", self.normalize)
        boolean("run_gloo", self.run_gloo)
        boolean("async_flag", self.async_flag)
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} must be <= experts={self.experts} (k distinct experts per token)")
        divisible("experts", self.experts, "ep", self.ep, "each rank holds E/ep whole experts")
        if not isinstance(self.drop_factors, list | tuple) or not self.drop_factors:
            raise ValueError(f"drop_factors={self.drop_factors!r} must be a non-empty list of positive numbers")
        for cf in self.drop_factors:
            positive_number("drop_factors entry", cf)
