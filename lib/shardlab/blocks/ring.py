"""The ring algorithm, step by step: why an all-reduce costs each rank 2(W−1)/W of its payload.

Design
------
W ranks stand in a ring; rank r only ever sends to rank r+1 (mod W). Each rank's tensor is cut into W
blocks ("chunks", the uneven rule of :func:`shardlab.blocks.split_sizes`). All sends of one step happen at
the same time, one chunk per rank.

- **reduce-scatter** (W−1 steps): at step s rank r sends chunk (r − s) mod W — the partial sum it received
  at step s−1, plus its own — and rank r+1 adds it to its own copy. After W−1 steps rank r holds chunk r
  summed over all W ranks, having sent W−1 chunks: (W−1)/W of its payload.
- **all-gather** (W−1 steps): at step s rank r sends chunk (r − s + 1) mod W — the complete chunk it owns
  or received at step s−1 — and rank r+1 keeps it. After W−1 steps every rank holds every chunk.
- **all-reduce** = reduce-scatter then all-gather: 2(W−1) steps, 2(W−1) chunks of payload/W sent per rank
  = 2(W−1)/W · payload, whatever W is: the ring keeps every link busy with 1/W of the data at a time.

:func:`simulate` runs the schedule on real tensors and records every send and, after each step, which ranks'
contributions each rank's copy of each chunk holds. Its sums are checked against the dense sum by the tests,
its byte counts against the ring formula (``shardlab.formulas.common.wire_bytes``), which it never calls.
:func:`wire_bytes` walks the same :func:`schedule` without data — bytes per rank of a collective given only its
op, length, item size and group size — so a ledger entry or a compiled collective can be priced by *counting the
chunks the algorithm sends* (:func:`ledger_wire_bytes`), independently of the formula's factors. With uneven
chunks (n not divisible by W) the ranks send different amounts (by whole elements); :func:`wire_bytes` returns
the mean over the ranks — what the formula's 2(W−1)/W·payload describes.

Example::

    >>> import torch
    >>> t = simulate("all_reduce", [torch.full((8,), float(r + 1)) for r in range(4)])   # ranks hold 1, 2, 3, 4
    >>> t.steps, t.sent_bytes(0), t.results[2].tolist()       # 6 steps; 6 chunks of 2 floats = 48 bytes
    (6, 48, [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0])
    >>> wire_bytes("all_reduce", 10, 4, 4)   # chunks 3, 3, 2, 2: the ranks send 56, 60, 64, 60 bytes
    60.0
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from shardlab.blocks import split_sizes
from shardlab.comm import Ledger

OPS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Send:
    """One chunk crossing one link."""

    step: int  # 1-based, over the whole algorithm
    phase: str  # "reduce-scatter" | "all-gather"
    src: int
    dst: int  # (src + 1) mod W
    chunk: int
    nbytes: int


@dataclass
class RingTrace:
    """What happened: the sends, the state after every step, and each rank's result."""

    op: str
    world_size: int
    sends: list[Send] = field(default_factory=list)
    # held[s][r][c]: the ranks whose data rank r's copy of chunk c contains after step s (s = 0: before);
    # an empty set means rank r holds nothing of chunk c.
    held: list[list[list[frozenset[int]]]] = field(default_factory=list)
    results: list[torch.Tensor] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.held) - 1

    def sent_bytes(self, rank: int) -> int:
        return sum(s.nbytes for s in self.sends if s.src == rank)

    def sends_at(self, step: int) -> list[Send]:
        return [s for s in self.sends if s.step == step]

    def phase_of(self, step: int) -> str:
        return self.sends_at(step)[0].phase if self.sends_at(step) else "start"


def schedule(op: str, world_size: int) -> Iterator[tuple[int, str, list[int], bool]]:
    """The ring's steps: ``(step, phase, chunk_of, add)`` — at ``step`` rank r sends chunk ``chunk_of[r]`` to rank
    r + 1, which adds it to its copy (``add``, the reduce-scatter phase) or keeps it (the all-gather phase)."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    w, s = world_size, 0
    if op in ("all_reduce", "reduce_scatter"):
        for i in range(1, w):
            s += 1
            yield s, "reduce-scatter", [(r - i) % w for r in range(w)], True
    if op in ("all_reduce", "all_gather"):
        for i in range(1, w):
            s += 1
            yield s, "all-gather", [(r - i + 1) % w for r in range(w)], False


def wire_bytes(op: str, numel: int, world_size: int, itemsize: int) -> float:
    """Bytes one rank sends in the ring ``op`` (mean over the ranks), counted chunk by chunk along
    :func:`schedule`: ``numel`` is the length each rank hands in (all_gather: its shard, every rank's alike)."""
    if world_size < 1 or numel < 0 or itemsize < 1:
        raise ValueError(f"world_size={world_size}, numel={numel}, itemsize={itemsize}: need world_size >= 1, "
                         "numel >= 0, itemsize >= 1")
    base, extra = divmod(numel, world_size)  # split_sizes' rule, empty chunks allowed (n < W)
    sizes = [numel] * world_size if op == "all_gather" else [base + (c < extra) for c in range(world_size)]
    sent = sum(sizes[c] for _, _, chunk_of, _ in schedule(op, world_size) for c in chunk_of)  # all ranks, all steps
    return sent * itemsize / world_size


def ledger_wire_bytes(ledger: Ledger, op: str | None = None) -> float:
    """Wire bytes per rank of a ledger's ring collectives (all-reduce, reduce-scatter, all-gather), counted by
    :func:`wire_bytes` from each entry's shape, dtype and group — not from the entry's own ``wire_bytes`` (the
    formula's model). ``op``: only that collective."""
    total = 0.0
    for e in ledger.select(op):
        if e.op not in OPS:
            raise ValueError(f"ledger entry {e.seq} is a {e.op}: the ring schedule prices {OPS} only")
        numel = math.prod(e.shape)
        if numel:
            total += wire_bytes(e.op, numel, e.group_size, e.payload_bytes // numel)
    return total


def simulate(op: str, inputs: list[torch.Tensor]) -> RingTrace:
    """Run the ring ``op`` on ``inputs[r]`` (rank r's 1-D tensor; for all_gather: its chunk).

    all_reduce / reduce_scatter: every input has the same length n (cut into W chunks, first n mod W one
    longer). all_gather: input r *is* chunk r. Results: all_reduce -> the sum (length n) on every rank;
    reduce_scatter -> rank r's chunk of the sum; all_gather -> the concatenated chunks.
    """
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    w = len(inputs)
    if w < 1:
        raise ValueError("inputs=[] : the ring needs at least one rank")
    if any(t.dim() != 1 for t in inputs):
        raise ValueError(f"inputs must be 1-D tensors, got shapes {[tuple(t.shape) for t in inputs]}")
    esize = inputs[0].element_size()
    if op == "all_gather":
        chunks: list[list[torch.Tensor | None]] = [[inputs[r].clone() if c == r else None for c in range(w)]
                                                  for r in range(w)]
    else:
        n = inputs[0].numel()
        if any(t.numel() != n for t in inputs):
            raise ValueError(f"{op}: every rank's tensor must have the same length, got {[t.numel() for t in inputs]}")
        chunks = [list(torch.split(t.clone(), split_sizes(n, w, "the tensor's length"))) for t in inputs]
    held = [[frozenset({r}) if chunks[r][c] is not None else frozenset() for c in range(w)] for r in range(w)]
    trace = RingTrace(op, w, held=[[list(row) for row in held]])

    def step(number: int, phase: str, chunk_of: list[int], add: bool) -> None:
        nonlocal held
        sends = [(r, (r + 1) % w, chunk_of[r]) for r in range(w)]
        payload = {(src, c): (chunks[src][c], held[src][c]) for src, _dst, c in sends}  # read before writing
        new_held = [list(row) for row in held]
        for src, dst, c in sends:
            data, have = payload[(src, c)]
            assert data is not None, f"rank {src} has no chunk {c} to send at step {number}"
            chunks[dst][c] = chunks[dst][c] + data if add else data.clone()
            new_held[dst][c] = (held[dst][c] | have) if add else have
            trace.sends.append(Send(number, phase, src, dst, c, data.numel() * esize))
        held = new_held
        trace.held.append([list(row) for row in held])

    for number, phase, chunk_of, add in schedule(op, w):
        step(number, phase, chunk_of, add)
    if op == "reduce_scatter":
        trace.results = [chunks[r][r] for r in range(w)]
    else:
        trace.results = [torch.cat([c for c in chunks[r] if c is not None]) for r in range(w)]
    return trace
