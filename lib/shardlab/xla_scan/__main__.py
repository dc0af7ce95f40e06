"""``python -m shardlab.xla_scan '<json>'``: one scan step compiled in a fresh device world; prints one JSON line.

``{"num_devices": 4, "layers": 8, "mode": "scan", "hidden": 128, "ffn": 512, "batch": 8, "seq": 8, "seed": 0}``
runs the step on mesh (fsdp = num_devices, tensor = 1) through the harness's CPU compiler view, after one small
warm-up compile (the first compile of a process initialises XLA, and the first scan backward imports JAX: one-off
seconds that belong to no step). :func:`shardlab.xla_scan.measure.compile_vs_devices` calls it once per count.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from shardlab import runtime
from shardlab.xla_scan.params import ScanParams


def main(argv: list[str]) -> None:
    req = json.loads(argv[0])
    n = req["num_devices"]
    runtime.setup(num_devices=n)
    # after setup: these import torch_xla, which must see the device count first (the ordering rule)
    from shardlab.core import harness
    from shardlab.xla_scan.case import ScanCase
    from shardlab.xla_scan.measure import graph_size

    p = ScanParams(num_devices=n, hidden=req["hidden"], ffn=req["ffn"], batch=req["batch"], seq=req["seq"],
                   mesh_fsdp=n, mesh_tensor=1, seed=req.get("seed", 0))
    warm = "loop" if req["mode"] == "loop" else "scan_layers"  # scan_layers: scan's machinery, no While at L = 1
    harness.hlo(ScanCase(replace(p, seq=p.seq + 1), layers=1, mode=warm))  # warm-up: never the measured graph
    view = harness.hlo(ScanCase(p, layers=req["layers"], mode=req["mode"]))
    if not view.ran:
        raise RuntimeError(view.skipped)
    cap = view.detail
    print(json.dumps({"num_devices": n, "mesh": [n, 1], "compile_s": cap.metrics.compile_s,
                      "hlo_instructions": graph_size(cap.module), "cached": cap.cached}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
