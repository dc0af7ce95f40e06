"""HF model code in ``shardlab.inspect``: presets, the meta build, the static MoE form, the rebuilt causal mask.

Oracles: the parameter counts published for each model (model cards: Llama 3 8B 8.03B, Mistral 7B 7.24B,
Mixtral 8x7B 46.7B, GPT-2 124M, Gemma 2B 2.51B — exact counts below are the module tree's, checked against
those rounded figures), the planner's hand-written Llama 3 8B preset, HF's own ``MixtralSparseMoeBlock.forward``
and HF's own mask functions (``masking_utils``), run on the CPU with real tensors.
"""

from __future__ import annotations

import pytest
import torch

from shardlab.formulas.presets import MODEL_PRESETS
from shardlab.inspect import models as M
from shardlab.inspect.step import causal_mask

PUBLISHED = {"llama-3-8b": 8.03e9, "mistral-7b": 7.24e9, "mixtral-8x7b": 46.7e9, "gpt2": 124e6, "gemma-2b": 2.51e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_build_on_meta_with_the_published_size(name: str) -> None:
    model = M.build_meta(M.load_config(name))
    params = M.parameters(model, M.layer_path(model))
    total = sum(p.numel for p in params)
    assert abs(total / PUBLISHED[name] - 1) < 0.005, total  # the published figure is rounded to 3 digits
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing allocated
    assert not model.training  # eval: no dropout


def test_tied_weights_are_one_parameter_with_two_holders() -> None:
    model = M.build_meta(M.load_config("gpt2"))
    params = {p.name: p for p in M.parameters(model, M.layer_path(model))}
    assert set(params["transformer.wte.weight"].holders) == {("transformer.wte", "weight"), ("lm_head", "weight")}
    assert M.layer_path(model) == "transformer.h" and params["transformer.h.11.attn.c_attn.weight"].layer == 11


def test_planner_mapping_of_llama_3_8b_is_the_planners_preset() -> None:
    m, notes = M.planner_model(M.load_config("llama-3-8b"))
    ref = MODEL_PRESETS["llama-3-8b"]
    assert (m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, m.vocab, m.gated_mlp) == \
        (ref.layers, ref.hidden, ref.ffn, ref.heads, ref.kv_heads, ref.vocab, ref.gated_mlp)
    assert notes == []
    _, notes = M.planner_model(M.load_config("gemma-2b"))
    assert any("tied embeddings" in n for n in notes)


def test_bad_configs_are_named() -> None:
    with pytest.raises(M.ModelInputError, match="neither a preset"):
        M.config_dict("no-such-model")
    with pytest.raises(M.ModelInputError, match="model_type='no-such-type'"):
        M.load_config({"model_type": "no-such-type"})
    with pytest.raises(M.ModelInputError, match="cannot be built"):
        M.build_meta(M.load_config("llama-3-8b", {"hidden_act": "no-such-activation", "num_hidden_layers": 1}))


def test_static_moe_equals_hf_forward() -> None:
    """Same function: HF gathers each expert's tokens, the static form weights every expert's output by its
    routing weight (0 when not chosen). float64, so the only difference is the order of the sums."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    cfg = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    block = MixtralSparseMoeBlock(cfg).double().eval()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    ref, ref_logits = block(x)
    out, logits = M.static_moe_forward(block, x)
    assert torch.equal(logits, ref_logits)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    with M.static_moe("mixtral"):
        assert torch.allclose(block(x)[0], ref)
    assert block.forward.__func__ is MixtralSparseMoeBlock.forward  # restored


@pytest.mark.parametrize("window", [None, 3])
def test_rebuilt_mask_equals_hfs(window: int | None) -> None:
    from transformers import MistralConfig
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    cfg = MistralConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, sliding_window=window)
    cfg._attn_implementation = "eager"
    embeds = torch.zeros(2, 7, 16, dtype=torch.bfloat16)
    make = create_causal_mask if window is None else create_sliding_window_causal_mask
    hf = make(config=cfg, input_embeds=embeds, attention_mask=None, cache_position=torch.arange(7),
              past_key_values=None, position_ids=torch.arange(7)[None])
    mine = causal_mask(7, torch.bfloat16, window, torch.device("cpu"))
    assert hf.shape == (2, 1, 7, 7) and mine.shape == (1, 1, 7, 7)
    assert torch.equal(hf, mine.expand(2, 1, 7, 7))


def test_a_config_object_a_model_and_a_file_give_the_same_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    a, b = M.load_config(cfg), M.load_config(str(path))
    model = M.build_meta(a)
    c = M.load_config(model)  # a model: its config only
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        assert getattr(a, k) == getattr(b, k) == getattr(c, k) == getattr(cfg, k)


def _moe_input(h: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 5, h, dtype=torch.float64)


def _random_init(module: torch.nn.Module) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)


@pytest.mark.parametrize("norm", [True, False])
def test_static_qwen3_moe_equals_hf_forward(norm: bool) -> None:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                         norm_topk_prob=norm)
    block = Qwen3MoeSparseMoeBlock(cfg).double().eval()
    x = _moe_input(32)
    ref, ref_logits = block(x)
    out, logits = M.static_qwen3_moe_forward(block, x)
    assert torch.equal(logits, ref_logits)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_static_deepseek_moe_equals_hf_moe() -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(hidden_size=32, moe_intermediate_size=24, n_routed_experts=4, num_experts_per_tok=2,
                           n_group=1, topk_group=1)
    block = DeepseekV3MoE(cfg).eval()  # float32: HF's router scores in float32 (its index_add_ needs one dtype)
    _random_init(block)
    x = _moe_input(32).float()
    ref = block(x)
    with M.static_moe("deepseek_v3"):
        out = block(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert block.moe.__func__ is DeepseekV3MoE.moe  # restored

