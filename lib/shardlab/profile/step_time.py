"""Step time of a compiled XLA:TPU program, read from the compiler's own per-kernel estimates (the ``tpu`` source).

Design
------
The TPU compiler prices every kernel it emits: each scheduled fusion (and custom call) of the per-chip program
carries ``"estimated_cycles"`` in its ``backend_config``. Collectives carry none. So one step is priced in three
parts, each beside an independent roofline:

**Compute.** ``compute_s = Σ estimated_cycles × runs(computation) / clock``. ``runs`` is how often the computation
holding the kernel executes per step: 1 for the entry, a ``while`` body its trip count (read by running the
loop's integer control, :meth:`shardlab.profile.hlo.HloModule.runs`) — a ``scan`` over L layers prints its body
once and the compiler's cost analysis counts it once, so without the trip count an L-layer stack costs one layer.
The clock is the chip's (``clock_hz`` in ``data/hardware``: the ``cycles_per_microsecond`` the compiler's
latency-hiding scheduler prints, 1500 on v5e, 1750 on v6e and v5p). Each kernel also gets a roofline:
``max(FLOPs / bf16 peak, bytes / HBM bandwidth)`` with the FLOPs of its ``dot`` / ``convolution`` instructions
(2 · result elements · contracted size) and the bytes of its operands and result; the larger term is the kernel's
**bound** (``compute`` or ``hbm``). Measured: a bf16 matmul's estimate is within ~20 % above its FLOP roofline.

**Communication.** Each logical collective (× its ``runs``) is priced with the ring model of the design contract
(wire bytes per chip: all-reduce 2(n−1)/n·payload, all-gather (n−1)·payload, reduce-scatter and all-to-all
(n−1)/n·payload, collective-permute the payload) over the ICI egress of the torus axes its group spans
(:meth:`shardlab.formulas.hardware.ChipProfile.ici_egress_for`, :func:`~shardlab.formulas.hardware.group_axes`).
β only: no per-hop latency term (α), no multi-hop penalty for all-to-all, no missing wraparound on partial
slices — the figure is a lower bound of the wire time, per mesh axis when the caller names the mesh.

**Overlap, as the schedule laid it out.** XLA:TPU issues most collectives asynchronously (a start and a done,
other work scheduled between). A collective's exposed time is ``max(0, wire time − compute scheduled inside its
window)``; a synchronous one is fully exposed. ``step_s = compute_s + exposed_comm_s``: the program's
critical path if kernels run back to back and each collective hides behind exactly the kernels the scheduler put
in its window. Bounds beside it: ``max(compute_s, comm_s)`` (perfect overlap) and ``compute_s + comm_s`` (none).

**Pallas kernels, derived.** XLA:TPU gives a ``tpu_custom_call`` (torch_xla's flash attention) no estimate, so
its time is absent from ``compute_s``. ``unpriced_roofline_s`` adds a *derived* figure for each flash kernel —
its causal attention matmul FLOPs over the bf16 peak, a roofline lower bound; the compiler gives no estimate — kept
apart from the measured ``compute_s``: ``predicted_s = step_s + unpriced_roofline_s``. The kernel kind is read
from its operands and results (the kernel body is opaque MLIR bytecode): no f32 ``[b, h, s, 128]`` statistics
after q, k, v → forward (``q·kᵀ``, ``p·v``: 2 matmuls); with them and two results (dk, dv) → the dk/dv
kernel (``q·kᵀ``, ``dO·vᵀ``, ``pᵀ·dO``, ``dSᵀ·q``: 4); with them and one result → the dq kernel (``q·kᵀ``,
``dO·vᵀ``, ``dS·k``: 3). Each matmul is ``2·b·h·s_q·s_k·d`` FLOPs with q ``[b, h, s_q, d]``, k ``[b, h, s_k, d]``
(per chip), halved for the causal mask (the kernel skips blocks above the diagonal). Any other Pallas kernel
stays in ``unpriced`` with no figure.

**Saturated estimates.** Some kernels carry ``estimated_cycles`` = 2⁶³ − 1 (measured: one kernel of the scanned
layer body of a Llama 3 8B step compiled for v5e-64 — the compiler's "no estimate", not a time). Such a kernel is
left out of ``compute_s``, named in ``StepTime.saturated``, and given its roofline
(``max(FLOPs / peak, bytes / HBM bandwidth)`` × runs) as a *derived* figure, ``saturated_roofline_s``, which
``predicted_s`` adds beside the flash term.

MFU follows MaxText's convention (``calculate_tflops_training_per_device``): model FLOPs = 6 · parameters · tokens
plus the attention score and value matmuls (12 · layers · seq² · q_heads·head_dim / 2 for causal masking, per
sequence), over step time × chips × bf16 peak — counted from the model, not read from the program, so
rematerialised FLOPs do not raise it.

Example::

    >>> est = kernel_estimates(parse_hlo(COMPILED_TEXT))            # doctest: +SKIP
    >>> st = step_time(tpu_compile, mesh={"fsdp": 8})                # doctest: +SKIP
    >>> st.step_s, st.bound                                          # doctest: +SKIP
    (0.00073, 'compute')
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from shardlab.formulas import hardware
from shardlab.profile.hlo import Collective, HloModule

_CYCLES = re.compile(r'"estimated_cycles"\s*:\s*"?(\d+)"?')
SATURATED = 2**63 - 1  # estimated_cycles of a kernel the compiler did not price (INT64_MAX): no estimate
_MATMUL_OPS = ("dot", "convolution")


@dataclass(frozen=True)
class Kernel:
    """One scheduled kernel of the per-chip program, with the compiler's estimate and a roofline beside it."""

    name: str
    computation: str
    cycles: int  # the compiler's estimate for one execution
    runs: int  # executions per step (loop trip counts multiplied)
    flops: int  # dot/convolution FLOPs of one execution (2 x result elements x contracted size)
    bytes: int  # operand + result bytes of one execution (HBM traffic if nothing stays on chip)

    def seconds(self, clock_hz: float) -> float:
        return self.cycles * self.runs / clock_hz

    def roofline_s(self, chip: hardware.ChipProfile) -> float:
        return self.runs * max(self.flops / chip.bf16_peak_flops_per_s, self.bytes / chip.hbm_bandwidth_bytes_per_s)

    def bound(self, chip: hardware.ChipProfile) -> str:
        return "compute" if self.flops / chip.bf16_peak_flops_per_s >= self.bytes / chip.hbm_bandwidth_bytes_per_s \
            else "hbm"


@dataclass(frozen=True)
class CommTime:
    """One logical collective priced on the ICI: ring wire bytes over the egress of the axes its group spans."""

    op: str
    name: str
    group_size: int
    torus_axes: int  # torus axes the group spans (0: one chip)
    mesh_axes: str  # the mesh axes the group spans, "+"-joined ("" when the caller named no mesh)
    wire_bytes: int  # per chip, one execution
    runs: int
    seconds: float  # all runs
    exposed_s: float  # all runs: what the compute scheduled in its window does not hide
    async_: bool


@dataclass
class StepTime:
    """One training step of one chip, priced from the compiled program."""

    topology: str
    clock_hz: float
    compute_s: float  # Σ kernel estimates x runs / clock
    roofline_compute_s: float  # Σ kernel rooflines (the same kernels)
    comm_s: float  # Σ collective wire times
    exposed_comm_s: float  # the part of comm_s no scheduled compute hides
    step_s: float  # compute_s + exposed_comm_s
    comm_by_axis: dict[str, float]  # mesh axes (or "torus<k>") -> seconds
    kernels: list[Kernel] = field(default_factory=list)
    collectives: list[CommTime] = field(default_factory=list)
    unknown_runs: list[str] = field(default_factory=list)  # computations whose trip count could not be read
    unpriced: list[str] = field(default_factory=list)  # Pallas kernels (tpu_custom_call): no estimate, not in compute
    # derived (roofline), the compiler gives no estimate: Σ flash kernels' causal FLOPs x runs / bf16 peak
    unpriced_roofline_s: float = 0.0
    unpriced_flash: dict[str, int] = field(default_factory=dict)  # kernel kind -> kernels x runs given that figure
    saturated: list[str] = field(default_factory=list)  # kernels with estimated_cycles = SATURATED: not in compute
    saturated_roofline_s: float = 0.0  # derived (roofline) for those: Σ max(FLOPs / peak, bytes / HBM) x runs

    @property
    def predicted_s(self) -> float:
        """``step_s`` plus the derived roofline of the kernels the compiler left unpriced (Pallas, saturated)."""
        return self.step_s + self.unpriced_roofline_s + self.saturated_roofline_s

    @property
    def overlap_bound_s(self) -> float:  # perfect overlap
        return max(self.compute_s, self.comm_s)

    @property
    def serial_s(self) -> float:  # no overlap at all
        return self.compute_s + self.comm_s

    def hbm_bound_s(self, chip: hardware.ChipProfile) -> float:
        """Seconds of the kernels whose roofline is set by HBM bandwidth (at the compiler's estimate)."""
        return sum(k.seconds(self.clock_hz) for k in self.kernels if k.bound(chip) == "hbm")

    def bound(self, chip: hardware.ChipProfile) -> str:
        """What dominates the step: ``compute`` (MXU-bound kernels), ``hbm`` (memory-bound kernels) or
        ``ici:<axes>`` (the exposed communication of the costliest axis), whichever takes the most time."""
        hbm = self.hbm_bound_s(chip)
        parts = {"compute": self.compute_s - hbm, "hbm": hbm}
        if self.comm_s > 0 and self.exposed_comm_s > 0:
            axis = max(self.comm_by_axis, key=self.comm_by_axis.get)  # type: ignore[arg-type]
            parts[f"ici:{axis}"] = self.exposed_comm_s
        return max(parts, key=parts.get)  # type: ignore[arg-type]

    def mfu(self, model_flops_per_step: float, chips: int, chip: hardware.ChipProfile) -> float:
        """Model FLOPs utilisation: model FLOPs of the whole step over (step time x chips x bf16 peak)."""
        return model_flops_per_step / (self.step_s * chips * chip.bf16_peak_flops_per_s)

    def as_dict(self) -> dict[str, Any]:
        return {"topology": self.topology, "clock_hz": self.clock_hz, "compute_s": self.compute_s,
                "roofline_compute_s": self.roofline_compute_s, "comm_s": self.comm_s,
                "exposed_comm_s": self.exposed_comm_s, "step_s": self.step_s, "comm_by_axis": self.comm_by_axis,
                "kernels": len(self.kernels), "collectives": len(self.collectives),
                "unknown_runs": self.unknown_runs, "unpriced": self.unpriced,
                "unpriced_roofline_s": self.unpriced_roofline_s, "unpriced_flash": self.unpriced_flash,
                "saturated": self.saturated, "saturated_roofline_s": self.saturated_roofline_s,
                "predicted_s": self.predicted_s}


# ------------------------------------------------------------------------------------------------ kernels
def estimated_cycles(ins: Any) -> int | None:
    """The compiler's cycle estimate of one scheduled instruction, or None when it carries none."""
    m = _CYCLES.search(ins.attrs.get("backend_config", ""))
    return int(m.group(1)) if m else None


def _dot_flops(ins: Any, module: HloModule) -> int:
    """2 x result elements x contracted size of a dot (operand shapes looked up in the module)."""
    out = math.prod(ins.shape[0].dims) if ins.shape else 0
    if ins.opcode == "dot":
        lhs = module.instructions.get(ins.operands[0])
        dims = [int(d) for d in ins.attrs.get("lhs_contracting_dims", "{}").strip("{}").split(",") if d.strip()]
        k = math.prod(lhs.shape[0].dims[d] for d in dims) if lhs is not None and lhs.shape else 1
        return 2 * out * k
    # convolution (XLA:TPU writes matmuls as convolutions): each output element contracts the kernel's input
    # features x window, i.e. the kernel's elements over its output features ('o' in dim_labels "bf_io->bf")
    rhs = module.instructions.get(ins.operands[1]) if len(ins.operands) > 1 else None
    labels = ins.attrs.get("dim_labels", "")
    if rhs is None or not rhs.shape or "_" not in labels:
        raise ValueError(f"convolution {ins.name}: cannot read its kernel shape or dim_labels={labels!r}")
    kernel_labels = labels.split("->")[0].split("_")[1]
    kernel = rhs.shape[0].dims
    taps = math.prod(kernel) // kernel[kernel_labels.index("o")]  # grouped: the kernel's i is already i/g
    # XLA:TPU writes batched and per-head matmuls as convolutions whose window meets only one real input element:
    # a window of s taps over a spatial input of n elements dilated d times meets at most min(ceil(s / d), n).
    window = ins.attrs.get("window", "")
    size = re.search(r"size=([\dx]+)", window)
    if size:
        dilate = re.search(r"lhs_dilate=([\dx]+)", window)
        sizes = [int(x) for x in size.group(1).split("x")]
        dilations = [int(x) for x in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
        lhs = module.instructions.get(ins.operands[0])
        lhs_labels = labels.split("->")[0].split("_")[0]
        for i, (s, d) in enumerate(zip(sizes, dilations, strict=True)):
            n = lhs.shape[0].dims[lhs_labels.index(str(i))] if lhs is not None and lhs.shape else s
            taps = taps // s * min(-(-s // d), n)
    return 2 * out * taps


def kernel_estimates(module: HloModule, saturated: bool = False) -> tuple[list[Kernel], list[str]]:
    """Every scheduled instruction with ``estimated_cycles`` (entry and loop bodies), with its runs per step,
    FLOPs and bytes — except those whose estimate is :data:`SATURATED` (``saturated=True``: only those). Second
    value: computations holding estimated kernels whose runs could not be read (their kernels are counted once and
    listed, never silently)."""
    out: list[Kernel] = []
    unknown: list[str] = []
    for comp, names in module.computations.items():
        estimated = [module.instructions[n] for n in names if estimated_cycles(module.instructions[n]) is not None
                     and (estimated_cycles(module.instructions[n]) == SATURATED) == saturated]
        if not estimated:
            continue
        runs = module.runs(comp)
        if runs is None:
            unknown.append(comp)
            runs = 1
        for ins in estimated:
            flops = sum(_dot_flops(i, module) for i in module.executed(ins.name) if i.opcode in _MATMUL_OPS)
            operand_bytes = sum(module.instructions[o].nbytes for o in ins.operands if o in module.instructions)
            out.append(Kernel(ins.name, comp, estimated_cycles(ins) or 0, runs, flops, operand_bytes + ins.nbytes))
    return out, unknown


def unpriced_kernels(module: HloModule) -> list[str]:
    """Pallas kernels (``tpu_custom_call``: flash attention, …) of the scheduled program: XLA:TPU gives them no
    ``estimated_cycles`` (measured with torch_xla's flash kernel), so their time is missing from ``compute_s``."""
    return [n for names in module.computations.values() for n in names
            if module.instructions[n].opcode == "custom-call"
            and "tpu_custom_call" in module.instructions[n].attrs.get("custom_call_target", "")
            and estimated_cycles(module.instructions[n]) is None]


FLASH_MATMULS = {"forward": 2, "dq": 3, "dkv": 4}  # s x s x d matmuls each flash kernel runs (module note)


def flash_kind(operands: list[Any], results: list[Any]) -> str | None:
    """``forward`` / ``dq`` / ``dkv`` for a flash-attention Pallas kernel from its operand and result arrays
    (``hlo.Array``: dtype, dims), None when the call does not look like one (q first, 4-D)."""
    if not operands or len(operands[0].dims) != 4 or len(operands) < 3 or not results:
        return None
    stats = any(a.dtype == "f32" and len(a.dims) == 4 and a.dims[:3] == operands[0].dims[:3] for a in operands[3:])
    if not stats:
        return "forward"
    return {1: "dq", 2: "dkv"}.get(len(results))


def flash_flops(kind: str, q_dims: tuple[int, ...], k_dims: tuple[int, ...], causal: bool = True) -> float:
    """FLOPs of one execution of a flash kernel of ``kind`` with q ``[b, h, s_q, d]`` and k ``[b, h, s_k, d]``.

    >>> flash_flops("forward", (1, 1, 4, 2), (1, 1, 4, 2), causal=False)  # 2 matmuls x 2·4·4·2
    128.0
    """
    b, h, sq, d = q_dims
    return FLASH_MATMULS[kind] * 2.0 * b * h * sq * k_dims[2] * d * (0.5 if causal else 1.0)


def flash_roofline(module: HloModule, topology: str, causal: bool = True) -> tuple[float, dict[str, int]]:
    """Derived (roofline) seconds of the unpriced flash kernels of ``module``: Σ flash_flops x runs / bf16 peak
    (a lower bound: the compiler gives no estimate), and kind -> kernel executions counted."""
    chip, _ = hardware.slice_chips(topology)
    total, counts = 0.0, {}
    for name in unpriced_kernels(module):
        ins = module.instructions[name]
        operands = [module.instructions[o].shape[0] for o in ins.operands
                    if o in module.instructions and module.instructions[o].shape]
        kind = flash_kind(operands, list(ins.shape))
        if kind is None:
            continue
        runs = module.runs(ins.computation) or 1
        total += flash_flops(kind, operands[0].dims, operands[1].dims, causal) * runs
        counts[kind] = counts.get(kind, 0) + runs
    return total / chip.bf16_peak_flops_per_s, counts


# ------------------------------------------------------------------------------------------------ collectives
def wire_bytes(c: Collective) -> int:
    """Per-chip bytes on the wire for one execution, ring model (the design contract's wire bytes)."""
    n = c.group_size or 1
    if c.op == "all-reduce":
        return 2 * (n - 1) * c.operand_bytes // n
    if c.op == "all-gather":
        return (n - 1) * c.operand_bytes
    if c.op in ("reduce-scatter", "all-to-all"):
        return (n - 1) * c.operand_bytes // n
    return c.operand_bytes  # collective-permute: what one chip sends


def _mesh_axes(group: list[int], mesh: dict[str, int] | None) -> str:
    """The mesh axes along which ``group``'s devices differ (row-major mesh, last axis fastest)."""
    if not mesh or len(group) < 2:
        return ""
    sizes = list(mesh.values())

    def coords(d: int) -> list[int]:
        return [(d // math.prod(sizes[j + 1:])) % s for j, s in enumerate(sizes)]

    cs = [coords(d) for d in group]
    return "+".join(a for j, a in enumerate(mesh) if len({c[j] for c in cs}) > 1)


def _window_compute_s(module: HloModule, c: Collective, kernels: dict[str, Kernel], clock_hz: float) -> float:
    """Seconds of estimated kernels the schedule put between the collective's start and done (one execution)."""
    order = module.computations.get(c.computation, [])
    if not c.async_ or c.start not in order or c.done not in order:
        return 0.0
    between = order[order.index(c.start) + 1: order.index(c.done)]
    return sum(kernels[n].cycles for n in between if n in kernels) / clock_hz


def collective_times(module: HloModule, topology: str, clock_hz: float, kernels: list[Kernel],
                     mesh: dict[str, int] | None = None) -> list[CommTime]:
    chip, _ = hardware.slice_chips(topology)
    by_name = {k.name: k for k in kernels}
    out = []
    for c in module.collectives:
        runs = module.runs(c.computation) or 1
        group = c.replica_groups[0] if c.replica_groups else []
        if c.op == "collective-permute" and c.source_target_pairs:
            group = sorted({d for pair in c.source_target_pairs for d in pair})
        axes = hardware.group_axes(topology, group) if len(group) > 1 else 0
        wire = wire_bytes(c)
        one = wire / chip.ici_egress_for(axes) if axes else 0.0
        if c.op == "collective-permute" and axes:
            one = wire / (chip.ici_link_bytes_per_s / 2)  # one link, one way
        hidden = _window_compute_s(module, c, by_name, clock_hz)
        out.append(CommTime(c.op, c.name, len(group), axes, _mesh_axes(group, mesh), wire, runs, one * runs,
                            max(0.0, one - hidden) * runs, c.async_))
    return out


# ------------------------------------------------------------------------------------------------ the step
def clock_hz(topology: str) -> float:
    """The chip's clock as the compiler's scheduler states it (``clock_hz`` of the generation's profile)."""
    chip, _ = hardware.slice_chips(topology)
    data = json.loads((hardware.hardware_dir() / f"{chip.name}.json").read_text())
    if "clock_hz" not in data:
        raise ValueError(f"{chip.name}: no clock_hz in its hardware profile; the step time cannot be priced")
    return float(data["clock_hz"])


def step_time(module: HloModule, topology: str, mesh: dict[str, int] | None = None) -> StepTime:
    """Price one execution of the compiled per-chip ``module`` (a :class:`TpuCompile`'s ``module``) for
    ``topology``; ``mesh`` (``{axis: size}``, row-major as the suite's meshes) names each collective's axes."""
    chip, _ = hardware.slice_chips(topology)
    clock = clock_hz(topology)
    kernels, unknown = kernel_estimates(module)
    comms = collective_times(module, topology, clock, kernels, mesh)
    by_axis: dict[str, float] = {}
    for t in comms:
        key = t.mesh_axes or f"torus{t.torus_axes}"
        by_axis[key] = by_axis.get(key, 0.0) + t.seconds
    compute = sum(k.seconds(clock) for k in kernels)
    exposed = sum(t.exposed_s for t in comms)
    flash_s, flash_counts = flash_roofline(module, topology)  # the suite's flash attention is causal
    sat, _ = kernel_estimates(module, saturated=True)
    return StepTime(topology, clock, compute, sum(k.roofline_s(chip) for k in kernels), sum(t.seconds for t in comms),
                    exposed, compute + exposed, by_axis, kernels, comms, unknown, unpriced_kernels(module),
                    flash_s, flash_counts, [k.name for k in sat], sum(k.roofline_s(chip) for k in sat))


def model_flops(num_params: int, tokens: int, *, layers: int = 0, seq: int = 0, attn_dim: int = 0,
                causal: bool = True) -> float:
    """Training FLOPs of one step, MaxText's convention: 6·N·tokens for the weights plus the attention score and
    value matmuls, 12·layers·seq·attn_dim per token (forward 2 matmuls x 2 FLOPs, backward 2x that), halved when
    causal; ``attn_dim`` = query heads x head dim.

    >>> model_flops(1000, 10)
    60000.0
    >>> model_flops(0, 4, layers=1, seq=4, attn_dim=2, causal=False)
    384.0
    """
    attention = 12.0 * layers * seq * attn_dim * tokens * (0.5 if causal else 1.0)
    return 6.0 * num_params * tokens + attention
