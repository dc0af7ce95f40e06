"""One training step of a Hugging Face model, traced with placeholders on this process's device world.

Design note
-----------
:func:`build` (module-level: ``tpu.compile_program`` may call it in a helper process with the slice's device
count) traces, without allocating or executing anything:

    weights     one bf16 placeholder per trained tensor, ``placeholder * 1`` annotated with its spec
                (``mark_sharding``; a placeholder itself cannot carry one), detached into a leaf that requires
                grad and installed in the meta-built HF model (tied weights: one leaf in every holder)
    inputs      tokens and labels: int64 ``[B, S]`` placeholders split over the batch axes
    forward     the HF model's own ``forward(input_ids, labels)``: embedding, mask, rotary, decoder layers, norm,
                LM head and HF's loss (``ForCausalLMLoss``: fp32 logits, shifted labels)
    layers      ``scan``: the decoder layers' weights held stacked ``[L, ...]`` (one tensor per weight name, as
                MaxText / torchprime's scanned models keep them), one layer traced once and run by
                ``torch_xla.experimental.scan.scan``; ``scan_layers``: torch_xla's ``scan_layers`` over the HF
                layers (it stacks the per-layer weights inside the step); ``loop``: HF's Python loop (L copies)
    recompute   ``full``: scan / scan_layers with the partition that saves only the layer inputs
                (``planner_verdict.full_recompute_partition``); loop: ``torch_xla.utils.checkpoint`` per layer
    activations forward hooks annotate each decoder layer's output and the embedding output as split over the
                batch axes; with tensor parallelism, column-parallel and vocabulary outputs on the tensor axis
                (``mark_sharding_with_gradients``)
    optimizer   AdamW as ``planner_verdict`` traces it: fp32 master, exp_avg, exp_avg_sq placeholders sharded like
                the weight, elementwise update, every new value donated into its old buffer (``tpu.Step``)

HF's decoder loop (``for layer in self.layers[:n]``, GPT-2's ``for i, block in enumerate(self.h)``) is kept: the
layer list is replaced by a :class:`LayerStack` whose slice / iteration yields one runner that scans all layers,
receiving exactly the arguments HF passes to a layer. Tensors among them (rotary ``cos, sin``, the mask) travel in
the scan's carry unchanged (torchprime's "broadcasted inputs"); other values are bound as constants.

Output order (``outputs()``): ``[loss] + [new weight, master, exp_avg, exp_avg_sq]`` per trained tensor in
``Layout.trained`` order — the analysis reads the kinds from it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the CLI and notebook 12 import step after it)
from torch import nn
from torch._functorch.partitioners import default_partition
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch_xla.experimental.scan import scan
from torch_xla.experimental.scan_layers import scan_layers
from torch_xla.utils.checkpoint import checkpoint

from shardlab import runtime
from shardlab.inspect import models as M
from shardlab.inspect import sharding as S
from shardlab.inspect.config import InspectConfig, layout
from shardlab.planner.verdict import adamw_step, full_recompute_partition
from shardlab.profile import tpu as T
from shardlab.profile.placeholders import placeholder

KINDS = ("param", "master", "exp_avg", "exp_avg_sq")  # per trained tensor, in output order after the loss


def output_kinds(cfg: InspectConfig) -> list[tuple[str, str]]:
    """``(trained tensor name, kind)`` of every output after the loss, in order."""
    lay = layout(cfg)
    return [(name, k) for name, _, _ in lay.trained(cfg.layers == "scan") for k in KINDS]


class LayerStack(nn.ModuleList):
    """The decoder layers, as HF's model sees them: ``self.layers[:n]`` and ``iter(self.layers)`` give one runner
    that runs every layer (``named_parameters`` and indexing by int still see the real layers)."""

    def __init__(self, layers: nn.ModuleList, runner: Callable[..., Any]) -> None:
        super().__init__(list(layers))
        object.__setattr__(self, "_runner", runner)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return [self._runner]
        return super().__getitem__(idx)

    def __iter__(self) -> Iterator[Any]:
        return iter([self._runner])


class _Call:
    """The arguments HF passes to a decoder layer, split for a scan: float tensors ride in the carry unchanged
    (rotary ``cos, sin``), other tensors (position ids) are stacked per layer, the ``[b, 1, s, s]`` additive mask is
    rebuilt inside the layer from iota (:func:`causal_mask`: a carried mask would be a loop buffer with a gradient),
    and everything else is a constant."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], seq: int, window: int | None,
                 device: torch.device) -> None:
        leaves, self.spec = tree_flatten((args, kwargs))
        self.kind: list[str] = []
        for x in leaves:
            if not isinstance(x, torch.Tensor):
                self.kind.append("const")
            elif x.dim() == 4 and tuple(x.shape[-2:]) == (seq, seq) and x.is_floating_point():
                self.kind.append("mask")
            else:
                self.kind.append("carry" if x.is_floating_point() else "stack")
        self.const = [x if k == "const" else None for x, k in zip(leaves, self.kind, strict=True)]
        self.carried = [x for x, k in zip(leaves, self.kind, strict=True) if k == "carry"]
        self.stacked = [x for x, k in zip(leaves, self.kind, strict=True) if k == "stack"]
        self.mask_dtype = next((x.dtype for x, k in zip(leaves, self.kind, strict=True) if k == "mask"), None)
        self.seq, self.window, self.device = seq, window, device

    def join(self, carried: tuple[Any, ...], stacked: list[Any]) -> tuple[Any, dict[str, Any]]:
        c, s = iter(carried), iter(stacked)
        mask = causal_mask(self.seq, self.mask_dtype, self.window, self.device) if self.mask_dtype else None
        leaves = [next(c) if k == "carry" else next(s) if k == "stack" else mask if k == "mask" else x
                  for x, k in zip(self.const, self.kind, strict=True)]
        return tree_unflatten(leaves, self.spec)


def causal_mask(seq: int, dtype: torch.dtype, window: int | None, device: torch.device) -> torch.Tensor:
    """HF's additive causal mask ``[1, 1, s, s]``: 0 where query q may see key k (k <= q, and k > q - window with a
    sliding window), the dtype's minimum elsewhere (``masking_utils``: ``causal_mask_function``,
    ``sliding_window_overlay``, ``torch.where(mask, 0, min)``)."""
    q = torch.arange(seq, device=device)[:, None]  # [s, 1]
    k = torch.arange(seq, device=device)[None, :]  # [1, s]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (k > q - window)
    zero = torch.zeros((), dtype=dtype, device=device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, zero, low)[None, None]  # [1, 1, s, s]


class _Carried(nn.Module):
    """One HF layer as ``scan_layers`` wants it: ``forward(hidden, *carried) -> (hidden', *carried)``; the stacked
    arguments are this wrapper's buffers (``scan_layers`` stacks buffers like weights)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def set_call(self, call: _Call) -> None:
        object.__setattr__(self, "call", call)
        for i, t in enumerate(call.stacked):
            self.register_buffer(f"arg{i}", t, persistent=False)

    def forward(self, hidden: torch.Tensor, *carried: torch.Tensor) -> tuple[torch.Tensor, ...]:
        call: _Call = self.call  # type: ignore[attr-defined]
        args, kwargs = call.join(carried, [getattr(self, f"arg{i}") for i in range(len(call.stacked))])
        out = self.layer(hidden, *args, **kwargs)
        return (out[0] if isinstance(out, tuple) else out, *carried)


def _scan_runner(template: nn.Module, stacked: dict[str, torch.Tensor], partition: Callable[..., Any] | None, seq: int,
                 window: int | None, num_layers: int) -> Callable[..., Any]:
    """Runner for ``layers='scan'``: ``scan`` over the stacked weights, one ``functional_call`` of the template."""
    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        call = _Call(args, kwargs, seq, window, hidden.device)
        xs = dict(stacked)
        for i, t in enumerate(call.stacked):  # [L, ...] copies of the per-layer arguments (position ids: small)
            xs[f"__arg{i}"] = t.unsqueeze(0).expand(num_layers, *t.shape).contiguous()
        tuple_out: list[bool] = []

        def body(carry: tuple[torch.Tensor, ...], w: dict[str, torch.Tensor]) -> tuple[Any, None]:
            h, *ts = carry
            w = dict(w)
            extra = [w.pop(f"__arg{i}") for i in range(len(call.stacked))]
            a, kw = call.join(tuple(ts), extra)
            out = torch.func.functional_call(template, w, (h, *a), kw, strict=True)
            tuple_out.append(isinstance(out, tuple))
            return (out[0] if isinstance(out, tuple) else out, *ts), None

        carry, _ = scan(body, (hidden, *call.carried), xs, partition_fn=partition)
        return (carry[0],) if tuple_out and tuple_out[0] else carry[0]

    return run


def _scan_layers_runner(layers: list[nn.Module], partition: Callable[..., Any] | None, tuple_out: bool, seq: int,
                        window: int | None) -> Callable[..., Any]:
    """Runner for ``layers='scan_layers'``: torch_xla's ``scan_layers`` over the HF layers (carry-wrapped)."""
    wrapped = [_Carried(layer) for layer in layers]

    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        call = _Call(args, kwargs, seq, window, hidden.device)
        for w in wrapped:
            w.set_call(call)
        carry = scan_layers(wrapped, (hidden, *call.carried), partition_fn=partition)
        return (carry[0],) if tuple_out else carry[0]

    return run


def _loop_runner(layers: list[nn.Module], recompute: bool) -> Callable[..., Any]:
    """Runner for ``layers='loop'``: HF's loop, each layer under ``torch_xla.utils.checkpoint`` when recomputing."""
    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out: Any = hidden
        for layer in layers:
            h = out[0] if isinstance(out, tuple) else out
            if recompute:
                out = checkpoint(functools.partial(layer, *args, **kwargs) if not args else
                                 functools.partial(_call_first, layer, args, kwargs), h, use_reentrant=True)
            else:
                out = layer(h, *args, **kwargs)
        return out

    return run


def _call_first(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], h: torch.Tensor) -> Any:
    return layer(h, *args, **kwargs)


@contextlib.contextmanager
def _hooks(handles: list[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def build(cfg: InspectConfig) -> Any:
    """Trace ``cfg``'s training step on this process's world; returns ``tpu.Step(outputs, donate)``."""
    lay = layout(cfg)
    stacked_mode = cfg.layers == "scan"
    model = M.build_meta(lay.hf_config)
    device = runtime.device()
    mesh = runtime.mesh(tuple(n for _, n in cfg.mesh), tuple(a for a, _ in cfg.mesh))
    batch: Any = (cfg.batch_axes[0] if len(cfg.batch_axes) == 1 else cfg.batch_axes) if cfg.batch_axes else None
    dt = torch.bfloat16

    for mod in model.modules():  # buffers (rotary inv_freq, GPT-2's causal mask) are real: move them
        for k, buf in list(mod._buffers.items()):
            if buf is not None:
                mod._buffers[k] = buf.to(device)

    raws: dict[str, torch.Tensor] = {}
    leaves: dict[str, torch.Tensor] = {}
    for name, shape, spec in lay.trained(stacked_mode):
        raw = placeholder(shape, dt)
        w = raw * 1  # a placeholder cannot carry an annotation; its product can
        xs.mark_sharding(w, mesh, spec)
        raws[name], leaves[name] = raw, w.detach().requires_grad_(True)  # the leaf keeps the sharding
    by_name = {p.name: p for p in lay.params}
    for p in lay.params:
        if stacked_mode and p.layer is not None:
            continue
        for mod_name, attr in p.holders:
            model.get_submodule(mod_name)._parameters[attr] = leaves[p.name]

    def ann(spec: tuple[Any, ...]) -> Callable[..., Any]:
        def hook(_mod: nn.Module, _inp: tuple[Any, ...], out: Any) -> Any:
            t = out[0] if isinstance(out, tuple) else out
            if not isinstance(t, torch.Tensor) or t.dim() < 2:
                return out
            full = (batch, *([None] * (t.dim() - 2)), spec[-1]) if t.dim() >= 2 else spec
            t = xs.mark_sharding_with_gradients(t, mesh, full)
            return (t, *out[1:]) if isinstance(out, tuple) else t
        return hook

    layers = model.get_submodule(lay.layer_path)
    handles = []
    annotate = [layers[0]] if stacked_mode else list(layers)
    handles += [m.register_forward_hook(ann((None,))) for m in annotate]
    embed = model.get_input_embeddings()
    handles.append(embed.register_forward_hook(ann((None,))))
    if cfg.tensor:  # Megatron: column-parallel and vocabulary outputs split on the tensor axis, rows not
        for mod_name, mod in model.named_modules():
            if stacked_mode and mod_name.startswith(lay.layer_path + ".") and \
                    not mod_name.startswith(f"{lay.layer_path}.0."):
                continue
            w = mod._parameters.get("weight") if hasattr(mod, "_parameters") else None
            name = f"{mod_name}.weight"
            if w is None or name not in by_name or mod is embed:
                continue
            split = S.output_split(lay.origins.get(name, ""))
            handles.append(mod.register_forward_hook(ann((split,))))

    partition = None
    if cfg.layers != "loop":
        partition = full_recompute_partition if cfg.recompute == "full" else default_partition
    tuple_out = lay.hf_config.model_type == "gpt2"
    window = getattr(lay.hf_config, "sliding_window", None)
    if stacked_mode:
        template = layers[0]
        stacked = {p.suffix: leaves[f"{lay.layer_path}.*.{p.suffix}"] for p in lay.params
                   if p.layer == 0}
        for k, buf in template.named_buffers():  # buffers travel with the weights: [L, ...] copies (small)
            stacked[k] = buf.unsqueeze(0).expand(lay.num_layers, *buf.shape).contiguous()
        runner = _scan_runner(template, stacked, partition, cfg.seq, window, lay.num_layers)
    elif cfg.layers == "scan_layers":
        runner = _scan_layers_runner(list(layers), partition, tuple_out, cfg.seq, window)
    else:
        runner = _loop_runner(list(layers), cfg.recompute == "full")
    parent_name, _, attr = lay.layer_path.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, LayerStack(layers, runner))

    tokens, labels = (placeholder((cfg.batch, cfg.seq), torch.int64) * 1 for _ in range(2))  # [B, S]
    for t in (tokens, labels):
        xs.mark_sharding(t, mesh, (batch, None))
    with _hooks(handles), M.static_moe(lay.hf_config.model_type):
        loss = model(input_ids=tokens, labels=labels, use_cache=False).loss
        loss.backward()

    outs: list[torch.Tensor] = [loss]
    donate: dict[int, torch.Tensor] = {}
    for name, _shape, spec in lay.trained(stacked_mode):  # 07's AdamW step, the same ops and donations
        adamw_step(outs, donate, raws[name], leaves[name].grad, spec, mesh)
    return T.Step(outs, donate)
