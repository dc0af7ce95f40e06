"""Sharding strings: how XLA writes down which device holds which block of a tensor.

Design
------
``mark_sharding(t, mesh, spec)`` splits a tensor into a grid of blocks (XLA calls them *tiles*) and gives
each tile to one or more devices. XLA prints the result as a string, e.g. for a 2-D tensor on a
``(data 2, model 4)`` mesh with spec ``(None, "model")``::

    {devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}
             ^^^^^^^ ^^^^^^^^^^^^^^^ ^^^^^^^^^^^^^^^^^^^^^^^
             tiles   device order    the last count is copies, not a tensor dim

- **tile assignment dims** ``[1,4,2]``: one count per tensor dim — how many blocks that dim is cut into
  (1: not split). Here rows are not split, columns are cut in 4.
- ``last_tile_dim_replicate``: the assignment has one extra, *last* dim — how many devices hold a copy of
  each tile (the mesh axes the spec does not name). Here every column block lives on 2 devices. Without the
  flag there is no extra dim: every tile lives on exactly one device. ``{replicated}``: one tile, on every
  device.
- **device order** ``0,4,1,5,...``: the devices of the assignment array, flattened row-major. Reshaped to
  ``[1,4,2]`` it reads: tile (0, 0) on devices 0 and 4, tile (0, 1) on 1 and 5, tile (0, 2) on 2 and 6, tile
  (0, 3) on 3 and 7. It is the mesh's device-id array with its axes put in the spec's order (the axes naming
  tensor dims first, dim by dim, then the unnamed axes as copies) and flattened.

:func:`sharding_string` predicts the string torch_xla prints (the notebooks check it against torch_xla);
:func:`tile_devices` reads one back into an array of device ids per tile. Both are pure (no XLA).

Example::

    >>> sharding_string((2, 4), ("data", "model"), (None, "model"))
    '{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}'
    >>> sharding_string((2, 4), ("data", "model"), ("data", "model"))
    '{devices=[2,4]0,1,2,3,4,5,6,7}'
    >>> tile_devices('{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}', 2)[0, 1].tolist()
    [1, 5]
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from shardlab.formulas.common import ceil_div

Spec = Sequence[str | tuple[str, ...] | None]  # one entry per tensor dim: a mesh axis, a tuple of axes, or None
_STRING = re.compile(r"^\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}$")


class Tiles(NamedTuple):
    """A sharding, decoded: ``devices[i, j, ..., c]`` = the c-th device holding tile (i, j, ...)."""

    tiles: tuple[int, ...]  # blocks per tensor dim
    copies: int  # devices per tile (the last_tile_dim_replicate count; 1 without it)
    devices: np.ndarray  # int array of shape (*tiles, copies)


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def tiles(mesh_shape: Sequence[int], axis_names: Sequence[str], spec: Spec,
          device_ids: Sequence[int] | None = None) -> Tiles:
    """Which devices hold which block when a tensor is annotated with ``spec`` on a mesh.

    ``device_ids``: the mesh's devices in row-major order (default ``0 .. n-1``, as ``runtime.mesh`` builds it).
    """
    shape, names = tuple(mesh_shape), tuple(axis_names)
    if len(shape) != len(names):
        raise ValueError(f"mesh_shape={shape} has {len(shape)} axes but axis_names={names} has {len(names)}")
    ids = np.arange(math.prod(shape)) if device_ids is None else np.asarray(device_ids)
    if ids.size != math.prod(shape):
        raise ValueError(f"device_ids has {ids.size} entries but mesh_shape={shape} holds {math.prod(shape)}")
    ids = ids.reshape(shape)
    used: list[str] = []
    for entry in spec:
        for a in _axes(entry):
            if a not in names:
                raise ValueError(f"spec={tuple(spec)} names mesh axis {a!r}, which is not in axis_names={names}")
            if a in used:
                raise ValueError(f"spec={tuple(spec)} uses mesh axis {a!r} twice")
            used.append(a)
    size = dict(zip(names, shape, strict=True))
    counts = tuple(math.prod(size[a] for a in _axes(e)) for e in spec)  # blocks per tensor dim
    rest = [a for a in names if a not in used]
    copies = math.prod(size[a] for a in rest)
    order = [names.index(a) for a in used + rest]  # spec's axes first (dim by dim), then the copies
    devices = ids.transpose(order).reshape(*counts, copies)
    return Tiles(counts, copies, devices)


def sharding_string(mesh_shape: Sequence[int], axis_names: Sequence[str], spec: Spec,
                    device_ids: Sequence[int] | None = None) -> str:
    """The string torch_xla prints (``_get_xla_sharding_spec``) for a tensor annotated with ``spec``.

    ``{replicated}`` when no dim is split; ``last_tile_dim_replicate`` when each tile has more than one copy.

    >>> sharding_string((2, 2, 2), ("a", "b", "c"), ("c", "a"))
    '{devices=[2,2,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}'
    >>> sharding_string((2, 4), ("a", "b"), (None, None))
    '{replicated}'
    """
    t = tiles(mesh_shape, axis_names, spec, device_ids)
    if math.prod(t.tiles) == 1:
        return "{replicated}"
    order = ",".join(str(int(d)) for d in t.devices.reshape(-1))
    if t.copies == 1:
        return f"{{devices=[{','.join(map(str, t.tiles))}]{order}}}"
    return f"{{devices=[{','.join(map(str, (*t.tiles, t.copies)))}]{order} last_tile_dim_replicate}}"


def tile_devices(sharding: str, rank: int, num_devices: int | None = None) -> np.ndarray:
    """Device ids per tile, shape ``(*tiles, copies)``, read from a sharding string of a rank-``rank`` tensor.

    ``{replicated}`` needs ``num_devices`` (one tile held by every device).
    """
    if sharding.strip() == "{replicated}":
        if num_devices is None:
            raise ValueError("'{replicated}' names no devices: pass num_devices")
        return np.arange(num_devices).reshape(*(1,) * rank, num_devices)
    m = _STRING.match(sharding.strip())
    if m is None:
        raise ValueError(f"sharding={sharding!r} is not of the form '{{devices=[t0,t1,...]d0,d1,...[ "
                         "last_tile_dim_replicate]}' or '{replicated}'")
    dims = [int(d) for d in m.group(1).split(",")]
    ids = np.array([int(d) for d in m.group(2).split(",")])
    if not m.group(3):
        dims.append(1)
    if len(dims) != rank + 1:
        raise ValueError(f"sharding={sharding!r} has {len(dims) - 1} tile dims but the tensor has rank={rank}")
    if ids.size != math.prod(dims):
        raise ValueError(f"sharding={sharding!r} lists {ids.size} devices for {math.prod(dims)} tile slots")
    return ids.reshape(dims)


def owners(shape: Sequence[int], devices: np.ndarray) -> list[Any]:
    """For a 2-D tensor of ``shape``, each element's devices (a tuple) from ``tile_devices``'s array.

    Uneven dims follow XLA's rule: each tile has ceil(size / tiles) elements, the last one fewer.
    """
    if len(shape) != 2 or devices.ndim != 3:
        raise ValueError(f"owners() draws 2-D tensors: shape={tuple(shape)}, devices of rank {devices.ndim - 1}")
    (rows, cols), (tr, tc) = shape, devices.shape[:2]
    br, bc = ceil_div(rows, tr), ceil_div(cols, tc)
    return [[tuple(int(d) for d in devices[r // br, c // bc]) for c in range(cols)] for r in range(rows)]


def group_axes(groups: Sequence[Sequence[int]], mesh_shape: Sequence[int], axis_names: Sequence[str]) -> str:
    """The mesh axes a collective's replica groups run over: the groups are the lines of the device-id array
    along those axes. ``"+"``-joined names; ``"?"`` when the groups match no set of axes (or there are none).

    >>> group_axes([[0, 4], [1, 5], [2, 6], [3, 7]], (2, 4), ("X", "Y"))
    'X'
    >>> group_axes([[0, 1, 2, 3], [4, 5, 6, 7]], (2, 4), ("X", "Y"))
    'Y'
    """
    shape, names = tuple(mesh_shape), tuple(axis_names)
    ids = np.arange(math.prod(shape)).reshape(shape)
    want = {frozenset(int(d) for d in g) for g in groups}
    if not want:
        return "?"
    for r in range(1, len(names) + 1):
        for axes in itertools.combinations(range(len(names)), r):
            rest = [a for a in range(len(names)) if a not in axes]
            lines = ids.transpose(rest + list(axes)).reshape(-1, math.prod(shape[a] for a in axes))
            if {frozenset(int(d) for d in line) for line in lines} == want:
                return "+".join(names[a] for a in axes)
    return "?"
