"""Trace small, compile big at full size: the exactness check at 64 chips and the seed on a whole v6e pod.

Design: every compile here is XLA:TPU compile-only (libtpu) and takes minutes on a 2-core host. ``compare`` compiles
the same full-size graph twice for a 64-chip slice — traced on 64 CPU devices (the direct path, a helper process)
and traced on 8 with the mesh's sizes shrunk, its shardings rewritten (:mod:`shardlab.profile.retarget`) — and
prints :func:`shardlab.profile.retarget.differences` (empty = the same program). ``pod`` compiles notebook 06's
seed block stack (Llama 3.1 405B's q/o projections, 126 layers, mesh fsdp × tensor 4, one sequence of 1024 tokens
per fsdp rank) with shard_as off and on for v6e-64, v6e-128 and v6e-256 from an 8-device trace, each compile in a
fresh process so its peak host memory (``ru_maxrss``) and seconds are its own; results go to
``data/scale/seed_405b_pod.json`` (``_source`` says how they were measured).

Usage::

    python tools/retarget_full_size.py compare            # 06's in_graph off/on at v6e-64: direct vs from 8 devices
    python tools/retarget_full_size.py compare --inspect  # 12's Llama 3 8B step at v6e-64: direct vs from 8
    python tools/retarget_full_size.py pod                # the seed, shard_as off/on, v6e-64/128/256 (6 processes)
    python tools/retarget_full_size.py pod --chips 256    # one slice only (merged into the cache)
    python tools/retarget_full_size.py planner            # 07's pod verdicts: Llama 3 70B on v6e/v5e/v5p/v4 (4)
    python tools/retarget_full_size.py planner-one llama-3-70b.v4-256   # one row, in this process (merged)
    python tools/retarget_full_size.py planner-control    # the v4 row's 128-chip program compiled for v6e-128

``planner`` compiles :data:`shardlab.planner.pod.POD` (notebook 07's verdict step traced on 8 devices, mesh
(1, 2, 4), compiled for 128 or 256 chips), each row in a fresh process, into ``data/scale/planner_pod.json``.
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

POD_FILE = Path(__file__).resolve().parents[1] / "data" / "scale" / "seed_405b_pod.json"
TENSOR = 4  # the seed's tensor axis
SEQ = 1024  # tokens per sequence; one sequence per fsdp rank (batch = fsdp)


def _versions() -> dict:
    from shardlab.profile import tpu

    return tpu.check_backend()


def seed_case(fsdp: int, shard_as: bool, trace_fsdp: int | None = None):  # type: ignore[no-untyped-def]
    """Notebook 06's seed stack on mesh (fsdp, 4) (``shardlab.xla_scan.pod.pod_case``); traced on (2, 4) when
    ``trace_fsdp`` is given."""
    from shardlab.xla_scan.pod import TRACE_FSDP, pod_case

    if trace_fsdp not in (None, TRACE_FSDP):
        raise ValueError(f"trace_fsdp={trace_fsdp}: the pod cases trace on fsdp {TRACE_FSDP}")
    return pod_case(fsdp * TENSOR, shard_as, trace=trace_fsdp is not None)


def _summary(c) -> dict:  # type: ignore[no-untyped-def]
    m = c.memory
    out = {"fits": c.fits, "compile_s": round(c.compile_s, 1)}
    if m is not None:
        out.update(argument=m.argument, output=m.output, temp=m.temp, alias=m.alias, peak=m.peak)
        out["collectives"] = len(c.module.collectives)
    if c.oom is not None:
        out.update(oom=c.oom.message.splitlines()[0][:200], used=c.oom.used, capacity=c.oom.capacity,
                   largest=[b.shape for b in c.oom.buffers[:4]])
    return out


def compare(inspect: bool) -> None:
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.core.case import build_graph
    from shardlab.profile import retarget as R
    from shardlab.profile import tpu

    if inspect:
        from dataclasses import replace

        from shardlab.inspect import step
        from shardlab.inspect.config import make_config

        big = make_config("llama-3-8b", mesh="fsdp=16,tensor=4", topology="v6e-64", batch=16, seq=2048).validate()
        small = replace(big, mesh=(("fsdp", 2), ("tensor", 4)), rules_mesh=big.mesh)  # as inspect traces small
        pairs = {"12 llama-3-8b fsdp16 x tensor4": (step.build, big, small, ((2, 4), (16, 4)), {"donate": big.donate})}
    else:
        pairs = {f"06 in_graph shard_as {'on' if on else 'off'}":
                 (build_graph, seed_case(16, on), seed_case(16, on, trace_fsdp=2), ((2, 4), (16, 4)), {})
                 for on in (False, True)}
    for name, (build, big, small, meshes, kw) in pairs.items():
        t0 = time.perf_counter()
        direct = tpu.compile_program(build, big, "v6e-64", **kw)
        t1 = time.perf_counter()
        small_c = tpu.compile_program(build, small, "v6e-64", retarget=meshes, **kw)
        t2 = time.perf_counter()
        diff = R.differences(direct, small_c)
        print(json.dumps({"case": name, "identical": not diff, "differences": {k: [str(a), str(b)] for k, (a, b) in
                                                                            diff.items()},
                          "direct": {**_summary(direct), "wall_s": round(t1 - t0, 1)},
                          "small_trace": {**_summary(small_c), "wall_s": round(t2 - t1, 1)}}), flush=True)


def pod_one(chips: int, shard_as: bool) -> None:
    """One compile in this fresh process: print its numbers as one JSON line."""
    t_start = time.perf_counter()
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.profile import tpu
    from shardlab.xla_scan.scale import seed_result

    fsdp = chips // TENSOR
    case = seed_case(fsdp, shard_as, trace_fsdp=2)
    t0 = time.perf_counter()
    outputs = case.graph()
    trace_s = time.perf_counter() - t0
    c = tpu.compile_tensors(outputs, tpu.topology_for(chips, "v6e"), retarget=((2, TENSOR), (fsdp, TENSOR)),
                            label=f"seed v6e-{chips} shard_as {shard_as}")
    res = seed_result(seed_case(fsdp, shard_as), c)
    print(json.dumps({"chips": chips, "shard_as": shard_as, "topology": c.topology, "trace_s": round(trace_s, 1),
                      "process_s": round(time.perf_counter() - t_start, 1),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "summary": _summary(c), "result": res.as_dict() if hasattr(res, "as_dict") else res.__dict__},
                     default=str), flush=True)


def pod(chips_list: list[int]) -> None:
    started = time.time()
    cached = json.loads(POD_FILE.read_text())["results"] if POD_FILE.exists() else {}
    for chips in chips_list:
        for on in (False, True):
            out = subprocess.run([sys.executable, __file__, "pod-one", str(chips), str(int(on))], capture_output=True,
                                 text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode or not lines:
                raise SystemExit(f"v6e-{chips} shard_as={on} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            row = json.loads(lines[-1])
            cached[f"v6e-{chips}.{'on' if on else 'off'}"] = row
            s = row["summary"]
            print(f"v6e-{chips} shard_as {'on ' if on else 'off'} fits={s['fits']} compile {s['compile_s']} s, "
                  f"trace {row['trace_s']} s, peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    source = {"command": "python tools/retarget_full_size.py pod --chips " + " ".join(map(str, chips_list)),
              "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
              "wall_s": round(time.time() - started, 1), "versions": _versions(), "cpus": os.cpu_count(),
              "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "machine": platform.machine(),
              "trace": "8 CPU devices, mesh (fsdp 2, tensor 4), shardings rewritten to (chips / 4, 4)"}
    POD_FILE.write_text(json.dumps({"_source": source, "results": dict(sorted(cached.items()))}, indent=1) + "\n")


def planner_one(key: str) -> None:
    """One pod-scale planner compile in this fresh process, merged into the cache; its numbers as one JSON line."""
    started = time.time()
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.planner import pod as PP
    from shardlab.profile.result_files import save_results

    cases = PP.pod_cases()
    if key not in cases:
        raise SystemExit(f"planner-one {key!r}: not a row of shardlab.planner.pod.POD {sorted(cases)}")
    r = PP.compile_retargeted(cases[key])
    r.host_peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cached, old = PP.load_pod() if PP.POD_FILE.exists() else ({}, {})
    cmd = f"python tools/retarget_full_size.py planner-one {key}"
    row_source = {"rows": [key], "command": cmd, "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                  "wall_s": round(time.time() - started, 1), "versions": _versions(), "cpus": os.cpu_count(),
                  "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "machine": platform.machine()}
    added = [a for a in old.get("added", []) if key not in a["rows"]] + [row_source]
    source = {"command": "python tools/retarget_full_size.py planner (each row: planner-one <row>, listed under "
                         "'added')", "measured": max(a["measured"] for a in added), "versions": _versions(),
              "trace": "8 CPU devices, mesh (data 1, fsdp 2, tensor 4), shardings rewritten to (1, chips / 4, 4)",
              "added": added}
    save_results(dict(sorted({**cached, key: r}.items())), PP.POD_FILE, **source)
    s = r.compiler
    print(json.dumps({"row": key, "compiler_fits": r.compiler_fits, "planner_no_flash_fits": r.planner_no_flash_fits,
                      "total": r.total, "arguments": s.get("arguments"), "outputs": s.get("outputs"),
                      "temp": s.get("temp"), "peak": s.get("peak"), "message": r.message, "compile_s": r.compile_s,
                      "trace_s": r.trace_s, "host_peak_bytes": r.host_peak_bytes,
                      "process_s": round(time.time() - started, 1)}), flush=True)


def planner_control() -> None:
    """The control compile of ``shardlab.planner.pod.CONTROL`` in this process, with its cost."""
    started = time.time()
    from shardlab import runtime

    runtime.setup(num_devices=8)
    from shardlab.planner import pod as PP
    from shardlab.profile.result_files import save_results

    r = PP.compile_control()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    key = f"{PP.CONTROL[0].rsplit('.', 1)[0]}.{PP.CONTROL[1]}"
    save_results({key: r}, PP.CONTROL_FILE, command="python tools/retarget_full_size.py planner-control",
                 measured=time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                 wall_s=round(time.time() - started, 1), versions=_versions(), cpus=os.cpu_count(),
                 load_avg_at_end=[round(x, 2) for x in os.getloadavg()], machine=platform.machine(),
                 host_peak_bytes=peak, trace=f"the step of {PP.CONTROL[0]}, traced on 8 CPU devices")
    print(json.dumps({"row": key, **r.as_dict(), "host_peak_bytes": peak}, default=str), flush=True)


def planner(keys: list[str]) -> None:
    from shardlab.planner.pod import POD

    for key in keys or list(POD):
        out = subprocess.run([sys.executable, __file__, "planner-one", key], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode or not lines:
            raise SystemExit(f"{key} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        print(lines[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("compare", "pod", "pod-one", "planner", "planner-one",
                                            "planner-control"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--inspect", action="store_true", help="compare: 12's Llama 3 8B step instead of 06's seed")
    ap.add_argument("--chips", nargs="*", type=int, default=[64, 128, 256], help="pod: slices (v6e-N chips)")
    a = ap.parse_args()
    if a.what == "compare":
        compare(a.inspect)
    elif a.what == "pod":
        pod(a.chips)
    elif a.what == "planner":
        planner(a.args)
    elif a.what == "planner-one":
        planner_one(a.args[0])
    elif a.what == "planner-control":
        planner_control()
    else:
        pod_one(int(a.args[0]), bool(int(a.args[1])))


if __name__ == "__main__":
    main()
