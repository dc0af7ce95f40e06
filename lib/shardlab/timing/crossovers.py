"""The crossover table: per mesh axis (fsdp, tensor, context, expert) and TPU generation, the swept size from which
on a one-axis step is compute-bound, by the formula and by the compiled XLA:TPU program, beside the scaling book's
critical value.

Design
------
Each axis has one program (:mod:`shardlab.timing.programs`) and one swept size (:data:`AXES`): the MLP block under
FSDP (tokens per chip) and tensor parallelism (its inner width f), the attention core under context parallelism
(sequence positions per chip) and the GShard MoE layer under expert parallelism (the experts' inner width f: the
all-to-all bytes and the expert FLOPs both grow with the tokens, so their ratio does not). Every point is compiled
for an 8-chip slice of each generation (:data:`SLICES`) and priced by :func:`shardlab.timing.sweep.price`; the
crossing is :func:`shardlab.timing.sweep.measured_crossover` — the first swept size from which on wire time ≤
compute time — for every axis alike, the formula's from its own two columns, the compiler's from the program's.

Compiling all of it takes minutes, so ``tools/crossovers.py`` does it once and stores :data:`CACHE_FILE` (with the
libtpu version, the settings and the command); notebook 13 reads it (:func:`load`, :func:`points`) and compiles
nothing at its defaults.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from shardlab.timing import sweep as S
from shardlab.timing.programs import AttentionStep, MlpStep, MoeStep

CACHE_FILE = Path(__file__).resolve().parents[3] / "data" / "time" / "crossovers.json"
SLICES = {"v5e": "v5e-8", "v5p": "v5p-16", "v6e": "v6e-8"}  # 8 chips each (v5p names TensorCores, 2 per chip)
AXES: dict[str, tuple[MlpStep | AttentionStep | MoeStep, str, tuple[int, ...]]] = {
    "fsdp": (MlpStep(axis="fsdp", devices=8, hidden=2048, ffn=8192), "tokens", (256, 512, 1024, 2048, 4096)),
    "tensor": (MlpStep(axis="tensor", devices=8, hidden=2048, tokens=1024), "ffn", (2048, 4096, 8192, 16384, 32768)),
    "context": (AttentionStep(devices=8, batch=1, heads=8, kv_heads=8, head_dim=128), "seq",
                (32, 64, 128, 256, 512, 1024, 2048)),
    "expert": (MoeStep(devices=8, tokens=1024, hidden=1024, experts=8, top_k=2, capacity_factor=1.25), "ffn",
               (128, 256, 512, 1024, 2048, 4096)),
}
POINT_FIELDS = ("compute_s", "comm_s", "exposed_s", "step_s", "formula_compute_s", "formula_comm_s", "collectives",
                "flops", "wire_bytes")


def row(axis: str, generation: str, pts: list[S.TimingPoint]) -> dict[str, Any]:
    """One (axis, generation) entry of the cache: the swept points and both crossings."""
    base, field, _ = AXES[axis]
    topology = SLICES[generation]
    return {"axis": axis, "generation": generation, "topology": topology, "field": field,
            "config": {k: v for k, v in asdict(base).items() if k != field},
            "critical": S.critical(base, topology), "egress_bytes_per_s": S.egress(topology),
            "crossover": {src: S.measured_crossover(pts, field, src) for src in ("formula", "tpu")},
            "points": [{field: getattr(q.cfg, field), "formula_flops": q.cfg.flops_per_chip,
                        "formula_wire_bytes": q.cfg.wire_bytes,
                        **{k: getattr(q, k) for k in POINT_FIELDS}} for q in pts]}


def measure(axis: str, generation: str, values: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Compile and price ``axis``'s sweep on ``generation``'s 8-chip slice (``values``: the swept sizes; default
    :data:`AXES`')."""
    base, field, default = AXES[axis]
    return row(axis, generation, S.sweep(base, SLICES[generation], tuple(values or default), field))


def points(entry: dict[str, Any]) -> list[S.TimingPoint]:
    """A cached entry's points as :class:`~shardlab.timing.sweep.TimingPoint` (the config rebuilt from the entry)."""
    base, field, _ = AXES[entry["axis"]]
    return [S.TimingPoint(replace(base, **{field: pt[field]}), entry["topology"],
                          **{k: pt[k] for k in POINT_FIELDS}) for pt in entry["points"]]


def load(path: Path = CACHE_FILE) -> dict[str, Any]:
    """The cache: ``{"_source": {...}, "<axis>.<generation>": entry, ...}``."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no crossover cache; make it with `nice -n 10 python tools/crossovers.py`")
    return json.loads(path.read_text())


def table(cache: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (axis, generation): the book's critical value, the swept crossings, the exposed communication
    at the compiler's crossing."""
    out = []
    for key, e in cache.items():
        if key.startswith("_"):
            continue
        pts = {pt[e["field"]]: pt for pt in e["points"]}
        at = pts.get(e["crossover"]["tpu"])
        last = e["points"][-1]["collectives"]
        out.append({"axis": e["axis"], "generation": e["generation"], "slice": e["topology"], "swept": e["field"],
                    "book critical": round(e["critical"]), "formula crossing": e["crossover"]["formula"],
                    "compiler crossing": e["crossover"]["tpu"],
                    "exposed / step at compiler crossing": at["exposed_s"] / at["step_s"] if at else None,
                    "collectives (largest size)": ", ".join(f"{c} {op}" for op, c in sorted(last.items()))})
    return out
