"""One notebook execution: what the runner adds to the notebook, and how a finished run is read back.

Design note
-----------
Every execution happens in a kernel held by a worker process (``kernel_worker``, scheduled by ``pool``):
a fresh kernel per notebook of the report, a kernel shared by the points of one sweep. This module holds
what both need:

* :func:`prepare_input` copies the notebook and adds two tagged cells the HTML export drops again: a
  *prologue* (in a shared kernel: clears the namespace and output cache, restarts the XLA RNG from a fresh
  kernel's seed, notes torch global state a fresh kernel would not have; always: snapshots torch_xla's compile
  counters) and an *epilogue*
  (writes ``<results_dir>/<stem>.xla.json``: compile / execute totals **of this run** — the counters minus the
  prologue's snapshot — ``CachedCompile`` / ``UncachedCompile``, ``TpuCachedCompile`` when the TPU compiler
  view was used (hits of its own in-process cache, from ``shardlab.profile.tpu.CACHE_HITS``; null while that
  module does not count them), ``state_changed`` (what the prologue found different from a fresh kernel) and
  ``kernel_run``, the how-many-th notebook this kernel executes). In a fresh kernel the snapshot is empty, so
  the totals are the kernel's totals.
* :func:`find_failure` reads an executed notebook back (papermill saves it after every cell): the cell that
  raised (its source and traceback) or the cell still running when the clock ran out.
* :func:`kill_tree` ends a worker and its kernel by pid (the kernel runs in its own session, so a
  process-group kill would miss it).

Kernel environment: ``TF_CPP_MIN_LOG_LEVEL=2`` (hides the GSPMD warning per compile) and
``PLOTLY_RENDERER=plotly_mimetype`` (figures stored as JSON; the HTML renderer draws them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
KILL_GRACE_S = 5.0          # after SIGTERM, how long the tree gets before SIGKILL
KERNEL_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PLOTLY_RENDERER": "plotly_mimetype", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
# `import nbformat` pulls jsonschema's optional rfc3987_syntax, which builds a lark grammar at import time
# (measured 3.7 s of papermill's 4.8 s import here; ~1 s of CPU in every kernel whose first `fig.show()`
# imports nbformat for plotly's mimetype renderer). nbformat never validates IRI formats, so the workers and
# the kernels hide that module (jsonschema skips the format when the import fails).
SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)


def hide_slow_modules() -> None:
    """Make :data:`SLOW_OPTIONAL_MODULES` unimportable in this process (call before importing nbformat)."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[assignment]


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
    wall_s: float             # from handing the notebook to its worker to the end (a fresh kernel's start included)
    returncode: int | None    # 0 ok, 1 failed; None when killed on timeout
    failure: Failure | None = None
    kernel_run: int = 1       # 1: the kernel's first notebook (a fresh kernel); n: n-th run in a shared kernel
    rerun: str = ""           # why this ran again in a fresh kernel after a run in a shared one ("" if not)

    @property
    def ok(self) -> bool:
        return self.failure is None


def _descendants(pid: int) -> list[int]:
    """Pids of every descendant of ``pid`` (read from /proc; psutil when available)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process already gone
        pass
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` and all its descendants by pid (TERM, grace period, then KILL)."""
    pids = _descendants(proc.pid) + [proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not alive:
            return
        pids = alive


def _strip(text: str) -> str:
    return ANSI_RE.sub("", text)


def find_failure(executed: Path) -> Failure | None:
    """The first error output of an executed notebook, or the cell papermill left 'running'.

    ``cell_index`` counts the executed notebook's cells without the runner's own two (the index a reader of
    the executed notebook's HTML sees); a failure inside a runner cell has no index.
    """
    try:
        nb = json.loads(executed.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    cells, index, i = [], {}, 0
    for n, cell in enumerate(nb.get("cells", [])):
        cells.append(cell)
        if EPILOGUE_TAG not in cell.get("metadata", {}).get("tags", []):
            index[n], i = i, i + 1
    for n, cell in enumerate(cells):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                src = cell.get("source", "")
                return Failure(
                    kind="error",
                    message=f"{out.get('ename', 'Error')}: {_strip(str(out.get('evalue', '')))}",
                    cell_index=index.get(n),
                    cell_source="".join(src) if isinstance(src, list) else src,
                    traceback=_strip("\n".join(out.get("traceback", []))),
                    execution_count=cell.get("execution_count"),
                )
    for n, cell in enumerate(cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            src = cell.get("source", "")
            return Failure(kind="timeout", message="cell was still running", cell_index=index.get(n),
                           cell_source="".join(src) if isinstance(src, list) else src)
    return None


EPILOGUE_TAG = "shardlab-report-epilogue"     # both runner cells carry it: the HTML export drops them
# What a fresh kernel starts with (tests/test_report_pool.py checks both in a fresh process). A shared kernel's
# run starts with the XLA RNG reset to that seed; one that finds torch's global state different is not accepted.
TORCH_FRESH_STATE = {"get_default_dtype": "torch.float32", "is_grad_enabled": "True",
                     "are_deterministic_algorithms_enabled": "False", "is_inference_mode_enabled": "False"}
XLA_FRESH_RNG_STATE = 101     # torch_xla 2.9: xm.get_rng_state() of a new process
PROLOGUE = """\
# Added by `python -m shardlab report` (not part of the notebook): start this run's XLA counters.
import sys as _sys, types as _types
_run = _sys.modules.setdefault("_shardlab_run", _types.ModuleType("_shardlab_run"))
del _types
if hasattr(_run, "dunders"):    # a shared kernel: drop the previous notebook's names and output cache, keep
    get_ipython().run_line_magic("reset", "-f")   # what a fresh kernel's namespace holds (__spec__ ...)
    import gc as _gc, sys as _sys
    _run = _sys.modules["_shardlab_run"]
    globals().update(_run.dunders)
    _gc.collect()
    _torch = _sys.modules.get("torch")             # process-wide torch state the previous run may have left
    _run.changed = [] if _torch is None else [f"torch.{_f}() = {getattr(_torch, _f)()} (a fresh kernel: {_v})"
                                              for _f, _v in __TORCH_FRESH_STATE__.items()
                                              if str(getattr(_torch, _f)()) != _v]
    _xmod = _sys.modules.get("torch_xla.core.xla_model")
    if _xmod is not None:                          # torch.manual_seed does not reset the XLA RNG: start it where
        _xmod.set_rng_state(__XLA_FRESH_RNG_STATE__)   # a fresh kernel's starts
    del _gc, _torch, _xmod
else:
    _run.dunders = {_k: _v for _k, _v in globals().items() if _k.startswith("__") and _k.endswith("__")}
    _run.changed = []
for _name in __SLOW_OPTIONAL_MODULES__:
    _sys.modules.setdefault(_name, None)   # see SLOW_OPTIONAL_MODULES in shardlab/report/execute.py
_run.count = getattr(_run, "count", 0) + 1
_xm = _sys.modules.get("torch_xla.debug.metrics")
_run.start = {} if _xm is None else {
    **{n: (lambda d: (int(d[0]), d[1]) if d else (0, 0.0))(_xm.metric_data(n)) for n in ("CompileTime", "ExecuteTime")},
    **{n: int(_xm.counter_value(n) or 0) for n in ("CachedCompile", "UncachedCompile")}}
_run.start["TpuCachedCompile"] = getattr(_sys.modules.get("shardlab.profile.tpu"), "CACHE_HITS", 0)
del _sys, _xm, _run, _name
"""
EPILOGUE = """\
# Added by `python -m shardlab report` (not part of the notebook): XLA compile/execute totals of this run.
import json as _json, sys as _sys
_xm = _sys.modules.get("torch_xla.debug.metrics")
_run = _sys.modules["_shardlab_run"]
_out = {"kernel_run": _run.count, "state_changed": _run.changed,
        "CachedCompile": 0, "UncachedCompile": 0}   # no torch_xla: nothing compiled
if _xm is not None:
    for _name in ("CompileTime", "ExecuteTime"):
        _d = _xm.metric_data(_name)
        _c, _t = (int(_d[0]), _d[1]) if _d else (0, 0.0)
        _c0, _t0 = _run.start.get(_name, (0, 0.0))
        _out[_name] = {"count": _c - _c0, "total_s": (_t - _t0) / 1e9}
    for _name in ("CachedCompile", "UncachedCompile"):
        _out[_name] = int(_xm.counter_value(_name) or 0) - _run.start.get(_name, 0)
_tpu = _sys.modules.get("shardlab.profile.tpu")   # the TPU compiler view keeps its own in-process compile cache
if _tpu is not None:
    _hits = getattr(_tpu, "CACHE_HITS", None)     # None: that cache's hits are not counted, so not provable
    _out["TpuCachedCompile"] = None if _hits is None else _hits - _run.start.get("TpuCachedCompile", 0)
if results_dir:
    with open(f"{results_dir}/{__SHARDLAB_STEM__}.xla.json", "w") as _fh:
        _json.dump(_out, _fh)
# multiprocessing's helper processes (gloo ranks start them) keep an ipykernel from exiting when asked: it
# hangs until killed, skipping its atexit handlers. Stop them; the next user starts them again.
for _mod, _obj in (("multiprocessing.forkserver", "_forkserver"), ("multiprocessing.resource_tracker",
                                                                    "_resource_tracker")):
    _stop = getattr(getattr(_sys.modules.get(_mod), _obj, None), "_stop", None)
    if _stop is not None:
        _stop()
"""


def _runner_cell(cell_id: str, source: str) -> dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": {"tags": [EPILOGUE_TAG]},
            "outputs": [], "source": source}


def prepare_input(src: Path, dest: Path) -> Path:
    """Copy notebook ``src`` to ``dest`` with the prologue cell first and the epilogue cell last (both tagged)."""
    nb = json.loads(src.read_text())
    cells = nb.setdefault("cells", [])
    prologue = (PROLOGUE.replace("__SLOW_OPTIONAL_MODULES__", repr(SLOW_OPTIONAL_MODULES))
                .replace("__TORCH_FRESH_STATE__", repr(TORCH_FRESH_STATE))
                .replace("__XLA_FRESH_RNG_STATE__", repr(XLA_FRESH_RNG_STATE)))
    cells.insert(0, _runner_cell("shardlab-prologue", prologue))
    cells.append(_runner_cell("shardlab-epilogue", EPILOGUE.replace("__SHARDLAB_STEM__", repr(src.stem))))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb, indent=1))
    return dest


def read_xla_totals(results_dir: Path, stem: str) -> dict[str, Any]:
    """What the epilogue wrote: ``{"kernel_run", "CompileTime": {"count", "total_s"}, "ExecuteTime": {...},
    "CachedCompile", "UncachedCompile"}`` or {} when the run did not get that far."""
    try:
        return dict(json.loads((results_dir / f"{stem}.xla.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return {}


def execution(stem: str, executed: Path, log: Path, params: dict[str, Any], wall_s: float, *, ok: bool,
              error: str = "", timed_out: bool = False, timeout_s: float | None = None,
              kernel_run: int = 1) -> Execution:
    """Describe a finished (or killed) run from what its worker reported and the executed notebook."""
    failure = find_failure(executed)
    if timed_out:
        where = failure if failure is not None and failure.kind == "timeout" else Failure("timeout", "")
        where.kind = "timeout"
        where.message = f"notebook timed out after {timeout_s:g} s" + (
            f" (cell {where.cell_index} was running)" if where.cell_index is not None else "")
        failure = where
    elif not ok and failure is None:
        tail = _strip(log.read_text(errors="replace"))[-4000:] if log.exists() else ""
        failure = Failure("crash", error.strip().splitlines()[-1] if error.strip() else "the kernel worker died",
                          traceback=(error + "\n" + tail).strip())
    elif ok and failure is not None and failure.kind == "timeout":
        failure = None      # papermill finished; a stale 'running' status is not a failure
    return Execution(stem, executed, log, dict(params), wall_s, None if timed_out else 0 if ok else 1, failure,
                     kernel_run)
