"""scan over layers as cases: the stacked step, the ``nn.Linear`` trap, ``shard_as`` on its own.

Design
------
Each case holds notebook 06's parameters ``p`` (:class:`xla_scan.params.ScanParams`) and the variant it shows, on
the mesh (fsdp, tensor) = (``p.mesh_fsdp``, ``p.mesh_tensor``); :mod:`shardlab.core.harness` runs it through the views.
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
scan_layers cases add no values: the compile-time sweep reads their programs
(:func:`shardlab.xla_scan.sections.record_sweep`).

What notebook 06 measures beyond one case's views (the sweep, the OFF/ON contrast, the transposed mesh, per-layer
gradient specs, trace transfers, the explorer's run) is in :mod:`shardlab.xla_scan.sections`.
torch_xla is imported at the top: import this module after ``shardlab.runtime.setup()`` (the notebooks' order).

Example::

    off = ScanCase(p, layers=4, shard_as=False)
    harness.record(rec, "shard_as.off", *harness.views(off, ("formula", "hlo", "tpu")))
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import SimpleNamespace
from typing import ClassVar

import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch_xla.distributed.spmd.xla_sharding import XLAPatchedLinear, shard_as

from shardlab import runtime
from shardlab.core.case import Case, Checks, Step
from shardlab.core.views import COMPILERS, View, collectives_view, traffic
from shardlab.formulas import scan as FS
from shardlab.formulas.common import dtype_bytes
from shardlab.profile.hlo import Collective, HloModule
from shardlab.xla_scan import measure as X
from shardlab.xla_scan import model as M
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.params import ScanParams
from shardlab.xla_scan.patches import shard_as_enabled

MODES = M.MODES


GRAD_OPS = ("all_reduce", "reduce_scatter")


PARITY_RTOL = 1e-5  # max |xla - cpu loop| / max |cpu loop|: XLA reorders float32 sums, a real bug is O(1)


SOURCE_LABEL = {"formula": "formula", **COMPILERS}


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

    def small_trace(self) -> tuple[ScanCase, tuple[int, int], tuple[int, int]] | None:
        """Trace small, compile big: the same step on mesh (fsdp 2, tensor) — its tensors have global shapes that
        no mesh size enters — compiled for (fsdp, tensor) with the shardings rewritten (``harness.tpu``; exact at
        8 chips, tested). None when fsdp is already 2 or odd (2 does not tile it)."""
        f, t = self.p.mesh_fsdp, self.p.mesh_tensor
        if f <= 2 or f % 2:
            return None
        return replace(self, p=replace(self.p, mesh_fsdp=2)), (2, t), (f, t)

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
    def graph(self) -> Step:
        """The step on the current world, NOT synced: [out, x.grad, grad of each weight (w_up's, then w_down's)]."""
        model, x = X.prepare(self.p, self.layers, self.mode, self.layout)
        t0 = time.perf_counter()
        with shard_as_enabled(self.shard_as):
            out = model(x)  # [b, s, h]
            M.loss_fn(out).backward()
        self.trace["s"] = time.perf_counter() - t0  # Python wall time to build the lazy forward + backward graph
        return Step([out, x.grad, *[w.grad for ws in model.weights().values() for w in ws]])  # type: ignore[operator]

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

    def graph(self) -> Step:
        """The one product on the current world, NOT synced: [y [b, s, O]]."""
        p = self.p
        mesh = S.make_mesh(p.mesh_fsdp, p.mesh_tensor)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(p.batch, p.seq, p.hidden, generator=g).to(runtime.device())  # [b, s, h]
        xs.mark_sharding(x, mesh, ("fsdp", "tensor", None))
        w = torch.randn(p.ffn, p.hidden, generator=g).to(runtime.device())  # [O, h], replicated
        if self.kind == "linear":
            return Step([torch.nn.functional.linear(x, w)])  # reshape [b·s, h] · [h, O] -> [b, s, O]
        return Step([XLAPatchedLinear.apply(x, w, None)])  # einsum [b,s,h] · [O,h] -> [b,s,O]

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

    def graph(self) -> Step:
        """[a, a', b'] with ``(a', b') = shard_as(a, b)``; [b] without (b alone: nothing ties it to a)."""
        ones = torch.ones(DEMO_ROWS, DEMO_COLS).to(runtime.device())
        if not self.shard_as:
            return Step([ones * 2.0])
        a = torch.arange(DEMO_ROWS * DEMO_COLS, dtype=torch.float32).reshape(DEMO_ROWS, DEMO_COLS)
        a = a.to(runtime.device())  # [rows, cols]
        xs.mark_sharding(a, S.make_mesh(self.p.mesh_fsdp, self.p.mesh_tensor), ("fsdp", "tensor"))
        return Step([a, *shard_as(a, ones * 2.0)])
