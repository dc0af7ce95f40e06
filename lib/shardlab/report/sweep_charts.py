"""Plotly charts of a sweep table: any measurement vs any parameter.

Design note
-----------
One figure per x parameter. Each numeric measurement name gets its traces (one per source — formula,
ledger, hlo ... — and per combination of the other swept parameters); a dropdown shows one measurement at
a time, so "any measurement vs any parameter" is one page however many names a notebook records. Sources
are drawn with distinct markers so three agreeing views visibly sit on top of each other. Timing rows get
error bars from their [min, max] spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

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


def chart(frame: Any, x: str, name: str, title: str | None = None) -> Any:
    """One measurement ``name`` vs parameter ``x``."""
    sub = frame[(frame["name"] == name) & frame["value"].notna() & frame[x].notna()]
    others = [c for c in frame.columns if c not in (*OTHER_COLS, x) and sub[c].nunique(dropna=True) > 1]
    fig = go.Figure(_traces(sub, x, others))
    unit = sub["unit"].iloc[0] if len(sub) else ""
    fig.update_layout(title=title or f"{name} vs {x}", xaxis_title=x, yaxis_title=f"{name} ({unit})", height=420,
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def charts(frame: Any, x: str, names: Sequence[str] | None = None, title: str | None = None) -> list[Any]:
    """A figure of every numeric measurement vs ``x`` with a dropdown (one figure; [] if nothing to draw)."""
    if x not in frame.columns:
        return []
    ok = frame[frame["value"].notna() & frame[x].notna()]
    names = list(dict.fromkeys(ok["name"])) if names is None else [n for n in names if n in set(ok["name"])]
    if not names:
        return []
    if len(names) == 1:
        return [chart(frame, x, names[0], title)]
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
                                        yanchor="bottom", showactive=True)])
    return [fig]


def write_charts(figures: Sequence[Any], dest: Path, title: str) -> Path:
    """A standalone page with plotly.js inlined once."""
    body = "".join(f.to_html(full_html=False, include_plotlyjs=False) for f in figures) or "<p>nothing to draw</p>"
    dest.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
                    f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body><h1>{title}</h1>"
                    f"{body}</body></html>")
    return dest
