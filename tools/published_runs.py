"""Compile MaxText's published v5e-256 dense training runs through ``inspect`` and price them with ``step_time``.

Design: MaxText publishes MFU for four dense models on one v5e-256 (``configs/tpu/v5e/{16b,32b,64b,128b}.sh``:
``global_parameter_scale`` 16 / 32 / 64 / 128 over its ``base.yml`` widths, seq 2048, FSDP over the 256 chips
except 128B's fsdp 16 x tensor 16). ``shardlab.timing.published`` holds the settings; this tool builds each as a
Llama config for ``inspect``'s step (traced on a 2-device mesh, compiled for the 256 chips: the pod-scale
retarget), prices the compiled program with :func:`shardlab.profile.step_time.step_time` and stores the result in
``data/scale/published_runs.json``, which notebook 13 reads unless run with ``full_size=True``. The compiled
per-chip program text is kept (gzip) beside the JSON when ``--keep-hlo DIR`` is given, so a change of the pricing
can be re-applied without recompiling.

Usage::

    nice -n 10 python tools/published_runs.py 16b                 # ~minutes of XLA:TPU compile per run
    nice -n 10 python tools/published_runs.py maxtext_8b_v6e8    # a v6e Llama 8B row (one per process)
    nice -n 10 python tools/published_runs.py 16b 32b --layers 2 4  # the scan-linearity route (see published)
    python tools/published_runs.py --reprice DIR                    # today's pricing on the kept programs
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--reprice", type=Path, default=None, metavar="HLO_DIR",
                    help="re-price the cached results from their kept programs (no compile), then compile RUNS")
    ap.add_argument("--layers", nargs="*", type=int, default=None,
                    help="compile at these layer counts (scan) instead of the published one")
    ap.add_argument("--batch", type=int, default=None, help="sequences per chip instead of the published number")
    ap.add_argument("--keep-hlo", type=Path, default=None, help="directory for the compiled programs (gzip)")
    ap.add_argument("--out", type=Path, default=None, help="results file (default: the notebook's cache)")
    a = ap.parse_args()
    from shardlab.profile import tpu
    from shardlab.timing import published as P

    out = a.out or P.CACHE_FILE
    v6e = [k for k in a.runs if k in P.V6E_RUNS]
    if v6e and (len(a.runs) > 1 or a.reprice is not None):
        ap.error(f"{v6e[0]}: a v6e run is compiled alone (its process holds one CPU device per chip)")
    if a.reprice is not None:
        print("re-priced:", ", ".join(P.reprice(a.reprice, out)), flush=True)
    for key in a.runs:
        if key in P.V6E_RUNS:  # compiled as published (flash kept), priced, numbers only
            started = time.time()
            res = P.compile_v6e(key)
            res["_source"] = {"command": f"python tools/published_runs.py {key}",
                              "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                              "versions": tpu.check_backend(), "cpus": os.cpu_count(), "machine": platform.machine()}
            print(json.dumps({key: res}, indent=1), flush=True)
            P.store(key, res, out)
            continue
        for layers in a.layers or [None]:
            started = time.time()
            res, hlo = P.compile_run(key, num_layers=layers, per_device_batch=a.batch)
            res["_source"] = {
                "command": f"python tools/published_runs.py {key}" + (f" --layers {layers}" if layers else "")
                + (f" --batch {a.batch}" if a.batch else ""),
                "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                "wall_s": round(time.time() - started, 1), "versions": tpu.check_backend(),
                "cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                "machine": platform.machine()}
            name = P.result_key(key, layers, a.batch)
            print(json.dumps({name: {k: v for k, v in res.items() if k != "kernels_top"}}, indent=1), flush=True)
            P.store(name, res, out)
            if a.keep_hlo is not None and hlo is not None:
                a.keep_hlo.mkdir(parents=True, exist_ok=True)
                with gzip.open(a.keep_hlo / f"{name}.hlo.txt.gz", "wt") as f:
                    f.write(hlo)


if __name__ == "__main__":
    main()
