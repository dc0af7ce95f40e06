"""The 405B seed at full size: a scan over placeholder weights, compiled by the XLA:TPU compiler, shard_as off/on.

Design note
-----------
Llama 3.1 405B's decoder weights, stacked over its 126 layers, in torch's ``[out, in]`` layout and 2-D sharded
on a mesh (fsdp, tensor) — notation ``A[I_X, J_Y]``: dim I split over mesh axis X::

    q, gate, up   [L, out, in] -> [∅, out_tensor, in_fsdp]      q: [126, 16384, 16384]
    o, down       [L, out, in] -> [∅, out_fsdp, in_tensor]      o: [126, 16384, 16384]
    x             [B, S, H]    -> x[B_fsdp, S, H]               (the carry of the scan)

One step is a forward + backward through ``torch_xla.experimental.scan`` of the block::

    qo:   h = x + silu(x · qᵀ) · oᵀ                             x·qᵀ: [B, S, H] · [H, H] -> [B, S, H_tensor]
    mlp:  h = h + (silu(h · gateᵀ) ⊙ (h · upᵀ)) · downᵀ          [B, S, H] -> [B, S, F_tensor] -> [B, S, H]

Weights and input are placeholders (``placeholder * 1`` carries the sharding annotation; a placeholder itself
cannot be annotated), so nothing is allocated: the graph is only lowered and handed to the TPU compiler.

Two switches decide whether ``shard_as`` matters (measured with libtpu 0.0.21, v6e:8x8, mesh 16 × 4):

``stacking``   ``"in_graph"`` — 126 per-layer weights are ``torch.stack``-ed inside the step (what
               ``scan_layers`` does) and the per-layer gradients are sliced back out; ``"held"`` — the
               weights are held stacked ``[L, ...]`` and the step returns the stacked gradient.
``update``     ``"none"`` — the step returns the gradients (torch_xla keeps ``.grad`` live); ``"sgd"`` —
               ``w - lr·g`` in the same graph.

Without ``shard_as`` the per-layer gradient ``dq = (dY)ᵀ · x`` contracts the fsdp-sharded batch, is
all-reduced over fsdp and left 1-D (``[1, 4096, 16384]`` per chip), and the stacked gradient buffer the backward
scan writes it into takes that sharding: ``bf16[126, 4096, 16384]`` = 15.75 GiB per chip, per weight. With
``stacking="in_graph"`` that buffer is a temporary and the compile fails ("Used 36.56G of 31.25G hbm"); with
``"held"`` it is an output, which the compiler's capacity check does not count, so the compile succeeds with
31.5 GiB of outputs that no chip can hold. When an update ``w - lr·g`` in the same graph ties the gradient to
the 2-D weight, sharding propagation carries the weight's sharding back into the loop and off = on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

# (out, in) per layer, as a function of (hidden, ffn); mesh axes of (out, in)
WEIGHTS: dict[str, tuple[str, str]] = {"q": ("hidden", "hidden"), "o": ("hidden", "hidden"),
                                       "gate": ("ffn", "hidden"), "up": ("ffn", "hidden"),
                                       "down": ("hidden", "ffn")}
SPECS: dict[str, tuple[str, str]] = {"q": ("tensor", "fsdp"), "o": ("fsdp", "tensor"),
                                     "gate": ("tensor", "fsdp"), "up": ("tensor", "fsdp"),
                                     "down": ("fsdp", "tensor")}
STACKINGS = ("in_graph", "held")
UPDATES = ("none", "sgd")
SGD_LR = 1e-3


@dataclass(frozen=True)
class SeedConfig:
    layers: int = 126  # L (Llama 3.1 405B)
    hidden: int = 16384  # H
    ffn: int = 53248  # F (SwiGLU)
    batch: int = 16  # B, sharded over fsdp
    seq: int = 1024  # S
    mesh_fsdp: int = 16
    mesh_tensor: int = 4
    weights: tuple[str, ...] = ("q", "o")  # which per-layer weights the block has (the seed: q_proj, o_proj)
    stacking: str = "in_graph"  # "in_graph" (scan_layers style) | "held" (pre-stacked [L, ...] parameters)
    update: str = "none"  # "none": the step returns the gradients | "sgd": w - lr·g in the same graph
    shard_as: bool = True  # torch_xla's default; False = the monkeypatched pre-fix backward
    dtype: str = "bfloat16"

    def validate(self) -> SeedConfig:
        for name in ("layers", "hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")
        unknown = [w for w in self.weights if w not in WEIGHTS]
        if not self.weights or unknown:
            raise ValueError(f"weights={self.weights!r}: give a non-empty subset of {tuple(WEIGHTS)}")
        if ("gate" in self.weights or "down" in self.weights) and "up" not in self.weights:
            raise ValueError(f"weights={self.weights!r}: an MLP needs 'up' (and 'down'; 'gate' makes it SwiGLU)")
        if ("up" in self.weights) != ("down" in self.weights):
            raise ValueError(f"weights={self.weights!r}: 'up' and 'down' come together")
        if ("q" in self.weights) != ("o" in self.weights):
            raise ValueError(f"weights={self.weights!r}: 'q' and 'o' come together")
        if self.stacking not in STACKINGS:
            raise ValueError(f"stacking={self.stacking!r} must be one of {STACKINGS}")
        if self.update not in UPDATES:
            raise ValueError(f"update={self.update!r} must be one of {UPDATES}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype={self.dtype!r} must be 'bfloat16' or 'float32'")
        rules = (("hidden", self.hidden, "fsdp", self.mesh_fsdp), ("hidden", self.hidden, "tensor", self.mesh_tensor),
                 ("batch", self.batch, "fsdp", self.mesh_fsdp))
        if "up" in self.weights:
            rules += (("ffn", self.ffn, "tensor", self.mesh_tensor),)
        for name, size, axis, n in rules:
            if size % n:
                raise ValueError(f"{name}={size} is not divisible by {axis}={n} (it is sharded over {axis})")
        return self

    @property
    def chips(self) -> int:
        return self.mesh_fsdp * self.mesh_tensor

    def shape(self, weight: str) -> tuple[int, int]:
        """Per-layer ``(out, in)`` of ``weight``."""
        out_dim, in_dim = WEIGHTS[weight]
        return getattr(self, out_dim), getattr(self, in_dim)


def _block(cfg: SeedConfig, mesh: Any) -> Any:
    import torch_xla.distributed.spmd as xs

    def ann(t: torch.Tensor, spec: tuple[str | None, ...]) -> torch.Tensor:
        return xs.mark_sharding_with_gradients(t, mesh, spec)

    def step(carry: torch.Tensor, layer: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
        h = ann(carry, ("fsdp", None, None))  # [B_fsdp, S, H]
        if "q" in layer:
            a = ann(torch.einsum("bsh,oh->bso", h, layer["q"]), ("fsdp", None, "tensor"))  # [B, S, H_tensor]
            h = h + torch.einsum("bsi,oi->bso", torch.nn.functional.silu(a), layer["o"])  # [B, S, H] (+ all-reduce)
            h = ann(h, ("fsdp", None, None))
        if "up" in layer:
            u = ann(torch.einsum("bsh,fh->bsf", h, layer["up"]), ("fsdp", None, "tensor"))  # [B, S, F_tensor]
            if "gate" in layer:
                g = ann(torch.einsum("bsh,fh->bsf", h, layer["gate"]), ("fsdp", None, "tensor"))
                u = torch.nn.functional.silu(g) * u
            else:
                u = torch.nn.functional.gelu(u)
            h = h + torch.einsum("bsf,hf->bsh", u, layer["down"])  # [B, S, F_tensor] · [H, F_tensor] -> [B, S, H]
        return h, None

    return step


def build(cfg: SeedConfig) -> list[torch.Tensor]:
    """Trace one step of the seed stack on this process's device world; returns ``[loss, *outputs]``.

    Outputs are the weight gradients (``update="none"``; stacked ``[L, out, in]`` each, or L per-layer
    ``[out, in]`` with ``stacking="in_graph"``) or the updated weights (``update="sgd"``). Module-level so
    ``shardlab.profile.tpu.compile_program`` can run it in a worker with ``cfg.chips`` devices.
    """
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.scan import scan

    from shardlab import runtime
    from shardlab.xla_scan.patches import placeholder, shard_as_enabled

    cfg.validate()
    mesh = runtime.mesh((cfg.mesh_fsdp, cfg.mesh_tensor), ("fsdp", "tensor"))
    dt = getattr(torch, cfg.dtype)
    leaves: dict[str, list[torch.Tensor]] = {}
    stacked: dict[str, torch.Tensor] = {}
    for name in cfg.weights:
        if cfg.stacking == "held":
            leaf = placeholder((cfg.layers, *cfg.shape(name)), dt).requires_grad_(True)  # [L, out, in]
            w = leaf * 1  # a placeholder cannot carry an annotation; its product can
            xs.mark_sharding(w, mesh, (None, *SPECS[name]))
            leaves[name], stacked[name] = [leaf], w
        else:
            per_layer = []
            leaves[name] = []
            for _ in range(cfg.layers):
                leaf = placeholder(cfg.shape(name), dt).requires_grad_(True)  # [out, in]
                w = leaf * 1
                xs.mark_sharding(w, mesh, SPECS[name])
                leaves[name].append(leaf)
                per_layer.append(w)
            stacked[name] = torch.stack(per_layer)  # [L, out, in], inside the graph (as scan_layers does)
    x = placeholder((cfg.batch, cfg.seq, cfg.hidden), dt) * 1  # [B, S, H]
    xs.mark_sharding(x, mesh, ("fsdp", None, None))
    with shard_as_enabled(cfg.shard_as):
        out, _ = scan(_block(cfg, mesh), x, stacked)  # [B, S, H]
        loss = out.float().pow(2).mean()
        loss.backward()
    flat = [leaf for name in cfg.weights for leaf in leaves[name]]
    if cfg.update == "sgd":
        return [loss, *[leaf - SGD_LR * leaf.grad for leaf in flat]]
    return [loss, *[leaf.grad for leaf in flat]]


@dataclass
class SeedResult:
    """One compile of the seed stack (per-chip numbers)."""

    config: dict[str, Any]
    topology: str
    fits: bool  # the compiler's verdict (its HBM check counts arguments + temporaries, not outputs)
    compile_s: float
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    capacity_bytes: int | None = None
    grad_shapes: dict[str, list[str]] = field(default_factory=dict)  # weight -> per-chip output shapes
    message: str = ""  # the compiler's first line when it ran out of memory
    largest: list[tuple[int, str, str]] = field(default_factory=list)  # (bytes, shape, XLA label)
    used_bytes: int | None = None  # from the out-of-memory message
    output_in_message: str = ""  # "Output size ...": what the compiler reports but does not count

    @property
    def live_bytes(self) -> int | None:
        """Arguments + outputs + temporaries: what a chip must hold to run the step (outputs included)."""
        if self.argument_bytes is None:
            return None
        return self.argument_bytes + (self.output_bytes or 0) + (self.temp_bytes or 0)

    @property
    def runs(self) -> bool:
        """Would the step run: the compile fits *and* the outputs fit beside arguments and temporaries."""
        return bool(self.fits and self.capacity_bytes and self.live_bytes is not None
                    and self.live_bytes <= self.capacity_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "live_bytes": self.live_bytes, "runs": self.runs}


def _entry_outputs(hlo_text: str) -> list[str]:
    """Per-chip result shapes of the TPU program's entry computation (from its layout header)."""
    from shardlab.profile.hlo_text import parse_shape

    head = hlo_text.split("\n", 1)[0]
    key = "entry_computation_layout={"
    if key not in head:
        return []
    layout = head.split(key, 1)[1].split(", allow_spmd", 1)[0]
    return [str(a) for a in parse_shape(layout.split(")->", 1)[1])]


def compile_seed(cfg: SeedConfig, topology: str = "v6e:8x8") -> SeedResult:
    """Build ``cfg``'s step (in a worker with ``cfg.chips`` devices when needed) and compile it for ``topology``."""
    from shardlab.profile import tpu

    cfg.validate()
    topo = tpu.get_topology(topology)
    if topo.chips != cfg.chips:
        raise ValueError(f"topology={topology!r} has {topo.chips} chips but the mesh (fsdp={cfg.mesh_fsdp}, "
                         f"tensor={cfg.mesh_tensor}) has {cfg.chips}")
    c = tpu.compile_program(build, cfg, topology, label=f"seed shard_as={'on' if cfg.shard_as else 'off'}")
    res = SeedResult(asdict(cfg), topology, c.fits, c.compile_s, capacity_bytes=topo.hbm_bytes)
    if c.fits and c.memory is not None and c.hlo_text is not None:
        res.argument_bytes, res.output_bytes, res.temp_bytes = c.memory.argument, c.memory.output, c.memory.temp
        shapes = _entry_outputs(c.hlo_text)[1:]  # [0] is the loss
        per = len(shapes) // len(cfg.weights)
        res.grad_shapes = {w: sorted(set(shapes[i * per:(i + 1) * per])) for i, w in enumerate(cfg.weights)}
    elif c.oom is not None:
        res.message = next((ln for ln in c.oom.message.splitlines() if "Ran out of memory" in ln),
                           c.oom.message.split("\n", 1)[0])
        res.used_bytes, res.capacity_bytes = c.oom.used, c.oom.capacity
        res.largest = [(b.size, b.shape, b.label) for b in c.oom.buffers[:5]]
        # "arguments 0B" in the message means "not evaluated" (the program alone already exceeded the HBM)
        res.argument_bytes = c.oom.breakdown.get("arguments") or None
        res.output_in_message = next((ln.strip() for ln in c.oom.message.splitlines()
                                      if ln.strip().startswith("Output size")), "")
    return res


def off_on(cfg: SeedConfig, topology: str = "v6e:8x8") -> dict[str, SeedResult]:
    """The same step compiled with shard_as off and on."""
    return {"off": compile_seed(replace(cfg, shard_as=False), topology),
            "on": compile_seed(replace(cfg, shard_as=True), topology)}
