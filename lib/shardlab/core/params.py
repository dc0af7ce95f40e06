"""Notebook parameters: one frozen dataclass per notebook, validated once, before any XLA work.

Design
------
papermill injects plain literals into a notebook's first cell (tagged ``parameters``). That cell stays a
list of literals, and the cell after it reads them into the notebook's dataclass in one line::

    p = MlpParams.from_namespace(globals())      # exactly the declared fields; validated; errors name the rule

``from_namespace`` takes every field of the dataclass from the namespace (a missing one is an error, so a
parameter cannot be silently ignored) and calls :meth:`NotebookParams.validate`, which raises ``ValueError``
naming the parameter and the rule ("ffn=100 is not divisible by tp=8"). The :class:`Recorder` takes the
object (``Recorder.for_params(p, world)``), so a notebook never writes its parameters twice.
``tests/test_params.py`` checks that each notebook's parameters cell declares exactly its dataclass's fields
with the same defaults — no notebook declares a parameter it does not use.

Each topic's folder declares its notebooks' dataclasses (``shardlab.tp.params.MlpParams`` …) and registers them
in its ``TOPIC`` entry (:mod:`shardlab.core.topics`); this module is the base class and the shared one-field rules.

Example::

    >>> from shardlab.tp.params import MlpParams
    >>> MlpParams(tp=3).validate()
    Traceback (most recent call last):
    ValueError: ffn=256 is not divisible by tp=3 (ParallelMLP splits the MLP's inner dimension)
    >>> MlpParams(tp=4, num_devices=1).validate().tp
    4
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import tokenize
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar, Self

from shardlab.profile.tpu import parse_slice

DTYPES = ("float32", "bfloat16")


def positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")


def divisible(name: str, value: int, by_name: str, by: int, why: str) -> None:
    if value % by:
        raise ValueError(f"{name}={value} is not divisible by {by_name}={by} ({why})")


def one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {allowed}")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")


@dataclass(frozen=True)
class NotebookParams:
    """Fields every notebook declares; subclasses add their own and extend :meth:`checks`.

    A size that sets a view's device count (ranks, blocks, degrees, a mesh) may exceed ``num_devices``: formula and
    ledger need no devices, the harness skips the CPU compiler view with a note and compiles the TPU view for that
    many chips in a helper process."""

    NOTEBOOK: ClassVar[str] = ""
    # The one-field rules, each class listing its own fields (validate() applies those of every class in the MRO)
    POSITIVE: ClassVar[tuple[str, ...]] = ()  # positive ints
    FLAGS: ClassVar[tuple[str, ...]] = ()  # True or False
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {}  # field -> the values it may take
    # TPU slice names: a user may write "v6e-8" or libtpu's "v6e:2x4"; validate() stores the one form ("v6e-8")
    SLICES: ClassVar[tuple[str, ...]] = ()

    num_devices: int = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
    results_dir: str | None = None  # where the JSON record goes (the report runner sets it)
    seed: int = 0  # seed of every random tensor
    answers: dict | None = None  # exercise answer key (the tests and the report inject it); leave None

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> Self:
        """Read every field from ``namespace`` (a notebook's ``globals()``) and validate."""
        missing = [f.name for f in fields(cls) if f.name not in namespace]
        if missing:
            raise ValueError(f"{cls.NOTEBOOK or cls.__name__}: the parameters cell does not define {missing}")
        return cls(**{f.name: namespace[f.name] for f in fields(cls)}).validate()

    def validate(self) -> Self:
        if self.num_devices is not None:  # None: all TPU chips of a TPU host
            positive_int("num_devices", self.num_devices)
        if self.results_dir is not None and not isinstance(self.results_dir, str):
            raise ValueError(f"results_dir={self.results_dir!r} must be a path string or None")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")
        if self.answers is not None and not isinstance(self.answers, dict):
            raise ValueError(f"answers={self.answers!r} must be None or a dict of exercise number to answer")
        for klass in reversed(type(self).__mro__):
            rules = vars(klass)
            for name in rules.get("POSITIVE", ()):
                positive_int(name, getattr(self, name))
            for name in rules.get("FLAGS", ()):
                boolean(name, getattr(self, name))
            for name, allowed in rules.get("CHOICES", {}).items():
                one_of(name, getattr(self, name), allowed)
            for name in rules.get("SLICES", ()):
                # the boundary: the notebook's own code and the library see the generation-chips name only
                object.__setattr__(self, name, parse_slice(getattr(self, name), name))
        self.checks()
        return self

    def checks(self) -> None:
        """Notebook-specific rules beyond POSITIVE, FLAGS and CHOICES (subclasses)."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default value (default factories called)."""
        return {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                for f in fields(cls)}

    @classmethod
    def parameters_cell(cls) -> str:
        """The notebook's ``parameters`` cell, generated from the dataclass: one ``name = default  # comment``
        line per field, in field order, the comment of the class that declared the field last."""
        comments: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if klass is object or not hasattr(klass, "__dataclass_fields__"):
                continue
            comments |= field_comments(klass)
        lines = []
        defaults = cls.defaults()
        defaults["answers"] = defaults.pop("answers")  # last: the learner never sets it
        for name, value in defaults.items():
            text = f"{name} = {_literal(value)}"
            lines.append(f"{text}  # {comments[name]}" if comments.get(name) else text)
        return "\n".join(lines)

    def as_record(self) -> dict[str, Any]:
        """The parameters as the record stores them: ``results_dir`` (where, not what) and the injected answer
        key (not a parameter of the measurement) are left out."""
        out = asdict(self)
        out.pop("results_dir")
        out.pop("answers")
        return out


def _literal(value: Any) -> str:
    """A default as the plain literal papermill injects (tuples as lists)."""
    if isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    ast.literal_eval(text)  # a parameters cell holds literals only
    return text


def field_comments(cls: type) -> dict[str, str]:
    """``{field: trailing comment}`` of the annotated assignments in ``cls``'s own body."""
    source = inspect.getsource(cls)
    tree = ast.parse(source)
    body = tree.body[0].body  # type: ignore[attr-defined]
    lines = {n.lineno: n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    out: dict[str, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in lines:
            out[lines[tok.start[0]]] = tok.string.lstrip("#").strip()
    return out


# ---------------------------------------------------------------------------- shared rules
GENERATIONS = ("v5e", "v6e")


def int_sequence(name: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{name}={value!r} must be a non-empty list of positive ints")
    for v in value:
        positive_int(f"{name} entry", v)



def int_list(name: str, value: Any, least: int = 1, empty_ok: bool = False) -> None:
    if not isinstance(value, list | tuple) or (not value and not empty_ok):
        raise ValueError(f"{name}={value!r} must be a {'' if empty_ok else 'non-empty '}list of ints >= {least}")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < least]
    if bad:
        raise ValueError(f"{name}={list(value)} has entries {bad}: each must be an int >= {least}")



def layer_widths(name: str, value: Any) -> tuple[int, ...]:
    """A list/tuple of >= 2 positive ints (MLP widths), returned as a tuple."""
    if (not isinstance(value, list | tuple) or len(value) < 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value)):
        shown = list(value) if isinstance(value, tuple) else value
        raise ValueError(f"{name}={shown!r} must be a list of >= 2 positive ints (MLP widths)")
    return tuple(value)
