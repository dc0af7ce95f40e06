"""The planner's step time on its presets, beside the step time the XLA:TPU compiler gives the same training step.

Design note
-----------
The planner prices a step by formula (:func:`shardlab.planner.plan`): compute = hardware FLOPs per chip (6·N·tokens
+ attention 12·B·s²·h·L without a causal halving, + one more forward under full recompute) over the bf16 peak; comm
= each collective's ring wire bytes over the ICI links its group spans; step = max(compute, comm) — perfect
overlap; MFU = model FLOPs / (step · chips · peak). Here the same plan is compiled: the planner's own verdict step
(:class:`shardlab.planner.verdict.VerdictCase`: embedding, ``scan`` over the decoder layers, LM head, fp32 loss,
backward with full recompute, AdamW donated), traced on 8 CPU devices and retargeted to the slice
(:mod:`shardlab.planner.pod`'s route), and priced by :func:`shardlab.profile.step_time.step_time` — the compiler's
per-kernel estimates × loop trip counts for compute, each collective's wire time per mesh axis, and the part of it
no kernel scheduled in its window hides.

The rows (:data:`ROWS`), the planner's own settings, two generations or more per model size where they fit:

    row                       mesh (data, fsdp, tensor)  batch x seq   why
    llama-3-8b.v6e-64         (1, 16, 4)                 16 x 8192     the planner's verdict-matrix row that fits
    llama-3-8b.v5e-64         (1, 16, 4)                 16 x 8192     the same plan one generation down
    llama-3-70b.v6e-256       (1, 64, 4)                 64 x 8192     notebook 07's pod row (planner.pod)
    llama-3-70b.v5p-256       (1, 32, 4)                 32 x 8192     the pod row on v5p (128 chips)
    llama-3.1-405b.v6e-256    (1, 64, 4)                 64 x 8192     the seed's slice and 2-D mesh (notebook 06)

8 chips with fsdp 8 (the planner's default) is not a row: the traced step has no flash kernel, and one
8192-token sequence per chip holds [32, s, s] fp32 score arrays the v5e / v6e chip cannot (the verdict matrix's
8B rows are out of memory). Tensor 4 divides the heads and the arrays by 4.

**Depth.** A row is compiled at full depth when it fits; 405B does not (:data:`EXTRAPOLATED`), so it is compiled
at 2 and 4 layers (scan) and every time term extrapolated along the line through the two (``timing.published``'s
route). Measured on 405B: compute(4) − compute(2) is 1.2 % above 2 × the scanned body's estimate — the rest is the
AdamW update of the two extra layers' stacked weights, outside the loop, which the line carries too. ``how`` says
which.

**What the ratio compares.** ratio = compiler step / planner step (the compiler's step: its kernels' estimates +
exposed communication, + the roofline of any kernel it gave no estimate — ``StepTime.saturated``, kept as a
separate derived column) (> 1: the planner is optimistic); MFU for both
from the planner's model FLOPs, so the MFU ratio is its inverse. Term by term: the compiler's compute against the
planner's FLOP roofline (the difference is kernel efficiency and the elementwise / HBM-bound kernels the planner
does not count), and each mesh axis' wire time from the program's collectives against the planner's comm terms of
that axis; the planner's step assumes perfect overlap, the compiler's adds what its schedule leaves exposed.
Attention here is traced (no flash kernel): the compiled program computes the full [s, s] score matrix, as the
planner's FLOP count does (no causal halving).

The compiles take minutes (``tools/planner_presets_time.py``, one per process); the results are cached in
``data/time/planner_presets.json`` and notebook 07 reads the cache. :data:`STAND_IN` is a tiny model through the
same code path that compiles in seconds (the test recompiles it and requires the cached entry).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from shardlab.formulas import hardware as hw
from shardlab.planner import MESH_AXES, Plan, PlanConfig, comm_seconds, plan

CACHE_FILE = Path(__file__).resolve().parents[3] / "data" / "time" / "planner_presets.json"
TRACE_DEVICES = 8
DEPTHS = (2, 4)  # the scan-linearity route's layer counts
MESH = ("data", "fsdp", "tensor")  # the verdict step's device mesh, row-major
ROWS: dict[str, dict[str, Any]] = {
    "llama-3-8b.v6e-64": dict(model="llama-3-8b", topology="v6e-64", fsdp=16, tensor=4, global_batch=16, seq=8192),
    "llama-3-8b.v5e-64": dict(model="llama-3-8b", topology="v5e-64", fsdp=16, tensor=4, global_batch=16, seq=8192),
    # planner.pod's rows (the same dicts; not imported: that module imports torch_xla)
    "llama-3-70b.v6e-256": dict(model="llama-3-70b", topology="v6e-256", fsdp=64, tensor=4, global_batch=64,
                                seq=8192),
    "llama-3-70b.v5p-256": dict(model="llama-3-70b", topology="v5p-256", fsdp=32, tensor=4, global_batch=32,
                                seq=8192),
    "llama-3.1-405b.v6e-256": dict(model="llama-3.1-405b", topology="v6e-256", fsdp=64, tensor=4, global_batch=64,
                                   seq=8192),
}
# compiled at 2 and 4 layers, not at full depth: the planner's no-flash total is 77 GB per chip on v6e (2.3x its
# usable HBM: 48.8 GB of kept activations, 19 GB of AdamW state); a full-depth compile would report out of memory
EXTRAPOLATED = ("llama-3.1-405b.v6e-256",)
TINY = {"name": "tiny", "layers": 2, "hidden": 256, "ffn": 512, "heads": 8, "kv_heads": 4, "vocab": 1024}
STAND_IN: dict[str, dict[str, Any]] = {
    "tiny.v5e-8": dict(model=TINY, topology="v5e-8", fsdp=2, tensor=4, global_batch=4, seq=256)}
ALL = {**ROWS, **STAND_IN}


def config(key: str) -> PlanConfig:
    if key not in ALL:
        raise ValueError(f"row={key!r} must be one of {sorted(ALL)}")
    return PlanConfig(**ALL[key])


def mesh(cfg: PlanConfig) -> dict[str, int]:
    return {a: getattr(cfg, a) for a in MESH}


# ------------------------------------------------------------------------------------------------ the planner
def planner_terms(p: Plan) -> dict[str, Any]:
    """The planner's step-time terms: FLOP-roofline compute, wire time per mesh axis, step (perfect overlap), MFU,
    and the FLOPs and chip figures they come from."""
    chip = hw.chip(p.chip)
    by_axis: dict[str, float] = {}
    for t in p.comm:
        by_axis[t.axis] = by_axis.get(t.axis, 0.0) + comm_seconds([t], p.ici_axes, chip)
    return {"compute_s": p.roofline.compute_s, "comm_s": p.roofline.comm_s, "comm_by_axis": by_axis,
            "step_s": p.roofline.step_s, "mfu": p.mfu, "model_flops": p.flops.model,
            "hardware_flops": p.flops.hardware, "chips": p.chips, "peak_flops_per_s": chip.bf16_peak_flops_per_s,
            "bound": p.roofline.bound,
            # the [s, s] score and value matmuls' share of the compute (forward, backward, and the recomputed forward)
            "attention_s": p.flops.attention * (4 / 3 if p.config.recompute == "full" else 1) / p.chips
            / chip.bf16_peak_flops_per_s}


# ------------------------------------------------------------------------------------------------ the compiler
def compile_row(key: str, layers: int | None = None, keep_hlo: Path | None = None) -> dict[str, Any]:
    """Compile row ``key``'s verdict step (at ``layers`` instead of the model's when given) for its slice, traced on
    this process's 8 devices (retargeted when the slice has more), and price it. Numbers only."""
    from shardlab.planner.pod import compile_step
    from shardlab.planner.verdict import VerdictCase

    cfg = config(key)
    case = VerdictCase(cfg, layers)
    trace_fsdp = TRACE_DEVICES // (cfg.data * cfg.tensor)
    if cfg.data * trace_fsdp * cfg.tensor != TRACE_DEVICES or cfg.fsdp % trace_fsdp:
        raise ValueError(f"{key}: data={cfg.data} x tensor={cfg.tensor} must divide the {TRACE_DEVICES} trace "
                         "devices and leave an fsdp degree dividing the row's")
    t0 = time.perf_counter()
    c, small, big = compile_step(case, trace_fsdp=trace_fsdp, label=f"planner time {key}")
    out: dict[str, Any] = {"row": key, "layers": layers, "fits": c.fits, "compile_s": c.compile_s,
                           "wall_s": time.perf_counter() - t0, "trace_mesh": list(small), "target_mesh": list(big),
                           "oom": c.oom.first_line if c.oom else ""}
    if c.module is None:
        return out
    if keep_hlo is not None and c.hlo_text:  # the per-chip program, to re-read without a compile
        import gzip

        keep_hlo.mkdir(parents=True, exist_ok=True)
        with gzip.open(keep_hlo / f"{key}.{layers or 'full'}.hlo.txt.gz", "wt") as fh:
            fh.write(c.hlo_text)
    out.update(price(key, c.module))
    out["program_flops"] = c.cost.get("flops")
    return out


def price(key: str, module: Any) -> dict[str, Any]:
    """Row ``key``'s compiled per-chip program priced: the step's terms, its bound, one execution of the scanned
    body, the exposed wire per axis, the compute split by kernel kind, the costliest kernels."""
    from shardlab.profile.step_time import step_time

    cfg = config(key)
    chip = hw.slice_chips(cfg.topology)[0]
    t = step_time(module, cfg.topology, mesh(cfg))
    body = [k for k in t.kernels if k.runs > 1]
    return {"step": t.as_dict(), "hbm_bound_s": t.hbm_bound_s(chip), "bound": t.bound(chip),
            "loop_body_s": sum(k.cycles for k in body) / t.clock_hz,
            "exposed_by_axis": _exposed_by_axis(t), "compute_split": compute_split(t, module, cfg, chip),
            "kernels_top": [{"name": k.name, "s": k.seconds(t.clock_hz), "runs": k.runs, "flops": k.flops,
                             "bytes": k.bytes} for k in sorted(t.kernels, key=lambda k: -k.seconds(t.clock_hz))[:8]]}


def reprice(hlo_dir: Path, path: Path = CACHE_FILE) -> list[str]:
    """Re-price every cached compile whose program was kept (``<row>.<layers|full>.hlo.txt.gz`` in ``hlo_dir``)
    with today's :func:`price`, without a compile; rebuild the rows. Returns what was updated."""
    import gzip

    from shardlab.profile.hlo import parse_hlo

    data, done = load(path), []
    for key, comps in data.get("compiles", {}).items():
        for depth, res in comps.items():
            f = hlo_dir / f"{key}.{'full' if depth == 'full' else depth[1:]}.hlo.txt.gz"
            if res.get("fits") and f.exists():
                with gzip.open(f, "rt") as fh:
                    res.update(price(key, parse_hlo(fh.read())))
                res.setdefault("_source", {})["repriced"] = f"today's pricing on the kept program {f.name}"
                done.append(f"{key}.{depth}")
        data["rows"][key] = row(key, comps)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return done


def compute_split(t: Any, module: Any, cfg: PlanConfig, chip: hw.ChipProfile) -> dict[str, dict[str, float]]:
    """The compiler's compute by kind of kernel, all runs: ``attention [s, s]`` (a kernel touching the traced
    attention's per-chip scores, probabilities or their gradients: an array [..., s, s] whose leading dims hold
    this chip's b · a / t sequences × heads — not a [h, h] weight when h = s), ``matmul`` (the other kernels with
    dot FLOPs, their fused elementwise work included) and ``other`` (elementwise, norms, copies, the optimizer) —
    each with the compiler's estimate, its roofline and its dot FLOPs; ``derived_s``: the roofline of that kind's
    kernels the compiler gave no estimate (``StepTime.saturated``)."""
    from shardlab.planner import model_from
    from shardlab.profile.step_time import kernel_estimates

    m, s = model_from(cfg.model), cfg.seq
    lead = cfg.global_batch // (cfg.data * cfg.fsdp) * m.heads // cfg.tensor  # [b, a/t] per chip
    out = {p: {"estimate_s": 0.0, "roofline_s": 0.0, "flops": 0.0, "derived_s": 0.0}
           for p in ("matmul", "attention [s, s]", "other")}

    def kind(k: Any) -> str:
        square = any(i.shape and len(i.shape[0].dims) >= 3 and tuple(i.shape[0].dims[-2:]) == (s, s)
                     and math.prod(i.shape[0].dims[:-2]) == lead for i in module.executed(k.name))
        return "attention [s, s]" if square else "matmul" if k.flops else "other"

    for k in t.kernels:
        part = out[kind(k)]
        part["estimate_s"] += k.seconds(t.clock_hz)
        part["roofline_s"] += k.roofline_s(chip)
        part["flops"] += float(k.flops * k.runs)
    for k in kernel_estimates(module, saturated=True)[0]:
        out[kind(k)]["derived_s"] += k.roofline_s(chip)
    return out


def _exposed_by_axis(t: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in t.collectives:
        key = c.mesh_axes or f"torus{c.torus_axes}"
        out[key] = out.get(key, 0.0) + c.exposed_s
    return out


# ------------------------------------------------------------------------------------------------ the row
TERMS = ("compute_s", "comm_s", "exposed_comm_s", "step_s", "derived_s", "predicted_s")


def _terms(st: dict[str, Any]) -> dict[str, float]:
    """A priced program's time terms; ``derived_s``: the roofline of the kernels it gave no estimate
    (``StepTime.saturated_roofline_s`` + ``unpriced_roofline_s``), ``predicted_s`` = ``step_s`` + that."""
    derived = st.get("unpriced_roofline_s", 0.0) + st.get("saturated_roofline_s", 0.0)
    return {"compute_s": st["compute_s"], "comm_s": st["comm_s"], "exposed_comm_s": st["exposed_comm_s"],
            "step_s": st["step_s"], "derived_s": derived, "predicted_s": st["step_s"] + derived}


def compiler_terms(entries: dict[str, dict[str, Any]], layers: int) -> tuple[dict[str, Any], str] | None:
    """The compiler's terms at ``layers`` from a row's compiles (``"full"`` or ``"L<k>"`` -> result): the full-depth
    compile when it fits, else the line through the two shallow ones. None when neither is there."""
    full = entries.get("full")
    if full and full.get("step"):
        st = full["step"]
        return ({**_terms(st), "comm_by_axis": dict(st["comm_by_axis"]),
                 "exposed_by_axis": dict(full["exposed_by_axis"]), "bound": full["bound"],
                 "split": _split(full)},
                f"compiled at {layers} layers")
    a, b = (entries.get(f"L{d}") for d in DEPTHS)
    if not (a and b and a.get("step") and b.get("step")):
        return None
    d0, d1 = DEPTHS

    def line(x: float, y: float) -> float:
        return x + (y - x) * (layers - d0) / (d1 - d0)

    ta, tb = _terms(a["step"]), _terms(b["step"])
    out: dict[str, Any] = {f: line(ta[f], tb[f]) for f in TERMS}
    for part in ("comm_by_axis", "exposed_by_axis"):
        src_a = a["step"][part] if part == "comm_by_axis" else a[part]
        src_b = b["step"][part] if part == "comm_by_axis" else b[part]
        out[part] = {k: line(src_a.get(k, 0.0), src_b.get(k, 0.0)) for k in sorted(set(src_a) | set(src_b))}
    out["bound"] = b["bound"]
    sa, sb = _split(a), _split(b)
    out["split"] = {k: line(sa[k], sb[k]) for k in sa if k in sb}
    return out, f"extrapolated from {d0} and {d1} layers (scan)"


def _split(res: dict[str, Any]) -> dict[str, float]:
    """A compile's compute split: seconds per kind, and ``attention derived`` (its unestimated kernels' roofline)."""
    sp = res.get("compute_split", {})
    out = {k: v["estimate_s"] for k, v in sp.items()}
    if sp:
        out["attention derived"] = sp["attention [s, s]"].get("derived_s", 0.0)
    return out


def row(key: str, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Planner vs compiler for row ``key``: both sides' terms, MFU from the planner's model FLOPs, the ratio."""
    p = plan(config(key))
    pl = planner_terms(p)
    out: dict[str, Any] = {"row": key, "planner": pl, "config": _config_dict(config(key))}
    got = compiler_terms(entries, p.model.layers)
    if got is None:
        out.update({"compiler": None, "how": "not compiled", "ratio": None})
        return out
    co, how = got
    co["mfu"] = pl["model_flops"] / (co["predicted_s"] * pl["chips"] * pl["peak_flops_per_s"])
    out.update({"compiler": co, "how": how, "ratio": co["predicted_s"] / pl["step_s"]})
    sp = co.get("split") or {}
    if sp:  # what-if, not a measurement: the traced attention's kernels replaced by its FLOPs at the bf16 peak
        co["attention_at_roofline_s"] = (co["predicted_s"] - sp["attention [s, s]"] - sp["attention derived"]
                                         + pl["attention_s"])
        out["ratio_attention_at_roofline"] = co["attention_at_roofline_s"] / pl["step_s"]
    return out


def _config_dict(cfg: PlanConfig) -> dict[str, Any]:
    m = cfg.model
    return {"model": m if isinstance(m, str) else dict(m), "topology": cfg.topology,
            **{a: getattr(cfg, a) for a in MESH_AXES if getattr(cfg, a) != 1 or a in MESH},
            "global_batch": cfg.global_batch, "seq": cfg.seq, "recompute": cfg.recompute}


# ------------------------------------------------------------------------------------------------ the cache
def load(path: Path = CACHE_FILE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"compiles": {}, "rows": {}}


def store_compile(key: str, depth: str, result: dict[str, Any], source: dict[str, Any],
                  path: Path = CACHE_FILE) -> dict[str, Any]:
    """Merge one compile (``depth``: "full" or "L<k>") and rebuild the row from the cached compiles."""
    data = load(path)
    data.setdefault("compiles", {}).setdefault(key, {})[depth] = {**result, "_source": source}
    data.setdefault("rows", {})[key] = row(key, data["compiles"][key])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data["rows"][key]


def rows(data: dict[str, Any], keys: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The cached rows (``ROWS`` order), each rebuilt from its cached compiles with today's planner."""
    return [row(k, data.get("compiles", {}).get(k, {})) for k in (keys or tuple(ROWS))]


def frame(rs: list[dict[str, Any]]) -> Any:
    """One line per row: the planner's and the compiler's compute, wire per axis, exposed, step, MFU, ratio."""
    import pandas as pd

    lines = []
    for r in rs:
        pl, co = r["planner"], r["compiler"] or {}
        axes = sorted(set(pl["comm_by_axis"]) | set(co.get("comm_by_axis", {})))
        lines.append({
            "row": r["row"], "how": r["how"],
            "planner compute s": pl["compute_s"], "of it attention s": pl["attention_s"],
            "compiler compute s": co.get("compute_s"),
            **{f"compiler {k} s": v for k, v in co.get("split", {}).items()},
            "planner wire s": "; ".join(f"{a} {pl['comm_by_axis'].get(a, 0):.3f}" for a in axes),
            "compiler wire s": "; ".join(f"{a} {co['comm_by_axis'].get(a, 0):.3f}" for a in axes) if co else "–",
            "compiler exposed s": "; ".join(f"{a} {v:.3f}" for a, v in co.get("exposed_by_axis", {}).items()),
            "compiler derived s": co.get("derived_s"),
            "planner step s": pl["step_s"], "compiler step s": co.get("predicted_s"),
            "planner MFU": pl["mfu"], "compiler MFU": co.get("mfu"),
            "ratio (compiler / planner)": r["ratio"],
            "ratio, attention at its FLOP roofline (what-if)": r.get("ratio_attention_at_roofline"),
            "compiler bound": co.get("bound"),
        })
    return pd.DataFrame(lines).set_index("row")


def why(r: dict[str, Any]) -> str:
    """The ratio term by term, in words, from the row's numbers."""
    pl, co = r["planner"], r["compiler"]
    if co is None:
        return f"{r['row']}: not compiled"
    comm = ", ".join(f"{a} {co['comm_by_axis'].get(a, 0.0):.3f} vs {pl['comm_by_axis'].get(a, 0.0):.3f} s"
                     for a in sorted(set(pl["comm_by_axis"]) | set(co["comm_by_axis"])))
    sp = co.get("split", {})
    parts = (f" — matmul kernels (with what is fused into them) {sp['matmul']:.2f} s vs the planner's "
             f"{pl['compute_s'] - pl['attention_s']:.2f} s for the weights' FLOPs; the traced attention's [s, s] "
             f"kernels {sp['attention [s, s]']:.2f} s"
             + (f" (+ {sp['attention derived']:.2f} s derived)" if sp.get("attention derived") else "")
             + f" vs its {pl['attention_s']:.2f} s of attention FLOPs at peak; "
             f"other kernels (elementwise, norms, copies, the optimizer) {sp['other']:.2f} s, which the planner does "
             "not count" if sp else "")
    return (f"**{r['row']}** ({r['how']}): compute {co['compute_s']:.2f} s vs the planner's FLOP roofline "
            f"{pl['compute_s']:.2f} s ({co['compute_s'] / pl['compute_s']:.2f}×){parts}; wire per axis, compiler vs "
            "planner: "
            f"{comm}; exposed {co['exposed_comm_s']:.3f} s (the planner assumes full overlap)"
            + (f"; kernels the compiler gave no estimate, at their roofline (derived): {co['derived_s']:.3f} s"
               if co["derived_s"] else "")
            + f"; step {co['predicted_s']:.2f} vs {pl['step_s']:.2f} s — ratio {r['ratio']:.2f}, MFU "
            f"{co['mfu']:.3f} vs {pl['mfu']:.3f}; the compiler's bound: {co['bound']}"
            + (f"; with the attention kernels replaced by their FLOPs at peak (a what-if) the ratio would be "
               f"{r['ratio_attention_at_roofline']:.2f}" if "ratio_attention_at_roofline" in r else "") + ".")


def compiled_or_cached(rec: Any, live: bool) -> tuple[list[dict[str, Any]], str]:
    """The rows from the cache (or compiled now, ``live``: tens of minutes), recorded and checked:
    ``planner.time.<row>.ratio`` and ``.step_s`` [tpu], the planner's ``.step_s`` [formula]."""
    data = load()
    if live:
        for key in ROWS:
            depths = [str(d) for d in DEPTHS] if key in EXTRAPOLATED else ["full"]
            for depth in depths:
                res = compile_row(key, None if depth == "full" else int(depth))
                data.setdefault("compiles", {}).setdefault(key, {})[depth if depth == "full" else f"L{depth}"] = res
        about = "compiled now"
    else:
        srcs = [c.get("_source", {}) for r in data.get("compiles", {}).values() for c in r.values()]
        libtpu = sorted({str(s.get("versions", {}).get("libtpu", "?")) for s in srcs})
        about = (f"compiler numbers cached in data/time/planner_presets.json (tools/planner_presets_time.py all; "
                 f"libtpu {', '.join(libtpu) or '?'}); the planner's side computed now")
        rec.note("planner.time", f"step-time compiles not run (full_size=False); {about}")
    rs = rows(data)
    for r in rs:
        name = f"planner.time.{r['row']}"
        rec.measure(f"{name}.step_s", r["planner"]["step_s"], "s", "formula")
        if r["compiler"] is None:
            continue
        rec.measure(f"{name}.step_s", r["compiler"]["predicted_s"], "s", "tpu")
        rec.measure(f"{name}.ratio", r["ratio"], "1", "tpu")
        rec.check(f"{name}: the ratio is the compiler's step over the planner's, MFU their inverse ratio",
                  check_ratio(r) and math.isclose(r["planner"]["mfu"] / r["compiler"]["mfu"], r["ratio"],
                                                  rel_tol=1e-9), f"ratio {r['ratio']:.4f}")
        co = r["compiler"]
        rec.check(f"{name}: the compiler's step is its compute + its exposed wire (+ a derived term), each >= 0",
                  math.isclose(co["predicted_s"], co["compute_s"] + co["exposed_comm_s"] + co["derived_s"],
                               rel_tol=1e-9) and min(co["exposed_comm_s"], co["derived_s"]) >= 0, "")
    split = [r for r in rs if r["compiler"] and r["compiler"].get("split")]
    rec.check("planner.time: the traced attention's kernels are the largest part of the gap on every row with a split "
              "(more than the matmul kernels' excess over the planner's weight FLOPs)",
              all(r["compiler"]["split"]["attention [s, s]"] + r["compiler"]["split"]["attention derived"]
                  - r["planner"]["attention_s"]
                  > r["compiler"]["split"]["matmul"] - (r["planner"]["compute_s"] - r["planner"]["attention_s"])
                  for r in split) and len(split) > 0, f"{len(split)} rows")
    rec.check("planner.time: the planner is optimistic on every compiled row, and exposed wire is under 10 % of "
              "each compiler step",
              all(r["ratio"] > 1 and r["compiler"]["exposed_comm_s"] < 0.1 * r["compiler"]["predicted_s"]
                  for r in rs if r["compiler"]), "")
    return rs, about


def check_ratio(r: dict[str, Any]) -> bool:
    """The stored ratio is the compiler's step over the planner's, of the row's own terms."""
    co = r["compiler"]
    return co is not None and math.isclose(r["ratio"], co["predicted_s"] / r["planner"]["step_s"], rel_tol=1e-12)


__all__ = ["ALL", "CACHE_FILE", "ROWS", "STAND_IN", "check_ratio", "compile_row", "compiler_terms", "config",
           "price", "reprice", "compiled_or_cached", "frame", "load", "planner_terms", "row", "rows", "store_compile",
           "why"]
