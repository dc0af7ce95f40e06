"""tp.figures: ownership pictures agree with vocab_range / the Megatron split, and the explorer works headless."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.core.explorer import explorer_for
from shardlab.tp import figures as vtp
from shardlab.tp import vocab_range
from shardlab.tp.case import explore
from shardlab.tp.params import AttentionParams, MlpParams, VocabParams


def test_mlp_and_attention_panels_follow_the_split() -> None:
    (_, a), (_, b) = vtp.mlp_panels(hidden=4, ffn=8, tp=4)
    assert a.shape == (4, 8) and list(a[0]) == [0, 0, 1, 1, 2, 2, 3, 3]  # A by columns
    assert b.shape == (8, 4) and list(b[:, 0]) == [0, 0, 1, 1, 2, 2, 3, 3]  # B by the matching rows
    panels = vtp.attention_panels(hidden=8, heads=4, tp=2)
    assert [t.split()[0] for t, _ in panels] == ["W_Q", "W_K", "W_V", "W_out"]
    assert list(panels[0][1][0]) == [0] * 4 + [1] * 4  # 2 heads of hd=2 per device


@pytest.mark.parametrize("vocab,tp", [(10, 4), (50257, 8), (1003, 4)])
def test_embedding_panels_owner_matches_vocab_range(vocab: int, tp: int) -> None:
    (_, table), (_, logits) = vtp.embedding_panels(vocab, 16, tp)
    drawn = np.linspace(0, vocab - 1, min(vocab, 240)).round().astype(int)
    for row_id, owner in zip(drawn, table[:, 0], strict=True):
        s, e = vocab_range(vocab, int(owner), tp)
        assert s <= row_id < e
    assert (logits[0] == table[:, 0]).all()


def test_explorer_headless_update_and_bad_input() -> None:
    pytest.importorskip("ipywidgets")
    for kind, bad in [("mlp", dict(tp=3, hidden=16)), ("attention", dict(tp=4, heads=6, hidden=24)),
                      ("embedding_ce", dict(tp=8, vocab=4))]:
        params = {"mlp": MlpParams, "attention": AttentionParams, "embedding_ce": VocabParams}[kind]()
        ui, update = explorer_for(params, tp=2, batch=1, seq=4, hidden=16, heads=4, vocab=50)
        shown = update()
        assert shown["ok"] and shown["formula"] == shown["ledger"]
        failed = update(**bad)
        assert not failed["ok"] and ("not divisible" in failed["error"] or "smaller than" in failed["error"])
        assert update(tp=4)["ok"]  # and recovers


def test_figures_build() -> None:
    res = explore("embedding_ce", tp=4, batch=1, seq=4, hidden=8, heads=2, vocab=53)
    assert [e.seq for e in res["ledger_obj"]] == list(range(4))  # embedding g + CE max/target/sumexp
    fig = vtp.ledger_timeline(res["ledger_obj"])
    assert sum(len(t.x) for t in fig.data) == 4
    assert list(vtp.ledger_frame(res["ledger_obj"])["op"]) == ["all_reduce"] * 4
    ratio = vtp.saving_ratio_figure([1000, 50257], [8])
    wire, payload = ratio.data  # tp=8: wire p ceil(V/p) / 6, payload ceil(V/p) / 3
    assert list(wire.y) == pytest.approx([8 * 125 / 6, 8 * 6283 / 6])
    assert list(payload.y) == pytest.approx([125 / 3, 6283 / 3])
    assert len(vtp.ownership_figure(vtp.mlp_panels(4, 8, 2), 2).data) == 2
