"""The sweeps the report embeds, as data: add a :class:`SweepSpec` when a notebook lands.

Design note
-----------
Each spec names a notebook, a small grid and what to chart. A spec whose notebook does not exist (yet), or
does not declare a swept parameter, is skipped with the reason shown in the report — never an error.
Sweep points are cached across report runs in ``out/sweeps/<profile>/<name>/`` (see ``sweep.py``: a point
is reused only while the notebook, the library sources, the parameters and torch/torch_xla versions are
unchanged), and a point whose parameters equal the report's own run of the notebook is taken from that run
instead of being executed again.

:class:`ReportSweeps` follows one report run: when a notebook finishes, :meth:`ReportSweeps.plan` plans its
sweeps (the runner queues their points into the report's pool, where the points of one sweep share a
kernel); :meth:`ReportSweeps.summaries` writes the tables and charts once everything has run.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardlab.report import sweep as sw
from shardlab.report.datatypes import ReportOptions, SweepSummary
from shardlab.report.notebooks import NotebookInfo, ReportInputError, find_notebooks
from shardlab.report.sweep_charts import charts


@dataclass(frozen=True)
class SweepSpec:
    name: str                                   # directory name under the sweep cache
    title: str
    notebook: str                               # stem
    axes: dict[str, list[Any]]                  # swept parameters ({} = one point at the defaults)
    x: str                                      # the chart's x: a swept parameter or a name_params column
    y: tuple[str, ...]                          # fnmatch patterns of measurement names to chart
    params: dict[str, Any] = field(default_factory=dict)        # fixed parameters for every point
    derived: tuple[tuple[str, str, str, str, str], ...] = ()    # (name, ratio|difference, a, b, unit)
    name_params: dict[str, str] = field(default_factory=dict)   # column -> regex with one group


REPORT_SWEEPS: tuple[SweepSpec, ...] = (
    SweepSpec("megatron_bytes_vs_tp", "Megatron MLP: all-reduce count and payload bytes per rank vs tp",
              "02_megatron_mlp", {"tp": [1, 2, 4, 8]}, "tp", ("mlp.*.all_reduce.bytes", "mlp.*.all_reduce.count"),
              params={"run_gloo": False}),                         # the gloo replay adds process start-up only
    SweepSpec("ce_saving_vs_vocab", "Vocab-parallel cross-entropy: wire-byte saving over gathered logits vs vocab",
              "04_vocab_parallel_embedding_ce", {"vocab": [1024, 8192, 32000, 50257]}, "vocab",
              ("ce.saving_ratio", "ce.vocab_parallel.bytes", "ce.gather_logits.bytes")),
    SweepSpec("fsdp_padding_vs_world_size", "FSDP flat parameter: padding (elements) vs world size",
              "05_fsdp_flat_params", {"world_size": [2, 3, 5, 8]}, "world_size",   # SimulatedWorld ranks: any W
              ("fsdp.flat.padding", "fsdp.flat.padded_numel", "fsdp.flat.shard_numel"),
              params={"steps": 1, "batch": 120},                # the padding needs no training; 120 rows split
                                                                # evenly over every W of the sweep
              derived=(("fsdp.flat.padding", "difference", "fsdp.flat.padded_numel", "fsdp.flat.numel",
                        "elements"),)),
    SweepSpec("scan_compile_vs_layers", "scan: XLA compile time and HLO size vs number of layers L",
              "06_scan_shard_as", {}, "L", ("scan.compile_s", "scan.hlo_instructions", "scan.execute_s"),
              # scan.compile_s.<mode>.L<n> -> name scan.compile_s with columns L and mode (one trace per mode)
              name_params={"L": r"\.L(\d+)$", "mode": r"\.(loop|scan_layers|scan)$"}),
)


def seed_from_report(nb: NotebookInfo, cache: Path, report_out: Path, values: dict[str, Any],
                     params: dict[str, Any]) -> bool:
    """Reuse the report's own execution for the point ``values`` if it passed (it ran with ``params``)."""
    rec_path = report_out / "records" / f"{nb.stem}.json"
    if not rec_path.exists():
        return False
    record = json.loads(rec_path.read_text())
    if record.get("status") != "passed" or any(not c.get("ok") for c in record.get("checks", [])):
        return False
    return sw.seed_point(nb, cache, values, params, record, report_out / "notebooks" / f"{nb.stem}.ipynb")


@dataclass
class _Item:
    spec: SweepSpec
    summary: SweepSummary
    plan: sw.SweepPlan | None = None
    seeded: int = 0


class ReportSweeps:
    """The report's sweeps over one report run."""

    def __init__(self, options: ReportOptions, report_out: Path, executed: Iterable[str]) -> None:
        self.options, self.report_out = options, report_out
        self.notebooks = find_notebooks(options.notebooks_dir)
        self.items = [_Item(spec, SweepSummary(spec.title)) for spec in REPORT_SWEEPS]
        chosen = set(executed)
        for item in self.items:
            if item.spec.notebook not in self.notebooks:
                item.summary.skipped = f"notebook {item.spec.notebook} does not exist yet"
            elif item.spec.notebook not in chosen:
                item.summary.skipped = (f"{item.spec.notebook} is not part of this run (--only, or it appeared "
                                        "after the run started)")

    def plan(self, stem: str, failed: bool) -> list[sw.SweepPlan]:
        """Plan the sweeps of notebook ``stem``, which just finished in this run (nothing if it failed)."""
        plans = []
        for item in self.items:
            if item.spec.notebook != stem or item.summary.skipped:
                continue
            if failed:
                item.summary.skipped = f"{stem} failed in this run at its default parameters; fix it first"
                continue
            try:
                item.plan, item.seeded = self._plan(item.spec)
            except ReportInputError as exc:
                item.summary.skipped = str(exc)
                continue
            plans.append(item.plan)
        return plans

    def _plan(self, spec: SweepSpec) -> tuple[sw.SweepPlan, int]:
        o = self.options
        nb = self.notebooks[spec.notebook]
        cache = o.sweep_cache / o.profile / spec.name
        sw.validate(nb, spec.axes, spec.params)
        base = {"num_devices": o.num_devices, **spec.params}
        defaults = {**nb.parameters, "num_devices": o.num_devices}
        sw.claim_dir(cache, nb.stem, force=False)
        seeded = 0
        for values in sw.grid(spec.axes):
            full = {**base, **values}
            if all(defaults.get(k) == v for k, v in full.items()):
                seeded += seed_from_report(nb, cache, self.report_out, values, full)
        return sw.plan_sweep(nb, spec.axes, cache, base=spec.params, num_devices=o.num_devices, device=o.device,
                             name_params=spec.name_params), seeded

    def summaries(self) -> list[SweepSummary]:
        """Tables, charts and one line per sweep, once every point has run."""
        for item in self.items:
            spec, s, plan = item.spec, item.summary, item.plan
            if plan is None:
                s.skipped = s.skipped or f"{spec.notebook} did not finish in this run"
                continue
            res = sw.finish_sweep(plan, render=False)
            frame = res.frame
            for name, op, a, b, unit in spec.derived:
                frame = sw.add_derived(frame, name, op, a, b, unit)
            names = sw.match_names(frame, spec.y)
            s.figures = charts(frame, spec.x, names, spec.title) if names else []
            bad = [p for p in res.points if p.status in ("failed", "timeout")]
            s.failed_points = len(bad)
            s.wall_s = res.wall_s
            s.summary = (f"{len(res.points)} point(s) of {spec.notebook} over "
                         f"{', '.join(f'{k}={v}' for k, v in spec.axes.items()) or 'its defaults'}: "
                         f"{res.ran} run now, {len(res.points) - res.ran} reused, {len(bad)} failed"
                         + (" (" + "; ".join(f"{p.dir.name}: {p.message}" for p in bad) + ")" if bad else "")
                         + "." + kernel_note(res.points, res.kernels))
            if not names:
                s.summary += f" No measurement matches {list(spec.y)}."
            dest = self.report_out / "sweeps" / f"{spec.name}.csv"
            dest.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(dest, index=False)
            if res.parquet is not None:
                shutil.copy(res.parquet, dest.with_suffix(".parquet"))
            s.links = [f"sweeps/{spec.name}.csv"]
        return [item.summary for item in self.items]


def kernel_note(points: list[sw.Point], kernels: int) -> str:
    """How the points run now used their kernels, and what the compile-cache guard saw."""
    ran = [p for p in points if p.kernel_run is not None]
    if not ran:
        return ""
    shared = [p for p in ran if p.kernel_run and p.kernel_run > 1]
    kernel_s = sum(p.wall_s or 0.0 for p in ran)
    note = f" {len(ran)} point(s) in {kernels} kernel(s), {kernel_s:.1f} s of kernel time"
    if shared:
        note += (f"; {len(shared)} ran in a shared kernel with no compile served from torch_xla's cache "
                 "(CachedCompile = 0)")
    reruns = [p for p in ran if p.rerun]
    if reruns:
        note += f"; {len(reruns)} re-run in a fresh kernel (" + "; ".join(f"{p.dir.name}: {p.rerun}"
                                                                          for p in reruns) + ")"
    return note + "."
