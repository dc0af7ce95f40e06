"""Per-chip memory of a TPU compile, and the compiler's out-of-memory message turned into data.

Design: XLA:TPU reports running out of HBM as a compile error (``RESOURCE_EXHAUSTED: XLA:TPU compile permanent
error. Ran out of memory in memory space hbm. Used 16.00G of 15.75G hbm. Exceeded hbm capacity by 258.00M.``)
followed by a usage breakdown and, for real programs, the largest allocations::

      1. Size: 16.00G
         Operator: op_name="dot.13"
         Shape: f32[131072,32768]{1,0:T(8,128)}
         Unpadded size: 16.00G
         XLA label: fusion.29 = fusion(Arg_2.3, Arg_1.2), kind=kOutput, calls=fused_computation.31
         Allocation type: HLO temp

:func:`parse_oom` reads that text (sizes are printed rounded, in binary units: ``G`` = GiB) and keeps the exact
message. Pure text functions; no JAX import.

Example::

    >>> parse_oom("RESOURCE_EXHAUSTED: ... Used 16.00G of 15.75G hbm. Exceeded hbm capacity by 258.00M.").capacity
    16911433728
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = r"([\d.]+)\s*([KMGT]?)B?"


def parse_size(text: str) -> int:
    """``"16.00G"`` -> 17179869184 (binary units, as the TPU compiler prints them)."""
    m = re.fullmatch(_SIZE, text.strip())
    if not m:
        raise ValueError(f"not a TPU compiler size: {text!r}")
    return round(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass
class TpuMemory:
    """Per-chip bytes of a compiled TPU program (``get_compiled_memory_stats``)."""

    argument: int
    output: int
    temp: int
    alias: int
    generated_code: int
    capacity: int | None  # usable HBM per chip the compiler checks against

    @classmethod
    def from_stats(cls, stats: Any, capacity: int | None) -> TpuMemory:
        return cls(stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
                   stats.alias_size_in_bytes, stats.generated_code_size_in_bytes, capacity)

    @property
    def total(self) -> int:
        """Arguments + outputs (minus aliased) + temporaries + code: everything live if all coexist."""
        return self.argument + self.output - self.alias + self.temp + self.generated_code

    def as_dict(self) -> dict[str, int | None]:
        return {**asdict(self), "total": self.total}


@dataclass
class OomBuffer:
    """One of the largest allocations the compiler lists when it runs out of memory."""

    size: int
    shape: str
    label: str  # "XLA label": the HLO instruction that owns the buffer
    operator: str = ""  # e.g. op_name="dot.13"
    allocation_type: str = ""  # e.g. "HLO temp"


@dataclass
class OutOfMemory:
    used: int
    capacity: int
    exceeded: int
    breakdown: dict[str, int] = field(default_factory=dict)  # reserved / program / arguments, as listed
    buffers: list[OomBuffer] = field(default_factory=list)  # largest first
    message: str = ""  # the compiler's exact text

    def __str__(self) -> str:
        gib = 1024**3
        return f"out of HBM: used {self.used / gib:.2f} GiB of {self.capacity / gib:.2f} GiB"


def parse_oom(message: str) -> OutOfMemory | None:
    """The structured form of an XLA:TPU out-of-memory compile error; None for any other error."""
    m = re.search(rf"Used {_SIZE} of {_SIZE} hbm\. Exceeded hbm capacity by {_SIZE}\.", message)
    if "RESOURCE_EXHAUSTED" not in message or not m:
        return None
    used, cap, exc = (parse_size(m.group(i) + m.group(i + 1)) for i in (1, 3, 5))
    breakdown = {}
    tm = re.search(r"Total hbm usage >= .*?\n((?:[ \t]+\w+[ \t]+.*\n)+)", message)
    if tm:
        for line in tm.group(1).splitlines():
            sm = re.match(rf"\s+(\w+)\s+{_SIZE}\s*$", line)
            if sm:
                breakdown[sm.group(1)] = parse_size(sm.group(2) + sm.group(3))
    buffers = []
    for block in re.split(r"\n\s*\d+\. Size: ", message)[1:]:
        size, _, rest = block.partition("\n")
        fields = dict(re.findall(r"^\s*(Operator|Shape|XLA label|Allocation type): (.*)$", rest, re.M))
        buffers.append(OomBuffer(parse_size(size), fields.get("Shape", ""), fields.get("XLA label", ""),
                                 fields.get("Operator", ""), fields.get("Allocation type", "")))
    return OutOfMemory(used, cap, exc, breakdown, buffers, message)
