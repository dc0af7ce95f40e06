"""Pipeline schedules as per-device ordered action lists: GPipe, 1F1B, interleaved 1F1B.

Design note
-----------
A schedule is what each device does, in order: `Action("F", stage, i)` runs the forward of microbatch i through
(virtual) stage `stage`, `Action("B", stage, i)` its backward.  Zero-bubble schedules (Qi et al. 2024) split a
backward into "I" (the input gradient, which the previous stage waits for) and "W" (the weight gradient, which
nobody waits for); we read those orders from PyTorch and time them, we do not build them.  p devices,
m microbatches, v virtual stages per device (p v stages in all); stage k lives on device k % p (Megatron-LM and
torch.distributed.pipelining both place model chunk c of device r at stage c p + r; a V-shaped schedule sets
`placement` instead).  Time is not part of a schedule: the order alone fixes when each action can start once
costs are given (`shardlab.pipeline.timeline`).

    GPipe (Huang et al. 2019)       every forward, then every backward:  F0 F1 ... F(m-1) B0 B1 ... B(m-1)
    1F1B (PipeDream-Flush,          device s: w = min(p - s - 1, m) warm-up forwards, then alternate one
      Narayanan et al. 2021)        forward and one backward, then the w remaining backwards
    interleaved 1F1B (Narayanan     the same on chunk-microbatches: forward step k of device r is chunk
      et al. 2021, section 2.2.2)   (k // p) % v of microbatch (k // (p v)) p + k % p, backward step k is chunk
                                    v - 1 - (k // p) % v of the same microbatch; w = min((v - 1) p + 2 (p - 1 - r),
                                    m v) warm-up forwards

These are written from the papers' rules (Megatron-LM's `forward_backward_pipelining_with[out]_interleaving`);
`shardlab.pipeline.torch_ref` reads PyTorch's own orders and the tests check they are identical.  One deliberate
choice: Megatron-LM warms up *everything* on every device when m == p in the interleaved schedule; PyTorch's
ScheduleInterleaved1F1B does not (its warm-up rule is the min above).  We follow PyTorch, so the two agree.

Example (p = 2, m = 3)::

    >>> [str(a) for a in one_f_one_b(2, 3).devices[0]]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    >>> peak_inflight(one_f_one_b(2, 3)), peak_inflight(gpipe(2, 3))
    ([2, 1], [3, 3])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from shardlab.formulas.pipeline import check_pipeline

KINDS = ("F", "B", "I", "W")
BACKWARDS = ({"F", "B"}, {"F", "I", "W"})  # the kinds one (stage, microbatch) gets: a full backward, or split

__all__ = ["KINDS", "Action", "Schedule", "build", "gpipe", "interleaved_1f1b", "one_f_one_b", "peak_inflight"]


class Action(NamedTuple):
    kind: str  # "F" forward | "B" backward (input and weight gradients) | "I" input gradient | "W" weight gradient
    stage: int  # global (virtual) stage index, 0 .. p v - 1
    microbatch: int  # 0 .. m - 1

    def __str__(self) -> str:  # PyTorch's spelling: "1F0" = stage 1, forward, microbatch 0
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class Schedule:
    """`devices[r]` is device r's action list, in execution order."""

    name: str  # gpipe | 1f1b | interleaved
    p: int  # devices (pipeline ranks)
    m: int  # microbatches per step
    v: int  # virtual stages (model chunks) per device
    devices: tuple[tuple[Action, ...], ...]
    placement: tuple[int, ...] = ()  # device of each stage; empty: stage k on device k % p

    @property
    def stages(self) -> int:
        return self.p * self.v

    def device_of(self, stage: int) -> int:
        return self.placement[stage] if self.placement else stage % self.p

    def validate(self) -> None:
        """Raise ValueError unless every (stage, microbatch) gets F and B (or F, I and W) exactly once, on the
        stage's device, F before B / I before W, and each device runs each (kind, stage) in microbatch order."""
        got: dict[tuple[int, int], list[str]] = {(s, i): [] for s in range(self.stages) for i in range(self.m)}
        for r, acts in enumerate(self.devices):
            last: dict[tuple[str, int], int] = {}
            for a in acts:
                kinds = got.get((a.stage, a.microbatch))
                if a.kind not in KINDS or kinds is None or a.kind in kinds:
                    raise ValueError(f"{self.name}: action {a} on device {r} is repeated or out of range")
                if self.device_of(a.stage) != r:
                    raise ValueError(f"{self.name}: action {a} is on device {r}, stage {a.stage} lives on "
                                     f"device {self.device_of(a.stage)}")
                before = {"B": "F", "I": "F", "W": "I"}.get(a.kind)
                if before is not None and before not in kinds:
                    raise ValueError(f"{self.name}: {a} comes before its {before} on device {r}")
                if last.get((a.kind, a.stage), -1) >= a.microbatch:
                    raise ValueError(f"{self.name}: {a} runs microbatches of stage {a.stage} out of order")
                last[(a.kind, a.stage)] = a.microbatch
                kinds.append(a.kind)
        bad = [(s, i) for (s, i), kinds in got.items() if set(kinds) not in BACKWARDS]
        if bad:
            s, i = bad[0]
            raise ValueError(f"{self.name}: {len(bad)} (stage, microbatch) pair(s) incomplete, e.g. stage {s} "
                             f"microbatch {i} has {got[(s, i)]}")


def gpipe(p: int, m: int) -> Schedule:
    """All forwards, then all backwards (in microbatch order, as torch.distributed.pipelining.ScheduleGPipe)."""
    check_pipeline(p, m, 1, "gpipe")
    devs = tuple(
        tuple([Action("F", s, i) for i in range(m)] + [Action("B", s, i) for i in range(m)]) for s in range(p)
    )
    return Schedule("gpipe", p, m, 1, devs)


def one_f_one_b(p: int, m: int) -> Schedule:
    """PipeDream-Flush: p - s - 1 warm-up forwards on stage s, steady one-forward-one-backward, cool-down."""
    check_pipeline(p, m, 1, "1f1b")
    devs = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        acts = [Action("F", s, i) for i in range(warmup)]
        for k in range(m - warmup):  # steady state: F of microbatch warmup + k, then B of microbatch k
            acts += [Action("F", s, warmup + k), Action("B", s, k)]
        acts += [Action("B", s, i) for i in range(m - warmup, m)]
        devs.append(tuple(acts))
    return Schedule("1f1b", p, m, 1, tuple(devs))


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B: device r holds stages r, r + p, ..., r + (v - 1) p."""
    check_pipeline(p, m, v, "interleaved")
    total = m * v  # chunk-microbatches per device

    def microbatch(k: int) -> int:  # microbatches go round in groups of p: 0..p-1 on every chunk, then p..2p-1
        return (k // (p * v)) * p + k % p

    def forward_chunk(k: int) -> int:
        return (k // p) % v

    def backward_chunk(k: int) -> int:
        return v - 1 - (k // p) % v

    devs = []
    for r in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
        acts = [Action("F", forward_chunk(k) * p + r, microbatch(k)) for k in range(warmup)]
        for k in range(total - warmup):
            f = k + warmup
            acts.append(Action("F", forward_chunk(f) * p + r, microbatch(f)))
            acts.append(Action("B", backward_chunk(k) * p + r, microbatch(k)))
        acts += [Action("B", backward_chunk(k) * p + r, microbatch(k)) for k in range(total - warmup, total)]
        devs.append(tuple(acts))
    return Schedule("interleaved", p, m, v, tuple(devs))


def build(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The schedule called `name` ("gpipe" | "1f1b" | "interleaved")."""
    check_pipeline(p, m, v, name)
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    return interleaved_1f1b(p, m, v)


def peak_inflight(schedule: Schedule) -> list[int]:
    """Per device, the most (stage, microbatch) pairs whose forward ran and whose backward has not yet — the
    activations the device holds, in units of one stage's (interleaved: one chunk's) per microbatch.  A split
    backward frees them at W (the weight gradient still reads the stage's saved inputs)."""
    peaks = []
    for acts in schedule.devices:
        live = peak = 0
        for a in acts:
            live += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
