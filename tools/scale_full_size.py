"""Measure the full-size XLA:TPU compiles that notebooks 06 and 07 show from a cache by default.

Design: the compiles take minutes (30-600 s each on a 2-core machine, compile-only, libtpu); the notebooks read
their cached results from ``data/scale/`` unless run with ``full_size=True``, which compiles live. This tool
refreshes the cache with the same library functions and records how it was measured (date, versions, machine
load) in the file's ``_source``.

Usage::

    python tools/scale_full_size.py seed       # notebook 06: the 405B seed story (9 compiles, 64-chip worker)
    python tools/scale_full_size.py seed --only in_graph_update seed_layout   # compile these cases, merge
    python tools/scale_full_size.py planner    # notebook 07: the planner matrix (7 compiles, 8- and 64-chip)
    python tools/scale_full_size.py planner --only llama-3-8b.v6e-8
    python tools/scale_full_size.py holdout    # notebook 07: configurations held out from the fit (3 compiles)
    python tools/scale_full_size.py fsdp-rule  # notebook 07: the FSDP bytes of a 4-layer Llama step (2 compiles)
    python tools/scale_full_size.py pipeline   # notebook 07: the SPMD pipeline's per-chip bytes (2 compiles)
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from shardlab import runtime
from shardlab.profile import tpu
from shardlab.profile.result_files import save_results


def _source(command: str, started: float) -> dict:
    return {"command": command, "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
            "wall_s": round(time.time() - started, 1), "versions": tpu.check_backend(),
            "cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "machine": platform.machine()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("seed", "planner", "holdout", "fsdp-rule", "pipeline"))
    ap.add_argument("--only", nargs="*", help="planner / holdout: the '<preset>.<slice>' keys to compile; seed: "
                    "cases of scale.CASES (merged into the cache, their measurement noted in _source['added'])")
    a = ap.parse_args()
    runtime.setup(num_devices=8)
    # after setup: these modules import torch_xla, which must see the device count first (the ordering rule)
    from shardlab.planner import verdict as pv
    from shardlab.xla_scan import scale

    started = time.time()
    if a.what == "seed":
        results, why = scale.story(cases=tuple(a.only) if a.only else tuple(scale.CASES))
        if why:
            raise SystemExit(f"the TPU view is skipped here: {why}")
        for k, r in results.items():
            print(f"{k:22s} fits={r.fits} runs={r.runs} {r.compile_s:6.1f} s  {r.message}", flush=True)
        source = _source("python tools/scale_full_size.py seed" + (f" --only {' '.join(a.only)}" if a.only else ""),
                         started)
        if a.only and scale.STORY_FILE.exists():  # merge into the cache, keeping how the other cases were measured
            cached, old = scale.load_story()
            source = {**old, "added": [*old.get("added", []), {"cases": sorted(results), **source}]}
            results = {**cached, **results}
        scale.save_story(results, **source)
        print("wrote", scale.STORY_FILE)
    elif a.what == "fsdp-rule":
        rules = {r: pv.rule_check(pv.rule_case(r)) for r in ("none", "full")}
        for k, r in rules.items():
            print(k, r.compiler, r.gspmd, f"{r.compile_s:.1f} s", flush=True)
        save_results(rules, pv.RULE_FILE, **_source("python tools/scale_full_size.py fsdp-rule", started))
        print("wrote", pv.RULE_FILE)
    elif a.what == "pipeline":
        from shardlab.planner import check as pc

        results = {"gpipe": pc.pipeline_check()}
        print(results["gpipe"].as_dict(), flush=True)
        save_results(results, pc.PIPELINE_FILE, **_source("python tools/scale_full_size.py pipeline", started))
        print("wrote", pc.PIPELINE_FILE)
    else:
        holdout = a.what == "holdout"
        cases = pv.holdout_cases() if holdout else pv.matrix_cases()
        path = pv.HOLDOUT_FILE if holdout else pv.MATRIX_FILE
        if a.only:
            unknown = set(a.only) - set(cases)
            if unknown:
                raise SystemExit(f"--only {sorted(unknown)}: not in {list(cases)}")
            cases = {k: cases[k] for k in a.only}
        results = {}
        for k, case in cases.items():
            results[k] = r = pv.check(case)
            print(f"{k:24s} compiler fits={r.compiler_fits} planner(no flash) fits={r.planner_no_flash_fits} "
                  f"{r.compile_s:6.1f} s {r.message}", flush=True)
        source = _source(f"python tools/scale_full_size.py {a.what}" + (f" --only {' '.join(a.only)}" if a.only
                                                                         else ""), started)
        if a.only and path.exists():  # merge into the cache, keeping how the other rows were measured
            cached, old = pv.load_holdout() if holdout else pv.load_matrix()
            source = {**old, "added": [*old.get("added", []), {"rows": sorted(results), **source}]}
            results = {**cached, **results}
        save_results(results, path, **source)
        print("wrote", path)


if __name__ == "__main__":
    main()
