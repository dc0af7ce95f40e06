"""The pipeline as ONE SPMD program: stage weights stacked and sharded over a `stage` mesh axis, every stage's
activation in one [p, ...] buffer shifted one stage per loop iteration (the GSPMD paper's pipeline, section
3.3; MaxText's `pipeline.py` writes it the same way, with a "circular" variant for v repeats).

Design note
-----------
p stages, m microbatches of [rows, h], v repeats (circular pipeline; v = 1 is GPipe's fill-drain).  The model is
p v layers `y = tanh(x @ W_k)`; layer k = r p + s lives on stage s as repeat r (the interleaved placement: stage
k on device k % p), so the weights are held as W [v, p, h, h], sharded ('stage' on dim 1).  Stacking needs
identical stages: an SPMD pipeline pipelines the repeated layers only (MaxText keeps the embedding and the head
outside it).  p, m and v are read from the shapes of x [m, rows, h] and W [v, p, h, h].

State: `state` [p, rows, h] sharded on dim 0 — slot s is what stage s works on.  Iteration t (T = v m + p - 1
iterations; GPipe: m + p - 1):

    rotated = shift(state)                         slot s+1 <- slot s; slot 0 <- slot p-1 (circular) or zeros
    entering stage 0:  x[t]  for t < m             a fresh microbatch
                       the item that left the last stage m iterations ago (v > 1): it waits in a FIFO of
                       m - p slots held by stage 0 (needs m >= p, as MaxText's circular pipeline)
    state = tanh(state @ W_sel)                    every stage at once: stage s uses W[r, s], r = (t - s) // m
    ys[t] = state                                  the last stage's slot is an output from t = (v-1) m + p - 1 on

The stage computation is local (dim 0 of state and dim 1 of W carry the same sharding).  The only
communication is the shift, and **how it is written decides the collective** (torch_xla 2.9.0, XLA:CPU, 8
virtual devices, state [8, 8, 64] sharded on dim 0, measured):

    shift="cat"        torch.cat([state[-1:], state[:-1]])      ONE collective-permute, one shard, p pairs
    shift="pad"        F.pad(state[:-1], front of dim 0)        ONE collective-permute, one shard, p - 1 pairs
    shift="roll"       torch.roll(state, 1, 0)                  two all-to-alls + an all-gather
    shift="cat_zeros"  torch.cat([zeros[1], state[:-1]])        all-to-alls (the same values as pad!)

GPipe (v = 1) needs no hand-back from the last stage (slot 0 is overwritten by the next microbatch), so
"pad" is its natural shift; the circular pipeline needs "cat".

The loop is `torch_xla.experimental.scan` (one While loop in the HLO: trip count T, one permute in the body)
or a Python loop (`loop="python"`: T permutes unrolled into the entry).  The bubble shows up as the trip
count: T iterations do v m stage-steps of useful work each, (p - 1) / T of the step is fill and drain, and the
shift moves a shard per device in every iteration — bubble iterations included.  Autograd differentiates the
whole forward loop before any backward runs: the ordering is GPipe's (every microbatch's activations held until
the backward loop; autograd saves all T iterations, bubble included — the circular pipeline too, v m + p - 1 of
them: the interleaved schedule's bubble with GPipe's memory).  A 1F1B order needs the backward written into the
loop body instead of left to autograd: `shardlab.pipeline.spmd_1f1b` (m + 2 (p - 1) ticks, 2 p - 1 slots held).

What the bubble iterations move: `idle_transfers` follows every slot through the loop (a for-loop, no formula):
the forward shift at iteration t carries stage s's output of iteration t - 1, microbatch t - 1 - s, so only
iteration 0 shifts no microbatch at all, and (p - 1)^2 of the (p - 1) T pair-transfers carry none.

Parity: `dense_forward` runs the p v layers one after another per microbatch on CPU; `stage_modules` gives the
same layers to the per-stage programs (`shardlab.pipeline.programs`).

Example::

    runtime.setup(num_devices=4)
    x, w = init(p=4, m=4, v=1, rows=8, hidden=64)
    mesh = runtime.mesh((4, 1), ("stage", "data"))
    out = circular_pipeline(x.to(dev), w.to(dev), mesh, shift="pad")     # [m, rows, h] == dense_forward(x, w)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch_xla.experimental.scan import scan

from shardlab.profile.hlo import HloModule

SHIFTS = ("cat", "pad", "roll", "cat_zeros")
LOOPS = ("scan", "python")

__all__ = ["LOOPS", "SHIFTS", "TanhLayer", "check_spmd", "circular_pipeline", "dense_forward", "idle_transfers",
           "init", "iterations", "microbatch_loss", "pipeline_loss", "pipeline_step", "read_program", "schedule_inputs",
           "shift", "stage_modules"]


def iterations(p: int, m: int, v: int = 1) -> int:
    """T = v m + p - 1: the loop's trip count."""
    return v * m + p - 1


def idle_transfers(p: int, m: int) -> dict[str, int]:
    """The GPipe forward loop's shifts, followed slot by slot (the "pad" shift: pair s -> s + 1 for s < p - 1 at
    every iteration): {"transfers": pair-transfers, "idle": of them carrying no microbatch, "idle_iterations":
    iterations whose shift carries no microbatch at all}.  Autograd's reversed loop mirrors each transfer.

    >>> idle_transfers(8, 24)
    {'transfers': 217, 'idle': 49, 'idle_iterations': 1}
    """
    slots: list[int | None] = [None] * p  # what each stage computed in the previous iteration
    transfers = idle = idle_iterations = 0
    for t in range(iterations(p, m)):
        carried = slots[:-1]  # the shift: stage s's output goes to stage s + 1
        transfers += len(carried)
        idle += sum(c is None for c in carried)
        idle_iterations += all(c is None for c in carried)
        slots = [t if t < m else None, *carried]  # stage 0 takes microbatch t, stage s + 1 what s sent
    return {"transfers": transfers, "idle": idle, "idle_iterations": idle_iterations}


def check_spmd(p: int, m: int, v: int = 1, how: str = "cat", loop: str = "scan") -> None:
    """Raise ValueError naming the rule when (p, m, v, shift, loop) is no circular pipeline this module builds."""
    for name, value in (("p", p), ("m", m), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    if how not in SHIFTS:
        raise ValueError(f"shift={how!r} is not one of {SHIFTS}")
    if loop not in LOOPS:
        raise ValueError(f"loop={loop!r} is not one of {LOOPS}")
    if v > 1 and how in ("pad", "cat_zeros"):
        raise ValueError(f"shift={how!r} drops the last stage's slot; a circular pipeline (v={v}) needs shift "
                         "'cat' or 'roll'")
    if v > 1 and m < p:
        raise ValueError(f"m={m} must be >= p={p} for a circular pipeline (v={v}): an item leaving the last stage "
                         "re-enters stage 0 m iterations after it first entered")


def init(p: int, m: int, v: int, rows: int, hidden: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU inputs: x [m, rows, h] and W [v, p, h, h] (scaled so tanh stays in its linear-ish range)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, rows, hidden, generator=g)
    w = torch.randn(v, p, hidden, hidden, generator=g) / hidden**0.5
    return x, w


def dense_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The oracle: each microbatch through layers k = 0 .. p v - 1 in order, layer k = W[k // p, k % p]."""
    v, p = w.shape[0], w.shape[1]
    out = x
    for k in range(p * v):
        out = torch.tanh(out @ w[k // p, k % p])  # [m, rows, h] @ [h, h]
    return out


def schedule_inputs(p: int, m: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per iteration t: `fresh` [T] (1.0 while a new microbatch enters, t < m) and `select` [T, v, p] (one-hot:
    stage s uses repeat r = clamp((t - s) // m, 0, v - 1))."""
    T = iterations(p, m, v)
    fresh = (torch.arange(T) < m).float()
    select = torch.zeros(T, v, p)
    for t in range(T):
        for s in range(p):
            select[t, min(max((t - s) // m, 0), v - 1), s] = 1.0
    return fresh, select


def shift(state: torch.Tensor, how: str) -> torch.Tensor:
    """slot s+1 <- slot s for s < p - 1; slot 0 <- slot p-1 (cat, roll) or zeros (pad, cat_zeros).
    state [p, rows, h]; the caller overwrites slot 0 whenever it is not the circular hand-back."""
    if how == "cat":
        return torch.cat([state[-1:], state[:-1]], 0)  # [1, rows, h] + [p-1, rows, h] -> [p, rows, h]
    if how == "pad":
        return F.pad(state[:-1], (0, 0, 0, 0, 1, 0))  # zeros in front of [p-1, rows, h] -> [p, rows, h]
    if how == "cat_zeros":
        return torch.cat([state.new_zeros(1, *state.shape[1:]), state[:-1]], 0)
    if how == "roll":
        return torch.roll(state, 1, 0)
    raise ValueError(f"shift={how!r} is not one of {SHIFTS}")


def annotator(mesh: xs.Mesh | None) -> Callable[[torch.Tensor, tuple], torch.Tensor]:
    """``annotate(t, spec)``: ``mark_sharding`` on ``mesh`` and return ``t`` — or just return ``t`` when there is no
    mesh (the same loop then runs unannotated, for the dense check)."""
    def annotate(t: torch.Tensor, spec: tuple) -> torch.Tensor:
        if mesh is not None:
            xs.mark_sharding(t, mesh, spec)
        return t

    return annotate


def circular_pipeline(x: torch.Tensor, w: torch.Tensor, mesh: xs.Mesh | None = None, *, how: str = "cat",
                      loop: str = "scan", data_axis: str | None = None, fsdp: bool = False) -> torch.Tensor:
    """The pipeline's outputs [m, rows, h] (differentiable in x and w).  With `mesh` the state and the weights
    are annotated: "stage" splits the stages; `data_axis` (a second mesh axis) splits every microbatch's rows —
    data parallelism, one pipeline per data shard — and, with `fsdp`, W's input dim as well (ZeRO-3 / FSDP:
    each stage gathers its layer's shards when it runs it).  Without `mesh` the same math runs unannotated."""
    m, v, p = x.shape[0], w.shape[0], w.shape[1]
    check_spmd(p, m, v, how, loop)
    T, depth = iterations(p, m, v), max(m - p, 0)  # FIFO slots between the last stage and stage 0
    dev = x.device

    annotate = annotator(mesh)

    row = data_axis
    annotate(w, (None, "stage", row if fsdp else None, None))  # W [v, p, h, h]
    fresh, select = (t.to(dev) for t in schedule_inputs(p, m, v))
    # [T, p, rows, h]: x[t] in stage 0's slot at t < m, zeros elsewhere — sharded like the state, so entering is
    # local (a stream every stage reads would need an all-reduce of its gradient over the stages per iteration)
    stream = annotate(F.pad(x[:, None], (0, 0, 0, 0, 0, p - 1, 0, T - m)), (None, "stage", row, None))
    annotate(select, (None, None, None))  # replicated: left unannotated, the partitioner reshards per iteration
    state = annotate(x.new_zeros(p, x.shape[1], x.shape[2]), ("stage", row, None))  # [p, rows, h]
    fifo = annotate(x.new_zeros(p, max(depth, 1), x.shape[1], x.shape[2]), ("stage", None, row, None))

    def step(carry, inputs):
        state, fifo, w = carry
        x_t, fresh_t, sel_t = inputs  # [p, rows, h] (slot 0: the microbatch entering), [], [v, p]
        rotated = shift(state, how)  # the one collective of the iteration (written as cat or pad)
        if v > 1 and depth > 0:  # what left the last stage m - p iterations ago re-enters stage 0 now
            back = fifo[:, 0]  # [p, rows, h] (slot 0 meaningful: stage 0's FIFO)
            fifo = torch.cat([fifo[:, 1:], rotated[:, None]], 1)  # push; local to each stage
        else:
            back = rotated
        enter = fresh_t * x_t + (1 - fresh_t) * back  # [p, rows, h]; only slot 0 is used
        slot0 = (torch.arange(p, device=rotated.device) == 0).to(rotated.dtype).view(p, 1, 1)  # made inside:
        state = slot0 * enter + (1 - slot0) * rotated  # scan's body may not capture outer tensors
        # stage s's layer this iteration: W[0] for GPipe, else the repeat `select` picks
        w_sel = w[0] if v == 1 else torch.einsum("vp,vphk->phk", sel_t, w)  # [p, h, h]
        state = torch.tanh(torch.einsum("pbh,phk->pbk", state, w_sel))  # every stage at once, locally
        return (state, fifo, w), state

    carry = (state, fifo, w)
    if loop == "scan":
        _, ys = scan(step, carry, (stream, fresh, select))  # ys [T, p, rows, h]
    else:
        outs = []
        for t in range(T):
            carry, y = step(carry, (stream[t], fresh[t], select[t]))
            outs.append(y)
        ys = torch.stack(outs)
    first = (v - 1) * m + p - 1  # microbatch i leaves the last stage (last repeat) at first + i
    return ys[first : first + m, p - 1]  # [m, rows, h]


def pipeline_loss(out: torch.Tensor) -> torch.Tensor:
    return (out * out).mean()


def microbatch_loss(y: torch.Tensor, _unused: torch.Tensor) -> torch.Tensor:
    """`pipeline_loss` of one microbatch (the per-stage programs divide by m): a mean over equal microbatches."""
    return pipeline_loss(y)


def pipeline_step(x: torch.Tensor, w: torch.Tensor, mesh: xs.Mesh | None = None, *, how: str = "cat",
                  loop: str = "scan", data_axis: str | None = None, fsdp: bool = False,
                  backward: bool = True) -> list[torch.Tensor]:
    """One step on device tensors x [m, rows, h], W [v, p, h, h]: [outputs] or, with `backward`, [outputs, loss,
    grad x, grad W].  Not synced (for `shardlab.core.harness` to capture or compile)."""
    if not backward:
        return [circular_pipeline(x, w, mesh, how=how, loop=loop, data_axis=data_axis, fsdp=fsdp)]
    x.requires_grad_(True)
    w.requires_grad_(True)
    out = circular_pipeline(x, w, mesh, how=how, loop=loop, data_axis=data_axis, fsdp=fsdp)
    loss = pipeline_loss(out)
    gx, gw = torch.autograd.grad(loss, (x, w))
    return [out, loss, gx, gw]


class TanhLayer(torch.nn.Module):
    """One layer of the SPMD pipeline's model, y = tanh(x W), as a module for the per-stage programs."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(w.clone())  # [h, h]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.weight)  # [rows, h] @ [h, h]


def stage_modules(w: torch.Tensor, rows: int) -> tuple[list[TanhLayer], list[dict[str, str]], list[tuple]]:
    """The same model for `shardlab.pipeline.programs.pipeline_program`: stage k = layer k (W[k // p, k % p]),
    the gradient names "w.<r>.<s>" (index into W), and the [rows, h] tensor each cut hands over."""
    v, p, h = w.shape[0], w.shape[1], w.shape[2]
    n = p * v
    layers = [TanhLayer(w[k // p, k % p]) for k in range(n)]
    names = [{"weight": f"w.{k // p}.{k % p}"} for k in range(n)]
    boundary = [((rows, h), torch.float32)] * (n - 1)
    return layers, names, boundary


def read_program(module: HloModule) -> dict[str, Any]:
    """What a compiled pipeline program does per step, from its HLO (XLA:CPU or XLA:TPU, `profile.hlo`):

    ``trip_counts`` (every While loop, sorted), and per collective op: ``<op>.count`` (instructions),
    ``<op>.in_loop`` (of them inside a loop body), ``<op>.step_count`` / ``<op>.step_bytes`` (executions and
    per-device operand bytes per step: each collective times the runs of the computation that schedules it),
    ``<op>.async`` (issued as start / done); for the collective-permutes also ``collective_permute.pairs``
    (source-target pairs of each in-loop permute), ``collective_permute.bytes_per_iteration`` and
    ``collective_permute.windows``: per asynchronous in-loop permute, (instructions the schedule puts between its
    start and its done, how many of them do matmul work) — what XLA:TPU overlaps with the shift.
    """
    out: dict[str, Any] = {"trip_counts": sorted(t for w in module.while_loops
                                                 if (t := module.trip_count(w.name)) is not None)}
    for c in module.collectives:
        key = c.op.replace("-", "_")
        runs = module.runs(c.computation) or 0
        for name, value in (("count", 1), ("in_loop", int(c.in_while)), ("step_count", runs),
                            ("step_bytes", runs * c.operand_bytes), ("async", int(c.async_))):
            out[f"{key}.{name}"] = out.get(f"{key}.{name}", 0) + value
        if c.op == "collective-permute" and c.in_while:
            out.setdefault("collective_permute.pairs", []).append(len(c.source_target_pairs))
            out.setdefault("collective_permute.bytes_per_iteration", []).append(c.operand_bytes)
    windows = [w for w in module.async_windows() if w.collective.op == "collective-permute" and w.collective.in_while]
    out["collective_permute.windows"] = [(len(w.between), len(w.compute)) for w in windows]
    return out
