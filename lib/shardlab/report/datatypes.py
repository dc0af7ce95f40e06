"""The report's data types: what a run is asked to do, what each notebook gave, and the whole report.

Design note: ``runner`` fills these types, ``rundir`` writes the manifest from them, ``html`` renders them; this
module imports only ``execute.Execution`` and ``baseline.Diff`` (no import cycle). The exit codes live here once
(the CLI and :attr:`Report.exit_status` use them):

    EXIT_OK      0  every notebook passed, no structural regression
    EXIT_FAILED  1  a notebook failed (error, timeout, failed check, missing record) or a structural value
                    regressed against the baseline (a sweep: a point failed)
    EXIT_RUNNER  2  the runner itself failed (bad input, unusable baseline, internal error)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardlab.report.baseline import Diff
from shardlab.report.execute import Execution
from shardlab.report.floor import Floor

EXIT_OK, EXIT_FAILED, EXIT_RUNNER = 0, 1, 2
ROOT = Path(__file__).resolve().parents[3]     # the repository: notebooks/, data/, out/
RUNNER_WALL = "report.notebook.wall_s"         # timing rows the runner adds to each notebook
RUNNER_COMPILE = "report.notebook.xla_compile_s"


@dataclass
class ReportOptions:
    notebooks_dir: Path | None = None          # None: the registered topics' notebooks (shardlab.core.topics)
    out: Path | None = None                    # None: out/reports/<UTC time>, with out/reports/latest
    num_devices: int = 8
    device: str = "cpu"                        # cpu | tpu
    only: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)   # extra -p values for every selected notebook
    timeout_s: float = 600.0
    jobs: int = 1                              # notebooks (kernels) at a time
    force: bool = False
    update_baseline: bool = False
    baseline_dir: Path = ROOT / "data" / "baselines"
    full_size: bool = False                    # full_size=True in every notebook declaring it (minutes of TPU compiles)
    tpu_generation: str = "v5e"                # every notebook's compile-only TPU view compiles for this generation
    floor_probes: int | None = None            # bare kernels timed for the floor; None: floor.default_probes(jobs)

    @property
    def profile(self) -> str:
        """Baseline profile of everything but the compile-only TPU view: ``cpu-8`` (``cpu-8-full``)."""
        return f"{self.device}-{self.num_devices}" + ("-full" if self.full_size else "")

    @property
    def tpu_profile(self) -> str:
        """Baseline profile of the compile-only TPU view (source ``tpu``): ``tpu-<slice>-aot``, the slice named as
        everywhere in the suite (generation-chips): ``tpu-v5e-8-aot`` for 8 devices of the generation compiled for.
        Its structural values are deterministic (compile-only, libtpu pinned) and compared exactly, like cpu-8's."""
        return f"tpu-{self.tpu_generation}-{self.num_devices}-aot" + ("-full" if self.full_size else "")


@dataclass
class NotebookResult:
    stem: str
    status: str                                # passed | failed | timeout | regressed
    reasons: list[str]
    execution: Execution | None
    record: dict[str, Any] | None
    html: str | None                           # path relative to the report dir
    diffs: list[Diff] = field(default_factory=list)
    param_changes: dict[str, Any] = field(default_factory=dict)
    compared: bool = False                     # a baseline entry existed for this notebook

    @property
    def xla(self) -> dict[str, Any]:
        """What torch_xla compiled and executed in the notebook (``Recorder.close`` writes it)."""
        return dict((self.record or {}).get("xla") or {})

    def _xla_total(self, metric: str, key: str) -> float | None:
        """``xla[metric][key]`` of the record (0 when the metric lacks the key), None without the metric."""
        ct = self.xla.get(metric)
        return float(ct.get(key, 0)) if ct else None

    @property
    def compile_s(self) -> float | None:
        return self._xla_total("CompileTime", "total_s")

    @property
    def tpu_compile_s(self) -> float | None:
        """Seconds of XLA:TPU compiles (compile-only, cache hits excluded) in the notebook."""
        return self._xla_total("TpuCompileTime", "total_s")

    @property
    def tpu_live(self) -> int | None:
        """XLA:TPU compiles the notebook ran (cache hits and store hits excluded)."""
        n = self._xla_total("TpuCompileTime", "count")
        return None if n is None else int(n)

    @property
    def tpu_stored(self) -> int | None:
        """XLA:TPU compiles the committed store served the notebook (``shardlab.profile.tpu_store``)."""
        n = self._xla_total("TpuCompileTime", "stored")
        return None if n is None else int(n)

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds of the notebook's kernel and the children it reaped (gloo ranks, TPU workers)."""
        cpu = self.xla.get("ProcessCpu")
        return float(cpu["self_s"] + cpu["children_s"]) if cpu else None

    def runner_timings(self, device: str) -> dict[str, dict[str, Any]]:
        """Wall and compile time of this notebook as baseline timing rows (single samples)."""
        out: dict[str, dict[str, Any]] = {}
        if self.execution is not None:
            w = self.execution.wall_s
            out[f"{RUNNER_WALL} [timer]"] = {"median": w, "min": w, "max": w, "n": 1, "unit": "s", "device": device}
        if self.compile_s is not None:
            c = self.compile_s
            out[f"{RUNNER_COMPILE} [metrics]"] = {"median": c, "min": c, "max": c, "n": 1, "unit": "s",
                                                 "device": device}
        return out


@dataclass
class Report:
    options: ReportOptions
    out: Path
    started: float
    finished: float
    results: list[NotebookResult]
    baseline_path: Path
    baseline_state: str                        # "compared" | "none" | "updated" | "created"
    env: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    charts: list[Any] = field(default_factory=list)   # report.charts.Chart: curves drawn from the records
    floor: Floor | None = None                 # kernel start + import torch_xla, measured in this run

    @property
    def wall_s(self) -> float:
        """The run's wall time up to the results (``finished`` as the page is written; the page and the terminal
        state this same number)."""
        return self.finished - self.started

    def floor_summary(self) -> dict[str, Any] | None:
        """The floor and the ratio of this run's wall to it (None when not measured)."""
        return None if self.floor is None else self.floor.as_dict(self.wall_s)

    def store_line(self) -> str | None:
        """How many XLA:TPU compiles ran live and how many the committed store served (None: no TPU compile)."""
        live = sum(r.tpu_live or 0 for r in self.results)
        stored = sum(r.tpu_stored or 0 for r in self.results)
        if not live and not stored:
            return None
        secs = sum(r.tpu_compile_s or 0.0 for r in self.results)
        missed = [r.stem for r in self.results if r.tpu_live and r.tpu_stored is not None]
        line = (f"XLA:TPU compiles: {live} live ({secs:.1f} s), {stored} served from the committed store "
                f"(data/tpu_store, keyed by libtpu, the program, the topology and the options)")
        if missed and stored:
            line += f"; compiled live in {', '.join(missed)} (not stored: python tools/tpu_store.py refresh)"
        return line

    def floor_line(self) -> str:
        """``wall W s, floor F s (N notebooks × k s ÷ jobs), ratio R``, or the wall alone without a floor."""
        return self.floor.summary(self.wall_s) if self.floor else f"wall {self.wall_s:.1f} s, floor not measured"

    @property
    def exit_status(self) -> int:
        """1 if a notebook did not pass (a failed check is a failed check) or regressed."""
        return EXIT_OK if all(r.status == "passed" for r in self.results) else EXIT_FAILED
