"""Device world setup: one call before anything touches torch_xla.

Design
------
torch_xla reads ``PJRT_DEVICE``, ``CPU_NUM_DEVICES`` and ``XLA_FLAGS`` once, when the first device is used,
and SPMD mode must be switched on before any XLA tensor exists. A process (or notebook kernel) therefore
holds exactly one *device world*. ``setup()`` is the only place that sets those variables: it

1. validates the request (``num_devices`` within what the host allows) before any XLA work,
2. sets the environment (CPU virtual devices by default, TPU when present or asked for),
3. points ``--xla_dump_to`` at a per-process temporary directory so ``shardlab.profile`` can read the
   post-partitioning HLO of every compiled ``SyncTensorsGraph`` module (the "compiler" view),
4. imports torch_xla, calls ``use_spmd()`` (and keeps torch's CPU ops on one thread unless ``OMP_NUM_THREADS`` is
   set: the suite's CPU tensors are tiny) and returns a small :class:`World` description.

A second call with the same request returns the same world; a different device count raises an error that
tells the user to restart the kernel (changing it later has no effect in torch_xla).

Call it first, before any autograd work: the autograd engine sizes its per-device ready queues at the first
backward of a process, so a CPU ``.backward()`` run before torch_xla registered its device makes every later
XLA backward fail with "device_ready_queues_ ... INTERNAL ASSERT FAILED" (torch / torch_xla 2.9.0).
``tests/conftest.py`` therefore sets the world up at session start.

Example::

    >>> from shardlab import runtime
    >>> world = runtime.setup(num_devices=8)
    >>> world.kind, world.num_devices
    ('cpu', 8)
    >>> mesh = runtime.mesh((2, 4), ("fsdp", "tensor"))
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.metadata
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch_xla.distributed.spmd import Mesh

# torch and torch_xla are imported inside the functions below: torch_xla only after setup() has set the environment,
# and torch not at import time because the report runner (which only reads `tpu_present`) stays torch-free.

# Each CPU virtual device is a full PJRT client device (~100 MB RSS with small graphs); past this count the
# 2-core reference machine spends minutes per compile. TPU counts are whatever the host has.
MAX_CPU_DEVICES = 64
DUMP_MODULE_RE = "SyncTensorsGraph"
FAST_CPU_COMPILE = "--xla_backend_optimization_level=0"
# `import nbformat` (papermill's, and plotly's the first time a figure is shown in a kernel) pulls jsonschema's
# optional rfc3987_syntax, which builds ~40 lark grammars at import time: measured 1.7-1.8 s of CPU per process
# here (3.7 s of papermill's 4.8 s import on a slower machine). Neither nbformat nor plotly validates IRI formats,
# so the report's processes and every world's kernel hide that module (jsonschema skips the format check when
# the import fails).
SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)


def hide_slow_modules() -> None:
    """Make :data:`SLOW_OPTIONAL_MODULES` unimportable in this process (no effect on one already imported)."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[assignment]


@dataclass(frozen=True)
class World:
    """What ``setup()`` prepared: device kind and count, versions, where HLO dumps go."""

    kind: str  # "cpu" | "tpu"
    num_devices: int
    spmd: bool
    dump_dir: str | None
    versions: dict[str, str] = field(default_factory=dict)


_WORLD: World | None = None


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "torch_xla", "jax", "jaxlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def tpu_present() -> bool:
    """True on a TPU VM / Kaggle / Colab TPU runtime (checked without importing torch_xla)."""
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return True
    if os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE"):
        return True
    return any(os.path.exists(f"/dev/accel{i}") for i in range(8)) or os.path.exists("/dev/vfio/0")


def _check_request(num_devices: int | None, kind: str) -> None:
    if kind not in ("cpu", "tpu"):
        raise ValueError(f"device={kind!r} is not supported: use 'cpu' or 'tpu'")
    if num_devices is None:
        if kind == "cpu":
            raise ValueError("num_devices=None is only allowed on TPU (it means 'all chips'); give a count")
        return
    if isinstance(num_devices, bool) or not isinstance(num_devices, int):
        raise TypeError(f"num_devices={num_devices!r} must be an int")
    if num_devices < 1:
        raise ValueError(f"num_devices={num_devices} must be >= 1")
    if kind == "cpu" and num_devices > MAX_CPU_DEVICES:
        raise ValueError(
            f"num_devices={num_devices} is above what this host allows for CPU virtual devices "
            f"(at most {MAX_CPU_DEVICES})"
        )


def setup(num_devices: int | None = 8, device: str | None = None, spmd: bool = True,
          dump_hlo: bool = True) -> World:
    """Prepare the process-wide device world and import torch_xla. Idempotent for the same request."""
    global _WORLD
    kind = (device or ("tpu" if tpu_present() else "cpu")).lower()
    _check_request(num_devices, kind)
    if _WORLD is not None:
        if (num_devices is not None and num_devices != _WORLD.num_devices) or kind != _WORLD.kind:
            raise RuntimeError(
                f"this process already holds a {_WORLD.kind} world with {_WORLD.num_devices} devices; "
                f"num_devices={num_devices} (device={kind!r}) needs a new process: restart the kernel"
            )
        return _WORLD
    if "torch_xla" in sys.modules and kind == "cpu":
        have = os.environ.get("CPU_NUM_DEVICES")
        if have != str(num_devices):
            raise RuntimeError(
                "torch_xla was imported before shardlab.runtime.setup() "
                f"(CPU_NUM_DEVICES={have}, wanted {num_devices}): restart the kernel and call setup() first"
            )

    hide_slow_modules()  # before the notebook's first figure imports nbformat
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["PJRT_DEVICE"] = kind.upper()
    if kind == "cpu":
        os.environ["CPU_NUM_DEVICES"] = str(num_devices)
        # The compile-only TPU view loads libtpu in this process: JAX must not claim it as a runtime backend,
        # and other processes (notebook kernels, workers) may hold libtpu's lockfile at the same time.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # XLA:CPU's LLVM backend at -O0: the HLO passes, the partitioner, the collectives and the buffer
        # assignment are the same (every notebook's structural values compared identical), compiles are 2-7x
        # faster, and CPU execution is slower (this suite never presents CPU execution speed as a result).
        # Set --xla_backend_optimization_level yourself in XLA_FLAGS to override.
        if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {FAST_CPU_COMPILE}").strip()
    dump_dir = None
    if dump_hlo:
        dump_dir = tempfile.mkdtemp(prefix="shardlab-hlo-")
        atexit.register(shutil.rmtree, dump_dir, ignore_errors=True)
        flags = os.environ.get("XLA_FLAGS", "")
        flags = " ".join(f for f in flags.split() if not f.startswith(("--xla_dump_to", "--xla_dump_hlo_module_re")))
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text "
            f"--xla_dump_hlo_module_re={DUMP_MODULE_RE}"
        ).strip()

    with _gc_paused():
        import torch
        import torch_xla  # noqa: F401
        import torch_xla.runtime as xr

    # The suite's CPU tensors are tiny (oracles, per-rank ledger programs in threads): with torch's default of one
    # OpenMP thread per core the threads spin, measured on the 2-core reference machine under load: a 64k-element
    # comparison 4 ms of CPU with 2 threads vs 0.1 ms with 1; notebook 08's kernel 40.1 -> 32.7 s of CPU. XLA's own
    # compile and execution threads are not affected. OMP_NUM_THREADS, when set, wins.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)

    _quiet_absl()

    if spmd:
        xr.use_spmd()
    count = xr.global_runtime_device_count()
    if num_devices is not None and count != num_devices:
        raise RuntimeError(
            f"num_devices={num_devices} but the {kind} runtime reports {count} devices; "
            "on TPU use num_devices=None or the chip count"
        )
    _WORLD = World(kind=kind, num_devices=count, spmd=spmd, dump_dir=dump_dir, versions=_versions())
    gc.freeze()  # what the imports built lives as long as the process: later collections skip it (see _gc_paused)
    return _WORLD


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while torch / torch_xla import. Their import allocates millions of
    long-lived objects and triggers ~100 collections that each walk them all (measured on the 2-core machine:
    0.8 s of the import's 3.9 s of CPU); the import leaves almost no cyclic garbage. :func:`setup` then freezes
    what exists (``gc.freeze``), so the notebook's own collections stop re-walking the imported modules (measured:
    0.26 -> 0.07 s of GC in three TPU compiles). Tensors and graphs built afterwards are collected as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _quiet_absl() -> None:
    """torch_xla's shard_as imports torchax -> flax -> orbax, whose absl logger warns "Tensorflow library not
    found" (GCS paths only; nothing here uses them) into every notebook that runs a scan backward."""
    try:
        import absl.logging  # optional: comes with jax
    except ImportError:
        return
    absl.logging.set_verbosity(absl.logging.ERROR)


def current() -> World:
    """The world prepared by ``setup()``; a clear error if there is none yet."""
    if _WORLD is None:
        raise RuntimeError("no device world yet: call shardlab.runtime.setup(num_devices=...) first")
    return _WORLD


def device() -> torch.device:
    """The XLA device (under SPMD all virtual devices appear as one logical device)."""
    current()
    import torch_xla

    return torch_xla.device()


def axis_problem(size: int, num_devices: int, name: str, mesh: str) -> str | None:
    """Why a 2-D mesh whose one axis spans ``size`` devices (the other axis takes the rest) cannot be built on
    ``num_devices`` devices; None when it can. ``name`` is the notebook's parameter for ``size``, ``mesh``
    describes the axes for the message.

    >>> axis_problem(3, 8, "tp", "(data, tensor) = (n / tp, tp)")
    'tp=3 does not tile num_devices=8 (mesh (data, tensor) = (n / tp, tp))'
    """
    if size > num_devices:
        return f"the mesh needs {name}={size} devices; this process has num_devices={num_devices}"
    if num_devices % size:
        return f"{name}={size} does not tile num_devices={num_devices} (mesh {mesh})"
    return None


def check_mesh_shape(shape: tuple[int, ...], axis_names: tuple[str, ...], num_devices: int) -> None:
    """Validate a mesh request without touching XLA."""
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} has {len(shape)} axes but {len(axis_names)} names {axis_names}")
    if len(set(axis_names)) != len(axis_names):
        raise ValueError(f"mesh axis names {axis_names} must be distinct")
    for n, a in zip(shape, axis_names, strict=True):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"mesh axis {a!r}={n} must be a positive int")
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"mesh shape {dict(zip(axis_names, shape, strict=True))} uses {math.prod(shape)} devices but the world "
            f"has num_devices={num_devices}: the product of the mesh axes must equal the device count"
        )


def mesh(shape: int | tuple[int, ...], axis_names: str | tuple[str, ...]) -> Mesh:
    """A named ``torch_xla.distributed.spmd.Mesh`` over all devices, e.g. ``mesh((2, 4), ("fsdp", "tensor"))``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    world = current()
    check_mesh_shape(shape, axis_names, world.num_devices)
    import torch_xla.distributed.spmd as xs

    return xs.Mesh(np.arange(world.num_devices), shape, axis_names)
