"""Notebook 11's explorer, declared (:mod:`shardlab.core.explorer` builds it): sliders over the notebook's own
parameters (ep, tokens, experts, top_k, capacity factor); each change re-evaluates
:func:`shardlab.expert.case.explore` on them and shows its numbers and the dispatch matrix."""

from __future__ import annotations

from typing import Any

import pandas as pd

from shardlab.core.explorer import Explorer, Shown, Slider, cause
from shardlab.expert.case import explore
from shardlab.expert.figures import dispatch_matrix


def _show(res: dict[str, Any], v: dict[str, Any]) -> Shown:
    ok = res["formula"] == res["ledger"] and res["dropped"] == res["measured"] and res["parity"]
    status = (f"C = {res['capacity']} slots per expert &nbsp; forward all-to-alls (dispatch + combine) per device: "
              f"formula {res['formula']} B, ledger {res['ledger']} B (wire {res['wire']:.0f} B) &nbsp; "
              f"dropped: formula {res['dropped']:.4f}, "
              f"measured {res['measured']:.4f}, uniform routing {res['uniform']:.4f} &nbsp; expert weights per chip "
              f"{res['expert_bytes']} B &nbsp; {'match' if ok else 'MISMATCH'}")
    ep = v["ep"]
    m = dispatch_matrix(res["loads"], res["capacity"], ep)
    table = ("<p>tokens rank i sends to rank j (kept assignments; every cell carries "
             f"{res['capacity'] * v['experts'] // ep} slots)</p>"
             + pd.DataFrame(m, index=[f"from {i}" for i in range(ep)],
                            columns=[f"to {j}" for j in range(ep)]).to_html())
    return Shown(ok, status, table=table)


EXPLORERS = {"11_expert_parallel": Explorer(
    controls={"ep": Slider(1, 8), "tokens": Slider(8, 256, 8, label="tokens S"),
              "experts": Slider(1, 16, label="experts E"), "top_k": Slider(1, 4),
              "capacity_factor": Slider(0.25, 3.0, 0.25, label="capacity")},
    evaluate=lambda q, _v: explore(q), show=_show, fields=True, errors=(Exception,), reason=cause)}
