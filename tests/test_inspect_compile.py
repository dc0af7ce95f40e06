"""``inspect`` end to end at tiny sizes: the five HF families traced with placeholders and compiled by XLA:TPU
(compile-only, v5e:2x4) on this process's 8 CPU devices.

Oracles: the per-chip argument bytes the compiler's partitioned program declares (``entry_computation_layout``)
against the plan's own arithmetic (sharded shapes, uneven dims padded) — equal only if the compiler kept every
annotated layout; the model's parameter count against the module tree; which mesh axis each collective runs on
against the plan (FSDP alone: every all-gather and reduce-scatter on ``fsdp``); the compiler's out-of-memory
message against the verdict. No timed assertions: compile seconds are reported, never checked.
"""

from __future__ import annotations

import json

import pytest

from shardlab.inspect import output
from shardlab.inspect.analysis import layout_bytes
from shardlab.inspect.api import InspectResult, run
from shardlab.inspect.config import make_config

pytestmark = pytest.mark.xla

ATTN = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512}
TINY = {
    "llama-3-8b": ATTN,
    "mistral-7b": {**ATTN, "sliding_window": 32},
    "mixtral-8x7b": {**ATTN, "num_local_experts": 4},
    "gemma-2b": {**ATTN, "num_key_value_heads": 1, "head_dim": 32},
    "gpt2": {"n_embd": 128, "n_head": 4, "vocab_size": 512},
}
_RESULTS: dict[str, InspectResult] = {}


MESH = {"llama-3-8b": "fsdp=4,tensor=2"}  # Llama with Megatron tensor parallelism too; the others FSDP alone


def tiny(name: str, **kw):  # type: ignore[no-untyped-def]
    kw = {"mesh": MESH.get(name, "fsdp=8"), "topology": "v5e-8", "batch": 8, "seq": 64, "num_layers": 2, **kw}
    return make_config(name, overrides=TINY[name], **kw)


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_step_fits_and_the_compiler_kept_the_plan(name: str, xla_world) -> None:  # type: ignore[no-untyped-def]
    """Every family compiles (about 10-15 s each here: the step's HLO is a few thousand instructions)."""
    cfg = tiny(name)
    r = _RESULTS[name] = run(cfg)
    assert r.fits and r.exit_status == 0 and r.where == "this process"
    expect = layout_bytes(cfg)
    assert r.row("parameters")["compiler"] == expect["params"]
    assert r.row("optimizer state")["compiler"] == expect["optimizer"] == 6 * expect["params"]  # 3 fp32 per bf16
    # the memory stats' argument bytes include the TPU's tile padding ((8, 128) tiles), the layout's shapes do not
    assert r.totals["arguments"] >= expect["params"] + expect["optimizer"] + r.row("inputs")["compiler"]
    assert r.row("total")["compiler"] == r.totals["arguments"] + r.totals["temporaries"]
    if cfg.tensor is None:  # FSDP alone: weights gathered and gradients scattered on fsdp, nothing else
        gathers = {c["axes"] for c in r.collectives if c["op"] in ("all-gather", "reduce-scatter")}
        assert gathers == {"fsdp"}, r.collectives
    else:  # Megatron: q k v gate up by columns, o down by rows, embedding and LM head by vocabulary, per layer
        assert (r.rules["megatron column"], r.rules["megatron row"], r.rules["megatron vocabulary"]) == (10, 4, 2)
        on_tensor = {c["op"] for c in r.collectives if c["axes"] == "tensor"}
        assert "all-reduce" in on_tensor  # Megatron's f / g in the layers (and the vocabulary-parallel loss)
    assert r.planner is not None and r.planner["fits"]
    # the module tree's parameter count against the planner's formula: equal where the planner sees every tensor
    h, v, layers = 128, 512, 2
    extra = {"llama-3-8b": 0, "mistral-7b": 0, "gemma-2b": -v * h,  # tied: the planner counts the LM head too
             "mixtral-8x7b": layers * 4 * h,  # the router [E, h] per layer, which the planner does not count
             "gpt2": None}[name]
    if extra is not None:
        assert r.params["model"] - r.params["planner"] == extra


@pytest.mark.slow
def test_out_of_memory_is_the_compilers_verdict(xla_world) -> None:  # type: ignore[no-untyped-def]
    """(~80 s: XLA:TPU works long before it gives up.) A 3M-word vocabulary: 2 x 3M x 2048 weights with AdamW = 20 GiB of arguments per chip of 15.75."""
    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=8, seq=64, num_layers=1,
                      overrides={**ATTN, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 3_000_000})
    r = run(cfg)
    assert not r.fits and r.exit_status == 1
    assert "Ran out of memory in memory space hbm" in r.message and r.message in r.oom_message
    assert r.totals["checked"] > r.totals["capacity"] == 15.75 * 2**30  # "Used X of 15.75G hbm"
    assert r.largest and all(c["instructions"] == 0 for c in r.collectives)  # no program: the planner's rows only
    assert r.planner is not None and not r.planner["fits"]
    assert r.nearest is not None and r.nearest["total"] <= 0.9 * 15.75 * 2**30  # the planner's fit limit
    text = output.text(r)
    assert "DOES NOT FIT" in text and "nearest plan that fits" in text


def test_outputs_render_and_round_trip(xla_world) -> None:  # type: ignore[no-untyped-def]
    r = _RESULTS.get("gpt2") or run(tiny("gpt2"))
    back = InspectResult.from_dict(json.loads(output.as_json(r)))
    assert back.as_dict() == json.loads(output.as_json(r))
    page = output.html_page(r)
    assert page.startswith("<!DOCTYPE html>") and "plotly" in page and "Memory per chip" in page
    assert "collectives per step" in output.text(r)


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["loop", "scan_layers"])
def test_layer_modes_hold_the_same_state(layers: str, xla_world) -> None:  # type: ignore[no-untyped-def]
    """loop and scan_layers keep per-layer weights, scan keeps them stacked: the same bytes per chip."""
    cfg = tiny("llama-3-8b", layers=layers)
    r = run(cfg)
    ref = _RESULTS.get("llama-3-8b") or run(tiny("llama-3-8b"))
    assert r.fits
    for kind in ("parameters", "optimizer state"):
        assert r.row(kind)["compiler"] == ref.row(kind)["compiler"] == layout_bytes(cfg)[
            "params" if kind == "parameters" else "optimizer"]
