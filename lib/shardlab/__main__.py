"""Command line: ``python -m shardlab report ...`` and ``python -m shardlab sweep ...``.

Exit status (``shardlab.report.datatypes.EXIT_*``): 0 all good; 1 a notebook failed (error, timeout, failed
check) or a structural value regressed against the baseline (a sweep: a point failed); 2 the runner itself
failed (bad input, unusable baseline, internal error). Parameters the runner sets itself are options, never
``-p``: ``--num-devices`` (num_devices) and ``--out`` (results_dir).

Examples::

    python -m shardlab report                                   # all notebooks, CPU, 8 devices
    python -m shardlab report --only 01 02_megatron_mlp --out out/r1 --timeout 120
    python -m shardlab report --update-baseline                 # rewrite data/baselines/cpu-8.json
    python -m shardlab sweep 02_megatron_mlp -p tp 1 2 4 8 -p batch 4 --jobs 2
    python -m shardlab sweep 00 --num-devices 2 4 8            # device counts are the runner's: an option
    python -m shardlab badges --repo OWNER/shardlab             # README badge table
    python -m shardlab inspect llama-3-8b --topology v6e-8 --mesh fsdp=8   # an HF model on a TPU slice
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from shardlab.inspect.cli import add_parser as add_inspect
from shardlab.inspect.cli import main as inspect_main
from shardlab.report.baseline import BaselineError
from shardlab.report.datatypes import EXIT_FAILED, EXIT_OK, EXIT_RUNNER, ROOT
from shardlab.report.hosted import badge_table
from shardlab.report.notebooks import ReportInputError, find_notebooks, parse_value, resolve_name
from shardlab.runtime import hide_slow_modules, tpu_present

# report.runner / sweep / charts are imported in the commands that use them, after main() has called
# hide_slow_modules(): the runner imports nbformat, 3.7 s slower before it (execute.py), and sweep imports pandas.


def _params(pairs: list[list[str]] | None, single: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        name, values = pair[0], [parse_value(v) for v in pair[1:]]
        if not values:
            raise ReportInputError(f"-p {name} needs a value")
        if name in out:
            raise ReportInputError(f"-p {name} given twice")
        if single and len(values) != 1:
            raise ReportInputError(f"-p {name} takes exactly one value in report (got {len(values)}); "
                                   "use `python -m shardlab sweep` for grids")
        out[name] = values[0] if single else values
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m shardlab", description="shardlab report runner and sweeps")
    sub = ap.add_subparsers(dest="command", required=True)

    rp = sub.add_parser("report", help="execute every notebook and write an HTML report")
    rp.add_argument("--num-devices", type=int, default=8, help="CPU virtual devices / TPU chips (default 8)")
    rp.add_argument("--device", choices=["auto", "cpu", "tpu"], default="auto",
                    help="device profile; auto = tpu when a TPU is visible, else cpu")
    rp.add_argument("--out", type=Path, default=None,
                    help="output directory (default out/reports/<UTC time>, linked as out/reports/latest)")
    rp.add_argument("--only", nargs="+", metavar="NAME", help="notebook stems or numbers (e.g. 01 02_megatron_mlp)")
    rp.add_argument("-p", "--param", nargs="+", action="append", metavar=("NAME", "VALUE"),
                    help="override a parameter in every selected notebook (must be declared by each)")
    rp.add_argument("--timeout", type=float, default=None,
                    help="seconds per notebook (default 600; 3600 with --full-size)")
    rp.add_argument("--full-size", action="store_true",
                    help="full_size=True in the notebooks that declare it (06: the 405B seed, 07: the compiler's "
                         "verdict on real presets): tens of minutes of XLA:TPU compiles; baseline profiles "
                         "<profile>-full")
    rp.add_argument("--jobs", type=int, default=1, help="notebooks (kernels) at a time (default 1)")
    rp.add_argument("--floor-probes", type=int, default=None,
                    help="bare kernels timed (start + import torch_xla) for the floor the wall is compared with; "
                         "0 skips them (default: one per job, at least 2)")
    rp.add_argument("--force", "--overwrite", dest="force", action="store_true",
                    help="replace an existing report in --out")
    rp.add_argument("--tpu-generation", default="v5e",
                    help="TPU generation every compile-only TPU view compiles for (default v5e; baseline profile "
                         "tpu-<generation>-<N>-aot)")
    rp.add_argument("--update-baseline", action="store_true",
                    help="rewrite data/baselines/<profile>.json from this run")
    rp.add_argument("--baseline-dir", type=Path, default=None, help="default data/baselines")
    rp.add_argument("--notebooks-dir", type=Path, default=None, help=argparse.SUPPRESS)

    sp = sub.add_parser("sweep", help="run one notebook over a parameter grid (resumable)")
    sp.add_argument("notebook", help="notebook stem, number, or path")
    sp.add_argument("-p", "--param", nargs="+", action="append", metavar=("NAME", "VALUE"),
                    help="a swept parameter and its values (one value = fixed); YAML values: 4, 0.5, bf16, [2,4]")
    sp.add_argument("--out", type=Path, default=None, help="sweep directory (default out/sweeps/<notebook>)")
    sp.add_argument("--jobs", type=int, default=1, help="points (kernels) at a time (~1 GB RAM each on CPU)")
    sp.add_argument("--num-devices", type=int, nargs="+", default=[8],
                    help="CPU virtual devices / TPU chips (default 8); several values sweep the device count")
    sp.add_argument("--device", choices=["cpu", "tpu"], default="cpu")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds per point")
    sp.add_argument("--force", action="store_true", help="replace a sweep of another notebook in --out")
    sp.add_argument("--x", dest="x", help="chart only this parameter on the x axis")
    sp.add_argument("--y", dest="y", nargs="+", help="chart only measurements matching these patterns")
    sp.add_argument("--name-param", nargs=2, action="append", metavar=("COLUMN", "REGEX"),
                    help=r"split a parameter out of measurement names, e.g. L '\.L(\d+)$'")
    sp.add_argument("--notebooks-dir", type=Path, default=None, help=argparse.SUPPRESS)

    bp = sub.add_parser("badges", help="print the README's Open-in-Colab / Open-in-Kaggle table")
    bp.add_argument("--repo", required=True, help="owner/name of the public GitHub repository")
    bp.add_argument("--branch", default="main")
    add_inspect(sub)
    return ap


def cmd_report(args: argparse.Namespace) -> int:
    from shardlab.report.runner import ReportOptions, run_report

    device = args.device
    if device == "auto":
        device = "tpu" if tpu_present() else "cpu"
    opts = ReportOptions(num_devices=args.num_devices, device=device, out=args.out, only=args.only,
                         params=_params(args.param, single=True),
                         timeout_s=args.timeout or (3600.0 if args.full_size else 600.0), jobs=args.jobs,
                         force=args.force, update_baseline=args.update_baseline, full_size=args.full_size,
                         tpu_generation=args.tpu_generation, floor_probes=args.floor_probes)
    if args.baseline_dir is not None:
        opts.baseline_dir = args.baseline_dir
    if args.notebooks_dir is not None:
        opts.notebooks_dir = args.notebooks_dir
    report = run_report(opts)
    print(f"\nreport: {report.out / 'index.html'}  ({report.finished - report.started:.1f} s)")
    for r in report.results:
        wall = f"{r.execution.wall_s:6.1f} s" if r.execution else "     — "
        comp = f"compile {r.compile_s:5.1f} s" if r.compile_s is not None else ""
        tpu = f"tpu {r.tpu_compile_s:5.1f} s" if r.tpu_compile_s is not None else ""
        tpu += f" +{r.tpu_stored} stored" if r.tpu_stored else ""
        cpu = f"cpu {r.cpu_s:5.1f} s" if r.cpu_s is not None else ""
        print(f"  {r.status:9s} {wall} {comp:16s} {tpu:22s} {cpu:12s} {r.stem}  {'; '.join(r.reasons)}")
    print(f"baseline {report.baseline_state}: {report.baseline_path}")
    print(f"report {report.floor_line()}")
    if report.store_line():
        print(f"  {report.store_line()}")
    for note in report.notes:
        print(f"  note: {note}")
    return report.exit_status


def cmd_sweep(args: argparse.Namespace) -> int:
    from shardlab.report.charts import charts, write_charts
    from shardlab.report.sweep import match_names, run_sweep

    nb = resolve_name(args.notebook, find_notebooks(args.notebooks_dir))
    grid = _params(args.param, single=False)
    axes = {k: v for k, v in grid.items() if len(v) > 1}
    base = {k: v[0] for k, v in grid.items() if len(v) == 1}
    name_params = dict(args.name_param or [])
    out = args.out or ROOT / "out" / "sweeps" / nb.stem
    res = run_sweep(nb, axes, out, base=base, num_devices=args.num_devices, device=args.device, jobs=args.jobs,
                    timeout_s=args.timeout, force=args.force, name_params=name_params, render=False)
    xs = [args.x] if args.x else [*axes, *name_params]
    names = match_names(res.frame, args.y) if args.y else None
    figs = [f for x in xs for f in charts(res.frame, x, names)]
    write_charts(figs, out / "charts.html", f"sweep of {nb.stem}")
    bad = [p for p in res.points if p.status in ("failed", "timeout")]
    print(f"\nsweep {nb.stem}: {len(res.points)} points, {res.ran} run, {len(res.points) - res.ran} reused, "
          f"{len(bad)} failed, {res.wall_s:.1f} s")
    for p in bad:
        print(f"  {p.status}: {p.dir.name}: {p.message}  (log: {p.dir / 'papermill.log'})")
    print(f"table: {res.table}\ncharts: {out / 'charts.html'}")
    return EXIT_FAILED if bad else EXIT_OK


def cmd_badges(args: argparse.Namespace) -> int:
    try:
        print(badge_table(find_notebooks(), args.repo, args.branch))
    except ValueError as exc:
        raise ReportInputError(str(exc)) from exc
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    hide_slow_modules()                             # 3.7 s of nbformat's import; see execute.py
    args = build_parser().parse_args(argv)
    if args.command == "inspect":  # its own exit status: 0 fits, 1 does not fit, 2 bad input
        return inspect_main(args)
    try:
        commands = {"report": cmd_report, "sweep": cmd_sweep, "badges": cmd_badges}
        return commands[args.command](args)
    except (ReportInputError, BaselineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNNER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_RUNNER
    except Exception:  # noqa: BLE001 - the runner itself failed: say so with status 2
        traceback.print_exc()
        print("error: the runner itself failed (see traceback above)", file=sys.stderr)
        return EXIT_RUNNER


if __name__ == "__main__":
    sys.exit(main())
