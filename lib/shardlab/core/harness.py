"""The harness: every case through the four views, compared and recorded — written once for all topics.

Design
------
A topic supplies a :class:`shardlab.core.case.Case`; this module owns the rest:

- :func:`ledger` runs the case's per-rank program on ``case.ranks`` ranks of a :class:`SimulatedWorld` (one world
  per group when the program runs in independent groups), reads the collectives it recorded and checks the ranks'
  results against the oracle (``case.parity``).
- :func:`gloo` / :func:`gloo_runs` run the same per-rank programs in real processes (torch.distributed, gloo),
  several cases in one start-up, each with the case's ``reference_program()`` (the framework's own implementation
  of the step, e.g. PyTorch's pipelining) beside it; each case's ledger is its own, as if it ran alone.
- :func:`hlo` — the CPU compiler. The rule for a view that needs more devices than this process has: it is
  *skipped* with the reason (never a failed check). Otherwise the graph is run as one step, its partitioned
  HLO captured (:func:`shardlab.profile.capture_hlo`), its collectives parsed, its outputs checked against the
  oracle.
- :func:`tpu` — the TPU compiler, compile-only: a slice with this process's chip count when the case fits here,
  else a ``case.devices``-chip slice compiled in a helper process (:func:`shardlab.profile.tpu.view_topology`);
  out of memory is a result (``fits = 0``, the compiler's message as a note), not an exception.
- :func:`compare` / :func:`record` — one comparison rule (:func:`shardlab.profile.record.values_equal`), every
  value recorded under ``<prefix>.<name>`` with its source; a value a view lists in ``differs`` is recorded
  with that reason as a field (``differs``) and left out of the checks; a skipped view is recorded as a
  structured ``skipped`` entry. The report reads both fields; it never re-derives them.
- :func:`record_compile_s` — compile seconds of the programs behind the compiler views, one rule: a compile
  served from a cache measured nothing and is not recorded (the record says so in a note).

A case whose step is several graphs (``case.programs``) is captured graph by graph, each executed before the next
is built; the TPU compiles each (:func:`build_program` rebuilds and executes the graphs before it), and a view's
``parts`` is then the list of its captures / compiles (``detail`` the last).

Every hook of a case returns one declared type (``program()`` a list of ``(fn, args)``, ``graph()`` a ``Step``,
``graphs()`` an iterator of them), and every view one declared detail per source (:data:`LedgerView`,
:data:`CpuView`, :data:`TpuView`): nothing here asks what a case handed back. A case that cannot build a view for
one of its variants says why in ``case.unavailable(source)``; the view is skipped with that reason.

Example::

    >>> from shardlab.core.views import View
    >>> rows = compare([View("formula", {"n": 2}, {"n": "count"}), View("hlo", {"n": 2}, {"n": "count"})])
    >>> rows[0]["agree"], rows[0]["checked_sources"]
    (True, ['formula', 'hlo'])
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from shardlab import runtime
from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.comm.base import CollectiveMismatch
from shardlab.comm.distributed import run_programs
from shardlab.comm.ledger import Ledger, ledger_problem
from shardlab.core.case import Case, build_graph
from shardlab.core.views import (
    CpuView,
    LedgerRun,
    LedgerView,
    TpuView,
    View,
    collectives_view,
    ledger_view,
    merge,
)
from shardlab.profile.capture import Capture, capture_hlo
from shardlab.profile.hlo import HloModule
from shardlab.profile.record import Recorder, values_equal
from shardlab.profile.timer import xla_sync
from shardlab.profile.tpu import (
    NOT_INSTALLED,
    Step,
    TpuCompile,
    compile_program,
    default_generation,
    topology_for,
    view_topology,
)

if TYPE_CHECKING:
    import torch

SOURCES = ("formula", "ledger", "hlo", "tpu")


# ------------------------------------------------------------------------------------------------ the views
def _named(case: Case, view: View[Any]) -> View[Any]:
    """``view`` with its values named by ``case.value_name`` (the same view when the case keeps the names)."""
    if type(case).value_name is Case.value_name:
        return view
    return view.renamed(case.value_name)


def _unavailable(case: Case, source: str) -> View[Any] | None:
    reason = case.unavailable(source)
    return None if reason is None else View.skip(source, reason)


def formula(case: Case) -> View[Any]:
    return _unavailable(case, "formula") or _named(case, case.formula())


def _groups(case: Case) -> list[tuple[Any, ...]]:
    groups = case.program()
    if len(groups) > 1 and not case.grouped:
        raise ValueError(f"{type(case).__name__}.program() returned {len(groups)} groups but the case does not "
                         "declare `grouped` (parity would not know which results are whose)")
    return groups


def ledger(case: Case) -> LedgerView:
    """The per-rank program's ledger and its parity with the oracle (skipped when the case has no program)."""
    skipped = _unavailable(case, "ledger")
    if skipped is not None:
        return skipped
    groups = _groups(case)
    if not groups:
        return View.skip("ledger", f"{type(case).__name__} has no per-rank program")
    worlds = [SimulatedWorld(case.ranks) for _ in groups]
    t0 = time.perf_counter()
    runs = [world.run(fn, *args) for world, (fn, args) in zip(worlds, groups, strict=True)]
    wall_s = time.perf_counter() - t0
    led = worlds[0].ledger
    results = runs if case.grouped else runs[0]
    view = ledger_view(led, case.phase, case.ops, detail=LedgerRun(ledger=led, ranks=results, wall_s=wall_s))
    if len(worlds) > 1:
        view.checks[f"ledger.{case.phase}.groups_alike"] = (all(w.ledger == led for w in worlds),
                                                            f"the {len(worlds)} groups issue identical collectives")
    view.checks |= case.parity("ledger", results, case.oracle())
    return _named(case, case.ledger_extra(view, led, results))


def gloo(case: Case) -> LedgerRun:
    """The case's per-rank program (its first group) in ``case.ranks`` real processes (torch.distributed, gloo):
    ``{ledger, ledgers, ranks}`` (+ ``reference``) — what the simulated ledger is checked against, bit for bit."""
    return gloo_runs([case])[0]


def gloo_runs(cases: Sequence[Case]) -> list[LedgerRun]:
    """Several cases' per-rank programs in ONE gloo start-up (the processes and their ``import torch`` once, not per
    case), one :data:`LedgerRun` per case: ``ledger`` (rank 0's) and ``ledgers`` (every rank's) hold that case's
    collectives alone, numbered from 0 — what the case would record in a start-up of its own —, ``ranks`` each
    rank's result, ``reference`` each rank's result of ``case.reference_program()`` when the case has one
    (the framework's own implementation of the step, run right after ours in the same processes).

    Every program gets its arguments as the parent built them: they travel pickled and each program unpickles its
    own copy (one that trains its modules leaves the next one's untouched; and no tensor is shared through a file
    descriptor — a few schedules' modules exceed how many descriptors a process start may pass). The cases must
    run on the same number of ranks (one process group)."""
    if not cases:
        raise ValueError("gloo_runs needs at least one case")
    sizes = [(f"{type(c).__name__}({c.phase})", c.ranks) for c in cases]
    if len({n for _, n in sizes}) > 1:
        raise ValueError("the cases of one gloo start-up must run on the same number of ranks (one process group): "
                         + ", ".join(f"{name} on {n}" for name, n in sizes))
    jobs = []
    for case in cases:
        groups = _groups(case)
        if not groups:
            raise ValueError(f"{type(case).__name__} has no per-rank program to run in gloo processes")
        reference = case.reference_program()
        jobs.append((pickle.dumps(groups[0]), None if reference is None else pickle.dumps(reference)))
    world = DistributedWorld(cases[0].ranks)
    per_rank = world.run(run_programs, jobs)
    runs = []
    for i in range(len(cases)):
        ledgers = [Ledger.from_records(r[i]["records"]) for r in per_rank]
        problem = ledger_problem(ledgers)
        if problem is not None:
            raise CollectiveMismatch(f"{type(cases[i]).__name__}({cases[i].phase}) in gloo: {problem}")
        run = LedgerRun(ledger=ledgers[0], ledgers=ledgers, ranks=[r[i]["result"] for r in per_rank],
                        wall_s=max(r[i]["wall_s"] for r in per_rank))
        if jobs[i][1] is not None:
            run["reference"] = [r[i]["reference"] for r in per_rank]
        runs.append(run)
    return runs


def _next_outputs(steps: Iterator[Step]) -> list[torch.Tensor]:
    """The next graph's outputs (what a capture runs and hands back as its ``result``)."""
    return list(next(steps).outputs)


def build_program(case_program: tuple[Case, int]) -> list[torch.Tensor]:
    """Program ``i`` of a case with several, NOT synced (module-level: the TPU compile may pickle it into a helper
    process): the programs before it are built and executed first — they make the values it reads."""
    case, i = case_program
    steps = case.graphs()
    for _ in range(i):
        run_program(_next_outputs(steps))
    return _next_outputs(steps)


def run_program(outputs: list[torch.Tensor]) -> None:
    """Execute a program on this process's devices: captured where this process dumps HLO (the parse is memoised by
    graph hash, so a later capture of the same program finds it), else synced."""
    if runtime.current().dump_dir:
        capture_hlo(list, outputs)
    else:
        xla_sync()


def _per_program(case: Case, items: list[Any]) -> Any:
    """The one program's item, or ``{program: item}`` for a case with several programs."""
    return dict(zip(case.programs, items, strict=True)) if case.programs else items[0]


def _compiled_view(source: str, case: Case, modules: list[HloModule], parts: list[Any]) -> View[Any]:
    """The collectives ``case.ops`` of the compiled program(s): one program under ``<phase>``, several under
    ``<phase>.<program>``; ``parts`` the capture / compile of each, ``detail`` the last."""
    kw = dict(cpu_reduce_scatter=case.cpu_reduce_scatter)
    if not case.programs:
        return collectives_view(source, modules[0], case.phase, case.ops, case.dtype, detail=parts[0], **kw)
    view = merge(*(collectives_view(source, m, f"{case.phase}.{name}", case.ops, case.dtype, detail=part, **kw)
                   for name, m, part in zip(case.programs, modules, parts, strict=True)))
    view.detail = parts[-1]
    return view


def hlo(case: Case) -> CpuView:
    """XLA:CPU's partitioned program of ``case.graph()`` on this process's devices, or a skip with the reason."""
    problem = case.unavailable("hlo") or case.not_executable() or case.mesh_problem(runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    steps = case.graphs()
    caps: list[Capture] = [capture_hlo(_next_outputs, steps) for _ in case.programs or ("",)]
    steps.close()
    view = _compiled_view("hlo", case, [c.module for c in caps], caps)
    ref = case.oracle()
    if ref is not None:
        got = [[t.cpu() if hasattr(t, "cpu") else t for t in c.result] for c in caps]
        view.checks |= case.parity("hlo", _per_program(case, got), ref)
    return _named(case, case.read(view, _per_program(case, [c.module for c in caps])))


def tpu_topology(case: Case, generation: str | None = None) -> tuple[str | None, str]:
    """Where the case's TPU view compiles: ``(topology, how)`` or ``(None, why it is skipped)``. The generation
    defaults to :func:`shardlab.profile.tpu.default_generation` (the report sets one for every notebook)."""
    fits = case.mesh_problem(runtime.current().num_devices) is None
    topology, how = view_topology(case.devices, fits, generation or default_generation())
    if topology is not None and not fits:
        how += f" ({case.size_name}={case.devices})"
    return topology, how


def tpu(case: Case, generation: str | None = None, small_trace: bool | None = None, **options: Any) -> TpuView:
    """XLA:TPU's per-chip program of ``case.graph()`` (compile-only), or a skip with the reason.

    ``small_trace``: build the graph from :meth:`Case.small_trace` on its few devices and compile it with its
    shardings rewritten to the case's mesh — None: only where a direct trace cannot (more chips than a process has
    CPU devices) and the case declares one; True: whenever it declares one (the tests compare both routes).
    ``options`` override ``case.compile_options()`` (``disable_passes``, ``debug_options``, ``donate``, ...)."""
    skipped = _unavailable(case, "tpu")
    if skipped is not None:
        return skipped
    topology, how = tpu_topology(case, generation)
    traced, small = case, case.small_trace() if small_trace is not False else None
    if small is not None and (small_trace or (topology is None and case.devices > runtime.MAX_CPU_DEVICES
                                              and how != NOT_INSTALLED)):
        try:
            topology = topology_for(case.devices, generation or default_generation())
        except ValueError as exc:
            return View.skip("tpu", str(exc))
        traced, trace_mesh, target_mesh = small
        options = {**options, "retarget": (tuple(trace_mesh), tuple(target_mesh))}
        how = f"traced on {math.prod(trace_mesh)} devices, mesh {tuple(trace_mesh)} rewritten to {tuple(target_mesh)}"
    if topology is None:
        return View.skip("tpu", how)
    opts = {**case.compile_options(), **options}
    comps: list[TpuCompile]
    if case.programs:
        comps = [compile_program(build_program, (traced, i), topology, **{"label": f"{case.phase} {name}", **opts})
                 for i, name in enumerate(case.programs)]
    else:
        comps = [compile_program(build_graph, traced, topology, **{"label": case.phase, **opts})]
    oom = next((c.oom for c in comps if not c.fits), None)
    if oom is not None:
        view: TpuView = View("tpu", {"fits": 0}, {"fits": "bool"}, detail=comps[-1], parts=comps)
        view.notes.append(f"does not fit on {topology}: {oom.message.splitlines()[0]}")
        return _named(case, view)
    view = _compiled_view("tpu", case, [c.module for c in comps], comps)
    programs = f" ({' + '.join(case.programs)})" if case.programs else ""
    view.notes.append(f"{case.phase}: XLA:TPU {topology} ({how}), {comps[0].num_chips} chips, compiled in "
                      f"{sum(c.compile_s for c in comps):.2f} s{programs}"
                      + (" (cached)" if any(c.cached for c in comps) else ""))
    return _named(case, case.read(view, _per_program(case, [c.module for c in comps])))


def compiler_view(case: Case) -> View:
    """``case``'s XLA:CPU view when this process has its devices, else its XLA:TPU view (what an exercise graded by
    the compiler reads); ValueError when neither runs here."""
    cpu = hlo(case)
    view = cpu if cpu.ran else tpu(case)
    if not view.ran:
        raise ValueError(f"no compiler can grade this here: {cpu.skipped}")
    return view


def views(case: Case, sources: Iterable[str] = SOURCES, generation: str | None = None) -> list[View[Any]]:
    """The case through each of ``sources`` (formula, ledger, hlo, tpu), in that order."""
    run = {"formula": formula, "ledger": ledger, "hlo": hlo, "tpu": lambda c: tpu(c, generation)}
    unknown = [s for s in sources if s not in run]
    if unknown:
        raise ValueError(f"sources={list(sources)}: {unknown} not among {SOURCES}")
    return [run[s](case) for s in sources]


# --------------------------------------------------------------------------------------- compare and record
def compare(views: Iterable[View]) -> list[dict[str, Any]]:
    """Rows ``{name, unit, <source>: value ..., agree, checked_sources, not compared}`` over every name.

    A compiler that combined collectives reports ``<op>.operands`` (logical collectives carried by its tuple
    instructions); every view without that name carries one operand per collective, so its ``count`` stands in.
    """
    views = [v for v in views if v.ran]
    names: list[str] = []
    for v in views:
        names += [n for n in v.values if n not in names]
    rows = []
    for name in names:
        row: dict[str, Any] = {"name": name, "unit": next(v.units.get(name, "") for v in views if name in v.values),
                               "checked_sources": []}
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
                    row["checked_sources"].append(v.source)
        row["agree"] = all(values_equal(checked[0], x) for x in checked[1:]) if checked else True
        row["not compared"] = ", ".join(unchecked)
        rows.append(row)
    return rows


def record(rec: Recorder, prefix: str, *views: View, show: bool = True) -> pd.DataFrame:
    """Record every view's values under ``<prefix>.<name>``, check agreement, print skips and differences.

    Returns a DataFrame (name, unit, one column per source, agree, not compared) for the notebook to display.
    Raises :class:`~shardlab.profile.record.CheckFailed` (after recording) when two checked values disagree.
    """
    for v in views:
        if not v.ran:
            rec.skip(prefix, v.source, v.skipped or "")
            if show:
                print(f"[{v.source}] skipped: {v.skipped}")
            continue
        for name, value in v.values.items():
            rec.measure(f"{prefix}.{name}", value, v.units.get(name, ""), v.source, differs=v.differs.get(name))
        if show:
            for name, why in v.differs.items():
                print(f"[{v.source}] {prefix}.{name}: {why}")
            for note in v.notes:
                print(f"[{v.source}] {note}")
        for name, (ok, detail) in v.checks.items():
            rec.check(f"{prefix}.{name}", ok, detail)
    rows = compare(views)
    for row in rows:
        srcs = row["checked_sources"]
        if len(srcs) < 2:
            continue
        detail = " = ".join(f"{s} {row[s]}" for s in srcs)
        rec.check(f"{prefix}.{row['name']}: {' = '.join(srcs)}", row["agree"],
                  detail if row["agree"] else "disagree: " + detail)
    sources = [v.source for v in views if v.ran]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows, columns=["name", "unit", *sources, "agree", "not compared"], dtype=object)
    frame["name"] = prefix + "." + frame["name"]
    return frame


def agree(rec: Recorder, name: str, unit: str, **values: Any) -> dict[str, Any]:
    """Record ``{source: value}`` for one name and check that they are equal (the rule of :func:`record`)."""
    *_, last = name.split(".")
    prefix = name[: -len(last) - 1] if "." in name else name
    record(rec, prefix, *(View(s, {last: v}, {last: unit}) for s, v in values.items()), show=False)
    return values


def _compiles(obj: Any) -> Iterable[TpuCompile]:
    if isinstance(obj, TpuCompile):
        yield obj
    elif isinstance(obj, View):
        if obj.source == "tpu" and obj.ran:
            yield from obj.parts
    elif isinstance(obj, dict | list | tuple):
        for v in obj.values() if isinstance(obj, dict) else obj:
            yield from _compiles(v)


def measured(compile: Any) -> bool:
    """Whether a compile's ``compile_s`` measures a compile: one it ran (or a worker ran), or one served from the
    committed store (``shardlab.profile.tpu_store``: the seconds it took when stored) — not a hit of this process's
    cache, which took no time. The rule of :func:`compile_seconds` and :func:`record_compile_s`."""
    return not getattr(compile, "cached", False) or getattr(compile, "stored", False)


def compile_seconds(*results: Any) -> tuple[float, int]:
    """XLA:TPU compile seconds behind ``results`` (tpu views, compiles, or dicts / lists of them) and the number
    of compiles; a compile that measured nothing (:func:`measured`) adds 0 s."""
    comps = list(_compiles(results))
    return sum(c.compile_s for c in comps if measured(c)), len(comps)


def record_compile_s(rec: Recorder, name: str, *views: View) -> dict[str, float]:
    """Record the compile seconds behind compiler views as timings ``name``: an ``hlo`` view's XLA:CPU compile
    (source ``metrics``: torch_xla's CompileTime of the captured step) and a ``tpu`` view's XLA:TPU compile
    (source ``tpu``); a view of several programs sums them. A view with a compile that measured nothing
    (:func:`measured`: a hit of this process's cache) is not recorded; a compile served from the committed store
    counts the seconds it took when stored (the record's ``xla.TpuCompileTime.stored`` counts such compiles)."""
    out: dict[str, float] = {}
    for v in views:
        if not v.ran or not v.parts or v.source not in ("hlo", "tpu"):
            continue
        parts = v.parts
        src = "metrics" if v.source == "hlo" else "tpu"
        if not all(measured(c) for c in parts):
            rec.note(f"{name}.{src}", "served from a compile cache: no compile seconds measured")
            continue
        secs = [c.metrics.compile_s if src == "metrics" else c.compile_s for c in parts]
        out[src] = rec.measure(name, float(sum(secs)), "s", src, kind="timing")
    return out


def memory_frame(views: Mapping[str, View]) -> pd.DataFrame:
    """Per-device bytes of compiled programs side by side: ``{label: hlo or tpu view}`` -> DataFrame.

    XLA:CPU's buffer assignment gives parameters, outputs and the heap-simulated peak of temporaries; XLA:TPU's
    compiled memory statistics give arguments, outputs, the HBM temporaries its capacity check counts (peak -
    arguments - outputs + aliased), generated code and the peak. Skipped views are left out; a view of several
    programs shows its last (the largest of a step cut into forward and backward + update).
    """
    cols: dict[str, dict[str, Any]] = {}
    for label, v in views.items():
        if not v.ran or not v.parts:
            continue
        detail = v.parts[-1]
        if v.source == "hlo" and detail.module.buffers is not None:
            b = detail.module.buffers
            cols[label] = {"arguments": b.parameter, "outputs": b.output, "temporaries": b.temp,
                           "generated code": None, "total": b.total, "peak": None}
        elif v.source == "tpu" and getattr(detail, "memory", None) is not None:
            m = detail.memory
            cols[label] = {"arguments": m.argument, "outputs": m.output, "temporaries": m.checked_temp,
                           "generated code": m.generated_code, "total": m.total, "peak": m.peak}
    return pd.DataFrame(cols, dtype=object)
