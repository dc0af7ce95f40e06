"""The same training step for the two XLA compilers: XLA:CPU's buffer assignment, XLA:TPU's temporaries.

Design note
-----------
:func:`build` runs ``shardlab.memory.graph.train_step`` on this process's XLA device world (replicated: the
per-chip program is the whole step) and returns what the compilers need:

- ``placeholders=False``: real tensors (seeded; Adam moments zero), for XLA:CPU — ``profile.capture_hlo`` executes
  the step and reads the buffer assignment of the compiled module (``HloModule.buffers``: parameters, outputs,
  and the heap-simulated peak of the temporaries). torch_xla aliases every parameter / moment it updates in place
  to its input buffer;
- ``placeholders=True``: nothing allocated, for XLA:TPU compile-only — the in-place updates act on clones of the
  placeholders, and ``tpu.Step`` donates each placeholder to its updated value (the alias torch_xla makes on a real
  device), so the TPU's temporaries are comparable with the CPU's and with the DAG's (parameters, moments and the
  batch resident and not counted).

A lazy graph has no operator order: the compiler schedules it. An *eager* update is forced before the next block's
backward with an optimization barrier over the flowing gradient and the updated tensors (``after_block`` in
``train_step``); an update at the end has no barrier. What XLA then does with that freedom is what the
compilers' numbers show. With one block there is no later backward to force the updates before: eager and end are
the same lazy graph and compile to the same program (use ``layers >= 2`` to compare schedules on XLA).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from shardlab.memory.graph import StepConfig, build_model, param_names, train_step


@dataclass(frozen=True)
class XlaStep:
    config: StepConfig
    schedule: tuple[tuple[str, str], ...] = ()  # (parameter, "eager" | "end"); default config.update
    placeholders: bool = True
    barrier: bool = True  # force eager updates before the next block's backward
    seed: int = 0

    @classmethod
    def of(cls, config: StepConfig, schedule: Mapping[str, str] | None = None, **kw: Any) -> XlaStep:
        """From a schedule over parameters or update units ("a+b+c" names every member)."""
        flat = {}
        for unit, choice in (schedule or {}).items():
            for p in unit.split("+"):
                flat[p] = choice
        return cls(config, tuple(sorted(flat.items())), **kw)


def build(spec: XlaStep) -> Any:
    """The step on this process's world: a ``tpu.Step`` (placeholders, donated) or ``[loss, *p, *m, *v]``."""
    import torch_xla.core.xla_model as xm

    from shardlab import runtime
    from shardlab.profile import tpu

    cfg = spec.config.validate()
    dt = getattr(torch, cfg.dtype)
    dev = runtime.device()
    with torch.device("meta"):
        structure = build_model(cfg)  # only its structure: functional_call gets the tensors
    names = param_names(structure)
    shapes = [tuple(p.shape) for p in structure.parameters()]
    act = (cfg.batch, cfg.seq, cfg.hidden)
    if spec.placeholders:
        from torch_xla.core.xla_builder import create_placeholder_tensor as ph

        p_in = [ph(s, dt) for s in shapes]
        m_in, v_in = [ph(s, dt) for s in shapes], [ph(s, dt) for s in shapes]
        x, target = ph(act, dt), ph(act, dt)
        params, ms, vs = [t.clone() for t in p_in], [t.clone() for t in m_in], [t.clone() for t in v_in]
    else:
        g = torch.Generator().manual_seed(spec.seed)
        init = build_model(cfg)
        params = [p.detach().to(dev) for p in init.parameters()]
        ms = [torch.zeros(s, dtype=dt).to(dev) for s in shapes]
        vs = [torch.zeros(s, dtype=dt).to(dev) for s in shapes]
        x = torch.randn(*act, generator=g).to(dt).to(dev)
        target = torch.randn(*act, generator=g).to(dt).to(dev)

    def after_block(grad: torch.Tensor, updated: list[int]) -> torch.Tensor:
        if not spec.barrier or not updated:
            return grad
        tensors = [grad, *(t for i in updated for t in (params[i], ms[i], vs[i]))]
        xm.optimization_barrier_(tensors)
        return tensors[0]

    out = train_step(cfg, structure, x, target, params, ms, vs, dict(spec.schedule), after_block=after_block)
    outputs = [*out, *params, *ms, *vs]
    if not spec.placeholders:
        return outputs
    n, k = len(names), len(out)
    donate = {k + j: src for j, src in enumerate([*p_in, *m_in, *v_in])}
    assert len(donate) == 3 * n
    return tpu.Step(outputs, donate)


@dataclass
class XlaMemory:
    """Per-device bytes of the step as each XLA compiler laid it out."""

    cpu_temp: int | None  # XLA:CPU buffer assignment: heap-simulated peak of the temporaries
    cpu_buffers: dict[str, int] = field(default_factory=dict)
    tpu_temp: int | None = None  # XLA:TPU: temporaries the capacity check counts (checked_temp)
    tpu_memory: dict[str, Any] = field(default_factory=dict)
    tpu_topology: str = ""
    tpu_compile_s: float = 0.0


def cpu_buffers(spec: XlaStep) -> dict[str, int]:
    """Run the step on XLA:CPU (real tensors) and return its buffer assignment (bytes by kind)."""
    from dataclasses import replace

    from shardlab.profile import capture_hlo

    cap = capture_hlo(build, replace(spec, placeholders=False))
    buffers = cap.module.buffers
    if buffers is None:
        raise RuntimeError("XLA:CPU wrote no buffer assignment for the step")
    return buffers.as_dict()


def tpu_memory(spec: XlaStep, topology: str | None = None) -> tuple[dict[str, Any], str, float]:
    """Compile the step for a TPU slice (default: as many chips as this process has devices), compile-only."""
    from dataclasses import replace

    from shardlab import runtime
    from shardlab.profile import tpu

    topo = topology or tpu.topology_for(runtime.current().num_devices)
    c = tpu.compile_program(build, replace(spec, placeholders=True), topo, label=f"memory step {spec.config.model}")
    if not c.fits or c.memory is None:
        raise RuntimeError(f"the step does not fit on {topo}: {c.oom}")
    return c.memory.as_dict(), topo, c.compile_s


def measure(spec: XlaStep, cpu: bool = True, tpu_view: bool = True, topology: str | None = None) -> XlaMemory:
    """Both compilers' view of one step (either can be skipped)."""
    out = XlaMemory(None)
    if cpu:
        out.cpu_buffers = cpu_buffers(spec)
        out.cpu_temp = out.cpu_buffers["temp"]
    if tpu_view:
        mem, topo, secs = tpu_memory(spec, topology)
        out.tpu_memory, out.tpu_topology, out.tpu_compile_s = mem, topo, secs
        out.tpu_temp = int(mem["checked_temp"])
    return out
