"""Block products and single collectives, four views each: formula, ledger, CPU compiler, TPU compiler.

Design
------
Two configuration dataclasses, every view computing the same step from the same numbers:

- :class:`BlockConfig` (notebook 01): ``Y = x W`` split over ``parts`` = p blocks, one block per device, by
  one of three rules — ``column`` (W by columns: no collective), ``row`` (x by columns, W by rows: one
  all-reduce of the m×n partial sums over p devices), ``grid`` (p devices as a (2, p/2) grid: one all-reduce
  of an (m/2)×n partial within each group of p/2).
- :class:`CollectiveConfig` (notebook 00): one all-reduce, all-gather or reduce-scatter over ``world_size``
  ranks, each rank handing in a tensor of ``shape``.

::

    formula(cfg)    the algebra                                  (shardlab.formulas.blocks)
    ledger(cfg)     per-rank code in a SimulatedWorld            (row_rank, col_rank, collective_rank below)
    compiler(cfg)   mark_sharding on the CPU devices; the HLO of XLA's SPMD partitioner
    tpu(cfg)        the same graph compiled by XLA:TPU for a TPU topology (compile-only)

Every view is at the configuration's own p (or W): formula and ledger need no devices. The CPU compiler
builds a mesh ``(num_devices / p, p)`` — the first axis holds copies, the second the p blocks — and is
skipped with the reason when p does not tile the process's devices. The TPU compiler compiles that mesh for
a ``num_devices``-chip topology, or, when p does not tile the process, a ``(1, p)`` mesh for a p-chip
topology in a helper process; on a real TPU host whose own program is the ``hlo`` column it is skipped.

Values are named ``<phase>.<op>.{count,bytes,elements,group_size}`` (phase ``col`` / ``row`` / ``grid`` or
the collective's label), the names notebook 00 / 01 record under ``welcome.`` / ``blocks.``. Parity with the
dense product (float64 of the same rounded operands) is part of the ledger and compiler views' ``checks``.

Example::

    cfg = BlockConfig("row", m=16, k=64, n=32, parts=4)
    record(rec, "blocks", formula(cfg), ledger(cfg), compiler(cfg), tpu(cfg))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from shardlab import blocks, runtime
from shardlab.blocks import tiles
from shardlab.comm import SimulatedWorld
from shardlab.dtypes import hlo_name
from shardlab.formulas import blocks as F
from shardlab.formulas.common import reduction_dtype
from shardlab.views import View, build_graph, collectives_view, formula, ledger, ledger_view, traffic

RULES = ("column", "row", "grid")
PHASES = {"column": "col", "row": "row", "grid": "grid"}
COLLECTIVES = F.COLLECTIVES


# ------------------------------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class BlockConfig:
    """``Y = x W`` (x: [m, k], W: [k, n]) split over ``parts`` blocks = devices by ``rule``."""

    rule: str  # column | row | grid
    m: int
    k: int
    n: int
    parts: int  # p: blocks, one per device
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why this configuration is not a legal split (None when it is)."""
        if self.rule not in RULES:
            return f"rule={self.rule!r} must be one of {RULES}"
        for name in ("m", "k", "n", "parts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                return f"{name}={v!r} must be a positive int"
        if self.rule == "column" and self.parts > self.n:
            return f"parts={self.parts} is more than n={self.n}: every column block of W needs a column"
        if self.rule in ("row", "grid") and self.parts > self.k:
            return f"parts={self.parts} is more than k={self.k}: every block needs at least one row of W"
        if self.rule == "grid":
            if self.parts % 2:
                return f"parts={self.parts} is odd: the grid lays p devices out as (2, p/2)"
            if self.m % 2:
                return f"m={self.m} is odd: the grid splits x's rows in 2 (each row group needs m/2 rows)"
        return None

    @property
    def phase(self) -> str:
        return PHASES[self.rule]

    @property
    def grid(self) -> tuple[int, int]:
        """(p_r, p_c) of the grid rule: 2 row groups of p/2 devices."""
        return 2, self.parts // 2

    @property
    def group(self) -> int:
        """Devices that add partial sums together (1 for the column rule: nobody adds anything)."""
        return {"column": 1, "row": self.parts, "grid": self.parts // 2}[self.rule]

    @classmethod
    def from_params(cls, p: Any, rule: str, **overrides: Any) -> BlockConfig:
        kw = dict(rule=rule, m=p.m, k=p.k, n=p.n, parts=p.parts, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


def configs_from_params(p: Any) -> tuple[dict[str, BlockConfig], dict[str, str]]:
    """Notebook 01's configurations — column, row and, when p is even, the (2, p/2) grid — and the rules left out
    with the reason (``{"grid": "parts=3 is odd: ..."}``)."""
    configs, skipped = {}, {}
    for rule in RULES:
        try:
            configs[rule] = BlockConfig.from_params(p, rule)
        except ValueError as exc:
            skipped[rule] = str(exc)
    return configs, skipped


@dataclass(frozen=True)
class CollectiveConfig:
    """One collective over ``world_size`` ranks; rank r hands in a tensor of ``shape``.

    all_reduce: the tensors are partial sums, every rank ends with their sum ([*shape]);
    reduce_scatter: the same, rank r ends with block r of the sum (dim 0 cut in W);
    all_gather: rank r's tensor is its shard, every rank ends with all of them ([W, *shape]).
    """

    op: str
    world_size: int
    shape: tuple[int, ...]
    dtype: str = "float32"
    label: str = ""  # measurement phase ("sum" ...); default: the op
    seed: int = 0

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVES:
            raise ValueError(f"op={self.op!r} must be one of {COLLECTIVES}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r} must be a positive int")
        if not self.shape or any(not isinstance(s, int) or s < 1 for s in self.shape):
            raise ValueError(f"shape={self.shape!r} must be a non-empty tuple of positive ints")
        if self.op == "reduce_scatter" and self.shape[0] % self.world_size:
            raise ValueError(f"shape[0]={self.shape[0]} is not divisible by world_size={self.world_size} "
                             "(the reduce-scatter cuts dim 0 of the sum into one block per rank)")

    @property
    def phase(self) -> str:
        return self.label or self.op

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def group(self) -> int:
        return self.world_size

    @property
    def parts(self) -> int:  # devices the mesh's block axis needs (the same rule as BlockConfig)
        return self.world_size


# ----------------------------------------------------------------------------------------------- the data
def operands(cfg: BlockConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] and W [k, n] in the configuration's dtype, the same for every view."""
    g = torch.Generator().manual_seed(cfg.seed)
    dt = getattr(torch, cfg.dtype)
    return torch.randn(cfg.m, cfg.k, generator=g).to(dt), torch.randn(cfg.k, cfg.n, generator=g).to(dt)


def dense(cfg: BlockConfig) -> torch.Tensor:
    """The oracle: x @ W in float64 of the rounded operands (so only the summation order differs)."""
    x, w = operands(cfg)
    return x.double() @ w.double()


def collective_inputs(cfg: CollectiveConfig) -> torch.Tensor:
    """[W, *shape]: rank r's tensor is row r."""
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randn(cfg.world_size, *cfg.shape, generator=g).to(getattr(torch, cfg.dtype))


def expected(cfg: CollectiveConfig) -> list[torch.Tensor]:
    """Each rank's result, computed without any collective (float64)."""
    data = collective_inputs(cfg).double()
    w = cfg.world_size
    if cfg.op == "all_reduce":
        return [data.sum(0)] * w
    if cfg.op == "reduce_scatter":
        return list(data.sum(0).chunk(w, dim=0))
    return [data] * w


def _close(a: torch.Tensor, b: torch.Tensor, dtype: str, terms: int) -> bool:
    """Equal up to summation order and rounding: each element is a sum of ``terms`` O(1) products or addends,
    so its size is about sqrt(terms) and each rounding step is off by a few units of the dtype's precision."""
    eps = {"float32": 2.0**-23, "bfloat16": 2.0**-8}[dtype]
    return torch.allclose(a.double(), b.double(), rtol=8 * eps, atol=8 * eps * max(terms, 1) ** 0.5)


# ------------------------------------------------------------------------------------------- per-rank code
def col_rank(comm: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Column rule, rank r: Y's column block r is x @ W_r — no collective."""
    w_r = blocks.split_cols(w, comm.world_size)[comm.rank]  # [k, n_r]
    return x @ w_r  # [m, n_r]


def row_rank(comm: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Row rule, rank r: the partial sum x_r @ W_r (full size, Y{U}), then one all-reduce adds them."""
    x_r = blocks.split_cols(x, comm.world_size)[comm.rank]  # [m, k_r]
    w_r = blocks.split_rows(w, comm.world_size)[comm.rank]  # [k_r, n]
    return comm.all_reduce(x_r @ w_r)  # [m, n]: Σ_r x_r W_r


def collective_rank(comm: Any, data: torch.Tensor, op: str) -> torch.Tensor:
    """Rank r hands ``data[r]`` to one collective."""
    mine = data[comm.rank]  # [*shape]
    if op == "all_reduce":
        return comm.all_reduce(mine)  # [*shape]: the sum over ranks
    if op == "reduce_scatter":
        return comm.reduce_scatter(mine, dim=0)  # [shape0 / W, ...]: rank r's block of the sum
    return comm.all_gather(mine.unsqueeze(0), dim=0)  # [W, *shape]: every rank's tensor


def rank_arithmetic(op: str, world_size: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(before, after) per rank for ``op`` on data where rank r holds r + 1 (all-gather: a 1-element shard).

    After an all-reduce every entry is 1 + 2 + ... + W = W (W + 1) / 2; after a reduce-scatter rank r holds
    element r of that sum; after an all-gather every rank holds [1, 2, ..., W].
    """
    w = world_size
    if op == "all_gather":
        data = torch.arange(1, w + 1, dtype=torch.float32).reshape(w, 1)  # rank r: [r + 1]
    else:
        data = torch.arange(1, w + 1, dtype=torch.float32).reshape(w, 1).expand(w, w).contiguous()  # [r + 1] * W
    outs = SimulatedWorld(w).run(collective_rank, data, op)
    before = list(data)
    after = [o.reshape(-1) for o in outs]
    return before, after


# --------------------------------------------------------------------------------------------------- views
def _extra(view: View, phase: str, op: str, f: dict[str, Any], wire: bool = True) -> View:
    """Group size (when there is a collective) and ring wire bytes of a formula / ledger view."""
    if f["count"]:
        view.add(f"{phase}.{op}.group_size", f["group_size"], "devices")
    if wire:
        view.add(f"{phase}.{op}.wire_bytes", f["wire_bytes"], "bytes")
    return view


@formula.register
def _(cfg: BlockConfig) -> View:
    if cfg.rule == "column":
        return View("formula", {"col.collective.count": F.col_split_collectives()}, {"col.collective.count": "count"})
    f = (F.row_split_all_reduce(cfg.m, cfg.n, cfg.parts, cfg.dtype) if cfg.rule == "row"
         else F.grid_all_reduce(cfg.m, cfg.n, cfg.grid, cfg.dtype))
    view = traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)
    if cfg.rule == "grid":
        view.add("grid.collective.bytes", f["bytes"], "bytes")
    return _extra(view, cfg.phase, "all_reduce", f)


@formula.register
def _(cfg: CollectiveConfig) -> View:
    f = F.collective(cfg.op, cfg.numel, cfg.world_size, cfg.dtype)
    view = traffic(View("formula", detail=f), cfg.phase, {cfg.op: f["count"]}, {cfg.op: f["bytes"]}, cfg.dtype,
                   (cfg.op,))
    return _extra(view, cfg.phase, cfg.op, f)


def _ledger_extra(view: View, phase: str, op: str, led: Any) -> View:
    rows = list(led.select(op))
    if rows:
        view.add(f"{phase}.{op}.group_size", rows[0].group_size, "devices")
    view.add(f"{phase}.{op}.wire_bytes", led.wire_bytes(op), "bytes")
    return view


@ledger.register
def _(cfg: BlockConfig) -> View:
    x, w = operands(cfg)
    ref = dense(cfg)
    if cfg.rule == "column":
        sim = SimulatedWorld(cfg.parts)
        ys = sim.run(col_rank, x, w)
        view = View("ledger", {"col.collective.count": len(sim.ledger)}, {"col.collective.count": "count"},
                    detail={"ledger": sim.ledger, "ranks": ys})
        view.checks["parity.ledger.col"] = (_close(torch.cat(ys, dim=1), ref, cfg.dtype, cfg.k),
                                            "the column blocks, concatenated, == x @ W")
        return view
    if cfg.rule == "row":
        sim = SimulatedWorld(cfg.parts)
        ys = sim.run(row_rank, x, w)
        view = ledger_view(sim.ledger, "row", ("all_reduce",), detail={"ledger": sim.ledger, "ranks": ys})
        view.checks["parity.ledger.row"] = (all(_close(y, ref, cfg.dtype, cfg.k) for y in ys),
                                            "every rank's Y == x @ W")
        return _ledger_extra(view, "row", "all_reduce", sim.ledger)
    # grid: row group i (x's row block i) is its own group of p_c ranks running the row rule on x_i
    p_r, p_c = cfg.grid
    sims, ys = [], []
    for x_i in blocks.split_rows(x, p_r):  # [m/2, k]
        sim = SimulatedWorld(p_c)
        ys.append(sim.run(row_rank, x_i, w))
        sims.append(sim)
    led = sims[0].ledger
    view = ledger_view(led, "grid", ("all_reduce",), detail={"ledger": led, "ranks": ys})
    view.add("grid.collective.bytes", led.payload_bytes(), "bytes")
    view.checks["ledger.grid.groups_alike"] = (all(s.ledger == led for s in sims),
                                               f"the {p_r} row groups issue identical collectives")
    view.checks["parity.ledger.grid"] = (
        all(_close(torch.cat([g[j] for g in ys], dim=0), ref, cfg.dtype, cfg.k) for j in range(p_c)),
        "every rank's row block of Y, stacked over the row groups, == x @ W")
    return _ledger_extra(view, "grid", "all_reduce", led)


@ledger.register
def _(cfg: CollectiveConfig) -> View:
    data = collective_inputs(cfg)
    sim = SimulatedWorld(cfg.world_size)
    outs = sim.run(collective_rank, data, cfg.op)
    view = ledger_view(sim.ledger, cfg.phase, (cfg.op,), detail={"ledger": sim.ledger, "ranks": outs})
    view.checks[f"parity.ledger.{cfg.phase}"] = (
        all(_close(o, e, cfg.dtype, cfg.world_size) for o, e in zip(outs, expected(cfg), strict=True)),
        f"every rank's {cfg.op.replace('_', '-')} result == the same computed without communication")
    return _ledger_extra(view, cfg.phase, cfg.op, sim.ledger)


# -------------------------------------------------------------------------------------------- the compilers
def mesh_problem(parts: int, num_devices: int, name: str = "p") -> str | None:
    """Why a mesh (num_devices / p, p) cannot be built on this world (None when it can); ``name`` is what the
    notebook calls p (``parts``, ``world_size``)."""
    return runtime.axis_problem(parts, num_devices, name, f"(copies, blocks) = (num_devices / {name}, {name})")


def _name(cfg: BlockConfig | CollectiveConfig) -> str:
    return "parts" if isinstance(cfg, BlockConfig) else "world_size"


def mesh_layout(cfg: BlockConfig | CollectiveConfig, num_devices: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh the compiler views build: ``(copies, model)`` = (n / p, p); the grid: ``(copies, r, c)``."""
    copies = num_devices // cfg.parts
    if isinstance(cfg, BlockConfig) and cfg.rule == "grid":
        return (copies, *cfg.grid), ("copies", "r", "c")
    return (copies, cfg.parts), ("copies", "model")


SPECS: dict[str, dict[str, tuple[str | None, ...]]] = {
    "column": {"x": (None, None), "W": (None, "model")},  # W[K, N_model], x replicated
    "row": {"x": (None, "model"), "W": ("model", None)},  # x[M, K_model], W[K_model, N]
    "grid": {"x": ("r", "c"), "W": ("c", None)},  # x[M_r, K_c], W[K_c, N]
}


def _on_mesh(cfg: BlockConfig) -> tuple[torch.Tensor, torch.Tensor, dict[str, str]]:
    """x and W on the XLA devices, annotated; and the sharding strings torch_xla reports for them."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    shape, names = mesh_layout(cfg, runtime.current().num_devices)
    mesh = runtime.mesh(shape, names)
    dev = runtime.device()
    x, w = (t.to(dev) for t in operands(cfg))  # created on the CPU, moved, then annotated
    for t, spec in ((x, SPECS[cfg.rule]["x"]), (w, SPECS[cfg.rule]["W"])):
        xs.mark_sharding(t, mesh, spec)  # (None, None): replicated, said explicitly
    return x, w, {"x": torch_xla._XLAC._get_xla_sharding_spec(x), "W": torch_xla._XLAC._get_xla_sharding_spec(w)}


@build_graph.register
def _(cfg: BlockConfig) -> list[torch.Tensor]:
    """Y = x @ W with the rule's shardings on the current world, NOT synced."""
    x, w, _ = _on_mesh(cfg)
    return [x @ w]  # [m, n]


@build_graph.register
def _(cfg: CollectiveConfig) -> list[torch.Tensor]:
    """The GSPMD program whose partitioning needs exactly ``cfg.op``, NOT synced."""
    import torch_xla.distributed.spmd as xs

    shape, names = mesh_layout(cfg, runtime.current().num_devices)
    mesh = runtime.mesh(shape, names)
    x = collective_inputs(cfg).to(runtime.device())  # [W, *shape], row r on block r of the mesh
    xs.mark_sharding(x, mesh, ("model",) + (None,) * len(cfg.shape))
    rest = (None,) * (len(cfg.shape) - 1)
    if cfg.op == "all_reduce":
        return [x.sum(0)]  # [*shape], replicated: the partial sums are added across the devices
    if cfg.op == "reduce_scatter":
        y = x.sum(0)  # [*shape], asked to stay split along dim 0: each device keeps its block of the sum
        xs.mark_sharding(y, mesh, ("model", *rest))
        return [y]
    y = x * 2  # [W, *shape], asked for on every device (x * 1 would be folded away and ask for nothing)
    xs.mark_sharding(y, mesh, (None,) * (len(cfg.shape) + 1))
    return [y]


def _ops(cfg: BlockConfig | CollectiveConfig) -> tuple[str, ...]:
    if isinstance(cfg, CollectiveConfig):
        return (cfg.op,)
    return () if cfg.rule == "column" else ("all_reduce",)


def _module_view(source: str, module: Any, cfg: BlockConfig | CollectiveConfig, detail: Any) -> View:
    """A compiler view (``hlo`` / ``tpu``) of one partitioned program: the op's count / bytes / elements, the
    group size, and checks that no other collective appears and every group has the configuration's size."""
    phase, ops = cfg.phase, _ops(cfg)
    colls = list(module.collectives)
    if not ops:  # the column rule: count whatever is there
        view = View(source, {"col.collective.count": len(colls)}, {"col.collective.count": "count"}, detail=detail)
        assert isinstance(cfg, BlockConfig)
        if cfg.n % cfg.parts == 0:
            view.checks[f"{source}.col.no_collective"] = (not colls, f"collectives: {[c.op for c in colls] or 'none'}")
        else:  # measured on both compilers: an unevenly split Y comes back whole, through an all-gather
            gathers = [c for c in colls if c.op == "all-gather"]
            view.checks[f"{source}.col.only_output_gather"] = (
                len(gathers) == len(colls), f"n={cfg.n} over p={cfg.parts}: collectives {[c.op for c in colls]}")
            if colls:
                view.differs["col.collective.count"] = (
                    f"the {source} program all-gathers Y ({sum(c.operand_bytes for c in gathers)} B per device): "
                    f"n={cfg.n} columns do not split evenly over p={cfg.parts}, and XLA hands the unevenly split "
                    "result back whole")
        return view
    rs = isinstance(cfg, CollectiveConfig) and cfg.op == "reduce_scatter"
    view = collectives_view(source, module, phase, ops, cfg.dtype, cpu_reduce_scatter=rs, detail=detail)
    op = ops[0]
    mine = [c for c in colls if c.op == op.replace("_", "-") or (rs and c.op == "all-reduce" and c.feeds_dynamic_slice)]
    sizes = sorted({c.group_size for c in mine})
    if len(sizes) == 1:
        view.add(f"{phase}.{op}.group_size", sizes[0], "devices")
    elif sizes:
        view.checks[f"{source}.{phase}.one_group_size"] = (False, f"collectives with group sizes {sizes}")
    others = [c.op for c in colls if c not in mine]
    view.checks[f"{source}.{phase}.only_{op}"] = (not others, f"no other collective in the program: {others or 'none'}")
    if isinstance(cfg, BlockConfig) and cfg.rule == "grid":
        view.add("grid.collective.bytes", sum(c.operand_bytes for c in colls), "bytes")
        if "grid.all_reduce.bytes" in view.differs:
            view.differs["grid.collective.bytes"] = view.differs["grid.all_reduce.bytes"]
    return view


def compiler(cfg: BlockConfig | CollectiveConfig) -> View:
    """The CPU compiler's view: the partitioned HLO of the step on this process's devices (or a skip)."""
    from shardlab.profile import capture_hlo

    world = runtime.current()
    problem = mesh_problem(cfg.parts, world.num_devices, _name(cfg))
    if problem:
        return View.skip("hlo", problem)
    strings: dict[str, str] = {}
    if isinstance(cfg, BlockConfig):
        def step() -> list[torch.Tensor]:
            x, w, s = _on_mesh(cfg)
            strings.update(s)
            return [x @ w]
        cap = capture_hlo(step)
    else:
        cap = capture_hlo(build_graph, cfg)
    view = _module_view("hlo", cap.module, cfg, detail=cap)
    got = cap.result[0].cpu()
    if isinstance(cfg, BlockConfig):
        view.checks[f"parity.hlo.{cfg.phase}"] = (_close(got, dense(cfg), cfg.dtype, cfg.k), "XLA's Y == x @ W")
        shape, names = mesh_layout(cfg, world.num_devices)
        predicted = {k: tiles.sharding_string(shape, names, SPECS[cfg.rule][k]) for k in ("x", "W")}
        view.checks[f"hlo.{cfg.phase}.sharding_strings"] = (
            strings == predicted, f"torch_xla {strings} vs predicted {predicted}")
        view.notes.append(f"{cfg.phase}: mesh {dict(zip(names, shape, strict=True))}, x {strings['x']}, "
                          f"W {strings['W']}")
    else:
        want = {"all_reduce": expected(cfg)[0], "reduce_scatter": torch.cat(expected(cfg), dim=0),  # .cpu() gathers
                "all_gather": expected(cfg)[0] * 2}[cfg.op]
        view.checks[f"parity.hlo.{cfg.phase}"] = (_close(got, want, cfg.dtype, cfg.world_size),
                                                  "XLA's result == the same computed without communication")
    return view


def tpu_plan(cfg: BlockConfig | CollectiveConfig, generation: str = "v5e") -> tuple[str | None, str]:
    """(topology, how) for the TPU view — the process's n chips when p tiles them, else p chips in a helper
    process — or (None, why the view is skipped): :func:`shardlab.profile.tpu.view_topology`."""
    from shardlab.profile import tpu as T

    fits = mesh_problem(cfg.parts, runtime.current().num_devices, _name(cfg)) is None
    topology, how = T.view_topology(cfg.parts, fits, generation)
    return topology, how if fits or topology is None else f"{how} ({_name(cfg)}={cfg.parts})"


def tpu(cfg: BlockConfig | CollectiveConfig, generation: str = "v5e") -> View:
    """The same graph compiled by XLA:TPU (compile-only) — see the module docstring for the topology rule."""
    from shardlab.profile import tpu as T

    topology, why = tpu_plan(cfg, generation)
    if topology is None:
        return View.skip("tpu", why)
    comp = T.compile_program(build_graph, cfg, topology, label=f"{cfg.phase}")
    if not comp.fits:
        view = View("tpu", detail=comp)
        view.notes.append(f"does not fit on {topology}: {comp.oom.message.splitlines()[0]}")
        return view
    view = _module_view("tpu", comp.module, cfg, detail=comp)
    view.notes.append(f"{cfg.phase}: XLA:TPU {topology} ({why}), compiled in {comp.compile_s:.2f} s"
                      + (" (cached)" if comp.cached else ""))
    return view


# ---------------------------------------------------------------------------- the element type reductions carry
def carried(cfg: BlockConfig, kinds: tuple[str, ...] = ("cpu", "tpu")) -> View:
    """The formula for what the reduction carries on each device kind: ``<phase>.all_reduce.on_<kind>.dtype``
    (HLO name) and ``.bytes``, with ``reduction_dtype(dtype, kind)`` (XLA:CPU adds bf16 in f32)."""
    view = View("formula")
    for kind in kinds:
        dt = reduction_dtype(cfg.dtype, kind)
        f = (F.row_split_all_reduce(cfg.m, cfg.n, cfg.parts, dt) if cfg.rule == "row"
             else F.grid_all_reduce(cfg.m, cfg.n, cfg.grid, dt))
        if f["count"]:
            view.add(f"{cfg.phase}.all_reduce.on_{kind}.dtype", hlo_name(dt), "dtype")
        view.add(f"{cfg.phase}.all_reduce.on_{kind}.bytes", f["bytes"], "bytes")
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
