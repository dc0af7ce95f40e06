"""The topic registry: every notebook the suite has, found through one entry per topic folder.

Design note
-----------
A topic is a folder ``shardlab/<topic>/`` holding everything that is only its own — the notebook's parameter
dataclass (``params.py``), its cases, its section helpers, its figures, its exercise solutions — and one module
``topic.py`` that declares ``TOPIC = Topic(...)``. The report (which notebooks exist, their answer keys, their
charts), the parameters-cell builder (``tools/build_notebooks.py``), the exercises (the reference solutions) and
the tests read the suite from :func:`topics` / :func:`notebooks`; nothing else lists notebook names. The model is
torchtitan's ``TrainSpec`` registry (``register_train_spec`` / ``get_train_spec``), except that an entry is found
by walking the package's folders, so adding a topic edits no shared file.

Discovery imports ``shardlab.<pkg>.topic`` for every package folder of :mod:`shardlab` that has one — and of every
folder named in the environment variable ``SHARDLAB_TOPIC_DIRS`` (``os.pathsep``-separated), whose packages join
``shardlab``'s path (a topic developed outside the repository; the tests add a throwaway topic this way). A
``topic.py`` stays light (no torch at import). The exercises' reference solutions are the topic folder's
``solutions.py`` (``SOLUTIONS = {stem: {number: Solution}}``), imported by :func:`solutions` when a notebook grades
its exercises (they import torch). Its explorers, likewise, are the folder's ``explorers.py``
(``EXPLORERS = {stem: Explorer}``, :mod:`shardlab.core.explorer`), imported by :func:`explorer_of` when a notebook
builds one.

An entry::

    Topic("tp", "tensor parallelism: Megatron's MLP, attention and vocab-parallel layers", (
        Lesson(MlpParams, charts=(ChartSpec(...),)), Lesson(AttentionParams), Lesson(VocabParams, charts=...)))

Each :class:`Lesson` is one notebook: its stem is its parameter class's ``NOTEBOOK``; its notebook, source, answer
key and test files follow from the stem (``notebooks/<stem>.ipynb``, ``notebooks/src/<stem>.py``,
``data/answers/<stem>.json``, ``tests/test_nb_<stem>.py``) under ``root`` (the repository unless the topic says).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import shardlab
from shardlab.core.params import NotebookParams

REPO = Path(__file__).resolve().parents[3]  # a checkout: notebooks/, data/, tests/
ENV_DIRS = "SHARDLAB_TOPIC_DIRS"


@dataclass(frozen=True)
class Solution:
    """The reference solution of one exercise (graded by :mod:`shardlab.core.exercises`; never printed)."""

    expected: Callable[..., Any]  # (**measured) -> the reference answer
    hint: str  # what to think about; never the answer itself
    rel_tol: float = 0.0  # numbers: accepted relative error (0: exact)
    run: Callable[[Callable[..., Any]], Any] | None = None  # a code exercise: runs the learner's function, returns
    #                                                          what is compared with `expected`


def measured(value: Any = None, what: str = "") -> Any:
    """A "predict it, then check" solution: the value the notebook measured and passed in."""
    if value is None:
        raise ValueError(f"this exercise is graded against a measurement ({what}) the notebook passes in; "
                         "none was given")
    return value


@dataclass(frozen=True)
class ChartSpec:
    """One curve of the report, drawn from a notebook's record (:mod:`shardlab.report.charts`)."""

    title: str
    notebook: str
    pattern: str          # a regular expression over measurement names, with a group "x" (and maybe "series")
    y: str                # the y axis title
    x: str = ""           # the x axis title (default: the x group's name in the title)
    log_x: bool = False


@dataclass(frozen=True)
class Lesson:
    """One notebook of a topic."""

    params: type[NotebookParams]  # its parameter dataclass; ``params.NOTEBOOK`` is the notebook's stem
    charts: tuple[ChartSpec, ...] = ()  # the report's curves drawn from its record
    root: Path = REPO  # where notebooks/, data/answers/ and tests/ are

    @property
    def stem(self) -> str:
        return self.params.NOTEBOOK

    @property
    def notebook(self) -> Path:
        return self.root / "notebooks" / f"{self.stem}.ipynb"

    @property
    def source(self) -> Path:
        return self.root / "notebooks" / "src" / f"{self.stem}.py"

    @property
    def answer_key(self) -> Path:
        return self.root / "data" / "answers" / f"{self.stem}.json"

    @property
    def test(self) -> Path:
        return self.root / "tests" / f"test_nb_{self.stem}.py"


@dataclass(frozen=True)
class Topic:
    """A topic folder's registry entry: its name (the folder) and its notebooks."""

    name: str
    summary: str
    lessons: tuple[Lesson, ...]

    def __post_init__(self) -> None:
        for lesson in self.lessons:
            if not (isinstance(lesson.params, type) and issubclass(lesson.params, NotebookParams)
                    and lesson.params.NOTEBOOK):
                raise ValueError(f"topic {self.name!r}: {lesson.params!r} is not a NotebookParams subclass with a "
                                 "NOTEBOOK name")
            for chart in lesson.charts:
                if chart.notebook != lesson.stem:
                    raise ValueError(f"topic {self.name!r}: chart {chart.title!r} reads notebook {chart.notebook!r}, "
                                     f"not its lesson {lesson.stem!r}")


def _extra_dirs() -> tuple[str, ...]:
    return tuple(d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d)


@cache
def _discover(extra: tuple[str, ...]) -> tuple[Topic, ...]:
    for d in extra:
        if d not in shardlab.__path__:
            shardlab.__path__.append(d)
    found: list[Topic] = []
    for info in pkgutil.iter_modules(shardlab.__path__):
        folder = Path(getattr(info.module_finder, "path", "")) / info.name
        if not info.ispkg or not (folder / "topic.py").exists():  # (looked up on disk: no package is imported)
            continue
        module = importlib.import_module(f"shardlab.{info.name}.topic")
        topic = getattr(module, "TOPIC", None)
        if not isinstance(topic, Topic):
            raise TypeError(f"shardlab.{info.name}.topic defines no TOPIC = Topic(...)")
        if topic.name != info.name:
            raise ValueError(f"shardlab.{info.name}.topic: TOPIC.name={topic.name!r} must be its folder's name")
        found.append(topic)
    stems = [lesson.stem for t in found for lesson in t.lessons]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"notebooks registered by two topics: {twice}")
    return tuple(sorted(found, key=lambda t: min(lesson.stem for lesson in t.lessons)))


def topics() -> tuple[Topic, ...]:
    """Every registered topic, in notebook order."""
    return _discover(_extra_dirs())


def lessons() -> dict[str, Lesson]:
    """``{notebook stem: its lesson}`` over every topic, sorted by stem."""
    return dict(sorted((lesson.stem, lesson) for t in topics() for lesson in t.lessons))


def lesson(stem: str) -> Lesson:
    """The lesson of notebook ``stem``; KeyError naming the known notebooks."""
    found = lessons()
    if stem not in found:
        raise KeyError(f"no topic registers notebook {stem!r}; registered: {', '.join(found)}")
    return found[stem]


def topic_of(stem: str) -> Topic:
    """The topic that registers notebook ``stem``."""
    lesson(stem)  # KeyError naming the registered notebooks
    return next(t for t in topics() if any(lesson.stem == stem for lesson in t.lessons))


def solutions(stem: str) -> Mapping[int, Solution]:
    """The reference solutions of notebook ``stem``'s exercises: ``SOLUTIONS[stem]`` of its topic folder's
    ``solutions`` module ({} when the topic has none)."""
    name = f"shardlab.{topic_of(stem).name}.solutions"
    if importlib.util.find_spec(name) is None:
        return {}
    return importlib.import_module(name).SOLUTIONS.get(stem, {})


def notebook_params() -> dict[str, type[NotebookParams]]:
    """``{notebook stem: its parameter dataclass}``."""
    return {stem: lesson.params for stem, lesson in lessons().items()}


def explorer_of(stem: str) -> Any:
    """The declared explorer of notebook ``stem`` (a :class:`shardlab.core.explorer.Explorer`): ``EXPLORERS[stem]``
    of its topic folder's ``explorers`` module; KeyError naming the notebook when it declares none."""
    found = explorers(stem)
    if found is None:
        raise KeyError(f"notebook {stem!r} declares no explorer (EXPLORERS in shardlab.{topic_of(stem).name}"
                       ".explorers)")
    return found


def explorers(stem: str) -> Any:
    """The declared explorer of notebook ``stem``, or None."""
    name = f"shardlab.{topic_of(stem).name}.explorers"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name).EXPLORERS.get(stem)
