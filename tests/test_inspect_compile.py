"""``inspect`` end to end at tiny sizes: the five HF families traced with placeholders and compiled by XLA:TPU
(compile-only, v5e-8) on this process's 8 CPU devices.

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
    # measured vs derived: what the program says, and what is layout arithmetic (labelled so in every output)
    assert [m["kind"].split(" ")[0] for m in r.memory if not m["measured"]] == ["gradients", "activations"]
    assert r.row("gradients")["compiler"] == expect["grads"] <= r.totals["temporaries"]
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
    """(~80 s: XLA:TPU works long before it gives up.) A 3M-word vocabulary: 2 x 3M x 2048 weights with AdamW
    = 20 GiB of arguments per chip of 15.75."""
    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=8, seq=64, num_layers=1,
                      overrides={**ATTN, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 3_000_000})
    r = run(cfg, confirm=True)  # the nearest plan is compiled too (in a helper process when it has more chips)
    assert not r.fits and r.exit_status == 1
    assert "Ran out of memory in memory space hbm" in r.message and r.message in r.oom_message
    assert r.totals["checked"] > r.totals["capacity"] == 15.75 * 2**30  # "Used X of 15.75G hbm"
    assert r.largest and all(c["instructions"] == 0 for c in r.collectives)  # no program: the planner's rows only
    assert r.planner is not None and not r.planner["fits"]
    assert r.nearest is not None and r.nearest["total"] <= 0.9 * 15.75 * 2**30  # the planner's fit limit
    assert r.confirmed is not None and r.confirmed["topology"] == r.nearest["topology"]
    assert r.confirmed["fits"]  # the compiler agrees with the planner's nearest plan
    text = output.text(r)
    assert "DOES NOT FIT" in text and "nearest plan that fits" in text and "confirmed by the compiler" in text


def test_outputs_render_and_round_trip(xla_world) -> None:  # type: ignore[no-untyped-def]
    r = _RESULTS.get("gpt2") or run(tiny("gpt2"))
    back = InspectResult.from_dict(json.loads(output.as_json(r)))
    assert back.as_dict() == json.loads(output.as_json(r))
    page = output.html_page(r)
    assert page.startswith("<!DOCTYPE html>") and "plotly" in page and "Memory per chip" in page
    text = output.text(r)
    assert "collectives per step" in text
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert " derived " in rows["gradients"] and " measured " in rows["parameters"]
    assert "(derived)" in page and "measured</b> = read from the compiled program" in page


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


# The first lines and two largest allocations of XLA:TPU's message for Llama 3 8B on v5e-8 (fsdp 8, batch 8,
# seq 8192; data/models/inspect_full.json): the program alone was over, so the arguments were not evaluated.
OOM = """RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 32.34G of 15.75G hbm. Exceeded hbm capacity by 16.59G.

Total hbm usage >= 32.59G:
    reserved        258.00M 
    program          32.34G 
    arguments            0B 

Output size 0B; shares 0B with arguments.

Program hbm requirement 32.34G:
    global           304.5K
    HLO temp         32.34G (100.0% utilization: Unpadded (28.52G) Padded (28.52G), 11.8% fragmentation (3.82G))

  Largest program allocations in hbm:

  1. Size: 8.00G
     Operator: op_name="call.2205/call.2046/broadcast.1258"
     Shape: f32[32,8192,8192]{1,2,0:T(8,128)}
     Unpadded size: 8.00G
     XLA label: fusion.988 = fusion(subtract_exponential_fusion.5), kind=kOutput, calls=fused_computation.606.clone
     Allocation type: HLO temp
     ==========================

  2. Size: 4.00G
     Operator: op_name="call.2205/call.2046/dot.1473"
     Shape: bf16[32,8192,8192]{1,2,0:T(8,128)(2,1)}
     Unpadded size: 4.00G
     XLA label: fusion.1001.remat3 = fusion(bitcast.1634, copy-done.5), kind=kOutput, calls=fused_computation.695
     Allocation type: HLO temp
"""  # noqa: E501,W291


def test_an_out_of_memory_message_becomes_the_table() -> None:
    """No compile: the analysis of a real message (the slow test above compiles one)."""
    from shardlab.inspect import analysis as A
    from shardlab.inspect.api import _Compiled
    from shardlab.profile.tpu_memory import parse_oom

    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=8, seq=8192).validate()
    plan, _ = A.planner_for(cfg)
    rows, totals = A.memory_rows(_Compiled(False, parse_oom(OOM)), cfg, plan)
    by = {r["kind"].split(" (")[0]: r for r in rows}
    g = 2**30
    assert totals["used"] == round(32.34 * g) and totals["lower_bound"] and totals["arguments"] is None
    # parameters 8,030,261,248 bf16 over 8 chips; AdamW 3 fp32 per parameter (all dims divide: no padding)
    assert by["parameters"]["compiler"] == 8_030_261_248 * 2 // 8 and by["optimizer state"]["compiler"] == \
        8_030_261_248 * 12 // 8
    assert by["total"]["compiler"] == totals["used"] + by["parameters"]["compiler"] + \
        by["optimizer state"]["compiler"] + by["inputs"]["compiler"]
    assert by["arguments"]["source"] == "not evaluated"
    big = A.largest(_Compiled(False, parse_oom(OOM)))
    assert [b["shape"].split("{")[0] for b in big] == ["f32[32,8192,8192]", "bf16[32,8192,8192]"]
    assert by["parameters"]["ratio"] == 1.0  # the planner's bf16 parameters per chip: the same arithmetic
