"""The XLA:TPU latency-hiding scheduler's own estimate of a program: its clock and its exposed communication.

Design
------
XLA:TPU's latency-hiding scheduler prices every instruction while it orders the program and, asked to
(``--xla_dump_to=DIR --xla_dump_latency_hiding_schedule=true``), writes ``<module>.schedule.txt``: per-instruction
start/end cycles, ``scheduler_statistics`` (``total_cycles``, ``all_gather_wasted_cycles``,
``all_reduce_wasted_cycles``, … — cycles in which the chip waits for a collective) and ``cycles_per_microsecond``,
the clock it counts in. The flag is one of libtpu's: torch_xla's own XLA rejects it in ``XLA_FLAGS`` and aborts the
process, so the compile runs in a child process that imports JAX and libtpu only (this module's ``__main__``),
handed the pre-partitioning HLO proto the parent lowered from its torch_xla graph. The dump is written only for a
program with at least one collective.

The scheduler's compute costs are its own coarse model (measured: 11x the kernel's ``estimated_cycles`` on one
bf16 matmul on v6e), so :mod:`shardlab.profile.step_time` uses the kernel estimates for compute and shows the
scheduler's wasted cycles beside its own exposed-communication figure.

Example::

    >>> s = schedule_stats(outputs, "v6e-8")                   # doctest: +SKIP
    >>> s.cycles_per_microsecond, s.wasted_s["all_gather"]     # doctest: +SKIP
    (1750, 0.000719)
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STAT = re.compile(r"^\s*(\w+):\s*([-\d.eE+]+)\s*$")


@dataclass(frozen=True)
class ScheduleStats:
    """What the scheduler reported for the entry computation (cycles, and seconds at its own clock)."""

    cycles_per_microsecond: int
    total_cycles: float
    wasted_cycles: dict[str, float] = field(default_factory=dict)  # "all_gather" -> cycles (total_wasted excluded)

    @property
    def total_s(self) -> float:
        return self.total_cycles / (self.cycles_per_microsecond * 1e6)

    @property
    def wasted_s(self) -> dict[str, float]:
        return {k: v / (self.cycles_per_microsecond * 1e6) for k, v in self.wasted_cycles.items()}

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.wasted_s.values())


def parse_schedule(text: str) -> ScheduleStats:
    """The entry computation's statistics of a ``*.schedule.txt`` (the last ``scheduler_statistics`` block: the
    entry is printed after the loop bodies it calls)."""
    blocks = text.split("scheduler_statistics {")
    if len(blocks) < 2:
        raise ValueError("no scheduler_statistics in the schedule dump")
    stats: dict[str, float] = {}
    for line in blocks[-1].split("}", 1)[0].splitlines():
        m = _STAT.match(line)
        if m:
            stats[m.group(1)] = float(m.group(2))
    clock = re.findall(r"cycles_per_microsecond:\s*(\d+)", text)
    if not clock:
        raise ValueError("no cycles_per_microsecond in the schedule dump")
    wasted = {k.removesuffix("_wasted_cycles"): v for k, v in stats.items()
              if k.endswith("_wasted_cycles") and k != "total_wasted_cycles"}
    return ScheduleStats(int(clock[-1]), stats.get("total_cycles", 0.0), wasted)


def schedule_stats(outputs: list[Any], topology: str, timeout: float = 600) -> ScheduleStats | None:
    """Compile the graph producing ``outputs`` (this process's torch_xla world, not synced) for ``topology`` in a
    JAX-only child process with the scheduler's dump on; its statistics, or None when the program has no
    collective (no dump is written)."""
    import torch_xla  # the graph is this process's: runtime.setup() ran before any tensor existed

    proto = torch_xla._XLAC._get_xla_tensors_hlo_proto(outputs)
    shardings = [torch_xla._XLAC._get_xla_sharding_spec(t) for t in outputs]
    return schedule_stats_proto(proto, shardings, topology, timeout)


def schedule_stats_proto(proto: bytes, shardings: list[str], topology: str,
                         timeout: float = 600) -> ScheduleStats | None:
    with tempfile.TemporaryDirectory(prefix="shardlab-schedule-") as tmp:
        job = Path(tmp) / "job.pkl"
        job.write_bytes(pickle.dumps((proto, shardings, topology)))
        dump = Path(tmp) / "dump"
        env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
        env["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_latency_hiding_schedule=true"
        env["JAX_PLATFORMS"] = "cpu"
        run = subprocess.run([sys.executable, "-m", "shardlab.profile.schedule", str(job)], env=env,
                             capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0:
            raise RuntimeError(f"the scheduler probe for {topology} failed (exit {run.returncode}):\n"
                               f"{run.stderr[-2000:]}")
        files = sorted(dump.glob("*.schedule.txt")) if dump.is_dir() else []
        if not files:
            return None
        return parse_schedule(files[-1].read_text())


def _main(job: str) -> None:
    """Child process: compile the pickled proto for the topology (JAX + libtpu only, torch_xla never imported)."""
    from shardlab.profile import tpu

    proto, shardings, topology = pickle.loads(Path(job).read_bytes())
    tpu._compile_proto(proto, tpu.get_topology(topology), (), {}, None, shardings, None)
    if "torch_xla" in sys.modules:  # its XLA would have parsed (and rejected) the dump flags
        raise SystemExit("torch_xla was imported in the scheduler probe")
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    _main(sys.argv[1])
