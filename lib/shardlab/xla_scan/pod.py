"""The 405B seed at its own size: v6e-256, fsdp 64 × tensor 4, traced on 8 CPU devices and compiled for the pod.

Design note
-----------
The seed's block stack (:class:`shardlab.xla_scan.scale.SeedStepCase`: Llama 3.1 405B's q and o projections
``[16384, 16384]``, 126 layers stacked in the step, batch layout, gradients out) on a mesh (fsdp = chips / 4,
tensor 4) with one sequence of 1024 tokens per fsdp rank (global batch = fsdp) — the same per-chip work on every
slice, and at 64 chips exactly :data:`shardlab.xla_scan.scale.FULL_SIZE`. A torch_xla trace needs one CPU device
per chip, so 128 and 256 chips are out of its reach; the graph is traced on mesh (2, 4) — 8 devices, the same global
shapes — and its shardings rewritten to the real mesh (:mod:`shardlab.profile.retarget`, exact: the tests compare it
with direct compiles, and at 64 chips it reproduces the cached direct compile's bytes).

``shard_as`` off and on at 64, 128 and 256 chips: six compiles of minutes each, cached in
``data/scale/seed_405b_pod.json`` by ``tools/retarget_full_size.py pod`` (each in a fresh process: its peak host
memory is its own), compiled live for v6e-256 when the notebook runs with ``full_size=True``.

    the largest buffers without shard_as:  [L, h/tensor, h]   bf16[126, 4096, 16384]  (the seed's stacked gradient)
    each layer's gradient with shard_as:      [h/fsdp, h/tensor]  bf16[256, 4096] at fsdp 64
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from shardlab.core.case import build_graph
from shardlab.formulas import scan as FS
from shardlab.profile import tpu
from shardlab.profile.record import Recorder
from shardlab.xla_scan.params import ScanParams
from shardlab.xla_scan.scale import FULL_SIZE, SeedResult, SeedStepCase, seed_result

POD_FILE = Path(__file__).resolve().parents[3] / "data" / "scale" / "seed_405b_pod.json"
TENSOR = 4  # the seed's tensor axis
SEQ = 1024  # tokens per sequence; one sequence per fsdp rank
SLICES = (64, 128, 256)  # v6e chips
TRACE_FSDP = 2  # the trace mesh: (2, TENSOR) = 8 CPU devices
GENERATION = "v6e"


def pod_case(chips: int, shard_as: bool, trace: bool = False) -> SeedStepCase:
    """The seed stack on ``chips`` v6e chips, mesh (chips / 4, 4), batch = fsdp sequences of 1024; ``trace=True``: the
    same global shapes on the trace mesh (2, 4).

    >>> c = pod_case(256, True); (c.p.mesh_fsdp, c.p.mesh_tensor, c.p.batch), pod_case(256, True, True).p.mesh_fsdp
    ((64, 4, 64), 2)
    """
    if chips % TENSOR or chips // TENSOR < TRACE_FSDP:
        raise ValueError(f"chips={chips} must be a multiple of tensor={TENSOR} with fsdp >= {TRACE_FSDP}")
    fsdp = chips // TENSOR
    p = replace(FULL_SIZE.p, batch=fsdp, seq=SEQ, mesh_fsdp=TRACE_FSDP if trace else fsdp, mesh_tensor=TENSOR)
    return replace(FULL_SIZE, p=p, stacking="in_graph", update="none", layout="batch", shard_as=shard_as)


def compile_pod(chips: int, shard_as: bool) -> SeedResult:
    """One compile: traced on mesh (2, 4) (in a helper process unless this one has 8 devices), compiled for
    v6e-``chips`` with the shardings rewritten to (chips / 4, 4)."""
    fsdp = chips // TENSOR
    c = tpu.compile_program(build_graph, pod_case(chips, shard_as, trace=True), tpu.topology_for(chips, GENERATION),
                            retarget=((TRACE_FSDP, TENSOR), (fsdp, TENSOR)), label=f"seed v6e-{chips}")
    return seed_result(pod_case(chips, shard_as), c)


def load_pod(path: Path = POD_FILE) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The cached rows (``"v6e-256.on"`` -> chips, trace / compile seconds, peak host memory, the result) and how
    they were measured."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tools/retarget_full_size.py pod (or the notebook with "
                                "full_size=True)")
    d = json.loads(path.read_text())
    return d["results"], d["_source"]


def pod_table(rec: Recorder, p: ScanParams) -> pd.DataFrame:
    """The pod story as a table, checked against the formula for every slice: without shard_as the compile fails
    and its two largest buffers are 1-D stacks ``[L, h/tensor, h]``; with it the step fits and each layer's gradient
    leaves ``[h/fsdp, h/tensor]``. Live for v6e-256 when ``p.full_size`` (its verdicts checked against the cache)."""
    rows, source = load_pod()
    results = {k: SeedResult.from_dict(v["result"]) for k, v in rows.items()}
    if p.full_size:
        live = {f"v6e-256.{'on' if on else 'off'}": compile_pod(256, on) for on in (False, True)}
        rec.check("scale.pod: v6e-256 verdicts compiled now == cached", all(
            live[k].fits == results[k].fits for k in live), str({k: r.fits for k, r in live.items()}))
        results.update(live)
        print("v6e-256 compiled now")
    else:
        rec.note("scale.pod", f"cached: {source['command']}, {source['measured']}, libtpu "
                              f"{source['versions']['libtpu']}; traced on {source.get('trace', '8 CPU devices')}")
    out = []
    for key, r in sorted(results.items(), key=lambda kv: (int(kv[0].split("-")[1].split(".")[0]), kv[0])):
        chips, flag = int(key.split("-")[1].split(".")[0]), key.rsplit(".", 1)[1]
        case = pod_case(chips, flag == "on")
        h, L, fsdp = case.p.hidden, case.layers, case.p.mesh_fsdp
        if flag == "off":
            want = FS.stacked_bytes(L, h, h, fsdp, TENSOR, "1d", case.dtype).per_device_bytes
            got = [size for size, *_ in r.largest[:2]]
            rec.check(f"scale.pod.{key}: does not fit; its two largest buffers are the 1-D stacks [L, h/tensor, h]",
                      not r.fits and got == [want, want], f"fits={r.fits}; {got} B vs {want} B each")
        else:
            want_shape = f"bf16[{h // fsdp},{h // TENSOR}]"
            rec.check(f"scale.pod.{key}: fits; each layer's gradient leaves 2-D [h/fsdp, h/tensor]",
                      r.fits and all(s == [want_shape] for s in r.grad_shapes.values()), f"{r.grad_shapes}")
        row = rows.get(key, {})
        gib = 2**30
        out.append({
            "slice": f"v6e-{chips}", "mesh": f"fsdp {fsdp} × tensor {TENSOR}", "batch × seq": f"{fsdp} × {SEQ}",
            "shard_as": flag, "fits": r.fits,
            "checked GiB": round((r.per_chip_bytes or 0) / gib, 2), "peak GiB": round((r.peak_bytes or 0) / gib, 2)
            if r.fits else "–",
            "largest buffers": ", ".join(str(b[1]).split("{")[0] for b in r.largest[:2]) if r.largest else "–",
            "gradient out, per chip": ", ".join(sorted({s for v in r.grad_shapes.values() for s in v})) or "–",
            "trace s (8 devices)": row.get("trace_s", "–"), "compile s": round(r.compile_s, 1),
            "peak host GiB": round(row["peak_rss_bytes"] / gib, 2) if "peak_rss_bytes" in row else "–",
        })
    return pd.DataFrame(out).set_index(["slice", "shard_as"])
