"""Run many notebook executions on a few kernels: a fresh kernel per notebook, a shared one per sweep.

Design note
-----------
A :class:`Task` is one papermill execution. A :class:`Pool` runs tasks on at most ``jobs`` worker processes
(capped by what ``MemAvailable`` holds), under one progress bar, with a wall-clock timeout per task; a
callback may submit more tasks while the pool runs (the report queues a notebook's sweep points when the
notebook has finished, so sweeps fill the cores while the last notebooks run).

Workers (``kernel_worker``) live as long as the pool, so python, papermill and jupyter_client start once
per worker; each holds at most one kernel. A task with ``reuse=False`` gets a fresh kernel, started for it and
shut down when it has finished — exactly as ``python -m papermill`` runs a notebook. A task with
``reuse=True`` (a sweep point) runs in the kernel a worker kept from points of the *same notebook, device
count, environment and directory* (:func:`reuse_key`), skipping the ~7 s of kernel start and torch /
torch_xla imports.

The guard. Points must not share torch_xla's compile cache: an executable compiled for one point would serve
another, whose compile counts and times would then be wrong. torch_xla cannot clear that cache, so the pool
*checks*: the epilogue cell writes each run's ``CachedCompile`` count (compiles served from the cache during
that run), and a run in a shared kernel is accepted only if it passed with ``CachedCompile == 0`` — nothing it
ran came from any compile cache, its own or another point's. (The other compiles in ``CompileTime`` — the
ReplicateShardedData module behind ``.cpu()`` of a sharded tensor — are never cached: measured, each call
compiles again and moves neither counter. No persistent compilation cache is configured.) The TPU compiler
view (``shardlab.profile.tpu``) keeps an in-process cache of its own; the epilogue reports its hits as
``TpuCachedCompile`` and the same rule applies (a run that used it while its hits are not counted cannot be
proven clean). Beyond compiles, each shared run starts from a fresh kernel's state where values depend on it:
an empty namespace and output cache, the XLA RNG at a new process's seed (``torch.manual_seed`` does not
reset it), torch's global switches (default dtype, grad / inference mode, deterministic algorithms) as a new
process has them — a run that finds them changed is not accepted. Whatever is not accepted (a cached compile,
changed state, a failure, a timeout, no counters) runs again in a fresh kernel and the fresh run's result
stands (``Execution.rerun`` says why). A point from a shared kernel therefore gives what a fresh kernel
gives, minus the kernel's start-up in ``wall_s``.

Scheduling: tasks start in submission order. An idle worker whose kernel has a waiting task's key takes it
first; otherwise a task goes to an idle worker without a kernel, then to one whose kernel no waiting task
wants, then to a new worker while fewer than ``jobs`` live, else to the worker idle for longest (a kernel it
drops before the task is reported as ``setup_s`` and left out of ``wall_s``). A key whose kernel is busy gets
a second kernel only when more than ``REUSE_BACKLOG`` of its tasks wait per kernel. ``limits`` caps how many
workers run tasks of one ``group`` at once (``--sweep-jobs``).

On interrupt every worker is killed by pid with its kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from shardlab.report.execute import KERNEL_ENV, KILL_GRACE_S, Execution, execution, kill_tree, read_xla_totals

KERNEL_RSS_BYTES = 1_500_000_000   # one 8-device CPU kernel: ~1 GB RSS measured + headroom
REUSE_BACKLOG = 3                  # queued tasks per kernel of a key before that key gets another kernel
POLL_S = 0.1


@dataclass
class Task:
    """One papermill execution."""

    key: str                  # unique label ("02_megatron_mlp" or "tp=4")
    stem: str
    src: Path                 # notebook to execute (prepared by execute.prepare_input)
    executed: Path
    log: Path
    params: dict[str, Any]
    cwd: Path
    env: dict[str, str] | None = None
    reuse: bool = False       # may run in a kernel shared with tasks of the same reuse_key
    group: str = ""           # for Pool(limits={group: n})

    @property
    def results_dir(self) -> Path | None:
        rd = self.params.get("results_dir")
        return Path(rd) if rd else None

    @property
    def reuse_key(self) -> str | None:
        """Tasks with equal keys may share a kernel; None: this task needs a fresh one."""
        return reuse_key(self) if self.reuse and self.results_dir is not None else None


def reuse_key(task: Task) -> str:
    """Same notebook, device count, kernel environment and directory."""
    return json.dumps([task.stem, task.params.get("num_devices"), context(task.cwd, task.env)])


def context(cwd: Path, env: Mapping[str, str] | None) -> str:
    """A worker runs tasks of one directory and kernel environment (fixed when the worker starts)."""
    return json.dumps([str(Path(cwd).resolve()), sorted((env or {}).items())])


def memory_jobs(jobs: int, per_job: int = KERNEL_RSS_BYTES) -> int:
    """``jobs`` capped by what MemAvailable can hold (at least 1): parallel only where memory allows."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return max(1, min(jobs, int(line.split()[1]) * 1024 // per_job))
    except OSError:
        pass
    return max(1, jobs)


def cache_guard(task: Task, ex: Execution) -> str:
    """Why a run in a shared kernel cannot be accepted ("" = accept). Fresh-kernel runs are always accepted."""
    if ex.kernel_run <= 1:
        return ""
    if not ex.ok:
        return f"failed in a shared kernel ({ex.failure.message if ex.failure else 'no reason'})"
    totals = read_xla_totals(task.results_dir, task.stem) if task.results_dir else {}
    if "CachedCompile" not in totals:
        return "no compile counters from its run in a shared kernel"
    if totals.get("state_changed"):
        return "the shared kernel was not in a fresh kernel's state: " + "; ".join(totals["state_changed"])
    if totals["CachedCompile"]:
        return (f"{totals['CachedCompile']} compile(s) in a shared kernel were served from torch_xla's cache "
                "(an earlier run compiled the same graph)")
    if "TpuCachedCompile" in totals and totals["TpuCachedCompile"] != 0:
        hits = totals["TpuCachedCompile"]
        return ("it used the TPU compiler view, whose in-process compile cache does not count its hits"
                if hits is None else f"{hits} TPU compile(s) in a shared kernel were served from the TPU view's cache")
    return ""


class Worker:
    """A ``kernel_worker`` process; it holds at most one kernel, of key ``kernel_key`` (None: no kernel now)."""

    def __init__(self, cwd: Path, env: Mapping[str, str] | None, log: Path) -> None:
        self.log = log
        self.context = context(cwd, env)
        self.kernel_key: str | None = None
        self.runs = 0                           # runs in the current kernel, the running one included
        self.task: Task | None = None
        self.sent = 0.0
        self.idle_since = time.monotonic()
        self.closing = 0.0
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "shardlab.report.kernel_worker"],
                                         stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT,
                                         env={**os.environ, **KERNEL_ENV, **(env or {})}, cwd=str(Path(cwd).resolve()))
        self.stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]

    @property
    def done_file(self) -> Path | None:
        return None if self.task is None else self.task.log.with_name(self.task.log.name + ".done.json")

    def send(self, task: Task) -> None:
        """Hand ``task`` to the worker (paths absolute: the kernel runs in the notebooks directory)."""
        key = task.reuse_key
        self.runs = self.runs + 1 if key is not None and key == self.kernel_key else 1
        self.kernel_key = key                      # what it will hold after this task (the reply confirms it)
        self.task, self.sent = task, time.monotonic()
        done = self.done_file
        assert done is not None
        done.unlink(missing_ok=True)
        task.executed.parent.mkdir(parents=True, exist_ok=True)
        task.log.parent.mkdir(parents=True, exist_ok=True)
        task.log.with_suffix(".params.json").write_text(json.dumps(task.params, indent=1))
        cmd = {"src": str(task.src.resolve()), "executed": str(task.executed.resolve()), "params": task.params,
               "cwd": str(Path(task.cwd).resolve()), "done": str(done.resolve()), "log": str(task.log.resolve()),
               "key": key}
        try:
            self.stdin.write((json.dumps(cmd) + "\n").encode())
            self.stdin.flush()
        except OSError:
            pass                                   # a dead worker: poll() reports it

    def poll(self, timeout_s: float | None) -> Execution | None:
        """The current task's Execution once it finished, crashed or timed out; None while it runs."""
        task, done = self.task, self.done_file
        if task is None or done is None:
            return None
        wall = time.monotonic() - self.sent
        if done.exists():
            reply = json.loads(done.read_text())
            done.unlink(missing_ok=True)
            self.kernel_key = reply.get("kernel")
            return self._finish(task, wall - float(reply.get("setup_s", 0.0)), ok=bool(reply["ok"]),
                                error=str(reply.get("error", "")))
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""
            return self._finish(task, wall, ok=False, error=f"the kernel worker exited with status "
                                f"{self.proc.returncode}\n{tail}")
        if timeout_s is not None and wall > timeout_s:
            self.kill()
            return self._finish(task, wall, ok=False, timed_out=True, timeout_s=timeout_s)
        return None

    def _finish(self, task: Task, wall: float, *, ok: bool, error: str = "", timed_out: bool = False,
                timeout_s: float | None = None) -> Execution:
        ex = execution(task.stem, task.executed, task.log, task.params, wall, ok=ok, error=error,
                       timed_out=timed_out, timeout_s=timeout_s, kernel_run=self.runs)
        self.task, self.idle_since = None, time.monotonic()
        if not self.alive:
            self.kernel_key = None
        return ex

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Ask the worker to end (EOF on stdin: it shuts its kernel down and exits); see :meth:`reap`."""
        self.closing = time.monotonic()
        try:
            self.stdin.close()
        except OSError:
            pass

    def reap(self, grace_s: float = KILL_GRACE_S) -> bool:
        """True once the worker is gone; kills it (and its kernel) by pid after ``grace_s`` of closing."""
        if self.proc.poll() is not None:
            return True
        if time.monotonic() - self.closing > grace_s:
            kill_tree(self.proc)
            return True
        return False

    def kill(self) -> None:
        kill_tree(self.proc)
        self.close()


@dataclass
class _Queued:
    task: Task
    on_done: Callable[[Task, Execution], None] | None
    rerun: str = ""


@dataclass
class Pool:
    jobs: int = 1
    timeout_s: float | None = None
    desc: str = "notebooks"
    limits: Mapping[str, int] = field(default_factory=dict)
    kernel_logs: Path | None = None            # where workers write their own (and their kernels') output

    def __post_init__(self) -> None:
        self._pending: list[_Queued] = []
        self._workers: list[Worker] = []
        self._closing: list[Worker] = []             # asked to end, not yet gone
        self._running: dict[int, _Queued] = {}      # id(worker) -> what it runs
        self._bar: Any = None
        self.results: dict[str, Execution] = {}
        self.workers_started = 0

    def submit(self, task: Task, on_done: Callable[[Task, Execution], None] | None = None) -> None:
        self._pending.append(_Queued(task, on_done))
        if self._bar is not None:
            self._bar.total += 1
            self._bar.refresh()

    # -- scheduling --------------------------------------------------------------------------------------------
    def _group_busy(self, group: str) -> int:
        return sum(1 for q in self._running.values() if q.task.group == group)

    def _group_full(self, task: Task) -> bool:
        limit = self.limits.get(task.group) if task.group else None
        return limit is not None and self._group_busy(task.group) >= limit

    def _worker_for(self, q: _Queued, allowed: int) -> Worker | None:
        """An idle worker for ``q`` (one without a kernel first, then one whose kernel nobody waits for), a new one
        while fewer than ``allowed`` are alive, else the idle worker unused for longest; None if all are busy."""
        ctx = context(q.task.cwd, q.task.env)
        idle = [w for w in self._workers if w.task is None and w.alive]
        mine = [w for w in idle if w.context == ctx]
        wanted = {p.task.reuse_key for p in self._pending if p.task.reuse_key is not None}
        for choice in ([w for w in mine if w.kernel_key is None], [w for w in mine if w.kernel_key not in wanted]):
            if choice:
                return min(choice, key=lambda w: w.idle_since)
        if len(self._workers) >= allowed:
            others = [w for w in idle if w.context != ctx] or mine
            if not others:
                return None
            victim = min(others, key=lambda w: w.idle_since)
            if victim.context == ctx:
                return victim                       # its kernel is dropped before this task (setup_s)
            self._retire(victim)
        log = (self.kernel_logs or q.task.log.parent) / f"worker-{self.workers_started + 1}.log"
        w = Worker(q.task.cwd, q.task.env, log)
        self.workers_started += 1
        self._workers.append(w)
        return w

    def _retire(self, w: Worker) -> None:
        self._workers.remove(w)
        w.close()
        self._closing.append(w)

    def _send(self, w: Worker, q: _Queued) -> None:
        self._pending.remove(q)
        self._running[id(w)] = q
        w.send(q.task)
        self._bar.set_postfix_str(", ".join(r.task.key for r in self._running.values()), refresh=True)

    def _dispatch(self, allowed: int) -> None:
        for w in [w for w in self._workers if w.task is None and w.kernel_key is not None and w.alive]:
            q = next((q for q in self._pending if q.task.reuse_key == w.kernel_key
                      and not self._group_full(q.task)), None)
            if q is not None:
                self._send(w, q)
        for q in list(self._pending):
            if self._group_full(q.task):
                continue
            key = q.task.reuse_key
            if key is not None:
                holders = [w for w in self._workers if w.kernel_key == key and w.alive]
                waiting = sum(1 for p in self._pending if p.task.reuse_key == key)
                if holders and waiting <= REUSE_BACKLOG * len(holders):
                    continue                        # its shared kernel takes it when free
            w = self._worker_for(q, allowed)
            if w is None:
                break
            self._send(w, q)

    def _collect(self) -> None:
        for w in list(self._workers):
            q = self._running.get(id(w))
            if q is None:
                if not w.alive:
                    self._retire(w)
                continue
            ex = w.poll(self.timeout_s)
            if ex is None:
                continue
            del self._running[id(w)]
            if not w.alive:
                self._retire(w)
            why = cache_guard(q.task, ex)
            if why:
                self._bar.write(f"  {q.task.key}: {why}: re-run in a fresh kernel")
                rd = q.task.results_dir
                for stale in ([rd / f"{q.task.stem}.json", rd / f"{q.task.stem}.xla.json"] if rd else []):
                    stale.unlink(missing_ok=True)
                self._pending.insert(0, _Queued(replace(q.task, reuse=False), q.on_done, why))
                continue
            ex.rerun = q.rerun
            self.results[q.task.key] = ex
            kernel = f" (shared kernel, run {ex.kernel_run})" if ex.kernel_run > 1 else ""
            mark = "ok" if ex.ok else f"FAILED ({ex.failure.message if ex.failure else ''})"
            self._bar.write(f"  {q.task.key}: {mark} in {ex.wall_s:.1f} s{kernel}")
            self._bar.update(1)
            if q.on_done is not None:
                q.on_done(q.task, ex)

    def run(self) -> dict[str, Execution]:
        """Run until nothing is pending or running (callbacks may submit more); results by task key."""
        from tqdm.auto import tqdm

        allowed = memory_jobs(self.jobs)
        if allowed < self.jobs:
            print(f"{self.desc}: --jobs {self.jobs} reduced to {allowed} (MemAvailable holds {allowed} kernels of "
                  f"~{KERNEL_RSS_BYTES / 1e9:.1f} GB)", file=sys.stderr)
        self._bar = tqdm(total=len(self._pending), desc=self.desc, unit="nb", file=sys.stderr, dynamic_ncols=True)
        try:
            while self._pending or self._running:
                self._collect()
                self._dispatch(allowed)
                self._closing = [w for w in self._closing if not w.reap()]
                if self._running:
                    time.sleep(POLL_S)
                elif self._pending:
                    raise RuntimeError("pool: tasks are pending but none can start (check `limits`)")
        finally:
            for w in list(self._workers):
                if w.task is not None:
                    w.kill()
                self._retire(w)
            while self._closing:
                self._closing = [w for w in self._closing if not w.reap()]
                time.sleep(POLL_S)
            self._bar.close()
            self._bar = None
        return self.results

