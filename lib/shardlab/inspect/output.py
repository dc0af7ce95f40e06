"""An :class:`~shardlab.inspect.api.InspectResult` as a terminal table, a self-contained HTML page, or JSON.

Design note: text only, from the result's plain data (so cached results render the same). The HTML page uses
the report's style (``shardlab.report.html``: its CSS, table and figure helpers) with plotly.js inlined once: a
stacked per-chip memory bar (inspect | planner, one segment per kind, derived segments hatched, the chip's
capacity as a line), the memory table with ratios, the largest buffers, the collectives per mesh axis, the notes.
Every memory row says how it was obtained: measured (read from the compiled program) or derived (layout
arithmetic, or temporaries minus it).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from shardlab.inspect.timing import html_section as time_section
from shardlab.inspect.timing import text_lines as time_lines
from shardlab.report.html import CSS, esc, figure, table

if TYPE_CHECKING:
    from shardlab.inspect.api import InspectResult

GIB = 1024**3


UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


def gib(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x / GIB:.{digits}f}"


def unit_for(*values: float | None) -> tuple[str, int]:
    """The largest unit in which the largest of ``values`` is at least 0.1 (tiny runs read in KiB, not 0.00 GiB)."""
    top = max((abs(v) for v in values if v), default=0)
    return next(((n, d) for n, d in UNITS if top >= d / 10), UNITS[-1])


def size(x: float | None, unit: tuple[str, int], digits: int = 2) -> str:
    return "–" if x is None else f"{x / unit[1]:.{digits}f}"


def human(x: float | None) -> str:
    """One number in its own unit: ``5.61 MiB``."""
    u = unit_for(x)
    return f"{size(x, u)} {u[0]}"


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def is_measured(m: dict[str, Any], fits: bool) -> bool:
    """A memory row's label; results cached before the label existed are read with today's rule."""
    if "measured" in m:
        return bool(m["measured"])
    from shardlab.inspect.analysis import measured

    return measured(m["kind"], fits)


def how(m: dict[str, Any], fits: bool = True) -> str:
    return "measured" if is_measured(m, fits) else "derived"


def kind_label(m: dict[str, Any]) -> str:
    """A memory row's kind, with what it holds when the row says (the optimizer state: optimizer and dtype)."""
    return f"{m['kind']} ({m['what'].split(':')[0]})" if m.get("what") else m["kind"]


def optimizer_line(r: InspectResult) -> str:
    """Which optimizer was traced, its state per tensor kind, measured or derived, and the planner's K."""
    o = r.optimizer
    if not o:
        return ""
    parts = ", ".join(f"{k} {human(v)}" for k, v in o["by_state"].items()) or "none"
    return (f"optimizer: {o['what']}; state per chip by tensor, {'measured' if o['measured'] else 'derived'} "
            f"({o['source']}): {parts}; planner: {o['planner_bytes_per_param']:.4g} bytes per parameter")


def host_lines(r: InspectResult) -> list[str]:
    """The program's host memory (``recompute='offload'``): arrays in the host memory space and the transfers,
    measured (read from the compiled program's instructions and memory statistics)."""
    h = r.host
    if not h:
        return []
    out = [f"host memory (measured: the program's arrays in memory space {h['space']}; not in the HBM total): "
           f"{human(h['host_temp'])} host temporaries per chip"]
    out += [f"  {human(a['bytes']):>10}  {a['shape']}" for a in h["arrays"]]
    out += [f"  {v['per_step']} x {k} per step ({v['instructions']} instructions), {human(v['bytes_per_step'])} "
            "per step" for k, v in h["transfers"].items()]
    return out


def verdict_line(r: InspectResult) -> str:
    if r.fits:
        t = r.totals
        return (f"FITS: {human(t.get('checked'))} of {human(t.get('capacity'))} per chip counted by the capacity "
                f"check (peak with outputs {human(t.get('peak'))})")
    return f"DOES NOT FIT: {r.message}"


def planner_line(r: InspectResult) -> str:
    p = r.planner
    if p is None:
        return "planner: no prediction (" + "; ".join(n for n in r.notes if n.startswith("planner:")) + ")"
    word = "fits" if p["fits"] else "at risk" if p["at_risk"] else "does not fit"
    agree = "agrees" if p["fits"] == r.fits else "DISAGREES"
    flash = r.config.get("attention", "eager") == "flash"
    return (f"planner ({'flash' if flash else 'no flash'} attention, as traced): {word}, {human(p['total'])} per chip"
            f" — {agree} with the compiler")


def memory_unit(r: InspectResult) -> tuple[str, int]:
    return unit_for(*(m[k] for m in r.memory for k in ("compiler", "planner")))


def collective_unit(r: InspectResult) -> tuple[str, int]:
    return unit_for(*(c.get(k) for c in r.collectives for k in ("bytes_per_step", "planner_bytes")))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    return "\n".join(out)


def text(r: InspectResult) -> str:
    """The terminal table."""
    where = f"{r.where}; traced in {r.trace_s:.1f} s" if r.trace_s is not None else r.where
    parts = [f"inspect {r.label}", f"compiled for {r.topology} by XLA:TPU (compile-only) in {r.compile_s:.1f} s "
             f"({where})", verdict_line(r), planner_line(r), ""]
    u = memory_unit(r)
    rows = [[kind_label(m), size(m["compiler"], u), how(m, r.fits), m["source"], size(m["planner"], u),
             ratio(m["ratio"])] for m in r.memory]
    parts.append(_table(["per chip", f"inspect {u[0]}", "how", "source", f"planner {u[0]}", "ratio"], rows))
    parts.append("how: measured = read from the compiled program; derived = layout arithmetic (gradients) or "
                 "the program's temporaries minus it")
    if r.optimizer:
        parts.append(optimizer_line(r))
    parts += host_lines(r)
    p = r.params
    parts.append(f"parameters: {p['model']:,} in the model, {p['planner'] or 0:,} by the planner's sizes "
                 f"(ratio {ratio(p['ratio'])}); rules: " + ", ".join(f"{k} {v}" for k, v in sorted(r.rules.items())))
    parts += ["", "largest buffers" + (" (the compiler's list)" if not r.fits else
                                       " (largest values of the program; not all live at the peak)")]
    parts += [f"  {human(b['bytes']):>10}  {b['shape'][:60]:60s}  {b['op'] or b['label'][:50]}" for b in r.largest]
    if r.collectives:
        parts += ["", "collectives per step, per chip (runs: a collective in the scanned layer body runs L times)"
                  if r.fits else "collectives: none to read (out of memory: the compiler returns no program); the "
                  "planner's terms"]
        u = collective_unit(r)
        rows = [[c["axes"], c["op"], str(c["instructions"]), str(c["per_step"]), size(c["bytes_per_step"], u, 3),
                 str(c.get("planner_count", "–")), size(c.get("planner_bytes"), u, 3), ratio(c.get("ratio"))]
                for c in r.collectives]
        parts.append(_table(["axes", "op", "instr", "per step", f"{u[0]}/step", "planner count", f"planner {u[0]}",
                             "ratio"], rows))
    elif not r.fits:
        parts += ["", "collectives: none to read (out of memory: the compiler returns no program)"]
    if r.nearest:
        n = r.nearest
        parts += ["", f"nearest plan that fits (planner): {n['topology']} data={n['data']} fsdp={n['fsdp']} "
                      f"tensor={n['tensor']} recompute={n['recompute']}: {human(n['total'])} per chip"]
        if r.confirmed:
            c = r.confirmed
            parts.append(f"  confirmed by the compiler: {'fits' if c['fits'] else 'does NOT fit: ' + c['message']}"
                         f" ({human(c['totals'].get('checked'))}, compiled in {c['compile_s']:.1f} s)")
    elif not r.fits:
        parts += ["", "nearest plan that fits: the planner finds none on this slice or a larger one of its generation"]
    parts += time_lines(r, _table)
    if r.notes:
        parts += ["", "notes:"] + [f"  - {n}" for n in r.notes]
    return "\n".join(parts)


def as_json(r: InspectResult) -> str:
    return json.dumps(r.as_dict(), indent=1, default=str)


def memory_figure(r: InspectResult) -> Any:
    """Stacked per-chip memory: compiler and planner, one segment per kind, the capacity as a line."""
    rows = {m["kind"].split(" (")[0]: m for m in r.memory}
    p = (r.planner or {}).get("memory", {})
    segs = {
        "parameters": (rows["parameters"]["compiler"], p.get("params")),
        "optimizer state": (rows["optimizer state"]["compiler"], (p.get("optimizer") or 0) + (p.get("padding") or 0)
                            if p else None),
        "inputs": (rows["inputs"]["compiler"], None),
        "gradients": (rows["gradients"]["compiler"], p.get("grads")),
        "activations + other temporaries": (rows["activations + other temporaries"]["compiler"],
                                            sum(p.get(k, 0) for k in ("activations", "logits", "fsdp_gathered_unit"))
                                            if p else None),
    }
    name_u, div = memory_unit(r)
    fig = go.Figure()
    derived = {"gradients", "activations + other temporaries"}
    if not r.fits:
        derived |= {"parameters", "optimizer state"}  # out of memory: the layout's arithmetic
    x = ["inspect (hatched: derived)", "planner"]
    for name, (c, pl) in segs.items():
        label = f"{name} (derived)" if name in derived else name
        fig.add_bar(name=label, x=x, y=[max(c or 0, 0) / div, (pl or 0) / div],
                    marker_pattern_shape=["/" if name in derived else "", ""])
    cap = r.totals.get("capacity")
    title = f"per-chip memory, {r.topology}"
    if cap and name_u == "GiB":
        fig.add_hline(y=cap / div, line_dash="dash", annotation_text=f"capacity {cap / GIB:.2f} GiB")
    elif cap:
        title += f"; the capacity, {cap / GIB:.2f} GiB, is off the scale"
    fig.update_layout(barmode="stack", height=420, margin=dict(l=10, r=10, t=40, b=10),
                      yaxis_title=f"{name_u} per chip", title=title, legend=dict(orientation="h"))
    return fig


def _body(r: InspectResult, chart: str) -> list[str]:
    """The page's sections (``chart``: the memory figure's HTML, or "" to leave it out)."""
    colour = "#1a7f37" if r.fits else "#cf222e"
    mu, cu = memory_unit(r), collective_unit(r)
    body = [f"<h1>inspect: {esc(r.label)}</h1>",
            f"<p><span class='badge' style='background:{colour}'>{'fits' if r.fits else 'does not fit'}</span> "
            f"compiled for <b>{esc(r.topology)}</b> by XLA:TPU (compile-only) in {r.compile_s:.1f} s "
            f"({esc(r.where)})</p>",
            f"<p>{esc(verdict_line(r))}</p><p>{esc(planner_line(r))}</p>", chart,
            "<h2>Memory per chip</h2>",
            table(["kind", f"inspect {mu[0]}", "how", "source", f"planner {mu[0]}", "ratio"],
                  [[esc(kind_label(m)), size(m["compiler"], mu), how(m, r.fits), esc(m["source"]),
                    size(m["planner"], mu), ratio(m["ratio"])] for m in r.memory]),
            "<p class='muted'>how: <b>measured</b> = read from the compiled program; <b>derived</b> = layout "
            "arithmetic (the gradients: bf16, sharded like their weights) or the program's temporaries minus it "
            "(activations + other temporaries)</p>",
            f"<p class='muted'>{esc(optimizer_line(r))}</p>" if r.optimizer else "",
            "<pre>" + esc("\n".join(host_lines(r))) + "</pre>" if r.host else "",
            f"<p class='muted'>parameters: {r.params['model']:,} in the model, {r.params['planner'] or 0:,} by the "
            f"planner's sizes; rules: {esc(', '.join(f'{k} {v}' for k, v in sorted(r.rules.items())))}</p>",
            "<h2>Largest buffers</h2>",
            table(["size", "shape", "operation", "label", "allocation"],
                  [[human(b["bytes"]), esc(b["shape"]), esc(b["op"]), esc(b["label"][:120]), esc(b["allocation"])]
                   for b in r.largest])]
    if r.collectives:
        body += ["<h2>Collectives per step, per chip</h2>",
                 table(["axes", "op", "instructions", "per step", f"{cu[0]} / step", "planner count",
                        f"planner {cu[0]}", "ratio", "planner terms"],
                       [[esc(c["axes"]), esc(c["op"]), str(c["instructions"]), str(c["per_step"]),
                         size(c["bytes_per_step"], cu, 3), str(c.get("planner_count", "–")),
                         size(c.get("planner_bytes"), cu, 3), ratio(c.get("ratio")),
                         esc("; ".join(c.get("planner_what", [])))] for c in r.collectives])]
    body += time_section(r)
    if r.nearest:
        n = r.nearest
        body.append(f"<h2>Nearest plan that fits</h2><p>{esc(n['topology'])}: data={n['data']} fsdp={n['fsdp']} "
                    f"tensor={n['tensor']} recompute={esc(n['recompute'])} — {esc(n['verdict'])}</p>")
        if r.confirmed:
            c = r.confirmed
            body.append(f"<p>confirmed by the compiler: {'fits' if c['fits'] else esc(c['message'])}</p>")
    if r.oom_message:
        body.append(f"<details><summary>the compiler's message</summary><pre>{esc(r.oom_message)}</pre></details>")
    body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in r.notes) + "</ul>")
    cfg = {k: v for k, v in r.config.items() if k != "model_config"}
    body.append(f"<details><summary>configuration</summary><pre>{esc(json.dumps(cfg, indent=1, default=str))}"
                f"</pre><pre>{esc(json.dumps(r.config['model_config'], indent=1))}</pre></details>")
    return body


def html_page(r: InspectResult) -> str:
    """One self-contained HTML page (plotly.js inlined)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>inspect {esc(r.label)}</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(_body(r, figure(memory_figure(r))))}</body></html>")


FRAGMENT_CLASS = "shardlab-inspect"


def html_fragment(r: InspectResult) -> str:
    """The page's sections without the chart, in a ``<div>`` with the report's CSS scoped to it — for a notebook
    cell (``IPython.display.HTML``; draw ``memory_figure(r)`` beside it): no second copy of plotly.js."""
    scoped = re.sub(r"([^{}]+)\{", lambda m: ",".join(
        f".{FRAGMENT_CLASS}" if sel.strip() == "body" else f".{FRAGMENT_CLASS} {sel.strip()}"
        for sel in m.group(1).split(",")) + "{", " ".join(CSS.split()))
    return f"<div class='{FRAGMENT_CLASS}'><style>{scoped}</style>{''.join(_body(r, ''))}</div>"
