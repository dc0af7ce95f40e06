"""``python -m shardlab report``: run every notebook, collect the records, diff the baseline, write HTML.

Design note
-----------
One report run owns one output directory::

    DIR/run.json                  manifest (marks the directory as a shardlab run; written first and last)
    DIR/index.html                the self-contained report
    DIR/notebooks/NN.ipynb|.html  executed notebooks and their HTML (plotly from DIR/notebooks/plotly.min.js)
    DIR/records/NN.json           the records (``results_dir`` of every notebook), NN.xla.json compile totals
    DIR/logs/NN.log               papermill output; NN.params.json the parameters passed
    DIR/sweeps/                   tables of the report's sweeps

Steps: validate every input (notebook names, parameters against each parameters cell, the out directory,
the baseline file) before any kernel starts -> execute (``execute.run_many``: progress bar, per-notebook
timeout, failures do not stop the run) -> classify each notebook -> compare with
``data/baselines/<profile>.json`` -> optional sweeps -> HTML. Exit status (issue 6): 0 all good, 1 a
notebook failed (error, timeout, failed check, missing record) or a structural regression, 2 the runner
itself failed (bad input, unusable baseline, internal error).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardlab.report import baseline as bl
from shardlab.report import execute, nbhtml
from shardlab.report.notebooks import (
    REQUIRED_PARAMETERS,
    NotebookInfo,
    ReportInputError,
    check_params,
    find_notebooks,
    select,
)
from shardlab.report.rundir import ROOT, default_out, host_env, prepare_out_dir, write_manifest

EXIT_OK, EXIT_FAILED, EXIT_RUNNER = 0, 1, 2
RUNNER_WALL = "report.notebook.wall_s"       # timing rows the runner adds to each notebook
RUNNER_COMPILE = "report.notebook.xla_compile_s"


@dataclass
class ReportOptions:
    notebooks_dir: Path = ROOT / "notebooks"
    out: Path | None = None                    # None: out/reports/<UTC time>, with out/reports/latest
    num_devices: int = 8
    device: str = "cpu"                        # cpu | tpu
    only: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)   # extra -p values for every selected notebook
    timeout_s: float = 600.0
    jobs: int = 1
    force: bool = False
    update_baseline: bool = False
    baseline_dir: Path = ROOT / "data" / "baselines"
    sweeps: bool = True
    sweep_cache: Path = ROOT / "out" / "sweeps"
    sweep_jobs: int = 2

    @property
    def profile(self) -> str:
        return f"{self.device}-{self.num_devices}"


@dataclass
class NotebookResult:
    stem: str
    status: str                                # passed | failed | timeout | regressed
    reasons: list[str]
    execution: execute.Execution | None
    record: dict[str, Any] | None
    xla: dict[str, Any]
    html: str | None                           # path relative to the report dir
    diffs: list[bl.Diff] = field(default_factory=list)
    param_changes: dict[str, Any] = field(default_factory=dict)
    compared: bool = False                     # a baseline entry existed for this notebook

    @property
    def compile_s(self) -> float | None:
        ct = self.xla.get("CompileTime")
        return float(ct["total_s"]) if ct else None

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
    baseline_state: str                        # "compared" | "none" | "updated" | "reset"
    env: dict[str, Any]
    sweeps: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """1 if a notebook did not pass or a sweep point failed (a failed check is a failed check)."""
        ok = all(r.status == "passed" for r in self.results) and not any(s.failed_points for s in self.sweeps)
        return EXIT_OK if ok else EXIT_FAILED


def validate_inputs(options: ReportOptions) -> list[NotebookInfo]:
    """Everything that can be wrong before a kernel starts; raises ReportInputError."""
    if options.device not in ("cpu", "tpu"):
        raise ReportInputError(f"--device {options.device!r} must be 'cpu' or 'tpu'")
    if options.num_devices < 1:
        raise ReportInputError(f"--num-devices {options.num_devices} must be >= 1")
    if options.timeout_s <= 0:
        raise ReportInputError(f"--timeout {options.timeout_s} must be > 0 seconds")
    if options.jobs < 1:
        raise ReportInputError(f"--jobs {options.jobs} must be >= 1")
    if options.device == "tpu":
        from shardlab.runtime import tpu_present

        if not tpu_present():
            raise ReportInputError("--device tpu but no TPU is visible on this host (no /dev/accel*, /dev/vfio, "
                                   "TPU_NAME or PJRT_DEVICE=TPU)")
    notebooks = find_notebooks(options.notebooks_dir)
    if not notebooks:
        raise ReportInputError(f"no notebooks named NN_name.ipynb in {options.notebooks_dir}")
    chosen = select(options.only, notebooks)
    for nb in chosen:
        check_params(nb, options.params)
    return chosen


def classify(nb: NotebookInfo, ex: execute.Execution | None, record: dict[str, Any] | None,
             record_error: str | None) -> tuple[str, list[str]]:
    reasons: list[str] = []
    status = "passed"
    if ex is not None and ex.failure is not None:
        status = "timeout" if ex.failure.kind == "timeout" else "failed"
        reasons.append(ex.failure.message)
    if record is None:
        status = "failed" if status == "passed" else status
        reasons.append(record_error or "no record")
    else:
        bad = [c for c in record.get("checks", []) if not c.get("ok")]
        if bad:
            status = "failed" if status == "passed" else status
            reasons.append(f"{len(bad)} failed check(s): " + "; ".join(c["name"] for c in bad[:3]))
        if record.get("status") not in ("passed",) and status == "passed":
            status = "failed"
            reasons.append(f"record status is {record.get('status')!r} (the notebook did not reach rec.close())")
    return status, reasons


def _load_record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    from shardlab.profile.record import load_record

    if not path.exists():
        return None, f"no record at {path.name}: the notebook did not create a Recorder with results_dir"
    try:
        return load_record(path), None
    except (ValueError, OSError) as exc:
        return None, f"record {path.name} unreadable: {exc}"


def execute_all(options: ReportOptions, chosen: list[NotebookInfo], out: Path) -> list[NotebookResult]:
    records_dir, nb_dir, logs = out / "records", out / "notebooks", out / "logs"
    env = {"PJRT_DEVICE": options.device.upper()}
    tasks: list[execute.Task] = []
    missing_required: dict[str, str] = {}
    for nb in chosen:
        lacking = [p for p in REQUIRED_PARAMETERS if p not in nb.parameters]
        if lacking:
            missing_required[nb.stem] = (f"the parameters cell does not declare {', '.join(lacking)} "
                                         "(every notebook must: design.md 'Notebook parameters')")
            continue
        params = {**options.params, "num_devices": options.num_devices, "results_dir": str(records_dir)}
        src = execute.prepare_input(nb.path, logs / f"{nb.stem}.input.ipynb")
        tasks.append(execute.Task(nb.stem, nb.stem, src, nb_dir / f"{nb.stem}.ipynb", logs / f"{nb.stem}.log",
                                  params, nb.path.parent, env))
    records_dir.mkdir(parents=True, exist_ok=True)
    done = {t.stem: ex for t, ex in zip(tasks, execute.run_many(tasks, jobs=options.jobs,
                                                               timeout_s=options.timeout_s, desc="report"),
                                        strict=True)}
    plotly_js = nbhtml.write_plotly_js(nb_dir / "plotly.min.js")
    results = []
    for nb in chosen:
        ex = done.get(nb.stem)
        if ex is None:
            results.append(NotebookResult(nb.stem, "failed", [missing_required[nb.stem]], None, None, {}, None))
            continue
        record, record_error = _load_record(records_dir / f"{nb.stem}.json")
        status, reasons = classify(nb, ex, record, record_error)
        html = None
        if ex.executed.exists():
            try:
                nbhtml.render(ex.executed, nb_dir / f"{nb.stem}.html", plotly_js.name)
                html = f"notebooks/{nb.stem}.html"
            except Exception as exc:  # noqa: BLE001 - a broken render must not hide the results
                reasons.append(f"HTML rendering failed: {exc}")
        results.append(NotebookResult(nb.stem, status, reasons, ex, record,
                                      execute.read_xla_totals(records_dir, nb.stem), html))
    return results


def apply_baseline(options: ReportOptions, results: list[NotebookResult], env: dict[str, Any],
                   notes: list[str]) -> tuple[Path, str]:
    """Compare with (or rewrite) the profile's baseline; raises BaselineError for an unusable file."""
    path = options.baseline_dir / f"{options.profile}.json"
    try:
        base = bl.load(path, options.profile)
    except bl.BaselineError as exc:
        if not options.update_baseline:
            raise
        notes.append(f"existing baseline was unusable and is rewritten from scratch ({exc})")
        base = None
    timings = {r.stem: r.runner_timings(options.profile) for r in results}
    for r in results:
        if r.record is not None:
            entry = (base or {}).get("notebooks", {}).get(r.stem)
            r.diffs = bl.compare_notebook(r.stem, entry, r.record, timings[r.stem])
            r.param_changes = bl.param_changes(entry, r.record)
            r.compared = entry is not None
            if entry is not None and any(d.regression for d in r.diffs) and r.status == "passed":
                r.status = "regressed"
                n = sum(d.regression for d in r.diffs)
                r.reasons.append(f"{n} structural value(s) differ from the baseline")
    if not options.update_baseline:
        return path, "compared" if base is not None else "none"
    good = [r for r in results if r.record is not None and r.status in ("passed", "regressed")]
    skipped = [r.stem for r in results if r not in good]
    if skipped:
        notes.append(f"baseline not updated for failed notebook(s): {', '.join(skipped)}")
    bl.save(bl.baseline_from_records(options.profile, [r.record for r in good if r.record], env,
                                     {r.stem: timings[r.stem] for r in good}, base), path)
    for r in good:
        if r.status == "regressed":
            r.status = "passed"
            r.reasons.append("baseline updated from this run")
    return path, "updated" if base is not None else "created"


def run_report(options: ReportOptions) -> Report:
    """Run the whole report; raises ReportInputError / BaselineError for runner-level failures."""
    chosen = validate_inputs(options)
    baseline_path = options.baseline_dir / f"{options.profile}.json"
    if not options.update_baseline:
        bl.load(baseline_path, options.profile)          # fail fast, before any kernel, on a corrupt baseline
    out = (options.out or default_out()).resolve()      # kernels run in notebooks/: every path absolute
    prepare_out_dir(out, options.force)
    started = time.time()
    write_manifest(out, options, started, None, None)
    env = host_env(options)
    results = execute_all(options, chosen, out)
    for r in results:
        if r.record and r.record.get("env"):
            env.setdefault("notebook_env", r.record["env"])
    notes: list[str] = []
    path, state = apply_baseline(options, results, env, notes)
    report = Report(options, out, started, time.time(), results, path, state, env, notes=notes)
    if options.sweeps:
        from shardlab.report.sweeps_config import run_report_sweeps

        failed = frozenset(r.stem for r in results if r.status in ("failed", "timeout"))
        report.sweeps = run_report_sweeps(options, out, [r.stem for r in results], failed)
    report.finished = time.time()
    from shardlab.report.html import write_report

    write_report(report, out / "index.html")
    write_manifest(out, options, started, results, report.exit_status)
    if options.out is None:
        latest = out.parent / "latest"
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(out.name)
    return report
