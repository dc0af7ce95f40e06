"""Full-size inspect runs, cached: ``python -m shardlab.inspect.full [KEY ...]`` -> ``data/models/inspect_full.json``.

Design note: each run is ``python -m shardlab inspect ... --json`` in a fresh process (its own device world with
the slice's chip count), one after another — minutes each on the 2-core reference machine. The file holds the
results (``InspectResult.as_dict``) by key plus how they were made (``result_files``), so a notebook shows them
without recompiling: :func:`load_full`. :data:`RUNS` mirrors notebook 07's Llama 3 8B matrix
(``planner.verdict.MATRIX``: same slices, meshes, batch, sequence 8192, full recompute, donated), an MoE model,
and torch_xla's scan_layers beside the stacked scan for one configuration (HF's loop: :data:`EXTRA`).
:func:`compare_with_07` puts each Llama row beside 07's cached compiler verdict (same fit verdict; bytes within 2 %).
"""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shardlab.inspect.config import LAYER_MODES
from shardlab.inspect.models import MODELS_DIR
from shardlab.profile.result_files import load_results, save_results

FULL_FILE = MODELS_DIR / "inspect_full.json"
SEQ = 8192
# key -> CLI arguments after the model
RUNS: dict[str, list[str]] = {
    "llama-3-8b.v5e-8": ["llama-3-8b", "--topology", "v5e-8", "--mesh", "fsdp=8", "--batch", "8"],
    "llama-3-8b.v6e-8": ["llama-3-8b", "--topology", "v6e-8", "--mesh", "fsdp=8", "--batch", "8"],
    "llama-3-8b.v6e-64": ["llama-3-8b", "--topology", "v6e-64", "--mesh", "fsdp=16,tensor=4", "--batch", "16"],
    "mixtral-8x7b.v6e-64": ["mixtral-8x7b", "--topology", "v6e-64", "--mesh", "fsdp=16,tensor=4", "--batch", "16"],
}
MATRIX = tuple(RUNS)  # notebook 12's table: Llama 3 8B on the three slices of notebook 07, and an MoE model
# compile seconds of another layer mode (scan: the llama-3-8b.v6e-64 row). HF's own loop at full size is not in
# the default list: it had not finished after 30 minutes on the (loaded) 2-core machine; run it by its key.
RUNS["llama-3-8b.v6e-64.scan_layers"] = [*RUNS["llama-3-8b.v6e-64"], "--layers", "scan_layers"]
EXTRA = {"llama-3-8b.v6e-64.loop": [*RUNS["llama-3-8b.v6e-64"], "--layers", "loop"]}
# the three layer modes at a middle size, where HF's loop finishes: 8 of the 32 layers, 2048 tokens, v6e-8
MIDDLE = "llama-3-8b.v6e-8.L8.seq2048"
for _mode in LAYER_MODES:
    RUNS[f"{MIDDLE}.{_mode}"] = ["llama-3-8b", "--topology", "v6e-8", "--mesh", "fsdp=8", "--batch", "8", "--seq",
                                 "2048", "--num-layers", "8", "--layers", _mode]
LAYERS = (*(f"{MIDDLE}.{m}" for m in LAYER_MODES), "llama-3-8b.v6e-64", "llama-3-8b.v6e-64.scan_layers",
          "llama-3-8b.v6e-64.loop")  # notebook 12's layer-mode table (a key not in the cache: not measured)


def command(key: str) -> list[str]:
    args = {**RUNS, **EXTRA}[key]
    seq = [] if "--seq" in args else ["--seq", str(SEQ)]
    return [sys.executable, "-m", "shardlab", "inspect", *args, *seq, "--json", "--quiet"]


def run_one(key: str) -> dict[str, Any]:
    """One full-size run in a fresh process; its result dict (exit 0 or 1), else RuntimeError with its stderr."""
    t0 = time.perf_counter()
    p = subprocess.run(command(key), capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{key}: exit {p.returncode}\n{p.stderr[-3000:]}")
    result = json.loads(p.stdout)
    result["wall_s"] = time.perf_counter() - t0
    return result


def load_full(path: Path = FULL_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({key: InspectResult}, source)`` from the cache."""
    # torch_xla (5.4 s) would set PJRT_DEVICE/XLA_FLAGS that the driver's child runs inherit
    from shardlab.inspect.api import InspectResult

    return load_results(path, lambda d: InspectResult.from_dict(d).reread(),
                        "run `python -m shardlab.inspect.full` (minutes per compile)")


@functools.cache
def _cached() -> tuple[dict[str, Any], dict[str, Any]]:
    return load_full()


def matrix(keys: tuple[str, ...], live: bool) -> tuple[dict[str, Any], str]:
    """``({key: InspectResult}, where they come from)``: compiled now, one fresh process per key (``live``: minutes
    each), or read from the cache (keys it lacks are left out)."""
    # torch_xla (5.4 s) would set PJRT_DEVICE/XLA_FLAGS that the driver's child runs inherit
    from shardlab.inspect.api import InspectResult

    if live:
        return {k: InspectResult.from_dict(run_one(k)).reread() for k in keys}, "compiled now"
    cached, source = _cached()
    added = "; ".join(f"{', '.join(a['keys'])}: {a['when']}" for a in source.get("added", []))
    about = (f"cached ({source.get('command')}, {source.get('when')}" + (f"; added {added}" if added else "") + ")")
    return {k: cached[k] for k in keys if k in cached}, about


def compare_with_07(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Llama 3 8B through inspect beside notebook 07's compiler verdicts (``data/scale/planner_verdict.json``)."""
    # torch_xla (5.4 s) would set PJRT_DEVICE/XLA_FLAGS that the driver's child runs inherit
    from shardlab.planner.verdict import load_matrix

    ref, _ = load_matrix()
    rows = []
    for key, r in results.items():
        if key not in ref:
            continue
        c = ref[key]
        # like with like: when the program alone ran out of memory neither compile evaluated its arguments, and
        # both "totals" are the message's "used" (the program's temporaries: where the compiler gave up)
        mine = r.totals.get("used") if not c.arguments_evaluated else r.row("total")["compiler"]
        rows.append({"key": key, "inspect_fits": r.fits, "07_fits": c.compiler_fits, "same_verdict":
                     r.fits == c.compiler_fits, "inspect_bytes": mine, "07_bytes": c.total,
                     "ratio": mine / c.total if mine and c.total else None, "inspect_compile_s": r.compile_s,
                     "07_compile_s": c.compile_s, "07_message": c.message, "inspect_message": r.message,
                     "lower_bounds": not c.arguments_evaluated, "capacity": c.capacity_bytes,
                     "inspect_temp": r.totals.get("temporaries"), "07_temp": c.compiler.get("temp"),
                     "inspect_args": r.totals.get("arguments"), "07_args": c.compiler.get("arguments"),
                     "07_fragmentation": c.compiler.get("fragmentation"),
                     "planner_total": (r.planner or {}).get("total"), "planner_at_risk": (r.planner or {}).get(
                         "at_risk")})
    return rows


class _Stored(dict):
    """A cached result dict as ``result_files.save_results`` wants it (``.as_dict()``)."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


def add(results: dict[str, dict[str, Any]], path: Path = FULL_FILE) -> None:
    """Store ``{key: result dict}`` in the cache: the file's first source is kept, these keys listed as added."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    data = json.loads(path.read_text()) if path.exists() else {"results": {}, "_source": {}}
    source = data["_source"] or {"command": "python -m shardlab.inspect.full", "machine": platform.node(),
                                 "when": when}
    if data["results"]:
        source.setdefault("added", []).append({"keys": sorted(results), "when": when, "machine": platform.node()})
    save_results({k: _Stored(v) for k, v in {**data["results"], **results}.items()}, path, **source)


def main(keys: list[str]) -> int:
    for key in keys or list(RUNS):
        print(f"{key}: {' '.join(command(key)[1:])}", flush=True)
        res = run_one(key)
        add({key: res})
        print(f"  fits={res['fits']} compile {res['compile_s']:.1f} s, wall {res['wall_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
