"""An :class:`~shardlab.inspect.api.InspectResult` as a terminal table, a self-contained HTML page, or JSON.

Design note: text only, from the result's plain data (so cached results render the same). The HTML page uses
the report's style (``shardlab.report.html``: its CSS, table and figure helpers) with plotly.js inlined once: a
stacked per-chip memory bar (compiler | planner, one segment per kind, the chip's capacity as a line), the
memory table with ratios, the largest buffers, the collectives per mesh axis, the notes.
"""

from __future__ import annotations

import json
from typing import Any

GIB = 1024**3


def gib(x: Any, digits: int = 2) -> str:
    return "–" if x is None else f"{x / GIB:.{digits}f}"


def ratio(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}"


def verdict_line(r: Any) -> str:
    if r.fits:
        t = r.totals
        return (f"FITS: {gib(t.get('checked'))} GiB of {gib(t.get('capacity'))} GiB per chip counted by the capacity "
                f"check (peak with outputs {gib(t.get('peak'))} GiB)")
    return f"DOES NOT FIT: {r.message}"


def planner_line(r: Any) -> str:
    p = r.planner
    if p is None:
        return "planner: no prediction (" + "; ".join(n for n in r.notes if n.startswith("planner:")) + ")"
    word = "fits" if p["fits"] else "at risk" if p["at_risk"] else "does not fit"
    agree = "agrees" if p["fits"] == r.fits else "DISAGREES"
    return (f"planner (no flash attention, as traced): {word}, {gib(p['total'])} GiB per chip — {agree} with the "
            "compiler")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    return "\n".join(out)


def text(r: Any) -> str:
    """The terminal table."""
    where = f"{r.where}; traced in {r.trace_s:.1f} s" if r.trace_s is not None else r.where
    parts = [f"inspect {r.label}", f"compiled for {r.topology} by XLA:TPU (compile-only) in {r.compile_s:.1f} s "
             f"({where})", verdict_line(r), planner_line(r), ""]
    rows = [[m["kind"], gib(m["compiler"]), m["source"], gib(m["planner"]), ratio(m["ratio"])] for m in r.memory]
    parts.append(_table(["per chip", "compiler GiB", "source", "planner GiB", "ratio"], rows))
    p = r.params
    parts.append(f"parameters: {p['model']:,} in the model, {p['planner'] or 0:,} by the planner's sizes "
                 f"(ratio {ratio(p['ratio'])}); rules: " + ", ".join(f"{k} {v}" for k, v in sorted(r.rules.items())))
    parts += ["", "largest buffers" + (" (the compiler's list)" if not r.fits else
                                       " (largest values of the program; not all live at the peak)")]
    parts += [f"  {gib(b['bytes']):>7} GiB  {b['shape'][:60]:60s}  {b['op'] or b['label'][:50]}" for b in r.largest]
    if r.collectives:
        parts += ["", "collectives per step, per chip (runs: a collective in the scanned layer body runs L times)"]
        rows = [[c["axes"], c["op"], str(c["instructions"]), str(c["per_step"]), gib(c["bytes_per_step"], 3),
                 str(c.get("planner_count", "–")), gib(c.get("planner_bytes"), 3), ratio(c.get("ratio"))]
                for c in r.collectives]
        parts.append(_table(["axes", "op", "instr", "per step", "GiB/step", "planner count", "planner GiB",
                             "ratio"], rows))
    elif not r.fits:
        parts += ["", "collectives: none to read (out of memory: the compiler returns no program)"]
    if r.nearest:
        n = r.nearest
        parts += ["", f"nearest plan that fits (planner): {n['topology']} data={n['data']} fsdp={n['fsdp']} "
                      f"tensor={n['tensor']} recompute={n['recompute']}: {gib(n['total'])} GiB per chip"]
        if r.confirmed:
            c = r.confirmed
            parts.append(f"  confirmed by the compiler: {'fits' if c['fits'] else 'does NOT fit: ' + c['message']}"
                         f" ({gib(c['totals'].get('checked'))} GiB, compiled in {c['compile_s']:.1f} s)")
    elif not r.fits:
        parts += ["", "nearest plan that fits: the planner finds none on this slice or a larger one of its generation"]
    if r.notes:
        parts += ["", "notes:"] + [f"  - {n}" for n in r.notes]
    return "\n".join(parts)


def as_json(r: Any) -> str:
    return json.dumps(r.as_dict(), indent=1, default=str)


def memory_figure(r: Any) -> Any:
    """Stacked per-chip memory: compiler and planner, one segment per kind, the capacity as a line."""
    import plotly.graph_objects as go

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
    fig = go.Figure()
    for name, (c, pl) in segs.items():
        fig.add_bar(name=name, x=["compiler", "planner"], y=[(c or 0) / GIB, (pl or 0) / GIB])
    cap = r.totals.get("capacity")
    if cap:
        fig.add_hline(y=cap / GIB, line_dash="dash", annotation_text=f"capacity {cap / GIB:.2f} GiB")
    fig.update_layout(barmode="stack", height=420, margin=dict(l=10, r=10, t=40, b=10), yaxis_title="GiB per chip",
                      title=f"per-chip memory, {r.slice} ({r.topology})", legend=dict(orientation="h"))
    return fig


def html_page(r: Any) -> str:
    """One self-contained HTML page (plotly.js inlined)."""
    from plotly.offline import get_plotlyjs

    from shardlab.report.html import CSS, esc, figure, table

    colour = "#1a7f37" if r.fits else "#cf222e"
    body = [f"<h1>inspect: {esc(r.label)}</h1>",
            f"<p><span class='badge' style='background:{colour}'>{'fits' if r.fits else 'does not fit'}</span> "
            f"compiled for <b>{esc(r.topology)}</b> by XLA:TPU (compile-only) in {r.compile_s:.1f} s "
            f"({esc(r.where)})</p>",
            f"<p>{esc(verdict_line(r))}</p><p>{esc(planner_line(r))}</p>", figure(memory_figure(r)),
            "<h2>Memory per chip</h2>",
            table(["kind", "compiler GiB", "source", "planner GiB", "ratio"],
                  [[esc(m["kind"]), gib(m["compiler"]), esc(m["source"]), gib(m["planner"]), ratio(m["ratio"])]
                   for m in r.memory]),
            f"<p class='muted'>parameters: {r.params['model']:,} in the model, {r.params['planner'] or 0:,} by the "
            f"planner's sizes; rules: {esc(', '.join(f'{k} {v}' for k, v in sorted(r.rules.items())))}</p>",
            "<h2>Largest buffers</h2>",
            table(["GiB", "shape", "operation", "label", "allocation"],
                  [[gib(b["bytes"], 3), esc(b["shape"]), esc(b["op"]), esc(b["label"][:120]), esc(b["allocation"])]
                   for b in r.largest])]
    if r.collectives:
        body += ["<h2>Collectives per step, per chip</h2>",
                 table(["axes", "op", "instructions", "per step", "GiB / step", "planner count", "planner GiB",
                        "ratio", "planner terms"],
                       [[esc(c["axes"]), esc(c["op"]), str(c["instructions"]), str(c["per_step"]),
                         gib(c["bytes_per_step"], 3), str(c.get("planner_count", "–")),
                         gib(c.get("planner_bytes"), 3), ratio(c.get("ratio")),
                         esc("; ".join(c.get("planner_what", [])))] for c in r.collectives])]
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
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>inspect {esc(r.label)}</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(body)}</body></html>")
