"""The ledger: one row per collective a rank issued.

Design note
-----------
Every `Comm` keeps a `Ledger`.  A collective appends one `LedgerEntry` describing what *this* rank handed to
the collective: the op, the group size, the dtype, the per-rank input shape, the payload bytes (the suite's
one convention: all-reduce -> its input, all-gather -> its shard, reduce-scatter -> its full input,
broadcast -> the tensor) and the wire bytes per rank of the ring model:

    all_reduce      2 (W - 1) / W * payload
    all_gather      (W - 1) * payload
    reduce_scatter  (W - 1) / W * payload
    broadcast       payload          (each non-source rank receives the tensor once; pipelined chain)

The phase ("forward" / "backward") is detected from the autograd engine: a collective issued while a backward
pass is running (inside an `autograd.Function.backward`) is a backward collective.

Worlds (SimulatedWorld, DistributedWorld) expose rank 0's ledger as `world.ledger` and check that every rank's
ledger is identical (all ranks take part in every collective, so they must be).

Example::

    led = Ledger()
    led.append(LedgerEntry(0, "all_reduce", 4, "float32", (2, 3), 24, 36.0, "forward"))
    led.count("all_reduce"), led.payload_bytes("all_reduce")   # (1, 24)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from shardlab.formulas.common import wire_bytes

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PHASES = ("forward", "backward")


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
    """ "backward" while the autograd engine runs a backward pass in this thread, else "forward"."""
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class LedgerEntry:
    seq: int  # 0-based position of the collective in this rank's program order
    op: str  # all_reduce | all_gather | reduce_scatter | broadcast
    group_size: int
    dtype: str  # "float32"
    shape: tuple[int, ...]  # per-rank INPUT shape (the tensor this rank hands to the collective)
    payload_bytes: int  # bytes of that input (what this rank hands over)
    wire_bytes: float  # ring model, per rank
    phase: str  # forward | backward
    reduce_op: str | None = None  # "sum" | "max" for all_reduce / reduce_scatter
    dim: int | None = None  # gather / scatter dim (normalised to be non-negative)
    src: int | None = None  # broadcast source rank
    tag: str = ""  # free label set by the caller, e.g. "f", "g", "ce.max"


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

    def to_frame(self):  # -> pandas.DataFrame (pandas imported lazily)
        import pandas as pd

        cols = list(LedgerEntry.__dataclass_fields__)
        return pd.DataFrame(self.to_records(), columns=cols)

    def summary(self):  # -> pandas.DataFrame: op, phase, count, payload_bytes, wire_bytes
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
