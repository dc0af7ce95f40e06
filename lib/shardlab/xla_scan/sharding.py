"""2-D (fsdp, tensor) sharding of the block stack, and reading sharding specs back.

Design note
-----------
Notation ``A[I_X, J_Y]``: dim I split over mesh axis X, dim J over Y; ``∅`` = not split.

    W_up   [h, F]      -> W_up[h_fsdp, F_tensor]         stacked: [L, h, F] -> [∅, h_fsdp, F_tensor]
    W_down [F, h]      -> W_down[F_tensor, h_fsdp]       stacked: [L, F, h] -> [∅, F_tensor, h_fsdp]
    x      [b, s, h]   -> x[b_fsdp, s, h]                (act_in, batch over fsdp as in FSDP)
    h      [b, s, F]   -> h[b_fsdp, s, F_tensor]         (act_mid, the up-projection output)

That is the ``"batch"`` activation layout (x's h whole). The ``"seed"`` layout is the one the seed ran
(torchprime's ``llama-fsdp-tp.yaml``: every decoder activation ``[fsdp, null, tensor]``): x[b_fsdp, s, h_tensor].
Then ``dW_up = xᵀ[h_tensor, b_fsdp] · dh[b_fsdp, F_tensor]`` has both result dims asking for tensor — the
conflicting-axis matmul A[M_X, N_Y]·B[N_Y, M_X] of pytorch/xla#8883: the contraction leaves partial sums over
fsdp, and the result can keep tensor on only one of its dims.

XLA prints a sharding as ``{devices=[t0,t1,...]<device order>}`` with one tile count per tensor dim; a
trailing extra count plus ``last_tile_dim_replicate`` means "each tile is replicated that many times".
``W[h, F_tensor]`` on mesh (2, 4) is ``{devices=[1,4,2]... last_tile_dim_replicate}``: the 1-D gradient
that an all-reduce over fsdp leaves behind. torch_xla is imported at the top: import this module after
``shardlab.runtime.setup()`` (the notebooks' order).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch
import torch_xla
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)

from shardlab import runtime
from shardlab.formulas.common import ceil_div
from shardlab.xla_scan.model import Annotate
from shardlab.xla_scan.params import ScanParams

AXES = ("fsdp", "tensor")
WEIGHT_SPECS: dict[str, tuple[str | None, ...]] = {"w_up": ("fsdp", "tensor"), "w_down": ("tensor", "fsdp")}
ACT_LAYOUTS: dict[str, dict[str, tuple[str | None, ...]]] = {
    "batch": {"act_in": ("fsdp", None, None), "act_mid": ("fsdp", None, "tensor")},  # x's h whole
    "seed": {"act_in": ("fsdp", None, "tensor"), "act_mid": ("fsdp", None, "tensor")},  # torchprime: [fsdp, -, tensor]
}


def check_layout(layout: str) -> None:
    if layout not in ACT_LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {tuple(ACT_LAYOUTS)}")


def check_sharding(p: ScanParams, layout: str = "batch") -> None:
    """Clear errors, before any XLA work, for a mesh or sizes the 2-D sharding (and ``layout``) cannot tile."""
    check_layout(layout)
    for name in ("hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an int >= 1")
    rules = (("hidden", p.hidden, "fsdp", p.mesh_fsdp), ("ffn", p.ffn, "tensor", p.mesh_tensor),
             ("batch", p.batch, "fsdp", p.mesh_fsdp))
    if layout == "seed":
        rules += (("hidden", p.hidden, "tensor", p.mesh_tensor),)
    for name, size, axis, n in rules:
        if size % n:
            raise ValueError(f"{name}={size} is not divisible by {axis}={n} (it is sharded over {axis})")


def make_mesh(mesh_fsdp: int, mesh_tensor: int) -> xs.Mesh:
    return runtime.mesh((mesh_fsdp, mesh_tensor), AXES)


def annotator(mesh: xs.Mesh, layout: str = "batch") -> Annotate:
    """An ``annotate(t, role) -> t'`` for :class:`~shardlab.xla_scan.model.Block` (activations as ``layout``).

    Uses ``mark_sharding_with_gradients`` (out-of-place, annotates the gradient too): the in-place
    ``mark_sharding`` cannot run under the AOTAutograd tracing that ``scan`` does.
    """
    specs = ACT_LAYOUTS[layout]

    def annotate(t: torch.Tensor, role: str) -> torch.Tensor:
        return xs.mark_sharding_with_gradients(t, mesh, specs[role])

    return annotate


def shard_model(model: torch.nn.Module, mesh: xs.Mesh) -> None:
    """Mark every weight 2-D: per-layer ``[h_fsdp, F_tensor]``; stacked adds a replicated layer axis."""
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        spec = WEIGHT_SPECS[leaf]
        if p.dim() == 3:  # stacked [L, d_in, d_out]
            spec = (None, *spec)
        xs.mark_sharding(p, mesh, spec)


def shard_input(x: torch.Tensor, mesh: xs.Mesh, layout: str = "batch") -> None:
    xs.mark_sharding(x, mesh, ACT_LAYOUTS[layout]["act_in"])


def spec_of(t: torch.Tensor) -> str:
    """torch_xla's sharding string of an XLA tensor (``''`` when unsharded/replicated)."""
    return torch_xla._XLAC._get_xla_sharding_spec(t)


class Tiling(NamedTuple):
    """A parsed sharding string."""

    tiles: tuple[int, ...]  # tiles per tensor dim (1 = not split)
    replicas: int  # copies of each tile (the last_tile_dim_replicate count, else 1)
    kind: str  # "2d" (two dims split), "1d" (one dim split), "replicated", "other"


_DEVICES = re.compile(r"devices=\[([\d,]+)\]")


def parse_spec(spec: str, rank: int) -> Tiling:
    """Parse ``{devices=[1,4,2]0,1,... last_tile_dim_replicate}`` for a tensor of ``rank`` dims.

    >>> parse_spec("{devices=[2,4]0,1,2,3,4,5,6,7}", 2)
    Tiling(tiles=(2, 4), replicas=1, kind='2d')
    >>> parse_spec("{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", 2)
    Tiling(tiles=(1, 4), replicas=2, kind='1d')
    """
    if not spec or "replicated" in spec:
        return Tiling((1,) * rank, 0, "replicated")
    m = _DEVICES.search(spec)
    if m is None:
        raise ValueError(f"cannot parse sharding spec {spec!r}")
    dims = tuple(int(d) for d in m.group(1).split(","))
    replicas = 1
    if "last_tile_dim_replicate" in spec or "last_tile_dims" in spec:
        dims, replicas = dims[:-1], dims[-1]
    if len(dims) != rank:
        raise ValueError(f"sharding spec {spec!r} has {len(dims)} tile dims but the tensor has rank {rank}")
    split = sum(d > 1 for d in dims)
    kind = {0: "replicated", 1: "1d", 2: "2d"}.get(split, "other")
    return Tiling(dims, replicas, kind)


def local_bytes(shape: tuple[int, ...] | torch.Size, spec: str, itemsize: int) -> int:
    """Bytes one device holds of a tensor with this sharding (uneven tiles padded, as XLA does)."""
    tiling = parse_spec(spec, len(shape))
    return math.prod(ceil_div(s, t) for s, t in zip(shape, tiling.tiles, strict=True)) * itemsize


def layer_spec(stacked_spec: str) -> str:
    """The per-layer spec inside a stacked ``[L, ...]`` spec whose layer axis is not split.

    >>> layer_spec("{devices=[1,1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}")
    '{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}'
    """
    m = _DEVICES.search(stacked_spec)
    if m is None or not m.group(1).startswith("1,"):
        raise ValueError(f"{stacked_spec!r} is not a stacked spec with an unsplit leading layer axis")
    return stacked_spec.replace(f"[{m.group(1)}]", f"[{m.group(1)[2:]}]", 1)
