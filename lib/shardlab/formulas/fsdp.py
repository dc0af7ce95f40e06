"""FSDP per-step collectives and per-rank memory: flat-parameter units (FSDP1) and per-parameter sharding.

Design note
-----------
One FSDP unit holds a flat parameter of n elements (alignment padding included) padded to
n_pad = N·c, c = ceil(n / N) (see ``shardlab.fsdp.flat_param``). One training step issues::

    forward   all-gather      payload c·e per rank      -> result n_pad·e   (unshard params)
    backward  all-gather      payload c·e per rank      -> result n_pad·e   (params were freed after forward;
                                                                          NOT for the root unit)
    backward  reduce-scatter  payload n_pad·e per rank  -> result c·e       (averaged gradient shard)

PyTorch (FSDP1 and FSDP2 alike) does not reshard the ROOT unit — the outermost one — after forward, since its
parameters would be all-gathered again at once for the backward: the root issues one all-gather per step,
every other unit two. A model wrapped as one unit is the root: one all-gather and one reduce-scatter per step
(``root=True``). The ring-wire figures below are for a non-root unit.

N = the FSDP ranks, e = bytes per element. With N = 1 nothing is sharded and the step issues no collective
(counts 0; the ledger records none and the partitioner emits none). "Payload" is what one rank hands to the collective
(``formulas.common``); the ring model puts (N-1)·c·e on the wire per all-gather and (N-1)/N·n_pad·e per
reduce-scatter, 3·(N-1)·c·e per step in total = the ZeRO-3 "3Ψ" (``formulas.zero.zero_comm``) with Ψ = n_pad.

Per-parameter FSDP (FSDP2 ``fully_shard``, GSPMD ``mark_sharding`` on dim 0): parameter p of shape
(d, *rest) is split with ``torch.chunk`` semantics and padded to c_p = ceil(d/N) rows per rank. One step on
XLA's SPMD partitioner (``shardlab.fsdp.gspmd`` measures it)::

    forward   unshard every parameter            all-gather of the padded shard  c_p·rest·e
    backward  unshard the weights dX reads       same (layers 2..L; layer 1's input is data)
    backward  reduce-scatter every gradient      payload = the full gradient      d·rest·e
              (XLA:CPU: all-reduce + dynamic-slice; its passes never form a reduce-scatter)

except for parameters whose sharded dimension is small: XLA's partitioner replicates a dimension of size d
split over N partitions with a dynamic-update-slice into zeros and an **all-reduce of the full d·rest·e**
when d <= N // 2 (most shards are then padding; ``PartitionedHlo::ReplicatePartial`` in XLA's
``spmd_partitioner.cc``; d == 1 takes its broadcast path — a select of the owning device — also an
all-reduce of the full tensor). Such an
unshard is an all-reduce, not an all-gather, in both graphs. :func:`per_param_step_bytes` predicts every
term; the earlier formula priced those unshards as all-gathers of c_p·rest·e (e.g. 764 vs the HLO's 760 bytes
at N = 4) — the term it got wrong.

The XLA:TPU compiler (libtpu 0.0.21, compile-only) partitions the same graph and then rewrites it; measured
on the per-parameter FSDP step (``device_kind="tpu"``)::

    unshard of a vector (a bias, or any parameter whose only non-1 dimension is the sharded one) whose
              shard is shorter than 128 elements (one TPU vector-register row): an all-reduce of the PADDED
              full vector N·c_p·e (a dynamic-update-slice into zeros), not an all-gather — all-gathering along
              the minor dimension moves less than a row per device, and the all-reduce can be combined with
              others; the d <= N // 2 rule above still gives the unpadded full tensor
    weights read by a matmul (forward, and the backward re-gather for dX) travel in bf16 when the model is
              f32 and the mat-mul precision is torch_xla's "default" (the TPU's bf16 passes): c_p·rest·2
              — unless the matmul is degenerate (a dimension of 1: XLA rewrites it without a dot)
    gradients: the same full f32 gradients, reduced by real reduce-scatters (an ``all-reduce-scatter``
              fusion) where the compiler chooses to, by all-reduce + dynamic-slice elsewhere, and COMBINED:
              one collective instruction carries several gradients (tuple operands)

so the byte totals are predicted per operand, and the instruction counts are not (the combiner decides them).
These rules hold where :func:`tpu_rules_apply` says so (dim-0 sharding, every dimension > 1, weight shards of
at least two rows), tested against the compiler on a grid of layer sizes and world sizes; elsewhere XLA:TPU
makes choices the formula does not model, and the notebook says so instead of comparing.

Persistent per-rank model state after a step with Adam: parameter shard c·e + gradient shard c·e +
optimizer state (exp_avg, exp_avg_sq in fp32) 2·c·4. For fp32 that is 16·c bytes — ZeRO-3's 16Ψ/N with
Ψ = n_pad. Transient: the unsharded padded parameter (n_pad·e) and its gradient (n_pad·e) while a unit runs.
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas.common import ceil_div
from shardlab.formulas.zero import padded_numel


class FlatStepComm(NamedTuple):
    all_gather_count: int
    all_gather_payload_bytes: int  # per call, per rank: the shard
    reduce_scatter_count: int
    reduce_scatter_payload_bytes: int  # per call, per rank: the padded flat gradient
    reduce_scatter_result_bytes: int  # per call, per rank: the gradient shard

    @property
    def all_gather_bytes(self) -> int:
        """Total all-gather payload per rank per step."""
        return self.all_gather_count * self.all_gather_payload_bytes

    @property
    def reduce_scatter_bytes(self) -> int:
        return self.reduce_scatter_count * self.reduce_scatter_payload_bytes

    def wire_bytes(self, world_size: int) -> float:
        """Ring-model bytes sent per rank per step."""
        w = world_size
        return (
            self.all_gather_count * (w - 1) * self.all_gather_payload_bytes
            + self.reduce_scatter_count * (w - 1) / w * self.reduce_scatter_payload_bytes
        )


def flat_numel(numels: list[int] | tuple[int, ...], world_size: int, align: int = 0) -> int:
    """n of a flat unit by hand: the parameter numels in order; with ``align`` > 0 (``use_orig_params``) each
    parameter starts at a multiple of ``align`` elements and the total is padded to a multiple of N.

    >>> flat_numel([1500, 50, 500, 10], 8), flat_numel([1500, 50, 500, 10], 8, align=4)   # 1550 -> 1552, 2062 -> 2064
    (2060, 2064)
    """
    total = 0
    for n in numels:
        if align and total % align:
            total += align - total % align
        total += n
    if align and total % world_size:
        total += world_size - total % world_size
    return total


def flat_step_comm(flat_numel: int, world_size: int, elem_bytes: int = 4, *, root: bool = False) -> FlatStepComm:
    """Collectives of one FULL_SHARD training step of one flat unit (``root``: the outermost unit, kept
    unsharded from forward to backward: one all-gather instead of two).

    >>> flat_step_comm(10, 4).all_gather_payload_bytes, flat_step_comm(10, 4).reduce_scatter_payload_bytes
    (12, 48)
    >>> flat_step_comm(10, 4).all_gather_count, flat_step_comm(10, 4, root=True).all_gather_count
    (2, 1)
    """
    if elem_bytes < 1:
        raise ValueError(f"elem_bytes={elem_bytes} must be >= 1")
    p = padded_numel(flat_numel, world_size)
    c = p // world_size
    # one rank holds everything: nothing to communicate
    n_ag, n_rs = ((1 if root else 2), 1) if world_size > 1 else (0, 0)
    return FlatStepComm(n_ag, c * elem_bytes, n_rs, p * elem_bytes, c * elem_bytes)


class FlatRankMemory(NamedTuple):
    param_shard: int  # bytes, persistent
    grad_shard: int
    optimizer: int
    unsharded_param: int  # transient, while the unit runs
    unsharded_grad: int

    @property
    def persistent(self) -> int:
        return self.param_shard + self.grad_shard + self.optimizer


OPTIMIZER_STATE_BYTES = {"sgd": 0, "adam": 8}
"""fp32 state bytes per element: SGD without momentum keeps none, Adam keeps exp_avg and exp_avg_sq."""


def flat_rank_memory(
    flat_numel: int, world_size: int, elem_bytes: int = 4, optimizer: str = "adam"
) -> FlatRankMemory:
    """Per-rank bytes of a FULL_SHARD flat unit (see the module note)."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r} must be one of {sorted(OPTIMIZER_STATE_BYTES)}")
    p = padded_numel(flat_numel, world_size)
    c = p // world_size
    b = elem_bytes
    return FlatRankMemory(c * b, c * b, c * OPTIMIZER_STATE_BYTES[optimizer], p * b, p * b)


# ---- per-parameter FSDP (FSDP2 fully_shard / GSPMD dim-0 sharding) -----------------------------------------

SHARD_DIMS = ("dim0", "largest")
"""Which dimension a parameter is sharded on: "dim0" (FSDP2 ``fully_shard``) or "largest" (torch_xla's
``SpmdFullyShardedDataParallel``: ``shard_maximal=True``, the first dimension of maximal size)."""


def shard_dim(shape: tuple[int, ...], rule: str = "dim0") -> int:
    if rule not in SHARD_DIMS:
        raise ValueError(f"shard rule={rule!r} must be one of {SHARD_DIMS}")
    if len(shape) == 0:
        raise ValueError("a 0-d parameter cannot be sharded")
    return 0 if rule == "dim0" else list(shape).index(max(shape))


def per_param_shard(
    shape: tuple[int, ...], world_size: int, rank: int, rule: str = "dim0"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local, padded) shard shape: ``torch.chunk`` on the shard dimension, padded to ceil(d/N).

    Same rule in FSDP2 (``fully_shard``) and in GSPMD ``mark_sharding``:
    >>> per_param_shard((10, 3), 4, 3)      # chunks 3,3,3,1 -> rank 3 holds 1 row, padded to 3
    ((1, 3), (3, 3))
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    k = shard_dim(shape, rule)
    d = shape[k]
    c = ceil_div(d, world_size)
    local = max(0, min(c, d - rank * c))
    return shape[:k] + (local,) + shape[k + 1 :], shape[:k] + (c,) + shape[k + 1 :]


DEVICE_KINDS = ("cpu", "tpu")
"""Compilers the per-parameter formula predicts: XLA:CPU (torch_xla's own CPU program) and XLA:TPU (compile-only)."""
MATMUL_PRECISIONS = ("default", "high", "highest")
"""torch_xla's mat-mul precision (``torch_xla.backends.set_mat_mul_precision``); "default" = one bf16 pass on TPU."""


def unshard_form(shape: tuple[int, ...], world_size: int, rule: str = "dim0", device_kind: str = "cpu") -> str:
    """Which collective replicates a parameter of ``shape`` before use (see the module note): "none" (N = 1),
    "all_gather" of its padded shard, "all_reduce" of the full tensor (d <= N // 2) or, on XLA:TPU,
    "all_reduce_padded" of the padded full vector.

    >>> [unshard_form(s, 8, device_kind=k) for s in ((50, 30), (50,), (2, 9)) for k in ("cpu", "tpu")]
    ['all_gather', 'all_gather', 'all_gather', 'all_reduce_padded', 'all_reduce', 'all_reduce']
    """
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device_kind={device_kind!r} must be one of {DEVICE_KINDS}")
    if world_size == 1:
        return "none"
    if unshard_by_all_reduce(shape, world_size, rule):
        return "all_reduce"
    if device_kind == "tpu" and _numel(shape) == shape[shard_dim(shape, rule)] \
            and ceil_div(shape[shard_dim(shape, rule)], world_size) < TPU_LANES:
        return "all_reduce_padded"
    return "all_gather"


TPU_LANES = 128
"""Width of a TPU vector register row: XLA:TPU all-gathers a vector whose shard fills at least one row (measured:
shards of 128 and 256 elements), and all-reduces the padded vector when the shard is shorter (25 ... 64)."""


def tpu_rules_apply(shapes: list[tuple[int, ...]], world_size: int, rule: str = "dim0") -> str | None:
    """None when :func:`per_param_step_bytes` (``device_kind="tpu"``) models XLA:TPU for these parameters, else why
    not. Outside this domain the compiler applies choices the formula does not describe (measured: a one-row
    weight shard all-gathered in f32, a degenerate matmul rewritten without a dot)."""
    if world_size == 1:
        return None
    if rule != "dim0":
        return f"rule={rule!r}: the TPU rules are measured for dim-0 sharding only"
    if any(1 in s for s in shapes):
        return "a dimension of size 1 (a degenerate matmul: XLA rewrites it without a dot)"
    thin = [s for s in shapes if len(s) >= 2 and ceil_div(s[0], world_size) < 2]
    if thin:
        return f"weight(s) {thin} have shards of one row at N = {world_size} (XLA:TPU's element type then varies)"
    return None


def unshard_by_all_reduce(shape: tuple[int, ...], world_size: int, rule: str = "dim0") -> bool:
    """True when XLA replicates this parameter with DUS + all-reduce of the full tensor (d <= N // 2), not an
    all-gather of its padded shard.

    >>> unshard_by_all_reduce((2, 9), 4), unshard_by_all_reduce((3, 9), 4)
    (True, False)
    """
    return world_size > 1 and shape[shard_dim(shape, rule)] <= world_size // 2


class StepBytes(NamedTuple):
    """One per-parameter FSDP step, per device, split the way the HLO shows it (payload = operand bytes)."""

    all_gather_forward: int  # unshards by all-gather: padded shards
    all_gather_backward: int
    reduce_scatter: int  # full gradients (on CPU: the all-reduce of an all-reduce + dynamic-slice pair)
    all_gather_count: int  # forward + backward
    reduce_scatter_count: int
    unshard_all_reduce_forward: int = 0  # unshards by DUS + all-reduce: full tensors of the small parameters
    unshard_all_reduce_backward: int = 0
    unshard_all_reduce_count: int = 0  # forward + backward

    @property
    def total(self) -> int:
        return (self.all_gather_forward + self.all_gather_backward + self.reduce_scatter
                + self.unshard_all_reduce_forward + self.unshard_all_reduce_backward)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unshard_elem_bytes(shape: tuple[int, ...], elem_bytes: int, read_by_matmul: bool, device_kind: str = "cpu",
                       matmul_precision: str = "default") -> int:
    """Bytes per element an unshard of this parameter moves: XLA:TPU all-gathers an f32 weight that a (non-
    degenerate) matmul reads in bf16 at the "default" mat-mul precision; otherwise the parameter's own type."""
    if matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision={matmul_precision!r} must be one of {MATMUL_PRECISIONS}")
    if (device_kind == "tpu" and read_by_matmul and elem_bytes == 4 and matmul_precision == "default"
            and min(shape) > 1):
        return 2
    return elem_bytes


def per_param_step_bytes(
    shapes: list[tuple[int, ...]], world_size: int, backward_needed: list[bool], elem_bytes: int = 4,
    rule: str = "dim0", device_kind: str = "cpu", read_by_matmul: list[bool] | None = None,
    matmul_precision: str = "default",
) -> StepBytes:
    """Formula for one per-parameter FSDP step on ``device_kind``'s compiler (see the module note).

    ``backward_needed[i]``: the backward reads parameter i (a weight whose layer's input needs a gradient).
    ``read_by_matmul[i]``: a matmul reads parameter i (default: every parameter of rank >= 2) — only XLA:TPU's
    element type depends on it. Counts are logical collectives (one per parameter and use): XLA:TPU combines
    several into one instruction, so its instruction counts are smaller.
    Layers 16 -> 9 -> 2 at N = 4 (weights [9, 16], [2, 9]; biases [9], [2]): W2 and b2 have d = 2 <= 4 // 2.
    >>> s = per_param_step_bytes([(9, 16), (9,), (2, 9), (2,)], 4, [False, False, True, False])
    >>> s.all_gather_forward, s.unshard_all_reduce_forward, s.unshard_all_reduce_backward, s.reduce_scatter
    (204, 80, 72, 692)
    >>> t = per_param_step_bytes([(9, 16), (9,), (2, 9), (2,)], 4, [False, False, True, False], device_kind="tpu")
    >>> t.all_gather_forward, t.unshard_all_reduce_forward, t.unshard_all_reduce_backward, t.reduce_scatter
    (96, 92, 36, 692)
    """
    if len(shapes) != len(backward_needed):
        raise ValueError(f"{len(shapes)} shapes but {len(backward_needed)} backward_needed flags")
    if read_by_matmul is None:
        read_by_matmul = [len(s) >= 2 for s in shapes]
    if len(read_by_matmul) != len(shapes):
        raise ValueError(f"{len(shapes)} shapes but {len(read_by_matmul)} read_by_matmul flags")
    if world_size == 1:  # nothing sharded: no gathers, no reduce-scatters (the partitioner emits none)
        return StepBytes(0, 0, 0, 0, 0)
    ag_f = ag_b = ar_f = ar_b = n_ag = n_ar = 0
    for shape, need, mm in zip(shapes, backward_needed, read_by_matmul, strict=True):
        form = unshard_form(shape, world_size, rule, device_kind)
        e = unshard_elem_bytes(shape, elem_bytes, mm, device_kind, matmul_precision)
        if form == "all_gather":
            shard = _numel(per_param_shard(shape, world_size, 0, rule)[1]) * e
            ag_f, ag_b, n_ag = ag_f + shard, ag_b + shard * need, n_ag + 1 + need
        else:
            padded = _numel(per_param_shard(shape, world_size, 0, rule)[1]) * world_size  # N·c_p·rest
            full = (_numel(shape) if form == "all_reduce" else padded) * e
            ar_f, ar_b, n_ar = ar_f + full, ar_b + full * need, n_ar + 1 + need
    rs = sum(_numel(s) * elem_bytes for s in shapes)
    return StepBytes(ag_f, ag_b, rs, n_ag, len(shapes), ar_f, ar_b, n_ar)
