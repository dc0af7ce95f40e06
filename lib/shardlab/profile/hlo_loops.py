"""How many times a ``while`` loop of a parsed HLO module runs, read from the loop itself.

Design
------
A loop's trip count is decided by a few integer scalars of its state: the condition reads them, the body steps
them. XLA:TPU prints them in more than one form — a plain ``i < N`` with ``i += 1`` (XLA:CPU, windowed einsum),
or a 64-bit counter split into two ``u32`` halves with a carry (torch_xla's ``scan`` on the TPU:
``hi < 0 or (hi == 0 and lo < N)``) — so instead of matching patterns we **run the control**: starting from
the initial tuple (constants in the calling computation), evaluate the condition, then the body's new value
of every scalar the condition (transitively) needs, until the condition is false. Only integer / predicate
scalar ops are evaluated (constant, parameter, get-tuple-element, tuple, copy, bitcast, convert,
bitcast-convert, add, subtract, multiply, divide, remainder, minimum, maximum, compare, and, or, xor, not,
negate, select, clamp); anything else (an array, a data-dependent exit) means "unknown" and gives None —
never a guess. XLA's own while-loop analysis does the same by brute force when no pattern applies.

A ``known_trip_count`` in the loop's backend config, when printed, is taken as is.

Example (a loop ``for i in range(1, 7, 2)``)::

    >>> from shardlab.profile.hlo import parse_hlo
    >>> m = parse_hlo('''HloModule m
    ... %c (p: (s32[])) -> pred[] {
    ...   %p = (s32[]) parameter(0)
    ...   %i = s32[] get-tuple-element(%p), index=0
    ...   %n = s32[] constant(7)
    ...   ROOT %lt = pred[] compare(%i, %n), direction=LT
    ... }
    ... %b (q: (s32[])) -> (s32[]) {
    ...   %q = (s32[]) parameter(0)
    ...   %j = s32[] get-tuple-element(%q), index=0
    ...   %two = s32[] constant(2)
    ...   %k = s32[] add(%j, %two)
    ...   ROOT %t = (s32[]) tuple(%k)
    ... }
    ... ENTRY %main () -> (s32[]) {
    ...   %one = s32[] constant(1)
    ...   %init = (s32[]) tuple(%one)
    ...   ROOT %w = (s32[]) while(%init), condition=%c, body=%b
    ... }''')
    >>> trip_count(m, "w"), len(range(1, 7, 2))
    (3, 3)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol


class Module(Protocol):
    """What this module reads of a :class:`shardlab.profile.hlo.HloModule` (hlo imports this module, so it is
    described here rather than imported back)."""

    instructions: Mapping[str, Any]
    computations: Mapping[str, list[str]]


MAX_TRIPS = 100_000  # brute force stops here: None (a loop that long is not something we price)
_BITS = {"pred": 1, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64}


class Unknown(Exception):
    """The value depends on something this evaluator does not run (an array, an unsupported op)."""


def _wrap(value: int, dtype: str) -> int:
    bits = _BITS.get(dtype)
    if bits is None:
        raise Unknown(dtype)
    if dtype == "pred":
        return int(bool(value))
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.startswith("s") and value >> (bits - 1) else value


_BINARY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
           "divide": lambda a, b: int(a / b), "remainder": lambda a, b: a - b * int(a / b),
           "minimum": min, "maximum": max, "and": lambda a, b: a & b, "or": lambda a, b: a | b,
           "xor": lambda a, b: a ^ b}
_COMPARE = {"EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b,
            "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b}


def _evaluate(module: Module, name: str, state: Any, memo: dict[str, Any]) -> Any:
    """Value of instruction ``name``: an int for a scalar, a list of lazily computed values for a tuple (the
    parameter's is ``state``, a function index -> int)."""
    if name in memo:
        return memo[name]
    ins = module.instructions.get(name)
    if ins is None:
        raise Unknown(name)
    op, args = ins.opcode, ins.operands
    dtype = ins.shape[0].dtype if len(ins.shape) == 1 and not ins.shape[0].dims else None
    if op == "parameter":
        value: Any = state
    elif op == "tuple":
        value = [lambda n=a: _evaluate(module, n, state, memo) for a in args]
    elif op == "get-tuple-element":
        t = _evaluate(module, args[0], state, memo)
        k = int(ins.attrs.get("index", "-1"))
        value = t(k) if callable(t) else t[k]()
    elif dtype is None:
        raise Unknown(f"{name}: not an integer scalar")
    elif op == "constant":
        lit = args[0] if args else ""
        value = {"true": 1, "false": 0}.get(lit) if lit in ("true", "false") else int(lit) if re.fullmatch(
            r"-?\d+", lit) else None
        if value is None:
            raise Unknown(f"{name}: constant {lit!r}")
    elif op in ("copy", "bitcast", "convert", "bitcast-convert"):
        value = _evaluate(module, args[0], state, memo)  # the dtype wrap below reinterprets the bits
    elif op == "negate":
        value = -_evaluate(module, args[0], state, memo)
    elif op == "not":
        a = _evaluate(module, args[0], state, memo)
        value = int(not a) if dtype == "pred" else ~a
    elif op in _BINARY:
        value = _BINARY[op](_evaluate(module, args[0], state, memo), _evaluate(module, args[1], state, memo))
    elif op == "compare":
        fn = _COMPARE.get(ins.attrs.get("direction", ""))
        if fn is None:
            raise Unknown(f"{name}: direction")
        value = int(fn(_evaluate(module, args[0], state, memo), _evaluate(module, args[1], state, memo)))
    elif op == "select":
        value = _evaluate(module, args[1] if _evaluate(module, args[0], state, memo) else args[2], state, memo)
    elif op == "clamp":
        lo, x, hi = (_evaluate(module, a, state, memo) for a in args)
        value = min(max(x, lo), hi)
    else:
        raise Unknown(f"{name}: {op}")
    if dtype is not None and isinstance(value, int) and op not in ("parameter", "tuple"):
        value = _wrap(value, dtype)
    memo[name] = value
    return value


def _root(module: Module, computation: str) -> str:
    names = module.computations.get(computation, [])
    roots = [n for n in names if module.instructions[n].is_root]
    if not roots:
        raise Unknown(f"{computation}: no root")
    return roots[0]


def _memoised(elements: list[Any]) -> Any:
    """A loop state ``index -> int`` over lazily evaluated tuple elements, each evaluated once (an element that
    cannot be evaluated raises :class:`Unknown` whenever it is asked for, and only then)."""
    cache: dict[int, Any] = {}

    def get(k: int) -> int:
        if k not in cache:
            try:
                cache[k] = elements[k]()
            except Unknown as exc:
                cache[k] = exc
        if isinstance(cache[k], Unknown):
            raise cache[k]
        return cache[k]

    return get


def trip_count(module: Module, name: str) -> int | None:
    """Iterations of ``while`` instruction ``name`` (see the module note), None when they cannot be read."""
    w = module.instructions[name]
    if w.opcode != "while":
        raise ValueError(f"{name} is a {w.opcode}, not a while")
    known = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', w.attrs.get("backend_config", ""))
    if known:
        return int(known.group(1))
    cond, body = (w.attrs.get(k, "").lstrip("%") for k in ("condition", "body"))
    try:
        cond_root, body_root = _root(module, cond), _root(module, body)
        init = _evaluate(module, w.operands[0], None, {})  # the initial tuple: a list of lazy elements
        state = _memoised(init)
        for trips in range(MAX_TRIPS + 1):
            if not _evaluate(module, cond_root, state, {}):
                return trips
            new = _evaluate(module, body_root, state, {})  # elements of the next state, evaluated on demand
            if not isinstance(new, list):
                raise Unknown("body root is not a tuple")
            state = _memoised(new)
        return None
    except (Unknown, IndexError, ValueError, TypeError, ZeroDivisionError):
        return None
