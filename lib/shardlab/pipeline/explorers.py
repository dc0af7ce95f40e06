"""Notebook 09's explorer, declared (:mod:`shardlab.core.explorer` builds it): p, m, v sliders over
:func:`shardlab.pipeline.timeline.compare` (bubble, memory, traffic of every schedule).

``update(**kw)`` returns ``{"ok", "rows", "errors", "torch", p, m, v}``: ok when every order written from the
papers' rules measures its formula; ``torch`` lists the schedules timed in PyTorch's own order because only
Megatron-LM's rule refused them (their bubble is shown beside the formula, not required to equal it: below m = p
it is larger); a schedule that cannot run is listed in ``errors`` and shown in the status line, never raised. The
notebook passes ``message_bytes`` (one send's payload) as a fixed setting."""

from __future__ import annotations

from typing import Any

from shardlab.core.explorer import ERROR_STYLE, Explorer, Shown, Slider
from shardlab.pipeline.timeline import compare

HEAD = ("<table><tr><th>schedule</th><th>idle share of step</th><th>bubble / ideal</th>"
        "<th>held on device 0 (stage-microbatches)</th><th>p2p messages</th><th>p2p bytes</th></tr>")


def _evaluate(_p: Any, v: dict[str, Any]) -> dict[str, Any]:
    try:
        rows = compare(v["p"], v["m"], v["v"], v.get("message_bytes", 0))
    except ValueError as exc:  # (p, m, v) no schedule accepts: shown in red, listed in "errors"
        return {"rows": [], "good": [], "errors": [str(exc)], "torch_rows": [], "torch": [], "refused": str(exc)}
    good = [r for r in rows if "error" not in r]
    errors = [f"{r['schedule']}: {r['error']}" for r in rows if "error" in r]
    torch_rows = [r for r in good if r["order"] == "PyTorch"]
    return {"rows": rows, "good": good, "errors": errors, "torch_rows": torch_rows,
            "torch": [r["schedule"] for r in torch_rows]}


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    if "refused" in res:
        return Shown(False, ERROR_STYLE.format(res["refused"]))
    good, errors = res["good"], res["errors"]
    ok = all(r["bubble_fraction"] == r["formula_fraction"] and r["bubble_ratio"] == r["formula_ratio"]
             and r["inflight"] == r["formula_inflight"] for r in good if r["order"] == "ours")
    cells = "".join(
        f"<tr><td>{r['schedule']}</td><td>{float(r['bubble_fraction']):.3f}</td>"
        f"<td>{float(r['bubble_ratio']):.3f}</td><td>{float(r['inflight']):g}</td><td>{r['messages']}</td>"
        f"<td>{r['bytes']:,}</td></tr>" for r in good)
    bad = "".join(f"<br><b style='color:#c00'>{e}</b>" for e in errors)
    theirs = "".join(f"<br>{r['schedule']}: m % p != 0 (Megatron-LM's rule) but PyTorch's order runs; its "
                     f"idle share {float(r['bubble_fraction']):.3f}, formula {float(r['formula_fraction']):.3f}"
                     for r in res["torch_rows"])
    return Shown(ok and not errors, f"timed orders {'match' if ok else 'DO NOT match'} the formulas{theirs}{bad}",
                 table=f"{HEAD}{cells}</table>")


EXPLORERS = {"09_pipeline": Explorer(
    controls={"p": Slider(1, 16, label="p (stages)", default=4), "m": Slider(1, 64, label="m (micro)", default=8),
              "v": Slider(1, 8, label="v (chunks)", default=2)},
    evaluate=_evaluate, show=_show)}
