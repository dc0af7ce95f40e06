"""Block products and single collectives as cases: notebook 01's three splits and notebook 00's collectives.

Design
------
Each case holds its notebook's parameters ``p`` (:mod:`shardlab.core.params`: ``BlocksParams`` for 01,
``WelcomeParams`` for 00) and the variant it shows; :mod:`shardlab.core.harness` runs it through the four views::

    BlockCase(p, rule)                   y = x W over p = parts blocks, one per device, split by `rule`:
                                         column (W by columns: no collective), row (x by columns, W by rows: one
                                         all-reduce of the m×n partial sums over p devices), grid (p devices as a
                                         (2, p/2) grid: one all-reduce of an (m/2)×n partial within each group of
                                         p/2; the ledger runs the 2 row groups as 2 independent worlds)
    CollectiveCase(p, op, shape, label)  one all-reduce, all-gather or reduce-scatter over world_size ranks, each
                                         rank handing in a tensor of `shape`

The compilers' mesh is (copies, blocks) = (num_devices / p, p) — the first axis holds copies, the second the p
blocks — and the grid's (copies, r, c). Values are named ``<phase>.<op>.{count,bytes,elements,group_size,
wire_bytes}`` (phase ``col`` / ``row`` / ``grid`` or the collective's label, the names notebooks 00 / 01 record
under ``welcome.`` / ``blocks.``); the column rule records ``col.collective.count``, the grid also
``grid.collective.bytes``. Parity with the dense product (float64 of the same rounded operands) or with the
collective computed without communication is part of the ledger and CPU compiler views' checks; the compiled
programs are also checked for one group size and no other collective, and on XLA:CPU for the sharding strings
torch_xla gave x and W against :func:`shardlab.blocks.tiles.sharding_string`.

Example::

    cases, skipped = block_cases(BlocksParams(parts=4))     # column, row and the (2, 2) grid
    harness.record(rec, "blocks", *harness.views(cases["row"]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import torch
import torch_xla  # blocks.case is imported after runtime.setup() (the notebooks' order)
import torch_xla.distributed.spmd as xs

from shardlab import blocks, runtime
from shardlab.blocks import ring, tiles
from shardlab.blocks.params import BlocksParams, WelcomeParams
from shardlab.comm import Ledger
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import COMPILERS, View, traffic
from shardlab.formulas import blocks as F
from shardlab.formulas.common import reduction_dtype
from shardlab.formulas.dtypes import hlo_name
from shardlab.profile.hlo import HloModule

RULES = ("column", "row", "grid")
PHASES = {"column": "col", "row": "row", "grid": "grid"}
SPECS: dict[str, dict[str, tuple[str | None, ...]]] = {
    "column": {"x": (None, None), "W": (None, "model")},  # W[K, N_model], x replicated
    "row": {"x": (None, "model"), "W": ("model", None)},  # x[M, K_model], W[K_model, N]
    "grid": {"x": ("r", "c"), "W": ("c", None)},  # x[M_r, K_c], W[K_c, N]
}


def operands(p: BlocksParams) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] and W [k, n] in the notebook's dtype, the same for every view."""
    g = torch.Generator().manual_seed(p.seed)
    dt = getattr(torch, p.dtype)
    return torch.randn(p.m, p.k, generator=g).to(dt), torch.randn(p.k, p.n, generator=g).to(dt)


def dense(p: BlocksParams) -> torch.Tensor:
    """The oracle: x @ W in float64 of the rounded operands (so only the summation order differs)."""
    x, w = operands(p)
    return x.double() @ w.double()


def _close(a: torch.Tensor, b: torch.Tensor, dtype: str, terms: int) -> bool:
    """Equal up to summation order and rounding: each element is a sum of ``terms`` O(1) products or addends,
    so its size is about sqrt(terms) and each rounding step is off by a few units of the dtype's precision."""
    eps = {"float32": 2.0**-23, "bfloat16": 2.0**-8}[dtype]
    return torch.allclose(a.double(), b.double(), rtol=8 * eps, atol=8 * eps * max(terms, 1) ** 0.5)


def _formula_extra(view: View, phase: str, op: str, f: dict[str, Any]) -> View:
    """Group size (when there is a collective) and ring wire bytes of a formula view."""
    if f["count"]:
        view.add(f"{phase}.{op}.group_size", f["group_size"], "devices")
    view.add(f"{phase}.{op}.wire_bytes", f["wire_bytes"], "bytes")
    return view


def _ledger_extra(view: View, phase: str, op: str, ledger: Ledger) -> View:
    """Group size and wire bytes of the ledger's ``op`` — the wire counted chunk by chunk along the ring
    schedule (:func:`shardlab.blocks.ring.ledger_wire_bytes`), not the formula's factor: formula = ledger on
    ``wire_bytes`` then tests that factor."""
    rows = list(ledger.select(op))
    if rows:
        view.add(f"{phase}.{op}.group_size", rows[0].group_size, "devices")
    view.add(f"{phase}.{op}.wire_bytes", ring.ledger_wire_bytes(ledger, op), "bytes")
    return view


def _read_op(view: View, module: HloModule, phase: str, op: str, reduce_scatter: bool = False) -> View:
    """A compiled program's group size for ``op`` and checks that every such collective has one group size and
    that no other collective appears (``reduce_scatter``: an all-reduce + dynamic-slice counts as ``op``)."""
    src, colls = view.source, list(module.collectives)
    mine = [c for c in colls
            if c.op == op.replace("_", "-") or (reduce_scatter and c.op == "all-reduce" and c.feeds_dynamic_slice)]
    sizes = sorted({c.group_size for c in mine})
    if len(sizes) == 1:
        view.add(f"{phase}.{op}.group_size", sizes[0], "devices")
    elif sizes:
        view.checks[f"{src}.{phase}.one_group_size"] = (False, f"collectives with group sizes {sizes}")
    others = [c.op for c in colls if c not in mine]
    view.checks[f"{src}.{phase}.only_{op}"] = (not others, f"no other collective in the program: {others or 'none'}")
    return view


# ---------------------------------------------------------------------------------------- notebook 01: y = xW
def split_problem(p: BlocksParams, rule: str) -> str | None:
    """Why splitting ``y = x W`` by ``rule`` is not legal for ``p``'s sizes (None when it is)."""
    if rule not in RULES:
        return f"rule={rule!r} must be one of {RULES}"
    for name in ("m", "k", "n", "parts"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{name}={v!r} must be a positive int"
    if rule == "column" and p.parts > p.n:
        return f"parts={p.parts} is more than n={p.n}: every column block of W needs a column"
    if rule in ("row", "grid") and p.parts > p.k:
        return f"parts={p.parts} is more than k={p.k}: every block needs at least one row of W"
    if rule == "grid":
        if p.parts % 2:
            return f"parts={p.parts} is odd: the grid lays p devices out as (2, p/2)"
        if p.m % 2:
            return f"m={p.m} is odd: the grid splits x's rows in 2 (each row group needs m/2 rows)"
    return None


@dataclass(frozen=True)
class BlockCase(Case):
    """``y = x W`` (x: [m, k], W: [k, n]) split over ``p.parts`` blocks = devices by ``rule``."""

    size_name: ClassVar[str] = "parts"
    mesh_text: ClassVar[str] = "(copies, blocks) = (num_devices / parts, parts)"

    p: BlocksParams
    rule: str = "row"  # column | row | grid

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why this split is not legal for these sizes (None when it is)."""
        return split_problem(self.p, self.rule)

    @property
    def phase(self) -> str:
        return PHASES[self.rule]

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return () if self.rule == "column" else ("all_reduce",)

    @property
    def grid(self) -> tuple[int, int]:
        """(p_r, p_c) of the grid rule: 2 row groups of p/2 devices."""
        return 2, self.p.parts // 2

    @property
    def ranks(self) -> int:
        return self.grid[1] if self.rule == "grid" else self.p.parts

    def formula(self) -> View:
        p = self.p
        if self.rule == "column":
            return View("formula", {"col.collective.count": F.col_split_collectives()},
                        {"col.collective.count": "count"})
        f = (F.row_split_all_reduce(p.m, p.n, p.parts, p.dtype) if self.rule == "row"
             else F.grid_all_reduce(p.m, p.n, self.grid, p.dtype))
        view = traffic(View("formula", detail=f), self.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                       p.dtype)
        if self.rule == "grid":
            view.add("grid.collective.bytes", f["bytes"], "bytes")
        return _formula_extra(view, self.phase, "all_reduce", f)

    @property
    def grouped(self) -> bool:
        return self.rule == "grid"  # row group i is its own group of p/2 ranks

    def program(self) -> list[Program]:
        x, w = operands(self.p)
        if self.rule == "grid":  # row group i (x's row block i) is its own group of p/2 ranks running the row rule
            return [(blocks.row_rank, (x_i, w)) for x_i in blocks.split_rows(x, 2)]  # x_i: [m/2, k]
        return [((blocks.col_rank if self.rule == "column" else blocks.row_rank), (x, w))]

    def oracle(self) -> torch.Tensor:
        return dense(self.p)

    def parity(self, source: str, got: list[torch.Tensor] | list[list[torch.Tensor]], ref: torch.Tensor) -> Checks:
        dt, k, name = self.p.dtype, self.p.k, f"parity.{source}.{self.phase}"
        if source == "hlo":
            return {name: (_close(got[0], ref, dt, k), "XLA's y == x @ W")}
        if self.rule == "column":
            return {name: (_close(torch.cat(got, dim=1), ref, dt, k), "the column blocks, concatenated, == x @ W")}
        if self.rule == "row":
            return {name: (all(_close(y, ref, dt, k) for y in got), "every rank's y == x @ W")}
        return {name: (all(_close(torch.cat([g[j] for g in got], dim=0), ref, dt, k) for j in range(self.ranks)),
                       "every rank's row block of y, stacked over the row groups, == x @ W")}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        if self.rule == "column":
            view.add("col.collective.count", len(ledger), "count")
            return view
        if self.rule == "grid":
            view.add("grid.collective.bytes", ledger.payload_bytes(), "bytes")
        return _ledger_extra(view, self.phase, "all_reduce", ledger)

    def layout(self, num_devices: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The compilers' mesh: ``(copies, model)`` = (n / p, p); the grid's ``(copies, r, c)``."""
        copies = num_devices // self.p.parts
        if self.rule == "grid":
            return (copies, *self.grid), ("copies", "r", "c")
        return (copies, self.p.parts), ("copies", "model")

    def on_mesh(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x and W on the XLA devices, annotated with the rule's shardings."""
        shape, names = self.layout(runtime.current().num_devices)
        mesh = runtime.mesh(shape, names)
        dev = runtime.device()
        x, w = (t.to(dev) for t in operands(self.p))  # created on the CPU, moved, then annotated
        for t, spec in ((x, SPECS[self.rule]["x"]), (w, SPECS[self.rule]["W"])):
            xs.mark_sharding(t, mesh, spec)  # (None, None): replicated, said explicitly
        return x, w

    def graph(self) -> Step:
        x, w = self.on_mesh()
        return Step([x @ w])  # [m, n]

    def read(self, view: View, module: HloModule) -> View:
        p, src, colls = self.p, view.source, list(module.collectives)
        if self.rule == "column":  # count whatever is there
            view.add("col.collective.count", len(colls), "count")
            if p.n % p.parts == 0:
                view.checks[f"{src}.col.no_collective"] = (not colls, f"collectives: {[c.op for c in colls] or 'none'}")
            else:  # measured on both compilers: an unevenly split y comes back whole, through an all-gather
                gathers = [c for c in colls if c.op == "all-gather"]
                view.checks[f"{src}.col.only_output_gather"] = (
                    len(gathers) == len(colls), f"n={p.n} over p={p.parts}: collectives {[c.op for c in colls]}")
                if colls:
                    view.differs["col.collective.count"] = (
                        f"the {src} program all-gathers y ({sum(c.operand_bytes for c in gathers)} B per device): "
                        f"n={p.n} columns do not split evenly over p={p.parts}, and XLA hands the unevenly split "
                        "result back whole")
        else:
            view = _read_op(view, module, self.phase, "all_reduce")
        if self.rule == "grid":
            view.add("grid.collective.bytes", sum(c.operand_bytes for c in colls), "bytes")
            if "grid.all_reduce.bytes" in view.differs:
                view.differs["grid.collective.bytes"] = view.differs["grid.all_reduce.bytes"]
        if src == "hlo":  # the operands as the graph annotates them (device data: nothing is executed)
            x, w = self.on_mesh()
            strings = {"x": torch_xla._XLAC._get_xla_sharding_spec(x), "W": torch_xla._XLAC._get_xla_sharding_spec(w)}
            shape, names = self.layout(runtime.current().num_devices)
            predicted = {k: tiles.sharding_string(shape, names, SPECS[self.rule][k]) for k in ("x", "W")}
            view.checks[f"hlo.{self.phase}.sharding_strings"] = (
                strings == predicted, f"torch_xla {strings} vs predicted {predicted}")
            view.notes.append(f"{self.phase}: mesh {dict(zip(names, shape, strict=True))}, x {strings['x']}, "
                              f"W {strings['W']}")
        return view


def block_cases(p: BlocksParams) -> tuple[dict[str, BlockCase], dict[str, str]]:
    """Notebook 01's cases — column, row and, when p is even, the (2, p/2) grid — and the rules left out with the
    reason (``{"grid": "parts=3 is odd: ..."}``)."""
    why = {rule: split_problem(p, rule) for rule in RULES}
    return ({rule: BlockCase(p, rule) for rule in RULES if why[rule] is None},
            {rule: reason for rule, reason in why.items() if reason is not None})


def carried(case: BlockCase, kinds: tuple[str, ...] = ("cpu", "tpu")) -> View:
    """The formula for what the reduction carries on each device kind: ``<phase>.all_reduce.on_<kind>.dtype``
    (HLO name) and ``.bytes``, with ``reduction_dtype(dtype, kind)`` (XLA:CPU adds bf16 in f32)."""
    p, view = case.p, View("formula")
    for kind in kinds:
        dt = reduction_dtype(p.dtype, kind)
        f = (F.row_split_all_reduce(p.m, p.n, p.parts, dt) if case.rule == "row"
             else F.grid_all_reduce(p.m, p.n, case.grid, dt))
        if f["count"]:
            view.add(f"{case.phase}.all_reduce.on_{kind}.dtype", hlo_name(dt), "dtype")
        view.add(f"{case.phase}.all_reduce.on_{kind}.bytes", f["bytes"], "bytes")
    return view


def on_device(view: View, kind: str, phase: str) -> View:
    """A compiler view's all-reduce element type and bytes, renamed for the device kind it compiled for."""
    if not view.ran:
        return View.skip(view.source, view.skipped or "")
    out = View(view.source, detail=view.detail)
    dts = sorted({c.dtype for c in view.detail.module.collectives if c.op == "all-reduce"})
    if dts:
        out.add(f"{phase}.all_reduce.on_{kind}.dtype", "/".join(dts), "dtype")
    out.add(f"{phase}.all_reduce.on_{kind}.bytes", view.values[f"{phase}.all_reduce.bytes"], "bytes")
    return out


def measured(name: str, *views: View) -> Any:
    """The first compiler measurement of ``name`` among ``views`` that ran (None when none did)."""
    return next((v.values[name] for v in views if v.ran and name in v.values), None)


# ------------------------------------------------------------------------------- notebook 00: one collective
@dataclass(frozen=True)
class CollectiveCase(Case):
    """One collective over ``p.world_size`` ranks; rank r hands in a tensor of ``shape``.

    all_reduce: the tensors are partial sums, every rank ends with their sum ([*shape]);
    reduce_scatter: the same, rank r ends with block r of the sum (dim 0 cut in W);
    all_gather: rank r's tensor is its shard, every rank ends with all of them ([W, *shape]).
    The compiled graph: x [W, *shape] split by rows over the mesh's W devices, then ``x.sum(0)`` replicated
    (all-reduce), the same sum kept split along dim 0 (reduce-scatter), or ``x * 2`` replicated (all-gather).
    """

    size_name: ClassVar[str] = "world_size"
    mesh_text: ClassVar[str] = "(copies, blocks) = (num_devices / world_size, world_size)"

    p: WelcomeParams
    op: str
    shape: tuple[int, ...]
    label: str = ""  # measurement phase ("sum" ...); default: the op

    def __post_init__(self) -> None:
        if self.op not in F.COLLECTIVES:
            raise ValueError(f"op={self.op!r} must be one of {F.COLLECTIVES}")
        if not self.shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.shape):
            raise ValueError(f"shape={self.shape!r} must be a non-empty tuple of positive ints")
        if self.op == "reduce_scatter" and self.shape[0] % self.p.world_size:
            raise ValueError(f"shape[0]={self.shape[0]} is not divisible by world_size={self.p.world_size} "
                             "(the reduce-scatter cuts dim 0 of the sum into one block per rank)")

    @property
    def phase(self) -> str:
        return self.label or self.op

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.op,)

    @property
    def cpu_reduce_scatter(self) -> bool:  # type: ignore[override]
        return self.op == "reduce_scatter"

    def inputs(self) -> torch.Tensor:
        """[W, *shape]: rank r's tensor is row r."""
        g = torch.Generator().manual_seed(self.p.seed)
        return torch.randn(self.p.world_size, *self.shape, generator=g).to(getattr(torch, self.dtype))

    def formula(self) -> View:
        f = F.collective(self.op, math.prod(self.shape), self.p.world_size, self.dtype)
        view = traffic(View("formula", detail=f), self.phase, {self.op: f["count"]}, {self.op: f["bytes"]},
                       self.dtype, self.ops)
        return _formula_extra(view, self.phase, self.op, f)

    def program(self) -> list[Program]:
        return [(blocks.collective_rank, (self.inputs(), self.op))]

    def oracle(self) -> list[torch.Tensor]:
        """Each rank's result, computed without any collective (float64)."""
        data, w = self.inputs().double(), self.p.world_size
        if self.op == "all_reduce":
            return [data.sum(0)] * w
        if self.op == "reduce_scatter":
            return list(data.sum(0).chunk(w, dim=0))
        return [data] * w

    def parity(self, source: str, got: list[torch.Tensor], ref: list[torch.Tensor]) -> Checks:
        w, name = self.p.world_size, f"parity.{source}.{self.phase}"
        if source == "hlo":  # the program's one output, gathered to the host by .cpu()
            want = {"all_reduce": ref[0], "reduce_scatter": torch.cat(ref, dim=0), "all_gather": ref[0] * 2}[self.op]
            return {name: (_close(got[0], want, self.dtype, w), "XLA's result == the same computed without "
                                                                "communication")}
        return {name: (all(_close(o, e, self.dtype, w) for o, e in zip(got, ref, strict=True)),
                       f"every rank's {self.op.replace('_', '-')} result == the same computed without communication")}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        return _ledger_extra(view, self.phase, self.op, ledger)

    def graph(self) -> Step:
        """The GSPMD program whose partitioning needs exactly ``op``."""
        n = runtime.current().num_devices
        mesh = runtime.mesh((n // self.p.world_size, self.p.world_size), ("copies", "model"))
        x = self.inputs().to(runtime.device())  # [W, *shape], row r on block r of the mesh
        xs.mark_sharding(x, mesh, ("model",) + (None,) * len(self.shape))
        if self.op == "all_reduce":
            return Step([x.sum(0)])  # [*shape], replicated: the partial sums are added across the devices
        if self.op == "reduce_scatter":
            y = x.sum(0)  # [*shape], asked to stay split along dim 0: each device keeps its block of the sum
            xs.mark_sharding(y, mesh, ("model",) + (None,) * (len(self.shape) - 1))
            return Step([y])
        y = x * 2  # [W, *shape], asked for on every device (x * 1 would be folded away and ask for nothing)
        xs.mark_sharding(y, mesh, (None,) * (len(self.shape) + 1))
        return Step([y])

    def read(self, view: View, module: HloModule) -> View:
        return _read_op(view, module, self.phase, self.op, reduce_scatter=self.op == "reduce_scatter")


# ------------------------------------------------------------------- notebook 01: sharded matmuls on (X, Y)
MATMUL_MESH = (2, 4)  # (X, Y): distinct sizes, so a collective's group size names its axis
MATMUL_SPECS: dict[str, tuple[str, tuple[str | None, ...], tuple[str | None, ...], tuple[str, ...] | None]] = {
    # case: (what it shows, A's spec, B's spec, C's spec asked for or None); A [I, J], B [J, K] (5, 5b: [J, I])
    "1": ("A[I_X, J] · B[J, K_Y]: no contracting dim split", ("X", None), (None, "Y"), None),
    "2": ("A[I, J_X] · B[J, K]: one operand's contracting dim split", (None, "X"), (None, None), None),
    "3": ("A[I, J_X] · B[J_X, K]: both contracting dims split", (None, "X"), ("X", None), None),
    "4": ("A[I_X, J] · B[J, K_X]: both output dims want X", ("X", None), (None, "X"), None),
    "5": ("A[M_X, N_Y] · B[N_Y, M_X]: 3 and 4 at once (the 2-D weight gradient)", ("X", "Y"), ("Y", "X"), None),
    "5b": ("the same, C asked for as C[M_X, M_Y] (what shard_as asks)", ("X", "Y"), ("Y", "X"), ("X", "Y")),
}


def root_elements(module: HloModule) -> int:
    """Elements per device of the program's (first) result: the entry computation's root."""
    root = next(module.instructions[n] for n in module.computations[module.entry] if module.instructions[n].is_root)
    return math.prod(root.shape[0].dims)


@dataclass(frozen=True)
class MatmulCase(Case):
    """``C = A·B`` on the mesh (copies, X, Y) = (n / 8, 2, 4), annotated as matmul ``case`` (:data:`MATMUL_SPECS`;
    sizes ``p.matmul`` = (I, J, K)): what the algebra fixes (``formulas.blocks.sharded_matmul``) against what each
    partitioner emits. No per-rank program: the lesson is what the partitioners choose."""

    mesh_text: ClassVar[str] = "(copies, X, Y) = (num_devices / 8, 2, 4)"

    p: BlocksParams
    case: str = "1"
    ask: tuple[str | None, ...] | None = None  # C's spec asked for instead of the case's (an exercise's answer)

    def __post_init__(self) -> None:
        if self.case not in MATMUL_SPECS:
            raise ValueError(f"case={self.case!r} is not one of {tuple(MATMUL_SPECS)}")
        if self.ask is not None and (not isinstance(self.ask, tuple) or len(self.ask) != 2):
            raise ValueError(f"ask={self.ask!r} must be a spec for the 2-D C: a tuple of two mesh axes or None")

    @property
    def phase(self) -> str:
        return f"case{self.case}"

    @property
    def devices(self) -> int:
        return math.prod(MATMUL_MESH)

    def mesh_problem(self, num_devices: int) -> str | None:
        n = self.devices
        if num_devices % n:
            return (f"the matmul mesh (X 2, Y 4) needs a multiple of {n} devices; this process has "
                    f"num_devices={num_devices}")
        return None

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(k.removesuffix(".count") for k in self.formula_terms() if k.endswith(".count")
                     and k != "collective.count")

    @property
    def cpu_reduce_scatter(self) -> bool:  # type: ignore[override]
        return self.case == "5b"  # XLA:CPU's all-reduce + dynamic-slice is the reduce-scatter asked for

    def formula_terms(self) -> dict[str, int]:
        return F.sharded_matmul(self.case, *self.p.matmul, MATMUL_MESH, self.dtype)

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A [I, J] and B [J, K] (cases 5, 5b: [J, I]), seeded, in the notebook's dtype."""
        i, j, k = self.p.matmul
        g = torch.Generator().manual_seed(self.p.seed + 7)
        dt = getattr(torch, self.dtype)
        return torch.randn(i, j, generator=g).to(dt), torch.randn(j, i if self.case in ("5", "5b") else k,
                                                                   generator=g).to(dt)

    def formula(self) -> View:
        units = {"count": "count", "elements": "elements", "bytes": "bytes", "group_size": "devices"}
        view = View("formula", detail=self.formula_terms())
        for name, value in self.formula_terms().items():
            view.add(f"{self.phase}.{name}", value, units[name.rsplit(".", 1)[1]])
        return view

    def oracle(self) -> torch.Tensor:
        a, b = self.operands()
        return a.double() @ b.double()

    def parity(self, source: str, got: list[torch.Tensor], ref: torch.Tensor) -> Checks:
        return {f"parity.hlo.{self.phase}": (_close(got[0], ref, self.dtype, self.p.matmul[1]), "XLA's C == A @ B")}

    def graph(self) -> Step:
        n = runtime.current().num_devices
        mesh = runtime.mesh((n // self.devices, *MATMUL_MESH), ("copies", "X", "Y"))
        _, a_spec, b_spec, c_spec = MATMUL_SPECS[self.case]
        c_spec = self.ask if self.ask is not None else c_spec
        a, b = (t.to(runtime.device()) for t in self.operands())  # created on the CPU, moved, then annotated
        xs.mark_sharding(a, mesh, a_spec)
        xs.mark_sharding(b, mesh, b_spec)
        c = a @ b  # [I, K] (5, 5b: [I, I])
        if c_spec is not None:
            xs.mark_sharding(c, mesh, c_spec)
        return Step([c])

    def read(self, view: View, module: HloModule) -> View:
        ph, colls = self.phase, list(module.collectives)
        view.add(f"{ph}.C.elements", root_elements(module), "elements")
        if not self.ops:
            view.add(f"{ph}.collective.count", len(colls), "count")
        for op in self.ops:
            mine = [c for c in colls if c.op == op.replace("_", "-")
                    or (op == "reduce_scatter" and self.cpu_reduce_scatter and c.feeds_dynamic_slice)]
            sizes = sorted({c.group_size for c in mine})
            if len(sizes) == 1:
                view.add(f"{ph}.{op}.group_size", sizes[0], "devices")
        permutes = [c for c in colls if c.op == "collective-permute"]
        if self.case == "4":  # measured: both partitioners move B from X onto Y first, then gather over Y
            view.add(f"{ph}.collective_permute.count", len(permutes), "count")
        elif self.case == "5b" and permutes and not view.get(f"{ph}.reduce_scatter.count"):
            for q in ("count", "bytes", "elements"):
                view.differs[f"{ph}.reduce_scatter.{q}"] = (
                    f"the {view.source} compiler sent the Y partial sums with {len(permutes)} collective-permutes "
                    f"at these sizes (matmul={self.p.matmul}): a reduce-scatter decomposed, C still [M_X, M_Y]")
        return view


def matmul_cases(p: BlocksParams) -> dict[str, MatmulCase]:
    """Notebook 01's sharded-matmul cases, in order."""
    return {c: MatmulCase(p, c) for c in MATMUL_SPECS}


def matmul_table(cases: dict[str, MatmulCase], compiled: dict[str, list[View]]) -> pd.DataFrame:
    """What each partitioner emitted per case: its collectives (op, element type, per-device operand shape, the
    mesh axis its groups run over) and C's per-device elements; one row per case and compiler that ran."""
    rows = []
    for name, case in cases.items():
        what, a_spec, b_spec, c_spec = MATMUL_SPECS[name]
        for v in compiled[name]:
            if not v.ran:
                continue
            module = v.detail.module
            shape = (module.num_partitions // case.devices, *MATMUL_MESH)
            emitted = [f"{c.op} {c.dtype}{list(c.operand_shapes[0])} "
                       + ("between device pairs" if c.op == "collective-permute" else
                          f"over {tiles.group_axes(c.replica_groups, shape, ('copies', 'X', 'Y'))}")
                       + (" + dynamic-slice" if c.feeds_dynamic_slice else "") for c in module.collectives]
            rows.append({"case": name, "what": what, "C asked": str(c_spec) if c_spec else "free",
                         "compiler": COMPILERS[v.source],
                         "collectives": "; ".join(emitted) or "none", "C elements per device": root_elements(module)})
    return pd.DataFrame(rows)
