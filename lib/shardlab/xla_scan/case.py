"""scan over layers as cases: the stacked step, the ``nn.Linear`` trap, ``shard_as`` on its own.

Design
------
Each case holds notebook 06's parameters ``p`` (:class:`shardlab.params.ScanParams`) and the variant it shows, on
the mesh (fsdp, tensor) = (``p.mesh_fsdp``, ``p.mesh_tensor``); :mod:`shardlab.harness` runs it through the views.
There is no ledger: scan is a property of one compiled program, not of per-rank code::

    ScanCase(p, layers, mode, shard_as, layout)   L blocks, forward + backward (loop, scan_layers or scan)
    TrapCase(p, kind)                             x[b_fsdp, s_tensor, h] · W[F, h]ᵀ through F.linear or einsum
    ShardAsCase(p, shard_as)                      a[16_fsdp, 32_tensor] annotated, b = 2·ones not: how b comes out

Values of a pre-stacked :class:`ScanCase` (the notebook puts them under a prefix such as ``shard_as.off``)::

    stacked_grads.bytes             per-device bytes of all stacked gradients           formula, hlo, tpu
    grad_shape.<weight>             per-device shape of the stacked gradient, "[L, ...]" formula, hlo, tpu
    grad_fsdp.<op>.{count,bytes,elements}   reductions over fsdp in the backward body   formula, hlo, tpu
    grad_spec                       XLA's sharding string of W_up's stacked gradient    hlo
    while_state.bytes               per-device bytes of the backward While's state      hlo, tpu (not compared)
    buffers.total.bytes             XLA:CPU buffer assignment total                     hlo

With the seed's layout both result dims of ``dW_up = xᵀ[h_tensor, b_fsdp]·dh[b_fsdp, F_tensor]`` ask for tensor
(the conflicting-axis matmul), and which dim of a 1-D gradient keeps the tensor split is the compiler's choice:
the views then add ``grad_sharding.<weight>`` ("1-D" / "2-D", compared) and record a 1-D gradient's shape without
comparing it.

Checks every compiler view carries (they hold for every legal configuration): each gradient is tiled like its
weight (shard_as on) or like its weight with the fsdp split removed (off; with the seed's layout: either 1-D
tiling); the backward While's loop state holds an array of exactly each stacked gradient's per-device shape (the
one carried sharding *is* the stack's); every mode's result equals the CPU for-loop oracle. The loop and
scan_layers cases add no values: the compile-time sweep reads their programs (:func:`record_sweep`).

The functions after the cases are what notebook 06 measures beyond one case's views (the sweep, the OFF/ON
contrast, the transposed mesh, per-layer gradient specs, trace transfers, the explorer's run).
torch_xla is imported at the top: import this module after ``shardlab.runtime.setup()`` (the notebooks' order).

Example::

    off = ScanCase(p, layers=4, shard_as=False)
    harness.record(rec, "shard_as.off", *harness.views(off, ("formula", "hlo", "tpu")))
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, ClassVar

import pandas as pd
import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch_xla.distributed.spmd.xla_sharding import XLAPatchedLinear, shard_as

from shardlab import harness, runtime
from shardlab.case import Case, Checks
from shardlab.formulas import scan as FS
from shardlab.formulas.common import dtype_bytes
from shardlab.params import ScanParams
from shardlab.profile.hlo import Collective, HloModule
from shardlab.profile.record import Recorder
from shardlab.views import View, collectives_view, merge, traffic
from shardlab.xla_scan import measure as X
from shardlab.xla_scan import model as M
from shardlab.xla_scan import patches as P
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.patches import shard_as_enabled

MODES = M.MODES
GRAD_OPS = ("all_reduce", "reduce_scatter")
PARITY_RTOL = 1e-5  # max |xla - cpu loop| / max |cpu loop|: XLA reorders float32 sums, a real bug is O(1)
SOURCE_LABEL = {"formula": "formula", "hlo": "XLA:CPU", "tpu": "XLA:TPU"}


def mesh_problem(p: ScanParams, num_devices: int) -> str | None:
    """Why the CPU views cannot run ``p``'s mesh in this process (None: they can)."""
    f, t = p.mesh_fsdp, p.mesh_tensor
    if f * t != num_devices:
        return f"the mesh (fsdp={f}, tensor={t}) needs {f * t} devices; this process has num_devices={num_devices}"
    return None


def _shape_str(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _root_shapes(module: HloModule) -> list[tuple[str, tuple[int, ...]]]:
    root = next(module.instructions[n] for n in module.computations[module.entry] if module.instructions[n].is_root)
    return [(a.dtype, tuple(a.dims)) for a in root.shape]


@dataclass(frozen=True)
class MeshCase(Case):
    """A case on ``p``'s (fsdp, tensor) mesh, which spans exactly fsdp·tensor devices."""

    p: ScanParams

    ops: ClassVar[tuple[str, ...]] = ()  # the collectives this topic reads are its own (``read``)
    size_name: ClassVar[str] = "mesh_fsdp·mesh_tensor"

    @property
    def devices(self) -> int:
        return self.p.mesh_fsdp * self.p.mesh_tensor

    def mesh_problem(self, num_devices: int) -> str | None:
        return mesh_problem(self.p, num_devices)


# --------------------------------------------------------------------------------------------- the stack
def stacked_dim_axes(weight: str) -> tuple[str | None, ...]:
    """Mesh axis of each dim of a stacked weight ``[L, d_in, d_out]`` (the layer axis is not split)."""
    return (None, *S.WEIGHT_SPECS[weight])


@lru_cache(maxsize=8)
def _reference(layers: int, hidden: int, ffn: int, batch: int, seq: int, seed: int
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The CPU loop oracle, computed once per size: every mode at the same L shares it (read-only)."""
    return M.reference(M.init_weights(layers, hidden, ffn, seed), M.init_input(batch, seq, hidden, seed))


@dataclass(frozen=True)
class ScanCase(MeshCase):
    """One forward + backward step of L blocks on the (fsdp, tensor) mesh (loss mean(out²))."""

    layers: int
    mode: str = "scan"  # "loop" | "scan_layers" | "scan" (pre-stacked weights)
    shard_as: bool = True  # torch_xla's shard_as in scan's backward (off: the behaviour before the fix)
    layout: str = "batch"  # the activations (sharding.ACT_LAYOUTS): "batch" x[b_fsdp, s, h]; "seed" x[b_fsdp, s, h_t]
    trace: dict[str, float] = field(default_factory=dict, init=False, compare=False, repr=False)  # graph() writes {"s"}

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {MODES}")
        M.check_sizes(layers=self.layers)
        S.check_sharding(self.p, self.layout)

    @property
    def phase(self) -> str:
        layout = "" if self.layout == "batch" else f" layout {self.layout}"
        return f"{self.mode} L={self.layers}{layout} shard_as {self.tag}"

    @property
    def tag(self) -> str:
        return "on" if self.shard_as else "off"

    @property
    def weight_shapes(self) -> dict[str, tuple[int, int]]:
        return M.weight_shapes(self.p.hidden, self.p.ffn)

    def expected_grad_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-device shape of each stacked gradient: like the weight (on) or all-reduced over fsdp (off)."""
        return {w: FS.per_device_shape((self.layers, *shape), stacked_dim_axes(w), self.p.mesh_fsdp,
                                       self.p.mesh_tensor, "2d" if self.shard_as else "1d")
                for w, shape in self.weight_shapes.items()}

    def grad_kind(self, weight: str, shape: tuple[int, ...]) -> str:
        """``"2-D"`` (split over fsdp and tensor, either orientation), ``"1-D"`` (tensor on one of the two dims,
        fsdp gone) or ``"other"``: how a per-device stacked gradient shape ``[L, ·, ·]`` is sharded."""
        L, d_in, d_out = self.layers, *self.weight_shapes[weight]
        f, t = self.p.mesh_fsdp, self.p.mesh_tensor
        two = {(L, -(-d_in // f), -(-d_out // t)), (L, -(-d_in // t), -(-d_out // f))}
        one = {(L, -(-d_in // t), d_out), (L, d_in, -(-d_out // t))}
        return "2-D" if tuple(shape) in two else "1-D" if tuple(shape) in one else "other"

    def _require_scan(self) -> None:
        if self.mode != "scan":
            raise ValueError(f"mode={self.mode!r}: the views compare the pre-stacked scan (mode='scan'), whose "
                             "gradients are one stacked [L, ...] array per weight")

    # ------------------------------------------------------------------------------------------ formula
    def formula(self) -> View:
        """Per-device stacked-gradient shapes and bytes, and the reduction over fsdp that finishes each dW."""
        self._require_scan()
        p = self.p
        if p.mesh_fsdp == 1:
            return View.skip("formula", "mesh_fsdp=1: the batch is not split, nothing reduces the gradients over fsdp")
        shapes = self.expected_grad_shapes()
        weights = list(self.weight_shapes.values())
        saving = FS.shard_as_saving(self.layers, weights, p.mesh_fsdp, p.mesh_tensor)
        red = FS.grad_reduction(weights, p.mesh_fsdp, p.mesh_tensor, self.shard_as)
        view = View("formula", detail={"saving": saving, "reduction": red, "grad_shapes": shapes})
        view.add("stacked_grads.bytes", saving.on_bytes if self.shard_as else saving.off_bytes, "bytes")
        if sum(math.prod(s) for s in shapes.values()) * dtype_bytes(self.dtype) != view["stacked_grads.bytes"]:
            raise AssertionError(f"per-device shapes {shapes} disagree with shard_as_saving {saving}")  # one formula
        for w, shape in shapes.items():
            if self.layout == "seed":  # 1-D: which dim keeps tensor is the compiler's choice; 2-D: the weight's
                view.add(f"grad_sharding.{w}", "2-D" if self.shard_as else "1-D", "kind")
                if not self.shard_as:
                    continue
            view.add(f"grad_shape.{w}", _shape_str(shape), "shape")
        return traffic(view, "grad_fsdp", {red.op: red.count}, {red.op: red.operand_bytes}, "float32", GRAD_OPS)

    # ---------------------------------------------------------------------------------------- the program
    def graph(self) -> list[torch.Tensor]:
        """The step on the current world, NOT synced: [out, x.grad, grad of each weight (w_up's, then w_down's)]."""
        model, x = X.prepare(self.p, self.layers, self.mode, self.layout)
        t0 = time.perf_counter()
        with shard_as_enabled(self.shard_as):
            out = model(x)  # [b, s, h]
            M.loss_fn(out).backward()
        self.trace["s"] = time.perf_counter() - t0  # Python wall time to build the lazy forward + backward graph
        return [out, x.grad, *[w.grad for ws in model.weights().values() for w in ws]]  # type: ignore[operator]

    def oracle(self) -> dict[str, torch.Tensor]:
        """The CPU for-loop: output [b, s, h], stacked gradients [L, ...] and the input gradient."""
        p = self.p
        out, grads = _reference(self.layers, p.hidden, p.ffn, p.batch, p.seq, p.seed)
        return {"out": out, **grads}

    def parity(self, source: str, got: list[torch.Tensor], ref: dict[str, torch.Tensor]) -> Checks:
        # approximate: XLA reorders float32 sums; relative to the largest reference value, a real bug is O(1)
        n = (len(got) - 2) // 2  # per weight: 1 stacked gradient, or L per-layer ones
        mine = {"out": got[0], "x": got[1]} | {w: torch.stack(got[2 + i * n:2 + (i + 1) * n]).reshape(ref[w].shape)
                                               for i, w in enumerate(M.WEIGHT_NAMES)}
        rel = max(float((mine[k].detach() - ref[k]).abs().max() / ref[k].abs().max()) for k in mine)
        return {f"parity.{source}": (rel < PARITY_RTOL, f"max |xla - cpu loop| / max |cpu loop|, output and "
                                                         f"gradients: {rel:.2e}")}

    # ------------------------------------------------------------------------------------ reading programs
    def read(self, view: View, module: HloModule) -> View:
        if self.mode != "scan":
            return view  # the sweep reads the loop's and scan_layers' programs itself
        if view.source == "hlo":
            return self._read_cpu(view, module)
        outs = _root_shapes(module)[2:]  # [out, x.grad, *grads]
        names = list(self.weight_shapes)
        if len(outs) != len(names):
            raise AssertionError(f"TPU program returns {len(outs)} gradients, expected {names}")
        self._grad_views(view, module, {w: s for w, (_, s) in zip(names, outs, strict=True)})
        state = module.while_loops[-1].state
        view.add("while_state.bytes", module.while_loops[-1].state_bytes, "bytes")
        low = sum(a.dtype == "bf16" for a in state)
        view.differs["while_state.bytes"] = (
            f"XLA:TPU's backward loop state is its own ({len(state)} arrays, {low} of them bf16 in this f32 model); "
            "the totals are not compared across compilers — each must hold the stacked gradients (checked)")
        return view

    def _read_cpu(self, view: View, module: HloModule) -> View:
        p, specs = self.p, grad_specs(view)
        shapes = {w: tuple(math.ceil(d / t) for d, t in zip((self.layers, *shape), S.parse_spec(specs[w][0], 3).tiles,
                                                             strict=True))
                  for w, shape in self.weight_shapes.items()}
        self._grad_views(view, module, shapes)
        grads = view.detail.result[2:]
        nbytes = sum(S.local_bytes(g.shape, S.spec_of(g), g.element_size()) for g in grads)
        if nbytes != view["stacked_grads.bytes"]:
            raise AssertionError(f"grad bytes {nbytes} vs shapes {shapes}")  # two readings of one spec
        view.add("grad_spec", specs["w_up"][0], "spec")
        view.add("while_state.bytes", module.while_loops[-1].state_bytes, "bytes")
        view.add("buffers.total.bytes", module.buffers.total if module.buffers else 0, "bytes")
        size = {"fsdp": p.mesh_fsdp, "tensor": p.mesh_tensor}
        t = p.mesh_tensor
        for w in self.weight_shapes:
            want = tuple(size[a] if a is not None and (self.shard_as or a != "fsdp") else 1
                         for a in stacked_dim_axes(w))
            got = S.parse_spec(specs[w][0], 3).tiles
            if self.layout == "batch":
                view.checks[f"grad_tiles.{w}"] = (got == want, f"{specs[w][0]}: tiles {got}, want {want} (the "
                                                  "weight's " + ("tiling)" if self.shard_as else
                                                                "tiling without its fsdp split)"))
            else:  # the seed's layout: the weight's 2-D tiling, or tensor on either dim (1-D)
                legal = {tuple(size[a] if a else 1 for a in stacked_dim_axes(w)), (1, t, 1), (1, 1, t)}
                view.checks[f"grad_tiles.{w}"] = (got in legal, f"{specs[w][0]}: tiles {got}, one of {sorted(legal)} "
                                                  "(the weight's 2-D tiling, or tensor on one dim)")
        return view

    def _grad_views(self, view: View, module: HloModule, shapes: dict[str, tuple[int, ...]]) -> View:
        """Values and checks shared by the two compiler views, from one program and its per-device grad shapes."""
        view.add("stacked_grads.bytes", sum(math.prod(s) for s in shapes.values()) * dtype_bytes(self.dtype), "bytes")
        for w, shape in shapes.items():
            view.add(f"grad_shape.{w}", _shape_str(shape), "shape")
        # Both compilers may finish a reduce-scatter as an all-reduce whose result a dynamic-slice cuts to the device's
        # share (XLA:CPU always; XLA:TPU for some shapes, measured at h=32, F=64): count each as what it does.
        reductions = fsdp_reductions(module, self.p.mesh_fsdp, self.p.mesh_tensor)
        red = collectives_view(view.source, SimpleNamespace(collectives=reductions), "grad_fsdp", GRAD_OPS,
                               "float32", cpu_reduce_scatter=True)
        for name, value in red.values.items():
            view.add(name, value, red.units[name])
        view.differs.update(red.differs)
        if view.source == "hlo":
            view.notes += red.notes
        else:
            lowered = sum(c.op == "all-reduce" and c.feeds_dynamic_slice for c in reductions)
            if lowered:
                view.notes.append(f"grad_fsdp.reduce_scatter: XLA:TPU finished {lowered} of them as an all-reduce + "
                                  "dynamic-slice (counted as the reduce-scatter it implements), the others natively")
        state = {tuple(a.dims) for a in module.while_loops[-1].state}
        missing = {w: s for w, s in shapes.items() if tuple(s) not in state}
        view.checks[f"while_state.holds_stacked_grads.{view.source}"] = (
            not missing, f"backward While state holds {sorted(shapes.values())}" if not missing
            else f"no loop-state array of shape {missing}; state arrays {sorted(state)}")
        if self.layout == "seed":
            self._seed_layout_values(view, module, shapes)
        return view

    def _seed_layout_values(self, view: View, module: HloModule, shapes: dict[str, tuple[int, ...]]) -> None:
        """With the seed's layout: each gradient's kind (compared with the formula's); a 1-D gradient's shape is
        recorded, not compared (its orientation is the compiler's choice). Where shard_as asked for 2-D and this
        compiler left a gradient 1-D, the values that follow from it are recorded with what its program shows."""
        compiler = "XLA:CPU" if view.source == "hlo" else "XLA:TPU"
        for w, shape in shapes.items():
            kind = self.grad_kind(w, shape)
            view.add(f"grad_sharding.{w}", kind, "kind")
            if kind == "1-D":
                kept = M.WEIGHT_DIMS[w][1 if shape[1] == self.weight_shapes[w][0] else 0]
                view.differs[f"grad_shape.{w}"] = (
                    f"1-D: both result dims of d{w} ask for tensor and {compiler} kept it on {kept}; either 1-D "
                    "tiling holds the same bytes (recorded, not compared)")
        want = self.formula()
        one_d = [w for w in shapes if view[f"grad_sharding.{w}"] != want[f"grad_sharding.{w}"]]
        if not (self.shard_as and one_d):
            return  # anything else that differs from the formula fails the comparison
        fsdp = [r for r in backward_reductions(module, self.p.mesh_fsdp, self.p.mesh_tensor) if r.endswith(" fsdp")]
        why = (f"shard_as asked for 2-D; {compiler} left {', '.join(one_d)} 1-D (measured): its backward body "
               f"reduces over fsdp with {', '.join(fsdp)} instead of one reduce-scatter per weight")
        for name, value in view.values.items():
            if name not in view.differs and want.get(name) is not None and value != want[name]:
                view.differs[name] = why


def grad_specs(view: View) -> dict[str, list[str]]:
    """XLA's sharding string of each weight gradient the CPU program returned: ``{weight: [spec per tensor]}``
    (one stacked tensor per weight for scan, one per layer for loop and scan_layers)."""
    grads = view.detail.result[2:]
    n = len(grads) // len(M.WEIGHT_NAMES)
    return {w: [S.spec_of(g) for g in grads[i * n:(i + 1) * n]] for i, w in enumerate(M.WEIGHT_NAMES)}


# ------------------------------------------------------------------------------------------- reading programs
def mesh_axis(group: list[int], fsdp: int, tensor: int) -> str:
    """Which mesh axis a replica group spans (device d sits at (d // tensor, d % tensor) of the mesh)."""
    coords = {(d // tensor, d % tensor) for d in group}
    if len(group) == fsdp * tensor and fsdp > 1 and tensor > 1:
        return "fsdp+tensor"
    if len({t for _, t in coords}) == 1 and len(group) == fsdp:
        return "fsdp"
    if len({f for f, _ in coords}) == 1 and len(group) == tensor:
        return "tensor"
    return "other"


def _kind(c: Collective) -> str:
    """A collective as the operation it performs (XLA:CPU's all-reduce + dynamic-slice is a reduce-scatter)."""
    return "reduce-scatter" if c.op == "all-reduce" and c.feeds_dynamic_slice else c.op


def backward_body_collectives(module: HloModule) -> list[Collective]:
    """Collectives scheduled in the backward While body (the module's last While consumes the forward's)."""
    if not module.while_loops:
        raise ValueError("the program has no While loop (XLA removes one that runs once: use L >= 2)")
    body = module.while_loops[-1].body
    return [c for c in module.collectives if c.computation == body]


def backward_reductions(module: HloModule, fsdp: int, tensor: int) -> list[str]:
    """``"<op> <axis>"`` for every reduction (all-reduce / reduce-scatter) in the backward body, one per operand."""
    out = []
    for c in backward_body_collectives(module):
        if _kind(c) in ("all-reduce", "reduce-scatter"):
            out += [f"{_kind(c)} {mesh_axis(c.replica_groups[0], fsdp, tensor)}"] * c.operands
    return sorted(out)


def fsdp_reductions(module: HloModule, fsdp: int, tensor: int) -> list[Collective]:
    """The backward body's reductions over the fsdp axis (those that finish the weight gradients)."""
    return [c for c in backward_body_collectives(module) if _kind(c) in ("all-reduce", "reduce-scatter")
            and mesh_axis(c.replica_groups[0], fsdp, tensor) == "fsdp"]


def what_shard_as_changed(off: View, on: View, p: ScanParams) -> tuple[str, str]:
    """(reductions only the OFF program has, reductions only the ON program has) in the backward body, each a
    ``"<op> <axis>"`` string (several joined by ", "): the measured answer to "what did shard_as change"."""
    a = Counter(backward_reductions(off.detail.module, p.mesh_fsdp, p.mesh_tensor))
    b = Counter(backward_reductions(on.detail.module, p.mesh_fsdp, p.mesh_tensor))
    return ", ".join(sorted(set((a - b).elements()))), ", ".join(sorted(set((b - a).elements())))


# ------------------------------------------------------------------------------------------ compile sweep
def sweep_cases(p: ScanParams) -> list[ScanCase]:
    """Every mode at every L of ``p.layers_sweep`` (shard_as on): the compile-time sweep's cases."""
    return [ScanCase(p, layers=n, mode=mode) for n in sorted(set(p.layers_sweep)) for mode in MODES]


def record_sweep(rec: Recorder, sweep: list[tuple[ScanCase, View]]) -> pd.DataFrame | None:
    """Record the CPU compiler views of every (mode, L): compile / trace / execute seconds (timings), program size,
    parity with the loop oracle; check that pre-stacked scan's program is the same at every L and the others grow.
    A DataFrame of the rows (None, and a skip recorded, when the mesh does not tile this process)."""
    ran = [(c, v) for c, v in sweep if v.ran]
    if not ran:
        harness.record(rec, "scan", sweep[0][1] if sweep else View.skip("hlo", "no layers"))
        return None
    rows = []
    for c, v in sorted(ran, key=lambda cv: (cv[0].layers, MODES.index(cv[0].mode))):
        cap, name = v.detail, f"{c.mode}.L{c.layers}"
        ok, detail = v.checks["parity.hlo"]
        rec.check(f"parity.{name}", ok, detail)
        compile_s = harness.record_compile_s(rec, f"scan.compile_s.{name}", v).get("metrics", 0.0)
        execute_s = cap.metrics.execute_s
        rec.measure(f"scan.trace_s.{name}", c.trace["s"], "s", "timer", kind="timing")
        rec.measure(f"scan.execute_s.{name}", execute_s, "s", "metrics", kind="timing")
        size = rec.measure(f"scan.hlo_instructions.{name}", X.graph_size(cap.module), "instructions", "hlo")
        rows.append({"mode": c.mode, "layers": c.layers, "trace_s": c.trace["s"], "compile_s": compile_s,
                     "execute_s": execute_s, "hlo_instructions": size,
                     "hlo_instructions_raw": cap.module.instruction_count, "max_rel_err": detail.rsplit(" ", 1)[-1],
                     "stacked_grads.bytes": v.get("stacked_grads.bytes")})
    size = {m: [r["hlo_instructions"] for r in rows if r["mode"] == m] for m in MODES}
    rec.check("scan.hlo_instructions.scan.constant_in_L", len(set(size["scan"])) == 1, f"scan sizes {size['scan']}")
    if len(size["loop"]) > 1:
        for m in ("loop", "scan_layers"):
            grows = all(a < b for a, b in zip(size[m], size[m][1:], strict=False))
            rec.check(f"scan.hlo_instructions.{m}.grows_with_L", grows, f"{m} sizes {size[m]}")
    return pd.DataFrame(rows)


def devices_sweep(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame | None:
    """Compile time and program size of the scan step vs device count: one fresh process per count n, mesh
    (fsdp = n, tensor = 1). Records each point and checks that every count above 1 compiles the same program."""
    if not p.devices_sweep:
        print("devices_sweep=[]: skipped (each device count needs a fresh process, 10-30 s apiece); "
              "run with devices_sweep=[1, 2, 4, 8]")
        return None
    rows = []
    for d in X.compile_vs_devices(p, layers, "scan", tuple(p.devices_sweep)):
        n = d["num_devices"]
        rows.append({"devices": n, "compile_s": d["compile_s"], "hlo_instructions": d["hlo_instructions"]})
        rec.measure(f"scan.compile_s_vs_devices.scan.L{layers}.D{n}", d["compile_s"], "s", "metrics", kind="timing")
        rec.measure(f"scan.hlo_instructions_vs_devices.scan.L{layers}.D{n}", d["hlo_instructions"], "instructions",
                    "hlo")
    multi = {r["hlo_instructions"] for r in rows if r["devices"] > 1}
    rec.check("scan.hlo_instructions_vs_devices.same_program", len(multi) <= 1, str(rows))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ shard_as on / off
def shard_as_views(rec: Recorder, p: ScanParams, layout: str = "batch") -> tuple[dict[str, list[View]], pd.DataFrame]:
    """The pre-stacked scan at L = ``p.layers`` with shard_as on and off through the formula, XLA:CPU and XLA:TPU
    views, recorded as ``shard_as.<on|off>`` (``shard_as.seed_layout.<on|off>`` for the seed's layout):
    ``({"on": views, "off": views}, the recorded values side by side)``."""
    prefix = "shard_as" if layout == "batch" else f"shard_as.{layout}_layout"
    views, frames = {}, []
    for tag in ("on", "off"):
        case = ScanCase(p, p.layers, shard_as=tag == "on", layout=layout)
        views[tag] = harness.views(case, ("formula", "hlo", "tpu"))
        # the batch layout prints its notes and differences (record's default); the seed's, only the skips (its
        # differences are the orientation notes layout_notes prints once each)
        frames.append(harness.record(rec, f"{prefix}.{tag}", *views[tag], show=layout == "batch"))
        if layout != "batch":
            for v in views[tag]:
                if not v.ran:
                    print(f"[{v.source}] {prefix}.{tag} skipped: {v.skipped}")
    return views, pd.concat(frames, ignore_index=True)


def layout_frame(views: dict[str, list[View]]) -> pd.DataFrame:
    """Per compiler and shard_as: how each stacked gradient leaves the backward loop (per-device shape, 1-D / 2-D)
    and the reductions over fsdp that finish them — the compact table of :func:`shard_as_views`' result."""
    cols: dict[str, dict[str, Any]] = {}
    for tag in ("off", "on"):
        for v in views[tag]:
            if not v.ran:
                continue
            col = {}
            for w in M.WEIGHT_NAMES:
                col[f"{w} gradient"] = v.get(f"grad_shape.{w}", "1-D (either dim)") + \
                    (f" {v[f'grad_sharding.{w}']}" if f"grad_sharding.{w}" in v.values else "")
            for op in GRAD_OPS:
                n = v.get(f"grad_fsdp.{op}.operands", v.get(f"grad_fsdp.{op}.count"))
                col[f"{op.replace('_', '-')}s over fsdp"] = n
            col["stacked gradients B"] = v.get("stacked_grads.bytes")
            cols[f"{SOURCE_LABEL[v.source]} · {tag}"] = col
    return pd.DataFrame(cols, dtype=object)


def layout_notes(views: dict[str, list[View]]) -> None:
    """Print, once each, why a compiler view's value was recorded without being compared (the 1-D orientation, a
    gradient left 1-D although shard_as asked for 2-D)."""
    seen: set[str] = set()
    for tag in ("off", "on"):
        for v in views[tag]:
            for name, why in v.differs.items():
                if name.startswith(("grad_shape.", "grad_sharding.")) and why not in seen:
                    seen.add(why)
                    print(f"[{SOURCE_LABEL[v.source]}, shard_as {tag}] {why}")


def contrast(rec: Recorder, on: list[View], off: list[View]) -> pd.DataFrame:
    """Per compiler that ran: OFF/ON ratios recorded, "OFF holds more" checked, XLA:TPU compile seconds recorded;
    a DataFrame of on vs off. XLA:CPU: backward While state and buffer-assignment total; XLA:TPU: backward While
    state and program outputs (the stacked gradients leave the program as outputs)."""
    cols: dict[str, dict[str, Any]] = {}
    for v_on, v_off in zip(on, off, strict=True):
        if v_on.source not in ("hlo", "tpu") or not (v_on.ran and v_off.ran) or not v_on.get("stacked_grads.bytes"):
            continue
        src = v_on.source
        pairs = {"while_state": (v_off["while_state.bytes"], v_on["while_state.bytes"])}
        if src == "hlo":
            pairs["buffers.total"] = (v_off["buffers.total.bytes"], v_on["buffers.total.bytes"])
        else:
            pairs["outputs"] = (v_off.detail.memory.output, v_on.detail.memory.output)
            for tag, v in (("on", v_on), ("off", v_off)):
                harness.record_compile_s(rec, f"shard_as.{tag}.tpu_compile_s", v)
        for label, (a, b) in pairs.items():
            rec.measure(f"shard_as.off_on_ratio.{label}", a / b, "x", src)
            rec.check(f"shard_as.off_exceeds_on.{label}.{src}", a > b, f"off {a} B > on {b} B per device")
        for i, (tag, v) in enumerate((("off", v_off), ("on", v_on))):
            col = {k: v.get(k) for k in ("grad_shape.w_up", "grad_shape.w_down", "stacked_grads.bytes")}
            cols[f"{src} · {tag}"] = col | {f"{label} B": pair[i] for label, pair in pairs.items()}
    return pd.DataFrame(cols, dtype=object)


def layer_grad_specs(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame | None:
    """``scan_layers`` returns per-layer gradients: their W_up specs with shard_as on and off, recorded and checked
    (each layer's gradient tiled like its weight, or like it without the fsdp split). None when skipped."""
    size = {"fsdp": p.mesh_fsdp, "tensor": p.mesh_tensor}
    specs = {}
    for tag, flag in (("on", True), ("off", False)):
        view = harness.hlo(ScanCase(p, layers, mode="scan_layers", shard_as=flag))
        if not view.ran:
            return None
        specs[tag] = grad_specs(view)["w_up"]
        want = tuple(size[a] if flag or a != "fsdp" else 1 for a in S.WEIGHT_SPECS["w_up"])
        tiles = (all(S.parse_spec(sp, 2).tiles == want for sp in specs[tag]),
                 f"{specs[tag]}: want tiles {want} for every layer")
        view = View("hlo", {"layer_grad_spec": specs[tag][0]}, {"layer_grad_spec": "spec"},
                    checks={"layer_grad_tiles": tiles})
        harness.record(rec, f"shard_as.{tag}", view, show=False)
    return pd.DataFrame({"per-layer W_up gradient spec (scan_layers)": {k: v[0] for k, v in specs.items()},
                         "layers with this spec": {k: f"{v.count(v[0])} of {len(v)}" for k, v in specs.items()}})


def transposed(rec: Recorder, p: ScanParams, layers: int) -> pd.DataFrame:
    """The same step on the transposed mesh (fsdp and tensor sizes swapped), compiled by XLA:TPU: the OFF/ON ratio
    of the stacked gradients is the fsdp size, so it changes. Formula vs tpu, recorded; a DataFrame."""
    q = replace(p, mesh_fsdp=p.mesh_tensor, mesh_tensor=p.mesh_fsdp)
    prefix = f"shard_as.mesh{q.mesh_fsdp}x{q.mesh_tensor}"
    views = {flag: harness.views(ScanCase(q, layers, shard_as=flag), ("formula", "tpu")) for flag in (True, False)}
    cols = {}
    for flag, (f, t) in views.items():
        tag = "on" if flag else "off"
        if f.ran and t.ran:
            harness.record(rec, f"{prefix}.{tag}", f, t, show=False)
        cols[f"shard_as {tag}"] = {"tpu grad_shape.w_up": t.get("grad_shape.w_up"),
                                   "tpu stacked_grads.bytes": t.get("stacked_grads.bytes")}
    t_on, t_off = views[True][1], views[False][1]
    for tag, v in (("on", t_on), ("off", t_off)):
        harness.record_compile_s(rec, f"{prefix}.{tag}.tpu_compile_s", v)
    if t_on.ran and t_off.ran and t_on.get("stacked_grads.bytes"):
        weights = list(M.weight_shapes(q.hidden, q.ffn).values())
        ratio = FS.shard_as_saving(layers, weights, q.mesh_fsdp, q.mesh_tensor).ratio
        harness.agree(rec, f"{prefix}.stacked_grads.ratio", "x", formula=ratio,
                      tpu=t_off["stacked_grads.bytes"] / t_on["stacked_grads.bytes"])
    else:
        print(f"[tpu] transposed mesh skipped: {t_on.skipped or t_off.skipped}")
    return pd.DataFrame(cols, dtype=object)


def stacked_bytes_lines(p: ScanParams, layers: list[int]) -> dict[str, list[tuple[int, int]]]:
    """The formula's stacked-gradient bytes per device at each L (``formula on`` / ``formula off``)."""
    out: dict[str, list[tuple[int, int]]] = {"formula on": [], "formula off": []}
    weights = list(M.weight_shapes(p.hidden, p.ffn).values())
    for L in layers:
        s = FS.shard_as_saving(L, weights, p.mesh_fsdp, p.mesh_tensor)
        out["formula on"].append((L, s.on_bytes))
        out["formula off"].append((L, s.off_bytes))
    return out


def stacked_bytes_points(sweep: list[tuple[ScanCase, View]], views: dict[str, list[View]]
                         ) -> dict[str, list[tuple[int, int]]]:
    """Measured stacked-gradient bytes per device: the CPU sweep's scan views (shard_as on, every L) and each
    compiler view's value at the views' L (``{"cpu on": [(L, bytes)], "tpu off": ...}``)."""
    points: dict[str, list[tuple[int, int]]] = {}
    for c, v in sweep:
        if c.mode == "scan" and v.ran:
            points.setdefault("cpu on", []).append((c.layers, v["stacked_grads.bytes"]))
    for tag, vs in views.items():
        for v in vs:
            if v.source in ("hlo", "tpu") and v.ran and v.get("stacked_grads.bytes"):
                L = int(v["grad_shape.w_up"].strip("[]").split(",")[0])
                label = f"{'cpu' if v.source == 'hlo' else 'tpu'} {tag}"
                if (L, v["stacked_grads.bytes"]) not in points.get(label, []):
                    points.setdefault(label, []).append((L, v["stacked_grads.bytes"]))
    return points


def seed_table(rec: Recorder, meshes: tuple[tuple[int, int], ...] = ((256, 1), (64, 4), (32, 8), (16, 16))
               ) -> pd.DataFrame:
    """The 405B seed's stacked gradient per chip on v6e-256 meshes, 1-D vs 2-D, as a share of usable HBM."""
    rows = []
    for f, t in meshes:
        c = FS.seed_case(fsdp=f, tensor=t, dtype="bfloat16")
        rows.append({"mesh (fsdp, tensor)": (f, t), "1-D shape/chip": c.one_d_shape,
                     "1-D GiB/chip": c.one_d_per_chip_bytes / 2**30, "2-D shape/chip": c.two_d_shape,
                     "2-D MiB/chip": c.two_d_per_chip_bytes / 2**20,
                     "1-D share of usable HBM": f"{c.one_d_fraction_of_hbm:.1%}"})
    c = FS.seed_case(64, 4)
    values = {"total.bytes": c.total_bytes, "mesh64x4.1d.bytes": c.one_d_per_chip_bytes,
              "mesh64x4.2d.bytes": c.two_d_per_chip_bytes}
    harness.record(rec, "shard_as.seed", View("formula", values, dict.fromkeys(values, "B"), checks={
        "1d_shape_is_reported_hlo_shape": (c.one_d_shape == (126, 4096, 16384), str(c))}), show=False)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------- the nn.Linear trap
TRAP_KINDS = ("linear", "einsum")


def _dot_rows(module: HloModule, out: int) -> int:
    """Rows one device multiplies: elements of the (largest) dot result / output features."""
    dots = [i for i in module.instructions.values() if i.opcode in ("dot", "convolution")]
    if not dots:
        raise ValueError("the program has no dot")
    return max(math.prod(d.shape[0].dims) for d in dots) // out


@dataclass(frozen=True)
class TrapCase(MeshCase):
    """``x[b_fsdp, s_tensor, h] · W[O, h]ᵀ`` (O = ``p.ffn``) through ``F.linear`` (a 2-D dot on [b·s, h]) or through
    einsum (torch_xla's ``XLAPatchedLinear``, a 3-D dot). Values ``<kind>.rows`` (rows one device multiplies),
    ``<kind>.out_tiles``, ``<kind>.collectives`` and, on XLA:CPU, ``<kind>.out_spec``."""

    kind: str = "linear"

    def __post_init__(self) -> None:
        if self.kind not in TRAP_KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {TRAP_KINDS}")

    @property
    def phase(self) -> str:
        return self.kind

    @property
    def flat(self) -> FS.FlattenedRows:
        return FS.flattened_rows(self.p.batch, self.p.seq, self.p.mesh_fsdp, self.p.mesh_tensor)

    def formula(self) -> View:
        f, k = self.flat, self.kind
        view = View("formula", detail=f)
        tiles = (self.p.mesh_fsdp, self.p.mesh_tensor if k == "einsum" or f.keeps_both else 1, 1)
        view.add(f"{k}.rows", f.rows_per_device if k == "linear" else f.einsum_rows_per_device, "rows")
        view.add(f"{k}.out_tiles", _shape_str(tiles), "tiles")
        return view

    def graph(self) -> list[torch.Tensor]:
        """The one product on the current world, NOT synced: [y [b, s, O]]."""
        p = self.p
        mesh = S.make_mesh(p.mesh_fsdp, p.mesh_tensor)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(p.batch, p.seq, p.hidden, generator=g).to(runtime.device())  # [b, s, h]
        xs.mark_sharding(x, mesh, ("fsdp", "tensor", None))
        w = torch.randn(p.ffn, p.hidden, generator=g).to(runtime.device())  # [O, h], replicated
        if self.kind == "linear":
            return [torch.nn.functional.linear(x, w)]  # reshape [b·s, h] · [h, O] -> [b, s, O]
        return [XLAPatchedLinear.apply(x, w, None)]  # einsum [b,s,h] · [O,h] -> [b,s,O]

    def read(self, view: View, module: HloModule) -> View:
        k, p = self.kind, self.p
        rows = _dot_rows(module, p.ffn)
        view.add(f"{k}.rows", rows, "rows")
        if view.source == "hlo":
            spec = S.spec_of(view.detail.result[0])
            view.add(f"{k}.out_tiles", _shape_str(S.parse_spec(spec, 3).tiles), "tiles")
            view.add(f"{k}.out_spec", spec, "spec")
        else:
            (_, local), = _root_shapes(module)
            view.add(f"{k}.out_tiles", _shape_str(tuple(g // n for g, n in zip((p.batch, p.seq, p.ffn), local,
                                                                                   strict=True))), "tiles")
        n = len(module.collectives)
        view.add(f"{k}.collectives", n, "count")
        moves = rows > self.flat.einsum_rows_per_device
        view.checks[f"{k}.moves_data_iff_rows_grow.{view.source}"] = (
            (n > 0) == moves, f"{n} collectives, {rows} rows per device (both splits kept: "
                              f"{self.flat.einsum_rows_per_device})")
        if view.source == "tpu" and rows != self.formula()[f"{k}.rows"]:
            dots = [_shape_str(i.shape[0].dims) for i in module.instructions.values()
                    if i.opcode in ("dot", "convolution")]
            view.differs[f"{k}.rows"] = (
                f"XLA:TPU's per-chip dot is {', '.join(dots)} ({rows} rows, {n} collectives): the flattened "
                "[B·S, H] dot of XLA:CPU's program is not what the TPU compiler partitioned (measured)")
            for name in (f"{k}.out_tiles", f"{k}.collectives"):
                view.differs[name] = f"follows from XLA:TPU's per-chip dot (see {k}.rows)"
        return view


def linear_trap(p: ScanParams) -> list[View]:
    """``F.linear`` vs einsum on ``x[b_fsdp, s_tensor, h]``: the formula, CPU compiler and TPU compiler views,
    each holding both kinds (``linear.rows``, ``einsum.rows``, ``*.out_tiles``, ``*.collectives``)."""
    cases = [TrapCase(p, kind=k) for k in TRAP_KINDS]
    return [merge(*(view(c) for c in cases)) for view in (harness.formula, harness.hlo, harness.tpu)]


# --------------------------------------------------------------------------------------- shard_as on its own
DEMO_ROWS, DEMO_COLS = 16, 32


@dataclass(frozen=True)
class ShardAsCase(MeshCase):
    """``a[rows_fsdp, cols_tensor]`` annotated, ``b = 2·ones`` not; with ``shard_as(a, b)`` b is tiled like a.

    ``shard_as(a, b)`` (torch_xla, via JAX's ``shard_alike``) says "a and b end up sharded the same way" without
    naming a sharding: the partitioner picks one (here a's, since a is annotated and b is not) — what
    ``Scan.backward`` needs: the gradient of layer i sharded like layer i's weight, whatever that is."""

    shard_as: bool = True

    def __post_init__(self) -> None:
        for name, size, n in (("rows", DEMO_ROWS, self.p.mesh_fsdp), ("cols", DEMO_COLS, self.p.mesh_tensor)):
            if size % n:
                raise ValueError(f"{name}={size} is not divisible by the mesh axis size {n}")

    def graph(self) -> list[torch.Tensor]:
        """[a, a', b'] with ``(a', b') = shard_as(a, b)``; [b] without (b alone: nothing ties it to a)."""
        ones = torch.ones(DEMO_ROWS, DEMO_COLS).to(runtime.device())
        if not self.shard_as:
            return [ones * 2.0]
        a = torch.arange(DEMO_ROWS * DEMO_COLS, dtype=torch.float32).reshape(DEMO_ROWS, DEMO_COLS)
        a = a.to(runtime.device())  # [rows, cols]
        xs.mark_sharding(a, S.make_mesh(self.p.mesh_fsdp, self.p.mesh_tensor), ("fsdp", "tensor"))
        return [a, *shard_as(a, ones * 2.0)]


@dataclass
class ShardAsDemo:
    a_spec: str  # the annotated tensor
    b_spec_without: str  # b computed on its own (no annotation, no shard_as)
    b_spec_with: str  # b after shard_as(a, b)


def shard_as_demo(p: ScanParams) -> ShardAsDemo | None:
    """The sharding strings of a and of b without and with ``shard_as`` (CPU compiler); None when skipped here."""
    without, with_ = (harness.hlo(ShardAsCase(p, shard_as=flag)) for flag in (False, True))
    if not (without.ran and with_.ran):
        return None
    return ShardAsDemo(S.spec_of(with_.detail.result[0]), S.spec_of(without.detail.result[0]),
                       S.spec_of(with_.detail.result[-1]))


# ------------------------------------------------------------------------------------------ trace transfers
def placeholder_demo(rec: Recorder) -> str:
    """A 64 GiB placeholder: made without memory, lowered to an HLO parameter (never executed: that would crash
    torch_xla 2.9), read with a clear error — each checked; returns what was seen."""
    rss0 = P.current_rss_bytes()
    big = P.placeholder((1 << 34,))  # 2^34 float32 = 64 GiB
    grew_mib = (P.current_rss_bytes() - rss0) / 2**20
    hlo = P.lowered_hlo([big * 2.0])
    try:
        P.read(big)
        error = None
    except P.PlaceholderReadError as e:
        error = str(e)
    rec.check("placeholder.no_memory", grew_mib < 100, f"RSS grew {grew_mib:.1f} MiB for 64 GiB logical")
    rec.check("placeholder.lowers_to_parameter", "f32[17179869184]{0} parameter(" in hlo, hlo.splitlines()[0])
    rec.check("placeholder.read_error_is_clear", error is not None and "placeholder" in error, str(error))
    return f"logical {P.logical_bytes(big) / 2**30:.0f} GiB, RSS grew {grew_mib:.1f} MiB\n{error}"


def record_trace(rec: Recorder, p: ScanParams) -> pd.DataFrame | None:
    """Host→device traffic of tracing one step at L = ``p.layers`` (``placeholder.trace.*``, source metrics): loop
    and scan with placeholders, scan without them at ``p.hidden`` and at each of ``p.placeholder_hiddens``
    (F = 4·h), against the formula; a DataFrame of the growth with hidden, or None (a skip recorded) when the mesh
    does not tile this process."""
    devices, L = runtime.current().num_devices, p.layers
    why = mesh_problem(p, devices)
    if why:
        harness.record(rec, "placeholder.trace", View.skip("metrics", why))
        return None
    runs = {"loop": X.trace_transfers(p, L, "loop", True), "scan": X.trace_transfers(p, L, "scan", True),
            "no_placeholder": X.trace_transfers(p, L, "scan", False, warm=False)}  # scan again: constants cached
    metrics = View("metrics", checks={"zero": (runs["scan"].h2d_bytes == 0 and runs["loop"].h2d_bytes == 0,
                                               f"scan {runs['scan'].h2d_bytes} B, loop {runs['loop'].h2d_bytes} B")})
    formula = View("formula")
    for k, t in runs.items():
        metrics.add(f"h2d.bytes.{k}", t.h2d_bytes, "B")
        metrics.add(f"ir_to_data.count.{k}", t.ir_value_to_data, "tensors")
    want = FS.block_trace_transfer(p.batch, p.seq, p.hidden, p.ffn, devices=devices, placeholders=False)
    off = runs["no_placeholder"]
    for v, (nbytes, count) in ((formula, (want.total_bytes, want.transfers)),
                               (metrics, (off.h2d_bytes, off.h2d_count))):
        v.add("h2d.bytes.no_placeholder.model", nbytes, "B")
        v.add("h2d.count.no_placeholder", count, "transfers")
    rows = []
    for h in sorted(set(p.placeholder_hiddens)):
        t = off if (h, 4 * h) == (p.hidden, p.ffn) else X.trace_transfers(replace(p, hidden=h, ffn=4 * h), L, "scan",
                                                                           False)
        f_off = FS.block_trace_transfer(p.batch, p.seq, h, 4 * h, devices=devices, placeholders=False).total_bytes
        formula.add(f"h2d.bytes.no_placeholder.H{h}", f_off, "B")
        metrics.add(f"h2d.bytes.no_placeholder.H{h}", t.h2d_bytes, "B")
        rows.append({"hidden": h, "ffn": 4 * h, "no placeholders h2d B (metrics)": t.h2d_bytes, "formula B": f_off})
    harness.record(rec, "placeholder.trace", formula, metrics, show=False)
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------------- explorer
def explore(p: ScanParams, fsdp: int, tensor: int, layers: int, hidden: int) -> dict[str, dict[str, Any]]:
    """The explorer's run: the scan step on mesh (fsdp, tensor) at (L, hidden) with shard_as on and off."""
    q = replace(p, mesh_fsdp=fsdp, mesh_tensor=tensor, hidden=hidden)
    res = {}
    for flag in (True, False):
        v = harness.hlo(ScanCase(q, layers, shard_as=flag))
        if not v.ran:
            raise ValueError(v.skipped)
        res["on" if flag else "off"] = {"w_up grad spec": v["grad_spec"], "stacked grads B": v["stacked_grads.bytes"],
                                        "while state B": v["while_state.bytes"], "buffers B": v["buffers.total.bytes"]}
    return res
