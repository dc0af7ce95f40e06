"""The report's output directory: claim it safely, describe the host, write the run manifest.

Design note
-----------
``run.json`` marks a directory as a shardlab report run; it is written before any kernel starts and again
at the end. An existing non-empty directory is replaced only with ``--force`` *and* only if it carries that
marker — anything else is refused, so earlier runs (or unrelated files) are never overwritten unless asked.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from shardlab.report.datatypes import ROOT, NotebookResult, ReportOptions
from shardlab.report.notebooks import ReportInputError

RUN_SCHEMA = "shardlab.report-run/1"


def prepare_out_dir(out: Path, force: bool) -> None:
    """Create ``out``; an existing non-empty directory is replaced only with ``force`` and only if it is ours."""
    if out.exists() and not out.is_dir():
        raise ReportInputError(f"--out {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        ours = (out / "run.json").exists()
        if not force:
            what = "another report run" if ours else "other files"
            raise ReportInputError(f"--out {out} already holds {what}; nothing was changed. Pass --force to "
                                   "replace it, or choose another directory")
        if not ours:
            raise ReportInputError(f"--out {out} is not empty and has no run.json (not a shardlab report "
                                   "directory): refusing to delete it even with --force")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def default_out() -> Path:
    return ROOT / "out" / "reports" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def host_env(options: ReportOptions) -> dict[str, Any]:
    env: dict[str, Any] = {"profile": options.profile, "device": options.device, "num_devices": options.num_devices,
                           "python": sys.version.split()[0], "platform": platform.platform(),
                           "machine": platform.machine()}
    installed = {d.metadata["Name"].lower().replace("-", "_"): d.version for d in importlib.metadata.distributions()}
    return env | {d: installed.get(d, "not installed") for d in ("torch", "torch_xla", "jax", "jaxlib", "torchax",
                                                                 "libtpu", "transformers", "papermill", "plotly")}


def write_manifest(out: Path, options: ReportOptions, started: float, results: list[NotebookResult] | None,
                   exit_status: int | None, floor: dict[str, Any] | None = None) -> None:
    data = {"schema": RUN_SCHEMA, "started": started, "finished": time.time() if results is not None else None,
            "argv": sys.argv, "profile": options.profile, "exit_status": exit_status, "floor": floor,
            "notebooks": [{"stem": r.stem, "status": r.status, "reasons": r.reasons,
                           "wall_s": r.execution.wall_s if r.execution else None, "compile_s": r.compile_s,
                           "tpu_compile_s": r.tpu_compile_s, "tpu_live": r.tpu_live, "tpu_stored": r.tpu_stored,
                           "cpu_s": r.cpu_s,
                           "html": r.html} for r in (results or [])]}
    (out / "run.json").write_text(json.dumps(data, indent=1))
