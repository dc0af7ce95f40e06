"""One notebook execution: papermill in a process of its own, a timeout that ends it, the failure read back.

Design note
-----------
:func:`run` starts ``python -m shardlab.report.execute SRC DEST PARAMS CWD`` — a small process that runs
papermill once — and waits at most ``timeout_s``; on timeout it ends the process *and its kernel* (the kernel
runs in a session of its own, so the tree is walked by parent pid with psutil, not by process group). The
runner calls :func:`run` from a pool of ``--jobs`` threads: a process pool of notebook executions, each in a
fresh kernel, so every notebook's wall and compile time are measured the same way.

What torch_xla compiled during a notebook is written by the notebook itself
(:meth:`shardlab.profile.record.Recorder.close` stores the compile / execute totals in the record's ``xla``
field); nothing is injected into the notebook.

:func:`find_failure` reads an executed notebook back (papermill saves it after every cell): the cell that
raised (its source and traceback) or the cell still running when the clock ran out.

Kernel environment: ``TF_CPP_MIN_LOG_LEVEL=2``, ``PLOTLY_RENDERER=plotly_mimetype`` (figures as JSON for the
HTML) and a ``TMPDIR`` of its own, removed afterwards. The kernel is shut down immediately after the last cell,
which writes the record (measured: a graceful shutdown spent 2.5 s per notebook in torch_xla's exit hooks); what
those hooks would remove (HLO dumps, TPU worker logs) is in that ``TMPDIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from shardlab.runtime import hide_slow_modules

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
KILL_GRACE_S = 5.0          # after SIGTERM, how long the tree gets before SIGKILL
KERNEL_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PLOTLY_RENDERER": "plotly_mimetype", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
@dataclass
class Failure:
    kind: str                 # "error" | "timeout" | "crash"
    message: str              # one line: "ValueError: hidden=100 is not divisible by tp=8"
    cell_index: int | None = None
    cell_source: str = ""
    traceback: str = ""
    execution_count: int | None = None   # the cell's "In [n]"


@dataclass
class Execution:
    stem: str
    executed: Path            # the executed notebook (.ipynb), possibly partial
    log: Path                 # papermill's output for this run
    params: dict[str, Any]
    wall_s: float             # process start to end, the kernel's start included
    returncode: int | None    # 0 ok, 1 failed; None when killed on timeout
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` and all its descendants (TERM, a grace period, then KILL)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
        for signal in ("terminate", "kill"):  # TERM, a grace period, then KILL what is left
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    getattr(p, signal)()
            procs = psutil.wait_procs(procs, timeout=KILL_GRACE_S)[1]
    proc.wait()


def _strip(text: str) -> str:
    return ANSI_RE.sub("", text)


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def find_failure(executed: Path) -> Failure | None:
    """The first error output of an executed notebook, or the cell papermill left 'running'."""
    try:
        cells = json.loads(executed.read_text()).get("cells", [])
    except (OSError, json.JSONDecodeError):
        return None
    for n, cell in enumerate(cells):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                return Failure("error", f"{out.get('ename', 'Error')}: {_strip(str(out.get('evalue', '')))}", n,
                               _source(cell), _strip("\n".join(out.get("traceback", []))),
                               cell.get("execution_count"))
    for n, cell in enumerate(cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            return Failure("timeout", "cell was still running", n, _source(cell))
    return None


def run(stem: str, src: Path, dest: Path, params: dict[str, Any], cwd: Path, log: Path, timeout_s: float,
        env: dict[str, str] | None = None) -> Execution:
    """Execute notebook ``src`` with ``params`` into ``dest`` in a fresh process and kernel; never raises for a
    failing notebook (the :class:`Execution` says what happened)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    params_file = log.with_suffix(".params.json")
    params_file.write_text(json.dumps(params, indent=1))
    cmd = [sys.executable, "-m", "shardlab.report.execute", str(src), str(dest), str(params_file), str(cwd)]
    tmp = tempfile.mkdtemp(prefix=f"shardlab-{stem}-")
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **KERNEL_ENV, "TMPDIR": tmp, **(env or {})})
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
    wall = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    failure = find_failure(dest)
    if code is None:
        where = failure if failure is not None and failure.kind == "timeout" else Failure("timeout", "")
        where.kind, where.message = "timeout", f"notebook timed out after {timeout_s:g} s" + (
            f" (cell {where.cell_index} was running)" if where.cell_index is not None else "")
        failure = where
    elif code != 0 and failure is None:
        tail = _strip(log.read_text(errors="replace"))[-4000:]
        failure = Failure("crash", tail.strip().splitlines()[-1] if tail.strip() else "papermill died",
                          traceback=tail)
    elif code == 0 and failure is not None and failure.kind == "timeout":
        failure = None      # papermill finished; a stale 'running' status is not a failure
    return Execution(stem, dest, log, dict(params), wall, code, failure)


ENGINE = "shardlab"


def register_engine() -> None:
    """Register papermill's nbclient engine under :data:`ENGINE`, saving the executed notebook when a cell starts
    but not again when it completes. papermill saves the whole notebook twice per cell (measured: ~18 ms of CPU
    per save of a report notebook, 50 saves each); the save at the next cell's start — or papermill's final
    write, or the one it makes before raising for an error — holds everything the skipped save held, so a
    timed-out notebook still shows its finished cells and the one that was running (:func:`find_failure`)."""
    from papermill.engines import NBClientEngine, NotebookExecutionManager, papermill_engines

    class Manager(NotebookExecutionManager):
        completing = False

        def cell_complete(self, cell: Any, cell_index: int | None = None, **kwargs: Any) -> None:
            self.completing = True
            try:
                super().cell_complete(cell, cell_index, **kwargs)
            finally:
                self.completing = False

        def save(self, **kwargs: Any) -> None:
            if not self.completing:
                super().save(**kwargs)

    class Engine(NBClientEngine):
        @classmethod
        def execute_notebook(cls, nb: Any, kernel_name: str, output_path: str | None = None,
                             progress_bar: bool = True, log_output: bool = False, autosave_cell_every: int = 30,
                             **kwargs: Any) -> Any:  # papermill's Engine.execute_notebook with our manager
            nb_man = Manager(nb, output_path=output_path, progress_bar=progress_bar, log_output=log_output,
                             autosave_cell_every=autosave_cell_every)
            nb_man.notebook_start()
            try:
                cls.execute_managed_notebook(nb_man, kernel_name, log_output=log_output, **kwargs)
            finally:
                nb_man.cleanup_pbar()
                nb_man.notebook_complete()
            return nb_man.nb

    papermill_engines.register(ENGINE, Engine)


def main(argv: list[str]) -> int:
    """``python -m shardlab.report.execute SRC DEST PARAMS_JSON CWD``: papermill, once."""
    hide_slow_modules()
    import papermill as pm  # after hide_slow_modules (3.7 s less import time)

    register_engine()
    src, dest, params_file, cwd = argv
    try:
        pm.execute_notebook(src, dest, parameters=json.loads(Path(params_file).read_text()), cwd=cwd,
                            kernel_name="python3", progress_bar=False, log_output=True, start_timeout=300,
                            shutdown_kernel="immediate", engine_name=ENGINE)
    except pm.PapermillExecutionError:
        return 1  # the executed notebook holds the error; find_failure reads it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
