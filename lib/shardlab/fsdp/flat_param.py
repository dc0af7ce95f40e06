"""Flat-parameter shard math, exactly as PyTorch FSDP1's ``FlatParamHandle`` does it — no process group.

Design note
-----------
FSDP1 concatenates every parameter of a wrapped module into ONE 1-D ``FlatParameter`` and gives each rank a
contiguous slice of it. Everything about that slice is integer arithmetic on the parameter numels, so it
lives here as pure functions returning named tuples, testable against PyTorch's own
``FlatParamHandle`` (tests/test_fsdp_flat_param.py builds one per rank on a fake process group).

Layout of the unsharded flat parameter (``torch/distributed/fsdp/_flat_param.py``,
``_init_flat_param_and_metadata``)::

    [p0][pad][p1][pad][p2] ... [p_last][pad to a multiple of N]
         ^ alignment padding (only with align > 0, i.e. use_orig_params=True), filled with
           FLAT_PARAM_PADDING_VALUE; before a parameter when the running total is not a multiple of
           ``align`` (= 16 bytes / element size, an Inductor constraint); the final pad makes the total a
           multiple of the world size N so the reduce-scatter needs no copy.

Sharding (``_get_unpadded_shard``) uses ``torch.chunk`` on the flat numel n over N ranks::

    c = ceil(n / N)                     # chunk size = every rank's shard numel after padding
    rank r holds [r*c, min((r+1)*c, n))  # empty when r*c >= n: chunk() may return fewer than N chunks
    then each shard is zero-padded to c  # n=10, N=4 -> 3,3,3,1+2 pad;  n=6, N=4 -> 2,2,2,0+2 pad

Shard metadata (``_get_shard_metadata``): for each parameter overlapping rank r's index range
[r*c, (r+1)*c - 1] (inclusive, padding included) one ``ShardParamInfo``
``(param_index, offset_in_shard, numel_in_shard, intra_start, intra_end)`` with ``intra_end`` INCLUSIVE.

Example::

    >>> plan = plan_flat_shards([6, 4], world_size=4)     # n = 6 + 4 = 10, c = ceil(10/4) = 3
    >>> [r.numel_padded for r in plan.ranks]
    [0, 0, 0, 2]
    >>> plan.ranks[1].params    # rank 1 holds flat [3, 5]: p0[3..5]
    (ShardParamInfo(param_index=0, offset_in_shard=0, numel_in_shard=3, intra_start=3, intra_end=5),)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from shardlab.formulas.common import ceil_div

FLAT_PARAM_PADDING_VALUE = 42
"""Fill value of alignment padding (PyTorch's ``_FLAT_PARAM_PADDING_VALUE``): a recognisable non-zero so a
bug that reads padding as data shows up. Shard padding (to the chunk size) is zeros, as in PyTorch."""

ALIGNMENT_BYTES = 16
"""Byte alignment of each parameter's start with ``use_orig_params=True`` (PyTorch ``_get_aligned_numel``)."""


class Segment(NamedTuple):
    """One piece of the unsharded flat parameter: a parameter or an alignment padding run."""

    kind: str  # "param" | "align_pad"
    param_index: int | None  # index into the (deduplicated) parameter list, None for padding
    start: int  # first flat index
    numel: int


class ShardParamInfo(NamedTuple):
    """One parameter's piece in one rank's shard (PyTorch ``_ShardParamInfo`` with ``in_shard=True``)."""

    param_index: int
    offset_in_shard: int  # where the piece starts inside the rank's shard
    numel_in_shard: int
    intra_start: int  # first element of the parameter (flattened) held by this rank
    intra_end: int  # last element held, INCLUSIVE


class RankShard(NamedTuple):
    rank: int
    start: int  # first index into the padded unsharded flat parameter
    end: int  # last index, INCLUSIVE (= start + shard_numel - 1)
    numel_unpadded: int  # real elements (params + alignment padding) in this shard
    numel_padded: int  # zeros appended to reach shard_numel
    params: tuple[ShardParamInfo, ...]


class FlatShardPlan(NamedTuple):
    numels: tuple[int, ...]  # per (deduplicated) parameter
    world_size: int
    align: int  # alignment in elements (0 = off)
    segments: tuple[Segment, ...]  # unsharded flat layout, padding included
    flat_numel: int  # n: params + alignment padding (PyTorch's unpadded unsharded numel)
    shard_numel: int  # c = ceil(n / N)
    padded_numel: int  # n_pad = N·c: what the all-gather produces
    ranks: tuple[RankShard, ...]

    @property
    def param_numel(self) -> int:
        return sum(self.numels)

    @property
    def align_padding_numel(self) -> int:
        return self.flat_numel - self.param_numel

    @property
    def shard_padding_numel(self) -> int:
        return self.padded_numel - self.flat_numel

    @property
    def padding_numel(self) -> int:
        """All elements moved and stored that are not parameters: padded_numel - sum(numels)."""
        return self.padded_numel - self.param_numel


def aligned_numel(dtype: torch.dtype) -> int:
    """Elements per ALIGNMENT_BYTES: float32 -> 4, bfloat16 -> 8 (PyTorch ``_get_aligned_numel``)."""
    size = torch.empty((), dtype=dtype).element_size()
    return ALIGNMENT_BYTES // size


def _check_ints(numels: list[int] | tuple[int, ...], world_size: int, align: int) -> tuple[int, ...]:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer >= 1")
    if isinstance(align, bool) or not isinstance(align, int) or align < 0:
        raise ValueError(f"align={align!r} must be an integer >= 0 (elements; 0 = no alignment)")
    numels = tuple(numels)
    if len(numels) == 0:
        raise ValueError("numels=[] is empty: a flat parameter needs at least one parameter")
    for i, n in enumerate(numels):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"numels[{i}]={n!r} must be an integer >= 0")
    if sum(numels) == 0:
        raise ValueError(f"numels={list(numels)} hold no elements: nothing to shard")
    return numels


def flat_layout(numels: list[int] | tuple[int, ...], world_size: int, align: int = 0) -> tuple[Segment, ...]:
    """Unsharded flat layout with alignment padding (PyTorch ``_init_flat_param_and_metadata``)."""
    numels = _check_ints(numels, world_size, align)
    segments: list[Segment] = []
    total = 0
    for i, n in enumerate(numels):
        if align > 0:
            to_pad = align - (total % align)
            if 0 < to_pad < align:
                segments.append(Segment("align_pad", None, total, to_pad))
                total += to_pad
        segments.append(Segment("param", i, total, n))
        total += n
    if align > 0:  # pad to a multiple of the world size so the reduce-scatter input needs no copy
        to_pad = world_size - (total % world_size)
        if 0 < to_pad < world_size:
            segments.append(Segment("align_pad", None, total, to_pad))
            total += to_pad
    return tuple(segments)


def chunk_bounds(flat_numel: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """``torch.chunk`` semantics: (start, real numel, zero padding) of ``rank``'s shard.

    >>> [chunk_bounds(6, 4, r) for r in range(4)]   # c = 2; chunk() returns only 3 chunks
    [(0, 2, 0), (2, 2, 0), (4, 2, 0), (6, 0, 2)]
    """
    if flat_numel < 1:
        raise ValueError(f"flat_numel={flat_numel} must be >= 1")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    c = ceil_div(flat_numel, world_size)
    start = rank * c
    real = max(0, min(c, flat_numel - start))
    return start, real, c - real


def _shard_metadata(segments: tuple[Segment, ...], start: int, end: int) -> tuple[ShardParamInfo, ...]:
    """PyTorch ``_get_shard_metadata`` restricted to parameters that overlap [start, end] (inclusive)."""
    shard_numel = end - start + 1
    infos: list[ShardParamInfo] = []
    for seg in segments:
        if seg.kind != "param":
            continue
        p_start, p_end = seg.start, seg.start + seg.numel - 1  # inclusive
        if not (start <= p_end and end >= p_start):
            continue
        if start <= p_start:
            intra_start, offset = 0, p_start - start
        else:
            intra_start, offset = start - p_start, 0
        assert 0 <= offset < shard_numel
        intra_end = min(p_end, end) - p_start
        numel = intra_end - intra_start + 1
        infos.append(ShardParamInfo(seg.param_index, offset, numel, intra_start, intra_end))
    return tuple(infos)


def plan_flat_shards(numels: list[int] | tuple[int, ...], world_size: int, align: int = 0) -> FlatShardPlan:
    """Shard plan for parameters of the given numels (registration order, shared ones listed once)."""
    segments = flat_layout(numels, world_size, align)
    numels = tuple(numels)
    flat_numel = segments[-1].start + segments[-1].numel
    c = ceil_div(flat_numel, world_size)
    ranks = []
    for r in range(world_size):
        _, real, pad = chunk_bounds(flat_numel, world_size, r)
        start, end = r * c, (r + 1) * c - 1  # PyTorch indexes the shard range padding included
        ranks.append(RankShard(r, start, end, real, pad, _shard_metadata(segments, start, end)))
    return FlatShardPlan(numels, world_size, align, segments, flat_numel, c, c * world_size, tuple(ranks))


def owned_modules(module: torch.nn.Module, ignored: tuple[torch.nn.Module, ...] = ()) -> list[torch.nn.Module]:
    """``module`` and its submodules in ``named_modules`` order, skipping the subtrees of ``ignored`` (the
    submodules an inner FSDP unit wraps: their parameters belong to that unit)."""
    return [mod for _, mod in _owned(module, ignored)]


def _owned(module: torch.nn.Module, ignored: tuple[torch.nn.Module, ...]) -> list[tuple[str, torch.nn.Module]]:
    out: list[tuple[str, torch.nn.Module]] = []
    skip = [f"{name}." for name, mod in module.named_modules(remove_duplicate=False)
            if any(mod is m for m in ignored) and name]
    for name, mod in module.named_modules(remove_duplicate=False):
        if any(mod is m for m in ignored) or any(name.startswith(prefix) for prefix in skip):
            continue
        out.append((name, mod))
    return out


def module_params(
    module: torch.nn.Module, ignored: tuple[torch.nn.Module, ...] = ()
) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters in FlatParamHandle's order: ``named_modules`` then each module's own params, shared once;
    the subtrees of ``ignored`` (inner units) are left out."""
    seen: set[int] = set()
    out: list[tuple[str, torch.nn.Parameter]] = []
    for mod_name, mod in _owned(module, ignored):
        for p_name, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            out.append((f"{mod_name}.{p_name}" if mod_name else p_name, p))
    if not out:
        raise ValueError(f"module {type(module).__name__} has no parameters: nothing to flatten")
    dtypes = {p.dtype for _, p in out}
    for name, p in out:
        if not p.dtype.is_floating_point:
            raise TypeError(f"parameter {name!r} has dtype {p.dtype}: FSDP flattens float params only")
    if len(dtypes) != 1:
        raise TypeError(f"parameters mix dtypes {sorted(map(str, dtypes))}: a flat parameter has one dtype")
    return out


def plan_flat_shards_for(
    module: torch.nn.Module, world_size: int, use_orig_params: bool = False, ignored: tuple[torch.nn.Module, ...] = ()
) -> FlatShardPlan:
    """Plan for ``module``'s parameters (outside ``ignored``'s subtrees); ``use_orig_params=True`` aligns them
    like PyTorch (16 bytes)."""
    params = module_params(module, ignored)
    align = aligned_numel(params[0][1].dtype) if use_orig_params else 0
    return plan_flat_shards([p.numel() for _, p in params], world_size, align)
