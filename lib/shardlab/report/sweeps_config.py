"""The sweeps the report embeds (issue 6), as data: add a :class:`SweepSpec` when a notebook lands.

Design note
-----------
Each spec names a notebook, a small grid and what to chart. A spec whose notebook does not exist (yet), or
does not declare a swept parameter, is skipped with the reason shown in the report — never an error.
Sweep points are cached across report runs in ``out/sweeps/<name>/`` (see ``sweep.py``: a point is reused
only while the notebook, the library sources, the parameters and torch/torch_xla versions are unchanged),
and a point whose parameters equal the report's own run of the notebook is taken from that run instead of
being executed again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardlab.report import sweep as sw
from shardlab.report.notebooks import NotebookInfo, ReportInputError, find_notebooks

if TYPE_CHECKING:
    from shardlab.report.runner import ReportOptions


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
    SweepSpec("ce_saving_vs_vocab", "Vocab-parallel cross-entropy: saving over gathered logits vs vocab",
              "04_vocab_parallel_embedding_ce", {"vocab": [1024, 8192, 32000, 50257]}, "vocab",
              ("ce.saving_ratio", "ce.vocab_parallel.bytes", "ce.gather_logits.bytes")),
    SweepSpec("fsdp_padding_vs_world_size", "FSDP flat parameter: padding (elements) vs world size",
              "05_fsdp_flat_params", {"world_size": [1, 2, 4, 8]}, "world_size",   # must divide 8
              ("fsdp.flat.padding", "fsdp.flat.padded_numel", "fsdp.flat.shard_numel"),
              params={"torch_fsdp_world": 0, "steps": 1},       # the padding needs neither gloo nor training
              derived=(("fsdp.flat.padding", "difference", "fsdp.flat.padded_numel", "fsdp.flat.numel",
                        "elements"),)),
    SweepSpec("scan_compile_vs_layers", "scan: XLA compile time and HLO size vs number of layers L",
              "06_scan_shard_as", {}, "L", ("scan.compile_s", "scan.hlo_instructions", "scan.execute_s"),
              # scan.compile_s.<mode>.L<n> -> name scan.compile_s with columns L and mode (one trace per mode)
              name_params={"L": r"\.L(\d+)$", "mode": r"\.(loop|scan_layers|scan)$"}),
)


@dataclass
class SweepSummary:
    """What the HTML report shows for one spec."""

    title: str
    skipped: str = ""
    summary: str = ""
    figures: list[Any] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    failed_points: int = 0
    wall_s: float = 0.0


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


def run_report_sweeps(options: ReportOptions, report_out: Path, executed: list[str],
                      failed: frozenset[str] = frozenset()) -> list[SweepSummary]:
    notebooks = find_notebooks(options.notebooks_dir)
    out: list[SweepSummary] = []
    for spec in REPORT_SWEEPS:
        s = SweepSummary(spec.title)
        out.append(s)
        nb = notebooks.get(spec.notebook)
        if nb is None:
            s.skipped = f"notebook {spec.notebook} does not exist yet"
            continue
        if spec.notebook not in executed:
            s.skipped = f"{spec.notebook} is not part of this run (--only, or it appeared after the run started)"
            continue
        if spec.notebook in failed:
            s.skipped = f"{spec.notebook} failed in this run at its default parameters; fix it first"
            continue
        cache = options.sweep_cache / options.profile / spec.name
        try:
            sw.validate(nb, spec.axes, spec.params)
            base = {"num_devices": options.num_devices, **spec.params}
            defaults = {**nb.parameters, "num_devices": options.num_devices}
            sw.claim_dir(cache, nb.stem, force=False)
            for values in sw.grid(spec.axes):
                full = {**base, **values}
                if all(defaults.get(k) == v for k, v in full.items()):
                    seed_from_report(nb, cache, report_out, values, full)
            res = sw.run_sweep(nb, spec.axes, cache, base=spec.params, num_devices=options.num_devices,
                               device=options.device, jobs=options.sweep_jobs, timeout_s=options.timeout_s,
                               name_params=spec.name_params, render=False)
        except ReportInputError as exc:
            s.skipped = str(exc)
            continue
        frame = res.frame
        for name, op, a, b, unit in spec.derived:
            frame = sw.add_derived(frame, name, op, a, b, unit)
        names = sw.match_names(frame, spec.y)
        from shardlab.report.sweep_charts import charts

        s.figures = charts(frame, spec.x, names, spec.title) if names else []
        bad = [p for p in res.points if p.status in ("failed", "timeout")]
        s.failed_points = len(bad)
        s.wall_s = res.wall_s
        s.summary = (f"{len(res.points)} point(s) of {spec.notebook} over "
                     f"{', '.join(f'{k}={v}' for k, v in spec.axes.items()) or 'its defaults'}: "
                     f"{res.ran} run now, {len(res.points) - res.ran} reused, {len(bad)} failed"
                     + (" (" + "; ".join(f"{p.dir.name}: {p.message}" for p in bad) + ")" if bad else "")
                     + f"; {res.wall_s:.1f} s.")
        if not names:
            s.summary += f" No measurement matches {list(spec.y)}."
        dest = report_out / "sweeps" / f"{spec.name}.csv"
        dest.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(dest, index=False)
        if res.parquet is not None:
            shutil.copy(res.parquet, dest.with_suffix(".parquet"))
        s.links = [f"sweeps/{spec.name}.csv"]
    return out
