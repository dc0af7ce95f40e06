"""Figures and tables of notebook 08 (compiler levers): timings and their α–β fit, the bucket curve, memory profiles
of operator orders, TPU schedules with and without the latency-hiding scheduler, the layout search; and the
tables that put the levers' numbers side by side (off vs on) — plain values in, a DataFrame or a figure out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlab.core.views import View
from shardlab.levers.case import OFF, logical
from shardlab.levers.combine import AlphaBeta, CombinePoint, combining_saving_s
from shardlab.profile.order import Extremes, Profile
from shardlab.profile.tpu_memory import TpuMemory
from shardlab.viz.common import PALETTE, REPLICATED

KIND_COLOR = {"matmul": PALETTE[0], "collective-start": PALETTE[3], "collective-done": PALETTE[7],
              "collective": PALETTE[4], "other": REPLICATED}


def mib(b: float | None) -> float | None:
    return None if b is None else round(b / 2**20, 2)


# ------------------------------------------------------------------------------------------------ combining
def combining_summary(views: Mapping[str, View]) -> pd.DataFrame:
    """One row per collective kind: count (and operands) per program — formula, XLA:CPU, XLA:TPU with its
    combiners on and off (``levers.case.combining``'s views)."""
    columns = {"formula": ("formula", ""), "XLA:CPU": ("hlo", ""), "XLA:TPU": ("tpu", ""),
               "XLA:TPU combiners off": ("tpu", OFF)}
    ops = [k.removesuffix(".count") for k in views["formula"].values if k.endswith(".count")]
    rows = []
    for op in ops:
        row: dict[str, Any] = {"collective": op.replace("_", "-")}
        for label, (source, suffix) in columns.items():
            v = views.get(source)
            if v is None or not v.ran or f"{op}.count{suffix}" not in v.values:
                continue
            count, operands = v[f"{op}.count{suffix}"], logical(v, op, suffix)
            row[label] = f"{count}" if operands == count else f"{count} (carrying {operands})"
        rows.append(row)
    return pd.DataFrame(rows)


def fit_text(fit: AlphaBeta, spread: Mapping[str, Mapping[str, float]]) -> str:
    """One line: α, β, the fit's quality and α's range over the repeats."""
    lo, hi = (spread.get("alpha_s", {}).get(k, float("nan")) * 1e6 for k in ("min", "max"))
    return (f"α = {fit.alpha_s * 1e6:.1f} µs per call, β = {fit.beta_Bps / 1e9:.3f} GB/s payload; "
            f"R² = {fit.r2:.3f}, relative RMS residual {fit.rel_rms:.0%} over {fit.points} points; "
            f"α over the repeats: {lo:.0f}–{hi:.0f} µs")


def timing_table(points: Sequence[CombinePoint], fit: AlphaBeta) -> pd.DataFrame:
    """Each timed point (m calls carrying n elements): median / min / max, the α–β model, and m calls against the
    fewest calls of that n."""
    fewest = {n: min((q for q in points if q.numel == n), key=lambda q: q.calls).timing.median_s
              for n in {q.numel for q in points}}
    return pd.DataFrame([{"n": pt.numel, "m": pt.calls, "median ms": pt.timing.median_s * 1e3,
                          "min ms": pt.timing.min_s * 1e3, "max ms": pt.timing.max_s * 1e3,
                          "model ms": fit.time_s(pt.calls, pt.payload_bytes) * 1e3,
                          "m calls / fewest": pt.timing.median_s / fewest[pt.numel]} for pt in points])


def saving_table(combine: Mapping[str, Mapping[str, View]], fit: AlphaBeta) -> pd.DataFrame:
    """Per step and collective: the logical m collectives and the TPU's m′ calls priced by the α–β model."""
    rows = []
    for mode, views in combine.items():
        tpu = views.get("tpu")
        if tpu is None or not tpu.ran:
            continue
        for op in [k.removesuffix(".count") for k in views["formula"].values if k.endswith(".count")]:
            m, m2 = logical(tpu, op), tpu.get(f"{op}.count")
            if m and m2:
                nbytes = tpu[f"{op}.bytes"]
                rows.append({"step": mode, "collective": op, "logical m": m, "TPU calls m′": m2,
                             "model ms, m calls": fit.time_s(m, nbytes) * 1e3,
                             "model ms, m′ calls": fit.time_s(m2, nbytes) * 1e3,
                             "saving ms": combining_saving_s(fit, m, m2) * 1e3})
    return pd.DataFrame(rows)


def timing_figure(points: Sequence[CombinePoint], fit: AlphaBeta | None,
                  title: str = "m all-reduces of n/m elements (gloo)") -> go.Figure:
    """Median time (with min-max bars) against m, one line per total size n; dashed: the α–β model."""
    fig = go.Figure()
    for i, n in enumerate(sorted({p.numel for p in points})):
        pts = sorted((p for p in points if p.numel == n), key=lambda p: p.calls)
        ks = [p.calls for p in pts]
        med = [p.timing.median_s * 1e3 for p in pts]
        fig.add_scatter(x=ks, y=med, mode="markers+lines", name=f"n = {n} (measured)", line_color=PALETTE[i],
                        error_y=dict(type="data", symmetric=False,
                                     array=[(p.timing.max_s - p.timing.median_s) * 1e3 for p in pts],
                                     arrayminus=[(p.timing.median_s - p.timing.min_s) * 1e3 for p in pts]))
        if fit is not None:
            fig.add_scatter(x=ks, y=[fit.time_s(k, n * 4) * 1e3 for k in ks], mode="lines",
                            name=f"n = {n} (α–β model)", line=dict(color=PALETTE[i], dash="dash"))
    fig.update_layout(title=title, xaxis_title="m (calls)", yaxis_title="ms", xaxis_type="log",
                      yaxis_type="log", height=380)
    return fig


def bucket_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """All-reduces (formula and ledger) and the α–β time against the bucket size."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [max(r["bucket_bytes"], 1) for r in rows]
    fig.add_scatter(x=x, y=[r["formula"] for r in rows], name="all-reduces (formula)", mode="lines",
                    line_color=PALETTE[0])
    fig.add_scatter(x=x, y=[r["ledger"] for r in rows], name="all-reduces (ledger)", mode="markers",
                    marker=dict(color=PALETTE[0], size=9, symbol="circle-open"))
    if rows and rows[0].get("model_ms") is not None:
        fig.add_scatter(x=x, y=[r["model_ms"] for r in rows], name="α–β time (ms)", mode="lines+markers",
                        line=dict(color=PALETTE[3], dash="dot"), secondary_y=True)
    fig.update_xaxes(type="log", title="bucket size (bytes)")
    fig.update_yaxes(title="all-reduces", secondary_y=False)
    fig.update_yaxes(title="ms (model)", secondary_y=True)
    fig.update_layout(title="Hand-made buckets: fewer, larger all-reduces", height=360)
    return fig


# -------------------------------------------------------------------------------------------------- overlap
def window_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``overlap.exposed``'s per-collective rows summed per (op, form): collectives, the torus axes their groups
    span (most), bytes, matmuls in their windows, communication and exposed µs."""
    win = pd.DataFrame(rows, columns=["collective", "op", "form", "axes", "bytes", "matmuls_between", "comm_s",
                                      "exposed_s"])
    return win.groupby(["op", "form"]).agg(collectives=("collective", "count"), axes=("axes", "max"),
                                           bytes=("bytes", "sum"),
                                           matmuls_between=("matmuls_between", "sum"),
                                           comm_us=("comm_s", lambda s: s.sum() * 1e6),
                                           exposed_us=("exposed_s", lambda s: s.sum() * 1e6))


def exposure_table(exposure: Mapping[str, tuple[Any, Mapping[str, float]]]) -> pd.DataFrame:
    """The model's totals (µs) per schedule: ``{"on": (rows, totals), "off": ...}`` -> one column each."""
    return pd.DataFrame({f"scheduler {lhs}": {k: v * 1e6 for k, v in tot.items() if k.endswith("_s")}
                         for lhs, (_rows, tot) in exposure.items()}).rename(index=lambda k: k.replace("_s", " µs"))


def schedule_figure(schedules: Mapping[str, Sequence[tuple[str, str]]], title: str) -> go.Figure:
    """The entry schedule as a strip of coloured cells per program: matmuls, collective starts / dones."""
    fig = go.Figure()
    for row, (label, sched) in enumerate(schedules.items()):
        for kind, color in KIND_COLOR.items():
            xs = [i for i, (_, k) in enumerate(sched) if k == kind]
            if xs:
                fig.add_scatter(x=xs, y=[label] * len(xs), mode="markers", name=kind, legendgroup=kind,
                                showlegend=row == 0, marker=dict(symbol="square", size=9, color=color),
                                text=[sched[i][0] for i in xs], hoverinfo="text")
    fig.update_layout(title=title, xaxis_title="position in the schedule", height=120 + 60 * len(schedules))
    return fig


# ------------------------------------------------------------------------------------------------ memory
def profile_figure(profiles: Mapping[str, Profile], unit: str = "MB") -> go.Figure:
    """Live memory while each operator runs, one line per order."""
    fig = go.Figure()
    for i, (label, prof) in enumerate(profiles.items()):
        fig.add_scatter(x=[s.op for s in prof.steps], y=[s.during for s in prof.steps], mode="lines+markers",
                        name=f"{label}: peak {prof.peak} {unit}", line=dict(color=PALETTE[i], shape="hv"))
    fig.update_layout(title="Memory while each operator runs", xaxis_title="step", yaxis_title=unit, height=340)
    return fig


def order_table(cpu: Extremes, xla_cpu: Profile, cpu_temp: int, unit: int, tpu_temp_units: float | None
                ) -> pd.DataFrame:
    """The toy's orders priced in units: XLA:CPU's graph (best, XLA's, worst, its heap simulation) and, when
    compiled, XLA:TPU's temporaries (the toy's own best is 12, worst 17)."""
    rows = [{"program": "XLA:CPU", "orders": cpu.orders, "best order": cpu.best.peak / unit,
             "XLA's order": xla_cpu.peak / unit, "worst order": cpu.worst.peak / unit,
             "compiler's own number": cpu_temp / unit, "which": "heap-simulated temporaries"}]
    if tpu_temp_units is not None:
        rows.append({"program": "XLA:TPU", "orders": None, "best order": 12, "XLA's order": None,
                     "worst order": 17, "compiler's own number": tpu_temp_units,
                     "which": "compiled temporaries (toy's best 12 / worst 17)"})
    return pd.DataFrame(rows)


def memory_table(memory: Mapping[str, TpuMemory]) -> pd.DataFrame:
    """Per chip, MiB: arguments, outputs, temporaries, aliased, and peak = arguments + outputs − aliased +
    temporaries, one column per program."""
    return pd.DataFrame({k: {"arguments MiB": mib(m.argument), "outputs MiB": mib(m.output),
                             "temporaries MiB": mib(m.temp), "aliased MiB": mib(m.alias),
                             "peak MiB": mib(m.argument + m.output - m.alias + m.temp)} for k, m in memory.items()})


# -------------------------------------------------------------------------------------------------- search
def search_figure(frame: pd.DataFrame) -> go.Figure:
    """Wire bytes against memory per chip, one point per candidate; Megatron and the planner marked."""
    fits = frame[frame["fits"]]
    fig = go.Figure()
    fig.add_scatter(x=fits["wire_bytes"], y=fits["memory_bytes"], mode="markers+text",
                    text=[f"{m} {lay}" for m, lay in zip(fits["mesh"], fits["layout"], strict=True)],
                    textposition="top center", marker=dict(size=9, color=PALETTE[0]), name="candidates")
    for col, color, name in (("megatron", PALETTE[3], "Megatron"), ("planner", PALETTE[2], "planner")):
        sel = fits[fits[col]]
        if len(sel):
            fig.add_scatter(x=sel["wire_bytes"], y=sel["memory_bytes"], mode="markers", name=name,
                            marker=dict(size=16, color="rgba(0,0,0,0)", line=dict(color=color, width=3)))
    fig.update_layout(title="Layouts compiled for the TPU: communication vs memory per chip",
                      xaxis_title="wire bytes per chip (ring model)", yaxis_title="bytes per chip", height=420)
    return fig


# ------------------------------------------------------------------------------------------------- summary
def summary_table(values: Callable[[str], Mapping[str, Any]], saving: pd.DataFrame, toy_worst_units: float,
                  step: tuple[Extremes, Profile] | None, search: pd.DataFrame | None, devices: int) -> pd.DataFrame:
    """The levers off vs on, one row each, from the recorded values (``values(name) -> {source: value}``, a
    Recorder's) and what was not recorded: the α–β saving table, the toy's worst order, the DP step's orders
    (extremes, XLA's), the search table."""
    def value(name: str, source: str) -> Any:
        return values(name).get(source)

    def us(name: str) -> float | None:
        v = value(name, "tpu")
        return None if v is None else round(v * 1e6, 1)

    first = saving.iloc[0] if len(saving) else None
    ext, xla = step if step is not None else (None, None)
    dp = None if search is None or not (search["data"] == devices).any() else search[search["data"] == devices]
    return _plain(pd.DataFrame([
        {"lever": "combining: DP step all-reduces", "off": value(f"levers.combine.all_reduce.count{OFF}", "tpu"),
         "on": value("levers.combine.all_reduce.count", "tpu"), "unit": "instructions",
         "where": f"XLA:TPU (XLA:CPU: {value('levers.combine.all_reduce.count', 'hlo')}, no combiner)"},
        {"lever": "combining: what it buys", "off": None if first is None else first["model ms, m calls"],
         "on": None if first is None else first["model ms, m′ calls"], "unit": "ms",
         "where": "α–β model with this machine's gloo α, β (DP step's bytes)"},
        {"lever": "overlap: FSDP step", "off": us("levers.overlap.fsdp.exposed_s.lhs_off"),
         "on": us("levers.overlap.fsdp.exposed_s.lhs_on"), "unit": "µs exposed",
         "where": "XLA:TPU schedule, latency-hiding scheduler off / on (model)"},
        {"lever": "memory order: toy", "off": toy_worst_units, "on": value("levers.order.toy.tpu.temp_units", "tpu"),
         "unit": "units",
         "where": f"worst order / XLA:TPU (XLA:CPU chose {value('levers.order.toy.cpu.xla_order_units', 'hlo'):g})"},
        {"lever": "memory order: DP step", "off": None if ext is None else ext.worst.peak / 1024,
         "on": None if xla is None else xla.peak / 1024, "unit": "KiB",
         "where": "XLA:CPU: worst order / XLA's order" + ("" if ext is None else f" (best {ext.best.peak / 1024:g})")},
        {"lever": "weight update in the backward graph",
         "off": mib(value("levers.order.weight_update.peak_bytes.separate", "tpu")),
         "on": mib(value("levers.order.weight_update.peak_bytes.fused", "tpu")), "unit": "MiB peak per chip",
         "where": "XLA:TPU"},
        {"lever": "strategy search", "off": None if dp is None else int(dp["wire_bytes"].iloc[0]),
         "on": None if search is None else int(search.iloc[0]["wire_bytes"]), "unit": "wire bytes per chip",
         "where": "XLA:TPU: pure data parallel / best candidate"
                  + ("" if search is None else f" ({search.iloc[0]['mesh']} {search.iloc[0]['layout']})")},
        {"lever": "fusion", "off": value("levers.fusion.kernels.cpu", "hlo"),
         "on": value("levers.fusion.kernels.tpu", "tpu"), "unit": "kernels", "where": "XLA:CPU / XLA:TPU, MLP block"},
    ]))


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """The off / on columns as plain numbers (ints stay ints, floats to 4 significant digits), not one float format
    for a column that mixes counts and bytes."""
    def plain(v: Any) -> Any:
        if v is None or isinstance(v, str) or pd.isna(v):
            return v
        return int(v) if float(v).is_integer() else float(f"{v:.4g}")

    return frame.assign(**{c: pd.Series([plain(v) for v in frame[c]], index=frame.index, dtype=object)
                           for c in ("off", "on")})
