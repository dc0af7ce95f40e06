"""Hugging Face model code with no weights: configs, the meta-device build, and what the planner can see of it.

Design note
-----------
A model is named by a preset in ``data/models/<name>.json`` (the ``config.json`` published with the model,
copied by hand: no hub access at run time), a path to such a file, a dict of its fields, or a
``transformers.PretrainedConfig``. :func:`load_config` turns any of them into the config class of its
``model_type`` (``AutoConfig.for_model``); :func:`build_meta` builds the model class ``AutoModelForCausalLM``
maps it to with every **parameter on the meta device** (no memory, no initialisation) and every buffer real on
the CPU (rotary ``inv_freq``, GPT-2's causal ``bias``: small, and computed in ``__init__``, so a meta buffer could
not be filled in later). Attention is HF's ``eager`` implementation: the plain softmax whose ``[b, a, s, s]``
scores exist in the program, as the planner's no-flash verdict assumes.

Two places where the model code is adapted, both stated in the result's notes:

- **MoE dispatch.** Mixtral's ``MixtralSparseMoeBlock.forward`` loops over the experts that received tokens
  (``nonzero``, ``torch.where``): shapes that depend on the router's values, which a trace with placeholders cannot
  know. :func:`static_moe` swaps in the static-shape form (torchprime's "static" MoE): the same router
  (softmax, top-k, renormalised), every expert applied to every token, weighted by the router's top-k weight for
  that expert (0 when not chosen) — the same function (no token dropped; tested against HF's forward), E/k times the
  expert FLOPs and activations.
- **Dropout** is off (``model.eval()``; these models have no batch norm), as the planner assumes.

:func:`planner_model` maps the config to the planner's sizes (``formulas.presets.ModelConfig``) and lists what the
planner cannot see (tied embeddings, position embeddings, biases, a head dimension other than hidden / heads,
a router): the parameter count of the real module tree is reported beside the planner's.

Example::

    >>> cfg = load_config("gpt2")
    >>> cfg.model_type, cfg.n_layer, cfg.n_embd
    ('gpt2', 12, 768)
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from shardlab.formulas.presets import ModelConfig

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

# what a user may name a model by (see config_dict)
ModelSpec: TypeAlias = "str | Path | dict[str, Any] | PretrainedConfig | PreTrainedModel"

MODELS_DIR = Path(__file__).resolve().parents[3] / "data" / "models"
# Where the decoder layers live (an nn.ModuleList of identical layers) per model_type; others are searched.
LAYER_PATHS = {"gpt2": "transformer.h"}
DEFAULT_LAYER_PATH = "model.layers"


class ModelInputError(ValueError):
    """A model name, file or config that cannot be built (bad input: exit status 2 at the CLI)."""


def presets() -> dict[str, Path]:
    """``{preset name: path}`` of the config files shipped in ``data/models`` (``inspect_*.json`` are results)."""
    return {p.stem: p for p in sorted(MODELS_DIR.glob("*.json")) if not p.stem.startswith("inspect")}


def config_dict(model: ModelSpec) -> dict[str, Any]:
    """The config fields of a preset name, a path to a ``config.json``, a dict, a ``PretrainedConfig`` or a model."""
    if hasattr(model, "config") and hasattr(model.config, "to_dict"):  # a PreTrainedModel: its config only
        model = model.config
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        return {**model.to_dict(), "model_type": model.model_type}
    if isinstance(model, dict):
        return dict(model)
    if isinstance(model, str | Path):
        known = presets()
        path = known.get(str(model)) or Path(model)
        if not path.is_file():
            raise ModelInputError(f"model={str(model)!r} is neither a preset ({', '.join(known)}) nor a config file")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelInputError(f"model={str(model)!r}: {path} is not a JSON config ({exc})") from None
        if not isinstance(data, dict):
            raise ModelInputError(f"model={str(model)!r}: {path} holds a JSON {type(data).__name__}, not an object "
                                  "of config fields ({\"model_type\": ..., \"hidden_size\": ...})")
        return data
    raise ModelInputError(f"model={model!r} must be a preset name, a config.json path, a dict or a PretrainedConfig")


def load_config(model: ModelSpec, overrides: dict[str, Any] | None = None) -> Any:
    """The ``transformers`` config object of ``model`` with ``overrides`` applied (e.g. ``num_hidden_layers``)."""
    from transformers import AutoConfig  # 2.4 s; params/CLI import models

    base = config_dict(model)
    overrides = dict(overrides or {})
    model_type = overrides.get("model_type", base.get("model_type"))
    if not model_type:
        raise ModelInputError(f"model config has no 'model_type' (keys: {sorted(base)[:12]}...): it names the model "
                              "class, e.g. 'llama', 'mistral', 'mixtral', 'gpt2', 'gemma'")
    if not isinstance(model_type, str):
        raise ModelInputError(f"model_type={model_type!r} must be a string naming the model class, e.g. 'llama'")
    check_overrides(model_type, base, overrides)
    d = {**base, **overrides}
    d.pop("model_type", None)
    for k in ("transformers_version", "architectures", "_name_or_path"):
        d.pop(k, None)
    layers = d.get("n_layer" if model_type == "gpt2" else "num_hidden_layers")
    types = d.get("layer_types")
    if isinstance(layers, int) and isinstance(types, list) and len(types) != layers and "layer_types" not in overrides:
        d["layer_types"] = [types[i % len(types)] for i in range(layers)] if types else None  # the same pattern
    try:
        config = AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelInputError(f"model_type={model_type!r}: transformers cannot make its config ({exc})") from None
    check_config(config)
    return config


# Config fields that must be positive integers when present (sizes and counts the model code divides by).
POSITIVE_FIELDS = ("hidden_size", "n_embd", "intermediate_size", "num_attention_heads", "n_head",
                   "num_key_value_heads", "head_dim", "vocab_size", "num_hidden_layers", "n_layer",
                   "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                   "moe_intermediate_size", "max_position_embeddings", "n_positions")
# families whose model class is not a decoder-only causal LM built from one list of layers
NOT_DECODER = {"t5": "an encoder-decoder", "bart": "an encoder-decoder", "mt5": "an encoder-decoder",
               "whisper": "an encoder-decoder (speech)", "bert": "an encoder", "roberta": "an encoder"}


def check_overrides(model_type: str, base: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Overrides name fields the config class has, with values of the field's type (before transformers sees
    them: it accepts any key silently and fails deep in the model code on a wrong type)."""
    if not overrides:
        return
    from transformers import AutoConfig

    try:
        default = AutoConfig.for_model(model_type).to_dict()
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelInputError(f"model_type={model_type!r}: transformers cannot make its config ({exc})") from None
    known = set(default) | set(base)
    for k, v in overrides.items():
        if k not in known:
            close = difflib.get_close_matches(k, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ModelInputError(f"override {k}={v!r}: {model_type} configs have no field {k!r}{hint}")
        ref = base.get(k, default.get(k))
        if isinstance(ref, bool) and not isinstance(v, bool):
            raise ModelInputError(f"override {k}={v!r} must be true or false (like {ref!r})")
        if isinstance(ref, int) and not isinstance(ref, bool) and (isinstance(v, bool) or not isinstance(v, int)):
            raise ModelInputError(f"override {k}={v!r} must be an integer (the config's value is {ref!r})")
        if isinstance(ref, float) and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ModelInputError(f"override {k}={v!r} must be a number (the config's value is {ref!r})")


def check_config(config: PretrainedConfig) -> None:
    """Values the model code would fail on deep inside a trace, named here (bad input)."""
    t = config.model_type
    if t in NOT_DECODER:
        raise ModelInputError(f"model_type={t!r} is {NOT_DECODER[t]}: inspect builds decoder-only causal LMs")
    for k in POSITIVE_FIELDS:
        v = getattr(config, k, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelInputError(f"{t}: {k}={v!r} must be an integer >= 1")
    heads = _get(config, "num_attention_heads", "n_head")
    kv = getattr(config, "num_key_value_heads", None)
    if heads and kv and heads % kv:
        raise ModelInputError(f"{t}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} "
                              "(grouped-query attention repeats each key/value head heads / kv_heads times)")
    if t == "deepseek_v3" and kv != heads:
        raise ModelInputError(f"{t}: num_key_value_heads={kv} must equal num_attention_heads={heads} (multi-head "
                              "latent attention expands its compressed key / value to every head)")
    vocab, pad = getattr(config, "vocab_size", None), getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and vocab and not 0 <= pad < vocab:
        raise ModelInputError(f"{t}: pad_token_id={pad} is not a row of the {vocab}-word embedding (0 <= "
                              "pad_token_id < vocab_size)")
    experts = _get(config, "num_local_experts", "num_experts", "n_routed_experts")
    k = getattr(config, "num_experts_per_tok", None)
    if experts and k and k > experts:
        raise ModelInputError(f"{t}: num_experts_per_tok={k} is more than the {experts} experts (top-k of E needs "
                              "k <= E)")
    window = getattr(config, "sliding_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ModelInputError(f"{t}: sliding_window={window!r} must be None or an integer >= 1")


# A family at tiny widths (compiled in seconds): the same module code and parameter names, narrower. Each field is
# set only where the config has it; the ones that count heads, experts or a window are capped, never raised.
TINY_WIDTHS = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "head_dim": 32,
               "vocab_size": 512, "n_embd": 128, "n_head": 4,
               # MoE experts' width; DeepSeek's multi-head latent attention (low-rank q / kv, rope + nope parts)
               "moe_intermediate_size": 64, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16,
               "qk_nope_head_dim": 16, "v_head_dim": 32}
TINY_CAPS = {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
             "num_experts_per_tok": 2, "sliding_window": 32, "n_group": 1, "topk_group": 1,
             "first_k_dense_replace": 1}


def tiny_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The config fields that shrink ``config`` (a config dict) to tiny widths (see :data:`TINY_WIDTHS`).

    >>> tiny_overrides({"model_type": "mixtral", "hidden_size": 4096, "num_local_experts": 8, "sliding_window": None})
    {'hidden_size': 128, 'num_local_experts': 4}
    """
    out = {k: v for k, v in TINY_WIDTHS.items() if config.get(k) is not None}
    out |= {k: min(v, config[k]) for k, v in TINY_CAPS.items() if isinstance(config.get(k), int)}
    if isinstance(config.get("pad_token_id"), int) and config["pad_token_id"] >= out.get("vocab_size", 1 << 62):
        out["pad_token_id"] = out["vocab_size"] - 1  # Phi-3: padding id 32000 must be a row of the embedding
    if config.get("model_type") == "deepseek_v3":  # MLA: one key / value head per query head
        out["num_key_value_heads"] = out.get("num_attention_heads", config.get("num_attention_heads"))
    if config.get("qk_head_dim") is not None:  # DeepSeek: q/k head = nope + rope parts, rotary on the rope part
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
        out["head_dim"] = out["qk_rope_head_dim"]
    return out


def layer_windows(config: PretrainedConfig, n: int) -> list[int | None]:
    """Each decoder layer's sliding window (None: full causal attention), as HF's mask mapping gives it:
    ``layer_types`` where the config has them (Gemma 2/3, gpt-oss, Qwen2/3 with ``use_sliding_window``), else
    ``sliding_window`` for every layer (Mistral, Mixtral, Phi-3)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if types[i] == "sliding_attention" else None for i in range(n)]
    return [window] * n


def scan_refusal(config: PretrainedConfig, params: list[Param]) -> str | None:
    """Why the decoder layers cannot run as one scanned body (``layers='scan'`` / ``'scan_layers'``), or None.
    Layers must hold the same parameters (names and shapes) and differ at most in their mask's window."""
    by_layer: dict[int, dict[str, tuple[int, ...]]] = {}
    for p in params:
        if p.layer is not None:
            by_layer.setdefault(p.layer, {})[p.suffix] = p.shape
    layers = [by_layer[i] for i in sorted(by_layer)]
    for i, lay in enumerate(layers[1:], 1):
        if lay != layers[0]:
            extra = sorted(set(lay) ^ set(layers[0]))[:2] or \
                [k for k in lay if lay[k] != layers[0][k]][:2]
            why = ""
            if getattr(config, "first_k_dense_replace", None):
                why = f" (the first {config.first_k_dense_replace} layers are dense MLPs, the rest MoE)"
            return (f"{config.model_type}: decoder layer {i} holds other parameters than layer 0{why}, e.g. "
                    f"{', '.join(extra)}: a scan runs one body for every layer")
    types = set(getattr(config, "layer_types", None) or [])
    if config.model_type == "gemma3_text" and len(types) > 1:
        return ("gemma3_text: its sliding and full layers use different rotary embeddings (local vs global base, "
                "chosen by a Python attribute of each layer), not only different masks: a scan runs one body")
    return None


def num_layers_key(config: PretrainedConfig) -> str:
    """The config field holding the decoder layer count (``num_hidden_layers``; GPT-2: ``n_layer``)."""
    return "n_layer" if config.model_type == "gpt2" else "num_hidden_layers"


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Within the block every ``nn.Parameter`` registered is moved to the meta device (buffers stay real)."""
    import torch  # 2.1 s; inspect.params and the CLI's checks import models
    from torch import nn

    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to(torch.device("meta")), param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_meta(config: PretrainedConfig, attention: str = "eager") -> Any:
    """``AutoModelForCausalLM`` of ``config`` with parameters on the meta device, eval mode, HF's attention
    implementation ``attention`` (eager; sdpa; a registered kernel's name)."""
    import torch
    from transformers import AutoModelForCausalLM  # 2.4 s; params/CLI import models

    try:
        with _parameters_on_meta(), torch.device("cpu"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    except Exception as exc:  # noqa: BLE001 - any failure of the model's own constructor is a bad config
        raise ModelInputError(f"{config.model_type}: the model class cannot be built from this config: "
                              f"{type(exc).__name__}: {exc}") from None
    return model.eval()


def layer_path(model: nn.Module) -> str:
    """Dotted path of the decoder layers' ``nn.ModuleList`` (``model.layers``, GPT-2 ``transformer.h``)."""
    from torch import nn  # 2.1 s; inspect.params and the CLI's checks import models

    path = LAYER_PATHS.get(model.config.model_type, DEFAULT_LAYER_PATH)
    try:
        mod = model.get_submodule(path)
    except AttributeError:
        mod = None
    if isinstance(mod, nn.ModuleList):
        return path
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and len({type(x) for x in m}) == 1 and "layer" in type(m[0]).__name__.lower()]
    if not lists:
        raise ModelInputError(f"{model.config.model_type}: no list of decoder layers found (looked for {path!r})")
    return max(lists, key=lambda nm: len(nm[1]))[0]


@dataclass(frozen=True)
class Param:
    """One trainable tensor of the model: its name, shape and every (module path, attribute) that holds it."""

    name: str  # the first name (named_parameters order)
    shape: tuple[int, ...]
    holders: tuple[tuple[str, str], ...]  # (module path, attribute); tied weights have several
    layer: int | None = None  # decoder layer index, None outside the layer stack
    suffix: str = ""  # name inside the layer ("self_attn.q_proj.weight")

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def parameters(model: nn.Module, layers_at: str) -> list[Param]:
    """The model's parameters, tied ones once (with every holder), in ``named_parameters`` order."""
    holders: dict[int, list[tuple[str, str]]] = {}
    first: dict[int, tuple[str, Any]] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, p in mod._parameters.items():
            if p is None:
                continue
            holders.setdefault(id(p), [])
            if (mod_name, attr) not in holders[id(p)]:
                holders[id(p)].append((mod_name, attr))
    out = []
    prefix = layers_at + "."
    for name, p in model.named_parameters():
        first[id(p)] = (name, p)
        layer, suffix = None, ""
        if name.startswith(prefix):
            idx, _, suffix = name[len(prefix):].partition(".")
            layer = int(idx)
        out.append(Param(name, tuple(p.shape), tuple(holders[id(p)]), layer, suffix))
    return out


def static_moe_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``MixtralSparseMoeBlock.forward`` with static shapes: every expert on every token, weighted by the router.

    y = sum_e expert_e(x) * w_e,  w_e = the renormalised top-k routing weight of expert e (0 if not in the top k)
    """
    import torch  # 2.1 s; inspect.params and the CLI's checks import models
    import torch.nn.functional as F

    b, s, h = hidden_states.shape
    x = hidden_states.view(-1, h)  # [T, h], T = b * s
    router_logits = self.gate(x)  # [T, E]
    routing = F.softmax(router_logits, dim=1, dtype=torch.float)
    top_w, top_e = torch.topk(routing, self.top_k, dim=-1)  # [T, k]
    top_w = (top_w / top_w.sum(dim=-1, keepdim=True)).to(x.dtype)
    combine = (F.one_hot(top_e, self.num_experts).to(x.dtype) * top_w[..., None]).sum(dim=1)  # [T, E]
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        out = out + expert(x) * combine[:, e, None]  # [T, h]
    return out.view(b, s, h), router_logits


def static_qwen3_moe_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Qwen3MoeSparseMoeBlock.forward`` with static shapes: Mixtral's form, the top-k weights renormalised only
    when ``norm_topk_prob`` (as HF's)."""
    import torch
    import torch.nn.functional as F

    b, s, h = hidden_states.shape
    x = hidden_states.view(-1, h)  # [T, h]
    router_logits = self.gate(x)  # [T, E]
    routing = F.softmax(router_logits, dim=1, dtype=torch.float)
    top_w, top_e = torch.topk(routing, self.top_k, dim=-1)  # [T, k]
    if self.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    top_w = top_w.to(x.dtype)
    combine = (F.one_hot(top_e, self.num_experts).to(x.dtype) * top_w[..., None]).sum(dim=1)  # [T, E]
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        out = out + expert(x) * combine[:, e, None]  # [T, h]
    return out.view(b, s, h), router_logits


def static_deepseek_moe(self: nn.Module, hidden_states: torch.Tensor, topk_indices: torch.Tensor,
                        topk_weights: torch.Tensor) -> torch.Tensor:
    """``DeepseekV3MoE.moe`` with static shapes: every routed expert on every token, weighted by its top-k weight
    (0 when not chosen), summed in the weights' dtype as HF's ``index_add_``."""
    import torch.nn.functional as F

    combine = (F.one_hot(topk_indices, len(self.experts)).to(topk_weights.dtype)
               * topk_weights[..., None]).sum(dim=1)  # [T, E]
    out = 0
    for e, expert in enumerate(self.experts):
        out = out + expert(hidden_states).to(topk_weights.dtype) * combine[:, e, None]  # [T, h]
    return out.type(hidden_states.dtype)


# model_type -> (transformers module, class, method, static replacement): MoE code with data-dependent shapes.
# gpt-oss needs none: off the CPU and in eval mode, GptOssExperts already runs every expert on every token.
STATIC_MOE: dict[str, tuple[str, str, str, Any]] = {
    "mixtral": ("mixtral.modeling_mixtral", "MixtralSparseMoeBlock", "forward", static_moe_forward),
    "qwen3_moe": ("qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock", "forward", static_qwen3_moe_forward),
    "deepseek_v3": ("deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE", "moe", static_deepseek_moe),
}
MOE_TYPES = (*STATIC_MOE, "gpt_oss")


@contextlib.contextmanager
def static_moe(model_type: str) -> Iterator[None]:
    """Within the block, the MoE blocks of ``model_type`` run their static form (:data:`STATIC_MOE`; restored on
    exit)."""
    if model_type not in STATIC_MOE:
        yield
        return
    import importlib

    mod_name, cls_name, method, static = STATIC_MOE[model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{mod_name}"), cls_name)
    original = getattr(cls, method)
    setattr(cls, method, static)
    try:
        yield
    finally:
        setattr(cls, method, original)


def _get(config: PretrainedConfig, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def planner_model(config: PretrainedConfig, name: str = "") -> tuple[Any, list[str]]:
    """The planner's ``ModelConfig`` for an HF config, and what the planner's sizes leave out (notes)."""
    h = _get(config, "hidden_size", "n_embd")
    heads = _get(config, "num_attention_heads", "n_head")
    kv = _get(config, "num_key_value_heads", default=heads)
    gated = config.model_type != "gpt2"
    ffn = _get(config, "intermediate_size", "n_inner", default=4 * h)
    notes = []
    experts = _get(config, "num_local_experts", default=0)
    if experts:
        k = _get(config, "num_experts_per_tok", default=1)
        notes.append(f"MoE: {experts} experts (top-{k}) are given to the planner as one dense MLP of ffn = "
                     f"{experts} x {ffn} = {experts * ffn}: the same parameters, and the same activations as the "
                     "static dispatch traced here (every expert on every token); the router is not counted")
        ffn *= experts
    head_dim = _get(config, "head_dim", default=h // heads)
    if head_dim * heads != h:
        notes.append(f"head_dim {head_dim} x heads {heads} = {head_dim * heads} != hidden {h}: the planner assumes "
                     "hidden / heads")
    if getattr(config, "tie_word_embeddings", False):
        notes.append("tied embeddings: the LM head is the embedding matrix, the planner counts both")
    if config.model_type == "gpt2":
        notes.append("GPT-2: learned position embeddings, LayerNorm and projection biases, GeLU MLP (not counted "
                     "by the planner beyond its weight matrices)")
    m = ModelConfig(name or config.model_type, _get(config, "num_hidden_layers", "n_layer"), h, ffn, heads, kv,
                    config.vocab_size, gated, source="inspect: mapped from the Hugging Face config")
    return m, notes
