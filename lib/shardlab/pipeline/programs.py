"""Per-device pipeline programs over `shardlab.comm`: run a schedule's action list with send / recv.

Design note
-----------
`pipeline_program(comm, schedule, stages, ...)` is one device's step (device = `comm.rank`).  It walks
`schedule.devices[rank]` in order:

    F(s, i)   x = microbatch i of the tokens (s = 0) or recv(activation, from the device of s - 1)
              y = stages[s](x); the last stage computes loss_i = loss(y, targets_i) / m
              send(y, to the device of s + 1)                                       (tag "act", forward)
    B(s, i)   g = recv(gradient of y, from the device of s + 1)  — or nothing on the last stage, which starts
              from loss_i;  torch.autograd.backward(y, g)  accumulates the parameter gradients of stage s
              send(x.grad, to the device of s - 1)                                   (tag "grad", backward)

Sends are buffered here (`comm.send` returns at once: the simulated world copies the tensor into the peer's
mailbox, gloo's `isend` is waited for at the end), receives block.  That is not enough for every valid order:
an order can pass `Schedule.validate()` and still deadlock (device 0 waits in B(0, 0) for a gradient device 1
computes only after a forward device 0 has queued behind that B — `timeline.simulate` names such a cycle), and
on NCCL a large send is not buffered at all: it completes only when the peer posts the matching receive.  So a
1F1B steady state that sends an activation forward and then waits for a gradient from the same neighbour would
block both sides; PyTorch's schedules post the send and the receive together (`batch_isend_irecv`: a forward
send batched with a backward receive), Megatron-LM's `send_forward_recv_backward` does the same.
When two consecutive stages sit on the same device (p = 1) the tensor is handed over in
memory and nothing is sent.  The backward p2p rows are labelled with `phase_scope("backward")`: the autograd
engine has returned by the time the gradient is sent.

What the ledger then holds, per step: m (p v - 1) activation sends and as many gradient sends, each
[b/m, s, h] — `shardlab.formulas.pipeline.p2p_traffic`.  Gradients are summed over microbatches (loss_i / m
each), so the step's loss and gradients equal the unsplit model's on the whole batch, up to fp32 rounding: the
unsplit backward reduces over all b rows inside one matmul, the pipeline adds m partial sums one after another.

The receiving device knows the shape it expects (PyTorch's PipelineStage infers it at run time by exchanging
metadata; Megatron passes it in): the tensor a cut hands over, with the batch dimension (dim 0) set to the
microbatch size.

Example::

    world = SimulatedWorld(p)
    results = world.run(pipeline_program, schedule, stages.modules, stages.param_names, stages.boundary,
                        tokens, targets)
    world.ledgers[0].count("send")
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from shardlab.comm import Comm, phase_scope
from shardlab.pipeline.model import lm_loss
from shardlab.pipeline.schedules import Schedule

__all__ = ["dense_step", "merge_results", "pipeline_program"]


def _microbatches(t: torch.Tensor, m: int) -> list[torch.Tensor]:
    if t.shape[0] % m:
        raise ValueError(f"batch {t.shape[0]} is not divisible by m={m} microbatches")
    return list(t.chunk(m))


def pipeline_program(
    comm: Comm,
    schedule: Schedule,
    stages: Sequence[nn.Module],
    param_names: Sequence[dict[str, str]],
    boundary: Sequence[tuple[tuple[int, ...], torch.dtype]],
    tokens: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss,
) -> dict[str, Any]:
    """One device's training step under `schedule` -> {"loss": sum of loss_i (last stage's device, else None),
    "grads": {unsplit parameter name: gradient} of this device's stages, "order": the actions in the order they
    ran, "peak_held": the most (stage, microbatch) activations this device held at once (forward done, backward
    not yet), "rows": the length of `comm.ledger` before the first action and after each one (action j's send / recv
    rows are ledger[rows[j]:rows[j + 1]])}."""
    p, m, n = schedule.p, schedule.m, schedule.stages
    if comm.world_size != p:
        raise ValueError(f"the schedule has p={p} devices but the world has {comm.world_size} ranks")
    if len(stages) != n or len(boundary) != n - 1:
        raise ValueError(f"{n} stages need {n} stage modules and {n - 1} boundaries, got {len(stages)} and "
                         f"{len(boundary)}")
    rank = comm.rank
    mine = [s for s in range(n) if schedule.device_of(s) == rank]
    for s in mine:
        for prm in stages[s].parameters():
            prm.grad = None
    inputs, labels = _microbatches(tokens, m), _microbatches(targets, m)
    mb = inputs[0].shape[0]

    def shape(cut: int) -> tuple[int, ...]:  # the tensor cut `cut` (between stage cut and cut + 1) hands over
        return (mb, *boundary[cut][0][1:])

    local: dict[tuple[str, int, int], torch.Tensor] = {}  # same-device hand-over (p = 1)
    saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (stage, i) -> (input, output | loss)
    loss_total: torch.Tensor | None = None
    order, peak_held, rows = [], 0, [len(comm.ledger)]
    for a in schedule.devices[rank]:
        if order:
            rows.append(len(comm.ledger))
        order.append(a)
        s, i = a.stage, a.microbatch
        if a.kind == "F":
            if s == 0:
                x = inputs[i]
            else:
                src = schedule.device_of(s - 1)
                if src == rank:
                    x = local.pop(("act", s - 1, i))
                else:
                    x = comm.recv(shape(s - 1), boundary[s - 1][1], src, tag="act")
                x = x.detach().requires_grad_(x.is_floating_point())
            y = stages[s](x)  # [b/m, s, h] (last stage: [b/m, s, V])
            if s == n - 1:
                y = loss_fn(y, labels[i]) / m
                loss_total = y.detach() if loss_total is None else loss_total + y.detach()
            else:
                dst = schedule.device_of(s + 1)
                if dst == rank:
                    local[("act", s, i)] = y.detach()
                else:
                    comm.send(y, dst, tag="act")
            saved[(s, i)] = (x, y)
            peak_held = max(peak_held, len(saved))
        elif a.kind == "B":
            x, y = saved.pop((s, i))
            with phase_scope("backward"):
                if s == n - 1:
                    torch.autograd.backward(y)
                else:
                    src = schedule.device_of(s + 1)
                    if src == rank:
                        g = local.pop(("grad", s + 1, i))
                    else:
                        g = comm.recv(tuple(y.shape), y.dtype, src, tag="grad")
                    torch.autograd.backward(y, g)
                if s > 0:
                    dst = schedule.device_of(s - 1)
                    if dst == rank:
                        local[("grad", s, i)] = x.grad
                    else:
                        comm.send(x.grad, dst, tag="grad")
        else:
            raise ValueError(f"pipeline_program runs F and B actions, got {a}")
    rows.append(len(comm.ledger))
    grads = {}
    for s in mine:
        for name, prm in stages[s].named_parameters():
            grads[param_names[s][name]] = prm.grad.detach().clone() if prm.grad is not None else None
    return {"loss": loss_total, "grads": grads, "order": order, "peak_held": peak_held, "rows": rows}


def merge_results(results: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the step's loss, every parameter gradient) from the per-device results; each name exactly once."""
    losses = [r["loss"] for r in results if r["loss"] is not None]
    if len(losses) != 1:
        raise ValueError(f"expected the loss on exactly one device, got {len(losses)}")
    grads: dict[str, torch.Tensor] = {}
    for r in results:
        for name, g in r["grads"].items():
            if name in grads:
                raise ValueError(f"parameter {name} has a gradient on two devices")
            grads[name] = g
    return losses[0], grads


def dense_step(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The oracle: the unsplit model's loss on the whole batch and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def run_stages(comm: Comm, *args: Any) -> dict[str, Any]:
    """One device's pipeline step, plus the payload of every send it recorded and, per action, its send / recv
    rows as (op, peer). What a case's ``program()`` hands to each rank: it lives here, not in ``pipeline.case``,
    because a gloo rank unpickles it by module, and that module must not import torch_xla (measured: 2.7 s of CPU
    per rank when it did)."""
    out = pipeline_program(comm, *args)
    out["sends"] = [e.payload_bytes for e in comm.ledger.select("send")]
    rows = list(comm.ledger)
    out["p2p"] = [[(e.op, e.peer) for e in rows[a:b] if e.op in ("send", "recv")]
                  for a, b in itertools.pairwise(out["rows"])]
    return out
