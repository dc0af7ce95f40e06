"""Measurements on the block stack: one fwd+bwd step per (mode, L), shard_as on/off, trace transfers.

Design note
-----------
Every function builds its model from seeded CPU weights, moves it to the device, marks the 2-D sharding
(``sharding.py``), and measures one step with :func:`shardlab.profile.capture_hlo`:

* timing from torch_xla metrics: ``compile_s`` (CompileTime), ``execute_s`` (ExecuteReplicatedTime — the
  SPMD name of ExecuteTime), ``trace_s`` (Python wall time to build the lazy forward+backward graph);
* structure from the post-partitioning HLO: instruction count, per-device while-loop state bytes, total
  buffer-assignment bytes; gradient shardings from ``_get_xla_sharding_spec``.

A process holds one device world, so compile time vs device count runs each count in a fresh subprocess
(:func:`in_subprocess`, which calls this module's ``__main__``) and reads one JSON line back.

Transfers (:func:`trace_transfers`) only *trace* the step, twice (the first fills torch_xla's scalar
device-data cache), and measure host→device bytes of the second trace; the graph is then dropped, never
compiled — so measuring the no-placeholder variant costs no compile.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

import torch

from shardlab import runtime
from shardlab.profile import capture_hlo, metrics_delta
from shardlab.xla_scan import model as M
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.patches import placeholders_enabled, shard_as_enabled

NS = 1e-9


@dataclass
class StepMeasure:
    mode: str
    layers: int
    mesh: tuple[int, int]  # (fsdp, tensor)
    shard_as: bool
    trace_s: float  # kind=timing
    compile_s: float  # kind=timing (0 if served from torch_xla's cache)
    execute_s: float  # kind=timing
    cached: bool
    hlo_instructions: int  # structural: program size, see graph_size()
    hlo_instructions_raw: int  # every instruction in the post-partitioning module text
    while_state_bytes: list[int]  # per-device bytes of each while loop's carried tuple, in HLO order
    buffers_total_bytes: int  # per-device "Total bytes used" of the buffer assignment
    grad_specs: dict[str, list[str]] = field(default_factory=dict)  # weight -> spec per gradient tensor
    grad_bytes: dict[str, int] = field(default_factory=dict)  # weight -> per-device bytes of all its grads
    weight_specs: dict[str, list[str]] = field(default_factory=dict)  # weight -> spec of each weight tensor
    max_abs_err: float | None = None  # vs the CPU loop oracle, when check=True
    max_rel_err: float | None = None  # max over tensors of max|xla - cpu| / max|cpu| (depth-scale free)
    module: Any = field(default=None, repr=False)  # the parsed per-device HloModule (not part of as_dict)

    @property
    def backward_while_state_bytes(self) -> int:
        """The backward scan's loop state: the last while loop in the module (it consumes the forward's)."""
        if not self.while_state_bytes:
            raise ValueError(f"mode={self.mode!r} has no while loop in its HLO")
        return self.while_state_bytes[-1]

    def as_dict(self) -> dict[str, Any]:
        """Every field but the parsed module (plain data: JSON-ready)."""
        return asdict(replace(self, module=None)) | {"module": None}


CPU_OUTLINED_PREFIX = "parallel_"


def require_shard_as_deps() -> None:
    """Clear error when the JAX stack behind torch_xla's ``shard_as`` (every SPMD scan backward) is missing.

    torch_xla only reports ``AssertionError: Jax is required for this feature`` deep inside the backward.
    """
    try:
        import jax  # noqa: F401
        import torchax  # noqa: F401  (torchax 0.0.7 imports flax at import time)
    except ImportError as e:
        raise RuntimeError(
            f"scan's backward under SPMD calls torch_xla's shard_as, which needs jax + torchax; importing them "
            f"failed ({e}). Install the pinned requirements (`make venv`): jax==0.7.1 jaxlib==0.7.1 "
            "torchax==0.0.7 flax==0.12.0"
        ) from e


def graph_size(module: Any) -> int:
    """Instructions in the per-device program, not counting the CPU backend's outlined parallel tasks.

    XLA:CPU moves a large elementwise op (e.g. the zero ``broadcast`` that initialises an [L, ...] gradient
    buffer) into a ``parallel_<op>`` computation called from the entry once its size passes a threshold:
    the op is then counted as the ``call`` plus the computation's body.  Counting the call alone keeps the
    size a function of the program, not of a codegen threshold that L happens to cross.
    """
    outlined = sum(len(names) for comp, names in module.computations.items()
                   if comp.startswith(CPU_OUTLINED_PREFIX))
    return module.instruction_count - outlined


def _prepare(cfg: M.StackConfig, mode: str, mesh: Any, seed: int) -> tuple[torch.nn.Module, torch.Tensor]:
    import torch_xla.core.xla_model as xm

    model = M.build(mode, M.init_weights(cfg, seed), annotate=S.annotator(mesh), device=runtime.device())
    S.shard_model(model, mesh)
    x = M.init_input(cfg, seed).to(runtime.device())  # CPU -> device, then mark (device RNG breaks lowering)
    S.shard_input(x, mesh)
    x.requires_grad_(True)
    xm.wait_device_ops()
    return model, x


def _grads(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    return {n: [w.grad for w in ws] for n, ws in model.weights().items()}  # type: ignore[operator]


def measure_step(cfg: M.StackConfig, mode: str, mesh_fsdp: int, mesh_tensor: int, seed: int = 0,
                 shard_as: bool = True, check: bool = False) -> StepMeasure:
    """Compile and run one forward+backward step of ``mode``; HLO structure, timings, gradient specs."""
    S.check_sharding(cfg, mesh_fsdp, mesh_tensor, runtime.current().num_devices)
    if mode != "loop":
        require_shard_as_deps()
    mesh = S.make_mesh(mesh_fsdp, mesh_tensor)
    model, x = _prepare(cfg, mode, mesh, seed)
    trace: dict[str, float] = {}

    def step() -> list[torch.Tensor]:
        t0 = time.perf_counter()
        out = model(x)  # [B,S,H]
        M.loss_fn(out).backward()
        trace["s"] = time.perf_counter() - t0
        return [out, x.grad, *[g for gs in _grads(model).values() for g in gs]]

    with shard_as_enabled(shard_as):
        cap = capture_hlo(step)
    m = cap.module
    specs = {n: [S.spec_of(g) for g in gs] for n, gs in _grads(model).items()}
    wspecs = {n: [S.spec_of(w) for w in ws] for n, ws in model.weights().items()}  # type: ignore[operator]
    nbytes = {n: sum(S.local_bytes(g.shape, sp, g.element_size()) for g, sp in zip(gs, specs[n], strict=True))
              for n, gs in _grads(model).items()}
    err = rel = None
    if check:
        ref_out, ref_grads = _reference(cfg, seed)
        got = {"out": cap.result[0].detach().cpu(), "x": x.grad.cpu()}
        got.update({n: torch.stack([g.cpu() for g in gs]).reshape(ref_grads[n].shape)
                    for n, gs in _grads(model).items()})
        ref = {**ref_grads, "out": ref_out}
        err = max(float((got[k] - ref[k]).abs().max()) for k in got)
        rel = max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in got)
    return StepMeasure(
        mode=mode, layers=cfg.layers, mesh=(mesh_fsdp, mesh_tensor), shard_as=shard_as, trace_s=trace["s"],
        compile_s=cap.metrics.compile_s, execute_s=cap.metrics.metric("ExecuteReplicatedTime")[1] * NS
        or cap.metrics.execute_s, cached=cap.cached, hlo_instructions=graph_size(m),
        hlo_instructions_raw=m.instruction_count,
        while_state_bytes=[w.state_bytes for w in m.while_loops],
        buffers_total_bytes=m.buffers.total if m.buffers else 0, grad_specs=specs, grad_bytes=nbytes,
        weight_specs=wspecs, max_abs_err=err, max_rel_err=rel, module=m,
    )


@lru_cache(maxsize=8)
def _reference(cfg: M.StackConfig, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The CPU loop oracle for (cfg, seed), computed once: every mode at the same L shares it (read-only)."""
    return M.reference(M.init_weights(cfg, seed), M.init_input(cfg, seed))


def warm_up(cfg: M.StackConfig, mesh_fsdp: int, mesh_tensor: int, seed: int = 0, mode: str = "loop") -> None:
    """Compile one small L=1 step first: the first compile of a process initialises XLA, and the first scan
    backward imports JAX (shard_as) — one-off seconds that would otherwise land on whichever (mode, L) runs first.
    The default ``loop`` step is the cheapest compile; the JAX import is paid here too (``require_shard_as_deps``).
    Uses ``seq + 1`` so the warm-up graph can never be the cached twin of a measured step."""
    c = M.StackConfig(1, cfg.hidden, cfg.ffn, cfg.batch, cfg.seq + 1, cfg.dtype)
    measure_step(c, mode, mesh_fsdp, mesh_tensor, seed)
    with contextlib.suppress(RuntimeError):  # loops need no JAX; a scan step raises the clear error itself
        require_shard_as_deps()


MIN_LAYERS = 2  # XLA's loop simplifier removes a While that runs once: at L = 1 scan's program has no loop


def check_layers_sweep(layers_sweep: list[int]) -> None:
    """Every L of a sweep is an int >= 2 (at L = 1 XLA removes the While, so there is no scan program to see)."""
    if not isinstance(layers_sweep, list | tuple) or not layers_sweep:
        raise ValueError(f"layers_sweep={layers_sweep!r} must be a non-empty list of ints >= {MIN_LAYERS}")
    bad = [L for L in layers_sweep if isinstance(L, bool) or not isinstance(L, int) or L < MIN_LAYERS]
    if bad:
        raise ValueError(f"layers_sweep={layers_sweep} has entries {bad}: every L must be an int >= {MIN_LAYERS} "
                         "(XLA removes a While that runs once, so at L = 1 scan's program has no loop)")


@dataclass
class TraceTransfers:
    mode: str
    placeholders: bool
    h2d_bytes: int  # OutboundData: host -> device bytes (summed over devices)
    h2d_count: int  # number of host -> device transfers
    ir_value_to_data: int  # IrValueTensorToXlaData count: tensors materialised as device data while tracing


def trace_transfers(cfg: M.StackConfig, mode: str, mesh_fsdp: int, mesh_tensor: int, placeholders: bool = True,
                    seed: int = 0, warm: bool = True) -> TraceTransfers:
    """Host→device traffic of *tracing* one forward+backward step (never executed).

    ``warm``: trace twice and measure the second trace, so torch_xla's cache of scalar constants is filled first.
    A caller that has just traced the same (cfg, mode) — e.g. with placeholders on — may pass ``warm=False``."""
    S.check_sharding(cfg, mesh_fsdp, mesh_tensor, runtime.current().num_devices)
    if mode != "loop":
        require_shard_as_deps()
    model, x = _prepare(cfg, mode, S.make_mesh(mesh_fsdp, mesh_tensor), seed)
    with placeholders_enabled(placeholders):
        for attempt in range(2 if warm else 1):
            with metrics_delta() as md:
                out = model(x)
                M.loss_fn(out).backward()
            del out
            if attempt == 0 and warm:
                model.zero_grad(set_to_none=True)
                x.grad = None
    h2d = TraceTransfers(mode, placeholders, md.h2d_bytes, md.h2d_count, md.metric("IrValueTensorToXlaData")[0])
    del model, x  # drop the traced graph: it is never compiled or run
    return h2d


# ----------------------------------------------------------------------------------------------------------
# fresh-process measurements (compile time vs device count)


def in_subprocess(task: str, num_devices: int, timeout_s: float = 600, **kwargs: Any) -> dict[str, Any]:
    """Run ``task`` in a fresh ``python -m shardlab.xla_scan.measure`` with its own device world; its JSON."""
    args = json.dumps({"task": task, "num_devices": num_devices, **kwargs})
    proc = subprocess.run([sys.executable, "-m", "shardlab.xla_scan.measure", args], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"subprocess task={task!r} num_devices={num_devices} failed "
                           f"(exit {proc.returncode}): " + " | ".join(tail))
    return json.loads(lines[-1])


def compile_vs_devices(cfg: M.StackConfig, mode: str, devices: tuple[int, ...] = (1, 2, 4, 8),
                       seed: int = 0) -> list[dict[str, Any]]:
    """One fresh process per device count n, mesh (fsdp=n, tensor=1): compile time of the same model."""
    for n in devices:
        S.check_sharding(cfg, n, 1, n)
    kw = dict(layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn, batch=cfg.batch, seq=cfg.seq, seed=seed)
    return [in_subprocess("step", n, mode=mode, mesh=[n, 1], **kw) for n in devices]


def _main(argv: list[str]) -> None:
    """``python -m shardlab.xla_scan.measure '<json>'``; prints one JSON line per measured step.

    ``{"task": "step", "num_devices": 8, "mode": "scan", "mesh": [2, 4], "layers": 8, "hidden": 128, ...}``
    or ``{"task": "sweep", "num_devices": 8, "mesh": [2, 4], "layers_sweep": [2, 4, ..., 64], ...}`` (every
    mode with shard_as on, plus scan with shard_as off — the numbers behind notebook 06's full story).
    """
    req = json.loads(argv[0])
    if req.get("task") not in ("step", "sweep"):
        raise ValueError(f"task={req.get('task')!r} is not one of 'step', 'sweep'")

    runtime.setup(num_devices=req["num_devices"])
    fsdp, tensor = req["mesh"]
    sizes = dict(hidden=req.get("hidden", 128), ffn=req.get("ffn", 512), batch=req.get("batch", 8),
                 seq=req.get("seq", 8))
    seed = req.get("seed", 0)
    if req["task"] == "step":
        cfg = M.StackConfig(req["layers"], **sizes)
        warm_up(cfg, fsdp, tensor, seed, "loop" if req["mode"] == "loop" else "scan")
        runs = [(cfg, req["mode"], req.get("shard_as", True))]
    else:
        check_layers_sweep(req["layers_sweep"])
        warm_up(M.StackConfig(1, **sizes), fsdp, tensor, seed)
        runs = [(M.StackConfig(L, **sizes), mode, sa) for L in req["layers_sweep"]
                for mode, sa in (("loop", True), ("scan_layers", True), ("scan", True), ("scan", False))]
    for cfg, mode, sa in runs:
        r = measure_step(cfg, mode, fsdp, tensor, seed, sa)
        print(json.dumps({**r.as_dict(), "num_devices": req["num_devices"]}), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
