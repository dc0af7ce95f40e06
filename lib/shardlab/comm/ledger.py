"""The ledger: one row per collective a rank issued.

Design note
-----------
Every `Comm` keeps a `Ledger`.  A collective appends one `LedgerEntry` describing what *this* rank handed to
the collective: the op, the group size, the dtype, the per-rank input shape, the payload bytes (all-reduce -> its
input, all-gather -> its shard, reduce-scatter and all-to-all -> its full input; send -> the tensor, recv -> the
bytes received, with `peer` the other rank) and the wire bytes per rank of the ring model
(:mod:`shardlab.formulas.common`, which holds the one table; a recv's row carries 0, the sender's the wire).

The phase ("forward" / "backward") is detected from the autograd engine: a collective issued while a backward
pass is running (inside an `autograd.Function.backward`) is a backward collective.  A pipeline stage sends its
input gradient *after* `torch.autograd.backward` returned, where `current_phase()` would say "forward":
`with phase_scope("backward"): comm.send(...)` labels it.

Worlds (SimulatedWorld, DistributedWorld) expose rank 0's ledger as `world.ledger` and check every run with
`ledger_problem`: the collective rows (everything but send / recv) must be identical on every rank (`seq` may
differ once point-to-point rows sit between them), and the k-th send i -> j must be the k-th recv on j from i,
with the same shape and dtype.

Example::

    led = Ledger()
    led.append(LedgerEntry(0, "all_reduce", 4, "float32", (2, 3), 24, 36.0, "forward"))
    led.count("all_reduce"), led.payload_bytes("all_reduce")   # (1, 24)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch

from shardlab.formulas.common import wire_bytes

if TYPE_CHECKING:
    import pandas as pd

# broadcast: no Comm issues one; its rows are PyTorch's own, logged by fsdp.torch_ref
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
P2P_OPS = ("send", "recv")
OPS = COLLECTIVE_OPS + P2P_OPS
PHASES = ("forward", "backward")
_PHASE = threading.local()


def ring_wire_bytes(op: str, payload_bytes: int, group_size: int) -> float:
    """Bytes one rank sends under the ring model (the one definition lives in
    :func:`shardlab.formulas.common.wire_bytes`).

    `ring_wire_bytes("all_reduce", 100, 4)` -> 150.0
    """
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    return float(wire_bytes(op, payload_bytes, group_size))


def current_phase() -> str:
    """The innermost `phase_scope` of this thread if any; else "backward" while the autograd engine runs a
    backward pass in this thread, else "forward"."""
    forced = getattr(_PHASE, "stack", None)
    if forced:
        return forced[-1]
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


@contextmanager
def phase_scope(phase: str) -> Iterator[None]:
    """Label every ledger row recorded by this thread inside the block with `phase` ("forward" | "backward").

    >>> with phase_scope("backward"):
    ...     current_phase()
    'backward'
    """
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not one of {PHASES}")
    stack = _PHASE.__dict__.setdefault("stack", [])
    stack.append(phase)
    try:
        yield
    finally:
        stack.pop()


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class LedgerEntry:
    seq: int  # 0-based position of the collective in this rank's program order
    op: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send | recv (| broadcast: PyTorch's own)
    group_size: int
    dtype: str  # "float32"
    shape: tuple[int, ...]  # per-rank INPUT shape (the tensor this rank hands to the collective)
    payload_bytes: int  # bytes of that input (what this rank hands over)
    wire_bytes: float  # ring model, per rank
    phase: str  # forward | backward
    reduce_op: str | None = None  # "sum" | "max" for all_reduce / reduce_scatter
    dim: int | None = None  # gather / scatter dim (normalised to be non-negative)
    tag: str = ""  # free label set by the caller, e.g. "f", "g", "ce.max"
    peer: int | None = None  # send: the destination rank; recv: the source rank


class Ledger:
    """An ordered list of `LedgerEntry` with counting helpers; filters take None as "any"."""

    def __init__(self, entries: list[LedgerEntry] | None = None) -> None:
        self.entries: list[LedgerEntry] = list(entries or [])

    def append(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)

    def select(self, op: str | None = None, phase: str | None = None, tag: str | None = None) -> Ledger:
        for name, value, allowed in (("op", op, OPS), ("phase", phase, PHASES)):
            if value is not None and value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")
        return Ledger(
            [
                e
                for e in self.entries
                if (op is None or e.op == op)
                and (phase is None or e.phase == phase)
                and (tag is None or e.tag == tag)
            ]
        )

    def count(self, op: str | None = None, phase: str | None = None, tag: str | None = None) -> int:
        return len(self.select(op, phase, tag))

    def payload_bytes(self, op: str | None = None, phase: str | None = None, tag: str | None = None) -> int:
        return sum(e.payload_bytes for e in self.select(op, phase, tag))

    def wire_bytes(self, op: str | None = None, phase: str | None = None, tag: str | None = None) -> float:
        return sum(e.wire_bytes for e in self.select(op, phase, tag))

    def to_records(self) -> list[dict]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_records(cls, records: list[dict]) -> Ledger:
        return cls([LedgerEntry(**{**r, "shape": tuple(r["shape"])}) for r in records])

    # pandas is imported in the two methods below, not at the top: every gloo rank process imports this module,
    # and pandas costs 0.65 s of import there (measured) for tables only a notebook asks for.
    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        cols = list(LedgerEntry.__dataclass_fields__)
        return pd.DataFrame(self.to_records(), columns=cols)

    def summary(self) -> pd.DataFrame:
        """op, phase, count, payload_bytes, wire_bytes."""
        import pandas as pd

        rows: dict[tuple[str, str], list] = {}
        for e in self.entries:
            row = rows.setdefault((e.op, e.phase), [0, 0, 0.0])
            row[0] += 1
            row[1] += e.payload_bytes
            row[2] += e.wire_bytes
        return pd.DataFrame(
            [(op, ph, c, p, w) for (op, ph), (c, p, w) in rows.items()],
            columns=["op", "phase", "count", "payload_bytes", "wire_bytes"],
        )

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(self.entries)

    def __getitem__(self, i: int) -> LedgerEntry:
        return self.entries[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ledger) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"Ledger({len(self)} collectives, {self.payload_bytes()} payload bytes)"


def ledger_problem(ledgers: Sequence[Ledger]) -> str | None:
    """Why the per-rank ledgers of one run cannot all be right, or None.

    Collective rows (every op but send / recv) must be equal on every rank up to `seq`; point-to-point rows
    must pair up per (src, dst) in order: the k-th send src -> dst has the same shape and dtype as the k-th recv
    on dst from src, and no send or recv is left without its partner.

    >>> a = LedgerEntry(0, "send", 2, "float32", (2,), 8, 8.0, "forward", peer=1)
    >>> b = LedgerEntry(0, "recv", 2, "float32", (2,), 8, 0.0, "forward", peer=0)
    >>> ledger_problem([Ledger([a]), Ledger([b])]) is None
    True
    >>> ledger_problem([Ledger([a]), Ledger([])])
    'rank 0 sent 1 tensor(s) to rank 1 but rank 1 received 0 from rank 0'
    """
    def collectives(led: Ledger) -> list[LedgerEntry]:
        return [replace(e, seq=0) for e in led if e.op not in P2P_OPS]

    first = collectives(ledgers[0])
    for r, led in enumerate(ledgers[1:], start=1):
        if collectives(led) != first:
            return f"rank {r}'s collective rows differ from rank 0's"
    for src, led in enumerate(ledgers):
        for dst in range(len(ledgers)):
            sends = [e for e in led if e.op == "send" and e.peer == dst]
            recvs = [e for e in ledgers[dst] if e.op == "recv" and e.peer == src] if dst != src else []
            if len(sends) != len(recvs):
                return (f"rank {src} sent {len(sends)} tensor(s) to rank {dst} but rank {dst} received "
                        f"{len(recvs)} from rank {src}")
            for k, (s, v) in enumerate(zip(sends, recvs, strict=True)):
                if (s.shape, s.dtype) != (v.shape, v.dtype):
                    return (f"send #{k} rank {src} -> {dst} carried {s.dtype} {s.shape} but the matching recv "
                            f"expected {v.dtype} {v.shape}")
    return None
