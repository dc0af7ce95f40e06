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

    compute_s = flops_per_chip / bf16_peak
    comm_s    = wire_bytes_per_chip / ici_egress,   ici_egress = ici_bidirectional / 2
    step_s    = max(compute_s, comm_s)      ratio = comm_s / compute_s  (> 1: communication-bound)

The egress assumption (half of the published bidirectional number, all ports busy) is ours, stated so it can
be argued with; the published numbers themselves are not modified.

Example:
    >>> chip, n = topology("v6e-256"); chip.hbm_bytes / 2**30, chip.hbm_usable_bytes / 2**30, n
    (32.0, 31.25, 256)
"""

from __future__ import annotations

import json
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

    @property
    def ici_egress_bytes_per_s(self) -> float:
        """Bytes per second one chip can send (half of the published bidirectional figure)."""
        return self.ici_bandwidth_bytes_per_s / 2


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
    """Resolve "v6e-256" -> (v6e profile, 256 chips); v5p names count TensorCores (v5p-8 = 4 chips)."""
    known = topologies()
    if name not in known:
        raise ValueError(f"unknown topology {name!r}; known: {sorted(known)}")
    c, n = known[name]
    return chip(c), n


class Roofline(NamedTuple):
    compute_s: float  # per-chip FLOPs / peak
    comm_s: float  # per-chip wire bytes / ICI egress
    step_s: float  # max(compute_s, comm_s): perfect overlap
    step_no_overlap_s: float  # compute_s + comm_s: no overlap
    comm_compute_ratio: float  # comm_s / compute_s
    bound: str  # "compute" | "communication"


def roofline(flops_per_chip: float, wire_bytes_per_chip: float, profile: ChipProfile) -> Roofline:
    """Step-time bounds of one chip from its FLOPs and the bytes it sends over ICI."""
    if flops_per_chip <= 0:
        raise ValueError(f"flops_per_chip={flops_per_chip} must be > 0")
    compute = flops_per_chip / profile.bf16_peak_flops_per_s
    comm = wire_bytes_per_chip / profile.ici_egress_bytes_per_s
    return Roofline(
        compute_s=compute,
        comm_s=comm,
        step_s=max(compute, comm),
        step_no_overlap_s=compute + comm,
        comm_compute_ratio=comm / compute,
        bound="communication" if comm > compute else "compute",
    )
