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
                (``planner.verdict.full_recompute_partition``); loop: ``torch_xla.utils.checkpoint`` per layer;
                ``selective``: :func:`selective_partition` (the projections' outputs kept; scans only);
                ``offload``: full, with the kept layer inputs in host memory (:class:`OffloadPartition`; scans)
    attention   HF's ``eager`` or ``sdpa``, or torch_xla's Pallas flash kernel (``attention.register_flash``,
                traced inside ``memory.pallas_tpu.pallas_for_tpu_compile``)
    masks       HF's loop picks each layer's mask by ``decoder_layer.attention_type``: the runners HF calls carry
                it (:class:`Runner`); a scan rebuilds the mask inside the body, with each layer's own sliding
                window (``models.layer_windows``) when the layers' windows differ (Gemma 2, gpt-oss)
    activations forward hooks annotate each decoder layer's output and the embedding output as split over the
                batch axes; with tensor parallelism, column-parallel and vocabulary outputs on the tensor axis
                (``mark_sharding_with_gradients``)
    optimizer   ``optimizer.update``: the state ``formulas.optimizers.state_tensors`` lists for the run's optimizer
                and precision (AdamW fp32: master, exp_avg, exp_avg_sq, as ``planner.verdict`` traces it) as
                placeholders sharded like the weight, torch.optim's update, every new value donated into its old
                buffer (``tpu.Step``)

HF's decoder loop (``for layer in self.layers[:n]``, GPT-2's ``for i, block in enumerate(self.h)``) is kept: the
layer list is replaced by a :class:`LayerStack` whose slice / iteration yields one runner that scans all layers
(loop: one runner per layer), receiving exactly the arguments HF passes to a layer. Tensors among them (rotary
``cos, sin``, the mask) travel in the scan's carry unchanged (torchprime's "broadcasted inputs"); other values
are bound as constants.

Output order: ``[loss] + [new weight, *new state]`` per trained tensor in ``Layout.trained`` order (the state in
``state_tensors`` order: AdamW fp32 ``master, exp_avg, exp_avg_sq``) — the analysis reads the kinds from it
(:func:`output_kinds`).
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
from shardlab.formulas.optimizers import state_tensors
from shardlab.inspect import models as M
from shardlab.inspect import sharding as S
from shardlab.inspect.attention import register_flash
from shardlab.inspect.config import InspectConfig, layout
from shardlab.inspect.optimizer import update
from shardlab.memory.pallas_tpu import pallas_for_tpu_compile
from shardlab.planner.verdict import full_recompute_partition
from shardlab.profile import tpu as T
from shardlab.profile.placeholders import placeholder


def selective_partition(joint_module: Any, _joint_inputs: Any, *, num_fwd_outputs: int,
                        **_: Any) -> tuple[Any, Any]:
    """AOTAutograd partition for ``recompute='selective'`` (Korthikanti et al.'s selective recompute): the backward
    keeps the layer inputs and the outputs of the layer's projections (the 2-D ``mm`` / ``addmm`` of every
    ``nn.Linear``) and recomputes everything else — norms, activations, the attention core (its batched matmuls,
    mask and softmax: the ``[b, a, s, s]`` arrays)."""
    import torch._functorch.partitioners as P

    keep = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    backward: set[Any] = set()  # nodes that depend on a tangent (the backward's incoming gradient)
    for n in joint_module.graph.nodes:  # topological order
        if P._is_tangent(n) or any(i in backward for i in n.all_input_nodes):
            backward.add(n)
    saved = [n for n in joint_module.graph.nodes if n.users and n not in backward and
             (P._is_primal(n) or (n.op == "call_function" and n.target in keep))]
    return P._extract_fwd_bwd_modules(joint_module, saved, [], num_fwd_outputs=num_fwd_outputs)


class OffloadPartition:
    """AOTAutograd partition for ``recompute='offload'``: full recompute (the backward keeps only the layer's
    inputs, :func:`full_recompute_partition`) with the layer's hidden-state input (the scan carry's first leaf)
    placed in host memory:
    the forward returns ``place_to_host(x)`` for each (torch_xla's ``annotate_device_placement`` custom call,
    ``_xla_buffer_placement="pinned_host"``) and the backward starts with ``place_to_device`` of it. XLA's host
    offloader then keeps the scan's stacked ``[L, ...]`` residual buffer in host memory space ``S(5)``, written and
    read by asynchronous dynamic-update-slice / dynamic-slice (torchprime's and MaxText's offloaded remat).
    ``carry``: the number of carry leaves, set by the runner before each scan; ``offloaded``: the saved inputs
    moved, by name, for the record. The other kept inputs (rotary tables, per-layer weights' slices) stay."""

    def __init__(self) -> None:
        self.carry = 1
        self.offloaded: list[str] = []

    def __call__(self, joint_module: Any, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any) -> tuple[Any, Any]:
        import torch._functorch.partitioners as P
        import torch_xla.experimental.stablehlo_custom_call  # noqa: F401  (registers torch.ops.xla.place_to_*)

        primals = [n for n in joint_module.graph.nodes if P._is_primal(n)]
        # the hidden state only: offloading the carried rotary tables as well ([1, s, head_dim], replicated) makes
        # XLA:TPU fail its own verifier ("INTERNAL: ... The async-start expects the shape of operand 0 to match
        # the async shape ... vs ...S(5)"), measured with libtpu 0.0.21
        carried = {n.name for n in primals[:1]
                   if n.users and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()}
        fwd, bwd = full_recompute_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        out = next(n for n in fwd.graph.nodes if n.op == "output")
        outs, moved = list(out.args[0]), []
        for i in range(num_fwd_outputs, len(outs)):
            n = outs[i]
            if isinstance(n, torch.fx.Node) and n.name in carried:
                with fwd.graph.inserting_before(out):
                    host = fwd.graph.call_function(torch.ops.xla.place_to_host.default, (n,))
                host.meta["val"] = n.meta["val"]
                outs[i] = host
                moved.append(n.name)
        out.args = (tuple(outs),)
        for p in [n for n in bwd.graph.nodes if n.op == "placeholder" and n.name in moved]:
            with bwd.graph.inserting_after(p):
                dev = bwd.graph.call_function(torch.ops.xla.place_to_device.default, (p,))
            dev.meta["val"] = p.meta["val"]
            p.replace_all_uses_with(dev, delete_user_cb=lambda u, d=dev: u is not d)
        for g in (fwd, bwd):
            g.graph.lint()
            g.recompile()
        self.offloaded = moved
        return fwd, bwd


def output_kinds(cfg: InspectConfig) -> list[tuple[str, str]]:
    """``(trained tensor name, kind)`` of every output after the loss, in order: ``param`` then the optimizer's
    state tensors (``master``, ``exp_avg``, ``row_var``, ...)."""
    lay = layout(cfg)
    return [(name, k) for name, shape, _ in lay.trained(cfg.layers == "scan")
            for k in ("param", *(t.name for t in state_tensors(cfg.optimizer, cfg.optimizer_dtype, shape)))]


class Runner:
    """What HF's decoder loop calls in place of a layer: a function with the layer attributes the loop reads
    (``attention_type``: transformers 4.57 picks each layer's mask by it, ``causal_mask_mapping[...]``)."""

    def __init__(self, fn: Callable[..., Any], like: nn.Module) -> None:
        self.fn = fn
        self.attention_type = getattr(like, "attention_type", "full_attention")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class LayerStack(nn.ModuleList):
    """The decoder layers, as HF's model sees them: ``self.layers[:n]`` and ``iter(self.layers)`` give the runners
    (one that runs every layer for the scans, one per layer for the loop); ``named_parameters`` and indexing by
    int still see the real layers."""

    def __init__(self, layers: nn.ModuleList, runners: list[Runner]) -> None:
        super().__init__(list(layers))
        object.__setattr__(self, "_runners", runners)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return list(self._runners)
        return super().__getitem__(idx)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._runners)


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
            elif x.dim() == 4 and tuple(x.shape[-2:]) == (seq, seq) and (x.is_floating_point() or
                                                                        x.dtype == torch.bool):
                self.kind.append("mask")  # eager: additive float mask; sdpa: boolean (True = may attend)
            else:
                self.kind.append("carry" if x.is_floating_point() else "stack")
        self.const = [x if k == "const" else None for x, k in zip(leaves, self.kind, strict=True)]
        self.carried = [x for x, k in zip(leaves, self.kind, strict=True) if k == "carry"]
        self.stacked = [x for x, k in zip(leaves, self.kind, strict=True) if k == "stack"]
        self.mask_dtype = next((x.dtype for x, k in zip(leaves, self.kind, strict=True) if k == "mask"), None)
        self.seq, self.window, self.device = seq, window, device

    def join(self, carried: tuple[Any, ...], stacked: list[Any], window: Any = None) -> tuple[Any, dict[str, Any]]:
        """The layer's arguments; ``window``: this layer's window as a 0-d tensor (layers with different windows),
        else the call's constant window."""
        c, s = iter(carried), iter(stacked)
        w = self.window if window is None else window
        mask = causal_mask(self.seq, self.mask_dtype, w, self.device) if self.mask_dtype else None
        leaves = [next(c) if k == "carry" else next(s) if k == "stack" else mask if k == "mask" else x
                  for x, k in zip(self.const, self.kind, strict=True)]
        return tree_unflatten(leaves, self.spec)


def causal_mask(seq: int, dtype: torch.dtype, window: int | torch.Tensor | None,
                device: torch.device) -> torch.Tensor:
    """HF's additive causal mask ``[1, 1, s, s]``: 0 where query q may see key k (k <= q, and k > q - window with a
    sliding window), the dtype's minimum elsewhere (``masking_utils``: ``causal_mask_function``,
    ``sliding_window_overlay``, ``torch.where(mask, 0, min)``). ``window`` may be a 0-d integer tensor (a scanned
    layer's own window; ``seq`` or more = no window)."""
    q = torch.arange(seq, device=device)[:, None]  # [s, 1]
    k = torch.arange(seq, device=device)[None, :]  # [1, s]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (k > q - window)
    if dtype == torch.bool:  # sdpa's mask: True where attention is allowed
        return allowed[None, None]
    zero = torch.zeros((), dtype=dtype, device=device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, zero, low)[None, None]  # [1, 1, s, s]


class _Shared:
    """What the traced layer saw, kept by reference through ``scan_layers``' ``deepcopy`` of the first layer."""

    tuple_out = False

    def __deepcopy__(self, memo: dict[int, Any]) -> _Shared:
        return self


class _Carried(nn.Module):
    """One HF layer as ``scan_layers`` wants it: ``forward(hidden, *carried) -> (hidden', *carried)``; the stacked
    arguments are this wrapper's buffers (``scan_layers`` stacks buffers like weights)."""

    def __init__(self, layer: nn.Module, seen: _Shared) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "seen", seen)

    def set_call(self, call: _Call, window: int | None = None) -> None:
        """``window``: this layer's own window when the layers' windows differ (a buffer: stacked per layer)."""
        object.__setattr__(self, "call", call)
        for i, t in enumerate(call.stacked):
            self.register_buffer(f"arg{i}", t, persistent=False)
        if window is not None:
            self.register_buffer("window", torch.tensor(window, device=call.device), persistent=False)

    def forward(self, hidden: torch.Tensor, *carried: torch.Tensor) -> tuple[torch.Tensor, ...]:
        call: _Call = self.call  # type: ignore[attr-defined]
        args, kwargs = call.join(carried, [getattr(self, f"arg{i}") for i in range(len(call.stacked))],
                                 getattr(self, "window", None))
        out = self.layer(hidden, *args, **kwargs)
        self.seen.tuple_out = isinstance(out, tuple)  # Gemma 2, GPT-2, GPT-NeoX: (hidden, ...)
        return (out[0] if isinstance(out, tuple) else out, *carried)


def _one_window(windows: list[int | None], seq: int) -> tuple[int | None, list[int] | None]:
    """``(the window every layer shares, None)``, or ``(None, per-layer windows)`` when they differ (Gemma 2,
    gpt-oss: sliding and full layers alternate; ``seq`` stands for no window)."""
    if len(set(windows)) <= 1:
        return (windows[0] if windows else None), None
    return None, [seq if w is None else w for w in windows]


def _scan_runner(template: nn.Module, stacked: dict[str, torch.Tensor], partition: Callable[..., Any] | None, seq: int,
                 windows: list[int | None], num_layers: int) -> Callable[..., Any]:
    """Runner for ``layers='scan'``: ``scan`` over the stacked weights, one ``functional_call`` of the template."""
    window, per_layer = _one_window(windows, seq)

    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        call = _Call(args, kwargs, seq, window, hidden.device)
        xs = dict(stacked)
        for i, t in enumerate(call.stacked):  # [L, ...] copies of the per-layer arguments (position ids: small)
            xs[f"__arg{i}"] = t.unsqueeze(0).expand(num_layers, *t.shape).contiguous()
        if per_layer is not None:
            xs["__window"] = torch.tensor(per_layer, device=hidden.device)  # [L] int64
        tuple_out: list[bool] = []

        def body(carry: tuple[torch.Tensor, ...], w: dict[str, torch.Tensor]) -> tuple[Any, None]:
            h, *ts = carry
            w = dict(w)
            extra = [w.pop(f"__arg{i}") for i in range(len(call.stacked))]
            a, kw = call.join(tuple(ts), extra, w.pop("__window", None))
            out = torch.func.functional_call(template, w, (h, *a), kw, strict=True)
            tuple_out.append(isinstance(out, tuple))
            return (out[0] if isinstance(out, tuple) else out, *ts), None

        if isinstance(partition, OffloadPartition):
            partition.carry = 1 + len(call.carried)
        carry, _ = scan(body, (hidden, *call.carried), xs, partition_fn=partition)
        return (carry[0],) if tuple_out and tuple_out[0] else carry[0]

    return run


def _scan_layers_runner(layers: list[nn.Module], partition: Callable[..., Any] | None, seq: int,
                        windows: list[int | None]) -> Callable[..., Any]:
    """Runner for ``layers='scan_layers'``: torch_xla's ``scan_layers`` over the HF layers (carry-wrapped)."""
    seen = _Shared()
    wrapped = [_Carried(layer, seen) for layer in layers]
    window, per_layer = _one_window(windows, seq)

    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        call = _Call(args, kwargs, seq, window, hidden.device)
        for i, w in enumerate(wrapped):
            w.set_call(call, None if per_layer is None else per_layer[i])
        if isinstance(partition, OffloadPartition):
            partition.carry = 1 + len(call.carried)
        carry = scan_layers(wrapped, (hidden, *call.carried), partition_fn=partition)
        return (carry[0],) if seen.tuple_out else carry[0]

    return run


def _loop_runners(layers: list[nn.Module], recompute: bool) -> list[Runner]:
    """Runners for ``layers='loop'``: HF's own loop, one runner per layer (HF passes each its own mask), each layer
    under ``torch_xla.utils.checkpoint`` when recomputing."""
    def one(layer: nn.Module) -> Callable[..., Any]:
        def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if recompute:
                return checkpoint(functools.partial(layer, *args, **kwargs) if not args else
                                  functools.partial(_call_first, layer, args, kwargs), hidden, use_reentrant=True)
            return layer(hidden, *args, **kwargs)
        return run

    return [Runner(one(layer), layer) for layer in layers]


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
    device = runtime.device()
    mesh = runtime.mesh(tuple(n for _, n in cfg.mesh), tuple(a for a, _ in cfg.mesh))
    batch: Any = (cfg.batch_axes[0] if len(cfg.batch_axes) == 1 else cfg.batch_axes) if cfg.batch_axes else None
    kernel = register_flash(mesh, batch, cfg.tensor if cfg.tensor and cfg.mesh_dict[cfg.tensor] > 1 else None) \
        if cfg.attention == "flash" else cfg.attention
    model = M.build_meta(lay.hf_config, kernel)
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
        partition = {"full": full_recompute_partition, "selective": selective_partition,
                     "none": default_partition, "offload": OffloadPartition()}[cfg.recompute]
    windows = M.layer_windows(lay.hf_config, lay.num_layers)
    if stacked_mode:
        template = layers[0]
        stacked = {p.suffix: leaves[f"{lay.layer_path}.*.{p.suffix}"] for p in lay.params
                   if p.layer == 0}
        for k, buf in template.named_buffers():  # buffers travel with the weights: [L, ...] copies (small)
            stacked[k] = buf.unsqueeze(0).expand(lay.num_layers, *buf.shape).contiguous()
        runners = [Runner(_scan_runner(template, stacked, partition, cfg.seq, windows, lay.num_layers), template)]
    elif cfg.layers == "scan_layers":
        runners = [Runner(_scan_layers_runner(list(layers), partition, cfg.seq, windows), layers[0])]
    else:
        runners = _loop_runners(list(layers), cfg.recompute == "full")
    parent_name, _, attr = lay.layer_path.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, LayerStack(layers, runners))

    tokens, labels = (placeholder((cfg.batch, cfg.seq), torch.int64) * 1 for _ in range(2))  # [B, S]
    for t in (tokens, labels):
        xs.mark_sharding(t, mesh, (batch, None))
    pallas = pallas_for_tpu_compile(active=runtime.current().kind != "tpu") if cfg.attention == "flash" else \
        contextlib.nullcontext()
    with _hooks(handles), M.static_moe(lay.hf_config.model_type), pallas:  # flash: forward and backward kernels
        loss = model(input_ids=tokens, labels=labels, use_cache=False).loss
        loss.backward()

    outs: list[torch.Tensor] = [loss]
    donate: dict[int, torch.Tensor] = {}
    for name, _shape, spec in lay.trained(stacked_mode):  # the optimizer's step: new values donated into the old
        for _kind, old, new in update(cfg.optimizer, cfg.optimizer_dtype, raws[name], leaves[name].grad, spec, mesh):
            if all(a is None for a in spec):  # a whole tensor's updates stay whole (else propagation may split one,
                xs.mark_sharding(new, mesh, (None,) * new.dim())  # and a donated input cannot alias an output of
            donate[len(outs)] = old  # another size: gpt-oss's biases)
            outs.append(new)
    return T.Step(outs, donate)
