"""Model presets for the planner: public hyperparameters of Llama 3 8B, 70B and Llama 3.1 405B, or custom sizes.

Design note
-----------
A `ModelConfig` holds only what the formulas need (layers, hidden, ffn, heads, kv_heads, vocab, MLP kind).
The preset values are the published model configurations (config.json of each model; Llama 3 paper,
Table 3: 405B = 126 layers, model dimension 16384, FFN 53248, 128 heads, 8 KV heads). `model_from` accepts a
preset name, a dict of custom sizes (what a notebook parameter can hold) or a ModelConfig.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int  # L decoder layers
    hidden: int  # h
    ffn: int  # MLP inner size
    heads: int  # a query heads
    kv_heads: int  # key/value heads (GQA)
    vocab: int  # V before padding
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GeLU (2)
    source: str = ""


_META = "Meta Llama 3 / 3.1 model config (config.json on the model repo; Llama 3 paper, Table 3)"
MODEL_PRESETS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig("llama-3-8b", 32, 4096, 14336, 32, 8, 128256, source=_META),
    "llama-3-70b": ModelConfig("llama-3-70b", 80, 8192, 28672, 64, 8, 128256, source=_META),
    "llama-3.1-405b": ModelConfig("llama-3.1-405b", 126, 16384, 53248, 128, 8, 128256, source=_META),
}


def model_preset(name: str) -> ModelConfig:
    if name not in MODEL_PRESETS:
        known = sorted(MODEL_PRESETS)
        raise ValueError(f"unknown model preset {name!r}; known: {known} (or pass a ModelConfig)")
    return MODEL_PRESETS[name]


def model_from(spec: str | dict | ModelConfig) -> ModelConfig:
    """A preset name, a dict of custom sizes, or a ModelConfig -> ModelConfig (clear errors on bad keys).

    >>> model_from({"layers": 2, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 32000}).name
    'custom'
    """
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, str):
        return model_preset(spec)
    if isinstance(spec, dict):
        required = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab")
        allowed = {*required, "name", "gated_mlp", "source"}
        missing = [k for k in required if k not in spec]
        unknown = sorted(set(spec) - allowed)
        if missing or unknown:
            raise ValueError(f"custom model {spec}: missing keys {missing}, unknown keys {unknown}; "
                             f"give {list(required)} (optional: name, gated_mlp)")
        for k in required:
            if isinstance(spec[k], bool) or not isinstance(spec[k], int) or spec[k] < 1:
                raise ValueError(f"custom model: {k}={spec[k]!r} must be a positive int")
        return ModelConfig(**{"name": "custom", **spec})
    raise ValueError(f"model={spec!r} must be a preset name {sorted(MODEL_PRESETS)}, a dict of sizes or a ModelConfig")
