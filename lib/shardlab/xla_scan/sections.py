"""Notebook 06's sections: what the notebook measures beyond one case's views.

Design note: the cases (:mod:`shardlab.xla_scan.case`) say what one configuration is and how each view reads it;
these functions are the notebook's sections built on them — the compile-time sweep and the devices sweep, the
shard_as OFF/ON contrast and its layouts, per-layer gradient specs, the transposed mesh, the stacked-bytes lines,
the seed table, the ``nn.Linear`` trap, ``shard_as`` on its own, trace transfers and the explorer's run. Each records
its measurements on the notebook's :class:`Recorder` and returns a table to display. It imports the cases (and so
torch_xla): import it after ``shardlab.runtime.setup()`` (the notebooks' order).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from shardlab import runtime
from shardlab.core import harness
from shardlab.core.views import View, merge
from shardlab.formulas import scan as FS
from shardlab.profile import placeholders as PH
from shardlab.profile.record import Recorder
from shardlab.xla_scan import measure as X
from shardlab.xla_scan import model as M
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.case import (
    GRAD_OPS,
    MODES,
    SOURCE_LABEL,
    TRAP_KINDS,
    ScanCase,
    ShardAsCase,
    TrapCase,
    backward_reductions,
    grad_specs,
    mesh_problem,
)
from shardlab.xla_scan.params import ScanParams


def what_shard_as_changed(off: View, on: View, p: ScanParams) -> tuple[str, str]:
    """(reductions only the OFF program has, reductions only the ON program has) in the backward body, each a
    ``"<op> <axis>"`` string (several joined by ", "): the measured answer to "what did shard_as change"."""
    a = Counter(backward_reductions(off.detail.module, p.mesh_fsdp, p.mesh_tensor))
    b = Counter(backward_reductions(on.detail.module, p.mesh_fsdp, p.mesh_tensor))
    return ", ".join(sorted(set((a - b).elements()))), ", ".join(sorted(set((b - a).elements())))


# ------------------------------------------------------------------------------------------ compile sweep
def sweep_cases(p: ScanParams) -> list[ScanCase]:
    """Every mode at every L of ``p.layers_sweep`` (shard_as on): the compile-time sweep's cases."""
    return [ScanCase(p, layers=n, mode=mode) for n in sorted(set(p.layers_sweep)) for mode in MODES]


def record_sweep(rec: Recorder, sweep: list[tuple[ScanCase, View]]) -> pd.DataFrame | None:
    """Record the CPU compiler views of every (mode, L): compile / trace / execute seconds (timings), program size,
    parity with the loop oracle; check that pre-stacked scan's program is the same at every L and the others grow.
    A DataFrame of the rows (None, and a skip recorded, when the mesh does not tile this process)."""
    ran = [(c, v) for c, v in sweep if v.ran]
    if not ran:
        harness.record(rec, "scan", sweep[0][1] if sweep else View.skip("hlo", "no layers"))
        return None
    rows = []
    for c, v in sorted(ran, key=lambda cv: (cv[0].layers, MODES.index(cv[0].mode))):
        cap, name = v.detail, f"{c.mode}.L{c.layers}"
        ok, detail = v.checks["parity.hlo"]
        rec.check(f"parity.{name}", ok, detail)
        compile_s = harness.record_compile_s(rec, f"scan.compile_s.{name}", v).get("metrics", 0.0)
        execute_s = cap.metrics.execute_s
        rec.measure(f"scan.trace_s.{name}", c.trace["s"], "s", "timer", kind="timing")
        rec.measure(f"scan.execute_s.{name}", execute_s, "s", "metrics", kind="timing")
        size = rec.measure(f"scan.hlo_instructions.{name}", X.graph_size(cap.module), "instructions", "hlo")
        rows.append({"mode": c.mode, "layers": c.layers, "trace_s": c.trace["s"], "compile_s": compile_s,
                     "execute_s": execute_s, "hlo_instructions": size,
                     "hlo_instructions_raw": cap.module.instruction_count, "max_rel_err": detail.rsplit(" ", 1)[-1],
                     "stacked_grads.bytes": v.get("stacked_grads.bytes")})
    size = {m: [r["hlo_instructions"] for r in rows if r["mode"] == m] for m in MODES}
    rec.check("scan.hlo_instructions.scan.constant_in_L", len(set(size["scan"])) == 1, f"scan sizes {size['scan']}")
    if len(size["loop"]) > 1:
        for m in ("loop", "scan_layers"):
            grows = all(a < b for a, b in zip(size[m], size[m][1:], strict=False))
            rec.check(f"scan.hlo_instructions.{m}.grows_with_L", grows, f"{m} sizes {size[m]}")
    return pd.DataFrame(rows)


def devices_sweep(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame | None:
    """Compile time and program size of the scan step vs device count: one fresh process per count n, mesh
    (fsdp = n, tensor = 1). Records each point and checks that every count above 1 compiles the same program."""
    if not p.devices_sweep:
        print("devices_sweep=[]: skipped (each device count needs a fresh process, 10-30 s apiece); "
              "run with devices_sweep=[1, 2, 4, 8]")
        return None
    rows = []
    for d in X.compile_vs_devices(p, layers, "scan", tuple(p.devices_sweep)):
        n = d["num_devices"]
        rows.append({"devices": n, "compile_s": d["compile_s"], "hlo_instructions": d["hlo_instructions"]})
        rec.measure(f"scan.compile_s_vs_devices.scan.L{layers}.D{n}", d["compile_s"], "s", "metrics", kind="timing")
        rec.measure(f"scan.hlo_instructions_vs_devices.scan.L{layers}.D{n}", d["hlo_instructions"], "instructions",
                    "hlo")
    multi = {r["hlo_instructions"] for r in rows if r["devices"] > 1}
    rec.check("scan.hlo_instructions_vs_devices.same_program", len(multi) <= 1, str(rows))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ shard_as on / off
def shard_as_views(rec: Recorder, p: ScanParams, layout: str = "batch") -> tuple[dict[str, list[View]], pd.DataFrame]:
    """The pre-stacked scan at L = ``p.layers`` with shard_as on and off through the formula, XLA:CPU and XLA:TPU
    views, recorded as ``shard_as.<on|off>`` (``shard_as.seed_layout.<on|off>`` for the seed's layout):
    ``({"on": views, "off": views}, the recorded values side by side)``."""
    prefix = "shard_as" if layout == "batch" else f"shard_as.{layout}_layout"
    views, frames = {}, []
    for tag in ("on", "off"):
        case = ScanCase(p, p.layers, shard_as=tag == "on", layout=layout)
        views[tag] = harness.views(case, ("formula", "hlo", "tpu"))
        # the batch layout prints its notes and differences (record's default); the seed's, only the skips (its
        # differences are the orientation notes layout_notes prints once each)
        frames.append(harness.record(rec, f"{prefix}.{tag}", *views[tag], show=layout == "batch"))
        if layout != "batch":
            for v in views[tag]:
                if not v.ran:
                    print(f"[{v.source}] {prefix}.{tag} skipped: {v.skipped}")
    return views, pd.concat(frames, ignore_index=True)


def layout_frame(views: dict[str, list[View]]) -> pd.DataFrame:
    """Per compiler and shard_as: how each stacked gradient leaves the backward loop (per-device shape, 1-D / 2-D)
    and the reductions over fsdp that finish them — the compact table of :func:`shard_as_views`' result."""
    cols: dict[str, dict[str, Any]] = {}
    for tag in ("off", "on"):
        for v in views[tag]:
            if not v.ran:
                continue
            col = {}
            for w in M.WEIGHT_NAMES:
                col[f"{w} gradient"] = v.get(f"grad_shape.{w}", "1-D (either dim)") + \
                    (f" {v[f'grad_sharding.{w}']}" if f"grad_sharding.{w}" in v.values else "")
            for op in GRAD_OPS:
                n = v.get(f"grad_fsdp.{op}.operands", v.get(f"grad_fsdp.{op}.count"))
                col[f"{op.replace('_', '-')}s over fsdp"] = n
            col["stacked gradients B"] = v.get("stacked_grads.bytes")
            cols[f"{SOURCE_LABEL[v.source]} · {tag}"] = col
    return pd.DataFrame(cols, dtype=object)


def layout_notes(views: dict[str, list[View]]) -> None:
    """Print, once each, why a compiler view's value was recorded without being compared (the 1-D orientation, a
    gradient left 1-D although shard_as asked for 2-D)."""
    seen: set[str] = set()
    for tag in ("off", "on"):
        for v in views[tag]:
            for name, why in v.differs.items():
                if name.startswith(("grad_shape.", "grad_sharding.")) and why not in seen:
                    seen.add(why)
                    print(f"[{SOURCE_LABEL[v.source]}, shard_as {tag}] {why}")


def contrast(rec: Recorder, on: list[View], off: list[View]) -> pd.DataFrame:
    """Per compiler that ran: OFF/ON ratios recorded, "OFF holds more" checked, XLA:TPU compile seconds recorded;
    a DataFrame of on vs off. XLA:CPU: backward While state and buffer-assignment total; XLA:TPU: backward While
    state and program outputs (the stacked gradients leave the program as outputs)."""
    cols: dict[str, dict[str, Any]] = {}
    for v_on, v_off in zip(on, off, strict=True):
        if v_on.source not in ("hlo", "tpu") or not (v_on.ran and v_off.ran) or not v_on.get("stacked_grads.bytes"):
            continue
        src = v_on.source
        pairs = {"while_state": (v_off["while_state.bytes"], v_on["while_state.bytes"])}
        if src == "hlo":
            pairs["buffers.total"] = (v_off["buffers.total.bytes"], v_on["buffers.total.bytes"])
        else:
            pairs["outputs"] = (v_off.detail.memory.output, v_on.detail.memory.output)
            for tag, v in (("on", v_on), ("off", v_off)):
                harness.record_compile_s(rec, f"shard_as.{tag}.tpu_compile_s", v)
        for label, (a, b) in pairs.items():
            rec.measure(f"shard_as.off_on_ratio.{label}", a / b, "x", src)
            rec.check(f"shard_as.off_exceeds_on.{label}.{src}", a > b, f"off {a} B > on {b} B per device")
        for i, (tag, v) in enumerate((("off", v_off), ("on", v_on))):
            col = {k: v.get(k) for k in ("grad_shape.w_up", "grad_shape.w_down", "stacked_grads.bytes")}
            cols[f"{src} · {tag}"] = col | {f"{label} B": pair[i] for label, pair in pairs.items()}
    return pd.DataFrame(cols, dtype=object)


def layer_grad_specs(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame | None:
    """``scan_layers`` returns per-layer gradients: their W_up specs with shard_as on and off, recorded and checked
    (each layer's gradient tiled like its weight, or like it without the fsdp split). None when skipped."""
    size = {"fsdp": p.mesh_fsdp, "tensor": p.mesh_tensor}
    specs = {}
    for tag, flag in (("on", True), ("off", False)):
        view = harness.hlo(ScanCase(p, layers, mode="scan_layers", shard_as=flag))
        if not view.ran:
            return None
        specs[tag] = grad_specs(view)["w_up"]
        want = tuple(size[a] if flag or a != "fsdp" else 1 for a in S.WEIGHT_SPECS["w_up"])
        tiles = (all(S.parse_spec(sp, 2).tiles == want for sp in specs[tag]),
                 f"{specs[tag]}: want tiles {want} for every layer")
        view = View("hlo", {"layer_grad_spec": specs[tag][0]}, {"layer_grad_spec": "spec"},
                    checks={"layer_grad_tiles": tiles})
        harness.record(rec, f"shard_as.{tag}", view, show=False)
    return pd.DataFrame({"per-layer W_up gradient spec (scan_layers)": {k: v[0] for k, v in specs.items()},
                         "layers with this spec": {k: f"{v.count(v[0])} of {len(v)}" for k, v in specs.items()}})


def transposed(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame:
    """The same step on the transposed mesh (fsdp and tensor sizes swapped), compiled by XLA:TPU: the OFF/ON ratio
    of the stacked gradients is the fsdp size, so it changes. Formula vs tpu, recorded; a DataFrame."""
    q = replace(p, mesh_fsdp=p.mesh_tensor, mesh_tensor=p.mesh_fsdp)
    prefix = f"shard_as.mesh{q.mesh_fsdp}x{q.mesh_tensor}"
    views = {flag: harness.views(ScanCase(q, layers, shard_as=flag), ("formula", "tpu")) for flag in (True, False)}
    cols = {}
    for flag, (f, t) in views.items():
        tag = "on" if flag else "off"
        if f.ran and t.ran:
            harness.record(rec, f"{prefix}.{tag}", f, t, show=False)
        cols[f"shard_as {tag}"] = {"tpu grad_shape.w_up": t.get("grad_shape.w_up"),
                                   "tpu stacked_grads.bytes": t.get("stacked_grads.bytes")}
    t_on, t_off = views[True][1], views[False][1]
    for tag, v in (("on", t_on), ("off", t_off)):
        harness.record_compile_s(rec, f"{prefix}.{tag}.tpu_compile_s", v)
    if t_on.ran and t_off.ran and t_on.get("stacked_grads.bytes"):
        weights = list(M.weight_shapes(q.hidden, q.ffn).values())
        ratio = FS.shard_as_saving(layers, weights, q.mesh_fsdp, q.mesh_tensor).ratio
        harness.agree(rec, f"{prefix}.stacked_grads.ratio", "x", formula=ratio,
                      tpu=t_off["stacked_grads.bytes"] / t_on["stacked_grads.bytes"])
    else:
        print(f"[tpu] transposed mesh skipped: {t_on.skipped or t_off.skipped}")
    return pd.DataFrame(cols, dtype=object)


def stacked_bytes_lines(p: ScanParams, layers: list[int]) -> dict[str, list[tuple[int, int]]]:
    """The formula's stacked-gradient bytes per device at each L (``formula on`` / ``formula off``)."""
    out: dict[str, list[tuple[int, int]]] = {"formula on": [], "formula off": []}
    weights = list(M.weight_shapes(p.hidden, p.ffn).values())
    for L in layers:
        s = FS.shard_as_saving(L, weights, p.mesh_fsdp, p.mesh_tensor)
        out["formula on"].append((L, s.on_bytes))
        out["formula off"].append((L, s.off_bytes))
    return out


def stacked_bytes_points(sweep: list[tuple[ScanCase, View]], views: dict[str, list[View]]
                         ) -> dict[str, list[tuple[int, int]]]:
    """Measured stacked-gradient bytes per device: the CPU sweep's scan views (shard_as on, every L) and each
    compiler view's value at the views' L (``{"cpu on": [(L, bytes)], "tpu off": ...}``)."""
    points: dict[str, list[tuple[int, int]]] = {}
    for c, v in sweep:
        if c.mode == "scan" and v.ran:
            points.setdefault("cpu on", []).append((c.layers, v["stacked_grads.bytes"]))
    for tag, vs in views.items():
        for v in vs:
            if v.source in ("hlo", "tpu") and v.ran and v.get("stacked_grads.bytes"):
                L = int(v["grad_shape.w_up"].strip("[]").split(",")[0])
                label = f"{'cpu' if v.source == 'hlo' else 'tpu'} {tag}"
                if (L, v["stacked_grads.bytes"]) not in points.get(label, []):
                    points.setdefault(label, []).append((L, v["stacked_grads.bytes"]))
    return points


def seed_table(rec: Recorder, meshes: tuple[tuple[int, int], ...] = ((256, 1), (64, 4), (32, 8), (16, 16))
               ) -> pd.DataFrame:
    """The 405B seed's stacked gradient per chip on v6e-256 meshes, 1-D vs 2-D, as a share of usable HBM."""
    rows = []
    for f, t in meshes:
        c = FS.seed_case(fsdp=f, tensor=t, dtype="bfloat16")
        rows.append({"mesh (fsdp, tensor)": (f, t), "1-D shape/chip": c.one_d_shape,
                     "1-D GiB/chip": c.one_d_per_chip_bytes / 2**30, "2-D shape/chip": c.two_d_shape,
                     "2-D MiB/chip": c.two_d_per_chip_bytes / 2**20,
                     "1-D share of usable HBM": f"{c.one_d_fraction_of_hbm:.1%}"})
    c = FS.seed_case(64, 4)
    values = {"total.bytes": c.total_bytes, "mesh64x4.1d.bytes": c.one_d_per_chip_bytes,
              "mesh64x4.2d.bytes": c.two_d_per_chip_bytes}
    harness.record(rec, "shard_as.seed", View("formula", values, dict.fromkeys(values, "B"), checks={
        "1d_shape_is_reported_hlo_shape": (c.one_d_shape == (126, 4096, 16384), str(c))}), show=False)
    return pd.DataFrame(rows)


def linear_trap(p: ScanParams) -> list[View]:
    """``F.linear`` vs einsum on ``x[b_fsdp, s_tensor, h]``: the formula, CPU compiler and TPU compiler views,
    each holding both kinds (``linear.rows``, ``einsum.rows``, ``*.out_tiles``, ``*.collectives``)."""
    cases = [TrapCase(p, kind=k) for k in TRAP_KINDS]
    return [merge(*(view(c) for c in cases)) for view in (harness.formula, harness.hlo, harness.tpu)]


@dataclass
class ShardAsDemo:
    a_spec: str  # the annotated tensor
    b_spec_without: str  # b computed on its own (no annotation, no shard_as)
    b_spec_with: str  # b after shard_as(a, b)


def shard_as_demo(p: ScanParams) -> ShardAsDemo | None:
    """The sharding strings of a and of b without and with ``shard_as`` (CPU compiler); None when skipped here."""
    without, with_ = (harness.hlo(ShardAsCase(p, shard_as=flag)) for flag in (False, True))
    if not (without.ran and with_.ran):
        return None
    return ShardAsDemo(S.spec_of(with_.detail.result[0]), S.spec_of(without.detail.result[0]),
                       S.spec_of(with_.detail.result[-1]))


# ------------------------------------------------------------------------------------------ trace transfers
def placeholder_demo(rec: Recorder) -> str:
    """A 64 GiB placeholder: made without memory, lowered to an HLO parameter (never executed: that would crash
    torch_xla 2.9), read with a clear error — each checked; returns what was seen."""
    rss0 = PH.current_rss_bytes()
    big = PH.placeholder((1 << 34,))  # 2^34 float32 = 64 GiB
    grew_mib = (PH.current_rss_bytes() - rss0) / 2**20
    hlo = PH.lowered_hlo([big * 2.0])
    try:
        PH.read(big)
        error = None
    except PH.PlaceholderReadError as e:
        error = str(e)
    rec.check("placeholder.no_memory", grew_mib < 100, f"RSS grew {grew_mib:.1f} MiB for 64 GiB logical")
    rec.check("placeholder.lowers_to_parameter", "f32[17179869184]{0} parameter(" in hlo, hlo.splitlines()[0])
    rec.check("placeholder.read_error_is_clear", error is not None and "placeholder" in error, str(error))
    return f"logical {PH.logical_bytes(big) / 2**30:.0f} GiB, RSS grew {grew_mib:.1f} MiB\n{error}"


def record_trace(rec: Recorder, p: ScanParams) -> pd.DataFrame | None:
    """Host→device traffic of tracing one step at L = ``p.layers`` (``placeholder.trace.*``, source metrics): loop
    and scan with placeholders, scan without them at ``p.hidden`` and at each of ``p.placeholder_hiddens``
    (F = 4·h), against the formula; a DataFrame of the growth with hidden, or None (a skip recorded) when the mesh
    does not tile this process."""
    devices, L = runtime.current().num_devices, p.layers
    why = mesh_problem(p, devices)
    if why:
        harness.record(rec, "placeholder.trace", View.skip("metrics", why))
        return None
    runs = {"loop": X.trace_transfers(p, L, "loop", True), "scan": X.trace_transfers(p, L, "scan", True),
            "no_placeholder": X.trace_transfers(p, L, "scan", False, warm=False)}  # scan again: constants cached
    metrics = View("metrics", checks={"zero": (runs["scan"].h2d_bytes == 0 and runs["loop"].h2d_bytes == 0,
                                               f"scan {runs['scan'].h2d_bytes} B, loop {runs['loop'].h2d_bytes} B")})
    formula = View("formula")
    for k, t in runs.items():
        metrics.add(f"h2d.bytes.{k}", t.h2d_bytes, "B")
        metrics.add(f"ir_to_data.count.{k}", t.ir_value_to_data, "tensors")
    want = FS.block_trace_transfer(p.batch, p.seq, p.hidden, p.ffn, devices=devices, placeholders=False)
    off = runs["no_placeholder"]
    for v, (nbytes, count) in ((formula, (want.total_bytes, want.transfers)),
                               (metrics, (off.h2d_bytes, off.h2d_count))):
        v.add("h2d.bytes.no_placeholder.model", nbytes, "B")
        v.add("h2d.count.no_placeholder", count, "transfers")
    rows = []
    for h in sorted(set(p.placeholder_hiddens)):
        t = off if (h, 4 * h) == (p.hidden, p.ffn) else X.trace_transfers(replace(p, hidden=h, ffn=4 * h), L, "scan",
                                                                           False)
        f_off = FS.block_trace_transfer(p.batch, p.seq, h, 4 * h, devices=devices, placeholders=False).total_bytes
        formula.add(f"h2d.bytes.no_placeholder.H{h}", f_off, "B")
        metrics.add(f"h2d.bytes.no_placeholder.H{h}", t.h2d_bytes, "B")
        rows.append({"hidden": h, "ffn": 4 * h, "no placeholders h2d B (metrics)": t.h2d_bytes, "formula B": f_off})
    harness.record(rec, "placeholder.trace", formula, metrics, show=False)
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------------- explorer
def explore(p: ScanParams, fsdp: int, tensor: int, layers: int, hidden: int) -> dict[str, dict[str, Any]]:
    """The explorer's run: the scan step on mesh (fsdp, tensor) at (L, hidden) with shard_as on and off."""
    q = replace(p, mesh_fsdp=fsdp, mesh_tensor=tensor, hidden=hidden)
    res = {}
    for flag in (True, False):
        v = harness.hlo(ScanCase(q, layers, shard_as=flag))
        if not v.ran:
            raise ValueError(v.skipped)
        res["on" if flag else "off"] = {"w_up grad spec": v["grad_spec"], "stacked grads B": v["stacked_grads.bytes"],
                                        "while state B": v["while_state.bytes"], "buffers B": v["buffers.total.bytes"]}
    return res
