"""Measure the full-size XLA:TPU compiles that notebooks 06 and 07 show from a cache by default.

Design: the compiles take minutes (30-600 s each on a 2-core machine, compile-only, libtpu); the notebooks read
their cached results from ``data/scale/`` unless run with ``full_size=True``, which compiles live. This tool
refreshes the cache with the same library functions and records how it was measured (date, versions, machine
load) in the file's ``_source``.

Usage::

    python tools/scale_full_size.py seed       # notebook 06: the 405B seed story (5 compiles, 64-chip worker)
    python tools/scale_full_size.py planner    # notebook 07: the planner matrix (7 compiles, 8- and 64-chip)
    python tools/scale_full_size.py planner --only llama-3-8b.v6e-8
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from shardlab import runtime
from shardlab.profile import tpu


def _source(command: str, started: float) -> dict:
    return {"command": command, "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
            "wall_s": round(time.time() - started, 1), "versions": tpu.check_backend(),
            "cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "machine": platform.machine()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("seed", "planner"))
    ap.add_argument("--only", nargs="*", help="planner: the '<preset>.<slice>' keys to compile")
    a = ap.parse_args()
    runtime.setup(num_devices=8)
    # after setup: these modules import torch_xla, which must see the device count first (the ordering rule)
    from shardlab import planner_verdict as pv
    from shardlab.xla_scan import scale

    started = time.time()
    if a.what == "seed":
        results, why = scale.story()
        if why:
            raise SystemExit(f"the TPU view is skipped here: {why}")
        for k, r in results.items():
            print(f"{k:14s} fits={r.fits} runs={r.runs} {r.compile_s:6.1f} s  {r.message}", flush=True)
        scale.save_story(results, **_source("python tools/scale_full_size.py seed", started))
        print("wrote", scale.STORY_FILE)
    else:
        cases = pv.matrix_cases()
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
        if a.only and pv.MATRIX_FILE.exists():  # merge into the existing cache
            cached, _ = pv.load_matrix()
            results = {**cached, **results}
        pv.save_matrix(results, **_source("python tools/scale_full_size.py planner", started))
        print("wrote", pv.MATRIX_FILE)


if __name__ == "__main__":
    main()
