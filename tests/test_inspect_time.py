"""``inspect`` prints step time, tokens/s/chip, MFU and the dominant bound, the compiler's beside the planner's.

Oracles, written here from the published chip figures and the model's shape (not read from the code under test):
the model FLOPs counted by hand for a tiny Llama (MaxText's convention: 6 x matmul weights x tokens + causal
attention); MFU recomputed as those FLOPs over (step x chips x 197 TFLOP/s, Cloud's v5e page); the compiler's compute
time at least the FLOP roofline of the model's FLOPs (full recompute only adds work); tokens/s/chip x step x chips =
the batch's tokens. v4 has no clock in the hardware profiles: its row says so instead of a number.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shardlab.inspect import output
from shardlab.inspect.api import InspectResult, run
from shardlab.inspect.config import layout, make_config
from shardlab.inspect.timing import time_summary

pytestmark = pytest.mark.xla

H, F, HEADS, KV, HD, V, L = 128, 256, 4, 2, 32, 512, 2
B, S, CHIPS = 8, 64, 8
V5E_PEAK = 197e12  # bf16 FLOP/s per chip, Cloud TPU v5e documentation
_R: dict[str, InspectResult] = {}


def _result() -> InspectResult:
    if "r" not in _R:
        cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=B, seq=S, num_layers=L,
                          overrides={"hidden_size": H, "intermediate_size": F, "num_attention_heads": HEADS,
                                     "num_key_value_heads": KV, "vocab_size": V})
        _R["r"] = run(cfg)
    return _R["r"]


def hand_model_flops() -> float:
    per_layer = H * HEADS * HD + 2 * H * KV * HD + HEADS * HD * H + 3 * H * F  # q, k, v, o, gate/up/down
    weights = L * per_layer + V * H  # + the untied LM head; the input embedding is a lookup
    tokens = B * S
    return 6 * weights * tokens + 6 * L * S * HEADS * HD * tokens  # causal attention: 12·L·s·(hq·hd)/2 per token


def test_time_beside_the_planner(xla_world) -> None:  # type: ignore[no-untyped-def]
    r = _result()
    assert r.fits and r.time is not None
    tm = r.time
    assert tm["model_flops"] == pytest.approx(hand_model_flops(), rel=1e-12)
    c, p = tm["compiler"], tm["planner"]
    assert c is not None and p is not None
    assert c["mfu"] == pytest.approx(hand_model_flops() / (c["step_s"] * CHIPS * V5E_PEAK), rel=1e-9)
    assert p["mfu"] == pytest.approx(hand_model_flops() / (p["step_s"] * CHIPS * V5E_PEAK), rel=1e-9)
    assert c["compute_s"] >= hand_model_flops() / (CHIPS * V5E_PEAK)  # no kernel beats the MXU's peak
    assert c["step_s"] == pytest.approx(c["compute_s"] + c["exposed_comm_s"], rel=1e-12)
    assert 0 <= c["exposed_comm_s"] <= c["comm_s"]
    assert c["tokens_per_s_per_chip"] * c["step_s"] * CHIPS == pytest.approx(B * S, rel=1e-12)
    assert set(c["comm_by_axis"]) == {"fsdp"}  # FSDP alone: every collective on the fsdp axis
    assert c["bound"] in ("compute", "hbm", "ici:fsdp") and p["bound"] in ("compute", "communication")
    assert c["unknown_runs"] == []  # every scanned body's trip count read


def test_time_in_every_output(xla_world) -> None:  # type: ignore[no-untyped-def]
    r = _result()
    txt = output.text(r)
    assert "time per step" in txt and "MFU" in txt and "tokens / s / chip" in txt and "dominant bound" in txt
    mfu_line = next(line for line in txt.splitlines() if line.startswith("MFU"))
    assert f"{100 * r.time['compiler']['mfu']:.1f} %" in mfu_line and f"{100 * r.time['planner']['mfu']:.1f} %" \
        in mfu_line
    back = json.loads(output.as_json(r))
    assert back["time"]["compiler"]["step_s"] == pytest.approx(r.time["compiler"]["step_s"])
    assert InspectResult.from_dict(back).time == back["time"]  # a cached result keeps its time
    assert "Time per step" in output.html_fragment(r)


def test_no_clock_says_so(xla_world) -> None:  # type: ignore[no-untyped-def]
    """A generation without a clock (v4) gets "no clock", never a number; the planner's side is still there."""
    r = _result()
    cfg = replace(r.config_object(), topology="v4-16")  # 8 chips (16 TensorCores, megacore)
    from shardlab.inspect.analysis import planner_for

    tm = time_summary(object(), cfg, planner_for(cfg)[0], layout(cfg))  # v4 is refused before a program is read
    assert tm["compiler"] is None and any("no clock" in w for w in tm["why"])
    shown = replace(r, time=tm)
    step_line = next(line for line in output.text(shown).splitlines() if line.startswith("step "))
    assert "no clock" in step_line


def test_flash_kernels_are_named_unpriced(xla_world) -> None:  # type: ignore[no-untyped-def]
    """XLA:TPU gives a Pallas kernel no estimate: the output says its time is missing instead of pricing it at 0."""
    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=B, seq=512, num_layers=L,
                      attention="flash", overrides={"hidden_size": H, "intermediate_size": F,
                                                    "num_attention_heads": HEADS, "num_key_value_heads": KV,
                                                    "vocab_size": V})
    r = run(cfg)
    assert r.fits and r.time["compiler"]["unpriced"]  # forward and backward kernels of each layer's flash call
    assert any("Pallas" in w for w in r.time["why"]) and "Pallas" in output.text(r)
