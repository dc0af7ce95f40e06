"""Charts: the report's curves drawn from the notebooks' own records, and a sweep table's charts.

Design note
-----------
A notebook whose lesson needs a curve computes it as a loop over its cases in one process and records every
point under a name that carries the swept value (``mlp.by_tp.tp4.fwd_bwd.all_reduce.bytes``,
``scan.compile_s.loop.L8``). A :class:`ChartSpec` names the notebook and a regular expression with a group ``x``
(the swept value) and optionally a group ``series`` — each topic declares its specs in its registry entry
(:mod:`shardlab.core.topics`); every matching measurement becomes a point, one trace per
series and source. A spec whose notebook did not run, or whose record holds no matching value, gives a chart
with a note instead of a figure.

Example::

    >>> spec = ChartSpec("t", "02_megatron_mlp", r"mlp\\.by_tp\\.tp(?P<x>\\d+)\\.fwd_bwd\\.all_reduce\\.bytes", "bytes")
    >>> rec = {"notebook": "02_megatron_mlp", "measurements": [
    ...     {"name": "mlp.by_tp.tp2.fwd_bwd.all_reduce.bytes", "value": 8, "source": "formula"}]}
    >>> points(spec, [rec])
    {'formula': [(2.0, 8)]}

A sweep table (``python -m shardlab sweep``) is drawn by :func:`charts`: one figure per x parameter, each numeric
measurement name a dropdown entry with one trace per source and per combination of the other swept parameters
(distinct markers, so agreeing views visibly sit on top of each other; timings with [min, max] error bars).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from shardlab.core.topics import ChartSpec, lessons


@dataclass
class Chart:
    spec: ChartSpec
    figure: go.Figure | None
    note: str = ""


def registered_charts() -> tuple[ChartSpec, ...]:
    """Every registered topic's chart specs (:class:`shardlab.core.topics.Lesson` ``charts``), in notebook order."""
    return tuple(spec for lesson in lessons().values() for spec in lesson.charts)


def points(spec: ChartSpec, records: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, Any]]]:
    """``{trace name: [(x, y), ...]}`` of every measurement of the spec's notebook that matches its pattern."""
    rx = re.compile(spec.pattern)
    out: dict[str, list[tuple[float, Any]]] = {}
    for rec in records:
        if rec.get("notebook") != spec.notebook:
            continue
        for m in rec.get("measurements", []):
            hit = rx.fullmatch(m["name"])
            if hit is None or not isinstance(m["value"], int | float):
                continue
            series = (hit.groupdict().get("series") or "").strip(".")
            name = f"{series} ({m['source']})" if series else m["source"]
            out.setdefault(name, []).append((float(hit["x"]), m["value"]))
    return {k: sorted(v) for k, v in out.items()}


def report_charts(records: list[Mapping[str, Any]], specs: Iterable[ChartSpec] | None = None) -> list[Chart]:
    charts = []
    for spec in registered_charts() if specs is None else specs:
        traces = points(spec, records)
        if not traces:
            ran = any(r.get("notebook") == spec.notebook for r in records)
            charts.append(Chart(spec, None, f"{spec.notebook} " + ("recorded no value matching "
                                                                   f"{spec.pattern!r}" if ran else "did not run")))
            continue
        fig = go.Figure([go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name)
                         for name, pts in traces.items()])
        fig.update_layout(title=spec.title, height=360, xaxis_title=spec.x, yaxis_title=spec.y,
                          xaxis_type="log" if spec.log_x else None, margin=dict(l=10, r=10, t=40, b=10))
        charts.append(Chart(spec, fig))
    return charts


MARKERS = {"formula": "circle-open", "ledger": "x", "hlo": "diamond-open", "metrics": "square", "timer": "triangle-up"}
OTHER_COLS = ("point", "point_status", "point_wall_s", "name", "source", "kind", "unit", "value", "value_text",
              "spread_min", "spread_max")


def _traces(sub: Any, x: str, group_cols: Sequence[str]) -> list[Any]:
    traces = []
    keys = ["source", *group_cols]
    for key, part in sub.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        part = part.sort_values(x)
        label = ", ".join([str(key[0]), *(f"{c}={v}" for c, v in zip(group_cols, key[1:], strict=True))])
        err = None
        if part["kind"].eq("timing").any() and part["spread_max"].notna().any():
            err = dict(type="data", symmetric=False, array=(part["spread_max"] - part["value"]).tolist(),
                       arrayminus=(part["value"] - part["spread_min"]).tolist())
        traces.append(go.Scatter(x=part[x].tolist(), y=part["value"].tolist(), mode="lines+markers", name=label,
                                 marker=dict(symbol=MARKERS.get(str(key[0]), "circle"), size=10), error_y=err))
    return traces


def charts(frame: Any, x: str, names: Sequence[str] | None = None, title: str | None = None) -> list[Any]:
    """A figure of every numeric measurement vs ``x`` with a dropdown (one figure; [] if nothing to draw)."""
    if x not in frame.columns:
        return []
    ok = frame[frame["value"].notna() & frame[x].notna()]
    names = list(dict.fromkeys(ok["name"])) if names is None else [n for n in names if n in set(ok["name"])]
    if not names:
        return []
    traces, owner = [], []
    for i, name in enumerate(names):
        sub = ok[ok["name"] == name]
        others = [c for c in frame.columns if c not in (*OTHER_COLS, x) and sub[c].nunique(dropna=True) > 1]
        for t in _traces(sub, x, others):
            t.visible = i == 0
            traces.append(t)
            owner.append(i)
    units = {n: ok[ok["name"] == n]["unit"].iloc[0] for n in names}
    buttons = [dict(label=n, method="update",
                    args=[{"visible": [o == i for o in owner]},
                          {"title": f"{n} vs {x}", "yaxis": {"title": {"text": f"{n} ({units[n]})"}}}])
               for i, n in enumerate(names)]
    fig = go.Figure(traces)
    fig.update_layout(title=title or f"{names[0]} vs {x}", xaxis_title=x,
                      yaxis_title=f"{names[0]} ({units[names[0]]})", height=480,
                      margin=dict(l=10, r=10, t=110, b=10), title_y=0.97,
                      updatemenus=[dict(buttons=buttons, direction="down", x=0, xanchor="left", y=1.02,
                                        yanchor="bottom", showactive=True)] if len(names) > 1 else [])
    return [fig]


def write_charts(figures: Sequence[Any], dest: Path, title: str) -> Path:
    """A standalone page with plotly.js inlined once."""
    body = "".join(f.to_html(full_html=False, include_plotlyjs=False) for f in figures) or "<p>nothing to draw</p>"
    dest.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
                    f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body><h1>{title}</h1>"
                    f"{body}</body></html>")
    return dest
