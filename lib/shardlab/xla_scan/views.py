"""scan over layers, the views of one configuration: formula, CPU compiler, TPU compiler (no ledger).

Design
------
A :class:`ScanConfig` fixes the stack (L, H, F, B, S), the mesh (fsdp, tensor), the mode, ``shard_as`` on/off and
the seed, so every view computes the same forward + backward step from the same numbers::

    formula(cfg)    shardlab.formulas.scan: per-device stacked-gradient shapes and bytes, and the collective
                    over fsdp that finishes dW = xᵀ·dy in the backward While body
    compiler(cfg)   the step compiled and run on this process's CPU devices (``measure.measure_step``): the
                    partitioned HLO, the gradients' sharding strings, parity with the CPU for-loop oracle
    tpu(cfg)        the same graph compiled by XLA:TPU for a fsdp·tensor-chip topology (compile-only)

There is no ledger view: scan is a property of one compiled program, not of per-rank code.

Value names (the notebook puts them under a prefix such as ``shard_as.off``)::

    stacked_grads.bytes             per-device bytes of all stacked gradients           formula, hlo, tpu
    grad_shape.<weight>             per-device shape of the stacked gradient, "[L, ...]" formula, hlo, tpu
    grad_fsdp.<op>.{count,bytes,elements}   reductions over fsdp in the backward body   formula, hlo, tpu
    grad_spec                       XLA's sharding string of W_up's stacked gradient    hlo
    while_state.bytes               per-device bytes of the backward While's state      hlo, tpu (not compared)
    buffers.total.bytes             XLA:CPU buffer assignment total                     hlo

Checks every compiler view carries (they hold for every legal configuration): each gradient is tiled like its
weight (shard_as on) or like its weight with the fsdp split removed (off); the backward While's loop state holds
an array of exactly each stacked gradient's per-device shape (the one carried sharding *is* the stack's); the
CPU result equals the for-loop oracle. The CPU view needs fsdp·tensor devices in this process and is skipped
otherwise; the TPU view compiles in a helper process when this process has another device count.

The module also holds the notebook's other measurements as small functions (compile-time sweep, the
``nn.Linear`` trap views, trace transfers, the explorer's run) so the notebook shows one line per view.

Example::

    cfg = ScanConfig(layers=4, hidden=128, ffn=512, batch=8, seq=8, mesh_fsdp=2, mesh_tensor=4, shard_as=False)
    record(rec, "shard_as.off", formula(cfg), compiler(cfg), tpu(cfg))
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from shardlab import runtime
from shardlab.formulas import scan as FS
from shardlab.formulas.common import dtype_bytes
from shardlab.views import View, collectives_view, record, traffic
from shardlab.xla_scan import model as M
from shardlab.xla_scan import sharding as S

GRAD_OPS = ("all_reduce", "reduce_scatter")
PARITY_RTOL = 1e-5  # max |xla - cpu loop| / max |cpu loop|: XLA reorders float32 sums, a real bug is O(1)


@dataclass(frozen=True)
class ScanConfig:
    """One forward + backward step of the block stack on a (fsdp, tensor) mesh."""

    layers: int
    hidden: int
    ffn: int
    batch: int
    seq: int
    mesh_fsdp: int
    mesh_tensor: int
    mode: str = "scan"  # "loop" | "scan_layers" | "scan" (pre-stacked weights)
    shard_as: bool = True  # torch_xla's shard_as in scan's backward (off: the behaviour before the fix)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in M.MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {M.MODES}")
        M.StackConfig(self.layers, self.hidden, self.ffn, self.batch, self.seq)  # validates the sizes

    @property
    def stack(self) -> M.StackConfig:
        return M.StackConfig(self.layers, self.hidden, self.ffn, self.batch, self.seq)

    @property
    def chips(self) -> int:
        return self.mesh_fsdp * self.mesh_tensor

    @property
    def tag(self) -> str:
        return "on" if self.shard_as else "off"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> ScanConfig:
        kw = dict(layers=max(p.layers_sweep), hidden=p.hidden, ffn=p.ffn, batch=p.batch, seq=p.seq,
                  mesh_fsdp=p.mesh_fsdp, mesh_tensor=p.mesh_tensor, seed=p.seed)
        return cls(**{**kw, **overrides})

    def replace(self, **changes: Any) -> ScanConfig:
        return dataclasses.replace(self, **changes)


def mesh_problem(fsdp: int, tensor: int, num_devices: int) -> str | None:
    """Why the CPU views cannot run this mesh in this process (None: they can)."""
    if fsdp * tensor != num_devices:
        return (f"the mesh (fsdp={fsdp}, tensor={tensor}) needs {fsdp * tensor} devices; this process has "
                f"num_devices={num_devices}")
    return None


def _shape_str(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def stacked_dim_axes(weight: str) -> tuple[str | None, ...]:
    """Mesh axis of each dim of a stacked weight ``[L, d_in, d_out]`` (the layer axis is not split)."""
    return (None, *S.WEIGHT_SPECS[weight])


def expected_grad_shapes(cfg: ScanConfig) -> dict[str, tuple[int, ...]]:
    """Per-device shape of each stacked gradient: like the weight (on) or all-reduced over fsdp (off)."""
    return {w: FS.per_device_shape((cfg.layers, *shape), stacked_dim_axes(w), cfg.mesh_fsdp, cfg.mesh_tensor,
                                   "2d" if cfg.shard_as else "1d")
            for w, shape in cfg.stack.weight_shapes.items()}


def _require_scan(cfg: ScanConfig) -> None:
    if cfg.mode != "scan":
        raise ValueError(f"mode={cfg.mode!r}: the views compare the pre-stacked scan (mode='scan'), whose gradients "
                         "are one stacked [L, ...] array per weight")


# --------------------------------------------------------------------------------------------------- formula
def formula(cfg: ScanConfig) -> View:
    """Per-device stacked-gradient shapes and bytes, and the reduction over fsdp that finishes each dW."""
    _require_scan(cfg)
    shapes = expected_grad_shapes(cfg)
    itemsize = dtype_bytes(str(cfg.stack.dtype))
    saving = FS.shard_as_saving(cfg.layers, list(cfg.stack.weight_shapes.values()), cfg.mesh_fsdp, cfg.mesh_tensor)
    red = FS.grad_reduction(list(cfg.stack.weight_shapes.values()), cfg.mesh_fsdp, cfg.mesh_tensor, cfg.shard_as)
    view = View("formula", detail={"saving": saving, "reduction": red, "grad_shapes": shapes})
    view.add("stacked_grads.bytes", saving.on_bytes if cfg.shard_as else saving.off_bytes, "bytes")
    if sum(math.prod(s) for s in shapes.values()) * itemsize != view.values["stacked_grads.bytes"]:
        raise AssertionError(f"per-device shapes {shapes} disagree with shard_as_saving {saving}")  # one formula
    for w, shape in shapes.items():
        view.add(f"grad_shape.{w}", _shape_str(shape), "shape")
    return traffic(view, "grad_fsdp", {red.op: red.count}, {red.op: red.operand_bytes}, "float32", GRAD_OPS)


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


def _kind(c: Any) -> str:
    """A collective as the operation it performs (XLA:CPU's all-reduce + dynamic-slice is a reduce-scatter)."""
    return "reduce-scatter" if c.op == "all-reduce" and c.feeds_dynamic_slice else c.op


def backward_body_collectives(module: Any) -> list[Any]:
    """Collectives scheduled in the backward While body (the module's last While consumes the forward's)."""
    if not module.while_loops:
        raise ValueError("the program has no While loop (XLA removes one that runs once: use L >= 2)")
    body = module.while_loops[-1].body
    return [c for c in module.collectives if c.computation == body]


def backward_reductions(module: Any, fsdp: int, tensor: int) -> list[str]:
    """``"<op> <axis>"`` for every reduction (all-reduce / reduce-scatter) in the backward body, one per operand."""
    out = []
    for c in backward_body_collectives(module):
        if _kind(c) in ("all-reduce", "reduce-scatter"):
            out += [f"{_kind(c)} {mesh_axis(c.replica_groups[0], fsdp, tensor)}"] * c.operands
    return sorted(out)


def what_shard_as_changed(off: View, on: View, fsdp: int, tensor: int) -> tuple[str, str]:
    """(reductions only the OFF program has, reductions only the ON program has) in the backward body, each a
    ``"<op> <axis>"`` string (several joined by ", "): the measured answer to "what did shard_as change"."""
    a = Counter(backward_reductions(off.detail.module, fsdp, tensor))
    b = Counter(backward_reductions(on.detail.module, fsdp, tensor))
    return ", ".join(sorted(set((a - b).elements()))), ", ".join(sorted(set((b - a).elements())))


def _fsdp_reductions(module: Any, fsdp: int, tensor: int) -> Any:
    """The backward body's reductions over the fsdp axis (those that finish the weight gradients)."""
    return SimpleNamespace(collectives=[c for c in backward_body_collectives(module)
                                        if _kind(c) in ("all-reduce", "reduce-scatter")
                                        and mesh_axis(c.replica_groups[0], fsdp, tensor) == "fsdp"])


def _while_holds(module: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[bool, str]:
    state = {tuple(a.dims) for a in module.while_loops[-1].state}
    missing = {w: s for w, s in shapes.items() if tuple(s) not in state}
    return (not missing, f"backward While state holds {sorted(shapes.values())}" if not missing
            else f"no loop-state array of shape {missing}; state arrays {sorted(state)}")


def _grad_views(view: View, cfg: ScanConfig, module: Any, shapes: dict[str, tuple[int, ...]], itemsize: int,
                cpu: bool) -> View:
    """Values and checks shared by the two compiler views, from one program and its per-device grad shapes."""
    view.add("stacked_grads.bytes", sum(math.prod(s) for s in shapes.values()) * itemsize, "bytes")
    for w, shape in shapes.items():
        view.add(f"grad_shape.{w}", _shape_str(shape), "shape")
    # Both compilers may finish a reduce-scatter as an all-reduce whose result a dynamic-slice cuts to the device's
    # share (XLA:CPU always; XLA:TPU for some shapes, measured at H=32, F=64): count each as what it does.
    reductions = _fsdp_reductions(module, cfg.mesh_fsdp, cfg.mesh_tensor)
    red = collectives_view(view.source, reductions, "grad_fsdp", GRAD_OPS, "float32", cpu_reduce_scatter=True)
    for name, value in red.values.items():
        view.add(name, value, red.units[name])
    view.differs.update(red.differs)
    if cpu:
        view.notes += red.notes
    else:
        lowered = sum(c.op == "all-reduce" and c.feeds_dynamic_slice for c in reductions.collectives)
        if lowered:
            view.notes.append(f"grad_fsdp.reduce_scatter: XLA:TPU finished {lowered} of them as an all-reduce + "
                              "dynamic-slice (counted as the reduce-scatter it implements), the others natively")
    view.checks[f"while_state.holds_stacked_grads.{view.source}"] = _while_holds(module, shapes)
    return view


# --------------------------------------------------------------------------------------------- CPU compiler
_STEPS: dict[tuple[ScanConfig, bool], Any] = {}


def step(cfg: ScanConfig, check: bool = True) -> Any:
    """One compiled + executed step on the CPU devices (``measure.measure_step``), memoised per configuration:
    the sweep, the views and the explorer share each compile."""
    from shardlab.xla_scan import measure as X

    key = (cfg, check)
    if key not in _STEPS:
        for (c, chk), r in _STEPS.items():  # a checked run answers an unchecked request
            if c == cfg and chk and not check:
                return r
        _STEPS[key] = X.measure_step(cfg.stack, cfg.mode, cfg.mesh_fsdp, cfg.mesh_tensor, cfg.seed, cfg.shard_as,
                                     check)
    return _STEPS[key]


def compiler(cfg: ScanConfig) -> View:
    """The CPU partitioner's program (source ``hlo``); skipped when the mesh does not tile this process."""
    _require_scan(cfg)
    problem = mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    r = step(cfg)
    shapes = {w: tuple(math.ceil(d / t) for d, t in zip((cfg.layers, *shape), S.parse_spec(r.grad_specs[w][0], 3)
                                                         .tiles, strict=True))
              for w, shape in cfg.stack.weight_shapes.items()}
    view = _grad_views(View("hlo", detail=r), cfg, r.module, shapes, dtype_bytes(str(cfg.stack.dtype)), cpu=True)
    if sum(r.grad_bytes.values()) != view.values["stacked_grads.bytes"]:
        raise AssertionError(f"grad bytes {r.grad_bytes} vs shapes {shapes}")  # two readings of one spec
    view.add("grad_spec", r.grad_specs["w_up"][0], "spec")
    view.add("while_state.bytes", r.backward_while_state_bytes, "bytes")
    view.add("buffers.total.bytes", r.buffers_total_bytes, "bytes")
    view.checks["parity.hlo"] = (r.max_rel_err is not None and r.max_rel_err < PARITY_RTOL,
                                 f"max |xla - cpu loop| / max |cpu loop|, output and gradients: {r.max_rel_err:.2e}")
    size = {"fsdp": cfg.mesh_fsdp, "tensor": cfg.mesh_tensor}
    for w in cfg.stack.weight_shapes:
        want = tuple(size[a] if a is not None and (cfg.shard_as or a != "fsdp") else 1 for a in stacked_dim_axes(w))
        got = S.parse_spec(r.grad_specs[w][0], 3).tiles
        view.checks[f"grad_tiles.{w}"] = (got == want, f"{r.grad_specs[w][0]}: tiles {got}, want {want} (the weight's "
                                          + ("tiling)" if cfg.shard_as else "tiling without its fsdp split)"))
    return view


# --------------------------------------------------------------------------------------------- TPU compiler
def build_graph(cfg: ScanConfig) -> list[torch.Tensor]:
    """The step on the current world, NOT synced: [out, x.grad, grad of each stacked weight]."""
    from shardlab.xla_scan import measure as X
    from shardlab.xla_scan.patches import shard_as_enabled

    X.require_shard_as_deps()
    model, x = X._prepare(cfg.stack, cfg.mode, S.make_mesh(cfg.mesh_fsdp, cfg.mesh_tensor), cfg.seed)
    with shard_as_enabled(cfg.shard_as):
        out = model(x)  # [B, S, H]
        M.loss_fn(out).backward()
    return [out, x.grad, *[w.grad for ws in model.weights().values() for w in ws]]  # type: ignore[operator]


def _root_shapes(module: Any) -> list[tuple[str, tuple[int, ...]]]:
    root = next(module.instructions[n] for n in module.computations[module.entry] if module.instructions[n].is_root)
    return [(a.dtype, tuple(a.dims)) for a in root.shape]


def _tpu_compile(build: Any, cfg: Any, chips: int, generation: str) -> tuple[Any, str | None]:
    """(TpuCompile, None) or (None, why the TPU view is skipped)."""
    from shardlab.profile import tpu as T

    topology, why = T.view_topology(chips, runtime.current().num_devices == chips, generation)
    return (None, why) if topology is None else (T.compile_program(build, cfg, topology), None)


def tpu(cfg: ScanConfig, generation: str = "v5e") -> View:
    """The same step compiled by XLA:TPU for a ``fsdp·tensor``-chip slice (compile-only)."""
    _require_scan(cfg)
    comp, why = _tpu_compile(build_graph, cfg, cfg.chips, generation)
    if comp is None:
        return View.skip("tpu", why or "")
    view = View("tpu", detail=comp)
    if not comp.fits:
        view.notes.append(f"does not fit on {comp.topology}: {comp.oom.message.splitlines()[0]}")
        return view
    outs = _root_shapes(comp.module)[2:]  # [out, x.grad, *grads]
    names = list(cfg.stack.weight_shapes)
    if len(outs) != len(names):
        raise AssertionError(f"TPU program returns {len(outs)} gradients, expected {names}")
    shapes = {w: s for w, (_, s) in zip(names, outs, strict=True)}
    _grad_views(view, cfg, comp.module, shapes, dtype_bytes(str(cfg.stack.dtype)), cpu=False)
    state = comp.module.while_loops[-1].state
    view.add("while_state.bytes", comp.module.while_loops[-1].state_bytes, "bytes")
    low = sum(a.dtype == "bf16" for a in state)
    view.differs["while_state.bytes"] = (
        f"XLA:TPU's backward loop state is its own ({len(state)} arrays, {low} of them bf16 in this f32 model); "
        "the totals are not compared across compilers — each must hold the stacked gradients (checked)")
    view.notes.append(f"XLA:TPU {comp.topology}: {comp.num_chips} chips, compiled in {comp.compile_s:.2f} s")
    return view


def record_tpu_seconds(rec: Any, prefix: str, views: dict[str, View]) -> None:
    """XLA:TPU compile seconds of each view that compiled (``<prefix>.<tag>.tpu_compile_s``, a timing; 0 when the
    program came from the in-process compile cache)."""
    for tag, v in views.items():
        if v.source == "tpu" and v.ran and v.detail is not None:
            rec.measure(f"{prefix}.{tag}.tpu_compile_s", 0.0 if v.detail.cached else v.detail.compile_s, "s", "tpu",
                        kind="timing")


def contrast(rec: Any, on: list[View], off: list[View]) -> Any:
    """Per compiler that ran: OFF/ON ratios recorded, "OFF holds more" checked; a DataFrame of on vs off.

    XLA:CPU: backward While state and buffer-assignment total; XLA:TPU: backward While state and program outputs
    (the stacked gradients leave the program as outputs)."""
    import pandas as pd

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
        if src == "tpu":
            record_tpu_seconds(rec, "shard_as", {"on": v_on, "off": v_off})
        for label, (a, b) in pairs.items():
            rec.measure(f"shard_as.off_on_ratio.{label}", a / b, "x", src)
            rec.check(f"shard_as.off_exceeds_on.{label}.{src}", a > b, f"off {a} B > on {b} B per device")
        for i, (tag, v) in enumerate((("off", v_off), ("on", v_on))):
            col = {k: v.get(k) for k in ("grad_shape.w_up", "grad_shape.w_down", "stacked_grads.bytes")}
            cols[f"{src} · {tag}"] = col | {f"{label} B": pair[i] for label, pair in pairs.items()}
    return pd.DataFrame(cols, dtype=object)


# ------------------------------------------------------------------------------------------ compile sweep
def sweep(cfg: ScanConfig, layers: list[int]) -> list[dict[str, Any]]:
    """Every mode at every L with shard_as on (parity with the loop oracle checked): rows of StepMeasure dicts.
    Empty when the mesh does not tile this process (the caller prints why)."""
    from shardlab.xla_scan import measure as X

    if mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices):
        return []
    # No separate warm-up compile: measured here, a process's first XLA:CPU compile takes no longer than the next
    # (0.81 s vs 0.84 s for the same loop step); the JAX import that scan's backward needs is done up front.
    X.require_shard_as_deps()
    rows = []
    for L in sorted(set(layers)):
        for mode in M.MODES:
            r = step(cfg.replace(layers=L, mode=mode, shard_as=True))
            rows.append(r.as_dict() | {"backward_while_state_bytes": r.while_state_bytes[-1]
                                       if r.while_state_bytes else 0})
    return rows


def record_sweep(rec: Any, rows: list[dict[str, Any]], cfg: ScanConfig) -> Any:
    """Record compile/trace/execute seconds and program sizes per (mode, L), parity, and the shape checks.
    With no rows (the mesh does not tile this process) print and record why."""
    import pandas as pd

    cols = ["mode", "layers", "trace_s", "compile_s", "execute_s", "hlo_instructions", "hlo_instructions_raw",
            "max_rel_err"]
    if not rows:
        why = mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices) or "no rows"
        print(f"[hlo] skipped: {why}")
        rec.note("scan.hlo", f"hlo view skipped: {why}")
        return None
    for r in rows:
        mode, L = r["mode"], r["layers"]
        rec.check(f"parity.{mode}.L{L}", r["max_rel_err"] < PARITY_RTOL,
                  f"max |xla - cpu loop| / max |cpu loop| over output and gradients = {r['max_rel_err']:.2e}")
        rec.measure(f"scan.compile_s.{mode}.L{L}", r["compile_s"], "s", "metrics", kind="timing")
        rec.measure(f"scan.trace_s.{mode}.L{L}", r["trace_s"], "s", "timer", kind="timing")
        rec.measure(f"scan.execute_s.{mode}.L{L}", r["execute_s"], "s", "metrics", kind="timing")
        rec.measure(f"scan.hlo_instructions.{mode}.L{L}", r["hlo_instructions"], "instructions", "hlo")
    size = {m: [r["hlo_instructions"] for r in sorted(rows, key=lambda r: r["layers"]) if r["mode"] == m]
            for m in M.MODES}
    rec.check("scan.hlo_instructions.scan.constant_in_L", len(set(size["scan"])) == 1, f"scan sizes {size['scan']}")
    if len(size["loop"]) > 1:
        for m in ("loop", "scan_layers"):
            grows = all(a < b for a, b in zip(size[m], size[m][1:], strict=False))
            rec.check(f"scan.hlo_instructions.{m}.grows_with_L", grows, f"{m} sizes {size[m]}")
    return pd.DataFrame(rows, columns=cols)


def devices_sweep(rec: Any, cfg: ScanConfig, counts: list[int]) -> Any:
    """Compile time and program size of the scan step vs device count: one fresh process per count n, mesh
    (fsdp = n, tensor = 1). Records each point and checks that every count above 1 compiles the same program."""
    import pandas as pd

    from shardlab.xla_scan import measure as X

    if not counts:
        print("devices_sweep=[]: skipped (each device count needs a fresh process, 10-30 s apiece); "
              "run with devices_sweep=[1, 2, 4, 8]")
        return None
    rows = []
    for d in X.compile_vs_devices(cfg.stack, "scan", tuple(counts), cfg.seed):
        n = d["num_devices"]
        rows.append({"devices": n, "compile_s": d["compile_s"], "hlo_instructions": d["hlo_instructions"]})
        rec.measure(f"scan.compile_s_vs_devices.scan.L{cfg.layers}.D{n}", d["compile_s"], "s", "metrics",
                    kind="timing")
        rec.measure(f"scan.hlo_instructions_vs_devices.scan.L{cfg.layers}.D{n}", d["hlo_instructions"],
                    "instructions", "hlo")
    multi = {r["hlo_instructions"] for r in rows if r["devices"] > 1}
    rec.check("scan.hlo_instructions_vs_devices.same_program", len(multi) <= 1, str(rows))
    return pd.DataFrame(rows)


def layer_grad_specs(rec: Any, cfg: ScanConfig) -> Any:
    """``scan_layers`` returns per-layer gradients: their W_up specs with shard_as on and off, recorded and checked
    (each layer's gradient tiled like its weight, or like it without the fsdp split). None when skipped."""
    import pandas as pd

    if mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices):
        return None
    size = {"fsdp": cfg.mesh_fsdp, "tensor": cfg.mesh_tensor}
    specs = {}
    for tag, flag in (("on", True), ("off", False)):
        # the ON step is the sweep's (parity checked there); OFF needs only its shardings, not a parity run
        specs[tag] = step(cfg.replace(mode="scan_layers", shard_as=flag), check=flag).grad_specs["w_up"]
        want = tuple(size[a] if flag or a != "fsdp" else 1 for a in S.WEIGHT_SPECS["w_up"])
        rec.check(f"shard_as.{tag}.layer_grad_tiles", all(S.parse_spec(sp, 2).tiles == want for sp in specs[tag]),
                  f"{specs[tag]}: want tiles {want} for every layer")
        rec.measure(f"shard_as.{tag}.layer_grad_spec", specs[tag][0], "spec", "hlo")
    return pd.DataFrame({"per-layer W_up gradient spec (scan_layers)": {k: v[0] for k, v in specs.items()},
                         "layers with this spec": {k: f"{v.count(v[0])} of {len(v)}" for k, v in specs.items()}})


def transposed(rec: Any, cfg: ScanConfig) -> Any:
    """The same step on the transposed mesh (fsdp and tensor sizes swapped), compiled by XLA:TPU: the OFF/ON ratio
    of the stacked gradients is the fsdp size, so it changes. Formula vs tpu, recorded; a DataFrame."""
    import pandas as pd

    c = cfg.replace(mesh_fsdp=cfg.mesh_tensor, mesh_tensor=cfg.mesh_fsdp)
    prefix = f"shard_as.mesh{c.mesh_fsdp}x{c.mesh_tensor}"
    views = {flag: [formula(c.replace(shard_as=flag)) if c.mesh_fsdp > 1 else View.skip("formula", "fsdp=1"),
                    tpu(c.replace(shard_as=flag))] for flag in (True, False)}
    cols = {}
    for flag, (f, t) in views.items():
        tag = "on" if flag else "off"
        if f.ran and t.ran:
            record(rec, f"{prefix}.{tag}", f, t, show=False)
        cols[f"shard_as {tag}"] = {"tpu grad_shape.w_up": t.get("grad_shape.w_up"),
                                   "tpu stacked_grads.bytes": t.get("stacked_grads.bytes")}
    t_on, t_off = views[True][1], views[False][1]
    record_tpu_seconds(rec, prefix, {"on": t_on, "off": t_off})
    if t_on.ran and t_off.ran and t_on.get("stacked_grads.bytes"):
        ratio = FS.shard_as_saving(c.layers, list(c.stack.weight_shapes.values()), c.mesh_fsdp, c.mesh_tensor).ratio
        rec.agree(f"{prefix}.stacked_grads.ratio", "x", formula=ratio,
                  tpu=t_off["stacked_grads.bytes"] / t_on["stacked_grads.bytes"])
    else:
        print(f"[tpu] transposed mesh skipped: {t_on.skipped or t_off.skipped}")
    return pd.DataFrame(cols, dtype=object)


def stacked_bytes_lines(cfg: ScanConfig, layers: list[int]) -> dict[str, list[tuple[int, int]]]:
    """The formula's stacked-gradient bytes per device at each L (``formula on`` / ``formula off``)."""
    out: dict[str, list[tuple[int, int]]] = {"formula on": [], "formula off": []}
    for L in layers:
        s = FS.shard_as_saving(L, list(cfg.stack.weight_shapes.values()), cfg.mesh_fsdp, cfg.mesh_tensor)
        out["formula on"].append((L, s.on_bytes))
        out["formula off"].append((L, s.off_bytes))
    return out


def stacked_bytes_points(rows: list[dict[str, Any]], views: dict[str, list[View]]) -> dict[str, list[tuple[int, int]]]:
    """Measured stacked-gradient bytes per device: the CPU sweep's scan rows (shard_as on, every L) and each
    compiler view's value at the views' L (``{"cpu on": [(L, bytes)], "tpu off": ...}``)."""
    points: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        if r["mode"] == "scan":
            points.setdefault("cpu on", []).append((r["layers"], sum(r["grad_bytes"].values())))
    for tag, vs in views.items():
        for v in vs:
            if v.source in ("hlo", "tpu") and v.ran and v.get("stacked_grads.bytes"):
                L = int(v["grad_shape.w_up"].strip("[]").split(",")[0])
                label = f"{'cpu' if v.source == 'hlo' else 'tpu'} {tag}"
                if (L, v["stacked_grads.bytes"]) not in points.get(label, []):
                    points.setdefault(label, []).append((L, v["stacked_grads.bytes"]))
    return points


def seed_table(rec: Any, meshes: tuple[tuple[int, int], ...] = ((256, 1), (64, 4), (32, 8), (16, 16))) -> Any:
    """The 405B seed's stacked gradient per chip on v6e-256 meshes, 1-D vs 2-D, as a share of usable HBM."""
    import pandas as pd

    rows = []
    for f, t in meshes:
        c = FS.seed_case(fsdp=f, tensor=t, dtype="bfloat16")
        rows.append({"mesh (fsdp, tensor)": (f, t), "1-D shape/chip": c.one_d_shape,
                     "1-D GiB/chip": c.one_d_per_chip_bytes / 2**30, "2-D shape/chip": c.two_d_shape,
                     "2-D MiB/chip": c.two_d_per_chip_bytes / 2**20,
                     "1-D share of usable HBM": f"{c.one_d_fraction_of_hbm:.1%}"})
    case = FS.seed_case(64, 4)
    rec.check("shard_as.seed.1d_shape_is_reported_hlo_shape", case.one_d_shape == (126, 4096, 16384), str(case))
    rec.measure("shard_as.seed.total.bytes", case.total_bytes, "B", "formula")
    rec.measure("shard_as.seed.mesh64x4.1d.bytes", case.one_d_per_chip_bytes, "B", "formula")
    rec.measure("shard_as.seed.mesh64x4.2d.bytes", case.two_d_per_chip_bytes, "B", "formula")
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------- the nn.Linear trap
@dataclass(frozen=True)
class TrapConfig:
    """``x[B_fsdp, S_tensor, H] · W[O, H]ᵀ`` through ``F.linear`` (a 2-D dot on [B·S, H]) and through einsum."""

    mesh_fsdp: int
    mesh_tensor: int
    batch: int
    seq: int
    hidden: int
    out: int
    kind: str = "linear"  # "linear" | "einsum" (torch_xla's XLAPatchedLinear)

    @property
    def chips(self) -> int:
        return self.mesh_fsdp * self.mesh_tensor


def build_trap(cfg: TrapConfig) -> list[torch.Tensor]:
    """The one product on the current world, NOT synced: [y [B, S, O]]."""
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.spmd.xla_sharding import XLAPatchedLinear

    mesh = S.make_mesh(cfg.mesh_fsdp, cfg.mesh_tensor)
    g = torch.Generator().manual_seed(0)
    dev = runtime.device()
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dev)  # [B, S, H]
    xs.mark_sharding(x, mesh, ("fsdp", "tensor", None))
    w = torch.randn(cfg.out, cfg.hidden, generator=g).to(dev)  # [O, H], replicated
    if cfg.kind == "linear":
        return [torch.nn.functional.linear(x, w)]  # reshape [B·S, H] · [H, O] -> [B, S, O]
    return [XLAPatchedLinear.apply(x, w, None)]  # einsum [B,S,H] · [O,H] -> [B,S,O]


def _dot_rows(module: Any, out: int) -> int:
    """Rows one device multiplies: elements of the (largest) dot result / output features."""
    dots = [i for i in module.instructions.values() if i.opcode in ("dot", "convolution")]
    if not dots:
        raise ValueError("the program has no dot")
    return max(math.prod(d.shape[0].dims) for d in dots) // out


def trap_formula(cfg: TrapConfig) -> View:
    f = FS.flattened_rows(cfg.batch, cfg.seq, cfg.mesh_fsdp, cfg.mesh_tensor)
    view = View("formula", detail=f)
    rows = f.rows_per_device if cfg.kind == "linear" else f.einsum_rows_per_device
    tiles = (cfg.mesh_fsdp, cfg.mesh_tensor if cfg.kind == "einsum" or f.keeps_both else 1, 1)
    view.add(f"{cfg.kind}.rows", rows, "rows")
    view.add(f"{cfg.kind}.out_tiles", _shape_str(tiles), "tiles")
    return view


def _trap_checks(view: View, cfg: TrapConfig, module: Any) -> View:
    f = FS.flattened_rows(cfg.batch, cfg.seq, cfg.mesh_fsdp, cfg.mesh_tensor)
    n = len(module.collectives)
    view.add(f"{cfg.kind}.collectives", n, "count")
    moves = view.values[f"{cfg.kind}.rows"] > f.einsum_rows_per_device
    view.checks[f"{cfg.kind}.moves_data_iff_rows_grow.{view.source}"] = (
        (n > 0) == moves, f"{n} collectives, {view.values[f'{cfg.kind}.rows']} rows per device "
                          f"(both splits kept: {f.einsum_rows_per_device})")
    return view


def trap_compiler(cfg: TrapConfig) -> View:
    from shardlab.profile import capture_hlo

    problem = mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(build_trap, cfg)
    view = View("hlo", detail=cap)
    view.add(f"{cfg.kind}.rows", _dot_rows(cap.module, cfg.out), "rows")
    tiles = S.parse_spec(S.spec_of(cap.result[0]), 3).tiles
    view.add(f"{cfg.kind}.out_tiles", _shape_str(tiles), "tiles")
    view.add(f"{cfg.kind}.out_spec", S.spec_of(cap.result[0]), "spec")
    return _trap_checks(view, cfg, cap.module)


def trap_tpu(cfg: TrapConfig, generation: str = "v5e") -> View:
    comp, why = _tpu_compile(build_trap, cfg, cfg.chips, generation)
    if comp is None:
        return View.skip("tpu", why or "")
    view = View("tpu", detail=comp)
    rows = _dot_rows(comp.module, cfg.out)
    view.add(f"{cfg.kind}.rows", rows, "rows")
    (_, local), = _root_shapes(comp.module)
    tiles = tuple(g // n for g, n in zip((cfg.batch, cfg.seq, cfg.out), local, strict=True))
    view.add(f"{cfg.kind}.out_tiles", _shape_str(tiles), "tiles")
    want = trap_formula(cfg)
    dots = [_shape_str(i.shape[0].dims) for i in comp.module.instructions.values()
            if i.opcode in ("dot", "convolution")]
    view = _trap_checks(view, cfg, comp.module)
    if view.values[f"{cfg.kind}.rows"] != want.values[f"{cfg.kind}.rows"]:
        view.differs[f"{cfg.kind}.rows"] = (
            f"XLA:TPU's per-chip dot is {', '.join(dots)} ({rows} rows, {view.values[f'{cfg.kind}.collectives']} "
            "collectives): the flattened [B·S, H] dot of XLA:CPU's program is not what the TPU compiler "
            "partitioned (measured)")
        for name in (f"{cfg.kind}.out_tiles", f"{cfg.kind}.collectives"):
            view.differs[name] = f"follows from XLA:TPU's per-chip dot (see {cfg.kind}.rows)"
    return view


def merge(views: list[View]) -> View:
    """One view from several of the same source (values, differs, notes, checks side by side)."""
    out = View(views[0].source, detail=[v.detail for v in views])
    for v in views:
        if not v.ran:
            return v
        if v.source != out.source:
            raise ValueError(f"cannot merge a {v.source} view into {out.source} views")
        out.values |= v.values
        out.units |= v.units
        out.differs |= v.differs
        out.checks |= v.checks
        out.notes += [n for n in v.notes if n not in out.notes]
    return out


def linear_trap(mesh_fsdp: int, mesh_tensor: int, batch: int, seq: int, hidden: int, out: int) -> list[View]:
    """``F.linear`` vs einsum on ``x[B_fsdp, S_tensor, H]``: the formula, CPU compiler and TPU compiler views,
    each holding both kinds (``linear.rows``, ``einsum.rows``, ``*.out_tiles``, ``*.collectives``)."""
    cfgs = [TrapConfig(mesh_fsdp, mesh_tensor, batch, seq, hidden, out, kind) for kind in ("linear", "einsum")]
    return [merge([view(c) for c in cfgs]) for view in (trap_formula, trap_compiler, trap_tpu)]


# ------------------------------------------------------------------------------------------ trace transfers
def transfers(cfg: ScanConfig, hiddens: list[int]) -> dict[str, Any] | None:
    """Host→device traffic of tracing one step: loop and scan (placeholders), scan without placeholders at the
    config's hidden and at each of ``hiddens`` (F = 4·h). None when the mesh does not tile this process."""
    from shardlab.xla_scan import measure as X

    if mesh_problem(cfg.mesh_fsdp, cfg.mesh_tensor, runtime.current().num_devices):
        return None
    f, t = cfg.mesh_fsdp, cfg.mesh_tensor
    out: dict[str, Any] = {"loop": X.trace_transfers(cfg.stack, "loop", f, t, True, cfg.seed),
                           "scan": X.trace_transfers(cfg.stack, "scan", f, t, True, cfg.seed),
                           # same graph as "scan", just traced: its scalar constants are cached already
                           "no_placeholder": X.trace_transfers(cfg.stack, "scan", f, t, False, cfg.seed, warm=False)}
    growth = {}
    for h in sorted(set(hiddens)):
        c = M.StackConfig(cfg.layers, h, 4 * h, cfg.batch, cfg.seq)
        growth[h] = (out["no_placeholder"] if (h, 4 * h) == (cfg.hidden, cfg.ffn)
                     else X.trace_transfers(c, "scan", f, t, False, cfg.seed))
    out["growth"] = growth
    return out


def record_transfers(rec: Any, cfg: ScanConfig, tt: dict[str, Any]) -> Any:
    """Record the trace transfers against the formula; a DataFrame of the growth with hidden."""
    import pandas as pd

    devices = runtime.current().num_devices
    for k in ("loop", "scan", "no_placeholder"):
        rec.measure(f"placeholder.trace.h2d.bytes.{k}", tt[k].h2d_bytes, "B", "metrics")
        rec.measure(f"placeholder.trace.ir_to_data.count.{k}", tt[k].ir_value_to_data, "tensors", "metrics")
    rec.check("placeholder.trace.zero", tt["scan"].h2d_bytes == 0 and tt["loop"].h2d_bytes == 0,
              f"scan {tt['scan'].h2d_bytes} B, loop {tt['loop'].h2d_bytes} B")
    want = FS.block_trace_transfer(cfg.batch, cfg.seq, cfg.hidden, cfg.ffn, devices=devices, placeholders=False)
    rec.agree("placeholder.trace.h2d.bytes.no_placeholder.model", "B", formula=want.total_bytes,
              metrics=tt["no_placeholder"].h2d_bytes)
    rec.agree("placeholder.trace.h2d.count.no_placeholder", "transfers", formula=want.transfers,
              metrics=tt["no_placeholder"].h2d_count)
    rows = []
    for h, t in tt["growth"].items():
        f_off = FS.block_trace_transfer(cfg.batch, cfg.seq, h, 4 * h, devices=devices, placeholders=False).total_bytes
        rec.agree(f"placeholder.trace.h2d.bytes.no_placeholder.H{h}", "B", formula=f_off, metrics=t.h2d_bytes)
        rows.append({"hidden": h, "ffn": 4 * h, "no placeholders h2d B (metrics)": t.h2d_bytes, "formula B": f_off})
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------------- explorer
def explore(cfg: ScanConfig, fsdp: int, tensor: int, layers: int, hidden: int) -> dict[str, dict[str, Any]]:
    """The explorer's run: the scan step on mesh (fsdp, tensor) at (L, hidden) with shard_as on and off."""
    c = cfg.replace(mesh_fsdp=fsdp, mesh_tensor=tensor, layers=layers, hidden=hidden, mode="scan")
    S.check_sharding(c.stack, fsdp, tensor, runtime.current().num_devices)
    res = {}
    for flag in (True, False):
        r = step(c.replace(shard_as=flag), check=False)
        res["on" if flag else "off"] = {"w_up grad spec": r.grad_specs["w_up"][0],
                                        "stacked grads B": sum(r.grad_bytes.values()),
                                        "while state B": r.backward_while_state_bytes,
                                        "buffers B": r.buffers_total_bytes}
    return res
