"""Measure the crossover table of notebook 13: per axis (fsdp, tensor, context, expert) and generation (v5e-8,
v5p-16, v6e-8), every swept size compiled compile-only for XLA:TPU and priced (``shardlab.timing.crossovers``).
Writes ``data/time/crossovers.json`` (the notebook's cache) with the libtpu version, the settings and this command.

Usage::

    nice -n 10 python tools/crossovers.py                     # all axes and generations (minutes)
    nice -n 10 python tools/crossovers.py --axes context --generations v5e
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def main() -> None:
    from shardlab.timing import crossovers as X

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--axes", nargs="*", default=list(X.AXES), choices=list(X.AXES))
    ap.add_argument("--generations", nargs="*", default=list(X.SLICES), choices=list(X.SLICES))
    ap.add_argument("--out", type=Path, default=X.CACHE_FILE)
    a = ap.parse_args()
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.profile import tpu

    started = time.time()
    cache = json.loads(a.out.read_text()) if a.out.exists() else {}
    for gen in a.generations:
        for axis in a.axes:
            t0 = time.time()
            cache[f"{axis}.{gen}"] = e = X.measure(axis, gen)
            print(f"{axis:8s} {gen}: critical {e['critical']:.0f}, crossing {e['crossover']} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    cache["_source"] = {"command": "PYTHONPATH=lib nice -n 10 python tools/crossovers.py"
                        + ("" if set(a.axes) == set(X.AXES) else " --axes " + " ".join(a.axes))
                        + ("" if set(a.generations) == set(X.SLICES) else " --generations " + " ".join(a.generations)),
                        "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                        "wall_s": round(time.time() - started), "versions": tpu.check_backend(),
                        "cpus": os.cpu_count(), "machine": platform.machine(), "num_devices": 8,
                        "settings": {axis: {"program": type(base).__name__, "config": repr(base), "swept": field,
                                            "values": list(values)} for axis, (base, field, values) in X.AXES.items()},
                        "slices": X.SLICES}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(dict(sorted(cache.items())), indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
