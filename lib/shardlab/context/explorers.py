"""Notebook 10's explorer, declared (:mod:`shardlab.core.explorer` builds it): sliders for a small ring (heads =
2·kv_heads, batch 1); each change asks :func:`shardlab.context.balance.explore` for the formulas and a
``SimulatedWorld`` ring of that configuration and shows them side by side."""

from __future__ import annotations

from typing import Any

import pandas as pd

from shardlab.context.balance import explore
from shardlab.core.explorer import Choice, Explorer, Shown, Slider, Toggle


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    f, led = res["formula"], res["ledger"]
    ok = f == led and res["formula_work"] == res["work"]
    status = (f"ring forward + backward per rank: formula {f['count']} sends / {f['bytes']} B, ledger "
              f"{led['count']} / {led['bytes']} B — {'match' if ok else 'MISMATCH'}; all-gather CP "
              f"forward: 2 × {res['allgather_payload']} B payload (same wire bytes as the ring's forward); "
              f"work max / mean {res['max_over_mean']:.3f}")
    table = pd.DataFrame({"rank": range(len(res["work"])), "work (formula)": res["formula_work"],
                          "work (counted)": res["work"]}).to_html(index=False)
    return Shown(ok, status, table=table)


EXPLORERS = {"10_context_parallel": Explorer(
    controls={"cp": Slider(1, 8, default=4), "seq": Slider(8, 256, 8, default=32),
              "kv_heads": Slider(1, 8, default=2), "head_dim": Slider(4, 64, 4, default=8),
              "layout": Choice(["contiguous", "zigzag"], default="zigzag"), "causal": Toggle(default=True)},
    evaluate=lambda _p, v: explore(**v), show=_show)}
