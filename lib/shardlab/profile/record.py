"""Records: the JSON a notebook leaves behind: params, environment, measurements (one row per source) and checks.

Design
------
A :class:`Recorder` collects *measurements* (one row per source, :data:`SOURCES`: formula, ledger, hlo, tpu,
metrics, timer; a row may carry ``differs``, why its value legitimately differs on this backend), *checks*,
*notes* and *skipped* views (name, source, reason). It rewrites ``<results_dir>/<notebook>.json`` after every
call, so a notebook that dies half-way still leaves a record with ``status: "running"`` (the report runner then
marks it failed and shows the cell).
:func:`values_equal` is the suite's one comparison rule — exact for ints and strings (structural numbers are
deterministic), a tight relative tolerance for floats; :mod:`shardlab.core.harness` compares views with it and
records one check per compared name; a failed check raises :class:`CheckFailed` after the record is written.

Example::

    >>> rec = Recorder("01_block_matrices", params={"m": 8})
    >>> rec.measure("blocks.row.all_reduce.count", 1, "count", "formula")
    1
    >>> rec.check("blocks.row.all_reduce.count: formula = hlo", values_equal(1, 1.0))
    True
    >>> rec.close()["status"]
    'passed'
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

from shardlab.profile.timer import Timing
from shardlab.runtime import World


class RecordedParams(Protocol):
    """What a recorder reads from a notebook's parameters (``shardlab.core.params.NotebookParams``; profile sits
    below the core, so the type is stated here)."""

    NOTEBOOK: ClassVar[str]
    results_dir: str | None

    def as_record(self) -> dict[str, Any]: ...


SCHEMA = "shardlab.record/1"
SOURCES = ("formula", "ledger", "hlo", "tpu", "metrics", "timer")
KINDS = ("structural", "timing")
FLOAT_RTOL = 1e-9


class CheckFailed(AssertionError):
    """A notebook check failed; the record has already been written."""


def _plain(value: Any) -> Any:
    """Convert numpy / torch scalars to JSON-friendly Python values."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, tuple):
        return list(value)
    return value


def values_equal(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return False
        return math.isclose(a, b, rel_tol=FLOAT_RTOL, abs_tol=1e-12)
    return a == b


class Recorder:
    """Collects measurements and checks for one notebook run and writes them as a JSON record."""

    def __init__(self, notebook: str, params: dict[str, Any] | None = None,
                 results_dir: str | os.PathLike[str] | None = None, world: World | None = None) -> None:
        self.notebook = notebook
        self.path = Path(results_dir) / f"{notebook}.json" if results_dir else None
        env: dict[str, Any] = {}
        if world is not None:
            env = {"device_kind": world.kind, "device_count": world.num_devices, **world.versions}
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "notebook": notebook,
            "params": {k: _plain(v) for k, v in (params or {}).items()},
            "env": env,
            "status": "running",
            "started": time.time(),
            "measurements": [],
            "checks": [],
            "notes": [],
            "skipped": [],
        }
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()

    @classmethod
    def for_params(cls, params: RecordedParams, world: World | None = None) -> Recorder:
        """The recorder of the notebook ``params`` belongs to (a :class:`shardlab.core.params.NotebookParams`):
        its name, its parameters as recorded, and its ``results_dir``."""
        return cls(params.NOTEBOOK, params=params.as_record(), results_dir=params.results_dir, world=world)

    # -- writing -------------------------------------------------------------------------------------------
    def _write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)

    def measure(self, name: str, value: Any, unit: str, source: str, kind: str = "structural",
                spread: dict[str, float] | None = None, differs: str | None = None) -> Any:
        """Record one measurement row; returns ``value``. ``differs``: why this source's value legitimately
        differs from the others' on this backend (recorded and shown, left out of every agreement check)."""
        if source not in SOURCES:
            raise ValueError(f"source={source!r} must be one of {SOURCES}")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}")
        row: dict[str, Any] = {"name": name, "value": _plain(value), "unit": unit, "source": source, "kind": kind}
        if spread is not None:
            row["spread"] = {k: _plain(v) for k, v in spread.items()}
        if differs:
            row["differs"] = str(differs)
        self.data["measurements"].append(row)
        self._write()
        return value

    def timing(self, name: str, timing: Timing, source: str = "timer", unit: str = "s") -> float:
        """Record a :class:`~shardlab.profile.timer.Timing` (median with its spread)."""
        self.measure(name, timing.median_s, unit, source, kind="timing", spread=timing.spread())
        return timing.median_s

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check; raise :class:`CheckFailed` (after writing) if it failed."""
        ok = bool(ok)
        self.data["checks"].append({"name": name, "ok": ok, "detail": str(detail)})
        if not ok:
            self.data["status"] = "failed"
        self._write()
        if not ok:
            raise CheckFailed(f"{self.notebook}: check {name!r} failed: {detail}")
        return ok

    def note(self, name: str, detail: str) -> None:
        """Record a visible note that is not a check: a view skipped here, a value that differs on this backend
        for a stated reason. Notes never fail a run; the report lists them."""
        self.data["notes"].append({"name": name, "detail": str(detail)})
        self._write()

    def skip(self, name: str, source: str, reason: str) -> None:
        """Record that the ``source`` view of ``name`` did not run here, and why (never a failure)."""
        self.data["skipped"].append({"name": name, "source": source, "reason": str(reason)})
        self._write()

    def close(self) -> dict[str, Any]:
        """Mark the run finished (passed unless a check failed), add what torch_xla compiled in this process
        (``xla``: :func:`xla_totals`), write the record, and stop multiprocessing's helper processes."""
        if self.data["status"] == "running":
            self.data["status"] = "passed"
        self.data["finished"] = time.time()
        self.data["wall_s"] = self.data["finished"] - self.data["started"]
        self.data["xla"] = xla_totals()
        self._write()
        stop_process_helpers()
        return self.data

    # -- reading -------------------------------------------------------------------------------------------
    def values(self, name: str) -> dict[str, Any]:
        """``{source: value}`` for one measurement name."""
        return {m["source"]: m["value"] for m in self.data["measurements"] if m["name"] == name}


def xla_totals() -> dict[str, Any]:
    """torch_xla's compile / execute totals of this process (``{}`` when torch_xla was never imported):
    ``{"CompileTime": {"count", "total_s"}, "ExecuteTime": {...}, "CachedCompile", "UncachedCompile"}``, plus
    ``TpuCompileTime`` (the XLA:TPU compiles of :mod:`shardlab.profile.tpu`, cache hits excluded; ``stored``: the
    compiles the committed store served instead, :mod:`shardlab.profile.tpu_store`) and
    ``ProcessCpu`` (CPU seconds of this process and of its reaped children) — where a notebook's time went."""
    metrics = sys.modules.get("torch_xla.debug.metrics")
    if metrics is None:
        return {}
    out: dict[str, Any] = {}
    tpu = sys.modules.get("shardlab.profile.tpu")
    if tpu is not None:
        out["TpuCompileTime"] = {"count": tpu.COMPILES, "total_s": tpu.COMPILE_S, "stored": tpu.STORE_HITS}
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["ProcessCpu"] = {"self_s": own.ru_utime + own.ru_stime, "children_s": children.ru_utime + children.ru_stime}
    for name in ("CompileTime", "ExecuteTime"):
        data = metrics.metric_data(name)
        out[name] = {"count": int(data[0]), "total_s": data[1] / 1e9} if data else {"count": 0, "total_s": 0.0}
    for name in ("CachedCompile", "UncachedCompile"):
        out[name] = int(metrics.counter_value(name) or 0)
    return out


def stop_process_helpers() -> None:
    """Stop multiprocessing's forkserver and resource tracker if this process started them (gloo ranks do):
    while they run, an ipykernel asked to shut down hangs until it is killed. The next user starts them again."""
    for module, name in (("multiprocessing.forkserver", "_forkserver"),
                         ("multiprocessing.resource_tracker", "_resource_tracker")):
        stop = getattr(getattr(sys.modules.get(module), name, None), "_stop", None)
        if stop is not None:
            stop()


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a record, checking its schema."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r} is not {SCHEMA!r}")
    return data
