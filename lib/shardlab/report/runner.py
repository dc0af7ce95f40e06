"""``python -m shardlab report``: run every notebook, collect the records, diff the baseline, write HTML.

Design note
-----------
One report run owns one output directory::

    DIR/run.json                  manifest (marks the directory as a shardlab run; written first and last)
    DIR/index.html                the self-contained report
    DIR/notebooks/NN.ipynb|.html  executed notebooks and their HTML (plotly from DIR/notebooks/plotly.min.js)
    DIR/records/NN.json           the records (``results_dir`` of every notebook)
    DIR/logs/NN.log               papermill's output; NN.params.json the parameters passed

Steps: validate every input (notebook names, parameters against each parameters cell, no ``-p`` for what
the runner sets itself, the out directory, the baseline files) before any kernel starts -> execute (``--jobs``
notebooks at a time, each papermill run in a process and kernel of its own — :func:`shardlab.report.execute.run`
— longest first, progress bar, per-notebook timeout, failures do not stop the run; each notebook's HTML is
rendered in a background thread as it finishes) -> compare with the baselines -> charts from the records
(:mod:`shardlab.report.charts`) -> HTML. Exit codes: ``datatypes.EXIT_*``.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardlab.core.answer_keys import load_key
from shardlab.profile.record import load_record
from shardlab.profile.tpu import GENERATION_ENV, TOPOLOGIES
from shardlab.report import baseline as bl
from shardlab.report import nbhtml
from shardlab.report.charts import report_charts
from shardlab.report.datatypes import ROOT, RUNNER_WALL, NotebookResult, Report, ReportOptions
from shardlab.report.execute import Execution, run
from shardlab.report.floor import Floor, Probe, default_probes, run_probe
from shardlab.report.html import write_report
from shardlab.report.notebooks import (
    REQUIRED_PARAMETERS,
    NotebookInfo,
    ReportInputError,
    check_params,
    check_runner_owned,
    find_notebooks,
    select,
)
from shardlab.report.rundir import default_out, host_env, prepare_out_dir, write_manifest
from shardlab.runtime import tpu_present

__all__ = ["ROOT", "NotebookResult", "Report", "ReportOptions", "run_report"]


def validate_inputs(options: ReportOptions) -> list[NotebookInfo]:
    """Everything that can be wrong before a kernel starts; raises ReportInputError."""
    check_runner_owned(options.params, "report")
    if options.device not in ("cpu", "tpu"):
        raise ReportInputError(f"--device {options.device!r} must be 'cpu' or 'tpu'")
    for name, value in (("--num-devices", options.num_devices), ("--jobs", options.jobs)):
        if value < 1:
            raise ReportInputError(f"{name} {value} must be >= 1")
    if options.floor_probes is not None and options.floor_probes < 0:
        raise ReportInputError(f"--floor-probes {options.floor_probes} must be >= 0 (0 skips the floor)")
    generations = sorted({t.generation for t in TOPOLOGIES.values()})
    if options.tpu_generation not in generations:
        raise ReportInputError(f"--tpu-generation {options.tpu_generation!r} must be one of {generations}")
    if options.timeout_s <= 0:
        raise ReportInputError(f"--timeout {options.timeout_s} must be > 0 seconds")
    if options.device == "tpu" and not tpu_present():
        raise ReportInputError("--device tpu but no TPU is visible on this host (no /dev/accel*, /dev/vfio, "
                               "TPU_NAME or PJRT_DEVICE=TPU)")
    notebooks = find_notebooks(options.notebooks_dir)
    if not notebooks:
        where = options.notebooks_dir or "the registered topics"
        raise ReportInputError(f"no notebooks named NN_name.ipynb in {where}")
    chosen = select(options.only, notebooks)
    for nb in chosen:
        check_params(nb, options.params)
    return chosen


def classify(ex: Execution | None, record: dict[str, Any] | None, record_error: str | None
             ) -> tuple[str, list[str]]:
    reasons: list[str] = []
    status = "passed"
    if ex is not None and ex.failure is not None:
        status = "timeout" if ex.failure.kind == "timeout" else "failed"
        reasons.append(ex.failure.message)
    if record is None:
        status = "failed" if status == "passed" else status
        reasons.append(record_error or "no record")
        return status, reasons
    bad = [c for c in record.get("checks", []) if not c.get("ok")]
    if bad:
        status = "failed" if status == "passed" else status
        reasons.append(f"{len(bad)} failed check(s): " + "; ".join(c["name"] for c in bad[:3]))
    if record.get("status") != "passed" and status == "passed":
        status = "failed"
        reasons.append(f"record status is {record.get('status')!r} (the notebook did not reach rec.close())")
    return status, reasons


def read_record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if not path.exists():
        return None, f"no record at {path.name}: the notebook did not create a Recorder with results_dir"
    try:
        return load_record(path), None
    except (ValueError, OSError) as exc:
        return None, f"record {path.name} unreadable: {exc}"


def notebook_params(options: ReportOptions, nb: NotebookInfo, out: Path) -> dict[str, Any]:
    """The -p values, the runner's own num_devices / results_dir / full_size and, for a notebook with exercises,
    the answer key from data/answers (so the report checks the key, as the tests do)."""
    params = {**options.params, "num_devices": options.num_devices, "results_dir": str(out / "records")}
    if options.full_size and "full_size" in nb.parameters:
        params["full_size"] = True
    if "generation" in nb.parameters:
        params["generation"] = options.tpu_generation
    if "answers" in nb.parameters and "answers" not in params:
        params["answers"] = load_key(nb.stem)
    return params


def longest_first(options: ReportOptions, chosen: list[NotebookInfo]) -> list[NotebookInfo]:
    """Start order: the longest notebooks (baseline wall time; unknown = longest) first, so the short ones fill
    the other job at the end instead of one long notebook running alone."""
    try:
        base = bl.load(options.baseline_dir / f"{options.profile}.json", options.profile) or {}
    except bl.BaselineError:
        base = {}
    timing = {nb: row.get("timing", {}).get(f"{RUNNER_WALL} [timer]") for nb, row in base.get("notebooks", {}).items()}
    return sorted(chosen, key=lambda nb: float((timing.get(nb.stem) or {"median": "inf"})["median"]), reverse=True)


def execute_all(options: ReportOptions, chosen: list[NotebookInfo], out: Path, notes: list[str] | None = None
                ) -> tuple[list[NotebookResult], Floor | None]:
    """Run every chosen notebook, ``options.jobs`` at a time, after the floor's probes in the same pool; results in
    suite order, and the floor (None when no probe ran or one failed: the reason goes to ``notes``)."""
    records_dir, nb_dir = out / "records", out / "notebooks"
    records_dir.mkdir(parents=True, exist_ok=True)
    plotly_js = nbhtml.write_plotly_js(nb_dir / "plotly.min.js")
    results: dict[str, NotebookResult] = {}
    renders: dict[str, Future[Path]] = {}
    env = {"PJRT_DEVICE": options.device.upper(), GENERATION_ENV: options.tpu_generation}

    def one(nb: NotebookInfo) -> Execution:
        return run(nb.stem, nb.path, nb_dir / f"{nb.stem}.ipynb", notebook_params(options, nb, out),
                   nb.path.parent, out / "logs" / f"{nb.stem}.log", options.timeout_s, env)

    runnable = []
    for nb in longest_first(options, chosen):
        lacking = [p for p in REQUIRED_PARAMETERS if p not in nb.parameters]
        if lacking:
            why = f"the parameters cell does not declare {', '.join(lacking)} (the runner sets them in every notebook)"
            results[nb.stem] = NotebookResult(nb.stem, "failed", [why], None, None, None)
        else:
            runnable.append(nb)
    n_probes = default_probes(options.jobs) if options.floor_probes is None else options.floor_probes
    with ThreadPoolExecutor(options.jobs) as pool, ThreadPoolExecutor(1) as renderer, \
            tqdm(total=len(runnable), desc="report", unit="nb") as bar:
        probes = [pool.submit(run_probe, env) for _ in range(n_probes if runnable else 0)]  # first: the pool's FIFO
        futures = {pool.submit(one, nb): nb for nb in runnable}
        for future in as_completed(futures):
            nb, ex = futures[future], future.result()
            record, error = read_record(records_dir / f"{nb.stem}.json")
            status, reasons = classify(ex, record, error)
            results[nb.stem] = NotebookResult(nb.stem, status, reasons, ex, record, None)
            if ex.executed.exists():
                renders[nb.stem] = renderer.submit(nbhtml.render, ex.executed, nb_dir / f"{nb.stem}.html",
                                                   plotly_js.name)
            bar.write(f"{nb.stem}: {status} in {ex.wall_s:.1f} s" + (f" ({'; '.join(reasons)})" if reasons else ""))
            bar.update()
        for stem, render in renders.items():
            try:
                render.result()
                results[stem].html = f"notebooks/{stem}.html"
            except Exception as exc:  # noqa: BLE001 - a broken render must not hide the results
                results[stem].reasons.append(f"HTML rendering failed: {exc}")
    return [results[nb.stem] for nb in chosen], floor_of(probes, len(runnable), options.jobs, notes)


def floor_of(probes: list[Future[Probe]], notebooks: int, jobs: int, notes: list[str] | None) -> Floor | None:
    """The floor from the finished probes, or None (with the reason in ``notes``) when none ran or one failed."""
    if not probes:
        return None
    try:
        return Floor(notebooks, jobs, tuple(f.result() for f in probes))
    except Exception as exc:  # noqa: BLE001 - a failed probe costs the floor line, never the report
        if notes is not None:
            notes.append(f"floor not measured: {exc}")
        return None


def _split(record: dict[str, Any], tpu: bool) -> dict[str, Any]:
    """The record with only the compile-only TPU view's rows (``tpu``) or only the others."""
    return {**record, "measurements": [m for m in record.get("measurements", []) if (m["source"] == "tpu") == tpu]}


def apply_baseline(options: ReportOptions, results: list[NotebookResult], env: dict[str, Any],
                   notes: list[str]) -> tuple[Path, str]:
    """Compare with (or rewrite) the two baselines — ``options.profile`` for formula / ledger / hlo / metrics /
    timer rows, ``options.tpu_profile`` for the TPU compiler's rows — and return the first's path and state.
    Raises BaselineError for an unusable file."""
    states = {}
    for tpu, profile in ((False, options.profile), (True, options.tpu_profile)):
        path = options.baseline_dir / f"{profile}.json"
        try:
            base = bl.load(path, profile)
        except bl.BaselineError as exc:
            if not options.update_baseline:
                raise
            notes.append(f"existing baseline {path.name} was unusable and is rewritten from scratch ({exc})")
            base = None
        timings = {r.stem: {} if tpu else r.runner_timings(options.profile) for r in results}
        records = {r.stem: _split(r.record, tpu) for r in results if r.record is not None}
        for r in (r for r in results if r.stem in records):
            entry = (base or {}).get("notebooks", {}).get(r.stem)
            diffs = bl.compare_notebook(r.stem, entry, records[r.stem], timings[r.stem])
            r.diffs = [*r.diffs, *diffs] if tpu else diffs
            r.param_changes = r.param_changes if tpu else bl.param_changes(entry, r.record)
            r.compared = r.compared or entry is not None
            n = sum(d.regression for d in diffs)
            if entry is not None and n and r.status in ("passed", "regressed"):
                r.status = "regressed"
                r.reasons.append(f"{n} structural value(s) differ from the baseline {profile}")
        good = [r for r in results if r.record is not None and r.status in ("passed", "regressed")]
        if not options.update_baseline:
            states[tpu] = (path, "compared" if base is not None else "none")
        elif tpu and not any(records[r.stem]["measurements"] for r in good):
            states[tpu] = (path, "none")  # no TPU view ran (a TPU host: the hlo column is the TPU there)
        else:
            if not tpu and len(good) < len(results):
                notes.append("baseline not updated for failed notebook(s): "
                             + ", ".join(r.stem for r in results if r not in good))
            bl.save(bl.baseline_from_records(profile, [records[r.stem] for r in good], env,
                                             {r.stem: timings[r.stem] for r in good}, base), path)
            states[tpu] = (path, "updated" if base is not None else "created")
    for r in results if options.update_baseline else []:
        if r.status == "regressed":
            r.status = "passed"
            r.reasons.append("baseline updated from this run")
    notes.append(f"TPU compiler baseline {states[True][0].name}: {states[True][1]}")
    return states[False]


def run_report(options: ReportOptions) -> Report:
    """Run the whole report; raises ReportInputError / BaselineError for runner-level failures."""
    chosen = validate_inputs(options)
    if not options.update_baseline:                      # fail fast, before any kernel, on a corrupt baseline
        bl.load(options.baseline_dir / f"{options.profile}.json", options.profile)
        bl.load(options.baseline_dir / f"{options.tpu_profile}.json", options.tpu_profile)
    out = (options.out or default_out()).resolve()      # kernels run in notebooks/: every path absolute
    prepare_out_dir(out, options.force)
    started = time.time()
    write_manifest(out, options, started, None, None)
    env = host_env(options)
    notes: list[str] = []
    results, floor = execute_all(options, chosen, out, notes)
    for r in results:
        if r.record and r.record.get("env"):
            env.setdefault("notebook_env", r.record["env"])
    path, state = apply_baseline(options, results, env, notes)
    report = Report(options, out, started, time.time(), results, path, state, env, notes=notes,
                    charts=report_charts([r.record for r in results if r.record is not None]), floor=floor)
    write_report(report, out / "index.html")  # report.finished stays: the page and the terminal state one wall
    write_manifest(out, options, started, results, report.exit_status, report.floor_summary())
    if options.out is None:
        latest = out.parent / "latest"
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(out.name)
    return report
