"""Baselines: what every notebook measured last time, per device profile, and the diff against a new run.

Design note
-----------
``data/baselines/<profile>.json`` (profile = device kind + count, e.g. ``cpu-8``) holds, per notebook, the
parameters it ran with, every *structural* measurement and every *timing* measurement. A measurement is
keyed ``"<name> [<source>]"`` (one row per source, as in the record); a name recorded twice by the same
source gets ``#2``, ``#3`` in record order. Comparison rules:

* structural: exact equality of value and unit (JSON round-trips ints, strings and floats exactly), any
  change is a **regression** until the baseline is updated with ``--update-baseline``;
* timing: a band around the baseline median, half-width
  ``max(TIMING_SPREAD_FACTOR * (max - min) / 2, TIMING_REL_FLOOR * median)`` — outside it is *flagged*
  (slower / faster) but never fails the run (timings are never pass/fail; brief);
* new (in the run, not the baseline) and missing (in the baseline, not the run) rows are listed.

Example::

    >>> rec = {"notebook": "02_megatron_mlp", "params": {"tp": 4}, "measurements": [
    ...     {"name": "mlp.fwd.all_reduce.count", "value": 1, "unit": "count", "source": "hlo"}]}
    >>> base = baseline_from_records("cpu-8", [rec])
    >>> [(d.key, d.status) for d in compare(base, [rec])]
    [('mlp.fwd.all_reduce.count [hlo]', 'same')]

A baseline file that is not JSON or does not follow the schema raises :class:`BaselineError` naming the file
and the problem (the CLI exits with status 2; ``--update-baseline`` rewrites it from scratch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "shardlab.baseline/1"
TIMING_SPREAD_FACTOR = 3.0   # band half-width in units of the observed half-range (max - min) / 2 ...
TIMING_REL_FLOOR = 0.5       # ... but never tighter than 50 % of the median: 2 shared cores are noisy
STRUCTURAL, TIMING = "structural", "timing"


class BaselineError(ValueError):
    """A baseline file is missing fields, has the wrong schema/profile, or is not JSON."""


def key_rows(measurements: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{"name [source]": row}`` with ``#n`` suffixes for repeats, in record order."""
    out: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for m in measurements:
        base = f"{m['name']} [{m['source']}]"
        seen[base] = seen.get(base, 0) + 1
        out[base if seen[base] == 1 else f"{base} #{seen[base]}"] = dict(m)
    return out


def _entry(record: Mapping[str, Any], extra_timings: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    rows = key_rows(record.get("measurements", []))
    structural = {k: {"value": r["value"], "unit": r["unit"]} for k, r in rows.items()
                  if r.get("kind", STRUCTURAL) == STRUCTURAL}
    timing: dict[str, Any] = {}
    for k, r in rows.items():
        if r.get("kind") == TIMING:
            spread = r.get("spread") or {}
            timing[k] = {"median": r["value"], "min": spread.get("min", r["value"]),
                         "max": spread.get("max", r["value"]), "n": spread.get("n", 1), "unit": r["unit"]}
    timing.update({k: dict(v) for k, v in (extra_timings or {}).items()})
    return {"params": dict(record.get("params", {})), "structural": structural, "timing": timing}


def baseline_from_records(profile: str, records: Iterable[Mapping[str, Any]], env: Mapping[str, Any] | None = None,
                          extra_timings: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                          previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A baseline dict from records; notebooks not in ``records`` are kept from ``previous``."""
    notebooks = dict((previous or {}).get("notebooks", {}))
    for rec in records:
        stem = rec["notebook"]
        notebooks[stem] = _entry(rec, (extra_timings or {}).get(stem))
    return {"schema": SCHEMA, "profile": profile, "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "env": dict(env or {}), "notebooks": dict(sorted(notebooks.items()))}


def validate(data: Any, path: Path | str, profile: str | None = None) -> dict[str, Any]:
    """Check the structure of a loaded baseline; raise BaselineError naming ``path`` and the rule."""
    def bad(why: str) -> BaselineError:
        return BaselineError(f"baseline {path} is not usable: {why}; fix it or rewrite it with --update-baseline")

    if not isinstance(data, dict):
        raise bad(f"top level is a {type(data).__name__}, not an object")
    if data.get("schema") != SCHEMA:
        raise bad(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    if profile is not None and data.get("profile") != profile:
        raise bad(f"it is for profile {data.get('profile')!r}, this run is {profile!r}")
    nbs = data.get("notebooks")
    if not isinstance(nbs, dict):
        raise bad("'notebooks' must be an object of notebook name -> entry")
    for stem, entry in nbs.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("structural"), dict) \
                or not isinstance(entry.get("timing", {}), dict):
            raise bad(f"notebook {stem!r} needs 'structural' and 'timing' objects")
        for k, row in entry["structural"].items():
            if not isinstance(row, dict) or "value" not in row or "unit" not in row:
                raise bad(f"{stem} structural {k!r} needs 'value' and 'unit'")
        for k, row in entry.get("timing", {}).items():
            if not isinstance(row, dict) or not isinstance(row.get("median"), int | float):
                raise bad(f"{stem} timing {k!r} needs a numeric 'median'")
    return data


def load(path: Path, profile: str | None = None) -> dict[str, Any] | None:
    """The baseline at ``path`` (None if the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path} is not valid JSON ({exc}); fix it or rewrite it with "
                            "--update-baseline") from exc
    return validate(data, path, profile)


def save(data: Mapping[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Diff:
    notebook: str
    key: str                   # "name [source]"
    kind: str                  # structural | timing
    status: str                # same | changed | new | missing | within | slower | faster
    baseline: Any = None
    current: Any = None
    unit: str = ""
    detail: str = ""

    @property
    def regression(self) -> bool:
        return self.kind == STRUCTURAL and self.status == "changed"

    @property
    def flagged(self) -> bool:
        return self.status in ("changed", "slower", "faster", "new", "missing")


def timing_band(row: Mapping[str, Any]) -> tuple[float, float]:
    median = float(row["median"])
    half_range = (float(row.get("max", median)) - float(row.get("min", median))) / 2
    width = max(TIMING_SPREAD_FACTOR * half_range, TIMING_REL_FLOOR * abs(median))
    return median - width, median + width


def compare_notebook(stem: str, entry: Mapping[str, Any] | None, record: Mapping[str, Any],
                     extra_timings: Mapping[str, Mapping[str, Any]] | None = None) -> list[Diff]:
    """Diff one notebook's record (plus runner timings) against its baseline entry (None: all new)."""
    cur = _entry(record, extra_timings)
    old = entry or {"structural": {}, "timing": {}}
    out: list[Diff] = []
    for k, row in cur["structural"].items():
        was = old["structural"].get(k)
        if was is None:
            out.append(Diff(stem, k, STRUCTURAL, "new", None, row["value"], row["unit"]))
        elif was["value"] == row["value"] and type(was["value"]) is type(row["value"]) and was["unit"] == row["unit"]:
            out.append(Diff(stem, k, STRUCTURAL, "same", was["value"], row["value"], row["unit"]))
        else:
            detail = f"{was['value']!r} {was['unit']} -> {row['value']!r} {row['unit']}"
            out.append(Diff(stem, k, STRUCTURAL, "changed", was["value"], row["value"], row["unit"], detail))
    for k, was in old["structural"].items():
        if k not in cur["structural"]:
            out.append(Diff(stem, k, STRUCTURAL, "missing", was["value"], None, was["unit"]))
    for k, row in cur["timing"].items():
        was = old.get("timing", {}).get(k)
        if was is None:
            out.append(Diff(stem, k, TIMING, "new", None, row["median"], row.get("unit", "s")))
            continue
        lo, hi = timing_band(was)
        status = "slower" if row["median"] > hi else "faster" if row["median"] < lo else "within"
        out.append(Diff(stem, k, TIMING, status, was["median"], row["median"], row.get("unit", "s"),
                        f"band [{lo:.4g}, {hi:.4g}]"))
    for k, was in old.get("timing", {}).items():
        if k not in cur["timing"]:
            out.append(Diff(stem, k, TIMING, "missing", was["median"], None, was.get("unit", "s")))
    return out


def param_changes(entry: Mapping[str, Any] | None, record: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Parameters that differ between the baseline entry and the record: ``{name: (old, new)}``."""
    if not entry:
        return {}
    old, new = entry.get("params", {}), record.get("params", {})
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def compare(baseline: Mapping[str, Any] | None, records: Iterable[Mapping[str, Any]],
            extra_timings: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> list[Diff]:
    """Diff every record against ``baseline`` (None: everything is new)."""
    nbs = (baseline or {}).get("notebooks", {})
    out: list[Diff] = []
    for rec in records:
        stem = rec["notebook"]
        out.extend(compare_notebook(stem, nbs.get(stem), rec, (extra_timings or {}).get(stem)))
    return out
