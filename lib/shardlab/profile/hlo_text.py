"""Text-level pieces of the HLO parser: shapes, instruction lines, replica groups, buffer assignment.

Design: pure string → dataclass functions with no knowledge of modules or collectives; ``hlo.py`` builds a
module from them. After XLA's optimisation passes, operands are printed as bare names (``%dot.3``), shapes
may be tuples and layouts may carry TPU tiling (``{1,0:T(8,128)}``) — all handled here.

Example::

    >>> parse_shape("(s32[], bf16[2,128]{1,0})")[1].nbytes
    512
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from shardlab.formulas.dtypes import HLO_BYTES

COMPUTATION_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*?)\s*\{\s*$")
INSTRUCTION_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


@dataclass(frozen=True)
class Array:
    """One array shape: dtype and per-device dims."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * HLO_BYTES.get(self.dtype, 0)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def parse_shape(text: str) -> list[Array]:
    """All arrays in a (possibly tuple) shape string, layouts ignored: ``(f32[2,3]{1,0}, s32[])``."""
    text = re.sub(r"\{[^{}]*\}", "", text)  # layouts / tiling
    out = []
    for dtype, dims in _ARRAY_RE.findall(text):
        if dtype not in HLO_BYTES:
            continue
        ds = tuple(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())
        out.append(Array(dtype, ds))
    return out


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` at bracket depth 0."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _matching(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opener, depth = text[start], 0
    for i in range(start, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == pairs[opener]:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced brackets in HLO line: {text[:120]}")


@dataclass
class Instruction:
    name: str
    opcode: str
    shape: list[Array]
    operands: list[str]
    attrs: dict[str, str]
    computation: str
    is_root: bool = False

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.shape)


def parse_instruction(line: str, computation: str) -> Instruction | None:
    m = INSTRUCTION_RE.match(line)
    if not m:
        return None
    root, name, rest = m.groups()
    rest = rest.strip()
    if rest.startswith("("):
        end = _matching(rest, 0)
        shape_txt, rest = rest[: end + 1], rest[end + 1:].strip()
    else:
        sm = re.match(r"([a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?)\s*", rest)
        if not sm:
            return None
        shape_txt, rest = sm.group(1), rest[sm.end():]
    om = re.match(r"([\w\-]+)\(", rest)
    if not om:
        return None
    opcode = om.group(1)
    end = _matching(rest, om.end() - 1)
    operands = []
    for op in _split_top(re.sub(r"/\*.*?\*/", "", rest[om.end(): end])):  # drop /*index=5*/ comments
        tok = op.split()[-1] if op.split() else op
        operands.append(tok.lstrip("%"))
    attrs: dict[str, str] = {}
    for kv in _split_top(rest[end + 1:].lstrip(", ")):
        if "=" in kv:
            k, v = kv.split("=", 1)
            attrs[k.strip()] = v.strip()
    return Instruction(name, opcode, parse_shape(shape_txt), operands, attrs, computation, bool(root))


def parse_replica_groups(text: str | None, num_partitions: int) -> list[list[int]]:
    """``{{0,1},{2,3}}`` or iota ``[2,2]<=[4]`` / ``[2,4]<=[4,2]T(1,0)``; empty means one group of all."""
    if not text or text in ("{}", "{{}}"):
        return [list(range(num_partitions))] if num_partitions else []
    text = text.strip()
    m = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m:
        out_shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(out_shape).tolist()
    return [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text)]


@dataclass
class BufferAssignment:
    total: int = 0
    parameter: int = 0
    output: int = 0
    temp: int = 0
    constant: int = 0
    thread_local: int = 0
    allocations: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def parse_buffer_assignment(text: str) -> BufferAssignment:
    """Sum allocation sizes by kind; ``total`` is XLA's own "Total bytes used"."""
    ba = BufferAssignment()
    for m in re.finditer(r"^allocation \d+: size (\d+),?(.*?):?$", text, re.M):
        size, kinds = int(m.group(1)), m.group(2)
        ba.allocations += 1
        if "parameter" in kinds:
            ba.parameter += size
        elif "output" in kinds or "maybe-live-out" in kinds:
            ba.output += size
        elif "constant" in kinds:
            ba.constant += size
        elif "thread-local" in kinds:
            ba.thread_local += size
        else:
            ba.temp += size
    tm = re.search(r"Total bytes used:\s*(\d+)", text)
    ba.total = int(tm.group(1)) if tm else sum((ba.parameter, ba.output, ba.temp, ba.constant))
    return ba
