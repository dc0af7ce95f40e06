"""The real XLA:TPU compiler, compile-only, for a described TPU topology (the ``tpu`` source).

Design
------
The ``libtpu`` wheel contains the TPU compiler; JAX can describe a TPU slice we do not own
(``jax.experimental.topologies.get_topology_desc``) and hand its compile-only client an HLO module. The graph a
notebook builds on its CPU device world (torch_xla under SPMD, shardings annotated, *not* synced) is lowered to
the pre-partitioning HLO proto with its shardings (``torch_xla._XLAC._get_xla_tensors_hlo_proto``) and compiled
for the topology exactly like torch_xla would on a TPU: GSPMD partitioning, sharding propagation allowed to the
outputs the graph left without a sharding (without it the program all-gathers every unannotated output) and to
the parameters the graph left without a sharding (placeholders) — never to a parameter torch_xla already laid
out (:func:`parameter_propagation`), nor to an output tensor that has a sharding spec: that spec is set as the
result's sharding, as torch_xla's own program keeps it (:func:`pin_shardings`). Measured why: allowed to
propagate, XLA:TPU returned the dim-0 sharded gradients and updated parameters of a per-parameter FSDP step
replicated, and all-gathered every parameter to produce them (the backward program of
notebook 05b's ``shardlab.fsdp.case.GspmdCase``).
Nothing executes, and the outputs are never synced (graphs over placeholders crash when executed).

**Donation.** torch_xla updates parameters and optimizer state in place: the step's new value of a tensor is
written into the buffer of its old one (input/output aliasing), so the update costs no second copy. A lazy graph
compiled here has no in-place tensors, so the caller says which output reuses which input:
``compile_tensors(outputs, donate={output index: input tensor})``, or a graph builder returns a :class:`Step`
``(outputs, donate)``. The input must be a parameter of the graph (device data or a placeholder, not a product
such as ``placeholder * 1``) with the output's shape and dtype; it becomes ``tf.aliasing_output`` on the entry
argument, which XLA turns into the program's input/output alias (``TpuMemory.alias`` = the donated bytes).
Measured on Llama 3 70B (v6e-64, AdamW state as placeholders): not donated, the step compiles ("fits") with
14.38 GiB of updated state as a second copy in the outputs; donated, the bf16 gradients become temporaries and
the same step fails ("Used 33.92G of 31.25G hbm") — the donated verdict is the realistic one.

What comes back (:class:`TpuCompile`): the per-chip program after every TPU pass (HLO text, parsed with
:mod:`shardlab.profile.hlo`), per-chip memory (:class:`TpuMemory`: ``peak``, and ``checked_temp`` / ``checked``,
the temporaries and the total the capacity check counts), XLA's cost analysis, and - instead of an exception - a
structured :class:`OutOfMemory` when the compiler runs out of HBM (out of memory is a compile error on TPU).

Measured with this compiler (libtpu 0.0.21): the HBM capacity check counts arguments + HBM temporaries, **not
outputs** (``v5e-1``: 1 GiB of arguments and 16 GiB of outputs compiled; 16 GiB of arguments did not: "Used
16.00G of 15.75G hbm"), nor the ~258 MiB it lists as reserved (:mod:`shardlab.profile.tpu_memory`). Capacities as
the compiler states them: v5e 15.75 GiB, v6e 31.25 GiB.

Every use of JAX's private API (``jax._src``) and of libtpu lives in this module (:func:`check_backend` pins the
versions and tests the names). libtpu writes warnings about the missing TPU straight to file descriptor 2;
:func:`quiet_libtpu` swallows those known lines and re-emits anything else. Compiles are cached in-process, and read
from the committed store of :mod:`shardlab.profile.tpu_store`, under one key (library versions, the program's HLO
text, topology, options). :func:`compile_program` runs a graph
builder in a worker process with the topology's device count when this process's world has a different one
(``tpu_worker``).

Example::

    >>> import torch, torch_xla.distributed.spmd as xs
    >>> from shardlab import runtime
    >>> mesh = runtime.mesh((2, 4), ("data", "tensor"))             # this process: 8 CPU devices
    >>> x = torch.randn(16, 64).to(runtime.device()); _ = xs.mark_sharding(x, mesh, (None, "tensor"))
    >>> w = torch.randn(64, 32).to(runtime.device()); _ = xs.mark_sharding(w, mesh, ("tensor", None))
    >>> out = compile_tensors([x @ w], "v5e-8")                       # not executed: compiled for 8 v5e chips
    >>> out.fits, out.count("all-reduce"), out.module.collectives[0].group_size
    (True, 1, 4)
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from shardlab import runtime
from shardlab.formulas import hardware
from shardlab.profile.hlo import HloModule, parse_hlo
from shardlab.profile.stderr_filter import filtered_fd, filtered_stderr
from shardlab.profile.tpu_memory import OutOfMemory, TpuMemory, parse_oom
from shardlab.profile.tpu_store import (
    StoredCompile,
    key_fields,
    key_of,
    load_stored,
    program_sha256,
    save_stored,
    store_mode,
)
from shardlab.profile.tpu_worker import worker_for

PINS = {"jax": "0.7.1", "jaxlib": "0.7.1", "libtpu": "0.0.21"}
# libtpu's complaints about the missing TPU (written to fd 2 at C level); harmless for compile-only use.
_NOISE = re.compile(
    r"Failed to find host bounds|could not determine TPU (accelerator type|worker hostnames)|"
    r"Logging before InitGoogle|TPU_WORKER_HOSTNAMES|TPU_ACCELERATOR_TYPE|=== Source Location Trace: ===|"
    r"^\S+\.(cc|h):\d+\s*$|GSPMD.*deprecat|^\s*$"
)


@dataclass(frozen=True)
class Topology:
    """A TPU slice the compiler can target. ``name`` is the suite's one slice name, Cloud TPU's accelerator type
    (``"v5e-8"``; for v4 and v5p the number counts TensorCores, two per chip: ``"v5p-256"`` is 128 chips);
    ``shape`` is the torus of chips libtpu itself names the slice by (``"2x4"``, ``"4x4x8"``), read only where the
    topology is handed to libtpu (:func:`_device_list`). ``wrap`` says which torus axes have wraparound links
    (:func:`wraparound`); ``host_bounds`` are the chips per host (libtpu's default 2x2x1 rejects 1- and 2-chip
    slices); ``chip_config`` is libtpu's chip configuration (v4: ``"megacore"``, one device per chip — by default
    libtpu lists each v4 TensorCore as a device); ``hbm_bytes`` is the per-chip capacity the compiler checks
    against (``data/hardware``)."""

    name: str  # e.g. "v5e-8", "v5p-256"
    generation: str  # "v4" | "v5e" | "v5p" | "v6e"
    chips: int
    shape: str  # e.g. "2x4", "4x4x8": libtpu's name for the slice is f"{generation}:{shape}"
    host_bounds: tuple[int, int, int] | None  # None: libtpu's default
    hbm_bytes: int | None
    wrap: tuple[bool, ...] = ()  # per torus axis: a wraparound link (a ring, not a line)
    chip_config: str | None = None  # libtpu's chip_config_name; None: its default

    @property
    def libtpu_name(self) -> str:
        """The name libtpu's ``get_topology_desc`` takes: ``"v5e:2x4"``."""
        return f"{self.generation}:{self.shape}"

    @property
    def extents(self) -> tuple[int, ...]:
        """The torus extents: ``(2, 4)`` for ``"2x4"``."""
        return tuple(int(v) for v in self.shape.split("x"))


# Cloud TPU names v4 and v5p slices by TensorCores (two per chip: v5p-8 is the 4-chip 2x2x1), v5e and v6e by chips
# (data/hardware/<generation>.json "slice_naming"; the tests check every published slice of data/hardware).
CORES_PER_CHIP_IN_NAME = {"v4": 2, "v5e": 1, "v5p": 2, "v6e": 1}
_CHIP_CONFIG = {"v4": "megacore"}  # v5p's default already is one device per chip (measured: v5p:2x2x1 -> 4 devices)
# The compile-only catalogue: every single-slice torus shape of Cloud TPU's tables up to the pod (v5e / v6e: 16x16;
# v4 / v5p: powers of two up to 16x16x16), each described by libtpu 0.0.21 (tests/test_tpu.py lists the devices of
# every one). 1- and 2-chip slices need explicit host bounds. libtpu describes larger shapes too (v6e:32x32, 1024
# chips): beyond one pod a job spans slices over the data-centre network (multi-slice), which is out of scope.
_SHAPES = {
    "v5e": ("1x1", "1x2", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v6e": ("1x1", "1x2", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16"),
    "v4": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16"),
}
_SMALL_BOUNDS = {"1x1": (1, 1, 1), "1x2": (1, 2, 1)}
POD_EDGE_2D = 16  # v5e / v6e: a 16-chip extent is the pod's full edge, the only one with a wraparound link
TORUS_MULTIPLE_3D = 4  # v4 / v5p: every extent a multiple of 4 (whole 4x4x4 cubes) -> a 3D torus


def wraparound(generation: str, shape: str) -> tuple[bool, ...]:
    """Which torus axes of a slice have wraparound links.

    v5e / v6e (2D): only an extent that spans the pod's full edge (16) wraps — v6e 16x16 both axes, 8x16 the long
    one, 8x8 none. v4 / v5p (3D): every axis wraps when all extents are multiples of 4 (Cloud TPU's v4 page: "3D
    torus on slices where ... each dimension is a multiple of 4"; the optical switches close whole 4x4x4 cubes);
    smaller slices are a 3D mesh. The same per-slice table as MaxText's ahead-of-time compile map.

    >>> wraparound("v6e", "16x16"), wraparound("v5e", "8x16"), wraparound("v5p", "4x4x8"), wraparound("v4", "2x4x4")
    ((True, True), (False, True), (True, True, True), (False, False, False))
    """
    dims = tuple(int(v) for v in shape.split("x"))
    if len(dims) == 2:
        return tuple(d == POD_EDGE_2D for d in dims)
    whole_cubes = all(d % TORUS_MULTIPLE_3D == 0 for d in dims)
    return tuple(whole_cubes for _ in dims)


def _topology(generation: str, shape: str, host_bounds: tuple[int, int, int] | None = None) -> Topology:
    chips = math.prod(int(v) for v in shape.split("x"))
    # Usable HBM per chip as the compiler reports it ("Used X of 15.75G hbm"): one fact, in data/hardware.
    chip = hardware.chips().get(generation)
    return Topology(f"{generation}-{chips * CORES_PER_CHIP_IN_NAME[generation]}", generation, chips, shape,
                    host_bounds, chip.hbm_usable_bytes if chip else None, wraparound(generation, shape),
                    _CHIP_CONFIG.get(generation))


TOPOLOGIES: dict[str, Topology] = {
    t.name: t for g, shapes in _SHAPES.items() for t in (_topology(g, s, _SMALL_BOUNDS.get(s)) for s in shapes)
}
DEFAULT_TOPOLOGY = "v5e-8"
GENERATIONS = tuple(_SHAPES)
# Cloud TPU's API names v5e slices "v5litepod-N" (console and gcloud); libtpu and the suite say "v5e".
_ALIASES = {"v5litepod": "v5e"}


def _slice_order(name: str) -> tuple[int, str, int]:
    """The catalogue's order: v5e, v6e (the suite's defaults), v5p, v4; then by size."""
    gen, _, n = name.partition("-")
    return (GENERATIONS.index(gen) if gen in GENERATIONS else len(GENERATIONS)), gen, int(n) if n.isdigit() else 0


def known_slices() -> list[str]:
    """Every slice name the suite knows: the planner's (``data/hardware``) and the compile-only topologies."""
    return sorted(set(hardware.topologies()) | set(TOPOLOGIES), key=_slice_order)


def _naming_rule() -> str:
    return ("Cloud TPU names v4 and v5p slices by TensorCores, two per chip (v5p-256 = 128 chips, v4-128 = 64 "
            "chips), v5e and v6e slices by chips (v6e-256 = 256 chips); libtpu's generation:shape form is accepted "
            "too (v5p:4x4x8 = v5p-256, v6e:2x4 = v6e-8)")


def parse_slice(text: Any, name: str = "topology") -> str:
    """A user's slice name in the suite's one form (Cloud TPU's accelerator type): ``"v6e-8"`` stays, libtpu's
    ``"v6e:2x4"`` becomes ``"v6e-8"``, ``"v5p:4x4x8"`` becomes ``"v5p-256"`` (TensorCores: 128 chips), Cloud's
    ``"v5litepod-16"`` becomes ``"v5e-16"``.

    The one boundary parser (CLI, notebook parameters, ``inspect()`` / ``make_config``); everything inside the
    suite takes the Cloud TPU name only. ``name`` is the parameter the value came from, for the error, which
    states the naming rule: a bare generation, ``v5`` (v5e or v5p?), a core count that is not a slice (``v5p-4``),
    a shape not in the catalogue and a slice larger than a pod are refused.

    >>> parse_slice("v5e:2x4"), parse_slice("v6e-64"), parse_slice("v5p:4x4x8"), parse_slice("v4-128")
    ('v5e-8', 'v6e-64', 'v5p-256', 'v4-128')
    """
    if isinstance(text, str):
        text = text.strip()
        gen, sep, rest = text.partition(":") if ":" in text else text.rpartition("-")
        gen = _ALIASES.get(gen, gen)
        candidate = f"{gen}-{rest}" if sep == "-" else text
        if candidate in TOPOLOGIES or candidate in hardware.topologies():
            return candidate
        by_shape = {t.libtpu_name: t.name for t in TOPOLOGIES.values()}
        if sep == ":" and f"{gen}:{rest}" in by_shape:
            return by_shape[f"{gen}:{rest}"]
        why = _why_not(text, gen, sep, rest)
    else:
        why = f"a slice name is a string such as 'v6e-8', not {type(text).__name__}"
    raise ValueError(f"{name}={text!r} is not a known TPU slice; known slices: {', '.join(known_slices())}. Why: "
                     f"{why}. {_naming_rule()}. One slice only: multi-slice jobs (slices joined over the "
                     "data-centre network, DCN) are out of scope")


def _why_not(text: str, gen: str, sep: str, rest: str) -> str:
    """The rule a refused slice name breaks (for :func:`parse_slice`'s error)."""
    if gen in ("v5", "v5lite"):
        return "'v5' is ambiguous: say v5e (one TensorCore per chip) or v5p (two)"
    if gen not in GENERATIONS:
        if not sep:
            return "expected generation-number (v6e-8) or generation:shape (v6e:2x4)"
        return f"unknown generation {gen!r} (known: {', '.join(GENERATIONS)})"
    if sep == ":":
        shapes = ", ".join(t.shape for t in TOPOLOGIES.values() if t.generation == gen)
        return f"{gen} has no single-slice shape {rest!r} in the catalogue (known: {shapes})"
    per = CORES_PER_CHIP_IN_NAME[gen]
    counts = sorted(t.chips * per for t in TOPOLOGIES.values() if t.generation == gen)
    if not rest.isdigit():
        return f"{rest!r} after '{gen}-' is not a number"
    if per > 1 and int(rest) % per:
        return f"{gen}-N counts TensorCores ({per} per chip), so N must be even; known N: {counts}"
    if int(rest) > counts[-1]:
        return f"{gen}-{rest} is larger than the largest single slice {gen}-{counts[-1]}"
    return f"{gen} has no slice with N = {rest} ({'TensorCores' if per > 1 else 'chips'}); known N: {counts}"


def get_topology(name: str) -> Topology:
    """The compile-only topology of the slice ``name`` (Cloud TPU's name, e.g. ``"v5e-8"``, ``"v5p-256"``)."""
    if name not in TOPOLOGIES:
        if isinstance(name, str) and ":" in name:
            raise ValueError(f"topology={name!r} is libtpu's generation:shape form; the suite's functions take the "
                             f"Cloud TPU name (e.g. 'v5e-8'): convert a user's value once with "
                             f"shardlab.profile.tpu.parse_slice")
        raise ValueError(f"topology={name!r} has no compile-only topology; known: {', '.join(TOPOLOGIES)}")
    return TOPOLOGIES[name]


def topology_for(num_chips: int, generation: str = "v5e") -> str:
    """The compile-only slice with ``num_chips`` chips of ``generation``: ``topology_for(8) == "v5e-8"``,
    ``topology_for(128, "v5p") == "v5p-256"``."""
    found = [t.name for t in TOPOLOGIES.values() if t.generation == generation and t.chips == num_chips]
    if not found:
        have = sorted({t.chips for t in TOPOLOGIES.values() if t.generation == generation})
        gens = sorted({t.generation for t in TOPOLOGIES.values()})
        raise ValueError(f"no {generation!r} topology with num_chips={num_chips}: known chip counts for "
                         f"{generation!r} are {have} (generations {gens})")
    return found[0]


GENERATION_ENV = "SHARDLAB_TPU_GENERATION"  # the report sets it: every notebook's TPU view compiles for one generation


def default_generation() -> str:
    """The TPU generation a view compiles for unless told otherwise: ``$SHARDLAB_TPU_GENERATION`` or ``v5e``."""
    generation = os.environ.get(GENERATION_ENV, "v5e")
    known = sorted({t.generation for t in TOPOLOGIES.values()})
    if generation not in known:
        raise ValueError(f"{GENERATION_ENV}={generation!r} is not a TPU generation the compiler knows: {known}")
    return generation


NOT_INSTALLED = ("libtpu is not installed here: the TPU compiler ships in it (`pip install libtpu==0.0.21`; "
                 "hosted TPU runtimes get it with torch_xla[tpu])")
ON_TPU = "this process runs on a TPU: the hlo column is the TPU compiler's own program"


def view_topology(needed_chips: int, fits_here: bool, generation: str = "v5e") -> tuple[str | None, str]:
    """Where a notebook's ``tpu`` view compiles: ``(topology, how)``, or ``(None, why the view is skipped)``.

    The rule every topic's view follows: a configuration that fits this process's devices compiles for a slice
    of that many chips (in process); one that needs ``needed_chips`` devices the process lacks compiles for
    ``needed_chips`` chips in a helper process. On a TPU host, a configuration that fits is skipped — its hlo
    column already is XLA:TPU's program. Without libtpu, or for a chip count no topology has, the view is skipped.
    """
    world = runtime.current()
    if importlib.util.find_spec("libtpu") is None:
        return None, NOT_INSTALLED
    if world.kind == "tpu" and fits_here:
        return None, ON_TPU
    chips = world.num_devices if fits_here else needed_chips
    try:
        topology = topology_for(chips, generation)
    except ValueError as exc:
        return None, str(exc)
    if chips > runtime.MAX_CPU_DEVICES:
        return None, (f"{topology} has {chips} chips and a torch_xla trace needs one CPU device per chip (at most "
                      f"{runtime.MAX_CPU_DEVICES}); a graph traced on a few devices is compiled for it with "
                      "shardlab.profile.retarget")
    return topology, "this process's devices" if fits_here else f"a helper process with {chips} devices"


@dataclass
class TpuCompile:
    """One XLA:TPU compile of a graph for a topology (per-chip numbers; picklable)."""

    topology: str
    num_chips: int
    fits: bool
    compile_s: float
    hlo_text: str | None  # the per-chip program after all TPU passes; None when out of memory
    module: HloModule | None
    memory: TpuMemory | None
    oom: OutOfMemory | None
    cost: dict[str, float] = field(default_factory=dict)  # XLA cost analysis: flops, bytes accessed, ...
    options: dict[str, Any] = field(default_factory=dict)  # disable_passes, debug_options
    cached: bool = False
    label: str = ""
    stored: bool = False  # served from the committed store (shardlab.profile.tpu_store): cached, and no compile ran

    def _module(self) -> HloModule:
        if self.module is None:
            raise ValueError(f"{self.label or 'this program'} did not fit on {self.topology} ({self.oom}): "
                             "there is no compiled program to count collectives in")
        return self.module

    def count(self, op: str, in_while: bool | None = None) -> int:
        """Logical collectives ``op`` in the TPU program (async clones and start/done pairs counted once)."""
        return self._module().count(op, in_while)

    def bytes(self, op: str, which: str = "operand", in_while: bool | None = None) -> int:
        """Per-chip operand (or result) bytes of the collectives ``op``."""
        return self._module().bytes(op, which, in_while)


# --------------------------------------------------------------------------------------------- backend (jax._src)

def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_backend() -> dict[str, str]:
    """Verify the pinned jax / jaxlib / libtpu and the private names this module uses; return the versions."""
    found = {d: _installed(d) for d in PINS}
    wrong = {d: v for d, v in found.items() if v != PINS[d]}
    if wrong:
        raise RuntimeError(
            "the TPU compile view needs " + ", ".join(f"{d}=={v}" for d, v in PINS.items())
            + " but found " + ", ".join(f"{d} {v or 'not installed'}" for d, v in wrong.items())
            + ": `make test` (or `pip install -r requirements.txt`) installs them"
        )
    _backend()
    return {d: str(v) for d, v in found.items()}


@cache
def _backend() -> Any:
    """The private JAX names (imported once, after the environment is set)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # JAX must not grab libtpu as a runtime backend
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several processes may compile at once
    from jax._src import compiler
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir as mlir_ir
    from jax.experimental import topologies

    class B:  # one namespace so tests can check every name
        get_compile_options = compiler.get_compile_options
        hlo_to_stablehlo = xc._xla.mlir.hlo_to_stablehlo
        XlaComputation = xc.XlaComputation
        DeviceList = xc.DeviceList
        get_topology_desc = topologies.get_topology_desc
        make_ir_context = jax_mlir.make_ir_context
        module_to_bytecode = jax_mlir.module_to_bytecode
        ir = mlir_ir

    return B


def quiet_libtpu() -> contextlib.AbstractContextManager[None]:
    """Redirect fd 2 around libtpu calls; re-emit (to ``sys.stderr``) every line that is not known noise."""
    return filtered_stderr(lambda line: bool(_NOISE.search(line)))


def topology_devices(name: str) -> tuple[Any, ...]:
    """The JAX ``TpuDevice`` objects of a topology (compile-only; e.g. for a ``jax.sharding.Mesh``)."""
    return _device_list(get_topology(name).name)


@cache
def _device_list(name: str) -> tuple[Any, ...]:
    topo = get_topology(name)
    b = _backend()
    kw: dict[str, Any] = {"chips_per_host_bounds": topo.host_bounds} if topo.host_bounds else {}
    if topo.chip_config:
        kw["chip_config_name"] = topo.chip_config
    if any(topo.wrap):  # only where a link wraps: smaller slices are described exactly as before the catalogue
        kw["wrap"] = topo.wrap + (False,) * (3 - len(topo.wrap))
    with quiet_libtpu():  # libtpu names the slice by its shape: "v5e:2x4" is the 8-chip v5e-8
        desc = b.get_topology_desc(platform="tpu", topology_name=topo.libtpu_name, **kw)
    devices = tuple(desc.devices)
    if len(devices) != topo.chips:
        raise RuntimeError(f"libtpu describes {topo.libtpu_name} ({name}) with {len(devices)} chips, expected "
                           f"{topo.chips}")
    return devices


class Step(NamedTuple):
    """What a graph builder returns (a case's ``graph()`` always): the outputs and which of them update an input in
    place.

    ``donate[i] = x``: output ``i`` is written into input ``x``'s buffer (torch_xla's in-place update of ``x``).
    """

    outputs: list[Any]
    donate: Mapping[int, Any] = MappingProxyType({})  # none


def donation(outputs: list[Any], donate: Mapping[int, Any]) -> dict[int, int]:
    """``{entry parameter number: output index}`` for ``donate = {output index: input tensor}``.

    The graph's parameters are its device-data nodes in torch_xla's order (``_get_tensors_xla_device_data_node``:
    parameter k of the lowered HLO is the k-th node); an input is found by its data handle. Errors name the output
    index and the rule: the input must be a parameter of this graph, donated once, with the output's shape and dtype.
    """
    import torch_xla  # in the functions, not at the top: profile is imported before runtime.setup()

    _, params = torch_xla._XLAC._get_tensors_xla_device_data_node(list(outputs))
    position = {h: k for k, h in enumerate(torch_xla._XLAC._get_tensors_handle(list(params)))}
    aliases: dict[int, int] = {}
    for out_index, tensor in sorted(donate.items()):
        if not 0 <= out_index < len(outputs):
            raise ValueError(f"donate={{{out_index}: ...}}: output index {out_index} is out of range "
                             f"(there are {len(outputs)} outputs)")
        out = outputs[out_index]
        try:
            (handle,) = torch_xla._XLAC._get_tensors_handle([tensor])
        except RuntimeError:
            handle = None
        if handle not in position:
            raise ValueError(f"donate={{{out_index}: ...}}: the input is not a parameter of the graph (donate the "
                             "device data or placeholder itself, not a product of it such as `placeholder * 1`)")
        if tuple(tensor.shape) != tuple(out.shape) or tensor.dtype != out.dtype:
            raise ValueError(f"donate={{{out_index}: ...}}: output {out_index} is {out.dtype}{list(out.shape)} but "
                             f"the donated input is {tensor.dtype}{list(tensor.shape)}: aliasing needs both alike")
        k = position[handle]
        if k in aliases:
            raise ValueError(f"donate={{{out_index}: ...}}: that input is already donated to output {aliases[k]}")
        aliases[k] = out_index
    return aliases


_PARAMETER_RE = re.compile(r"=\s*\S+\s+parameter\((\d+)\)(.*)$")


def parameter_propagation(hlo_text: str, count: int) -> list[bool]:
    r"""Per entry parameter: may the partitioner choose its sharding? Only when the graph gave it none.

    torch_xla gives every device-data parameter a sharding (``{replicated}`` when unannotated): on a TPU the data
    is already laid out that way, so the compiled program must keep it. Allowing propagation there let the
    compiler replace a parameter's sharding (measured: vocab-sharded logits became a replicated argument, and the
    gathered cross-entropy's all-gather disappeared). Placeholders (``create_placeholder_tensor``) carry no
    sharding and take the one their users imply.

    >>> parameter_propagation('ENTRY %m {\n  %p0 = f32[4]{0} parameter(0), sharding={replicated}\n'
    ...                       '  %p1 = f32[4]{0} parameter(1)\n}', 2)
    [False, True]
    """
    entry = hlo_text[hlo_text.find("ENTRY"):] if "ENTRY" in hlo_text else hlo_text
    sharded: dict[int, bool] = {}
    for line in entry.splitlines():
        m = _PARAMETER_RE.search(line)
        if m:
            sharded[int(m.group(1))] = "sharding=" in m.group(2)
    return [not sharded.get(i, False) for i in range(count)]


def pin_shardings(proto: bytes, output_shardings: list[str], aliases: Mapping[int, int] | None = None,
                  retarget: tuple[tuple[int, ...], tuple[int, ...]] | None = None
                  ) -> tuple[bytes, list[bool], list[bool]]:
    """The StableHLO module of ``proto`` with ``output_shardings[i]`` (HLO sharding text, "" = none) set as result
    i's sharding, and which parameters / results sharding propagation may still choose: those without one.
    ``aliases`` (``{parameter: output}``, see :func:`donation`) become ``tf.aliasing_output`` argument attributes.
    ``retarget = (trace mesh, target mesh)``: every sharding of the module (and ``output_shardings``) is rewritten
    from the mesh the graph was traced on to the target mesh (:mod:`shardlab.profile.retarget`)."""
    from shardlab.profile.retarget import retarget_module, retarget_sharding

    b = _backend()
    computation = b.XlaComputation(proto)
    free_params = parameter_propagation(computation.as_hlo_text(), len(computation.program_shape().parameter_shapes()))
    if retarget:
        output_shardings = [retarget_sharding(o, *retarget) if o else o for o in output_shardings]
    with b.make_ir_context():
        module = b.ir.Module.parse(b.hlo_to_stablehlo(proto))
        if retarget:  # global shapes stay; only the tile assignments name devices
            module = b.ir.Module.parse(retarget_module(str(module), *retarget))
        main = next(op for op in module.body.operations
                    if "sym_name" in op.attributes and b.ir.StringAttr(op.attributes["sym_name"]).value == "main")
        n_out = len(b.ir.FunctionType(b.ir.TypeAttr(main.attributes["function_type"]).value).results)
        if len(output_shardings) != n_out:
            raise ValueError(f"{len(output_shardings)} output shardings for a program with {n_out} results")
        main.attributes["res_attrs"] = b.ir.ArrayAttr.get([
            b.ir.DictAttr.get({"mhlo.sharding": b.ir.StringAttr.get(s)} if s else {}) for s in output_shardings])
        if aliases:
            n_args = len(main.regions[0].blocks[0].arguments)
            old = (list(main.attributes["arg_attrs"]) if "arg_attrs" in main.attributes
                   else [b.ir.DictAttr.get({})] * n_args)
            i32 = b.ir.IntegerType.get_signless(32)
            new = []
            for i, attrs in enumerate(old):
                kv = {a.name: a.attr for a in b.ir.DictAttr(attrs)}
                if i in aliases:
                    kv["tf.aliasing_output"] = b.ir.IntegerAttr.get(i32, aliases[i])
                new.append(b.ir.DictAttr.get(kv))
            main.attributes["arg_attrs"] = b.ir.ArrayAttr.get(new)
        return b.module_to_bytecode(module), free_params, [not s for s in output_shardings]


def _compile_proto(proto: bytes, topo: Topology, disable_passes: tuple[str, ...],
                   debug_options: Mapping[str, Any], auto_spmd_mesh: tuple[int, ...] | None = None,
                   output_shardings: list[str] | None = None, aliases: Mapping[int, int] | None = None,
                   retarget: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Any:
    """Compile a pre-partitioning HLO proto for ``topo``; returns the compile-only executable."""
    b = _backend()
    devices = _device_list(topo.name)
    computation = b.XlaComputation(proto)
    shape = computation.program_shape()
    result = shape.result_shape()
    n_out = len(result.tuple_shapes()) if result.is_tuple() else 1
    opts = b.get_compile_options(
        num_replicas=1, num_partitions=topo.chips, use_spmd_partitioning=True,
        device_assignment=np.array(devices).reshape(1, topo.chips),
        env_options_overrides=dict(debug_options) or None,
    )
    build = opts.executable_build_options
    # GSPMD, as torch_xla itself uses. Shardy (JAX 0.7's default) does not read the GSPMD shardings of a
    # torch_xla proto: it silently compiles a replicated program (measured: no collectives, full weights).
    build.use_shardy_partitioner = False
    # Vector sizes must be 1 or exactly the counts, or XLA aborts the process (CHECK failure).
    module, free_params, free_outputs = pin_shardings(proto, list(output_shardings or [""] * n_out), aliases,
                                                      retarget)
    build.allow_spmd_sharding_propagation_to_parameters = free_params
    build.allow_spmd_sharding_propagation_to_output = free_outputs
    if disable_passes:
        build.debug_options.xla_disable_hlo_passes = ",".join(disable_passes)
    if auto_spmd_mesh:  # XLA's auto-sharding (an ILP over every array's sharding) instead of propagation
        build.use_auto_spmd_partitioning = True
        build.auto_spmd_partitioning_mesh_shape = list(auto_spmd_mesh)
        build.auto_spmd_partitioning_mesh_ids = list(range(topo.chips))
        # the solver chooses every input's sharding too (with xla_tpu_auto_spmd_remove_all_user_shardings)
        build.allow_spmd_sharding_propagation_to_parameters = [True] * len(shape.parameter_shapes())
        build.allow_spmd_sharding_propagation_to_output = [True] * n_out
    with quiet_libtpu(), _quiet_stdout(bool(auto_spmd_mesh)):
        return devices[0].client.compile(module, executable_devices=b.DeviceList(devices), compile_options=opts)


@contextlib.contextmanager
def _quiet_stdout(active: bool) -> Iterator[None]:
    """Swallow fd 1 while the auto-sharding solver (OR-tools) prints its progress log there."""
    if not active:
        yield
        return
    with filtered_fd(1, lambda line: True):
        yield


def _cost(exe: Any) -> dict[str, float]:
    cost = exe.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    return {str(k): float(v) for k, v in dict(cost or {}).items() if isinstance(v, int | float)}


# -------------------------------------------------------------------------------------------------- public API

_CACHE: dict[str, TpuCompile] = {}  # by shardlab.profile.tpu_store.key_of
_LOCK = threading.Lock()
# Compiles served from a cache (this process's or a worker's) since import: the report's shared sweep kernels
# accept a point only if it compiled everything itself (a cached compile takes no time and proves nothing new).
CACHE_HITS = 0
# Compiles this process ran or had a worker run (cache hits excluded), and their seconds: the record's
# ``xla.TpuCompileTime`` (where a notebook's time goes).
COMPILES = 0
COMPILE_S = 0.0
# Compiles served from the committed store (shardlab.profile.tpu_store), also counted in CACHE_HITS.
STORE_HITS = 0


def compile_tensors(outputs: list[Any], topology: str = DEFAULT_TOPOLOGY, *, disable_passes: tuple[str, ...] = (),
                    debug_options: Mapping[str, Any] | None = None, label: str = "",
                    auto_spmd_mesh: tuple[int, ...] | None = None,
                    donate: Mapping[int, Any] | None = None,
                    retarget: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> TpuCompile:
    """Compile the graph producing ``outputs`` (this process's SPMD world, not synced) for ``topology``.

    ``donate`` (``{output index: input tensor}``): output i reuses input tensor's buffer, as torch_xla's in-place
    update does (see :func:`donation` for the rules); ``TpuCompile.options["donated"]`` lists the pairs.

    ``disable_passes`` names XLA passes to skip (e.g. ``("all-reduce-combiner",)``); ``debug_options`` are
    XLA / XLA:TPU compiler flags (``{"xla_tpu_...": value}``), passed like ``jax.jit(...).compile(compiler_options=)``.
    ``auto_spmd_mesh`` (e.g. ``(8,)``): let XLA's auto-sharding choose the shardings on a mesh of that shape
    (the build option ``use_auto_spmd_partitioning``); with the XLA:TPU flag
    ``xla_tpu_auto_spmd_remove_all_user_shardings`` it also ignores the graph's own annotations.
    ``retarget = (trace mesh, target mesh)`` (e.g. ``((2, 4), (64, 4))``): trace small, compile big — the graph was
    built on this process's world with the trace mesh, and is compiled for ``topology`` with every sharding
    rewritten to the target mesh (:mod:`shardlab.profile.retarget`; its errors say what cannot be retargeted).
    """
    import torch_xla  # in the functions, not at the top: profile is imported before runtime.setup()

    from shardlab.profile.retarget import check_meshes

    topo = get_topology(topology)
    world = runtime.current()
    if retarget is not None:
        small, big = check_meshes(*retarget)
        retarget = (small, big)
        if math.prod(small) != world.num_devices or math.prod(big) != topo.chips:
            raise ValueError(f"retarget={retarget}: the trace mesh must span this process's {world.num_devices} "
                             f"devices and the target mesh the {topo.chips} chips of {topology!r}")
    elif world.num_devices != topo.chips:
        raise ValueError(
            f"topology={topology!r} has {topo.chips} chips but this process's world has "
            f"num_devices={world.num_devices}: the graph's mesh must span the topology's chips. Use "
            f"compile_program(build, cfg, {topology!r}) to build the graph in a worker with {topo.chips} devices"
        )
    if not outputs:
        raise ValueError("outputs=[] : pass the tensors whose graph should be compiled")
    versions = check_backend()
    debug_options = dict(debug_options or {})
    disable_passes = tuple(disable_passes)
    auto_spmd_mesh = tuple(auto_spmd_mesh) if auto_spmd_mesh else None
    if auto_spmd_mesh and math.prod(auto_spmd_mesh) != topo.chips:
        raise ValueError(f"auto_spmd_mesh={auto_spmd_mesh} has {math.prod(auto_spmd_mesh)} devices but "
                         f"topology={topology!r} has {topo.chips} chips")
    options: dict[str, Any] = {"disable_passes": list(disable_passes), "debug_options": debug_options}
    if auto_spmd_mesh:
        options["auto_spmd_mesh"] = list(auto_spmd_mesh)
    if retarget:
        options["retarget"] = [list(retarget[0]), list(retarget[1])]  # traced on, compiled for
    aliases = donation(outputs, donate) if donate else {}
    if aliases:
        options["donated"] = sorted((o, k) for k, o in aliases.items())  # (output index, entry parameter)
    proto = torch_xla._XLAC._get_xla_tensors_hlo_proto(outputs)
    output_shardings = [torch_xla._XLAC._get_xla_sharding_spec(t) for t in outputs]  # "" when none
    # One key for this process's cache and the committed store: everything that decides the compile. The program
    # is the proto's HLO text with every constant printed, not the graph hash (it ignores settings that change the
    # lowered HLO — measured: the mat-mul precision) nor the raw proto (measured: two clones of one commit lower
    # different bytes for the same text when the graph holds a JAX-lowered call; shardlab.profile.tpu_store).
    fields = key_fields(versions, program_text(proto), topology, {
        "disable_passes": list(disable_passes), "debug_options": debug_options, "auto_spmd_mesh": auto_spmd_mesh,
        "output_shardings": output_shardings, "aliases": sorted(aliases.items()), "retarget": retarget})
    key = key_of(fields)
    global CACHE_HITS, STORE_HITS
    with _LOCK:
        if key in _CACHE:
            hit = _CACHE[key]
            CACHE_HITS += 1
            return TpuCompile(**{**hit.__dict__, "cached": True, "stored": False, "label": label or hit.label})
        mode = store_mode()
        entry = load_stored(key) if mode == "read" else None
        if entry is not None:
            STORE_HITS += 1
            CACHE_HITS += 1
            result = _from_entry(entry, topology, topo, options, label)
        else:
            result, error = _compile_live(proto, topology, topo, disable_passes, debug_options, auto_spmd_mesh,
                                          output_shardings, aliases, retarget, options, label)
            if mode == "write":
                save_stored(StoredCompile(fields, proto, result.hlo_text, error,
                                          asdict(result.memory) if result.memory else None, result.cost,
                                          result.compile_s, label))
        _CACHE[key] = result
        _count_compile(result)
        return result


def program_text(proto: bytes) -> str:
    """The HLO text of a pre-partitioning proto with every constant printed: what a compile key hashes."""
    return _backend().XlaComputation(proto).as_hlo_text(print_large_constants=True)


def _compile_live(proto: bytes, topology: str, topo: Topology, disable_passes: tuple[str, ...],
                  debug_options: dict[str, Any], auto_spmd_mesh: tuple[int, ...] | None,
                  output_shardings: list[str], aliases: dict[int, int],
                  retarget: tuple[tuple[int, ...], tuple[int, ...]] | None, options: dict[str, Any], label: str
                  ) -> tuple[TpuCompile, str | None]:
    """Run the compiler; the result and, when it ran out of memory, its message."""
    t0 = time.perf_counter()
    try:
        exe = _compile_proto(proto, topo, disable_passes, debug_options, auto_spmd_mesh, output_shardings,
                             aliases, retarget)
    except Exception as e:  # XlaRuntimeError; only out-of-memory becomes data
        oom = parse_oom(str(e))
        if oom is None:
            raise
        return TpuCompile(topology, topo.chips, False, time.perf_counter() - t0, None, None, None, oom,
                          {}, options, False, label), str(e)
    compile_s = time.perf_counter() - t0
    text = exe.hlo_modules()[0].to_string()
    memory = TpuMemory.from_stats(exe.get_compiled_memory_stats(), topo.hbm_bytes)
    return TpuCompile(topology, topo.chips, True, compile_s, text, parse_hlo(text), memory, None, _cost(exe),
                      options, False, label), None


def _from_entry(entry: StoredCompile, topology: str, topo: Topology, options: dict[str, Any], label: str
                ) -> TpuCompile:
    """A stored compile as the live one would have returned it, marked ``cached`` (it measured no time)."""
    if entry.text is None:
        oom = parse_oom(entry.error or "")
        if oom is None:
            raise ValueError(f"the stored compile {label!r} holds neither a program nor an out-of-memory message")
        return TpuCompile(topology, topo.chips, False, entry.compile_s, None, None, None, oom, {}, options, True,
                          label, stored=True)
    return TpuCompile(topology, topo.chips, True, entry.compile_s, entry.text, parse_hlo(entry.text),
                      TpuMemory(**entry.memory) if entry.memory else None, None, dict(entry.cost), options, True,
                      label, stored=True)


def _count_compile(result: TpuCompile) -> None:
    global COMPILES, COMPILE_S
    if not result.cached:
        COMPILES += 1
        COMPILE_S += result.compile_s


def compile_built(built: list[Any] | Step, topology: str, donate: bool = True, **opts: Any) -> TpuCompile:
    """Compile what a graph builder returned: a list of outputs, or a :class:`Step` whose donations are applied
    when ``donate`` (``donate=False``: the same graph without input/output aliasing)."""
    if isinstance(built, Step):
        return compile_tensors(list(built.outputs), topology, donate=built.donate if donate else None, **opts)
    return compile_tensors(list(built), topology, **opts)


def compile_program(build: Callable[[Any], list[Any] | Step], cfg: Any, topology: str = DEFAULT_TOPOLOGY, *,
                    disable_passes: tuple[str, ...] = (), debug_options: Mapping[str, Any] | None = None,
                    label: str = "", auto_spmd_mesh: tuple[int, ...] | None = None,
                    donate: bool = True, retarget: tuple[tuple[int, ...], tuple[int, ...]] | None = None
                    ) -> TpuCompile:
    """``build(cfg)`` (an importable module-level function returning output tensors, or a :class:`Step` that also
    says which outputs update which inputs in place), compiled for ``topology``. ``donate=False`` compiles a
    :class:`Step` without its donations (every update a second copy in the outputs).

    Runs in this process when its world has the topology's chip count; otherwise in a persistent worker
    process with ``CPU_NUM_DEVICES=<chips>`` (one per chip count, reused), so a 1-device notebook can still show
    the tensor-parallel program of a 4-chip slice. With ``retarget = (trace mesh, target mesh)`` the world has the
    trace mesh's devices: ``cfg`` builds the graph on the trace mesh, and it is compiled for the target mesh
    (:func:`compile_tensors`).
    """
    topo = get_topology(topology)
    opts: dict[str, Any] = {"disable_passes": tuple(disable_passes), "debug_options": dict(debug_options or {}),
                            "label": label, "auto_spmd_mesh": tuple(auto_spmd_mesh) if auto_spmd_mesh else None,
                            "donate": bool(donate)}
    chips = topo.chips
    if retarget is not None:
        opts["retarget"] = (tuple(retarget[0]), tuple(retarget[1]))
        chips = math.prod(opts["retarget"][0])
    try:
        world = runtime.current()
    except RuntimeError:
        world = None
    if world is not None and world.num_devices == chips:
        return compile_built(build(cfg), topology, **opts)
    global CACHE_HITS, STORE_HITS
    result = worker_for(chips).compile(build, cfg, topology, opts)
    CACHE_HITS += int(result.cached)  # served from the worker's cache or the store
    STORE_HITS += int(result.stored)
    _count_compile(result)
    return result


def recompile_stored(entry: StoredCompile) -> list[str]:
    """Compile a stored entry's proto live with its options and compare with what it holds (program text, memory,
    cost analysis, out-of-memory message); the differences, empty when the store holds what the compiler says."""
    versions = check_backend()
    if entry.fields["versions"] != dict(sorted(versions.items())):
        return [f"stored with {entry.fields['versions']}, this process has {versions}"]
    if program_sha256(program_text(entry.proto)) != entry.fields["program_sha256"]:
        return ["the stored proto is not the program its key names"]
    o = entry.fields["options"]
    topo = get_topology(entry.fields["topology"])
    retarget = tuple(tuple(m) for m in o["retarget"]) if o["retarget"] else None
    live, error = _compile_live(entry.proto, entry.fields["topology"], topo, tuple(o["disable_passes"]),
                                dict(o["debug_options"]), tuple(o["auto_spmd_mesh"]) if o["auto_spmd_mesh"] else None,
                                list(o["output_shardings"]), {int(k): int(v) for k, v in o["aliases"]},
                                retarget, {}, entry.label)  # type: ignore[arg-type]
    diffs = []
    if live.hlo_text != entry.text:
        diffs.append("program text")
    if (asdict(live.memory) if live.memory else None) != entry.memory:
        diffs.append(f"memory: live {live.memory}, stored {entry.memory}")
    if live.cost != entry.cost:
        diffs.append("cost analysis")
    if error != entry.error:
        diffs.append(f"out-of-memory message: live {error!r}, stored {entry.error!r}")
    return diffs
