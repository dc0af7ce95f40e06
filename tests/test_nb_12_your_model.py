"""Notebook 12 through papermill: at its defaults (a tiny Llama 3 8B compiled live on v5e-8, fsdp 4 x tensor 2;
the full-size runs cached), at four devices (a tiny GPT-2 on v5e-4 with a rule of the learner's; the learner's
full-size model not cached: the planner and the plan's bytes), with the layer-mode comparison compiled live (a tiny
Mistral, its sliding window, on fsdp 8), and with a mesh that does not tile the slice. Every in-notebook check passes
(``run_notebook`` asserts it, the graded answer key included).

Oracles: per-chip parameter bytes of the tiny runs worked out here from the architectures' shapes and the sharding
rules (Megatron: column-parallel weights split on the tensor axis, FSDP on the first other dimension the fsdp degree
divides — written out per tensor, not through the library's layout code); AdamW's fp32 state = 3 x 4 / 2 = 6 x those
bytes; Llama 3 8B's 8,030,261,248 parameters (counted by hand in data/answers/12_your_model.json) for the planner's
full-size rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent.parent / "data" / "models"

LLAMA_8B = 8_030_261_248  # parameters (hand count: 32 x 218,112,000 + 2 x 128256 x 4096 + 4096)


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


def _checks(record) -> set[str]:  # type: ignore[no-untyped-def]
    return {c["name"] for c in record["checks"]}


def llama_tiny_params(fsdp: int, tensor: int, layers: int = 2, h: int = 128, ffn: int = 256, kv: int = 64,
                      vocab: int = 512) -> int:
    """Per-chip bf16 bytes of the tiny Llama: q, k, v, gate, up [out_T, in_F]; o, down [out_F, in_T]; embedding and
    LM head [V_T, h_F]; RMSNorm weights [h_F]. Every dimension here is divisible by its split."""
    n = fsdp * tensor
    per_layer = (h * h + 2 * kv * h + h * h + 3 * ffn * h) // n + 2 * h // fsdp
    return 2 * (layers * per_layer + 2 * vocab * h // n + h // fsdp)


def gpt2_params(fsdp: int, tensor: int, layers: int = 2, h: int = 128, vocab: int = 512,
                positions: int = 1024) -> int:
    """Per-chip bf16 bytes of GPT-2 (Conv1D weights [in, out]): c_attn [h, 3h] and c_fc [h, 4h] by columns (their
    biases split on tensor only), attn / mlp c_proj by rows (biases: FSDP), LayerNorms on FSDP, wte by vocabulary
    (padded up to a multiple of tensor; tied LM head: one tensor), wpe by the learner's rule (None, tensor) + FSDP on
    its rows. Defaults: the tiny widths."""
    n = fsdp * tensor
    per_layer = (3 * h * h + 4 * h * h + h * h + 4 * h * h) // n  # c_attn, c_fc, attn c_proj, mlp c_proj weights
    per_layer += (3 * h + 4 * h) // tensor + (h + h) // fsdp + 4 * h // fsdp  # biases; ln_1, ln_2 weight + bias
    return 2 * (layers * per_layer + math.ceil(vocab / tensor) * (h // fsdp) + positions * h // n + 2 * h // fsdp)


def _hf_count(config) -> int:  # type: ignore[no-untyped-def]
    """Parameters of the HF model class (tied ones once), built on the meta device: the module tree's own count."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_hand_counts_are_the_module_trees() -> None:
    """The helpers on one chip equal the parameter count of transformers' own modules at the same widths."""
    from transformers import GPT2Config, LlamaConfig

    llama = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                        vocab_size=512, num_hidden_layers=2)
    assert llama_tiny_params(1, 1) // 2 == _hf_count(llama) == 426_624
    assert gpt2_params(1, 1) // 2 == _hf_count(GPT2Config(n_embd=128, n_head=4, vocab_size=512, n_layer=2))
    assert gpt2_params(1, 1, layers=12, h=768, vocab=50257) // 2 == _hf_count(GPT2Config()) == 124_439_808


@pytest.mark.notebook
def test_notebook_12_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("12_your_model")
    by = _by(record)
    params = llama_tiny_params(fsdp=4, tensor=2)  # 106,816 bytes
    assert by[("inspect.tiny.fits", "tpu")] == 1
    assert by[("inspect.tiny.per_chip.bytes.params", "tpu")] == params
    assert by[("inspect.tiny.per_chip.bytes.optimizer", "tpu")] == 6 * params
    # gradients are derived (the plan's bf16 share of the temporaries): recorded as layout arithmetic, never as tpu
    assert by[("inspect.tiny.layout.bytes.grads", "formula")] == params
    assert ("inspect.tiny.per_chip.bytes.grads", "tpu") not in by
    assert ("inspect.tiny.per_chip.bytes.activations", "tpu") not in by
    assert by[("inspect.tiny.collectives.fsdp.all-gather.per_step", "tpu")] > 0
    assert by[("inspect.tiny.collectives.tensor.all-reduce.per_step", "tpu")] > 0
    assert ("inspect.tiny.planner_ratio.total", "tpu") in by and ("inspect.tiny.compile_s", "tpu") in by
    # the full-size runs: cached, so the planner's side only (formula), computed now
    for key in ("llama-3-8b.v5e-8", "llama-3-8b.v6e-8", "llama-3-8b.v6e-64", "mixtral-8x7b.v6e-64"):
        assert (f"inspect.{key}.per_chip.bytes.total", "formula") in by
        assert (f"inspect.{key}.per_chip.bytes.total", "tpu") not in by
    assert by[("inspect.llama-3-8b.v6e-8.per_chip.bytes.params", "formula")] == 2 * LLAMA_8B // 8
    assert by[("inspect.llama-3-8b.v6e-8.per_chip.bytes.optimizer", "formula")] == 12 * LLAMA_8B // 8
    assert by[("inspect.llama-3-8b.v5e-8.fits", "formula")] == 0 and by[("inspect.llama-3-8b.v6e-64.fits",
                                                                         "formula")] == 1
    # your model at the defaults is the cached v6e-8 row
    assert by[("inspect.yours.per_chip.bytes.total", "formula")] == by[
        ("inspect.llama-3-8b.v6e-8.per_chip.bytes.total", "formula")]
    names = _checks(record)
    assert "inspect.vs07.llama-3-8b.v6e-64: both fit, per-chip bytes within 2 %" in names
    assert sum(n.startswith("inspect.bad_input: ") for n in names) == 16
    assert {f"exercise.{n}.answer_key" for n in (1, 2, 3, 4)} <= names
    assert {"inspect.explorer.update", "inspect.explorer.rejects_bad_mesh"} <= names
    notes = {n["name"] for n in record["notes"]}
    assert {"inspect.full", "inspect.vs07.llama-3-8b.v6e-8", "inspect.vs07.llama-3-8b.v5e-8"} <= notes


@pytest.mark.notebook
def test_notebook_12_four_devices_gpt2_with_a_rule(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """GPT-2 given as a dict of its config.json fields, on four devices: the live run in this process (v5e-4, fsdp 2
    x tensor 2), the learner's rule on the position embedding compiled; the full-size model is not cached: planner
    and layout only."""
    config = json.loads((MODELS / "gpt2.json").read_text())
    params = dict(num_devices=4, model=config, tiny_topology="v5e-4", tiny_mesh="fsdp=2,tensor=2",
                  rules={r"wpe\.weight$": [None, "tensor"]}, topology="v6e-8", mesh="fsdp=4,tensor=2", seq=1024)
    record = run_notebook("12_your_model", **params)
    by = _by(record)
    want = gpt2_params(fsdp=2, tensor=2)
    assert by[("inspect.tiny.per_chip.bytes.params", "tpu")] == want
    assert by[("inspect.tiny.per_chip.bytes.optimizer", "tpu")] == 6 * want
    assert by[("inspect.tiny.fits", "tpu")] == 1
    assert ("inspect.yours.per_chip.bytes.total", "formula") in by and ("inspect.yours.fits", "tpu") not in by
    # GPT-2 small (124,439,808 parameters, tied head) on fsdp 4 x tensor 2, wpe by the rule: the plan's exact bytes
    mine = gpt2_params(fsdp=4, tensor=2, layers=12, h=768, vocab=50257)
    assert by[("inspect.yours.layout.bytes.params", "formula")] == mine
    assert by[("inspect.yours.layout.bytes.optimizer", "formula")] == 6 * mine


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_12_layer_modes_live(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """(~30 s: three tiny compiles.) A tiny Mistral (sliding window) on fsdp 8, compiled with scan, scan_layers and
    HF's loop: the same parameter and AdamW bytes per chip in every mode."""
    record = run_notebook("12_your_model", model="mistral-7b", tiny_mesh="fsdp=8", compare_layers=True)
    by = _by(record)
    want = llama_tiny_params(fsdp=8, tensor=1)  # Mistral's modules have Llama's shapes at these widths
    for prefix in ("inspect.tiny", "inspect.tiny.scan_layers", "inspect.tiny.loop"):
        assert by[(f"{prefix}.per_chip.bytes.params", "tpu")] == want
        assert by[(f"{prefix}.per_chip.bytes.optimizer", "tpu")] == 6 * want
        assert (f"{prefix}.compile_s", "tpu") in by
    assert not any(k[0].startswith("inspect.tiny.collectives.tensor") for k in by)  # no tensor axis


@pytest.mark.notebook
def test_notebook_12_bad_mesh(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"mesh fsdp=4 = 4 devices does not tile v6e-8 \(8 chips\)"):
        run_notebook("12_your_model", mesh="fsdp=4")
