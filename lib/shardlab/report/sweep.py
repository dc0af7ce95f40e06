"""``python -m shardlab sweep``: one notebook over a parameter grid, resumable, as one table and charts.

Design note
-----------
A sweep directory belongs to one notebook::

    DIR/sweep.json                  {"schema", "notebook"} (a directory of another notebook is refused)
    DIR/points/<slug>/              one grid point: executed notebook, log, records/, point.json
    DIR/table.csv                   long table: one row per (point, measurement row of its record)
    DIR/charts.html                 plotly: any measurement vs any swept parameter (dropdown), offline

A point is *complete* when its ``point.json`` says ``passed`` and its fingerprint (SHA-256 of the notebook,
the parameters, the torch / torch_xla versions and shardlab's sources outside ``report/``) still matches; only
incomplete points run, like report notebooks (:func:`shardlab.report.execute.run`), ``jobs`` at a time. The
runner owns ``num_devices`` (``--num-devices``, one count or several) and ``results_dir`` (``--out``).
``name_params`` splits a parameter out of measurement names (``{"L": r"\\.L(\\d+)$"}``: ``scan.compile_s.loop.L8``
gets an ``L`` column and loses the suffix), so "compile time vs L" is a chart like any other.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pandas as pd

from shardlab.report.charts import charts, write_charts
from shardlab.report.execute import run
from shardlab.report.notebooks import (
    REQUIRED_PARAMETERS,
    NotebookInfo,
    ReportInputError,
    check_params,
    check_runner_owned,
)

SWEEP_SCHEMA = "shardlab.sweep/1"
PKG = Path(__file__).resolve().parents[1]


@dataclass
class Point:
    values: dict[str, Any]          # the swept values of this point
    params: dict[str, Any]          # everything passed to papermill (minus results_dir)
    dir: Path
    status: str = "pending"         # cached | passed | failed | timeout
    wall_s: float | None = None
    message: str = ""
    record: dict[str, Any] | None = None


@dataclass
class SweepResult:
    notebook: str
    out: Path
    axes: dict[str, list[Any]]
    points: list[Point]
    frame: pd.DataFrame             # the long table
    table: Path
    charts: Path | None
    wall_s: float

    @property
    def ran(self) -> int:
        return sum(p.status in ("passed", "failed", "timeout") for p in self.points)


def code_fingerprint() -> str:
    """Hash of shardlab's sources (not the report's own code): a library change makes cached points stale."""
    h = hashlib.sha256()
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] not in ("report", "__main__.py"):
            h.update(str(path.relative_to(PKG)).encode())
            h.update(path.read_bytes())
    for dist in ("torch", "torch_xla", "jax"):
        try:
            h.update(importlib.metadata.version(dist).encode())
        except importlib.metadata.PackageNotFoundError:
            pass
    return h.hexdigest()


def slug(values: Mapping[str, Any]) -> str:
    text = ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in values.items()) or "defaults"
    text = re.sub(r"[^A-Za-z0-9=,._-]+", "_", text)
    if len(text) > 80:
        text = text[:60] + "-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    return text


def grid(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Cartesian product in the order given: ``{"tp": [1, 2], "b": [8]}`` -> 2 points."""
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]


def validate(nb: NotebookInfo, axes: Mapping[str, Sequence[Any]], base: Mapping[str, Any],
             num_devices: Sequence[int] = (8,)) -> None:
    """Everything that can be wrong with a sweep before a kernel starts; raises ReportInputError."""
    check_runner_owned({**base, **axes}, "sweep")
    check_params(nb, {**base, **axes})
    lacking = [p for p in REQUIRED_PARAMETERS if p not in nb.parameters]
    if lacking:
        raise ReportInputError(f"{nb.stem} does not declare {', '.join(lacking)} in its parameters cell")
    for name, values in axes.items():
        if len(values) == 0:
            raise ReportInputError(f"-p {name} needs at least one value")
    bad = [n for n in num_devices if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ReportInputError(f"--num-devices {bad[0]!r} must be an int >= 1")
    if not num_devices or len(set(num_devices)) != len(num_devices):
        raise ReportInputError(f"--num-devices {list(num_devices)} needs one or more distinct counts")


def claim_dir(out: Path, stem: str, force: bool) -> None:
    """Make ``out`` this notebook's sweep directory (resuming is the normal case); another notebook's sweep is
    replaced only with ``force``, a directory that is not a sweep never."""
    marker = out / "sweep.json"
    if out.exists() and any(out.iterdir()):
        owner = json.loads(marker.read_text()).get("notebook") if marker.exists() else None
        if owner == stem:
            return
        if owner is None:
            raise ReportInputError(f"--out {out} is not empty and is not a sweep directory: choose another directory "
                                   "(it is not deleted, not even with --force)")
        if not force:
            raise ReportInputError(f"--out {out} holds a sweep of {owner}, not {stem}; pass --force to replace it "
                                   "or choose another directory")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"schema": SWEEP_SCHEMA, "notebook": stem}))


def _fingerprint(nb_sha: str, code: str, params: Mapping[str, Any]) -> str:
    blob = json.dumps({"nb": nb_sha, "code": code, "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_sweep(nb: NotebookInfo, axes: Mapping[str, Sequence[Any]], out: Path, *,
              base: Mapping[str, Any] | None = None, num_devices: int | Sequence[int] = 8, device: str = "cpu",
              jobs: int = 1, timeout_s: float = 600.0, force: bool = False,
              name_params: Mapping[str, str] | None = None, render: bool = True) -> SweepResult:
    """Run (or resume) the sweep; returns the table and charts. Raises ReportInputError on bad input.

    ``num_devices`` is the runner's (``--num-devices``): one count, or several to sweep it (an axis of its own).
    """
    counts = [num_devices] if isinstance(num_devices, int) else list(num_devices)
    validate(nb, axes, base or {}, counts)
    axes, fixed = dict(axes), dict(base or {})
    if len(counts) > 1:
        axes = {"num_devices": counts, **axes}
    else:
        fixed = {"num_devices": counts[0], **fixed}
    out = out.resolve()                                  # kernels run in notebooks/: every path absolute
    claim_dir(out, nb.stem, force)
    started = time.monotonic()
    nb_sha, code = nb.sha256, code_fingerprint()
    points, todo = [], []
    for values in grid(axes):
        params = {**fixed, **values}
        point = Point(values, params, out / "points" / slug(values))
        fp = _fingerprint(nb_sha, code, params)
        meta, rec_path = point.dir / "point.json", point.dir / "records" / f"{nb.stem}.json"
        if meta.exists() and rec_path.exists():
            old = json.loads(meta.read_text())
            if old.get("fingerprint") == fp and old.get("status") == "passed":
                point.status, point.wall_s = "cached", old.get("wall_s")
                point.record = json.loads(rec_path.read_text())
        if point.status != "cached":
            if point.dir.exists():
                shutil.rmtree(point.dir)
            point.dir.mkdir(parents=True)
            meta.write_text(json.dumps({"fingerprint": fp, "status": "running", "params": params}))
            todo.append(point)
        points.append(point)

    def one(p: Point) -> None:
        records = p.dir / "records"
        ex = run(nb.stem, nb.path, p.dir / f"{nb.stem}.ipynb", {**p.params, "results_dir": str(records)},
                 nb.path.parent, p.dir / "papermill.log", timeout_s, {"PJRT_DEVICE": device.upper()})
        rec_path = records / f"{nb.stem}.json"
        p.record = json.loads(rec_path.read_text()) if rec_path.exists() else None
        good = p.record is not None and p.record.get("status") == "passed" and \
            all(c.get("ok") for c in p.record.get("checks", []))
        if ex.ok and good:
            p.status = "passed"
        else:
            p.status = "timeout" if ex.failure and ex.failure.kind == "timeout" else "failed"
            p.message = ex.failure.message if ex.failure else "no passing record"
        p.wall_s = ex.wall_s
        meta = json.loads((p.dir / "point.json").read_text())
        meta.update(status=p.status, wall_s=ex.wall_s, message=p.message, xla=(p.record or {}).get("xla"))
        (p.dir / "point.json").write_text(json.dumps(meta))

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))
    frame = table(points, list(axes), name_params)
    csv = out / "table.csv"
    frame.to_csv(csv, index=False)
    result = SweepResult(nb.stem, out, {k: list(v) for k, v in axes.items()}, points, frame, csv, None,
                         time.monotonic() - started)
    if render:
        xs = [a for a in axes if len(axes[a]) > 1] + list(name_params or {})
        figures = [fig for x in xs for fig in charts(frame, x)]
        result.charts = write_charts(figures, out / "charts.html", f"sweep of {nb.stem}")
    return result


def table(points: Sequence[Point], axis_names: Sequence[str], name_params: Mapping[str, str] | None = None
          ) -> pd.DataFrame:
    """One row per (point, measurement row): axis values, status, name, source, kind, unit, value."""
    rows = []
    patterns = {k: re.compile(v) for k, v in (name_params or {}).items()}
    for p in points:
        base = {a: p.values.get(a) for a in axis_names}
        base.update(point=p.dir.name, point_status=p.status, point_wall_s=p.wall_s)
        for m in (p.record or {}).get("measurements", []):
            name, extra = m["name"], {}
            for col, rx in patterns.items():
                hit = rx.search(name)
                if hit:
                    extra[col] = int(hit.group(1)) if hit.group(1).isdigit() else hit.group(1)
                    name = name[: hit.start()] + name[hit.end():]
            value = m["value"]
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            spread = m.get("spread") or {}
            rows.append({**base, **extra, "name": name, "source": m["source"], "kind": m.get("kind", "structural"),
                         "unit": m["unit"], "value": float(value) if numeric else float("nan"),
                         "value_text": str(value), "spread_min": spread.get("min"), "spread_max": spread.get("max")})
    cols = [*axis_names, *(name_params or {}), "point", "point_status", "point_wall_s", "name", "source", "kind",
            "unit", "value", "value_text", "spread_min", "spread_max"]
    return pd.DataFrame(rows, columns=cols)


def match_names(frame: pd.DataFrame, patterns: Sequence[str]) -> list[str]:
    """Measurement names matching any pattern, in pattern order (the first pattern's names come first)."""
    names = list(dict.fromkeys(frame["name"]))
    return list(dict.fromkeys(n for p in patterns for n in names if fnmatch(n, p)))
