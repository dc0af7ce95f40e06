"""The explorer hook (shardlab.core.explorer): every registered notebook's declared explorer builds its widgets, and a
callback run at non-default values shows what calling the topic's own functions at those values gives — headless,
no browser: ``update(**values)`` is what a control change runs."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from shardlab.core import topics
from shardlab.core.explorer import Choice, Explorer, Shown, Slider, Text, build, explorer_for

# the notebooks whose source has an explorer cell: each declares one (and no other notebook does)
WITH_EXPLORER = {stem for stem, lesson in topics.lessons().items() if "explorer_for(" in lesson.source.read_text()}


def test_every_explorer_cell_has_a_declaration_and_every_declaration_a_cell() -> None:
    declared = {stem for stem in topics.lessons() if topics.explorers(stem) is not None}
    assert declared == WITH_EXPLORER == set(CASES) and len(declared) >= 12
    with pytest.raises(KeyError, match="13_step_time.*declares no explorer"):
        topics.explorer_of("13_step_time")


@pytest.mark.parametrize("stem", sorted(WITH_EXPLORER))
def test_the_hook_builds_every_declared_explorer(stem: str) -> None:
    """At the notebook's default parameters: one widget per declared control, with its declared description, and
    the controls, status, table and figure area laid out (nothing evaluated yet)."""
    spec = topics.explorer_of(stem)
    live = explorer_for(topics.lesson(stem).params())
    assert list(live.controls) == list(spec.controls)
    for name, control in spec.controls.items():
        assert live.controls[name].description == (control.label or name)
    rows = [c for c in live.widget.children if hasattr(c, "children")]
    assert [w for row in rows for w in row.children if w in live.controls.values()] == list(live.controls.values())
    assert live.result == {} and live.status.value == ""


# ---- a callback at non-default values == the topic called directly -----------------------------------------------
def _tp(kind: str, v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.tp.case import explore
    from shardlab.tp.figures import ledger_frame

    res = explore(kind, **v)
    return {"table": ledger_frame(res["ledger_obj"]).to_html(index=False), "formula": res["formula"],
            "ledger": res["ledger"]}


def _blocks(v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.blocks.figures import block_check, split_figure

    return {"figure": split_figure(**v).to_dict(), "max_abs_err": block_check(**v)}


def _fsdp(v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.fsdp.figures import flat_buffer_figure
    from shardlab.fsdp.flat_param import plan_flat_shards_for
    from shardlab.fsdp.params import FsdpParams
    from shardlab.fsdp.train import make_model

    model = make_model(FsdpParams(layer_sizes=v["layer_sizes"]))
    plan = plan_flat_shards_for(model, v["world_size"], use_orig_params=v["use_orig_params"])
    return {"figure": flat_buffer_figure(plan, [n for n, _ in model.named_parameters()]).to_dict(), "plan": plan}


def _scan(p: Any, v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.xla_scan.sections import explore

    res = explore(p, *v["mesh"], v["L"], v["hidden"])
    return {"table": pd.DataFrame(res).T.to_html(), "on": res["on"], "off": res["off"]}


def _planner(p: Any, v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.planner import plan
    from shardlab.planner.figures import memory_figure, summary_frame

    q = plan(replace(p, **v))
    return {"table": summary_frame(q).to_html(), "figure": memory_figure(q).to_dict(), "status": q.verdict}


def _memory(p: Any, v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.memory import graph, roam

    res = roam.quick(graph.trace_step(replace(p, **v).validate()))
    table = pd.DataFrame([{k: res[k] for k in ("program", "greedy", "eager", "end", "best")}], index=["peak bytes"])
    return {"table": table.to_html(), "best": res["best"], "program": res["program"]}


def _pipeline(v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.pipeline.timeline import compare

    return {"rows": compare(v["p"], v["m"], v["v"], 256)}


def _context(v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.context.balance import explore

    res = explore(**v)
    table = pd.DataFrame({"rank": range(len(res["work"])), "work (formula)": res["formula_work"],
                          "work (counted)": res["work"]})
    return {"table": table.to_html(index=False), "formula": res["formula"], "ledger": res["ledger"]}


def _expert(p: Any, v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.expert.case import explore

    res = explore(replace(p, **v))
    return {k: res[k] for k in ("capacity", "formula", "ledger", "dropped", "measured", "loads", "expert_bytes")}


def _inspect(v: dict[str, Any]) -> dict[str, Any]:
    from shardlab.inspect.notebook import explore

    return explore(**v)


# stem -> (non-default values, the topic called directly at those values -> what the explorer must show)
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "01_block_matrices": ({"m": 6, "k": 8, "n": 4, "parts": 4, "kind": "grid"}, lambda p, v: _blocks(v)),
    "02_megatron_mlp": ({"tp": 4, "batch": 1, "seq": 4, "hidden": 32}, lambda p, v: _tp("mlp", {
        "heads": 4, "vocab": 50, **v})),
    "03_megatron_attention": ({"tp": 2, "batch": 1, "seq": 6, "hidden": 24, "heads": 6},
                              lambda p, v: _tp("attention", {"vocab": 50, **v})),
    "04_vocab_parallel_embedding_ce": ({"tp": 4, "batch": 1, "seq": 4, "hidden": 8, "vocab": 53},
                                       lambda p, v: _tp("embedding_ce", {"heads": 4, **v})),
    "05_fsdp_flat_params": ({"layer_sizes": (5, 7, 3), "world_size": 3, "use_orig_params": True},
                            lambda p, v: _fsdp(v)),
    "06_scan_shard_as": ({}, _scan),  # the second mesh, the other L and hidden: set below from the options
    "07_planner": ({"fsdp": 4, "data": 2, "recompute": "selective"}, _planner),
    "08b_memory": ({"hidden": 32, "ffn": 64, "step_seq": 4}, _memory),
    "09_pipeline": ({"p": 2, "m": 6, "v": 3}, lambda p, v: _pipeline(v)),
    "10_context_parallel": ({"cp": 2, "seq": 16, "kv_heads": 1, "head_dim": 4, "layout": "contiguous"},
                            lambda p, v: _context({"causal": True, **v})),
    "11_expert_parallel": ({"ep": 2, "tokens": 16, "experts": 4, "top_k": 1, "capacity_factor": 1.5}, _expert),
    "12_your_model": ({"topology": "v5e-16", "fsdp": 4, "tensor": 2, "batch": 16, "seq": 4096},
                      lambda p, v: _inspect({"model": "llama-3-8b", "recompute": "full", **v})),
}


def _fixed(stem: str) -> dict[str, Any]:
    return {"message_bytes": 256} if stem == "09_pipeline" else {}


def _values(stem: str, live: Any) -> dict[str, Any]:
    if stem != "06_scan_shard_as":
        return CASES[stem][0]
    return {name: w.options[-1][1] if isinstance(w.options[-1], tuple) else w.options[-1]
            for name, w in live.controls.items()}


@pytest.mark.parametrize("stem", sorted(CASES))
def test_a_callback_at_non_default_values_shows_what_the_topic_computes(stem: str) -> None:
    p = topics.lesson(stem).params()
    if stem == "11_expert_parallel":
        p = replace(p, hidden=16, ffn=32)
    live = explorer_for(p, **_fixed(stem))
    values = _values(stem, live)
    defaults = {name: w.value for name, w in live.controls.items()}
    assert any(defaults[k] != x for k, x in values.items()), "the values must differ from the defaults"
    shown = live.update(**values)
    direct = CASES[stem][1](p, values)
    assert shown["ok"], shown.get("error")
    assert {k: shown[k] for k in values} == values  # what ran is what was asked for
    for key, want in direct.items():
        if key == "table":
            assert live.table.value == want
        elif key == "figure":
            assert shown["figure"].to_dict() == want and len(live.out.outputs) == 1
        elif key == "status":
            assert live.status.value == want
        elif key == "plan":
            assert shown["plan"] == want
        else:
            assert shown[key] == want, key
    # the widgets did not move (update's keywords are one evaluation), and a control change runs the same path
    assert {name: w.value for name, w in live.controls.items()} == defaults


# ---- the hook's own rules, on a declaration that is no notebook's ----------------------------------------------
def _toy() -> Explorer:
    def evaluate(_p: Any, v: dict[str, Any]) -> dict[str, Any]:
        if v["a"] % v["b"]:
            raise ValueError(f"a={v['a']} is not divisible by b={v['b']}")
        return {"quotient": v["a"] // v["b"], "scale": v.get("scale", 1)}

    return Explorer({"a": Slider(1, 12, default=6), "b": Slider(1, 4, default=2),
                     "mode": Choice(["x", "y"]), "sizes": Text(lambda s: tuple(int(t) for t in s.split(",")),
                                                               lambda t: ",".join(map(str, t)), default="1,2")},
                    evaluate, lambda res, v: Shown(True, f"q={res['quotient']}", table=f"<p>{v['sizes']}</p>"))


def test_a_bad_combination_is_shown_in_red_not_raised_and_observers_rerun() -> None:
    live = build(_toy(), None, {"a": 8}, {"scale": 3})
    ui, update = live  # unpacks as (widget, update)
    assert ui is live.widget and live.controls["a"].value == 8 and live.controls["mode"].value == "x"
    assert update() == {"ok": True, "quotient": 4, "scale": 3, "a": 8, "b": 2, "mode": "x", "sizes": "1,2"}
    bad = update(b=3)
    assert bad == {"ok": False, "error": "a=8 is not divisible by b=3", "a": 8, "b": 3, "mode": "x", "sizes": "1,2"}
    assert re.search(r"color:#c00.*not divisible", live.status.value) and live.table.value == ""
    assert live.error == "a=8 is not divisible by b=3" and live.quotient is None  # the last result's keys
    assert not update(sizes="1,x")["ok"]  # a text the parser refuses is shown like any bad value
    live.controls["a"].value = 12  # an observer re-evaluates on every change
    assert live.result["quotient"] == 6 and live.status.value == "q=6" and live.table.value == "<p>(1, 2)</p>"
    with pytest.raises(TypeError, match=r"update\(\) got \['c'\]"):
        update(c=1)


def test_initial_values_follow_the_declared_order() -> None:
    """The call's keyword, else the declaration's initial(p), else the parameter field (fields=True), else the
    control's default."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Toy:
        a: int = 9
        b: int = 3

    spec = Explorer({"a": Slider(1, 12, default=6), "b": Slider(1, 4, default=2), "c": Slider(1, 4, default=4)},
                    lambda p, v: {"a_times_c": p.a * v["c"]}, lambda res, v: Shown(True, ""), fields=False,
                    initial=lambda p: {"b": 1})
    assert spec.values(Toy(), {}) == {"a": 6, "b": 1, "c": 4}  # not over the fields: defaults
    spec = replace(spec, controls={k: spec.controls[k] for k in ("a", "b")}, fields=True,
                   evaluate=lambda p, v: {"a_times_b": p.a * p.b})
    assert spec.values(Toy(), {}) == {"a": 9, "b": 1}
    assert spec.values(Toy(), {"b": 4}) == {"a": 9, "b": 4}
    live = build(spec, Toy())
    assert live.update()["a_times_b"] == 9  # the evaluation got the parameter object with the controls' values
    assert live.update(a=5, b=2)["a_times_b"] == 10
