"""A stack of L identical blocks, runnable three ways: Python loop, ``scan_layers``, pre-stacked ``scan``.

Design note
-----------
One block is the MLP half of a decoder layer with a residual::

    y = x + gelu(x · W_up) · W_down        x: [b, s, h], W_up: [h, F], W_down: [F, h]

Matmuls are written as ``einsum`` so a [b, s, h] activation keeps its leading-dim sharding (``nn.Linear``
flattens to a 2-D dot; see ``case.linear_trap``).

Three ways to run L of them (the *loop is the oracle*):

``loop``         ``for block in blocks: x = block(x)`` — the traced graph holds L copies of the block, so its
                 size and compile time grow with L.
``scan_layers``  ``torch_xla.experimental.scan_layers(blocks, x)`` — one traced block inside an XLA While, but
                 the per-layer weights are ``torch.stack``-ed (and the gradients un-stacked) *inside the graph*
                 on every call: 2·L stack/slice ops per weight, so the graph still grows with L.
``scan``         weights are *held* stacked (``W_up: [L, h, F]``) and ``scan`` slices layer i out with
                 ``torch.func.functional_call`` on a template block: the graph is the same for every L.

All weights come from one seeded CPU generator (``init_weights``), so the three modes hold identical numbers.
Sizes are plain ints (notebook 06 reads them from its ``ScanParams``); torch_xla is imported at the top, so
import this module after ``shardlab.runtime.setup()`` (the notebooks' order).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch_xla.experimental.scan import scan  # imported after runtime.setup() (the notebooks' order)
from torch_xla.experimental.scan_layers import scan_layers

MODES = ("loop", "scan_layers", "scan")
WEIGHT_NAMES = ("w_up", "w_down")
WEIGHT_DIMS = {"w_up": ("h", "F"), "w_down": ("F", "h")}  # what each dim of a weight [d_in, d_out] is

# annotate(tensor, role) -> tensor returns the activation with a sharding annotation (forward and gradient);
# role is "act_in" ([b,s,h]) or "act_mid" ([b,s,F]). None = no annotation (CPU oracle, single device).
Annotate = Callable[[torch.Tensor, str], torch.Tensor]


def weight_shapes(hidden: int, ffn: int) -> dict[str, tuple[int, int]]:
    """Per-layer weight shapes: ``w_up`` [h, F], ``w_down`` [F, h]."""
    return {"w_up": (hidden, ffn), "w_down": (ffn, hidden)}


def check_sizes(**sizes: int) -> None:
    """Every size an int >= 1, or ValueError naming it."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an int >= 1")


class Block(nn.Module):
    """``y = x + gelu(x · W_up) · W_down`` with optional sharding annotations on the activations."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype = torch.float32, device: str | None = None,
                 annotate: Annotate | None = None) -> None:
        super().__init__()
        self.w_up = nn.Parameter(torch.empty(hidden, ffn, dtype=dtype, device=device))  # [h, F]
        self.w_down = nn.Parameter(torch.empty(ffn, hidden, dtype=dtype, device=device))  # [F, h]
        self.annotate = annotate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.annotate is not None:
            x = self.annotate(x, "act_in")
        h = torch.einsum("bsh,hf->bsf", x, self.w_up)  # [b,s,h] · [h,F] -> [b,s,F]
        h = torch.nn.functional.gelu(h)
        if self.annotate is not None:
            h = self.annotate(h, "act_mid")
        return x + torch.einsum("bsf,fh->bsh", h, self.w_down)  # [b,s,F] · [F,h] -> [b,s,h]


def init_weights(layers: int, hidden: int, ffn: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Stacked float32 CPU weights ``{"w_up": [L, h, F], "w_down": [L, F, h]}``.

    ``W_up ~ N(0, 1/H)``; ``W_down ~ N(0, 1/(F·2L))`` — GPT-2's residual scaling, so the residual stream
    stays O(1) at any depth and float32 comparisons with the oracle stay meaningful at L = 64.
    """
    check_sizes(layers=layers, hidden=hidden, ffn=ffn)
    g = torch.Generator().manual_seed(seed)
    scale = {"w_up": 1 / math.sqrt(hidden), "w_down": 1 / math.sqrt(ffn * 2 * layers)}
    return {name: torch.randn(layers, d_in, d_out, generator=g) * scale[name]  # [L, d_in, d_out]
            for name, (d_in, d_out) in weight_shapes(hidden, ffn).items()}


def init_input(batch: int, seq: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """Float32 CPU input ``x: [b, s, h]`` from its own seeded generator."""
    check_sizes(batch=batch, seq=seq, hidden=hidden)
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(batch, seq, hidden, generator=g)


def check_same_shapes(blocks: Sequence[nn.Module]) -> None:
    """Raise if the blocks do not share parameter names and shapes (scan needs identical layers)."""
    if len(blocks) < 1:
        raise ValueError(f"layers={len(blocks)}: need at least one block (L >= 1)")
    ref = {n: tuple(p.shape) for n, p in blocks[0].named_parameters()}
    for i, b in enumerate(blocks[1:], start=1):
        got = {n: tuple(p.shape) for n, p in b.named_parameters()}
        if set(got) != set(ref):
            raise ValueError(f"layer {i} has parameters {sorted(got)} but layer 0 has {sorted(ref)}")
        for n, shape in ref.items():
            if got[n] != shape:
                raise ValueError(f"layer {i} parameter {n!r} has shape {list(got[n])} but layer 0 has "
                                 f"{list(shape)}: scan needs identical layers")


class BlockList(nn.Module):
    """L separate blocks; ``mode`` is ``loop`` or ``scan_layers``."""

    def __init__(self, blocks: Sequence[Block], mode: str) -> None:
        super().__init__()
        if mode not in ("loop", "scan_layers"):
            raise ValueError(f"mode={mode!r}: BlockList runs 'loop' or 'scan_layers'")
        check_same_shapes(blocks)
        self.blocks = nn.ModuleList(blocks)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "loop":
            for block in self.blocks:
                x = block(x)  # [b,s,h] -> [b,s,h]
            return x
        return scan_layers(self.blocks, x)

    def stacked_grads(self) -> dict[str, torch.Tensor]:
        """Per-layer gradients stacked to ``[L, ...]`` (comparison helper; adds ops if on XLA)."""
        return {n: torch.stack([getattr(b, n).grad for b in self.blocks]) for n in WEIGHT_NAMES}

    def weights(self) -> dict[str, list[torch.Tensor]]:
        return {n: [getattr(b, n) for b in self.blocks] for n in WEIGHT_NAMES}


class StackedBlocks(nn.Module):
    """Weights held stacked (``w_up: [L, h, F]``, ``w_down: [L, F, h]``); forward is one ``scan``."""

    def __init__(self, w_up: torch.Tensor, w_down: torch.Tensor, annotate: Annotate | None = None) -> None:
        super().__init__()
        if w_up.dim() != 3 or w_down.dim() != 3:
            raise ValueError(f"stacked weights must be 3-D [L, d_in, d_out]; got w_up {list(w_up.shape)}, "
                             f"w_down {list(w_down.shape)}")
        L, H, F = w_up.shape
        if tuple(w_down.shape) != (L, F, H):
            raise ValueError(f"w_down has shape {list(w_down.shape)} but w_up {list(w_up.shape)} needs "
                             f"[{L}, {F}, {H}]")
        self.w_up = nn.Parameter(w_up)
        self.w_down = nn.Parameter(w_down)
        # The template block lives on 'meta' (no memory) and outside the module tree: functional_call swaps
        # in one layer's slices, so its own parameters are never read.
        self._template = [Block(H, F, dtype=w_up.dtype, device="meta", annotate=annotate)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        template = self._template[0]

        def step(carry: torch.Tensor, layer: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
            # layer["w_up"]: [h, F], layer["w_down"]: [F, h] — slice i of the stacked weights
            return torch.func.functional_call(template, layer, (carry,), strict=True), None

        out, _ = scan(step, x, {"w_up": self.w_up, "w_down": self.w_down})
        return out

    def stacked_grads(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n).grad for n in WEIGHT_NAMES}

    def weights(self) -> dict[str, list[torch.Tensor]]:
        return {n: [getattr(self, n)] for n in WEIGHT_NAMES}


def build(mode: str, weights: dict[str, torch.Tensor], annotate: Annotate | None = None,
          device: torch.device | str | None = None) -> nn.Module:
    """A model in ``mode`` holding copies of ``weights`` (stacked CPU tensors from :func:`init_weights`)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}")
    w_up, w_down = weights["w_up"], weights["w_down"]
    L = w_up.shape[0]
    if L < 1:
        raise ValueError(f"layers={L} must be >= 1")
    if mode == "scan":
        model: nn.Module = StackedBlocks(w_up.clone(), w_down.clone(), annotate)
    else:
        blocks = []
        for i in range(L):
            b = Block(w_up.shape[1], w_up.shape[2], dtype=w_up.dtype, annotate=annotate)
            with torch.no_grad():
                b.w_up.copy_(w_up[i])
                b.w_down.copy_(w_down[i])
            blocks.append(b)
        model = BlockList(blocks, mode)
    return model.to(device) if device is not None else model


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    """Scalar loss ``mean(out²)`` — every output element gets a distinct gradient."""
    return out.pow(2).mean()


def reference(weights: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The oracle: CPU eager Python loop. Returns (output [b,s,h], stacked grads incl. ``x``)."""
    model = build("loop", {k: copy.deepcopy(v) for k, v in weights.items()})
    x = x.clone().requires_grad_(True)
    out = model(x)
    loss_fn(out).backward()
    grads = model.stacked_grads()
    grads["x"] = x.grad
    return out.detach(), grads
