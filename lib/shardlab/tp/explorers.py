"""Notebooks 02-04's explorers, declared (:mod:`shardlab.core.explorer` builds them): sliders for a small
configuration (tp, batch, seq, hidden, heads, vocab); each change asks :func:`shardlab.tp.case.explore` for its
formula and ledger (forward + backward) and shows both, the ledger as a table."""

from __future__ import annotations

from typing import Any

from shardlab.core.explorer import Explorer, Shown, Slider, cause
from shardlab.tp.case import explore
from shardlab.tp.figures import ledger_frame

CONTROLS = {"tp": Slider(1, 8, default=2), "batch": Slider(1, 8, default=2), "seq": Slider(1, 64, default=8),
            "hidden": Slider(4, 128, 4, default=16), "heads": Slider(1, 16, default=4),
            "vocab": Slider(8, 1024, default=50)}


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    ok = res["formula"] == res["ledger"]
    extra = f", gathered logits would be {res['gathered_bytes']} B" if "gathered_bytes" in res else ""
    return Shown(ok, f"formula {res['formula']} &nbsp; ledger {res['ledger']} &nbsp; {'match' if ok else 'MISMATCH'}"
                     f"{extra}", table=ledger_frame(res["ledger_obj"]).to_html(index=False))


def _declare(kind: str) -> Explorer:
    # any error a bad combination raises in the ranks is shown (the world re-raises it: its cause is the message)
    return Explorer(CONTROLS, lambda _p, v: explore(kind, **v), _show, errors=(Exception,), reason=cause)


EXPLORERS = {"02_megatron_mlp": _declare("mlp"), "03_megatron_attention": _declare("attention"),
             "04_vocab_parallel_embedding_ce": _declare("embedding_ce")}
