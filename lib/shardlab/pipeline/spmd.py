"""The pipeline as ONE SPMD program: stage weights stacked and sharded over a `stage` mesh axis, every stage's
activation in one [p, ...] buffer shifted one stage per loop iteration (the GSPMD paper's pipeline, section
3.3; MaxText's `pipeline.py` writes it the same way, with a "circular" variant for v repeats).

Design note
-----------
p stages, m microbatches of [mb, h], v repeats (circular pipeline; v = 1 is GPipe's fill-drain).  The model is
p v layers `y = tanh(x @ W_k)`; layer k = r p + s lives on stage s as repeat r (the interleaved placement: stage
k on device k % p), so the weights are held as W [v, p, h, h], sharded ('stage' on dim 1).

State: `state` [p, mb, h] sharded on dim 0 — slot s is what stage s works on.  Iteration t (T = v m + p - 1
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
    shift="cat_zeros"  torch.cat([zeros[1], state[:-1]])        three all-to-alls (the same values as pad!)

GPipe (v = 1) needs no hand-back from the last stage (slot 0 is overwritten by the next microbatch), so
"pad" is its natural shift; the circular pipeline needs "cat".

The loop is `torch_xla.experimental.scan` (one While loop in the HLO: trip count T, one permute in the body)
or a Python loop (`loop="python"`: T permutes unrolled into the entry).  The bubble shows up as the trip
count: T iterations do v m stage-steps of useful work each, (p - 1) / T of the step is fill and drain, and the
shift moves a shard per device in every iteration — bubble iterations included.

Parity: `dense_forward` runs the p v layers one after another per microbatch on CPU; the tests compare the
pipeline's outputs and weight gradients with it.

Example::

    runtime.setup(num_devices=4)
    cfg = SpmdPipeline(p=4, m=4)
    x, w = init(cfg)
    out = circular_pipeline(x.to(dev), w.to(dev), cfg, runtime.mesh(4, "stage"))     # [m, mb, h]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SHIFTS = ("cat", "pad", "roll", "cat_zeros")
LOOPS = ("scan", "python")

__all__ = ["LOOPS", "SHIFTS", "SpmdPipeline", "build_graph", "circular_pipeline", "dense_forward", "init",
           "microbatch_loss", "pipeline_loss", "read_program", "schedule_inputs", "stage_modules", "TanhLayer"]


@dataclass(frozen=True)
class SpmdPipeline:
    p: int = 4  # stages (the `stage` mesh axis)
    m: int = 4  # microbatches
    v: int = 1  # repeats per stage (circular pipeline); v > 1 needs m >= p
    micro_batch: int = 8  # rows of one microbatch
    hidden: int = 64  # h
    fsdp: int = 1  # second mesh axis: shards the microbatch rows and W's input dim (1: replicated over it)
    shift: str = "cat"  # cat | pad | roll | cat_zeros: how the shift is written (module note)
    loop: str = "scan"  # scan (one While loop) | python (unrolled)
    backward: bool = True  # build the loss's backward too
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("p", "m", "v", "micro_batch", "hidden", "fsdp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.shift not in SHIFTS:
            raise ValueError(f"shift={self.shift!r} is not one of {SHIFTS}")
        if self.loop not in LOOPS:
            raise ValueError(f"loop={self.loop!r} is not one of {LOOPS}")
        if self.v > 1 and self.shift in ("pad", "cat_zeros"):
            raise ValueError(f"shift={self.shift!r} drops the last stage's slot; a circular pipeline (v={self.v}) "
                             "needs shift 'cat' or 'roll'")
        if self.v > 1 and self.m < self.p:
            raise ValueError(f"m={self.m} must be >= p={self.p} for a circular pipeline (v={self.v}): an item "
                             "leaving the last stage re-enters stage 0 m iterations after it first entered")
        if self.micro_batch % self.fsdp or self.hidden % self.fsdp:
            raise ValueError(f"micro_batch={self.micro_batch} and hidden={self.hidden} must be divisible by "
                             f"fsdp={self.fsdp}")

    @property
    def iterations(self) -> int:
        """T = v m + p - 1: the loop's trip count."""
        return self.v * self.m + self.p - 1

    @property
    def devices(self) -> int:
        return self.p * self.fsdp


def init(cfg: SpmdPipeline) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU inputs: x [m, mb, h] and W [v, p, h, h] (scaled so tanh stays in its linear-ish range)."""
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.m, cfg.micro_batch, cfg.hidden, generator=g)
    w = torch.randn(cfg.v, cfg.p, cfg.hidden, cfg.hidden, generator=g) / cfg.hidden**0.5
    return x, w


def dense_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The oracle: each microbatch through layers k = 0 .. p v - 1 in order, layer k = W[k // p, k % p]."""
    v, p = w.shape[0], w.shape[1]
    out = x
    for k in range(p * v):
        out = torch.tanh(out @ w[k // p, k % p])  # [m, mb, h] @ [h, h]
    return out


def schedule_inputs(cfg: SpmdPipeline) -> tuple[torch.Tensor, torch.Tensor]:
    """Per iteration t: `fresh` [T] (1.0 while a new microbatch enters, t < m) and `select` [T, v, p] (one-hot:
    stage s uses repeat r = clamp((t - s) // m, 0, v - 1))."""
    T, m, v, p = cfg.iterations, cfg.m, cfg.v, cfg.p
    fresh = (torch.arange(T) < m).float()
    select = torch.zeros(T, v, p)
    for t in range(T):
        for s in range(p):
            select[t, min(max((t - s) // m, 0), v - 1), s] = 1.0
    return fresh, select


def _shift(state: torch.Tensor, how: str) -> torch.Tensor:
    """slot s+1 <- slot s for s < p - 1; slot 0 <- slot p-1 (cat, roll) or zeros (pad, cat_zeros).
    state [p, mb, h]; the caller overwrites slot 0 whenever it is not the circular hand-back."""
    if how == "cat":
        return torch.cat([state[-1:], state[:-1]], 0)  # [1, mb, h] + [p-1, mb, h] -> [p, mb, h]
    if how == "pad":
        return F.pad(state[:-1], (0, 0, 0, 0, 1, 0))  # zeros in front of [p-1, mb, h] -> [p, mb, h]
    if how == "cat_zeros":
        return torch.cat([state.new_zeros(1, *state.shape[1:]), state[:-1]], 0)
    return torch.roll(state, 1, 0)


def circular_pipeline(x: torch.Tensor, w: torch.Tensor, cfg: SpmdPipeline, mesh: Any = None) -> torch.Tensor:
    """The pipeline's outputs [m, mb, h] (differentiable in x and w).  With `mesh` (axes ("stage",) or
    ("stage", "fsdp")) the state and the weights are annotated; without it the same math runs unannotated."""
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.scan import scan

    p, m, v = cfg.p, cfg.m, cfg.v
    T, depth = cfg.iterations, max(cfg.m - cfg.p, 0)  # FIFO slots between the last stage and stage 0
    dev = x.device
    two_d = mesh is not None and "fsdp" in mesh.axis_names

    def shard_state(t: torch.Tensor, spec: tuple) -> torch.Tensor:
        if mesh is not None:
            xs.mark_sharding(t, mesh, spec)
        return t

    row = "fsdp" if two_d else None  # the microbatch rows (and W's input dim) on the second axis
    if mesh is not None:
        xs.mark_sharding(w, mesh, (None, "stage", row, None))  # W [v, p, h, h]
    fresh, select = (t.to(dev) for t in schedule_inputs(cfg))
    stream = torch.cat([x, x.new_zeros(T - m, *x.shape[1:])], 0)  # [T, mb, h]: x[t] enters at t < m
    if mesh is not None:  # every stage sees the stream (only stage 0 reads it): left unannotated, the
        xs.mark_sharding(stream, mesh, (None, row, None))  # partitioner shards it on mb and reshards the state
        xs.mark_sharding(select, mesh, (None, None, None))  # to match, with all-to-alls in every iteration
    state = shard_state(x.new_zeros(p, cfg.micro_batch, cfg.hidden), ("stage", row, None))  # [p, mb, h]
    fifo = shard_state(x.new_zeros(p, max(depth, 1), cfg.micro_batch, cfg.hidden), ("stage", None, row, None))

    def step(carry, inputs):
        state, fifo, w = carry
        x_t, fresh_t, sel_t = inputs  # [mb, h], [], [v, p]
        rotated = _shift(state, cfg.shift)  # the one collective of the iteration (written as cat or pad)
        if v > 1 and depth > 0:  # what left the last stage m - p iterations ago re-enters stage 0 now
            back = fifo[:, 0]  # [p, mb, h] (slot 0 meaningful: stage 0's FIFO)
            fifo = torch.cat([fifo[:, 1:], rotated[:, None]], 1)  # push; local to each stage
        else:
            back = rotated
        enter = fresh_t * x_t[None] + (1 - fresh_t) * back  # [p, mb, h]; only slot 0 is used
        slot0 = (torch.arange(p, device=rotated.device) == 0).to(rotated.dtype).view(p, 1, 1)  # made inside:
        state = slot0 * enter + (1 - slot0) * rotated  # scan's body may not capture outer tensors
        w_sel = torch.einsum("vp,vphk->phk", sel_t, w)  # [p, h, h]: stage s's layer this iteration
        state = torch.tanh(torch.einsum("pbh,phk->pbk", state, w_sel))  # every stage at once, locally
        return (state, fifo, w), state

    carry = (state, fifo, w)
    if cfg.loop == "scan":
        _, ys = scan(step, carry, (stream, fresh, select))  # ys [T, p, mb, h]
    else:
        outs = []
        for t in range(T):
            carry, y = step(carry, (stream[t], fresh[t], select[t]))
            outs.append(y)
        ys = torch.stack(outs)
    first = (v - 1) * m + p - 1  # microbatch i leaves the last stage (last repeat) at first + i
    return ys[first : first + m, p - 1]  # [m, mb, h]


def pipeline_loss(out: torch.Tensor) -> torch.Tensor:
    return (out * out).mean()


def microbatch_loss(y: torch.Tensor, _unused: torch.Tensor) -> torch.Tensor:
    """`pipeline_loss` of one microbatch (the per-stage programs divide by m): a mean over equal microbatches."""
    return pipeline_loss(y)


class TanhLayer(torch.nn.Module):
    """One layer of the SPMD pipeline's model, y = tanh(x W), as a module for the per-stage programs."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(w.clone())  # [h, h]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.weight)  # [mb, h] @ [h, h]


def stage_modules(cfg: SpmdPipeline) -> tuple[list[TanhLayer], list[dict[str, str]], list[tuple]]:
    """The same model for `shardlab.pipeline.programs.pipeline_program`: stage k = layer k (W[k // p, k % p]),
    the gradient names "w.<r>.<s>" (index into W), and the [mb, h] tensor each cut hands over."""
    _, w = init(cfg)
    n = cfg.p * cfg.v
    layers = [TanhLayer(w[k // cfg.p, k % cfg.p]) for k in range(n)]
    names = [{"weight": f"w.{k // cfg.p}.{k % cfg.p}"} for k in range(n)]
    boundary = [((cfg.micro_batch, cfg.hidden), torch.float32)] * (n - 1)
    return layers, names, boundary


def build_graph(cfg: SpmdPipeline) -> list[torch.Tensor]:
    """The pipeline on this process's SPMD world (mesh stage x fsdp = p x fsdp devices): its outputs, and with
    `cfg.backward` the loss and the gradients of x and W.  Not synced; for `capture_hlo` / `profile.tpu`."""
    from shardlab import runtime

    axes = ("stage", "fsdp")
    mesh = runtime.mesh((cfg.p, cfg.fsdp), axes)
    dev = runtime.device()
    x, w = init(cfg)
    x, w = x.to(dev), w.to(dev)
    if not cfg.backward:
        return [circular_pipeline(x, w, cfg, mesh)]
    x.requires_grad_(True)
    w.requires_grad_(True)
    out = circular_pipeline(x, w, cfg, mesh)
    loss = pipeline_loss(out)
    gx, gw = torch.autograd.grad(loss, (x, w))
    return [out, loss, gx, gw]


def read_program(module: Any) -> dict[str, Any]:
    """What a compiled pipeline program does per step, from its HLO (XLA:CPU or XLA:TPU, `profile.hlo`):

    ``trip_counts`` (every While loop, sorted), and per collective op: ``<op>.count`` (instructions),
    ``<op>.in_loop`` (of them inside a loop body), ``<op>.step_count`` / ``<op>.step_bytes`` (executions and
    per-device operand bytes per step: each collective times the runs of the computation that schedules it),
    ``<op>.async`` (issued as start / done); for the collective-permutes also ``collective_permute.pairs``
    (source-target pairs of each in-loop permute) and ``collective_permute.bytes_per_iteration``.
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
    return out
