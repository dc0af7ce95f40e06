"""Views: one case's answer from one source — the formula, the ledger, the CPU compiler or the TPU compiler.

Design
------
A :class:`View` is a flat dict of named structural values (``"fwd.all_reduce.count"``) with units, from one
source. :mod:`shardlab.core.harness` produces the views of a :class:`shardlab.core.case.Case` and records them; this
module holds the data type and the builders every topic shares: :func:`traffic` (a formula's counts and
bytes), :func:`ledger_view` (what a rank's ledger recorded), :func:`collectives_view` (what a compiled HLO
program hands to its collectives) and :func:`merge` (two programs of one source side by side).

Each source's view carries one declared ``detail``, the object behind its numbers: a :class:`LedgerRun` (the
ledger, the ranks' results, the wall time) for ``ledger``, a :class:`~shardlab.profile.capture.Capture` for
``hlo``, a :class:`~shardlab.profile.tpu.TpuCompile` for ``tpu`` (:data:`LedgerView`, :data:`CpuView`,
:data:`TpuView`); a view of several programs (or a :func:`merge`) lists every program's in ``parts``, in order,
and ``detail`` is the last. ``View`` is generic in the detail, so a reader of ``view.detail.module`` is
type-checked.

A view that cannot run here is *skipped*: it carries the reason and no values. A value a view measured that
legitimately differs from the paper's algebra on its backend (XLA:CPU all-reduces bf16 partial sums in f32; the
TPU compiler merges k all-reduces into one tuple op) is listed in ``View.differs`` with the reason: recorded
and shown, left out of the equality check, while a comparable value (elements instead of bytes, operands
instead of ops) is checked instead.

Example::

    >>> f = View("formula", {"fwd.all_reduce.count": 1}, {"fwd.all_reduce.count": "count"})
    >>> h = View.skip("hlo", "needs 4 devices; this process has 1")
    >>> [v.source for v in (f, h) if v.ran]
    ['formula']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypedDict, TypeVar

from shardlab.comm.ledger import OPS as LEDGER_OPS
from shardlab.comm.ledger import Ledger
from shardlab.formulas.dtypes import dtype_bytes, hlo_name
from shardlab.profile.hlo import Collective, HloModule

# Collective names in the suite's vocabulary (ledger spelling) and their HLO spelling.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
HLO_OP = {op: op.replace("_", "-") for op in OPS}

COMPILERS = {"hlo": "XLA:CPU", "tpu": "XLA:TPU"}  # a compiler view's source -> the compiler (the one label map)

if TYPE_CHECKING:
    from shardlab.profile.capture import Capture
    from shardlab.profile.tpu import TpuCompile

D = TypeVar("D")  # the view's detail: what its numbers were read from


class LedgerRun(TypedDict, total=False):
    """A ledger view's detail: what the simulated ranks recorded and returned (a topic's ``ledger_extra`` may add
    its own keys, declared in a TypedDict of its own that extends this one)."""

    ledger: Ledger  # one rank's collectives (the first group's)
    ranks: Any  # each rank's result (a list per group when the case is grouped)
    wall_s: float  # the run's wall time
    ledgers: list[Ledger]  # every rank's collectives (gloo runs: harness.gloo / gloo_runs)
    reference: list[Any]  # gloo runs: each rank's result of the case's reference_program()


@dataclass
class View(Generic[D]):
    """One source's answer for one configuration."""

    source: str  # formula | ledger | hlo | tpu
    values: dict[str, Any] = field(default_factory=dict)  # "fwd.all_reduce.bytes" -> 512
    units: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None  # why this view did not run here (then values is empty)
    differs: dict[str, str] = field(default_factory=dict)  # names recorded but not checked -> why
    notes: list[str] = field(default_factory=list)  # one-line facts worth printing next to the table
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)  # parity etc.: name -> (ok, detail)
    detail: D | None = None  # the object behind the numbers: LedgerRun, Capture, TpuCompile, formula terms ...
    parts: list[D] = field(default_factory=list)  # every program's detail, in order ([detail] for one program)

    def __post_init__(self) -> None:
        if not self.parts and self.detail is not None:
            self.parts = [self.detail]

    @classmethod
    def skip(cls, source: str, reason: str) -> View[Any]:
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

    def renamed(self, rename: Callable[[str], str]) -> View[D]:
        """The same view with every value name (and its unit, ``differs`` entry) passed through ``rename``.

        >>> View("formula", {"ce.all_reduce.count": 3}, {"ce.all_reduce.count": "count"}).renamed(
        ...     lambda n: n.replace("ce.all_reduce", "vocab_parallel")).values
        {'vocab_parallel.count': 3}
        """
        return View(self.source, {rename(k): v for k, v in self.values.items()},
                    {rename(k): u for k, u in self.units.items()}, self.skipped,
                    {rename(k): w for k, w in self.differs.items()}, list(self.notes), dict(self.checks),
                    self.detail, list(self.parts))


LedgerView: TypeAlias = "View[LedgerRun]"  # harness.ledger
CpuView: TypeAlias = "View[Capture]"  # harness.hlo: the captured XLA:CPU step (its module, outputs, metrics)
TpuView: TypeAlias = "View[TpuCompile]"  # harness.tpu: the XLA:TPU compile (module, memory, cost, topology)


def merge(*views: View[D]) -> View[D]:
    """Several views of ONE source (disjoint value names) as one: values, units, differs, notes and checks
    together, ``parts`` every part's in order, ``detail`` the last. If any part was skipped, the merged view is
    skipped with that reason (a table row must not mix a measured half with a missing half).

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
    parts = [d for v in views for d in v.parts]
    out: View[D] = View(source, detail=parts[-1] if parts else None, parts=parts)
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


def traffic(view: View[Any], phase: str, counts: Mapping[str, int], byte_totals: Mapping[str, int], dtype: str,
            ops: Iterable[str] = ("all_reduce",)) -> View[Any]:
    """Add ``<phase>.<op>.count`` / ``.bytes`` / ``.elements`` for each op to a formula view (elements =
    bytes / element size of ``dtype``, the model's element type)."""
    for op in ops:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not one of {OPS}")
        view.add(f"{phase}.{op}.count", int(counts.get(op, 0)), "count")
        view.add(f"{phase}.{op}.bytes", int(byte_totals.get(op, 0)), "bytes")
        view.add(f"{phase}.{op}.elements", int(byte_totals.get(op, 0)) // dtype_bytes(dtype), "elements")
    return view


def ledger_view(ledger: Ledger, phase: str, ops: Iterable[str] = ("all_reduce",),
                detail: LedgerRun | None = None) -> LedgerView:
    """The ledger view of the collectives ``ops`` one rank issued (count, payload bytes, elements)."""
    view: LedgerView = View("ledger", detail=detail if detail is not None else LedgerRun(ledger=ledger))
    for op in ops:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not one of {OPS}")
        rows = list(ledger.select(op)) if op in LEDGER_OPS else []
        view.add(f"{phase}.{op}.count", len(rows), "count")
        view.add(f"{phase}.{op}.bytes", sum(r.payload_bytes for r in rows), "bytes")
        view.add(f"{phase}.{op}.elements", sum(r.payload_bytes // dtype_bytes(r.dtype) for r in rows), "elements")
    return view


# --------------------------------------------------------------------------------- compiler views from HLO
def _elements(c: Collective) -> int:
    """Elements one device hands to collective ``c`` (all operands of a tuple collective)."""
    return sum(math.prod(s) for s in c.operand_shapes)


def collectives_view(source: str, module: HloModule, phase: str, ops: Iterable[str], dtype: str,
                     cpu_reduce_scatter: bool = False, detail: Any = None) -> View[Any]:
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
                f"{phase}.{op}: XLA:CPU's pass pipeline forms no reduce-scatter; its all-reduce + dynamic-slice "
                "pairs are counted as the reduce-scatter they implement" if source == "hlo" else
                f"{phase}.{op}: the {source} compiler lowered this reduce-scatter as an all-reduce + dynamic-slice, "
                "counted as the reduce-scatter it implements")
        want = hlo_name(dtype)
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
