"""A committed store of XLA:TPU compile results, keyed by everything that decides them.

Design
------
Compile-only XLA:TPU is a pure function of its inputs: the libtpu build (and the JAX that drives it), the
pre-partitioning HLO proto torch_xla lowered, the topology and the compile options. Measured: the same inputs
give the same per-chip program text, memory statistics and cost analysis byte for byte in every process and
checkout (the baselines compare them exactly; a torch_xla proto is the same bytes whatever the process traced
before it). The report runs every notebook at its defaults, so it hands the compiler the same few dozen inputs
each time and spends most of its compile seconds recomputing known outputs.

This module keeps those outputs in ``data/tpu_store/<key>.json.xz``, one file per compile:
``key = sha256`` of ``[libtpu, jax, jaxlib versions, sha256(program), topology, the options]``, where the program
is the proto's HLO text with every constant printed. Measured: the protos of notebook 10's ring step and 12's
inspect step (each with a JAX-style ``main.N`` sub-computation) differ between two clones of the same commit while
their text is identical, so the raw bytes are not a key; a proto of plain torch_xla ops is the same bytes in every
process and checkout. The entry holds
the proto itself, the program text (or the out-of-memory message), the memory statistics, the cost analysis and
the seconds the compile took when it was stored. A change anywhere in the library that changes what is compiled
changes the program, misses, and compiles live — the store never stands between the suite and a regression of its
own code; what it skips is asking the pinned compiler again for an answer it already gave. Everything read from
the program (collectives, estimates, verdicts) is still computed from the stored text in the notebook.

Modes (environment ``SHARDLAB_TPU_STORE``, read at each compile):

- ``read`` (the default): serve a stored entry, compile a miss live (not stored);
- ``off``: compile everything live — what the report costs without the store;
- ``write``: compile everything live and store it (``python tools/tpu_store.py refresh`` runs the report so).

A compile worker (``shardlab.profile.tpu_worker``) gets this process's mode and directory with each request
(:func:`settings`), so it compiles as this process would even when the mode changed after it started.

A served result is a cache hit (``TpuCompile.cached``): no compile seconds are counted for it
(``tpu.COMPILES``/``COMPILE_S``, and the record's ``xla.TpuCompileTime``); ``tpu.STORE_HITS`` counts them, and the
report says how many compiles each notebook was served. ``tools/tpu_store.py verify`` recompiles every stored
proto live and compares text, memory and cost exactly; the test suite does it for the cheapest entries.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STORE_DIR = Path(__file__).resolve().parents[3] / "data" / "tpu_store"
ENV = "SHARDLAB_TPU_STORE"
MODES = ("read", "off", "write")
SCHEMA = 1


def store_mode() -> str:
    """The store's mode from ``SHARDLAB_TPU_STORE`` (``read`` when unset); a bad value is refused by name."""
    value = os.environ.get(ENV, "read").strip().lower() or "read"
    if value not in MODES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r} is not one of {', '.join(MODES)}")
    return value


def settings() -> tuple[str, str]:
    """(mode, store directory) of this process: what a compile worker is handed with each request, so it compiles
    as this process would (the mode may change after the worker started)."""
    return store_mode(), str(STORE_DIR)


def apply_settings(mode: str, store_dir: str) -> None:
    """Adopt another process's :func:`settings` (the compile worker's side)."""
    global STORE_DIR
    os.environ[ENV], STORE_DIR = mode, Path(store_dir)


def program_sha256(program: str) -> str:
    return hashlib.sha256(program.encode()).hexdigest()


def key_fields(versions: dict[str, str], program: str, topology: str, options: dict[str, Any]) -> dict[str, Any]:
    """Everything that decides a compile's result, as JSON-able values: ``program`` is the proto's HLO text with
    every constant printed (``options``: disable_passes, debug_options, auto_spmd_mesh, output_shardings, aliases,
    retarget)."""
    return {"schema": SCHEMA, "versions": dict(sorted(versions.items())),
            "program_sha256": program_sha256(program), "topology": topology,
            "options": json.loads(json.dumps(options, sort_keys=True, default=repr))}


def key_of(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@dataclass
class StoredCompile:
    """One stored compile (``text`` None and ``error`` the compiler's message when it ran out of memory)."""

    fields: dict[str, Any]
    proto: bytes
    text: str | None
    error: str | None
    memory: dict[str, Any] | None  # shardlab.profile.tpu_memory.TpuMemory's fields
    cost: dict[str, float]
    compile_s: float
    label: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["proto"] = base64.b64encode(self.proto).decode()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoredCompile:
        return cls(**{**data, "proto": base64.b64decode(data["proto"])})


def path_of(key: str) -> Path:
    return STORE_DIR / f"{key}.json.xz"


def _read(path: Path) -> StoredCompile:
    return StoredCompile.from_json(json.loads(lzma.decompress(path.read_bytes())))


def load_stored(key: str) -> StoredCompile | None:
    """The stored entry under ``key``, or None."""
    path = path_of(key)
    return _read(path) if path.is_file() else None


def save_stored(entry: StoredCompile) -> Path:
    """Write ``entry`` under its key (atomically: several processes store at once during a refresh)."""
    path = path_of(key_of(entry.fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(lzma.compress(json.dumps(entry.to_json(), sort_keys=True).encode(), preset=6))
    tmp.replace(path)
    return path


def stored_compiles() -> list[tuple[str, StoredCompile]]:
    """Every stored entry with its file's key, in key order."""
    return [(p.name.removesuffix(".json.xz"), _read(p)) for p in sorted(STORE_DIR.glob("*.json.xz"))]
