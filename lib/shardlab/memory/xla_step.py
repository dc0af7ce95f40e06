"""The traced training step built on the XLA device, for both compilers: XLA:CPU runs it, XLA:TPU compiles it.

Design note
-----------
:func:`build` runs ``shardlab.memory.graph.train_step`` at ``p``'s step sizes on this process's XLA world
(replicated: the per-chip program is the whole step) and returns its outputs ``Step([loss, *params, *m, *v])``.
Parameters, Adam moments (zero) and the batch are real seeded tensors on the device. Parameters, moments and the
batch must stay resident, as in the DAG (not counted), so each updated tensor must be written into its input's
buffer; two ways, one per compiler:

- ``donated=False``: Adam updates the device tensors in place, as a torch_xla training step does; executing the
  graph (XLA:CPU, ``harness.hlo``) torch_xla aliases every updated tensor to its input buffer itself;
- ``donated=True``: the updates act on clones, and a ``profile.tpu.Step`` declares each clone's final value
  *donated* to its input — the same aliasing, stated explicitly for a compile-only XLA:TPU program (which never
  sees torch_xla's runtime aliasing). Executed on XLA:CPU this graph would not be aliased: its buffer assignment
  then colocates the temporaries with the unaliased outputs and reports none.

A lazy graph has no operator order: the compiler schedules it. An *eager* update is forced before the next block's
backward with an optimization barrier over the flowing gradient and the updated tensors (``after_block`` in
``train_step``); an update at the end has no barrier. With one block there is no later backward to force the
updates before: eager and end are the same lazy graph (compare schedules with ``layers >= 2``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch_xla.core.xla_model as xm  # this module is imported after runtime.setup (the ordering rule)

from shardlab import runtime
from shardlab.memory.graph import DTYPE, activation_shape, build_model, param_names, train_step
from shardlab.memory.params import MemoryParams
from shardlab.profile.tpu import Step


def flat_schedule(schedule: Mapping[str, str] | None) -> dict[str, str]:
    """A schedule over update units ("a+b+c" names every member of a unit) as one over parameters."""
    return {name: choice for unit, choice in (schedule or {}).items() for name in unit.split("+")}


def build(p: MemoryParams, schedule: Mapping[str, str] | None = None, donated: bool = True,
          barrier: bool = True) -> Step:
    """The step on this process's world (module note); ``schedule``: parameter or unit -> "eager" | "end"."""
    dev = runtime.device()
    init = build_model(p)  # seeded by p.seed
    shapes = [tuple(w.shape) for w in init.parameters()]
    with torch.device("meta"):
        structure = build_model(p)  # only its structure: functional_call gets the tensors
    g = torch.Generator().manual_seed(p.seed)
    p_in = [w.detach().to(dev) for w in init.parameters()]
    m_in = [torch.zeros(s, dtype=DTYPE).to(dev) for s in shapes]
    v_in = [torch.zeros(s, dtype=DTYPE).to(dev) for s in shapes]
    x = torch.randn(*activation_shape(p), generator=g).to(DTYPE).to(dev)
    target = torch.randn(*activation_shape(p), generator=g).to(DTYPE).to(dev)
    params, ms, vs = p_in, m_in, v_in
    if donated:
        params, ms, vs = [t.clone() for t in p_in], [t.clone() for t in m_in], [t.clone() for t in v_in]

    def after_block(grad: torch.Tensor, updated: list[int]) -> torch.Tensor:
        if not barrier or not updated:
            return grad
        tensors = [grad, *(t for i in updated for t in (params[i], ms[i], vs[i]))]
        xm.optimization_barrier_(tensors)  # the eager updates happen before the next block's backward
        return tensors[0]

    out = train_step(structure, x, target, params, ms, vs, flat_schedule(schedule), after_block=after_block)
    if not donated:
        return Step([*out, *params, *ms, *vs])
    names = param_names(structure)
    donate = {len(out) + j: src for j, src in enumerate([*p_in, *m_in, *v_in])}
    assert len(donate) == 3 * len(names)
    return Step([*out, *params, *ms, *vs], donate)
