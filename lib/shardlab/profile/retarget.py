"""Trace small, compile big: a graph traced on a few CPU devices, compiled for a slice of any size.

Design
------
torch_xla's SPMD trace needs one virtual CPU device per chip (at most ``runtime.MAX_CPU_DEVICES`` = 64 here), but
the pre-partitioning HLO it lowers holds **global** shapes: only the shardings' tile assignments name devices. So a
graph built with the same mesh axis names on a small mesh (e.g. fsdp 2 × tensor 4 on 8 devices) becomes the graph
of the real mesh (fsdp 64 × tensor 4 on 256 chips) by rewriting each sharding, and the TPU compiler partitions
that for the real slice (:func:`shardlab.profile.tpu.compile_tensors` with ``retarget=``).

**The rewrite** (:func:`retarget_sharding`). A mesh is ``numpy.arange(n).reshape(sizes)`` (``runtime.mesh``). Every
tiled sharding torch_xla writes for a mesh is that array with its axes permuted and consecutive axes merged:
``{devices=[T0,T1,...]ids}`` with ``ids = mesh.transpose(perm).reshape(T)`` (a replicated axis lands in the last,
``last_tile_dim_replicate`` dimension). The rewrite finds ``perm`` and the grouping by trying every permutation
(≤ 4! for the suite's meshes) and checking the device list exactly, then writes the same permutation and grouping
of the target mesh: each tile dimension becomes the product of its axes' target sizes. Explicit device lists and
iota lists (``<=[8]``, ``<=[2,4]T(1,0)``) are read; explicit lists are written, as torch_xla writes them.
Every trace-mesh axis must have ≥ 2 devices (an axis of size 1 shards nothing, so the trace cannot show which tensor
dims it splits) unless it has 1 in the target mesh too (then it is inert and dropped).

**What is refused** (:class:`RetargetError`, naming the construct and the rule) — anything whose meaning depends
on the device count beyond the annotations: manual sharding (``{manual}``, ``last_tile_dims={manual}``, and
torch_xla's ``SPMDFullToShardShape`` / ``SPMDShardToFullShape`` custom calls, whose shapes are per device),
single-device placement (``{maximal device=k}``), Pallas kernels (``tpu_custom_call``: the kernel is traced for the
per-device block shapes), any other custom call not known to be mesh-independent, collectives written into the
graph (their replica groups name devices), ``partition-id`` / ``replica-id``, and a tile assignment that is not a
permutation of the trace mesh. ``shard_as`` / ``shard_like`` groups (``{unknown shard_as N}``) and ``{replicated}``
do not depend on the mesh and are kept.

**What cannot be detected here:** a builder whose global shapes depend on the mesh (a batch of ``8 × fsdp``, say).
The caller states the real mesh in the target configuration and traces a configuration that differs only in the
mesh; :func:`same_graph` compares a retargeted trace with a direct trace of the same mesh (both on CPU, seconds),
and the tests compare the two TPU compiles (memory, collectives, program text up to names).

Example::

    >>> retarget_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}", (2, 4), (16, 4))[:40]   # fsdp x tensor, 2-D
    '{devices=[16,4]0,1,2,3,4,5,6,7,8,9,10,11'
    >>> retarget_sharding("{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", (2, 4), (16, 4))[:21]
    '{devices=[4,1,16]0,4,'
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

# Custom calls whose operands and results are global and whose meaning does not involve the device count.
MESH_FREE_CUSTOM_CALLS = frozenset({"Sharding"})
# Custom calls known to depend on the device count, and why (the error quotes it).
MESH_BOUND_CUSTOM_CALLS = {
    "SPMDFullToShardShape": "manual sharding: the result has the per-device shape",
    "SPMDShardToFullShape": "manual sharding: the operand has the per-device shape",
    "tpu_custom_call": "a Pallas kernel: it is traced for per-device block shapes",
}
_TILED_RE = re.compile(r"devices=\[([\d,]+)\]((?:<=\[[\d,]+\](?:T\([\d,]+\))?)|(?:\d+(?:,\d+)*))")
_CUSTOM_CALL_RE = re.compile(r'custom_call_target="([^"]+)"')
_STABLEHLO_CUSTOM_CALL_RE = re.compile(r"stablehlo\.custom_call @([\w.\-]+)")
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "collective-broadcast", "partition-id", "replica-id")
_OP_RE = re.compile(r"=\s*[^=]*?\s(" + "|".join(re.escape(c) for c in _COLLECTIVES) + r")(?:-start)?\(|"
                    r"\b(?:stablehlo|mhlo)\.(" + "|".join(c.replace("-", "_") for c in _COLLECTIVES) + r")\b")


class RetargetError(ValueError):
    """The graph cannot be compiled for another mesh by rewriting its shardings (the message says why)."""


def check_meshes(trace_mesh: Sequence[int], target_mesh: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Both meshes as tuples, checked: the same number of axes, trace axes ≥ 2, target axes ≥ 1."""
    small, big = tuple(trace_mesh), tuple(target_mesh)
    if not small or any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in small + big):
        raise RetargetError(f"trace_mesh={small} and target_mesh={big} must be non-empty tuples of ints")
    if len(small) != len(big):
        raise RetargetError(f"trace_mesh={small} has {len(small)} axes but target_mesh={big} has {len(big)}: trace "
                            "the graph with the same mesh axes, smaller")
    if any(v < 2 and w != 1 for v, w in zip(small, big, strict=True)):
        raise RetargetError(f"trace_mesh={small}: every axis needs >= 2 devices in the trace unless it has 1 in "
                            f"target_mesh={big} too (an axis of size 1 shards nothing, so the trace cannot show "
                            "which dims it splits)")
    if any(v < 1 for v in big):
        raise RetargetError(f"target_mesh={big}: every axis needs >= 1 device")
    return small, big


def expand_tile_assignment(dims: Sequence[int], ids: str) -> np.ndarray:
    """The device array of a tile assignment: explicit ``"0,4,1,5"`` or iota ``"<=[2,4]T(1,0)"``.

    >>> expand_tile_assignment([2, 4], "<=[4,2]T(1,0)").ravel().tolist()
    [0, 2, 4, 6, 1, 3, 5, 7]
    """
    n = math.prod(dims)
    if ids.startswith("<="):
        m = re.fullmatch(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", ids)
        if m is None:
            raise RetargetError(f"iota tile assignment {ids!r} is not <=[dims] or <=[dims]T(perm)")
        reshape = [int(v) for v in m.group(1).split(",")]
        arr = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(2):
            arr = arr.transpose([int(v) for v in m.group(2).split(",")])
    else:
        arr = np.array([int(v) for v in ids.split(",")])
    if arr.size != n:
        raise RetargetError(f"tile assignment [{','.join(map(str, dims))}] has {n} tiles but lists {arr.size} devices")
    return arr.reshape(list(dims))


def _decompose(dims: tuple[int, ...], devices: np.ndarray, small: tuple[int, ...]
               ) -> tuple[tuple[int, ...], list[list[int]]]:
    """(perm, groups): ``devices == mesh.transpose(perm).reshape(dims)`` with each tile dim the product of its group
    of permuted axes (groups index positions of ``perm``; a tile dim of 1 has an empty group)."""
    mesh = np.arange(math.prod(small)).reshape(small)
    for perm in itertools.permutations(range(len(small))):
        groups: list[list[int]] = []
        k = 0
        for d in dims:
            group, size = [], 1
            while size < d and k < len(perm):
                size *= small[perm[k]]
                group.append(k)
                k += 1
            if size != d:
                break
            groups.append(group)
        else:
            if k == len(perm) and np.array_equal(mesh.transpose(perm).reshape(dims), devices):
                return perm, groups
    raise RetargetError(f"tile assignment [{','.join(map(str, dims))}] {devices.ravel().tolist()} is not a "
                        f"permutation of the trace mesh {small} (arange({math.prod(small)}).reshape{small}): "
                        "build the graph's mesh with shardlab.runtime.mesh")


def retarget_sharding(text: str, trace_mesh: Sequence[int], target_mesh: Sequence[int]) -> str:
    """One HLO sharding (or a tuple of them), rewritten from ``trace_mesh`` to ``target_mesh``: see the module note.

    >>> retarget_sharding("{{replicated}, {devices=[2,1,4]<=[8] last_tile_dim_replicate}}", (2, 4), (4, 2))
    '{{replicated}, {devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}}'
    """
    small, big = check_meshes(trace_mesh, target_mesh)
    _refuse_mesh_bound_sharding(text)
    # axes of size 1 in both meshes are inert (they split nothing and do not change the device order): drop them
    small, big = _squeeze(tuple(trace_mesh), tuple(target_mesh))
    target = np.arange(math.prod(big)).reshape(big)

    def one(m: re.Match[str]) -> str:
        dims = tuple(int(v) for v in m.group(1).split(","))
        devices = expand_tile_assignment(dims, m.group(2))
        if devices.size != math.prod(small):
            raise RetargetError(f"sharding {m.group(0)!r} spans {devices.size} devices but the trace mesh {small} has "
                                f"{math.prod(small)}")
        perm, groups = _decompose(dims, devices, small)
        new_dims = [math.prod(big[perm[k]] for k in g) for g in groups]
        ids = target.transpose(perm).reshape(new_dims).ravel()
        return f"devices=[{','.join(map(str, new_dims))}]{','.join(map(str, ids.tolist()))}"

    return _TILED_RE.sub(one, text)


def _squeeze(small: tuple[int, ...], big: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Both meshes without the axes of size 1 in both (inert: they split nothing and keep the device order)."""
    keep = [i for i, (v, w) in enumerate(zip(small, big, strict=True)) if not v == w == 1]
    return tuple(small[i] for i in keep) or (1,), tuple(big[i] for i in keep) or (1,)


def _refuse_mesh_bound_sharding(text: str) -> None:
    if "maximal" in text:
        raise RetargetError(f"sharding {text[:80]!r} places a tensor on one device ({{maximal device=k}}): that "
                            "device's index depends on the mesh")
    if "manual" in text:
        raise RetargetError(f"sharding {text[:80]!r} is manual (a manual region computes on per-device shapes, "
                            "which change with the mesh): trace it at the real mesh")


def check_mesh_independent(hlo_text: str) -> None:
    """Refuse a graph (HLO text, or the StableHLO assembly) that depends on the device count beyond its shardings:
    manual sharding, Pallas kernels, unknown custom calls, collectives and partition ids written into the graph."""
    targets = set(_CUSTOM_CALL_RE.findall(hlo_text)) | set(_STABLEHLO_CUSTOM_CALL_RE.findall(hlo_text))
    for t in sorted(targets):
        if t in MESH_BOUND_CUSTOM_CALLS:
            raise RetargetError(f"the graph has a {t!r} custom call — {MESH_BOUND_CUSTOM_CALLS[t]}: trace it at the "
                                "real mesh (or compile it on a slice the trace can span)")
        if t not in MESH_FREE_CUSTOM_CALLS:
            raise RetargetError(f"the graph has a {t!r} custom call, not known to be mesh-independent (known: "
                                f"{sorted(MESH_FREE_CUSTOM_CALLS)}): trace it at the real mesh")
    for line in hlo_text.splitlines():
        m = _OP_RE.search(line)
        if m:
            raise RetargetError(f"the graph has a {m.group(1) or m.group(2)} before partitioning "
                                f"({line.strip()[:100]!r}): its device groups are written for the trace mesh; trace "
                                "it at the real mesh")
        if "sharding=" in line or "mhlo.sharding" in line:
            _refuse_mesh_bound_sharding(line)


def retarget_module(text: str, trace_mesh: Sequence[int], target_mesh: Sequence[int]) -> str:
    """A whole module's text (HLO or StableHLO assembly) with every tiled sharding rewritten, after
    :func:`check_mesh_independent`."""
    check_meshes(trace_mesh, target_mesh)
    check_mesh_independent(text)
    return retarget_sharding(text, trace_mesh, target_mesh)


_NAME_RE = re.compile(r"%[\w.\-]+")
_META_RE = re.compile(r",?\s*metadata=\{[^}]*\}")


def normalise(hlo_text: str) -> str:
    """HLO text up to instruction names: ``%name`` renamed in order of first appearance, metadata dropped, the
    module name line dropped (it carries the graph hash)."""
    lines = [ln for ln in hlo_text.splitlines() if not ln.startswith("HloModule")]
    text = _META_RE.sub("", "\n".join(lines))
    names: dict[str, str] = {}
    return _NAME_RE.sub(lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def same_graph(retargeted: str, direct: str) -> bool:
    """Do two pre-partitioning modules agree up to instruction names (a retargeted trace vs a direct one)?"""
    return normalise(retargeted) == normalise(direct)


def _collective_rows(comp: Any) -> list[tuple[Any, ...]]:
    """Every logical collective of a compiled program: op, dtype, shapes, bytes, replica groups, operands, form."""
    if comp.module is None:
        return []
    return sorted((c.op, c.dtype, str(c.shape), c.operand_bytes, c.result_bytes, str(c.replica_groups),
                   str(c.source_target_pairs), c.operands, c.form, c.in_while) for c in comp.module.collectives)


def differences(direct: Any, small: Any) -> dict[str, tuple[Any, Any]]:
    """Where a small-trace compile differs from the direct compile (two ``TpuCompile``): ``{what: (direct, small)}``,
    empty when they are the same program — fits, the out-of-memory figures, per-chip memory (arguments, outputs,
    temporaries, aliased, peak), every collective (op, dtype, shapes, bytes, replica groups — hence the mesh axis —
    operands, form) and the program text up to instruction names."""
    out: dict[str, tuple[Any, Any]] = {}
    if direct.fits != small.fits:
        out["fits"] = (direct.fits, small.fits)
    if not direct.fits or not small.fits:
        a, b = direct.oom, small.oom
        for k in ("used", "capacity"):
            if a is not None and b is not None and getattr(a, k, None) != getattr(b, k, None):
                out[f"oom.{k}"] = (getattr(a, k, None), getattr(b, k, None))
        if a is not None and b is not None:  # the largest allocations the compiler lists: sizes and shapes
            x, y = [(u.size, u.shape) for u in a.buffers], [(u.size, u.shape) for u in b.buffers]
            if x != y:
                out["oom.buffers"] = (x[:3], y[:3])
        return out
    for k in ("argument", "output", "temp", "alias", "peak"):
        x, y = getattr(direct.memory, k), getattr(small.memory, k)
        if x != y:
            out[f"memory.{k}"] = (x, y)
    if _collective_rows(direct) != _collective_rows(small):
        out["collectives"] = (len(_collective_rows(direct)), len(_collective_rows(small)))
    if normalise(direct.hlo_text or "") != normalise(small.hlo_text or ""):
        a, b = normalise(direct.hlo_text or "").splitlines(), normalise(small.hlo_text or "").splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        out["program"] = (a[first] if first < len(a) else "<end>", b[first] if first < len(b) else "<end>")
    return out


TRACE_DEVICES = 8  # the suite's default CPU world: a trace mesh fits in it


def trace_mesh(target_mesh: Sequence[int], max_devices: int = TRACE_DEVICES) -> tuple[int, ...]:
    """The smallest trace mesh for ``target_mesh``: each axis its smallest prime factor (1 stays 1), so every tensor
    dim the target mesh divides, the trace mesh divides too.

    >>> trace_mesh((64, 4)), trace_mesh((256,)), trace_mesh((2, 16, 4)), trace_mesh((1, 6))
    ((2, 2), (2,), (2, 2, 2), (1, 2))
    """
    def smallest_factor(n: int) -> int:
        return next((f for f in range(2, n + 1) if n % f == 0), 1)

    small = tuple(smallest_factor(int(n)) for n in target_mesh)
    if math.prod(small) > max_devices:
        raise RetargetError(f"target_mesh={tuple(target_mesh)} needs a trace mesh {small} of {math.prod(small)} "
                            f"devices, more than {max_devices}: use fewer mesh axes")
    return small
