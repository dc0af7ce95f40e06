"""1F1B as ONE SPMD program: the backward written into the loop body, so each stage's backward of microbatch i
runs while later microbatches' forwards are still in flight.

Design note
-----------
`shardlab.pipeline.spmd` differentiates its forward loop with autograd: every forward iteration runs before the
reversed loop starts, which is GPipe's order, and autograd saves what the backward needs for all T = m + p - 1
iterations.  Here the backward is part of the loop instead (MaxText trades the same way in its pipeline, see
its `pipeline_delay_activation_forwarding` option).  p stages, m microbatches x [m, rows, h], one tanh layer
per stage, W [1, p, h, h] sharded on the stage axis (the same model as `spmd.circular_pipeline` at v = 1).

Tick t = 0 .. T - 1 with T = m + 2 (p - 1); every stage runs, masked, one forward slot and one backward slot:

    forward   stage s runs microbatch  i_f = t - s                 valid while 0 <= i_f < m
              input: stage 0 takes x[t], stage s > 0 the output stage s - 1 made at tick t - 1  (shift s -> s+1)
    backward  stage s differentiates   i_b = t - 2 (p - 1) + s     valid while 0 <= i_b < m
              output gradient: the last stage's comes from the loss of the forward it ran this very tick
              (i_b = i_f there); stage s < p - 1 takes the input gradient stage s + 1 made at tick t - 1
              (shift s+1 -> s)

Microbatch i's forward runs on stage s at tick i + s, its backward at tick i + 2 (p - 1) - s: the stage must
keep its input and output for 2 (p - 1 - s) ticks.  Each stage holds a shift register `stash` of K = 2 p - 1
slots (slot k = what it computed k ticks ago; stage s reads slot 2 (p - 1 - s)), whatever m is — GPipe's
autograd loop saves T = m + p - 1.  The price: T = m + 2 (p - 1) ticks of forward + backward instead of
m + p - 1 forward ticks then m + p - 1 backward ticks, i.e. an idle share of 2 (p - 1) / (m + 2 (p - 1)) per
tick against GPipe's (p - 1) / (m + p - 1) (a masked tick costs as much as a useful one).  Two shifts per tick,
each one collective-permute of one [rows, h] shard per device (written as `F.pad`, the shift both partitioners
recognise).

Per tick (all stages at once, locally; shapes per the whole [p, ...] buffer, dim 0 sharded on `stage`):

    xin   = slot 0 <- x[t],  slot s <- y_prev[s - 1]            [p, rows, h]   forward shift
    y     = tanh(xin @ W[s])                                    [p, rows, h]
    stash_x, stash_y <- push(xin), push(y)                      [p, K, rows, h]
    xb, yb = stash_x[s, 2(p-1-s)], stash_y[s, 2(p-1-s)]         [p, rows, h]   the microbatch to differentiate
    dy    = last stage: d loss / dy = 2 yb / (m rows h); else dx_prev[s + 1]   backward shift
    dz    = dy * (1 - yb^2) * valid_b                           [p, rows, h]
    gW   += xb^T dz                                             [p, h, h]
    dx    = dz @ W[s]^T                                         [p, rows, h]

The loss is `spmd.pipeline_loss` (mean of out^2 over [m, rows, h]), computed after the loop from the outputs the
last stage emitted; its gradient inside the loop is written by hand (2 y / N, N = m rows h), which is what
autograd would produce.  Checked against `spmd.dense_forward` differentiated by autograd (tests, notebook 09).

Example::

    runtime.setup(num_devices=4)
    x, w = spmd.init(p=4, m=8, v=1, rows=8, hidden=64)
    mesh = runtime.mesh((4, 1), ("stage", "data"))
    out, loss, gx, gw = one_f_one_b_step(x.to(dev), w.to(dev), mesh)   # == dense_forward + autograd
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch_xla.experimental.scan import scan

from shardlab.pipeline.schedules import Action, Schedule
from shardlab.pipeline.spmd import annotator

__all__ = ["check_1f1b", "masks", "one_f_one_b_step", "stash_slots", "tick_schedule", "ticks"]


def ticks(p: int, m: int) -> int:
    """T = m + 2 (p - 1): the 1F1B loop's trip count (each tick one forward slot and one backward slot)."""
    return m + 2 * (p - 1)


def stash_slots(p: int) -> int:
    """K = 2 p - 1: the slots of each stage's stash (stage 0 keeps an input for 2 (p - 1) ticks, plus this one)."""
    return 2 * p - 1


def check_1f1b(p: int, m: int) -> None:
    """Raise ValueError naming the rule when (p, m) is no 1F1B loop this module builds."""
    for name, value in (("p", p), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")


def masks(p: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward valid [T, p], backward valid [T, p]) as 0.0 / 1.0: stage s at tick t runs microbatch t - s
    forward and t - 2 (p - 1) + s backward, each valid inside [0, m)."""
    t = torch.arange(ticks(p, m))[:, None]
    s = torch.arange(p)[None, :]
    fwd, bwd = t - s, t - 2 * (p - 1) + s
    return ((fwd >= 0) & (fwd < m)).float(), ((bwd >= 0) & (bwd < m)).float()


def tick_schedule(p: int, m: int) -> Schedule:
    """The loop's order as action lists: stage s runs, tick by tick, its valid forward and then its valid backward
    (read from `masks`).  Steady state one forward and one backward per tick, as 1F1B; the warm-up is
    2 (p - 1 - s) forwards, twice PyTorch's Schedule1F1B's p - 1 - s, because in the lockstep loop a gradient
    moves one stage per tick like an activation — so stage s holds up to 2 (p - 1 - s) + 1 microbatches
    (stage 0: 2 p - 1, the stash) instead of p - s."""
    fwd, bwd = masks(p, m)
    devices = []
    for s in range(p):
        acts = []
        for t in range(ticks(p, m)):
            if fwd[t, s]:
                acts.append(Action("F", s, t - s))
            if bwd[t, s]:
                acts.append(Action("B", s, t - 2 * (p - 1) + s))
        devices.append(tuple(acts))
    return Schedule("1f1b_spmd", p, m, 1, tuple(devices))


def _push(stash: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
    """Shift register along dim 1 (local to each stage): slot 0 <- item [p, rows, h], slot k <- slot k - 1."""
    return torch.cat([item[:, None], stash[:, :-1]], 1)  # [p, 1, rows, h] + [p, K-1, rows, h] -> [p, K, rows, h]


def one_f_one_b_step(x: torch.Tensor, w: torch.Tensor, mesh: xs.Mesh | None = None, *,
                     data_axis: str | None = None) -> list[torch.Tensor]:
    """[outputs [m, rows, h], loss [], grad x [m, rows, h], grad W [1, p, h, h]] of x [m, rows, h] and
    W [1, p, h, h], by the 1F1B loop (see the module note).  With ``mesh``: "stage" splits the stages,
    ``data_axis`` a microbatch's rows.  Not synced (for ``shardlab.core.harness`` to capture or compile)."""
    m, rows, h = x.shape
    if w.dim() != 4 or w.shape[0] != 1:
        raise ValueError(f"W {tuple(w.shape)} must be [1, p, h, h]: the 1F1B loop pipelines v = 1")
    p = w.shape[1]
    check_1f1b(p, m)
    T, K, N = ticks(p, m), stash_slots(p), m * rows * h
    dev = x.device

    annotate = annotator(mesh)

    row = data_axis
    w = annotate(w[0], ("stage", None, None))  # [p, h, h]
    fmask, bmask = (t.to(dev) for t in masks(p, m))  # [T, p] each
    # [T, p, rows, h]: x[t] in stage 0's slot for t < m, zeros elsewhere (sharded like the state)
    stream = annotate(F.pad(x[:, None], (0, 0, 0, 0, 0, p - 1, 0, T - m)), (None, "stage", row, None))
    state = annotate(x.new_zeros(p, rows, h), ("stage", row, None))  # forward outputs of the last tick
    grad = annotate(x.new_zeros(p, rows, h), ("stage", row, None))  # input gradients of the last tick
    stash_x = annotate(x.new_zeros(p, K, rows, h), ("stage", None, row, None))
    stash_y = annotate(x.new_zeros(p, K, rows, h), ("stage", None, row, None))
    gw = annotate(w.new_zeros(p, h, h), ("stage", None, None))

    def tick(carry, inputs):
        state, grad, stash_x, stash_y, gw, w = carry
        x_t, f_t, b_t = inputs  # [p, rows, h] (slot 0: the microbatch entering), [p], [p]
        stage = torch.arange(p, device=state.device)  # made inside: scan's body may not capture outer tensors
        first = (stage == 0).to(state.dtype).view(p, 1, 1)
        last = (stage == p - 1).to(state.dtype).view(p, 1, 1)
        # forward slot: slot s+1 <- slot s (one collective-permute), stage 0 takes the fresh microbatch
        xin = first * x_t + (1 - first) * F.pad(state[:-1], (0, 0, 0, 0, 1, 0))  # [p, rows, h]
        y = torch.tanh(torch.einsum("pbh,phk->pbk", xin, w)) * f_t.view(p, 1, 1)  # [p, rows, h]
        stash_x, stash_y = _push(stash_x, xin), _push(stash_y, y)  # [p, K, rows, h], local
        # backward slot: stage s differentiates what it computed 2 (p - 1 - s) ticks ago
        read = (torch.arange(K, device=state.device)[None, :] == 2 * (p - 1 - stage)[:, None]).to(state.dtype)
        xb = torch.einsum("pk,pkbh->pbh", read, stash_x)  # [p, rows, h]
        yb = torch.einsum("pk,pkbh->pbh", read, stash_y)
        # output gradient: slot s <- slot s+1 of the last tick's input gradients (the mirror permute); the last
        # stage starts from the loss of the forward it ran this tick
        dy = last * (2.0 / N) * yb + (1 - last) * F.pad(grad[1:], (0, 0, 0, 0, 0, 1))  # [p, rows, h]
        dz = dy * (1 - yb * yb) * b_t.view(p, 1, 1)  # tanh' ; masked: no microbatch, no gradient
        gw = gw + torch.einsum("pbh,pbk->phk", xb, dz)  # [p, h, h]: x^T dz
        dx = torch.einsum("pbk,phk->pbh", dz, w)  # [p, rows, h]: dz W^T
        return (y, dx, stash_x, stash_y, gw, w), (y, dx)

    carry = (state, grad, stash_x, stash_y, gw, w)
    with torch.no_grad():
        (_, _, _, _, gw, _), (ys, dxs) = scan(tick, carry, (stream, fmask, bmask))  # ys, dxs [T, p, rows, h]
    out = ys[p - 1 : p - 1 + m, p - 1]  # microbatch i leaves the last stage at tick i + p - 1: [m, rows, h]
    gx = dxs[2 * (p - 1) : 2 * (p - 1) + m, 0]  # its input gradient leaves stage 0 at tick i + 2 (p - 1)
    loss = (out * out).mean()  # spmd.pipeline_loss
    return [out, loss, gx, gw[None]]
