"""The harness: every case through the four views, compared and recorded — written once for all topics.

Design
------
A topic supplies a :class:`shardlab.case.Case`; this module owns the rest:

- :func:`ledger` runs the case's per-rank program on ``case.ranks`` ranks of a :class:`SimulatedWorld`, reads the
  collectives it recorded and checks the ranks' results against the oracle (``case.parity``).
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

Example::

    >>> from shardlab.views import View
    >>> rows = compare([View("formula", {"n": 2}, {"n": "count"}), View("hlo", {"n": 2}, {"n": "count"})])
    >>> rows[0]["agree"], rows[0]["checked_sources"]
    (True, ['formula', 'hlo'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from shardlab import runtime
from shardlab.case import Case, build_graph
from shardlab.comm import SimulatedWorld
from shardlab.profile.capture import capture_hlo
from shardlab.profile.record import Recorder, values_equal
from shardlab.profile.tpu import Step, compile_program, view_topology
from shardlab.views import View, collectives_view, ledger_view

SOURCES = ("formula", "ledger", "hlo", "tpu")


# ------------------------------------------------------------------------------------------------ the views
def formula(case: Case) -> View:
    return case.formula()


def ledger(case: Case) -> View:
    """The per-rank program's ledger and its parity with the oracle (skipped when the case has no program)."""
    prog = case.program()
    if prog is None:
        return View.skip("ledger", f"{type(case).__name__} has no per-rank program")
    fn, args = prog
    world = SimulatedWorld(case.ranks)
    results = world.run(fn, *args)
    view = ledger_view(world.ledger, case.phase, case.ops, detail={"ledger": world.ledger, "ranks": results})
    view.checks |= case.parity("ledger", results, case.oracle())
    return case.ledger_extra(view, world.ledger, results)


def _outputs(built: Any) -> list[Any]:
    return list(built.outputs) if isinstance(built, Step) else list(built)


def _graph_outputs(case: Case) -> list[Any]:
    return _outputs(case.graph())


def hlo(case: Case) -> View:
    """XLA:CPU's partitioned program of ``case.graph()`` on this process's devices, or a skip with the reason."""
    problem = case.not_executable() or case.mesh_problem(runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(_graph_outputs, case)
    view = collectives_view("hlo", cap.module, case.phase, case.ops, case.dtype,
                            cpu_reduce_scatter=case.cpu_reduce_scatter, detail=cap)
    ref = case.oracle()
    if ref is not None:
        view.checks |= case.parity("hlo", [t.cpu() if hasattr(t, "cpu") else t for t in cap.result], ref)
    return case.read(view, cap.module)


def tpu_topology(case: Case, generation: str = "v5e") -> tuple[str | None, str]:
    """Where the case's TPU view compiles: ``(topology, how)`` or ``(None, why it is skipped)``."""
    fits = case.mesh_problem(runtime.current().num_devices) is None
    topology, how = view_topology(case.devices, fits, generation)
    if topology is not None and not fits:
        how += f" ({case.size_name}={case.devices})"
    return topology, how


def tpu(case: Case, generation: str = "v5e", **options: Any) -> View:
    """XLA:TPU's per-chip program of ``case.graph()`` (compile-only), or a skip with the reason.

    ``options`` override ``case.compile_options()`` (``disable_passes``, ``debug_options``, ``donate``, ...)."""
    topology, how = tpu_topology(case, generation)
    if topology is None:
        return View.skip("tpu", how)
    opts = {"label": case.phase, **case.compile_options(), **options}
    comp = compile_program(build_graph, case, topology, **opts)
    if not comp.fits:
        view = View("tpu", {"fits": 0}, {"fits": "bool"}, detail=comp)
        view.notes.append(f"does not fit on {topology}: {comp.oom.message.splitlines()[0]}")
        return view
    view = collectives_view("tpu", comp.module, case.phase, case.ops, case.dtype,
                            cpu_reduce_scatter=case.cpu_reduce_scatter, detail=comp)
    view.notes.append(f"{case.phase}: XLA:TPU {topology} ({how}), {comp.num_chips} chips, compiled in "
                      f"{comp.compile_s:.2f} s" + (" (cached)" if comp.cached else ""))
    return case.read(view, comp.module)


def views(case: Case, sources: Iterable[str] = SOURCES, generation: str = "v5e") -> list[View]:
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


def record_compile_s(rec: Recorder, name: str, *views: View) -> dict[str, float]:
    """Record the compile seconds behind compiler views as timings ``name``: an ``hlo`` view's XLA:CPU compile
    (source ``metrics``: torch_xla's CompileTime of the captured step) and a ``tpu`` view's XLA:TPU compile
    (source ``tpu``; a view of several programs sums them). A compile served from a cache is not recorded."""
    out: dict[str, float] = {}
    for v in views:
        if not v.ran or v.detail is None:
            continue
        if v.source == "hlo":
            parts, src = [v.detail], "metrics"
        elif v.source == "tpu":
            parts, src = (v.detail if isinstance(v.detail, list) else [v.detail]), "tpu"
        else:
            continue
        if any(getattr(c, "cached", False) for c in parts):
            rec.note(f"{name}.{src}", "served from a compile cache: no compile seconds measured")
            continue
        secs = [c.metrics.compile_s if src == "metrics" else c.compile_s for c in parts]
        out[src] = rec.measure(name, float(sum(secs)), "s", src, kind="timing")
    return out


def memory_frame(views: Mapping[str, View]) -> pd.DataFrame:
    """Per-device bytes of compiled programs side by side: ``{label: hlo or tpu view}`` -> DataFrame.

    XLA:CPU's buffer assignment gives parameters, outputs and the heap-simulated peak of temporaries; XLA:TPU's
    compiled memory statistics give arguments, outputs, the HBM temporaries its capacity check counts (peak -
    arguments - outputs + aliased), generated code and the peak. Skipped views are left out.
    """
    cols: dict[str, dict[str, Any]] = {}
    for label, v in views.items():
        if not v.ran or v.detail is None:
            continue
        if v.source == "hlo" and v.detail.module.buffers is not None:
            b = v.detail.module.buffers
            cols[label] = {"arguments": b.parameter, "outputs": b.output, "temporaries": b.temp,
                           "generated code": None, "total": b.total, "peak": None}
        elif v.source == "tpu" and getattr(v.detail, "memory", None) is not None:
            m = v.detail.memory
            cols[label] = {"arguments": m.argument, "outputs": m.output, "temporaries": m.checked_temp,
                           "generated code": m.generated_code, "total": m.total, "peak": m.peak}
    return pd.DataFrame(cols, dtype=object)
