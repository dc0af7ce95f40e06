"""When an axis turns communication-bound: the MLP step compiled for a slice at a range of sizes, priced from the
program, beside the JAX scaling book's critical intensity.

Design
------
The scaling book's lesson ("How to parallelize a transformer for training"): a sharded step is compute-bound while
the FLOPs per byte sent exceed the chip's FLOP/s over its ICI bandwidth, C / W. Written for notebook 13's MLP block
(:mod:`shardlab.timing.programs`, P = 2·d·f parameters, bf16, one mesh axis of n chips, W = the ICI egress of the
torus axes that axis spans):

- fsdp: one all-gather of each weight, one reduce-scatter of each gradient (a single graph keeps the gathered
  weights for the backward): wire 2·(n−1)/n·2P bytes against 6·T·P / C seconds of FLOPs →
  ``T* = (2/3)·(n−1)/n · C/W`` tokens per chip;
- tensor: an all-reduce of [T, d] forward and one backward: wire 2·2(n−1)/n·2·T·d against 6·T·P/n →
  ``f* = (2/3)·(n−1) · C/W`` (independent of T);
- data: one all-reduce of each gradient: wire 2(n−1)/n·2P against 6·T·P →  ``T* = (2/3)·(n−1)/n · C/W``;
- context (:class:`~shardlab.timing.programs.AttentionStep`, L positions per chip, s = n·L, hq query and hkv K/V
  heads of width dh): K and V all-gathered forward, their gradients reduce-scattered backward, 4·(n−1)·b·L·hkv·dh·2
  bytes, against 12·b·hq·L·s·dh attention FLOPs: the ratio FLOPs / bytes = (3/2)·(hq/hkv)·n/(n−1)·L grows with
  L, so ``L* = (2/3)·(hkv/hq)·(n−1)/n · C/W`` positions per chip;
- expert (:class:`~shardlab.timing.programs.MoeStep`, E experts, capacity C slots per expert and group, width h,
  expert width f): four all-to-alls of the chip's [E, 1, C, h] block, 4·(n−1)/n·E·C·h·2 bytes, against
  18·E·C·h·f expert-MLP FLOPs: tokens (through C) cancel, the ratio is (9/4)·n/(n−1)·f, so
  ``f* = (4/9)·(n−1)/n · C/W`` (the expert's inner width).

The compiler's side (:func:`price`): each point compiled for the slice and priced by
:func:`shardlab.profile.step_time.step_time` — compute from the kernels' estimates, wire time from the program's
own collectives, exposed communication as the schedule overlaps it. The measured crossover is the first swept size
from which on the program's wire time is at most its compute time (the book's definition: past it, perfect overlap
could hide every byte); the exposed communication the schedule leaves is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlab.formulas import hardware
from shardlab.profile import step_time as st
from shardlab.profile import tpu
from shardlab.timing.programs import AttentionStep, MlpStep, MoeStep

EXPOSED_SHARE = 0.10  # "communication hidden": exposed comm at most this share of the step


@dataclass(frozen=True)
class TimingPoint:
    """One swept configuration, priced."""

    cfg: MlpStep | AttentionStep | MoeStep
    topology: str
    compute_s: float
    comm_s: float  # wire time of the program's collectives
    exposed_s: float
    step_s: float
    formula_compute_s: float  # 6·T·P/chips / C
    formula_comm_s: float  # the collectives the formula assumes, at the same egress
    collectives: dict[str, int]  # op -> executions per step in the program
    flops: int  # matmul FLOPs per chip read from the program (dots x loop trips)
    wire_bytes: int = 0  # per chip, every collective of the program (one execution x runs)

    @property
    def ratio(self) -> float:  # comm / compute, compiler
        return self.comm_s / self.compute_s

    @property
    def hidden(self) -> bool:
        return self.exposed_s <= EXPOSED_SHARE * self.step_s


def egress(topology: str) -> float:
    """ICI egress of one chip for a collective over every chip of the slice (the axes its torus spans)."""
    chip, n = hardware.slice_chips(topology)
    axes = hardware.group_axes(topology, list(range(n)))
    return chip.ici_egress_for(axes) if axes else float("inf")


def critical(cfg: MlpStep | AttentionStep | MoeStep, topology: str) -> float:
    """The scaling book's crossover for ``cfg.axis``: tokens per chip (fsdp, data), ffn (tensor), sequence
    positions per chip (context) or the expert's inner width (expert) — the step's share of C / W."""
    chip, _ = hardware.slice_chips(topology)
    return cfg.critical_share * (chip.bf16_peak_flops_per_s / egress(topology))


def price(cfg: MlpStep | AttentionStep | MoeStep, topology: str) -> TimingPoint:
    """Compile ``cfg``'s step for ``topology`` (compile-only) and price it."""
    chip, n = hardware.slice_chips(topology)
    if n != cfg.devices:
        raise ValueError(f"topology={topology!r} has {n} chips but the step's axis has devices={cfg.devices}")
    compiled = tpu.compile_program(cfg.build, cfg, topology, label=cfg.label)
    if compiled.module is None:
        raise ValueError(f"{cfg} does not fit {topology}: {compiled.oom.first_line if compiled.oom else ''}")
    t = st.step_time(compiled.module, topology, {cfg.axis: cfg.devices})
    counts: dict[str, int] = {}
    for c in compiled.module.collectives:
        counts[c.op] = counts.get(c.op, 0) + (compiled.module.runs(c.computation) or 1)
    return TimingPoint(cfg, topology, t.compute_s, t.comm_s, t.exposed_comm_s, t.step_s,
                 cfg.flops_per_chip / chip.bf16_peak_flops_per_s, cfg.wire_bytes / egress(topology), counts,
                 sum(k.flops * k.runs for k in t.kernels), sum(c.wire_bytes * c.runs for c in t.collectives))


def sweep(base: MlpStep | AttentionStep | MoeStep, topology: str, values: tuple[int, ...],
          field: str = "tokens") -> list[TimingPoint]:
    """``base`` with ``field`` set to each of ``values``, priced."""
    return [price(replace(base, **{field: v}), topology) for v in values]


def measured_crossover(points: list[TimingPoint], field: str = "tokens", source: str = "tpu") -> int | None:
    """The first swept value from which on every point's wire time is at most its compute time (``source``
    ``"tpu"``: the compiled program's; ``"formula"``: the formula's); None if no such value was swept."""
    for i, pt in enumerate(points):
        if all((q.comm_s <= q.compute_s) if source == "tpu" else (q.formula_comm_s <= q.formula_compute_s)
               for q in points[i:]):
            return getattr(pt.cfg, field)
    return None
