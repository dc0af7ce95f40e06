"""The report page: one self-contained HTML file (plotly.js inlined once, no network needed).

Design note
-----------
Plain string building with ``html.escape`` — no template engine. Sections, top to bottom: summary (status
per notebook, checks, regressions, wall and XLA compile time), wall-time chart, baseline diff, one section
per notebook (failure with its cell and traceback, parameters, checks, skipped views and notes, the four-way
measurement table formula | ledger | hlo | tpu | metrics | timer with the CPU-vs-TPU compiler column and the
baseline status of each row), charts drawn from the records, environment. What "skipped" and "differs" mean
comes from the record's own fields; agreement uses the suite's one rule (``values_equal``). Every timing is
printed with the device profile it was measured on (``0.41 s @cpu-8``): only structural numbers are comparable
across devices.
"""

from __future__ import annotations

import html
import math
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from shardlab.profile.record import SOURCES, values_equal
from shardlab.report.baseline import key_rows
from shardlab.report.datatypes import NotebookResult, Report

STATUS_COLOURS = {"passed": "#1a7f37", "failed": "#cf222e", "timeout": "#bc4c00", "regressed": "#8250df",
                  "skipped": "#6e7781"}
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#1f2328}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px} th,td{border:1px solid #d0d7de;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:13px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;border-radius:4px}
pre.tb{background:#fff0f0} .bad{color:#cf222e;font-weight:600} .ok{color:#1a7f37} .muted{color:#6e7781}
.flag{background:#fff8c5} nav a{margin-right:1em}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def badge(status: str) -> str:
    return f'<span class="badge" style="background:{STATUS_COLOURS.get(status, "#6e7781")}">{esc(status)}</span>'


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10000:
        return f"{value:,}"
    return str(value)


def fmt_timing(row: dict[str, Any], device: str) -> str:
    spread = row.get("spread") or {}
    extra = ""
    if "min" in spread and "max" in spread:
        extra = f' <span class="muted">[{fmt(spread["min"])}, {fmt(spread["max"])}] n={spread.get("n", "?")}</span>'
    return f"{fmt(row['value'])}{extra} <span class='muted'>@{esc(device)}</span>"


def table(headers: list[str], rows: list[list[str]], cls: list[str] | None = None) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(f'<tr class="{(cls or [""] * len(rows))[i]}">' + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                   for i, r in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def device_of(r: NotebookResult, default: str) -> str:
    env = (r.record or {}).get("env", {})
    if env.get("device_kind") and env.get("device_count"):
        return f"{env['device_kind']}-{env['device_count']}"
    return default


def summary(report: Report) -> str:
    rows = []
    for r in report.results:
        checks = (r.record or {}).get("checks", [])
        ok = sum(1 for c in checks if c.get("ok"))
        regress = sum(d.regression for d in r.diffs)
        new = sum(d.status == "new" and d.kind == "structural" for d in r.diffs)
        missing = sum(d.status == "missing" for d in r.diffs)
        new_missing = f"{new} / {missing}" if r.compared else "no baseline"
        wall = f"{r.execution.wall_s:.1f}" if r.execution else "—"
        comp = (f"{r.compile_s:.1f} ({r.xla['CompileTime']['count']})" if r.compile_s is not None else "—")
        link = f'<a href="{esc(r.html)}">executed notebook</a>' if r.html else "—"
        rows.append([f'<a href="#nb-{esc(r.stem)}">{esc(r.stem)}</a>', badge(r.status),
                     f"{ok}/{len(checks)}", str(regress), new_missing, wall, comp, link,
                     "<br>".join(esc(x) for x in r.reasons)])
    total = sum(r.execution.wall_s for r in report.results if r.execution)
    n_comp = sum(r.compile_s or 0.0 for r in report.results)
    rows.append(["<b>total</b>", "", "", "", "", f"<b>{total:.1f}</b>", f"<b>{n_comp:.1f}</b>", "",
                 f"report wall time {report.wall_s:.1f} s"])
    return floor_paragraph(report) + table(["notebook", "status", "checks ok", "regressions", "new / missing",
                                            "wall s", "XLA compile s (count)", "HTML", "notes"], rows)


def floor_paragraph(report: Report) -> str:
    """The run's wall beside its floor, both measured in this run (:mod:`shardlab.report.floor`)."""
    how = ("floor = notebooks × (kernel start + <code>import torch_xla</code>, the median of bare kernels timed "
           "in the same pool before the first notebook) ÷ jobs; the wall includes those probes")
    store = report.store_line()
    store_html = (f"<br>{esc(store)}. <span class='muted'>A stored compile is the pinned compiler's answer to the same "
                  "program, recorded by <code>python tools/tpu_store.py refresh</code>; a program the library now "
                  "builds differently misses and compiles live. <code>SHARDLAB_TPU_STORE=off</code> compiles every "
                  "program live.</span>" if store else "")
    return f"<p id='floor'><b>{esc(report.floor_line())}</b>{store_html}<br><span class='muted'>{how}</span></p>"


def wall_chart(report: Report) -> str:
    rs = [r for r in report.results if r.execution]
    if not rs:
        return ""
    names = [r.stem for r in rs]
    comp = [r.compile_s or 0.0 for r in rs]
    rest = [max(0.0, r.execution.wall_s - c) for r, c in zip(rs, comp, strict=True) if r.execution]
    fig = go.Figure([go.Bar(y=names, x=comp, name="XLA compile", orientation="h"),
                     go.Bar(y=names, x=rest, name="everything else (kernel start, imports, execution)",
                            orientation="h")])
    fig.update_layout(barmode="stack", height=120 + 30 * len(rs), margin=dict(l=10, r=10, t=30, b=10),
                      title=f"wall time per notebook (s) @{report.options.profile}",
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h"))
    return figure(fig)


def figure(fig: go.Figure) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True}))


def baseline_section(report: Report) -> str:
    state = {"compared": "Compared with the baseline", "none": "No baseline yet at", "updated": "Updated the baseline",
             "created": "Created the baseline"}
    parts = [f"<p>{state.get(report.baseline_state, report.baseline_state)} "
             f"<code>{esc(report.baseline_path)}</code>.</p>"]
    if report.baseline_state == "none":
        parts.append("<p>Run with <code>--update-baseline</code> to record this run as the baseline.</p>")
    for note in report.notes:
        parts.append(f"<p class='bad'>{esc(note)}</p>")
    rows, classes = [], []
    for r in report.results:
        for d in r.diffs:
            if d.status in ("same", "within") or (d.status == "new" and report.baseline_state != "compared"):
                continue
            rows.append([esc(r.stem), esc(d.key), esc(d.kind), esc(d.status), esc(fmt(d.baseline)),
                         esc(fmt(d.current)), esc(d.unit), esc(d.detail)])
            classes.append("flag" if d.regression else "")
        for k, (old, new) in r.param_changes.items():
            rows.append([esc(r.stem), f"param {esc(k)}", "param", "changed", esc(old), esc(new), "", ""])
            classes.append("flag")
    if rows:
        parts.append(table(["notebook", "measurement", "kind", "status", "baseline", "now", "unit", "detail"],
                           rows, classes))
    elif report.baseline_state == "compared":
        parts.append("<p class='ok'>Every structural value equals the baseline; every timing is within its "
                     "band.</p>")
    n_same = sum(d.status == "same" for r in report.results for d in r.diffs)
    n_in = sum(d.status == "within" for r in report.results for d in r.diffs)
    parts.append(f"<p class='muted'>{n_same} structural rows unchanged, {n_in} timings within band. Structural "
                 "values are compared exactly; timings are flagged outside median ± max(3 × half-range, 50 % "
                 "of median) and never fail the run.</p>")
    return "".join(parts)


def measurements_table(r: NotebookResult, device: str) -> str:
    """One row per measurement name, one column per source; ``agree`` over the sources the notebook compared
    (a row the notebook recorded with ``differs`` — legitimately different on its backend — is marked † with the
    measured reason and left out, exactly as the notebook's own checks left it out), and the CPU-vs-TPU compiler
    column: same, or what differs and the measured why."""
    meas = (r.record or {}).get("measurements", [])
    if not meas:
        return "<p class='muted'>no measurements recorded</p>"
    diff_by_key = {d.key: d for d in r.diffs}
    names: dict[str, dict[str, Any]] = {}
    for key, m in key_rows(meas).items():
        row = names.setdefault(m["name"] + (" " + key.rsplit(" ", 1)[1] if "#" in key else ""),
                               {"unit": m["unit"], "kind": m.get("kind", "structural"), "src": {}, "diff": []})
        row["src"][m["source"]] = m
        if key in diff_by_key and diff_by_key[key].status not in ("same", "within") and r.compared:
            row["diff"].append(f"{m['source']}: {diff_by_key[key].status}")
    present = [s for s in SOURCES if any(s in v["src"] for v in names.values())]
    rows, classes = [], []
    for name, v in names.items():
        src = v["src"]
        vals = [src[s]["value"] for s in present if s in src and not src[s].get("differs")]
        cells = []
        for s in present:
            m = src.get(s)
            text = "" if m is None else fmt_timing(m, device) if v["kind"] == "timing" else esc(fmt(m["value"]))
            if m is not None and m.get("differs"):
                text = f"<span title='{esc(m['differs'])}'>{text} †</span>"
            cells.append(text)
        agree = all(values_equal(x, vals[0]) for x in vals)
        agree_cell = ("—" if len(vals) < 2 or v["kind"] == "timing" else
                      "<span class='ok'>✓</span>" if agree else "<span class='bad'>✗</span>")
        cpu_tpu = ""
        if v["kind"] == "structural" and "hlo" in src and "tpu" in src:
            reason = src["tpu"].get("differs") or src["hlo"].get("differs") or ""
            same = values_equal(src["hlo"]["value"], src["tpu"]["value"])
            cpu_tpu = "same" if same else esc("differs" + (f": {reason}" if reason else ""))
        rows.append([esc(name), esc(v["unit"]), esc(v["kind"]), *cells, agree_cell, cpu_tpu, esc("; ".join(v["diff"]))])
        classes.append("flag" if v["diff"] or agree_cell.endswith("✗</span>") else "")
    return table(["measurement", "unit", "kind", *present, "agree", "CPU vs TPU compiler", "vs baseline"], rows,
                 classes)


def notes_list(r: NotebookResult) -> str:
    """The notebook's skipped views (and why) and its notes."""
    rec = r.record or {}
    items = [f"<li><code>{esc(k['name'])}</code> [{esc(k['source'])}] skipped: {esc(k['reason'])}</li>"
             for k in rec.get("skipped", [])]
    items += [f"<li><code>{esc(n['name'])}</code>: {esc(n['detail'])}</li>" for n in rec.get("notes", [])]
    if not items:
        return ""
    return f"<details><summary>{len(items)} skipped view(s) and note(s)</summary><ul>{''.join(items)}</ul></details>"


def notebook_section(r: NotebookResult, default_device: str) -> str:
    device = device_of(r, default_device)
    parts = [f'<h3 id="nb-{esc(r.stem)}">{esc(r.stem)} {badge(r.status)}</h3>']
    if r.html:
        parts.append(f'<p><a href="{esc(r.html)}">executed notebook (HTML)</a> · '
                     f'<a href="{esc(r.html[:-5])}.ipynb">.ipynb</a></p>')
    for reason in r.reasons:
        parts.append(f"<p class='bad'>{esc(reason)}</p>" if r.status != "passed" else f"<p>{esc(reason)}</p>")
    fail = r.execution.failure if r.execution else None
    if fail is not None:
        where = f"cell {fail.cell_index}" if fail.cell_index is not None else "no cell"
        if fail.execution_count is not None:
            where += f" (In [{fail.execution_count}])"
        parts.append(f"<p><b>{esc(fail.kind)}</b> in {where}: <code>{esc(fail.message)}</code></p>")
        if fail.cell_source:
            parts.append(f"<p>Failing cell:</p><pre>{esc(fail.cell_source)}</pre>")
        if fail.traceback:
            parts.append(f"<p>Traceback:</p><pre class='tb'>{esc(fail.traceback)}</pre>")
    rec = r.record
    if rec is not None:
        params = ", ".join(f"{esc(k)}={esc(v)}" for k, v in rec.get("params", {}).items())
        parts.append(f"<p>params: <code>{params}</code> · record status <b>{esc(rec.get('status'))}</b>"
                     f" · timings @{esc(device)}</p>")
        checks = rec.get("checks", [])
        if checks:
            crow = [["<span class='ok'>✓</span>" if c.get("ok") else "<span class='bad'>✗</span>",
                     esc(c.get("name")), esc(c.get("detail", ""))] for c in checks]
            parts.append("<details" + (" open" if any(not c.get("ok") for c in checks) else "") +
                         f"><summary>{len(checks)} checks</summary>" +
                         table(["ok", "check", "detail"], crow) + "</details>")
        parts.append(notes_list(r))
        parts.append(measurements_table(r, device))
    return "".join(parts)


def charts_section(report: Report) -> str:
    parts = []
    for c in report.charts:
        parts.append(figure(c.figure) if c.figure is not None else
                     f"<h3>{esc(c.spec.title)}</h3><p class='muted'>{esc(c.note)}</p>")
    return "".join(parts) or "<p class='muted'>no charts</p>"


def env_section(report: Report) -> str:
    rows = [[esc(k), esc(v)] for k, v in report.env.items() if k != "notebook_env"]
    rows += [[f"notebook env: {esc(k)}", esc(v)] for k, v in report.env.get("notebook_env", {}).items()]
    return table(["", ""], rows)


def write_report(report: Report, dest: Path) -> Path:
    counts = {s: sum(r.status == s for r in report.results) for s in STATUS_COLOURS}
    headline = " ".join(f"{badge(s)} {n}" for s, n in counts.items() if n)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.started))
    body = [
        f"<h1>shardlab report</h1><p>{when} · profile <b>{esc(report.options.profile)}</b> · "
        f"{len(report.results)} notebooks · {headline} · exit status <b>{report.exit_status}</b></p>",
        "<nav><a href='#summary'>summary</a><a href='#baseline'>baseline</a><a href='#notebooks'>notebooks</a>"
        "<a href='#charts'>charts</a><a href='#env'>environment</a></nav>",
        "<h2 id='summary'>Summary</h2>", summary(report), wall_chart(report),
        "<h2 id='baseline'>Baseline diff</h2>", baseline_section(report),
        "<h2 id='notebooks'>Notebooks</h2>",
        "<p class='muted'>One row per measurement name, one column per source (formula = the paper's algebra, "
        "ledger = our per-rank implementation, hlo = what XLA's SPMD partitioner emitted on the CPU devices, "
        "tpu = the same graph compiled by XLA:TPU for a TPU slice, compile-only). † marks a value the notebook "
        "recorded as legitimately different on its backend (hover for the measured reason: XLA:CPU reduces bf16 "
        "in f32, the TPU combines collectives ...); it is left out of <i>agree</i>. XLA:CPU's passes lower a "
        "reduce-scatter to all-reduce + dynamic-slice; notebooks count that pair as a reduce-scatter.</p>",
        *(notebook_section(r, report.options.profile) for r in report.results),
        "<h2 id='charts'>Charts</h2>", "<p class='muted'>Curves the notebooks computed and recorded (a loop over "
        "their cases in one process), drawn from the records.</p>", charts_section(report),
        "<h2 id='env'>Environment</h2>", env_section(report),
    ]
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>shardlab report {esc(when)}</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(body)}</body></html>")
    dest.write_text(page)
    return dest
