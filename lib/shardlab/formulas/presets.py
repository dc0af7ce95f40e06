"""Model presets for the planner: public hyperparameters of Llama 3 8B, 70B and Llama 3.1 405B, or custom sizes.

Design note
-----------
A `ModelConfig` holds only what the formulas need (layers, hidden, ffn, heads, kv_heads, vocab, MLP kind, and for
a mixture-of-experts model the experts, the experts each token is routed to, and the capacity factor).
The preset values are the published model configurations (config.json of each model; Llama 3 paper,
Table 3: 405B = 126 layers, model dimension 16384, FFN 53248, 128 heads, 8 KV heads; Mixtral 8x7B's config.json:
32 layers, 4096, FFN 14336, 32 heads, 8 KV heads, vocabulary 32000, 8 local experts, 2 per token). `model_from`
accepts a preset name, a dict of custom sizes (what a notebook parameter can hold) or a ModelConfig.
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
    experts: int = 0  # E expert MLPs (each of width ffn) per layer; 0: a dense MLP
    top_k: int = 2  # experts per token (mixture of experts only)
    capacity_factor: float = 1.25  # slots per expert = ceil(cf · k · tokens / E) (GShard; mixture of experts only)

    @property
    def moe(self) -> bool:
        return self.experts > 0


_META = "Meta Llama 3 / 3.1 model config (config.json on the model repo; Llama 3 paper, Table 3)"
_MISTRAL = ("Mistral AI Mixtral-8x7B config.json (num_local_experts 8, num_experts_per_tok 2); capacity factor "
            "1.25 is this planner's assumption (Mixtral routes without a capacity limit)")
MODEL_PRESETS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig("llama-3-8b", 32, 4096, 14336, 32, 8, 128256, source=_META),
    "llama-3-70b": ModelConfig("llama-3-70b", 80, 8192, 28672, 64, 8, 128256, source=_META),
    "llama-3.1-405b": ModelConfig("llama-3.1-405b", 126, 16384, 53248, 128, 8, 128256, source=_META),
    "mixtral-8x7b": ModelConfig("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, source=_MISTRAL, experts=8, top_k=2),
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
        allowed = {*required, "name", "gated_mlp", "source", "experts", "top_k", "capacity_factor"}
        missing = [k for k in required if k not in spec]
        unknown = sorted(set(spec) - allowed)
        if missing or unknown:
            raise ValueError(f"custom model {spec}: missing keys {missing}, unknown keys {unknown}; "
                             f"give {list(required)} (optional: name, gated_mlp, experts, top_k, capacity_factor)")
        for k in required:
            if isinstance(spec[k], bool) or not isinstance(spec[k], int) or spec[k] < 1:
                raise ValueError(f"custom model: {k}={spec[k]!r} must be a positive int")
        m = ModelConfig(**{"name": "custom", **spec})
        _check_moe(m)
        return m
    raise ValueError(f"model={spec!r} must be a preset name {sorted(MODEL_PRESETS)}, a dict of sizes or a ModelConfig")


def _check_moe(m: ModelConfig) -> None:
    """The mixture-of-experts fields of a custom model: experts >= 0; with experts, 1 <= top_k <= experts and a
    capacity factor > 0."""
    if isinstance(m.experts, bool) or not isinstance(m.experts, int) or m.experts < 0:
        raise ValueError(f"custom model: experts={m.experts!r} must be an int >= 0 (0: a dense MLP)")
    if m.experts and (isinstance(m.top_k, bool) or not isinstance(m.top_k, int) or not 1 <= m.top_k <= m.experts):
        raise ValueError(f"custom model: top_k={m.top_k!r} must be an int in [1, experts={m.experts}]")
    cf = m.capacity_factor
    if m.experts and (isinstance(cf, bool) or not isinstance(cf, int | float) or cf <= 0):
        raise ValueError(f"custom model: capacity_factor={cf!r} must be a number > 0")
