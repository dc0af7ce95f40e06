"""Exercises: the learner's answer graded right / wrong (with a hint, never the answer); the answer key checked.

Design
------
Each notebook ends with numbered exercises. A learner writes an answer into a plain variable and a grader
says whether it is right::

    answer_1 = None                      # bytes each rank hands to the forward all-reduce
    ex.grade(1, answer_1)                # "exercise 1: not answered yet" / "right" / "not quite — hint: ..."

The reference solution of every exercise lives in its topic's folder (``shardlab.<topic>.solutions``, found
through the topic registry: :func:`shardlab.core.topics.solutions`): a function computing the expected value from
the library's formulas — or from a value the notebook measured and passes in (``ex.grade(4, answer_4,
hlo_count=...)``: "predict it, then check the HLO") — a tolerance and a hint. The notebook shows neither the
value nor the way to it; its explanation sits in a collapsed ``<details>`` block after the exercises.

The answer key is checked, not trusted: every notebook with exercises declares a parameter ``answers``
(None for a learner). The report and the tests pass the hand-written reference answers from
``data/answers/<notebook>.json`` (worked out from the papers and by hand, independently of this module); then
each exercise grades the key's answer, and a check ``exercise.<n>.answer_key`` fails the run when the grader
rejects it — a wrong solution here, a wrong key there, or a library formula that changed.

Example::

    >>> demo = {"demo": {1: Solution(lambda: 2 + 2, "add the two numbers")}}
    >>> Exercises("demo", solutions=demo).grade(1, 5)
    'exercise 1: not quite — hint: add the two numbers'
    >>> Exercises("demo", solutions=demo).grade(1, 4)
    'exercise 1: right'

A code exercise runs what the learner wrote (here: a function that must double its input)::

    >>> code = {"demo": {1: Solution(lambda: [2, 4], "double it", run=lambda f: [f(1), f(2)])}}
    >>> Exercises("demo", solutions=code).grade(1, lambda x: x + 1)
    'exercise 1: not quite — hint: double it'
    >>> Exercises("demo", solutions=code, answers={"1": "def answer(x): return 2 * x"}).grade(1, lambda x: 2 * x)
    'exercise 1: right'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shardlab.core import topics
from shardlab.core.answer_keys import load_key
from shardlab.core.topics import Solution
from shardlab.profile.record import Recorder

__all__ = ["Exercises", "Solution", "load_key", "matches"]


def matches(answer: Any, expected: Any, rel_tol: float = 0.0) -> bool:
    """Numbers within ``rel_tol`` (exact when 0); strings case- and space-insensitive; tuples/lists elementwise."""
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected
    if isinstance(expected, int | float) and isinstance(answer, int | float):
        return math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=0.0 if rel_tol else 1e-12)
    if isinstance(expected, str) and isinstance(answer, str):
        return " ".join(answer.lower().split()) == " ".join(expected.lower().split())
    if isinstance(expected, list | tuple) and isinstance(answer, list | tuple):
        return len(answer) == len(expected) and all(matches(a, e, rel_tol) for a, e in zip(answer, expected,
                                                                                              strict=True))
    return False


class Exercises:
    """The grader of one notebook's exercises. ``answers``: the answer key a test or the report injected."""

    def __init__(self, notebook: str, rec: Recorder | None = None, answers: Mapping[str, Any] | None = None,
                 solutions: Mapping[str, Mapping[int, Solution]] | None = None) -> None:
        if solutions is None:
            solutions = {notebook: topics.solutions(notebook)}
        if not solutions.get(notebook):
            raise KeyError(f"no exercises registered for {notebook!r}")
        if answers is not None and not isinstance(answers, Mapping):
            raise ValueError(f"answers={answers!r} must be None or a mapping of exercise number to answer")
        unknown = sorted(set(map(str, answers or {})) - {str(n) for n in solutions[notebook]})
        if unknown:
            raise ValueError(f"answers has exercise numbers {unknown} that {notebook} does not have "
                             f"(it has {sorted(solutions[notebook])})")
        self.notebook, self.rec, self.answers = notebook, rec, {str(k): v for k, v in (answers or {}).items()}
        self.solutions = solutions[notebook]

    def grade(self, number: int, answer: Any = None, **measured: Any) -> str:
        """Grade ``answer`` (or, when an answer key was injected, the key's answer) for exercise ``number``.

        A code exercise (``Solution.run``) takes a function — or, in an answer key, Python source defining
        ``answer`` — runs it through ``Solution.run`` and grades what comes out."""
        sol = self.solutions.get(number)
        if sol is None:
            raise KeyError(f"{self.notebook} has no exercise {number}")
        expected = sol.expected(**measured)
        if sol.run is not None and answer is not None:
            try:
                answer = sol.run(answer)
            except Exception as exc:  # noqa: BLE001 - the learner's code failed: say how, as a hint
                return f"exercise {number}: your code raised {type(exc).__name__}: {exc}"
        keyed = str(number) in self.answers
        if keyed:
            key = self.answers[str(number)]
            if sol.run is not None:
                namespace: dict[str, Any] = {}
                exec(key, namespace)  # the hand-written key of a code exercise: source defining `answer`
                key = sol.run(namespace["answer"])
            ok = matches(key, expected, sol.rel_tol)
            if self.rec is not None:
                self.rec.check(f"exercise.{number}.answer_key", ok,
                               "the grader accepts the reference answer" if ok
                               else f"the grader rejects the reference answer {self.answers[str(number)]!r}")
        if answer is None:
            msg = f"exercise {number}: not answered yet (write your answer into answer_{number})"
            if keyed:
                msg += "; the injected answer key was graded"
        elif matches(answer, expected, sol.rel_tol):
            msg = f"exercise {number}: right"
        else:
            msg = f"exercise {number}: not quite — hint: {sol.hint}"
        return msg

    def show(self, number: int, answer: Any = None, **measured: Any) -> None:
        """Print the grade (the notebook cell's one line)."""
        print(self.grade(number, answer, **measured))
