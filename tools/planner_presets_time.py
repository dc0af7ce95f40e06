"""Compile the planner's preset rows and put the compiler's step time beside the planner's (notebook 07's cache).

Design: :mod:`shardlab.planner.time_check` holds the rows and the pricing; this tool runs each compile (XLA:TPU
compile-only, minutes on a 2-core host) in its own process — ``one ROW DEPTH`` compiles one and merges it into
``data/time/planner_presets.json`` with its command, libtpu version and the load at its end. ``all`` runs every
row: its full depth first, and when that does not fit, 2 and 4 layers (the scan-linearity route).

Usage::

    nice -n 10 python tools/planner_presets_time.py all                    # every row, one process per compile
    nice -n 10 python tools/planner_presets_time.py all --rows llama-3-8b.v6e-64
    python tools/planner_presets_time.py one llama-3-70b.v6e-256 full      # one compile in this process
    python tools/planner_presets_time.py one llama-3.1-405b.v6e-256 2      # at 2 layers
    python tools/planner_presets_time.py one tiny.v5e-8 full               # the tests' stand-in (seconds)
    SHARDLAB_KEEP_HLO=DIR ... one ROW DEPTH                                # also keep the program (gzip) in DIR
    python tools/planner_presets_time.py reprice DIR                       # today's pricing on the kept programs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def one(key: str, depth: str) -> dict:
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.planner import time_check as T
    from shardlab.profile import tpu

    started = time.time()
    keep = os.environ.get("SHARDLAB_KEEP_HLO")  # a directory for the compiled program (gzip), to re-read it
    res = T.compile_row(key, None if depth == "full" else int(depth), Path(keep) if keep else None)
    source = {"command": f"python tools/planner_presets_time.py one {key} {depth}",
              "measured": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)) + " UTC",
              "versions": tpu.check_backend(), "cpus": os.cpu_count(), "machine": platform.machine(),
              "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
              "host_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    r = T.store_compile(key, depth if depth == "full" else f"L{depth}", res, source)
    print(json.dumps({"compile": {k: v for k, v in res.items() if k != "step"}, "row": r}, indent=1, default=str),
          flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a1 = sub.add_parser("one")
    a1.add_argument("row")
    a1.add_argument("depth", help="full, or a layer count (scan)")
    a3 = sub.add_parser("reprice", help="today's pricing on kept programs (SHARDLAB_KEEP_HLO's files), no compile")
    a3.add_argument("hlo_dir", type=Path)
    a2 = sub.add_parser("all")
    a2.add_argument("--rows", nargs="*", default=None)
    a = ap.parse_args()
    if a.cmd == "reprice":
        from shardlab.planner import time_check as T

        print("re-priced:", ", ".join(T.reprice(a.hlo_dir)), flush=True)
        return
    if a.cmd == "one":
        if a.depth != "full" and not a.depth.isdigit():
            ap.error(f"depth={a.depth!r} must be 'full' or a positive layer count")
        one(a.row, a.depth)
        return
    from shardlab.planner import time_check as T

    for key in a.rows or list(T.ROWS):
        if key not in T.ALL:
            ap.error(f"row={key!r} must be one of {sorted(T.ALL)}")
        depths = ["full"] if key not in T.EXTRAPOLATED else [str(d) for d in T.DEPTHS]
        for depth in depths:
            cmd = [sys.executable, __file__, "one", key, depth]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=False)
        got = T.load()["compiles"].get(key, {})
        if "full" in got and not got["full"].get("fits"):
            for depth in (str(d) for d in T.DEPTHS):
                subprocess.run([sys.executable, __file__, "one", key, depth], check=False)


if __name__ == "__main__":
    main()
