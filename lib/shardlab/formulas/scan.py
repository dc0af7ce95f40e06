"""Formulas for scan over layers: stacked-gradient bytes with 1-D vs 2-D sharding, placeholder transfers.

Design note
-----------
scan over L layers keeps every per-layer weight (and its gradient) in one *stacked* array
``W[L, d_in, d_out]``.  On a 2-D mesh (fsdp F, tensor T) the weight is sharded ``W[∅, I_F, J_T]`` (layer axis
replicated, ``d_in`` over fsdp, ``d_out`` over tensor), so one device holds ``L·d_in·d_out / (F·T)`` elements.

The 405B OOM: the per-layer gradient ``dW_l[d_in, d_out]`` leaves the backward body all-reduced over fsdp but
still sharded over tensor — the 1-D sharding ``dW[I, J_T]`` (XLA prints it ``devices=[1,T,F]
last_tile_dim_replicate``).  Written into the stacked gradient it forces the whole ``[L, d_in, d_out]`` array
to that sharding: ``L·d_in·d_out / T`` elements per device, F times the 2-D cost.  ``shard_as(w, dw)`` in
``Scan.backward`` makes the gradient inherit the weight's 2-D sharding and removes the factor F.

Everything here is plain arithmetic on ints: no torch, no XLA.  Functions return NamedTuples with named terms
so a notebook can print each term next to its measured counterpart.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from shardlab.formulas import hardware
from shardlab.formulas.common import ceil_div, dtype_bytes
from shardlab.presets import model_preset

GIB = 1024**3
MIB = 1024**2

Sharding = Literal["1d", "2d", "replicated"]

# The seed case (PyTorch/XLA Llama-3 405B on v6e-256, mesh fsdp 64 × tensor 4): the partitioned HLO showed a
# per-layer gradient f32/bf16[1, 4K, 16K] all-reduced over fsdp and written into a stacked [126, 4K, 16K]
# buffer. HLO shapes after SPMD partitioning are *per device*: the logical weight is [L, h, h] = [126, 16K, 16K]
# (q_proj / o_proj; L and h from the llama-3.1-405b preset) and 4K = 16K / tensor. 1-D keeps only that split.
SEED_MODEL = "llama-3.1-405b"
SEED_TOPOLOGY = "v6e-256"


class StackedBytes(NamedTuple):
    """Per-device bytes of one stacked array ``[layers, d_in, d_out]`` under a sharding."""

    layers: int
    d_in: int
    d_out: int
    dtype: str
    total_bytes: int  # layers · d_in · d_out · itemsize (the whole logical array)
    shards: int  # number of distinct pieces the array is cut into (F·T for 2-D, T for 1-D, 1 replicated)
    replicas: int  # copies of each piece (1 for 2-D, F for 1-D, F·T replicated)
    per_device_bytes: int  # total_bytes / shards (rounded up per dim, as XLA pads uneven tiles)


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

    ``2d``: ``W[∅, I_F, J_T]``; ``1d``: ``W[∅, I, J_T]`` (all-reduced over fsdp, the pre-shard_as gradient);
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
        shards, replicas = fsdp * tensor, 1
        local = layers * ceil_div(d_in, fsdp) * ceil_div(d_out, tensor) * item
    elif sharding == "1d":
        shards, replicas = tensor, fsdp
        local = layers * d_in * ceil_div(d_out, tensor) * item
    elif sharding == "replicated":
        shards, replicas = 1, fsdp * tensor
        local = total
    else:
        raise ValueError(f"sharding={sharding!r} must be one of '2d', '1d', 'replicated'")
    return StackedBytes(layers, d_in, d_out, dtype, total, shards, replicas, local)


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


class SeedCase(NamedTuple):
    """The 405B seed case: one stacked [L, h, h] weight gradient (q_proj / o_proj) on a slice with mesh
    (fsdp, tensor), per chip with 1-D (all-reduced over fsdp) vs 2-D (sharded like the weight) sharding."""

    model: str  # preset name
    topology: str  # slice name
    fsdp: int
    tensor: int
    dtype: str
    total_bytes: int  # the logical [L, h, h] array
    one_d_shape: tuple[int, int, int]  # per chip, all-reduced over fsdp: [L, h/T, h]
    two_d_shape: tuple[int, int, int]  # per chip, sharded like the weight: [L, h/T, h/F]
    one_d_per_chip_bytes: int
    two_d_per_chip_bytes: int
    hbm_usable_bytes: int  # what the XLA:TPU compiler lets one chip's program use (data/hardware)
    one_d_fraction_of_hbm: float  # one_d_per_chip_bytes / hbm_usable_bytes
    two_d_fraction_of_hbm: float

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
    >>> c.one_d_shape, c.one_d_per_chip_bytes / GIB, c.two_d_shape, c.two_d_per_chip_bytes / MIB
    ((126, 4096, 16384), 15.75, (126, 4096, 256), 252.0)
    """
    _check_positive(fsdp=fsdp, tensor=tensor)
    m = model_preset(model)
    chip, chips = hardware.topology(topology)
    if fsdp * tensor != chips:
        raise ValueError(f"mesh fsdp={fsdp} × tensor={tensor} = {fsdp * tensor} does not tile the {chips} chips "
                         f"of {topology}")
    L, h = m.layers, m.hidden
    # stacked_bytes(layers, d_in, d_out): "2d" = [L, d_in/F, d_out/T], "1d" = [L, d_in, d_out/T]
    one = stacked_bytes(L, h, h, fsdp, tensor, "1d", dtype)
    two = stacked_bytes(L, h, h, fsdp, tensor, "2d", dtype)
    rows = ceil_div(h, tensor)
    hbm = chip.hbm_usable_bytes
    return SeedCase(
        model, topology, fsdp, tensor, dtype, one.total_bytes,
        (L, rows, h), (L, rows, ceil_div(h, fsdp)),
        one.per_device_bytes, two.per_device_bytes, hbm,
        one.per_device_bytes / hbm, two.per_device_bytes / hbm,
    )


class TraceTransfer(NamedTuple):
    """Host→device bytes one scan forward+backward trace moves when its fake inputs are real tensors."""

    forward_elems: int  # fake carry + one slice of every xs leaf (the layer's weights)
    backward_elems: int  # fake grad-carry + one slice of every saved activation
    replicas: int  # an unsharded .to(device) under SPMD is copied to every device
    total_bytes: int  # (forward + backward) · itemsize · replicas


def block_trace_transfer(batch: int, seq: int, hidden: int, ffn: int, devices: int = 1,
                         dtype: str = "float32", placeholders: bool = True) -> TraceTransfer:
    """Bytes moved host→device per trace of a scanned ``x + gelu(x·W_up)·W_down`` block (forward+backward).

    With placeholders (torch_xla >= 2.6) nothing moves: every term is 0.  Before the fix, ``_scan_impl_flat``
    made each fake input with ``torch.empty(shape).to(device)``:

    * forward scan: carry ``x [B,S,H]`` and one layer ``W_up [H,F]``, ``W_down [F,H]``
    * backward scan: grad carry ``[B,S,H]`` and one slice of each activation AOTAutograd saves for the
      backward: ``x [B,S,H]`` (for dW_up), ``u = x·W_up [B,S,F]`` (for gelu'), ``g = gelu(u) [B,S,F]``
      (for dW_down), ``W_up``, ``W_down`` (for dx)

    i.e. ``3·BSH + 2·BSF + 4·HF`` elements, times ``devices`` because an unsharded ``.to(device)`` under SPMD
    is replicated to every device.

    >>> block_trace_transfer(8, 16, 128, 512, devices=8, placeholders=False).total_bytes  # 442368 · 4 · 8
    14155776
    """
    _check_positive(batch=batch, seq=seq, hidden=hidden, ffn=ffn, devices=devices)
    if not placeholders:
        bsh, bsf, hf = batch * seq * hidden, batch * seq * ffn, hidden * ffn
        fwd = bsh + 2 * hf
        bwd = bsh + (bsh + 2 * bsf + 2 * hf)
    else:
        fwd = bwd = 0
    return TraceTransfer(fwd, bwd, devices, (fwd + bwd) * dtype_bytes(dtype) * devices)
