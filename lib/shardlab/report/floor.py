"""The report's floor, measured in the same run: what starting every notebook's kernel and importing torch_xla
costs, against which the report's wall time is judged.

Design note
-----------
No report can be faster than starting one kernel per notebook and importing ``torch_xla`` in it, ``--jobs`` at a
time: the floor is ``notebooks × k ÷ jobs``, ``k`` the time of one bare kernel's start plus ``import torch_xla``.
``k`` depends on the machine and on how busy it is, so it is measured in the run it judges: before the first
notebook, ``probes`` bare kernels (by default one per job, at least two) go through the same pool of ``--jobs``
threads as the notebooks, each in a process of its own (``python -m shardlab.report.floor``, the kernel
environment of a notebook), so they see the same contention the notebooks do. ``k`` is their median. What a
probe times is the kernel start (launch to ready, as papermill waits for it) and the execution of
``import torch_xla`` — not the probe process's own start, which, like papermill's, is part of the overhead the
floor leaves out. The probes are part of the report's wall time (they run inside it).

:class:`Floor` holds the arithmetic and the one sentence both the terminal summary and the HTML page print:
``wall W s, floor F s (N notebooks × k s ÷ jobs), ratio R``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from shardlab.report.execute import KERNEL_ENV

PROBE_CODE = "import torch_xla"
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Probe:
    """One bare kernel: its start (launch to ready) and ``import torch_xla``, seconds."""

    kernel_start_s: float
    import_s: float

    @property
    def total_s(self) -> float:
        return self.kernel_start_s + self.import_s


@dataclass(frozen=True)
class Floor:
    """``notebooks × k ÷ jobs``, ``k`` the median probe (kernel start + ``import torch_xla``)."""

    notebooks: int
    jobs: int
    probes: tuple[Probe, ...]

    def __post_init__(self) -> None:
        if not self.probes:
            raise ValueError("a floor needs at least one probe (kernel start + import torch_xla)")
        if self.notebooks < 1 or self.jobs < 1:
            raise ValueError(f"notebooks={self.notebooks} and jobs={self.jobs} must both be >= 1")

    @property
    def per_notebook_s(self) -> float:  # k
        return statistics.median(p.total_s for p in self.probes)

    @property
    def effective_jobs(self) -> int:  # more jobs than notebooks run no faster than one notebook each
        return min(self.jobs, self.notebooks)

    @property
    def floor_s(self) -> float:
        return self.notebooks * self.per_notebook_s / self.effective_jobs

    def ratio(self, wall_s: float) -> float:
        return wall_s / self.floor_s

    def summary(self, wall_s: float) -> str:
        """``wall W s, floor F s (N notebooks × k s ÷ jobs), ratio R`` — the line the terminal and the page show."""
        return (f"wall {wall_s:.1f} s, floor {self.floor_s:.1f} s ({self.notebooks} notebooks × "
                f"{self.per_notebook_s:.2f} s ÷ {self.effective_jobs}), ratio {self.ratio(wall_s):.2f}")

    def as_dict(self, wall_s: float) -> dict[str, Any]:
        return {"wall_s": wall_s, "floor_s": self.floor_s, "ratio": self.ratio(wall_s), "notebooks": self.notebooks,
                "jobs": self.effective_jobs, "per_notebook_s": self.per_notebook_s,
                "probes": [{"kernel_start_s": p.kernel_start_s, "import_s": p.import_s} for p in self.probes]}


def default_probes(jobs: int) -> int:
    """One probe per job, at least two."""
    return max(2, jobs)


def probe(code: str = PROBE_CODE, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Start a bare ``python3`` kernel, run ``code`` in it, shut it down; the two times (this process's env)."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    t0 = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=timeout_s)
        t1 = time.perf_counter()
        reply = kc.execute_interactive(code, timeout=timeout_s, output_hook=lambda msg: None)
        t2 = time.perf_counter()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    if reply["content"].get("status") != "ok":
        raise RuntimeError(f"the floor probe's {code!r} failed: {reply['content'].get('evalue', reply['content'])}")
    return Probe(t1 - t0, t2 - t1)


def run_probe(env: dict[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """One probe in a process of its own, with a notebook kernel's environment (``execute.KERNEL_ENV``, a
    ``TMPDIR`` of its own, ``env``); raises RuntimeError with the process's output when it fails."""
    tmp = tempfile.mkdtemp(prefix="shardlab-floor-")
    try:
        run = subprocess.run([sys.executable, "-m", "shardlab.report.floor"], capture_output=True, text=True,
                             timeout=timeout_s, env={**os.environ, **KERNEL_ENV, "TMPDIR": tmp, **(env or {})})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"the floor probe failed (exit {run.returncode}): {(run.stderr or run.stdout)[-1000:]}")
    data = json.loads(lines[-1])
    return Probe(float(data["kernel_start_s"]), float(data["import_s"]))


def main(argv: list[str]) -> int:
    """``python -m shardlab.report.floor [CODE]``: one probe, printed as JSON on the last line of stdout."""
    p = probe(argv[0] if argv else PROBE_CODE)
    print(json.dumps({"kernel_start_s": p.kernel_start_s, "import_s": p.import_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
