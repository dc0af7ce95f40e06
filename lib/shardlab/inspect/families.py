"""The decoder families ``inspect`` is tested on, each from its ``transformers`` config class at tiny widths.

Design note
-----------
A family is named by its ``model_type``; its config is the config class's own defaults (``AutoConfig.for_model``:
no hub access), shrunk by :func:`shardlab.inspect.models.tiny_overrides` to widths that compile in seconds — the
same module code, parameter names and layer structure (Gemma 2's alternating sliding / full layers, DeepSeek-V3's
dense first layer before its MoE layers, gpt-oss's attention sinks). :data:`FAMILIES` says which layer modes each
family allows: a scan runs one body for every layer, so families whose layers differ in more than the mask's
window (DeepSeek-V3's dense and MoE layers, Gemma 3's local and global rotary) take HF's loop only, and inspect
refuses the scans before tracing, with the reason (``models.scan_refusal``).

Example::

    >>> tiny_family("qwen2")["hidden_size"], tiny_family("qwen2")["num_hidden_layers"]
    (128, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardlab.inspect import models as M


@dataclass(frozen=True)
class Family:
    model_type: str
    name: str  # as people say it
    layers: tuple[str, ...] = ("scan", "scan_layers", "loop")  # layer modes inspect can trace
    extra: tuple[tuple[str, Any], ...] = ()  # config fields besides the tiny widths


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "Llama"),
    Family("mistral", "Mistral", extra=(("sliding_window", 32),)),
    Family("mixtral", "Mixtral"),
    Family("qwen2", "Qwen2"),
    Family("qwen3", "Qwen3"),
    Family("qwen3_moe", "Qwen3-MoE"),
    Family("gemma", "Gemma"),
    Family("gemma2", "Gemma 2"),
    Family("gemma3_text", "Gemma 3 (text)", layers=("loop",)),
    Family("phi3", "Phi-3"),
    Family("gpt2", "GPT-2"),
    Family("gpt_neox", "GPT-NeoX"),
    Family("deepseek_v3", "DeepSeek-V3", layers=("loop",)),
    Family("gpt_oss", "gpt-oss"),
)}


def tiny_family(model_type: str, num_layers: int = 2) -> dict[str, Any]:
    """The config dict of ``model_type`` at tiny widths with ``num_layers`` decoder layers."""
    from transformers import AutoConfig

    full = {**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}
    over = M.tiny_overrides(full) | dict(FAMILIES[model_type].extra)
    over["n_layer" if model_type == "gpt2" else "num_hidden_layers"] = num_layers
    if full.get("layer_types"):  # the family's own pattern, cut to num_layers (Gemma 3: 5 sliding, then full)
        types = full["layer_types"]
        over["layer_types"] = types[:num_layers] if model_type != "gemma3_text" else \
            [*types[:num_layers - 1], "full_attention"]
    return {**full, **over}
