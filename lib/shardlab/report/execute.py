"""Execute one notebook with papermill in a child process, with a wall-clock timeout.

Design note
-----------
Each notebook runs as ``python -m papermill IN OUT -f params.yaml`` in its own process, which starts its
own kernel. A child process gives us three things the in-process API does not: a timeout for the *whole*
notebook (papermill's ``--execution-timeout`` is per cell), parallel points for sweeps, and isolation from
a kernel that segfaults. On timeout the papermill process and every descendant (the kernel included; the
kernel runs in its own session, so a process-group kill would miss it) are killed by pid.

papermill saves the output notebook after every cell, so after a failure or a timeout the executed
notebook still holds everything that ran. :func:`find_failure` reads it back: the cell that raised (its
source and traceback) or the cell that was still running when the clock ran out.

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
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
KILL_GRACE_S = 5.0          # after SIGTERM, how long the tree gets before SIGKILL
# `import nbformat` pulls jsonschema's optional rfc3987_syntax, which builds a lark grammar at import time
# (measured 3.7 s of papermill's 4.8 s import here). nbformat never validates IRI formats, so the papermill
# child hides that module (jsonschema skips the format when the import fails).
PAPERMILL_LAUNCHER = ("import sys; sys.modules.setdefault('rfc3987_syntax', None); "
                      "from papermill.cli import papermill; papermill(prog_name='papermill')")
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
    log: Path                 # papermill's stdout+stderr
    params: dict[str, Any]
    wall_s: float
    returncode: int | None    # None when killed on timeout
    failure: Failure | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["executed"], d["log"] = str(self.executed), str(self.log)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Execution:
        fail = Failure(**d["failure"]) if d.get("failure") else None
        return cls(d["stem"], Path(d["executed"]), Path(d["log"]), dict(d["params"]), float(d["wall_s"]),
                   d.get("returncode"), fail, dict(d.get("extra", {})))


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
    """The first error output of an executed notebook, or the cell papermill left 'running'."""
    try:
        nb = json.loads(executed.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    cells = nb.get("cells", [])
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                src = cell.get("source", "")
                count = cell.get("execution_count")
                return Failure(
                    kind="error",
                    message=f"{out.get('ename', 'Error')}: {_strip(str(out.get('evalue', '')))}",
                    cell_index=i,
                    cell_source="".join(src) if isinstance(src, list) else src,
                    traceback=_strip("\n".join(out.get("traceback", []))),
                    execution_count=count,
                )
    for i, cell in enumerate(cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            src = cell.get("source", "")
            return Failure(kind="timeout", message="cell was still running", cell_index=i,
                           cell_source="".join(src) if isinstance(src, list) else src)
    return None


EPILOGUE_TAG = "shardlab-report-epilogue"
EPILOGUE = """\
# Added by `python -m shardlab report` (not part of the notebook): XLA compile/execute totals of this kernel.
import json as _json, sys as _sys
_xm = _sys.modules.get("torch_xla.debug.metrics")
_out = {}
if _xm is not None:
    for _name in ("CompileTime", "ExecuteTime"):
        _d = _xm.metric_data(_name)
        _out[_name] = {"count": int(_d[0]), "total_s": _d[1] / 1e9} if _d else {"count": 0, "total_s": 0.0}
if results_dir:
    with open(f"{results_dir}/{__SHARDLAB_STEM__}.xla.json", "w") as _fh:
        _json.dump(_out, _fh)
"""


def prepare_input(src: Path, dest: Path) -> Path:
    """Copy notebook ``src`` to ``dest`` with the metrics epilogue cell appended (tagged, so it can be hidden)."""
    nb = json.loads(src.read_text())
    code = EPILOGUE.replace("__SHARDLAB_STEM__", repr(src.stem))
    nb.setdefault("cells", []).append({"cell_type": "code", "execution_count": None, "id": "shardlab-epilogue",
                                       "metadata": {"tags": [EPILOGUE_TAG]}, "outputs": [], "source": code})
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb, indent=1))
    return dest


def read_xla_totals(results_dir: Path, stem: str) -> dict[str, Any]:
    """What the epilogue wrote: ``{"CompileTime": {"count", "total_s"}, "ExecuteTime": {...}}`` or {}."""
    try:
        return dict(json.loads((results_dir / f"{stem}.xla.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return {}


# papermill waits 60 s for a kernel by default; two 8-device kernels starting at once on 2 busy cores took
# longer ("Kernel didn't respond in 60 seconds" in a sweep point), so give them more room.
KERNEL_START_TIMEOUT_S = 300


def launch(src: Path, executed: Path, log: Path, params: Mapping[str, Any], cwd: Path,
           env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start papermill on ``src`` (returns at once). ``params`` go through a YAML (JSON) file.

    Paths are made absolute: papermill runs in ``cwd`` (the notebooks directory).
    """
    src, executed, log, cwd = src.resolve(), executed.resolve(), log.resolve(), cwd.resolve()
    executed.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    params_file = log.with_suffix(".params.json")
    params_file.write_text(json.dumps(dict(params), indent=1))
    cmd = [sys.executable, "-c", PAPERMILL_LAUNCHER, str(src), str(executed), "-f", str(params_file),
           "--cwd", str(cwd), "--no-progress-bar", "--log-output", "--start-timeout", str(KERNEL_START_TIMEOUT_S)]
    full_env = {**os.environ, **KERNEL_ENV, **(env or {})}
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=str(cwd))


def finish(proc: subprocess.Popen[bytes], stem: str, executed: Path, log: Path, params: Mapping[str, Any],
           started: float, timeout_s: float | None) -> Execution:
    """Wait for ``proc`` (killing it after ``timeout_s`` from ``started``) and describe the outcome."""
    remaining = None if timeout_s is None else max(0.0, started + timeout_s - time.monotonic())
    timed_out = False
    try:
        proc.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
    wall = time.monotonic() - started
    failure = find_failure(executed)
    if timed_out:
        where = failure if failure is not None and failure.kind == "timeout" else Failure("timeout", "")
        where.kind = "timeout"
        where.message = f"notebook timed out after {timeout_s:g} s" + (
            f" (cell {where.cell_index} was running)" if where.cell_index is not None else "")
        failure = where
    elif proc.returncode != 0 and failure is None:
        tail = _strip(log.read_text(errors="replace"))[-4000:] if log.exists() else ""
        failure = Failure("crash", f"papermill exited with status {proc.returncode}", traceback=tail)
    elif proc.returncode == 0 and failure is not None and failure.kind == "timeout":
        failure = None      # papermill finished; a stale 'running' status is not a failure
    return Execution(stem, executed, log, dict(params), wall, None if timed_out else proc.returncode, failure)


@dataclass
class Task:
    """One papermill execution for :func:`run_many`."""

    key: str                  # unique label ("02_megatron_mlp" or "tp=4")
    stem: str
    src: Path                 # notebook to execute (maybe a prepared copy)
    executed: Path
    log: Path
    params: dict[str, Any]
    cwd: Path
    env: dict[str, str] | None = None


KERNEL_RSS_BYTES = 1_500_000_000   # one 8-device CPU kernel: ~1 GB RSS measured (xla-notes) + headroom


def memory_jobs(jobs: int, per_job: int = KERNEL_RSS_BYTES) -> int:
    """``jobs`` capped by what MemAvailable can hold (at least 1): parallel only where memory allows."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return max(1, min(jobs, int(line.split()[1]) * 1024 // per_job))
    except OSError:
        pass
    return max(1, jobs)


def run_many(tasks: list[Task], *, jobs: int = 1, timeout_s: float | None = None, desc: str = "notebooks",
             on_done: Callable[[Task, Execution], None] | None = None) -> list[Execution]:
    """Run ``tasks`` with at most ``jobs`` at a time under one tqdm bar; results in task order.

    Every child is killed (by pid, with its kernel) if we are interrupted.
    """
    from tqdm.auto import tqdm

    allowed = memory_jobs(jobs)
    if allowed < jobs:
        print(f"{desc}: --jobs {jobs} reduced to {allowed} (MemAvailable holds {allowed} kernels of "
              f"~{KERNEL_RSS_BYTES / 1e9:.1f} GB)", file=sys.stderr)
    pending = list(tasks)
    running: list[tuple[Task, subprocess.Popen[bytes], float]] = []
    results: dict[str, Execution] = {}
    bar = tqdm(total=len(tasks), desc=desc, unit="nb", file=sys.stderr, dynamic_ncols=True)
    try:
        while pending or running:
            while pending and len(running) < allowed:
                t = pending.pop(0)
                running.append((t, launch(t.src, t.executed, t.log, t.params, t.cwd, t.env), time.monotonic()))
                bar.set_postfix_str(", ".join(r[0].key for r in running), refresh=True)
            time.sleep(0.1)
            for item in list(running):
                t, proc, started = item
                expired = timeout_s is not None and time.monotonic() - started > timeout_s
                if proc.poll() is None and not expired:
                    continue
                running.remove(item)
                ex = finish(proc, t.stem, t.executed, t.log, t.params, started, timeout_s)
                results[t.key] = ex
                mark = "ok" if ex.ok else f"FAILED ({ex.failure.message if ex.failure else ''})"
                bar.write(f"  {t.key}: {mark} in {ex.wall_s:.1f} s")
                bar.update(1)
                if on_done is not None:
                    on_done(t, ex)
    finally:
        for _, proc, _ in running:
            kill_tree(proc)
        bar.close()
    return [results[t.key] for t in tasks]


def run_notebook(src: Path, executed: Path, log: Path, params: Mapping[str, Any], *, cwd: Path,
                 timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> Execution:
    """Execute ``src`` into ``executed`` with ``params``; never raises for notebook failures."""
    started = time.monotonic()
    proc = launch(src, executed, log, params, cwd, env)
    return finish(proc, src.stem, executed, log, params, started, timeout_s)
