"""Per-chip memory of a TPU compile, and the compiler's out-of-memory message turned into data.

What the capacity check counts (measured with libtpu 0.0.21, compile-only): **arguments + the program's HBM
temporaries <= the usable capacity** ("Used X of 31.25G hbm"). Outputs are not counted (unless aliased to an
argument, then they are the argument), and the ~258 MiB the compiler lists as "reserved" lies outside the usable
figure: on ``v6e-1`` arguments of 31483 MiB plus a 512 MiB sort temporary compiled, one more MiB did not
("Used 31.25G of 31.25G hbm. Exceeded hbm capacity by 512B."; the "Total hbm usage >=" line adds the reserved
260 MiB on top). :class:`TpuMemory` names the numbers accordingly: ``temp`` is XLA's ``temp_size_in_bytes``, which
overstates the checked temporaries (Llama 3 70B on v6e-64: 22.33 vs 16.16 GiB); ``checked_temp`` is the HBM
temporaries the check counts, ``peak - arguments - outputs + aliased``; ``checked`` is what the check compares with
the capacity, and ``peak`` is what a chip must hold to run the step (outputs included).

XLA:TPU reports running out of HBM as a compile error (``RESOURCE_EXHAUSTED: XLA:TPU compile permanent
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

When the program alone already exceeds the capacity, the breakdown lists "arguments 0B" and "Output size 0B":
the compiler did not evaluate them (a Llama 3 8B step on v5e-8 with 13.09 GiB of arguments reports 0B). Then
:attr:`OutOfMemory.arguments` and :attr:`OutOfMemory.outputs` are None, not 0.

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
    """Per-chip bytes of a compiled TPU program (``get_compiled_memory_stats``).

    >>> m = TpuMemory(argument=10, output=6, temp=9, alias=4, generated_code=1, capacity=20, peak=19)
    >>> m.checked_temp, m.checked, m.fits, m.runs      # 19 - 10 - 6 + 4 = 7; 10 + 7 = 17 <= 20
    (7, 17, True, True)
    """

    argument: int
    output: int
    temp: int  # XLA's temp_size_in_bytes: more than the temporaries the capacity check counts (checked_temp)
    alias: int  # output bytes that reuse (donated) argument buffers
    generated_code: int
    capacity: int | None  # usable HBM per chip the compiler checks against
    peak: int = 0  # peak_memory_in_bytes: arguments + outputs - aliased + HBM temporaries, live at once
    host_temp: int = 0  # host_temp_size_in_bytes: temporaries in host memory (offloaded activations, S(5))

    @classmethod
    def from_stats(cls, stats: Any, capacity: int | None) -> TpuMemory:
        return cls(stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
                   stats.alias_size_in_bytes, stats.generated_code_size_in_bytes, capacity,
                   stats.peak_memory_in_bytes, getattr(stats, "host_temp_size_in_bytes", 0))

    @property
    def checked_temp(self) -> int:
        """The HBM temporaries the capacity check counts: peak - arguments - outputs + aliased."""
        return self.peak - self.argument - self.output + self.alias

    @property
    def checked(self) -> int:
        """What the compiler's capacity check compares with ``capacity``: arguments + checked temporaries."""
        return self.argument + self.checked_temp

    @property
    def fits(self) -> bool | None:
        """The capacity check, recomputed (a compiled program passed it; None without a capacity)."""
        return None if self.capacity is None else self.checked <= self.capacity

    @property
    def runs(self) -> bool | None:
        """Would the step run: everything live at the peak, outputs included, within the capacity."""
        return None if self.capacity is None else self.peak <= self.capacity

    @property
    def total(self) -> int:
        """Arguments + outputs (minus aliased) + ``temp`` + code: everything if all coexisted (an upper bound)."""
        return self.argument + self.output - self.alias + self.temp + self.generated_code

    def as_dict(self) -> dict[str, int | bool | None]:
        return {**asdict(self), "total": self.total, "checked_temp": self.checked_temp, "checked": self.checked,
                "fits": self.fits, "runs": self.runs}


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
    used: int  # arguments + program (when the arguments were evaluated), as the check counts them
    capacity: int
    exceeded: int
    breakdown: dict[str, int] = field(default_factory=dict)  # reserved / program / arguments, as listed
    buffers: list[OomBuffer] = field(default_factory=list)  # largest first
    message: str = ""  # the compiler's exact text
    output_listed: int | None = None  # "Output size ...", as listed (not counted by the check)
    shared_with_arguments: int | None = None  # "... shares X with arguments" (donated outputs)
    fragmentation: int | None = None  # HLO temp lost to fragmentation, as listed
    single_allocation: bool = False  # "Allocation (size=N) would exceed memory": one array, before the heap check

    @property
    def arguments_evaluated(self) -> bool:
        """False when the compiler stopped at the program: it lists "arguments 0B" then, whatever they are, or it
        stopped at one array larger than the chip (no breakdown at all)."""
        if self.single_allocation:
            return False
        return bool(self.breakdown.get("arguments")) or self.breakdown.get("program", 0) < self.capacity

    @property
    def arguments(self) -> int | None:
        """Argument bytes per chip, or None when the compiler did not evaluate them (listed as 0B)."""
        return self.breakdown.get("arguments") if self.arguments_evaluated else None

    @property
    def outputs(self) -> int | None:
        """Output bytes per chip as listed, or None when not evaluated (listed as 0B with the arguments)."""
        return self.output_listed if self.arguments_evaluated else None

    @property
    def program(self) -> int | None:
        """The program's HBM requirement (temporaries, fragmentation included); for one array larger than the chip,
        that array (a lower bound: the compiler stopped there)."""
        return self.used if self.single_allocation else self.breakdown.get("program")

    def __str__(self) -> str:
        gib = 1024**3
        return f"out of HBM: used {self.used / gib:.2f} GiB of {self.capacity / gib:.2f} GiB"

    @property
    def first_line(self) -> str:
        """The compiler's one-line verdict ("RESOURCE_EXHAUSTED: ... Exceeded hbm capacity by ...", or
        "RESOURCE_EXHAUSTED: Allocation (size=N) would exceed memory (size=M) :: ... tag = '...']")."""
        if self.single_allocation:
            a = _ALLOCATION_LINE.search(self.message)
            if a:
                return a.group(0)
        return next((ln for ln in self.message.splitlines() if "Ran out of memory" in ln),
                    self.message.split("\n", 1)[0])


_ALLOCATION = re.compile(r"RESOURCE_EXHAUSTED: Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)"
                         r"(?:.*?shape = '([^']*)')?(?:.*?tag = '([^']*)')?", re.S)
_ALLOCATION_LINE = re.compile(r"RESOURCE_EXHAUSTED: Allocation \(size=\d+\) would exceed memory[^\n]*?tag = '[^']*'\]")


def parse_oom(message: str) -> OutOfMemory | None:
    """The structured form of an XLA:TPU out-of-memory compile error; None for any other error.

    Two forms: the capacity check ("Used X of Y hbm. Exceeded hbm capacity by Z.", with the largest buffers), and
    one array alone larger than the chip, raised before the heap simulation ("Allocation (size=N) would exceed
    memory (size=M) :: ... shape = '...' ... tag = '...'": then ``used`` and ``program`` are that one array, a
    lower bound, and the arguments were not evaluated).

    >>> o = parse_oom("RESOURCE_EXHAUSTED: Allocation (size=8) would exceed memory (size=4) :: #a [shape = "
    ...               "'bf16[2,2]{1,0}', space=hbm, size = 0x1, tag = 'output of fusion.1'] :: x")
    >>> o.used, o.capacity, o.exceeded, o.buffers[0].shape, o.buffers[0].label
    (8, 4, 4, 'bf16[2,2]{1,0}', 'fusion.1')
    >>> o.program, o.arguments_evaluated, o.arguments
    (8, False, None)
    """
    m = re.search(rf"Used {_SIZE} of {_SIZE} hbm\. Exceeded hbm capacity by {_SIZE}\.", message)
    if "RESOURCE_EXHAUSTED" not in message:
        return None
    if not m:
        a = _ALLOCATION.search(message)
        if a is None:
            return None
        size, capacity = int(a.group(1)), int(a.group(2))
        label = (a.group(4) or "").removeprefix("output of ")
        return OutOfMemory(size, capacity, size - capacity, {}, [OomBuffer(size, a.group(3) or "", label)], message,
                           single_allocation=True)
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
    om = re.search(rf"Output size {_SIZE}; shares {_SIZE} with arguments", message)
    fm = re.search(rf"HLO temp .*?fragmentation \({_SIZE}\)", message)
    return OutOfMemory(used, cap, exc, breakdown, buffers, message,
                       parse_size(om.group(1) + om.group(2)) if om else None,
                       parse_size(om.group(3) + om.group(4)) if om else None,
                       parse_size(fm.group(1) + fm.group(2)) if fm else None)
