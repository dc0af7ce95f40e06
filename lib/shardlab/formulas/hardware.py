"""TPU chip profiles, slice topologies and a roofline estimate of step time.

Design note
-----------
Chip numbers live in `data/hardware/<chip>.json` (per-chip HBM, bf16 peak FLOP/s, HBM bandwidth,
bidirectional ICI bandwidth, slice names, and the public document each number came from); this module only
loads them — it is the one place every notebook, formula and the planner read a chip fact from. HBM comes
twice: `hbm_bytes` is the capacity as Google publishes it ("32 GB" for v6e, read as GiB) and
`hbm_usable_bytes` the capacity the XLA:TPU compiler lets one chip's program use (v6e: "31.25G"), measured
with a compile-only probe; fits / does-not-fit verdicts use the usable figure. A *topology* is a slice name
such as "v5e-8" or "v6e-256" resolved to (chip, number of chips).

Roofline (all per chip, one training step; a lower bound that assumes perfect overlap):

    compute_s = flops_per_chip / bf16_peak   (+ bubble_s: a pipeline's idle time, bubble_ratio x compute_s)
    comm_s    = wire_bytes_per_chip / ici_egress          (or the caller's sum over collectives, per axis)
    step_s    = max(compute_s + bubble_s, comm_s)      ratio = comm_s / compute_s  (> 1: communication-bound)

**The ICI, per axis** (the JAX scaling book's model). A chip of a d-dimensional torus ("2D torus": v5e, v6e;
"3D torus": v5p, the profiles' ``interconnect``) has 2d ICI links, one each way along every axis; the published
bidirectional figure is the sum over them, so one link carries ``ici_link_bytes_per_s`` = published / 2d in both
directions together. A bidirectional ring along one torus axis sends over two links (one to each neighbour), one
way each: ``ici_egress_for(1)`` = one link's bidirectional figure (v5e 100 GB/s, v6e 200 GB/s). A collective whose
group spans k axes uses k such rings at once: ``ici_egress_for(k)`` = k links. ``ici_egress_bytes_per_s`` — half of
the published figure — is the all-axes case (k = d), the figure this module used for every collective before.
Which axes a group spans follows from where its devices sit: :func:`device_coords` places the devices of a slice
in the order XLA:TPU's compile-only topologies list them (hosts of 2 x 2 chips, checked against libtpu's
``TpuDevice.coords`` by the tests), :func:`group_axes` counts the torus coordinates that vary within a mesh axis's
group. Not modelled: an axis of a slice smaller than the pod has no wraparound link (a line, not a ring), and a
2-chip extent one link — both cost up to 2x more than the ring figure.

Example:
    >>> chip, n = topology("v6e-256"); chip.hbm_bytes / 2**30, chip.hbm_usable_bytes / 2**30, n
    (32.0, 31.25, 256)
"""

from __future__ import annotations

import json
import math
import os
import sys
from functools import cache
from pathlib import Path
from typing import NamedTuple

HARDWARE_DIR = Path(__file__).resolve().parents[3] / "data" / "hardware"  # a checkout (editable install)
# where else the profiles may be: $SHARDLAB_HARDWARE_DIR, or a non-editable install's data files
# (pyproject: [tool.setuptools.data-files] "share/shardlab/hardware" = ["data/hardware/*.json"])
INSTALLED_DIR = Path(sys.prefix) / "share" / "shardlab" / "hardware"


def hardware_dir() -> Path:
    """The first directory holding the chip profiles: $SHARDLAB_HARDWARE_DIR, the checkout, the install."""
    candidates = [Path(os.environ["SHARDLAB_HARDWARE_DIR"])] if os.environ.get("SHARDLAB_HARDWARE_DIR") else []
    candidates += [HARDWARE_DIR, INSTALLED_DIR]
    for d in candidates:
        if d.is_dir() and any(d.glob("*.json")):
            return d
    raise FileNotFoundError(f"TPU hardware profiles (*.json) not found in any of {[str(c) for c in candidates]}; "
                            "set SHARDLAB_HARDWARE_DIR to a copy of the repository's data/hardware")


class ChipProfile(NamedTuple):
    name: str  # "v5e" | "v6e" | "v5p"
    hbm_bytes: int  # per chip, as published (e.g. "32 GB" = 32 GiB)
    hbm_usable_bytes: int  # per chip, what the XLA:TPU compiler lets a program use (e.g. "31.25G")
    hbm_usable_as_reported: str  # the compiler's own words, e.g. "31.25G (G = GiB)"
    hbm_bandwidth_bytes_per_s: float  # per chip
    bf16_peak_flops_per_s: float  # per chip
    ici_bandwidth_bytes_per_s: float  # per chip, bidirectional, as published
    slices: dict[str, int]  # slice name -> chips
    sources: list[dict]  # [{"document", "url", "values"}]
    torus_dims: int = 2  # 2 ("2D torus": v5e, v6e) or 3 ("3D torus": v5p), from the profile's "interconnect"

    @property
    def ici_egress_bytes_per_s(self) -> float:
        """Bytes per second one chip can send over all its links (half of the published bidirectional figure):
        :meth:`ici_egress_for` of every torus axis."""
        return self.ici_bandwidth_bytes_per_s / 2

    @property
    def ici_links_per_chip(self) -> int:
        """ICI links of one chip: one each way along every torus axis (2D torus: 4)."""
        return 2 * self.torus_dims

    @property
    def ici_link_bytes_per_s(self) -> float:
        """One link, both directions together: the published bidirectional figure over the links."""
        return self.ici_bandwidth_bytes_per_s / self.ici_links_per_chip

    def ici_egress_for(self, axes: int) -> float:
        """Bytes per second one chip sends in a bidirectional ring over ``axes`` torus axes (2 links, one way
        each, per axis): ``axes`` x :attr:`ici_link_bytes_per_s`. ``ici_egress_for(torus_dims)`` equals
        :attr:`ici_egress_bytes_per_s`.

        >>> chip("v5e").ici_egress_for(1) / 1e9, chip("v5e").ici_egress_for(2) / 1e9
        (100.0, 200.0)
        """
        if isinstance(axes, bool) or not isinstance(axes, int) or not 1 <= axes <= self.torus_dims:
            raise ValueError(f"axes={axes!r} must be an int in [1, {self.torus_dims}] (the {self.name} torus)")
        return axes * self.ici_link_bytes_per_s


def _torus_dims(interconnect: str) -> int:
    """ "2D torus" -> 2, "3D torus" -> 3 (the published wording of the profiles' ``interconnect``)."""
    head = interconnect.strip().upper().split("D", 1)[0]
    if not head.isdigit():
        raise ValueError(f"interconnect={interconnect!r}: expected '<n>D torus'")
    return int(head)


@cache
def chips() -> dict[str, ChipProfile]:
    """All chip profiles found in data/hardware/, by name."""
    out = {}
    for f in sorted(hardware_dir().glob("*.json")):
        d = json.loads(f.read_text())
        out[d["name"]] = ChipProfile(
            name=d["name"],
            hbm_bytes=int(d["hbm_bytes"]),
            hbm_usable_bytes=int(d["hbm_usable_bytes"]),
            hbm_usable_as_reported=str(d["hbm_usable_as_reported"]),
            hbm_bandwidth_bytes_per_s=float(d["hbm_bandwidth_bytes_per_s"]),
            bf16_peak_flops_per_s=float(d["bf16_peak_flops_per_s"]),
            ici_bandwidth_bytes_per_s=float(d["ici_bandwidth_bytes_per_s"]),
            slices=dict(d["slices"]),
            sources=list(d["sources"]),
            torus_dims=_torus_dims(d.get("interconnect", "2D torus")),
        )
    return out


def chip(name: str) -> ChipProfile:
    known = chips()
    if name not in known:
        raise ValueError(f"unknown chip {name!r}; known: {sorted(known)}")
    return known[name]


def topologies() -> dict[str, tuple[str, int]]:
    """Every slice name -> (chip name, number of chips)."""
    return {s: (c.name, n) for c in chips().values() for s, n in c.slices.items()}


def topology(name: str) -> tuple[ChipProfile, int]:
    """Resolve "v6e-256" -> (v6e profile, 256 chips); v5p names count TensorCores (v5p-8 = 4 chips).

    Takes the suite's slice names only (generation-chips); a user's libtpu-style "v6e:2x4" is converted once at the
    boundary (``shardlab.profile.tpu.parse_slice``)."""
    known = topologies()
    if name not in known:
        form = (" (that is libtpu's generation:shape form; the suite's slice names are generation-chips, e.g. "
                "'v6e-8': convert a user's value with shardlab.profile.tpu.parse_slice)"
                if isinstance(name, str) and ":" in name else "")
        raise ValueError(f"unknown topology {name!r}{form}; known: {sorted(known)}")
    c, n = known[name]
    return chip(c), n


class Roofline(NamedTuple):
    compute_s: float  # per-chip FLOPs / peak
    comm_s: float  # per-chip wire bytes / ICI egress
    step_s: float  # max(compute_s + bubble_s, comm_s): perfect overlap
    step_no_overlap_s: float  # compute_s + bubble_s + comm_s: no overlap
    comm_compute_ratio: float  # comm_s / compute_s
    bound: str  # "compute" | "communication"
    bubble_s: float = 0.0  # a pipeline's idle time: bubble_ratio x compute_s (Narayanan et al.)


def roofline(flops_per_chip: float, wire_bytes_per_chip: float, profile: ChipProfile, *,
             comm_s: float | None = None, bubble_ratio: float = 0.0) -> Roofline:
    """Step-time bounds of one chip from its FLOPs and the bytes it sends over ICI (at the all-axes egress, or
    ``comm_s`` when the caller priced each collective on its own axes: :meth:`ChipProfile.ici_egress_for`);
    ``bubble_ratio``: a pipeline's bubble time over its ideal time, added to the compute time."""
    if flops_per_chip <= 0:
        raise ValueError(f"flops_per_chip={flops_per_chip} must be > 0")
    if bubble_ratio < 0:
        raise ValueError(f"bubble_ratio={bubble_ratio} must be >= 0")
    compute = flops_per_chip / profile.bf16_peak_flops_per_s
    comm = wire_bytes_per_chip / profile.ici_egress_bytes_per_s if comm_s is None else comm_s
    bubble = bubble_ratio * compute
    return Roofline(
        compute_s=compute,
        comm_s=comm,
        step_s=max(compute + bubble, comm),
        step_no_overlap_s=compute + bubble + comm,
        comm_compute_ratio=comm / compute,
        bound="communication" if comm > compute + bubble else "compute",
        bubble_s=bubble,
    )


# ------------------------------------------------------------------------------------------ devices on the torus
HOST_TILE = {2: (2, 2), 3: (2, 2, 1)}  # chips per host along each torus axis (libtpu's default host bounds)


def slice_chips(name: str) -> tuple[ChipProfile, int]:
    """(profile, chips) of a slice: a published slice of data/hardware, or any other count of a generation, read
    the way that generation's published names count (chips for v5e / v6e, TensorCores for v4 / v5p: the ratio of
    every published name's number to its chips) — the compile-only slices too (v5e-2, v5p-2048)."""
    try:
        return topology(name)
    except ValueError:
        gen, _, count = name.rpartition("-") if isinstance(name, str) else ("", "", "")
        profile = chips().get(gen)
        per_chip = {int(s.rpartition("-")[2]) // n for s, n in profile.slices.items()} if profile else set()
        if profile is None or not count.isdigit() or len(per_chip) != 1 or int(count) < (k := per_chip.pop()) \
                or int(count) % k:
            raise
        return profile, int(count) // k


def slice_shape(topology_name: str) -> tuple[int, ...]:
    """The torus extents of a slice: ``"v6e-8"`` -> (2, 4), ``"v6e-256"`` -> (16, 16) — powers of two as even as
    possible, ascending (Google's v5e / v6e slice shapes 1x1, 1x2, 2x2, 2x4 ... 16x16; v5p 2x2x1, 2x2x2, 2x4x4,
    4x4x4, 4x4x8 ...; libtpu names the 8-chip v5e slice by this shape, "v5e:2x4")."""
    profile, n = slice_chips(topology_name)
    if n & (n - 1):
        raise ValueError(f"{topology_name}: {n} chips is not a power of two (no slice shape known)")
    k, d = n.bit_length() - 1, profile.torus_dims
    dims = [2 ** (k // d + (i >= d - k % d)) for i in range(d)]  # e.g. 2**3 over 2 axes -> [2, 4]
    if dims[0] == 1 and d == 3:
        dims = dims[1:] + dims[:1]  # v5p's smallest slice is 2x2x1 (the other shapes ascend: 2x4x4, 4x4x8)
    return tuple(dims)


def device_coords(topology_name: str) -> list[tuple[int, ...]]:
    """Torus coordinates of device 0, 1, ... of a slice (e.g. "v6e-8"), in the order XLA:TPU's compile-only
    topologies list them (the device assignment the suite's TPU compiles use): hosts of 2 x 2 chips, the chips of
    a host x-first, the hosts x-first (v6e-8: (0,0) (1,0) (0,1) (1,1) (0,2) (1,2) (0,3) (1,3)). A 1 x 2 slice is
    one host."""
    shape = slice_shape(topology_name)
    tile = tuple(min(t, e) for t, e in zip(HOST_TILE[len(shape)], shape, strict=True))
    hosts = tuple(e // t for e, t in zip(shape, tile, strict=True))
    out = []
    for i in range(math.prod(shape)):
        host, local = divmod(i, math.prod(tile))
        h_idx, l_idx = _unravel(host, hosts), _unravel(local, tile)
        out.append(tuple(h * t + c for h, t, c in zip(h_idx, tile, l_idx, strict=True)))
    return out


def _unravel(i: int, extents: tuple[int, ...]) -> tuple[int, ...]:
    """Index -> coordinates, the first axis fastest."""
    out = []
    for e in extents:
        i, r = divmod(i, e)
        out.append(r)
    return tuple(out)


def mesh_group(mesh: dict[str, int], axes: tuple[str, ...], device: int = 0) -> list[int]:
    """The devices of ``device``'s group along the mesh ``axes`` (a mesh is ``{axis: size}``, the devices laid
    out row-major, the last axis fastest — ``numpy.arange(n).reshape(sizes)``, as the suite's meshes are)."""
    names, sizes = list(mesh), list(mesh.values())
    unknown = [a for a in axes if a not in mesh]
    if unknown:
        raise ValueError(f"axes {unknown} are not in the mesh {names}")
    idx = list(_unravel(device, tuple(reversed(sizes))))[::-1]  # row-major: the last axis fastest
    group = []
    for flat in range(math.prod(mesh[a] for a in axes)):
        sub = _unravel(flat, tuple(mesh[a] for a in reversed(axes)))[::-1]
        at = dict(zip(axes, sub, strict=True))
        full = [at.get(n, i) for n, i in zip(names, idx, strict=True)]
        group.append(sum(c * math.prod(sizes[j + 1:]) for j, c in enumerate(full)))
    return group


def group_axes(topology_name: str, devices: list[int]) -> int:
    """How many torus axes the devices span (coordinates that vary among them); 0 for one device."""
    coords = device_coords(topology_name)
    return sum(len({coords[d][a] for d in devices}) > 1 for a in range(len(coords[0])))
