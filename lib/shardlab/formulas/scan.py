"""Formulas for scan over layers: stacked-gradient bytes with 1-D vs 2-D sharding, placeholder transfers.

Design note
-----------
scan over L layers keeps every per-layer weight (and its gradient) in one *stacked* array
``W[L, d_in, d_out]``.  On a 2-D mesh (fsdp, tensor) — an axis's name also stands for its size — the weight is
sharded ``W[∅, I_fsdp, J_tensor]`` (layer axis replicated), so one device holds ``L·d_in·d_out / (fsdp·tensor)``
elements.

The 405B OOM: the per-layer gradient ``dW_l[d_in, d_out]`` leaves the backward body all-reduced over fsdp but
still sharded over tensor — the 1-D sharding ``dW[I, J_tensor]`` (XLA prints it ``devices=[1,tensor,fsdp]
last_tile_dim_replicate``).  Written into the stacked gradient it forces the whole ``[L, d_in, d_out]`` array
to that sharding: ``L·d_in·d_out / tensor`` elements per device, fsdp times the 2-D cost.  ``shard_as(w, dw)``
in ``Scan.backward`` makes the gradient inherit the weight's 2-D sharding and removes the factor fsdp.

Why the gradient is 1-D (the root cause): ``dW = xᵀ · dy`` contracts over the batch, and the batch is split over
fsdp: ``xᵀ[h, b_fsdp] · dy[b_fsdp, F_tensor] = dW[h, F_tensor]{U_fsdp}`` (F: the MLP width) — each device holds a
partial sum, and the contracted mesh axis (fsdp) is gone from the result's tiling.  Nothing asks for it back, so
the partitioner finishes with an **all-reduce over fsdp** (:func:`grad_reduction`); ``shard_as`` asks for
``dW[h_fsdp, F_tensor]`` and gets a **reduce-scatter over fsdp** instead.  The backward ``While`` carries the
stacked gradient as one loop-state array with one sharding, so the per-layer choice becomes the whole ``[L, h, F]``
buffer's. With the seed's activation layout (x[b_fsdp, s, h_tensor], torchprime's ``[fsdp, null, tensor]``) both
result dims of ``xᵀ[h_tensor, b_fsdp] · dy[b_fsdp, F_tensor]`` ask for tensor: the 1-D gradient keeps it on one of
them — the same bytes either way, the orientation the compiler's choice (not predicted here).

The ``nn.Linear`` trap (:func:`flattened_rows`): ``F.linear`` on ``x[b_fsdp, s_tensor, h]`` reshapes to a 2-D
``[b·s, h]`` dot; the merged dim keeps both splits only when each device's (b, s) block is contiguous in b·s.

Everything here is plain arithmetic on ints: no torch, no XLA.  Functions return NamedTuples with named terms
so a notebook can print each term next to its measured counterpart.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from shardlab.formulas import hardware
from shardlab.formulas.common import ceil_div, dtype_bytes
from shardlab.formulas.presets import model_preset

Sharding = Literal["1d", "2d", "replicated"]

# The seed case (pytorch/xla issue #8883: Llama 3.1 405B on v6e-256 with FSDP + TP): the partitioned HLO showed a
# per-layer gradient [1, 4K, 16K] all-reduced over the FSDP axis and written into a stacked [126, 4K, 16K]
# output. HLO shapes after SPMD partitioning are *per device*: the logical weight is [L, h, h] = [126, 16K, 16K]
# (o_proj, per AI-Hypercomputer/torchprime issue #160; q_proj has the same shape; L and h from the
# llama-3.1-405b preset) and 4K = 16K / tensor, so tensor = 4 and fsdp = 256 / 4 = 64 (our reading; the report
# does not state the mesh). 1-D keeps only the tensor split.
SEED_MODEL = "llama-3.1-405b"
SEED_TOPOLOGY = "v6e-256"


class StackedBytes(NamedTuple):
    """Per-device bytes of one stacked array ``[layers, d_in, d_out]`` under a sharding."""

    layers: int
    d_in: int
    d_out: int
    dtype: str
    total_bytes: int  # layers · d_in · d_out · itemsize (the whole logical array)
    per_device_bytes: int  # the piece one device holds: fsdp·tensor pieces (2-D), tensor (1-D), 1 (replicated);
    #                        each dim rounded up, as XLA pads uneven tiles


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


def stacked_bytes(
    layers: int,
    d_in: int,
    d_out: int,
    fsdp: int,
    tensor: int,
    sharding: Sharding = "2d",
    dtype: str = "float32",
) -> StackedBytes:
    """Bytes per device of a stacked ``[layers, d_in, d_out]`` array on mesh (fsdp, tensor).

    ``2d``: ``W[∅, I_fsdp, J_tensor]``; ``1d``: ``W[∅, I, J_tensor]`` (all-reduced over fsdp, the pre-shard_as
    gradient);
    ``replicated``: every device holds everything.  Uneven dims are padded per device, as XLA does.

    >>> stacked_bytes(8, 256, 1024, fsdp=2, tensor=4, sharding="2d").per_device_bytes  # 8·128·256·4
    1048576
    >>> stacked_bytes(8, 256, 1024, fsdp=2, tensor=4, sharding="1d").per_device_bytes  # 8·256·256·4
    2097152
    """
    _check_positive(layers=layers, d_in=d_in, d_out=d_out, fsdp=fsdp, tensor=tensor)
    item = dtype_bytes(dtype)
    total = layers * d_in * d_out * item
    if sharding == "2d":
        local = layers * ceil_div(d_in, fsdp) * ceil_div(d_out, tensor) * item
    elif sharding == "1d":
        local = layers * d_in * ceil_div(d_out, tensor) * item
    elif sharding == "replicated":
        local = total
    else:
        raise ValueError(f"sharding={sharding!r} must be one of '2d', '1d', 'replicated'")
    return StackedBytes(layers, d_in, d_out, dtype, total, local)


class ShardAsSaving(NamedTuple):
    """Stacked gradient bytes per device for a set of weights, without (1-D) and with (2-D) shard_as."""

    off_bytes: int  # sum over weights, 1-D sharded gradients
    on_bytes: int  # sum over weights, 2-D sharded gradients
    ratio: float  # off / on  (= fsdp when every dim divides evenly)


def shard_as_saving(
    layers: int,
    weight_shapes: list[tuple[int, int]],
    fsdp: int,
    tensor: int,
    dtype: str = "float32",
) -> ShardAsSaving:
    """Stacked-gradient bytes per device for per-layer weights ``weight_shapes`` (each ``(d_in, d_out)``).

    Each weight is assumed sharded with one dim on fsdp and the other on tensor (either order — the
    byte count is the same when dims divide evenly); the OFF gradient keeps only the tensor split.

    >>> s = shard_as_saving(8, [(256, 1024), (1024, 256)], fsdp=2, tensor=4)
    >>> s.off_bytes, s.on_bytes, s.ratio
    (4194304, 2097152, 2.0)
    """
    if not weight_shapes:
        raise ValueError("weight_shapes is empty: give at least one (d_in, d_out)")
    off = on = 0
    for d_in, d_out in weight_shapes:
        off += stacked_bytes(layers, d_in, d_out, fsdp, tensor, "1d", dtype).per_device_bytes
        on += stacked_bytes(layers, d_in, d_out, fsdp, tensor, "2d", dtype).per_device_bytes
    return ShardAsSaving(off, on, off / on)


AXES = ("fsdp", "tensor")


def per_device_shape(shape: tuple[int, ...], dim_axes: tuple[str | None, ...], fsdp: int, tensor: int,
                     sharding: Sharding = "2d") -> tuple[int, ...]:
    """Per-device shape of an array whose dims are split over ``dim_axes`` (``"fsdp"``, ``"tensor"`` or None).

    ``1d`` drops the fsdp split (the array all-reduced over fsdp), ``replicated`` drops both; uneven dims are
    padded (rounded up), as XLA does.

    >>> per_device_shape((4, 128, 512), (None, "fsdp", "tensor"), fsdp=2, tensor=4)          # W_up[∅, h_f, F_t]
    (4, 64, 128)
    >>> per_device_shape((4, 128, 512), (None, "fsdp", "tensor"), fsdp=2, tensor=4, sharding="1d")
    (4, 128, 128)
    """
    if len(shape) != len(dim_axes):
        raise ValueError(f"shape {shape} has {len(shape)} dims but dim_axes {dim_axes} names {len(dim_axes)}")
    _check_positive(fsdp=fsdp, tensor=tensor)
    if sharding not in ("2d", "1d", "replicated"):
        raise ValueError(f"sharding={sharding!r} must be one of '2d', '1d', 'replicated'")
    kept = {"2d": AXES, "1d": ("tensor",), "replicated": ()}[sharding]
    size = {"fsdp": fsdp, "tensor": tensor}
    out = []
    for d, axis in zip(shape, dim_axes, strict=True):
        if axis is not None and axis not in size:
            raise ValueError(f"dim_axes entry {axis!r} is not one of {AXES} or None")
        out.append(ceil_div(d, size[axis]) if axis in kept else d)
    return tuple(out)


class GradReduction(NamedTuple):
    """The collectives over fsdp that finish the weight gradients inside the backward While body (one per weight
    per layer; the body is one computation, so the program holds ``count`` of them whatever L is)."""

    op: str  # "all_reduce" (shard_as off: the result stays whole over fsdp) | "reduce_scatter" (on)
    count: int  # one per weight
    operand_elements: int  # per device: each weight's partial gradient [d_in, d_out / tensor], summed
    result_elements: int  # per device: whole (all-reduce) or 1/fsdp of it (reduce-scatter)
    operand_bytes: int
    group_size: int  # fsdp


def grad_reduction(weight_shapes: list[tuple[int, int]], fsdp: int, tensor: int, shard_as: bool,
                   dtype: str = "float32") -> GradReduction:
    """What finishes ``dW = xᵀ·dy`` per layer: the batch (contracted) is split over fsdp, so each device holds a
    partial sum of its ``[d_in, d_out/tensor]`` tile; off: all-reduce over fsdp, on: reduce-scatter over fsdp.

    >>> r = grad_reduction([(128, 512), (512, 128)], fsdp=2, tensor=4, shard_as=False)
    >>> r.op, r.count, r.operand_elements, r.result_elements           # 2 · 128 · 512/4, nothing scattered
    ('all_reduce', 2, 32768, 32768)
    >>> grad_reduction([(128, 512), (512, 128)], fsdp=2, tensor=4, shard_as=True).result_elements  # 1/fsdp kept
    16384
    """
    _check_positive(fsdp=fsdp, tensor=tensor)
    if not weight_shapes:
        raise ValueError("weight_shapes is empty: give at least one (d_in, d_out)")
    if fsdp == 1:
        raise ValueError("fsdp=1: the batch is not split, so no device holds a partial gradient to reduce")
    elems = sum(d_in * ceil_div(d_out, tensor) for d_in, d_out in weight_shapes)  # the tensor split of either dim
    result = elems if not shard_as else sum(ceil_div(d_in, fsdp) * ceil_div(d_out, tensor)
                                            for d_in, d_out in weight_shapes)
    return GradReduction("reduce_scatter" if shard_as else "all_reduce", len(weight_shapes), elems, result,
                         elems * dtype_bytes(dtype), fsdp)


class FlattenedRows(NamedTuple):
    """What ``F.linear``'s reshape ``[b, s, h] -> [b·s, h]`` leaves of ``x[b_fsdp, s_tensor, h]``'s two splits."""

    batch: int
    seq: int
    fsdp: int
    tensor: int
    keeps_both: bool  # each device's (b, s) block is one contiguous run of b·s: batch / fsdp == 1 or tensor == 1
    merged_tiles: int  # tiles the merged b·s dim carries: fsdp·tensor if keeps_both, else only the major dim's fsdp
    rows_per_device: int  # rows of the 2-D dot on one device: b·s / merged_tiles
    einsum_rows_per_device: int  # the 3-D dot (einsum) keeps both splits: b·s / (fsdp·tensor)


def flattened_rows(batch: int, seq: int, fsdp: int, tensor: int) -> FlattenedRows:
    """Rows each device multiplies when ``F.linear`` flattens ``x[b_fsdp, s_tensor, h]`` to a 2-D dot.

    Device (i, j) holds batch rows ``[i·b/fsdp, (i+1)·b/fsdp)`` and sequence positions ``[j·s/tensor,
    (j+1)·s/tensor)``; in the merged index ``i_b·s + i_s`` that block is contiguous only when it spans one batch
    row (b/fsdp = 1) or all of s (tensor = 1). Otherwise a tiling of b·s cannot describe it: the merged dim keeps the
    major (batch) split only, the sequence split is undone (gathered), and each device multiplies tensor times the
    rows.

    >>> flattened_rows(8, 8, fsdp=2, tensor=4).rows_per_device  # 4 batch rows per device: only the batch split
    32
    >>> flattened_rows(2, 8, fsdp=2, tensor=4).rows_per_device  # 1 batch row per device: both splits, 16 / 8
    2
    """
    _check_positive(batch=batch, seq=seq, fsdp=fsdp, tensor=tensor)
    for name, size, axis, n in (("batch", batch, "fsdp", fsdp), ("seq", seq, "tensor", tensor)):
        if size % n:
            raise ValueError(f"{name}={size} is not divisible by {axis}={n} (it is split over {axis})")
    keeps = batch // fsdp == 1 or tensor == 1
    tiles = fsdp * tensor if keeps else fsdp
    return FlattenedRows(batch, seq, fsdp, tensor, keeps, tiles, batch * seq // tiles, batch * seq // (fsdp * tensor))


class SeedCase(NamedTuple):
    """The 405B seed case: one stacked [L, h, h] weight gradient (q_proj / o_proj) on a slice with mesh
    (fsdp, tensor), per chip with 1-D (all-reduced over fsdp) vs 2-D (sharded like the weight) sharding."""

    model: str  # preset name
    topology: str  # slice name
    fsdp: int
    tensor: int
    dtype: str
    total_bytes: int  # the logical [L, h, h] array
    one_d_shape: tuple[int, int, int]  # per chip, all-reduced over fsdp: [L, h/tensor, h]
    two_d_shape: tuple[int, int, int]  # per chip, sharded like the weight: [L, h/tensor, h/fsdp]
    one_d_per_chip_bytes: int
    two_d_per_chip_bytes: int
    hbm_usable_bytes: int  # what the XLA:TPU compiler lets one chip's program use (data/hardware)
    one_d_fraction_of_hbm: float  # one_d_per_chip_bytes / hbm_usable_bytes

    @property
    def one_d_fits(self) -> bool:
        return self.one_d_per_chip_bytes <= self.hbm_usable_bytes

    @property
    def two_d_fits(self) -> bool:
        return self.two_d_per_chip_bytes <= self.hbm_usable_bytes


def seed_case(fsdp: int = 64, tensor: int = 4, dtype: str = "bfloat16", topology: str = SEED_TOPOLOGY,
              model: str = SEED_MODEL) -> SeedCase:
    """Per-chip cost of the seed's stacked gradient with 1-D vs 2-D sharding (the one definition: notebooks 06
    and 07 and the planner use it).

    At the reported mesh (64, 4) the 1-D per-chip array is exactly the HLO's [126, 4K, 16K]:

    >>> c = seed_case(fsdp=64, tensor=4, dtype="bfloat16")
    >>> c.one_d_shape, c.one_d_per_chip_bytes / 2**30, c.two_d_shape, c.two_d_per_chip_bytes / 2**20
    ((126, 4096, 16384), 15.75, (126, 4096, 256), 252.0)
    """
    _check_positive(fsdp=fsdp, tensor=tensor)
    m = model_preset(model)
    chip, chips = hardware.topology(topology)
    if fsdp * tensor != chips:
        raise ValueError(f"mesh fsdp={fsdp} × tensor={tensor} = {fsdp * tensor} does not tile the {chips} chips "
                         f"of {topology}")
    L, h = m.layers, m.hidden
    # stacked_bytes(layers, d_in, d_out): "2d" = [L, d_in/fsdp, d_out/tensor], "1d" = [L, d_in, d_out/tensor]
    one = stacked_bytes(L, h, h, fsdp, tensor, "1d", dtype)
    two = stacked_bytes(L, h, h, fsdp, tensor, "2d", dtype)
    rows = ceil_div(h, tensor)
    hbm = chip.hbm_usable_bytes
    return SeedCase(
        model, topology, fsdp, tensor, dtype, one.total_bytes,
        (L, rows, h), (L, rows, ceil_div(h, fsdp)),
        one.per_device_bytes, two.per_device_bytes, hbm,
        one.per_device_bytes / hbm,
    )


class TraceTransfer(NamedTuple):
    """Host→device bytes one scan forward+backward trace moves when its fake inputs are real tensors."""

    forward_elems: int  # fake carry + one slice of every xs leaf (the layer's weights)
    backward_elems: int  # fake grad-carry + one slice of every saved activation
    replicas: int  # an unsharded .to(device) under SPMD is copied to every device
    total_bytes: int  # (forward + backward) · itemsize · replicas
    transfers: int  # fake inputs made real: carry + 2 weights fwd, grad carry + 5 saved bwd (0 with placeholders)


def block_trace_transfer(batch: int, seq: int, hidden: int, ffn: int, devices: int = 1,
                         dtype: str = "float32", placeholders: bool = True) -> TraceTransfer:
    """Bytes moved host→device per trace of a scanned ``x + gelu(x·W_up)·W_down`` block (forward+backward).

    With placeholders (torch_xla >= 2.6) nothing moves: every term is 0.  Before the fix, ``_scan_impl_flat``
    made each fake input with ``torch.empty(shape).to(device)``:

    * forward scan: carry ``x [b,s,h]`` and one layer ``W_up [h,F]``, ``W_down [F,h]``
    * backward scan: grad carry ``[b,s,h]`` and one slice of each activation AOTAutograd saves for the
      backward: ``x [b,s,h]`` (for dW_up), ``u = x·W_up [b,s,F]`` (for gelu'), ``g = gelu(u) [b,s,F]``
      (for dW_down), ``W_up``, ``W_down`` (for dx)

    i.e. ``3·BSH + 2·BSF + 4·HF`` elements, times ``devices`` because an unsharded ``.to(device)`` under SPMD
    is replicated to every device.

    >>> block_trace_transfer(8, 16, 128, 512, devices=8, placeholders=False).total_bytes  # 442368 · 4 · 8
    14155776
    """
    _check_positive(batch=batch, seq=seq, hidden=hidden, ffn=ffn, devices=devices)
    if not placeholders:
        bsh, bsf, hf = batch * seq * hidden, batch * seq * ffn, hidden * ffn
        fwd = bsh + 2 * hf  # carry x, W_up, W_down
        bwd = bsh + (bsh + 2 * bsf + 2 * hf)  # grad carry; saved x, u, g, W_up, W_down
        count = 3 + 6
    else:
        fwd = bwd = count = 0
    return TraceTransfer(fwd, bwd, devices, (fwd + bwd) * dtype_bytes(dtype) * devices, count)
