"""PyTorch's own pipelining (torch.distributed.pipelining, torch 2.9.0) as the reference for our schedules.

Design note
-----------
What each PyTorch schedule *executes*, read without any communication:

* Multi-stage schedules (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble) build
  `pipeline_order` — every rank's action list, `None` for an idle step — in their constructor, and their
  runtime walks that list.  We construct them in this process on a *fake* process group
  (`torch.testing._internal.distributed.fake_pg.FakeStore`, backend "fake", rank 0 of p), with real
  `PipelineStage` objects holding rank 0's stages, and read the list.
* Single-stage schedules (ScheduleGPipe, Schedule1F1B) compute their order while they run
  (`_step_microbatches`).  We run PyTorch's own `_step_microbatches` on a recording stage (a stand-in whose
  forward / backward append to a list and whose send / recv op lists are empty), so the order is the one
  PyTorch's code executes, stage by stage.  Their `_get_pipeline_order()` (the table `_format_pipeline_order`
  prints) is a drawing, not what runs: for Schedule1F1B in torch 2.9.0 it is wrong on the last rank (it starts
  at F1 and ends at F{m}); `torch_drawn_order` returns it so a test can show the difference.

A real step on gloo (`torch_pipeline_program`, run by `shardlab.comm.DistributedWorld`, one process per
stage): every schedule aborts in torch 2.9.0 before its first microbatch with "[enforce fail at
gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match
expected size".  The cause is the stage's communicator warm-up, `_PipelineStageBase._get_init_p2p_neighbors_ops`:
it sends `torch.tensor(stage_index)` (int64, 8 bytes) to each neighbour and receives into `torch.zeros(1)`
(float32, 4 bytes); NCCL does not check the size, gloo does.  The warm-up only exists to create NCCL
communicators, so the program replaces it on each stage by an empty list of ops; then GPipe, 1F1B and
interleaved 1F1B all run on gloo, with shapes given up front (`input_args` / `output_args`) or inferred at run
time.  The program records PyTorch's own point-to-point ops (every `dist.batch_isend_irecv` the schedule
issues, unpacked) as ledger rows, so they can be compared with our ledger.

Orders come back as lists of `Action`s (our type; PyTorch's "1F0" is `Action("F", 1, 0)`).  PyTorch requires
m >= p for single-stage schedules ("Number of microbatches must be greater than or equal to the number of
stages"); the interleaved schedules need m a multiple of their number of rounds, max(1, m // p).

Example::

    orders = torch_orders("1f1b", p=4, m=8)         # [[Action('F', 0, 0), ...], ... one list per rank]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlab.comm import Comm, Ledger, LedgerEntry, current_phase, ring_wire_bytes
from shardlab.comm.ledger import dtype_name
from shardlab.pipeline.model import lm_loss
from shardlab.pipeline.schedules import Action, Schedule

TORCH_SCHEDULES = {  # our name -> torch.distributed.pipelining class name (get_schedule_class)
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "interleaved_zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
}
_KIND = {"F": "F", "B": "B", "I": "I", "W": "W"}

__all__ = [
    "TORCH_SCHEDULES", "as_schedule", "fake_world", "logged_p2p", "torch_drawn_order", "torch_orders",
    "torch_pipeline_program", "torch_schedule",
]


@contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """The default process group as rank 0 of `world_size` on PyTorch's fake backend (no communication)."""
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process; the fake world needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _action(a: Any) -> Action:
    kind = str(a.computation_type)
    if kind not in _KIND:
        raise ValueError(f"unexpected PyTorch action {a!r}")
    return Action(kind, int(a.stage_index), int(a.microbatch_index))


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return out.sum()


class _RecordingStage:
    """Stand-in for `_PipelineStageBase` with no communication: PyTorch's single-stage `_step_microbatches`
    calls these methods, in its own order."""

    def __init__(self, stage_index: int, num_stages: int) -> None:
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_first = stage_index == 0
        self.is_last = False  # no loss is computed: backward_one_chunk receives loss=None
        self.log: list[Action] = []

    def get_fwd_recv_ops(self, i: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, i: int, args: Any = None, kwargs: Any = None, *rest: Any) -> None:
        self.log.append(Action("F", self.stage_index, i))

    def backward_one_chunk(self, i: int, loss: Any = None, full_backward: bool = True, **kw: Any) -> None:
        self.log.append(Action("B", self.stage_index, i))

    def scale_grads(self, grad_scale_factor: int) -> None:
        pass


def _single_stage_class(name: str) -> Any:
    return get_schedule_class(TORCH_SCHEDULES[name])


def torch_orders(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Every rank's executed action list under PyTorch's schedule `name` (see TORCH_SCHEDULES)."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"name={name!r} is not one of {sorted(TORCH_SCHEDULES)}")
    if name in ("gpipe", "1f1b"):
        if v != 1:
            raise ValueError(f"v={v}: {name} has one stage per rank")
        cls = _single_stage_class(name)
        orders = []
        for s in range(p):
            stage = _RecordingStage(s, p)
            sched = cls(stage, m, loss_fn=_loss)  # type: ignore[arg-type]
            sched._stage_initialized = True  # nothing to exchange: no shapes, no process group
            sched._step_microbatches([()] * m, [{}] * m)
            orders.append(stage.log)
        return orders
    sched = torch_schedule(name, p, m, v)
    return [[_action(a) for a in sched.pipeline_order[r] if a is not None] for r in range(p)]


def torch_schedule(name: str, p: int, m: int, v: int = 1) -> Any:
    """PyTorch's multi-stage schedule object (pipeline_order computed), built on a fake process group of p
    ranks with rank 0's `PipelineStage`s (a Linear each; nothing runs).  ZBV has exactly 2 stages per rank."""
    if name == "zbv" and v != 2:
        raise ValueError(f"v={v}: ZBVZeroBubble has exactly 2 stages per rank")
    cls = get_schedule_class(TORCH_SCHEDULES[name])
    with fake_world(p):
        n = p * v
        local = [0, n - 1] if name == "zbv" else list(range(0, n, p))  # rank 0's stages (V shape for ZBV)
        stages = [PipelineStage(nn.Linear(2, 2), k, n, torch.device("cpu")) for k in local]
        return cls(stages, m, loss_fn=_loss)


def torch_drawn_order(name: str, p: int, m: int) -> list[list[Action | None]]:
    """A single-stage schedule's `_get_pipeline_order()` (its drawing, with None for idle steps)."""
    cls = _single_stage_class(name)
    sched = cls(_RecordingStage(0, p), m, loss_fn=_loss)  # type: ignore[arg-type]
    order = sched.pipeline_order
    return [[None if a is None else _action(a) for a in order[r]] for r in range(p)]


def as_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """PyTorch's order as our `Schedule` (ZBV: its V-shaped placement), ready for `timeline.simulate`."""
    orders = torch_orders(name, p, m, v)
    placement: tuple[int, ...] = ()
    if name == "zbv":
        placement = tuple(list(range(p)) + list(range(p - 1, -1, -1)))  # stage k < p on k, then back down
    return Schedule(f"torch.{name}", p, m, v, tuple(tuple(o) for o in orders), placement)


@contextmanager
def logged_p2p(ledger: Ledger, world_size: int) -> Iterator[None]:
    """Record every op of every `dist.batch_isend_irecv` call in the block as a send / recv ledger row."""
    original = dist.batch_isend_irecv

    def logged(p2p_op_list: list[Any]) -> Any:
        for op in p2p_op_list:
            kind = "send" if op.op in (dist.isend, dist.send) else "recv"
            t = op.tensor
            payload = t.numel() * t.element_size()
            ledger.append(LedgerEntry(len(ledger), kind, world_size, dtype_name(t.dtype), tuple(t.shape), payload,
                                      ring_wire_bytes(kind, payload, world_size), current_phase(),
                                      peer=int(op.group_peer if op.group_peer is not None else op.peer)))
        return original(p2p_op_list)

    dist.batch_isend_irecv = logged
    try:
        yield
    finally:
        dist.batch_isend_irecv = original


def torch_pipeline_program(
    comm: Comm,
    name: str,
    m: int,
    stages: list[nn.Module],
    param_names: list[dict[str, str]],
    tokens: torch.Tensor,
    targets: torch.Tensor,
    shapes_up_front: bool = True,
) -> dict[str, Any]:
    """One rank's training step with PyTorch's own `PipelineStage` + schedule `name` ("gpipe" | "1f1b" |
    "interleaved") on the process group `comm`'s world already joined (gloo).  Stage k runs on rank k % p.

    Returns {"loss": the mean of the microbatch losses (on the last stage's rank, else None), "grads":
    {unsplit name: gradient} (PyTorch divides by m: `scale_grads`), "p2p": ledger records of its sends /
    recvs}.
    """
    if name not in ("gpipe", "1f1b", "interleaved"):
        raise ValueError(f"name={name!r} is not one of ('gpipe', '1f1b', 'interleaved')")
    p, n, rank = comm.world_size, len(stages), comm.rank
    mine = [k for k in range(n) if k % p == rank]
    mb_tokens = tokens.chunk(m)[0]
    with torch.no_grad():  # every stage's input and output for one microbatch: the shapes PipelineStage expects
        io = [mb_tokens]
        for st in stages:
            io.append(st(io[-1]))
    built = []
    for k in mine:
        kw: dict[str, Any] = {}
        if shapes_up_front:
            kw = {"input_args": io[k].to("meta"), "output_args": io[k + 1].to("meta")}
        stage = PipelineStage(stages[k], k, n, torch.device("cpu"), **kw)
        stage._get_init_p2p_neighbors_ops = lambda: []  # the int64-vs-float32 warm-up gloo refuses (module note)
        built.append(stage)
    cls = get_schedule_class(TORCH_SCHEDULES[name])
    sched = cls(built if name == "interleaved" else built[0], m, loss_fn=lm_loss)
    ledger = Ledger()
    losses: list[torch.Tensor] = []
    has_first, has_last = 0 in mine, n - 1 in mine
    with logged_p2p(ledger, p):
        args = (tokens,) if has_first else ()
        sched.step(*args, target=targets if has_last else None, losses=losses if has_last else None)
    grads = {}
    for k in mine:
        for pname, prm in stages[k].named_parameters():
            grads[param_names[k][pname]] = None if prm.grad is None else prm.grad.detach().clone()
    loss = torch.stack(losses).mean() if has_last else None
    return {"loss": loss, "grads": grads, "p2p": ledger.to_records()}
