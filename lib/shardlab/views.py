"""Views: one configuration, answered by the formula, the ledger, the CPU compiler and the TPU compiler.

Design
------
Every topic (``blocks``, ``tp``, ``fsdp``, ``xla_scan``) has one module of *view functions* — ``formula(cfg)``,
``ledger(cfg)``, ``compiler(cfg)`` (the HLO XLA's SPMD partitioner produced on the CPU devices) and
``tpu(cfg)`` (the same graph compiled by XLA:TPU, compile-only) — each returning a :class:`View`: a flat dict
of named structural values (``"fwd.all_reduce.count"``) with units. The notebooks, the tests and the planner
cross-check call the same functions, so a number is computed one way everywhere.

A view that cannot run here (the CPU compiler needs ``tp`` devices and the process has fewer) is a
*skipped* view: it carries the reason and no values, and :func:`record` prints the reason and records a note —
never a failed check. A value a view measured but that legitimately differs from the paper's algebra on this
backend (XLA:CPU all-reduces bf16 partial sums in f32; the TPU compiler merges k all-reduces into one tuple op)
is listed in ``View.differs`` with the reason: it is recorded and shown, and left out of the equality check,
while a comparable value (elements instead of bytes, operands instead of ops) is checked instead.

:func:`record` writes every value of every view into the notebook's record (one row per source, the
measurement names the report and the baselines use) and checks, per name, that every view that has it and
does not list it in ``differs`` agrees — exactly, since these are structural numbers. :func:`merge` joins
several views of one source into one table column (two programs compared side by side), :meth:`View.renamed`
gives values the names a notebook already records, and :func:`record_compile_s` records the compile seconds
behind the compiler views (timing, never compared).

The view functions are single-dispatch generics defined here once — :func:`formula`, :func:`ledger`,
:func:`compiler`, :func:`build_graph` — and each topic registers its configuration types on them (its module
re-exports the generics, so ``tp.views.formula(cfg)`` and ``shardlab.views.formula(cfg)`` are the same call).

Example::

    >>> f = View("formula", {"fwd.all_reduce.count": 1}, {"fwd.all_reduce.count": "count"})
    >>> h = View.skip("hlo", "needs 4 devices; this process has 1")
    >>> [v.source for v in (f, h) if v.ran]
    ['formula']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

from shardlab.comm.ledger import OPS as LEDGER_OPS
from shardlab.profile.record import Recorder, values_equal

# Collective names in the suite's vocabulary (ledger spelling) and their HLO spelling.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
HLO_OP = {op: op.replace("_", "-") for op in OPS}
UNITS = {"count": "count", "bytes": "bytes", "elements": "elements", "operands": "operands"}


@dataclass
class View:
    """One source's answer for one configuration."""

    source: str  # formula | ledger | hlo | tpu
    values: dict[str, Any] = field(default_factory=dict)  # "fwd.all_reduce.bytes" -> 512
    units: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None  # why this view did not run here (then values is empty)
    differs: dict[str, str] = field(default_factory=dict)  # names recorded but not checked -> why
    notes: list[str] = field(default_factory=list)  # one-line facts worth printing next to the table
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)  # parity etc.: name -> (ok, detail)
    detail: Any = None  # the object behind the numbers: Ledger, Capture, TpuCompile, formula terms ...

    @classmethod
    def skip(cls, source: str, reason: str) -> View:
        return cls(source, skipped=reason)

    @property
    def ran(self) -> bool:
        return self.skipped is None

    def add(self, name: str, value: Any, unit: str) -> None:
        self.values[name] = value
        self.units[name] = unit

    def __getitem__(self, name: str) -> Any:
        if not self.ran:
            raise KeyError(f"the {self.source} view was skipped ({self.skipped}); it has no {name!r}")
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def renamed(self, rename: Callable[[str], str]) -> View:
        """The same view with every value name (and its unit, ``differs`` entry) passed through ``rename``.

        >>> View("formula", {"ce.all_reduce.count": 3}, {"ce.all_reduce.count": "count"}).renamed(
        ...     lambda n: n.replace("ce.all_reduce", "vocab_parallel")).values
        {'vocab_parallel.count': 3}
        """
        return View(self.source, {rename(k): v for k, v in self.values.items()},
                    {rename(k): u for k, u in self.units.items()}, self.skipped,
                    {rename(k): w for k, w in self.differs.items()}, list(self.notes), dict(self.checks),
                    self.detail)


def merge(*views: View) -> View:
    """Several views of ONE source (disjoint value names) as one: values, units, differs, notes and checks
    together, ``detail`` the list of the parts' details. If any part was skipped, the merged view is skipped
    with that reason (a table row must not mix a measured half with a missing half).

    >>> a = View("formula", {"x.count": 1}, {"x.count": "count"})
    >>> merge(a, View("formula", {"y.count": 2}, {"y.count": "count"})).values
    {'x.count': 1, 'y.count': 2}
    >>> merge(a, View.skip("formula", "no devices")).skipped
    'no devices'
    """
    if not views:
        raise ValueError("merge() needs at least one view")
    sources = {v.source for v in views}
    if len(sources) > 1:
        raise ValueError(f"merge() joins views of one source; got {sorted(sources)}")
    source = views[0].source
    skipped = next((v.skipped for v in views if not v.ran), None)
    if skipped is not None:
        return View.skip(source, skipped)
    out = View(source, detail=[v.detail for v in views])
    for v in views:
        clash = set(out.values) & set(v.values)
        if clash:
            raise ValueError(f"merge(): the {source} views both have {sorted(clash)}")
        out.values |= v.values
        out.units |= v.units
        out.differs |= v.differs
        out.notes += v.notes
        out.checks |= v.checks
    return out


def traffic(view: View, phase: str, counts: Mapping[str, int], byte_totals: Mapping[str, int], dtype: str,
            ops: Iterable[str] = ("all_reduce",)) -> View:
    """Add ``<phase>.<op>.count`` / ``.bytes`` / ``.elements`` for each op to a formula view (elements =
    bytes / element size of ``dtype``, the model's element type)."""
    from shardlab.formulas.common import dtype_bytes

    for op in ops:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not one of {OPS}")
        view.add(f"{phase}.{op}.count", int(counts.get(op, 0)), "count")
        view.add(f"{phase}.{op}.bytes", int(byte_totals.get(op, 0)), "bytes")
        view.add(f"{phase}.{op}.elements", int(byte_totals.get(op, 0)) // dtype_bytes(dtype), "elements")
    return view


def ledger_view(ledger: Any, phase: str, ops: Iterable[str] = ("all_reduce",), detail: Any = None) -> View:
    """The ledger view of the collectives ``ops`` one rank issued (count, payload bytes, elements)."""
    from shardlab.formulas.common import dtype_bytes

    view = View("ledger", detail=detail if detail is not None else ledger)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not one of {OPS}")
        rows = list(ledger.select(op)) if op in LEDGER_OPS else []
        view.add(f"{phase}.{op}.count", len(rows), "count")
        view.add(f"{phase}.{op}.bytes", sum(r.payload_bytes for r in rows), "bytes")
        view.add(f"{phase}.{op}.elements", sum(r.payload_bytes // dtype_bytes(r.dtype) for r in rows), "elements")
    return view


def compare(views: Iterable[View]) -> list[dict[str, Any]]:
    """Rows ``{name, unit, <source>: value ..., agree}`` over every name any view has.

    A compiler that combined collectives reports ``<op>.operands`` (logical collectives carried by its tuple
    instructions); every view without that name carries one operand per collective, so its ``count`` stands in.
    """
    views = [v for v in views if v.ran]
    names: list[str] = []
    for v in views:
        names += [n for n in v.values if n not in names]
    rows = []
    for name in names:
        row: dict[str, Any] = {"name": name, "unit": next(v.units.get(name, "") for v in views if name in v.values)}
        checked, unchecked = [], []
        for v in views:
            if name not in v.values and name.endswith(".operands") and name[:-9] + ".count" in v.values:
                count = name[:-9] + ".count"  # one operand per collective; unchecked where the count is
                v = View(v.source, {name: v.values[count]},
                         differs={name: v.differs[count]} if count in v.differs else {})
            if name in v.values:
                row[v.source] = v.values[name]
                if name in v.differs:
                    unchecked.append(v.source)
                else:
                    checked.append(v.values[name])
                    row.setdefault("checked_sources", []).append(v.source)
        row["agree"] = all(values_equal(checked[0], x) for x in checked[1:]) if checked else True
        row["checked"] = len(checked)
        row["not compared"] = ", ".join(unchecked)
        rows.append(row)
    return rows


def record(rec: Recorder, prefix: str, *views: View, show: bool = True) -> Any:
    """Record every view's values under ``<prefix>.<name>``, check agreement, print skips and differences.

    Returns a pandas DataFrame (name, unit, one column per source, agree) for the notebook to display.
    Raises :class:`~shardlab.profile.record.CheckFailed` (after recording) when two checked values disagree.
    """
    import pandas as pd

    for v in views:
        if not v.ran:
            rec.note(f"{prefix}.{v.source}", f"{v.source} view skipped: {v.skipped}")
            if show:
                print(f"[{v.source}] skipped: {v.skipped}")
            continue
        for name, value in v.values.items():
            rec.measure(f"{prefix}.{name}", value, v.units.get(name, ""), v.source)
        for name, why in v.differs.items():
            rec.note(f"{prefix}.{name}.{v.source}", why)
            if show:
                print(f"[{v.source}] {prefix}.{name}: {why}")
        for note in v.notes:
            if show:
                print(f"[{v.source}] {note}")
        for name, (ok, detail) in v.checks.items():
            rec.check(f"{prefix}.{name}", ok, detail)
    rows = compare(views)
    for row in rows:
        if row["checked"] < 2:
            continue
        srcs = row["checked_sources"]
        detail = " = ".join(f"{s} {row[s]}" for s in srcs)
        rec.check(f"{prefix}.{row['name']}: {' = '.join(srcs)}", row["agree"],
                  detail if row["agree"] else "disagree: " + detail)
    sources = [v.source for v in views if v.ran]
    frame = pd.DataFrame(rows, columns=["name", "unit", *sources, "agree", "not compared"], dtype=object) \
        if rows else pd.DataFrame()
    if not frame.empty:
        frame["name"] = prefix + "." + frame["name"]
    return frame


def record_compile_s(rec: Recorder, name: str, *views: View) -> dict[str, float]:
    """Record the compile seconds behind compiler views as timing measurements ``name``: an ``hlo`` view's
    XLA:CPU compile (source ``metrics``, torch_xla's CompileTime of the captured step; 0 when served from its
    cache) and a ``tpu`` view's XLA:TPU compile (source ``tpu``). Skipped views and other sources are left out."""
    out: dict[str, float] = {}
    for v in views:
        if not v.ran or v.detail is None:
            continue
        if v.source == "hlo" and getattr(v.detail, "metrics", None) is not None:
            out["metrics"] = rec.measure(name, v.detail.metrics.compile_s, "s", "metrics", kind="timing")
        elif v.source == "tpu":
            # one TPU compile, or a view of several programs (a forward and a backward graph): their sum
            parts = [v.detail] if hasattr(v.detail, "compile_s") else [
                getattr(v.detail, k) for k in ("forward", "backward") if getattr(v.detail, k, None) is not None]
            secs = [c.compile_s for c in parts if getattr(c, "compile_s", None) is not None]
            if secs:
                out["tpu"] = rec.measure(name, float(sum(secs)), "s", "tpu", kind="timing")
    return out


# --------------------------------------------------------------------------------- compiler views from HLO
HLO_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}


def _elements(c: Any) -> int:
    """Elements one device hands to collective ``c`` (all operands of a tuple collective)."""
    import math

    return sum(math.prod(s) for s in c.operand_shapes)


def collectives_view(source: str, module: Any, phase: str, ops: Iterable[str], dtype: str,
                     cpu_reduce_scatter: bool = False, detail: Any = None) -> View:
    """A compiler view (``hlo`` or ``tpu``) of the collectives ``ops`` in one partitioned HLO module.

    - ``count``: collective instructions in the program (a tuple all-reduce the combiner made from k
      gradients is ONE instruction), ``bytes`` / ``elements``: what one device hands over, all operands.
    - ``cpu_reduce_scatter``: count XLA:CPU's lowering of a reduce-scatter (a sum all-reduce cut to its
      1/group share by a dynamic-slice, flagged by the parser) as the reduce-scatter it is.
    - When the program moved another element type than the model's ``dtype`` (XLA:CPU reduces bf16 in f32),
      ``bytes`` is listed in ``differs`` with the measured reason and ``elements`` is what agrees.
    - When the program combined collectives (k operands in one instruction), ``count`` is listed in
      ``differs`` with the measured k, and ``<op>.operands`` records how many logical collectives it carries.
    """
    view = View(source, detail=detail if detail is not None else module)
    colls = list(module.collectives)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not one of {OPS}")
        hop = HLO_OP[op]
        if op == "reduce_scatter" and cpu_reduce_scatter:
            mine = [c for c in colls if c.op == hop or (c.op == "all-reduce" and c.feeds_dynamic_slice)]
        elif op == "all_reduce" and cpu_reduce_scatter:
            mine = [c for c in colls if c.op == hop and not c.feeds_dynamic_slice]
        else:
            mine = [c for c in colls if c.op == hop]
        view.add(f"{phase}.{op}.count", len(mine), "count")
        view.add(f"{phase}.{op}.bytes", sum(c.operand_bytes for c in mine), "bytes")
        view.add(f"{phase}.{op}.elements", sum(_elements(c) for c in mine), "elements")
        if op == "reduce_scatter" and cpu_reduce_scatter and any(c.op == "all-reduce" for c in mine):
            view.notes.append(
                f"{phase}.{op}: XLA:CPU has no reduce-scatter; its all-reduce + dynamic-slice pairs are counted as "
                "the reduce-scatter they implement" if source == "hlo" else
                f"{phase}.{op}: the {source} compiler lowered this reduce-scatter as an all-reduce + dynamic-slice, "
                "counted as the reduce-scatter it implements")
        want = HLO_DTYPE.get(dtype, dtype)
        moved = sorted({c.dtype for c in mine} - {want})
        if moved:
            view.differs[f"{phase}.{op}.bytes"] = (
                f"the {source} program moves {'/'.join(moved)} while the model is {dtype} "
                f"({'XLA:CPU reduces 16-bit floats in f32' if source == 'hlo' else 'compiler choice'}); "
                "elements agree instead")
        operands = sum(getattr(c, "operands", 1) for c in mine)
        if operands != len(mine):
            view.add(f"{phase}.{op}.operands", operands, "operands")
            view.differs[f"{phase}.{op}.count"] = (
                f"the {source} compiler combined {operands} {op.replace('_', '-')}s into {len(mine)} "
                "tuple instruction(s) (collective combining)")
    return view


def memory_frame(views: Mapping[str, View]) -> Any:
    """Per-device bytes of compiled programs side by side: ``{label: hlo or tpu view}`` -> DataFrame.

    XLA:CPU's buffer assignment gives parameters, outputs and the heap-simulated peak of temporaries; XLA:TPU's
    compiled memory statistics give arguments, outputs, the HBM temporaries its capacity check counts (peak -
    arguments - outputs + aliased), generated code and the peak. Skipped views are left out.
    """
    import pandas as pd

    cols: dict[str, dict[str, Any]] = {}
    for label, v in views.items():
        if not v.ran or v.detail is None:
            continue
        if v.source == "hlo":
            b = v.detail.module.buffers
            if b is not None:
                cols[label] = {"arguments": b.parameter, "outputs": b.output, "temporaries": b.temp,
                               "generated code": None, "total": b.total, "peak": None}
        elif v.source == "tpu" and getattr(v.detail, "memory", None) is not None:
            m = v.detail.memory
            cols[label] = {"arguments": m.argument, "outputs": m.output, "temporaries": m.checked_temp,
                           "generated code": m.generated_code, "total": m.total, "peak": m.peak}
    return pd.DataFrame(cols, dtype=object)


# ------------------------------------------------------------------------------------------ the view generics
@singledispatch
def formula(cfg: Any, *args: Any, **kwargs: Any) -> View:
    """The paper's algebra for ``cfg`` (a topic registers its configuration types; FSDP's take a device kind)."""
    raise TypeError(f"no formula view for {type(cfg).__name__}")


@singledispatch
def ledger(cfg: Any) -> View:
    """The per-rank implementation's collective ledger for ``cfg``."""
    raise TypeError(f"no ledger view for {type(cfg).__name__}")


@singledispatch
def compiler(cfg: Any) -> View:
    """What XLA's SPMD partitioner emitted for ``cfg`` on the CPU devices."""
    raise TypeError(f"no compiler view for {type(cfg).__name__}")


@singledispatch
def build_graph(cfg: Any) -> list[Any]:
    """The torch_xla tensors whose graph the compiler views compile (CPU and TPU alike)."""
    raise TypeError(f"no XLA graph for {type(cfg).__name__}")
