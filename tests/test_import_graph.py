"""The package's import graph has no cycle, and one-fact constants are defined once.

Read from the sources with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` of a
``shardlab`` module counts, at the top of a module, inside a function, or under ``TYPE_CHECKING`` — a
cycle hidden in a function or behind ``TYPE_CHECKING`` is still a cycle for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "lib" / "shardlab"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: shardlab modules it imports}`` (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lib_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "shardlab.report.datatypes" in graph["shardlab.report.runner"]      # the graph is really read
    assert cycles(graph) == []


def test_report_data_types_sit_below_their_users() -> None:
    graph = import_graph()
    below = {"shardlab.report.runner", "shardlab.report.html", "shardlab.report.rundir"}
    for user in below:
        assert "shardlab.report.datatypes" in graph[user], user
    assert not graph["shardlab.report.datatypes"] & (below | {"shardlab.report.sweep"})


def test_exit_codes_are_defined_once() -> None:
    owners = []
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = {n.id for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t])
                     if isinstance(n, ast.Name)}
            if names & {"EXIT_OK", "EXIT_FAILED", "EXIT_RUNNER"}:
                owners.append(name)
    assert owners == ["shardlab.report.datatypes"]


# the layers, bottom up: a module imports its own layer or those below, never above (topics may use each other)
GROUND = {"formulas", "runtime", "models", "viz"}
SHARED = {"comm", "profile"}
CORE = {"core"}
OUTSIDE_TOPICS = GROUND | SHARED | CORE | {"report", "__main__", ""}


def _package(module: str) -> str:
    """``shardlab.tp.case`` -> ``tp``; ``shardlab`` (the package's face) -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_runs_back_up_the_layers() -> None:
    graph = import_graph()
    topics = {_package(m) for m in graph} - OUTSIDE_TOPICS
    assert {"tp", "planner", "xla_scan"} <= topics  # the graph is really read
    allowed = {**{p: GROUND | {""} for p in GROUND}, **{p: GROUND | SHARED | {""} for p in SHARED},
               "core": GROUND | SHARED | CORE | {""}, "report": GROUND | SHARED | CORE | {"report", ""}}
    upward = []
    for module, deps in graph.items():
        pkg = _package(module)
        for dep in deps:
            dpkg = _package(dep)
            if dpkg == pkg:
                continue
            if pkg in allowed and dpkg not in allowed[pkg]:
                upward.append(f"{module} -> {dep}")
    assert upward == []


def test_at_most_three_top_level_modules() -> None:
    modules = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(modules) <= 3, modules
    assert not list(PKG.glob("planner_*.py"))


def test_class_names_unique() -> None:
    """One name per class across the library: no two modules define a top-level class of the same name (a reader
    who meets ``StepCase`` must not have to ask which)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(PKG)))
    dupes = {name: where for name, where in seen.items() if len(where) > 1}
    assert not dupes, f"class names defined in more than one module: {dupes}"
