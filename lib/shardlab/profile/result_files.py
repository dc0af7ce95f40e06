"""Cached full-size results: one JSON file of named results plus how they were measured.

Design note: the full-size compiles of notebooks 06 and 07 take minutes, so their results are committed under
``data/scale/`` and the notebooks read them unless asked to compile live. A file is
``{"_source": {how, where, when}, "results": {name: result.as_dict()}}``; the caller passes its own result type's
``from_dict``. A missing file is an error that says how to produce it.

:class:`CompileResult` is one XLA:TPU compile as such a result — the verdict, the per-chip bytes the compiler's
capacity check counted (``TpuMemory``) or the out-of-memory message's numbers (``OutOfMemory``) — read once from
a :class:`~shardlab.profile.tpu.TpuCompile`; a topic subclasses it with its own fields.

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.json"
    >>> save_results({"a": CompileResult({"n": 1}, "v6e-8", False, 2.0, used_bytes=9)}, p, command="doctest")
    >>> r, source = load_results(p, CompileResult.from_dict, "run the doctest")
    >>> r["a"].per_chip_bytes, r["a"].runs, source
    (9, False, {'command': 'doctest'})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from shardlab.profile.hlo_text import Array, parse_shape
from shardlab.profile.record import Recorder
from shardlab.profile.tpu import TpuCompile

T = TypeVar("T")


def save_results(results: Mapping[str, Any], path: Path, **source: Any) -> None:
    """Write ``{name: result.as_dict()}`` and ``source`` (how and where it was measured) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"_source": source, "results": {k: r.as_dict() for k, r in results.items()}}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def load_results(path: Path, from_dict: Callable[[dict[str, Any]], T],
                 how_to_make: str) -> tuple[dict[str, T], dict[str, Any]]:
    """The results in ``path`` (each through ``from_dict``) and their ``_source``; a missing file raises
    ``FileNotFoundError`` saying ``how_to_make`` it."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {how_to_make}")
    data = json.loads(path.read_text())
    return {k: from_dict(v) for k, v in data["results"].items()}, data.get("_source", {})


def entry_layout(hlo_text: str) -> tuple[list[Array], list[Array]]:
    """(parameters, results) of a compiled program's entry computation, per chip, from its layout header."""
    head = hlo_text.split("\n", 1)[0]
    if "entry_computation_layout={" not in head:
        return [], []
    layout = head.split("entry_computation_layout={", 1)[1].split(", allow_spmd", 1)[0]
    params, results = layout.split(")->", 1)
    return parse_shape(params), parse_shape(results)


@dataclass
class CompileResult:
    """One XLA:TPU compile (per-chip numbers; bytes as the compiler reports them)."""

    config: dict[str, Any]  # the case's configuration, as the cache stores it
    topology: str
    fits: bool  # the compiler's verdict (its HBM check counts arguments + temporaries, not outputs)
    compile_s: float
    argument_bytes: int | None = None  # None: out of memory before the compiler evaluated them
    output_bytes: int | None = None
    temp_bytes: int | None = None  # the HBM temporaries the capacity check counts (TpuMemory.checked_temp)
    temp_size_bytes: int | None = None  # XLA's temp_size_in_bytes (more; not what the check counts)
    peak_bytes: int | None = None  # arguments + outputs + temporaries, live at once
    alias_bytes: int | None = None  # outputs written into donated argument buffers
    capacity_bytes: int | None = None
    message: str = ""  # the compiler's first line when it ran out of memory
    largest: list[tuple[int, str, str]] = field(default_factory=list)  # (bytes, shape, XLA label)
    used_bytes: int | None = None  # "Used ..." from the out-of-memory message (arguments + program)
    program_bytes: int | None = None  # the program's HBM requirement, from the out-of-memory message
    fragmentation_bytes: int | None = None  # of the program's temporaries, from the out-of-memory message
    output_in_message: str = ""  # "Output size ...": what the compiler reports but does not count

    DERIVED: ClassVar[tuple[str, ...]] = ("per_chip_bytes", "live_bytes", "runs")  # written by as_dict too

    @classmethod
    def read(cls, config: dict[str, Any], c: TpuCompile, **extra: Any) -> Self:
        """The numbers of one compile (the harness's tpu view's detail); ``extra``: the subclass's fields."""
        res = cls(config, c.topology, c.fits, c.compile_s, **extra)
        if c.fits and c.memory is not None:
            m = c.memory
            res.capacity_bytes = m.capacity
            res.argument_bytes, res.output_bytes, res.temp_bytes = m.argument, m.output, m.checked_temp
            res.temp_size_bytes, res.peak_bytes, res.alias_bytes = m.temp, m.peak, m.alias
        elif c.oom is not None:
            o = c.oom
            res.message = o.first_line
            res.used_bytes, res.capacity_bytes, res.program_bytes = o.used, o.capacity, o.program
            res.fragmentation_bytes = o.fragmentation
            res.largest = [(b.size, b.shape, b.label) for b in o.buffers[:5]]
            res.argument_bytes = o.arguments  # None: "arguments 0B" = not evaluated (the program alone was over)
            res.output_bytes = o.outputs
            res.output_in_message = next((ln.strip() for ln in o.message.splitlines()
                                          if ln.strip().startswith("Output size")), "")
        return res

    @property
    def per_chip_bytes(self) -> int | None:
        """What the capacity check counted: arguments + temporaries when it fits, the message's "Used" when not
        (the program alone when the arguments were not evaluated)."""
        if self.fits:
            return None if self.argument_bytes is None else self.argument_bytes + (self.temp_bytes or 0)
        return self.used_bytes

    @property
    def live_bytes(self) -> int | None:
        """Arguments + outputs + temporaries: what a chip must hold to run the step (outputs included)."""
        if self.peak_bytes:
            return self.peak_bytes
        if self.argument_bytes is None:
            return None
        return self.argument_bytes + (self.output_bytes or 0) + (self.temp_bytes or 0)

    @property
    def runs(self) -> bool:
        """Would the step run: the compile fits *and* the outputs fit beside arguments and temporaries."""
        return bool(self.fits and self.capacity_bytes and self.live_bytes is not None
                    and self.live_bytes <= self.capacity_bytes)

    def record(self, rec: Recorder, name: str) -> None:
        """``<name>.fits`` (1/0), ``.per_chip.bytes`` (when known) and ``.compile_s`` (a timing), source tpu."""
        rec.measure(f"{name}.fits", int(self.fits), "1", "tpu")
        if self.per_chip_bytes is not None:
            rec.measure(f"{name}.per_chip.bytes", self.per_chip_bytes, "bytes", "tpu")
        rec.measure(f"{name}.compile_s", self.compile_s, "s", "tpu", kind="timing")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), **{k: getattr(self, k) for k in self.DERIVED}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """Inverse of :meth:`as_dict` (derived values dropped; JSON turns tuples into lists)."""
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["largest"] = [tuple(x) for x in kw.get("largest", [])]
        return cls(**kw)
