"""The block stack on the device: the sharded model, program size, trace transfers, fresh-process compiles.

Design note
-----------
:func:`prepare` builds a model in one of the three modes from seeded CPU weights, moves it to the device and
marks the 2-D sharding (``sharding.py``); :class:`shardlab.xla_scan.case.ScanCase` traces its step from it and
:mod:`shardlab.core.harness` compiles, runs and reads it. What is specific to this topic lives here:

* :func:`graph_size` — instructions of the partitioned per-device program, XLA:CPU's outlined tasks counted once;
* :func:`trace_transfers` — host→device traffic of *tracing* one step (``OutboundData``, never compiled);
* :func:`compile_vs_devices` — a process holds one device world, so compile time vs device count runs each count
  in a fresh ``python -m shardlab.xla_scan`` (:func:`in_subprocess`) and reads one JSON line back.

torch_xla is imported at the top: import this module after ``shardlab.runtime.setup()`` (the notebooks' order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch_xla.core.xla_model as xm  # imported after runtime.setup() (the notebooks' order)

from shardlab import runtime
from shardlab.profile import metrics_delta
from shardlab.profile.hlo import HloModule
from shardlab.xla_scan import model as M
from shardlab.xla_scan import sharding as S
from shardlab.xla_scan.params import ScanParams
from shardlab.xla_scan.patches import placeholders_enabled

CPU_OUTLINED_PREFIX = "parallel_"


def require_shard_as_deps() -> None:
    """Clear error when the JAX stack behind torch_xla's ``shard_as`` (every SPMD scan backward) is missing.

    torch_xla only reports ``AssertionError: Jax is required for this feature`` deep inside the backward.
    """
    try:
        import jax  # noqa: F401  (a dependency probe: imported here to turn its absence into a clear error)
        import torchax  # noqa: F401  (torchax 0.0.7 imports flax at import time)
    except ImportError as e:
        raise RuntimeError(
            f"scan's backward under SPMD calls torch_xla's shard_as, which needs jax + torchax; importing them "
            f"failed ({e}). Install the pinned requirements (`make venv`): jax==0.7.1 jaxlib==0.7.1 "
            "torchax==0.0.7 flax==0.12.0"
        ) from e


def graph_size(module: HloModule) -> int:
    """Instructions in the per-device program, not counting the CPU backend's outlined parallel tasks.

    XLA:CPU moves a large elementwise op (e.g. the zero ``broadcast`` that initialises an [L, ...] gradient
    buffer) into a ``parallel_<op>`` computation called from the entry once its size passes a threshold:
    the op is then counted as the ``call`` plus the computation's body.  Counting the call alone keeps the
    size a function of the program, not of a codegen threshold that L happens to cross.
    """
    outlined = sum(len(names) for comp, names in module.computations.items()
                   if comp.startswith(CPU_OUTLINED_PREFIX))
    return module.instruction_count - outlined


def prepare(p: ScanParams, layers: int, mode: str, layout: str = "batch") -> tuple[torch.nn.Module, torch.Tensor]:
    """The ``mode`` model of L = ``layers`` blocks and its input x [b, s, h] on the device, 2-D sharded, the
    activations as ``layout`` says (:data:`shardlab.xla_scan.sharding.ACT_LAYOUTS`)."""
    S.check_sharding(p, layout)
    if mode != "loop":
        require_shard_as_deps()
    mesh = S.make_mesh(p.mesh_fsdp, p.mesh_tensor)
    weights = M.init_weights(layers, p.hidden, p.ffn, p.seed)
    model = M.build(mode, weights, annotate=S.annotator(mesh, layout), device=runtime.device())
    S.shard_model(model, mesh)
    x = M.init_input(p.batch, p.seq, p.hidden, p.seed).to(runtime.device())  # CPU -> device, then mark
    S.shard_input(x, mesh, layout)
    x.requires_grad_(True)
    xm.wait_device_ops()
    return model, x


@dataclass
class TraceTransfers:
    mode: str
    placeholders: bool
    h2d_bytes: int  # OutboundData: host -> device bytes (summed over devices)
    h2d_count: int  # number of host -> device transfers
    ir_value_to_data: int  # IrValueTensorToXlaData count: tensors materialised as device data while tracing


def trace_transfers(p: ScanParams, layers: int, mode: str, placeholders: bool = True,
                    warm: bool = True) -> TraceTransfers:
    """Host→device traffic of *tracing* one forward+backward step (never executed).

    ``warm``: trace twice and measure the second trace, so torch_xla's cache of scalar constants is filled first.
    A caller that has just traced the same step — e.g. with placeholders on — may pass ``warm=False``."""
    model, x = prepare(p, layers, mode)
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
def in_subprocess(request: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """Run ``python -m shardlab.xla_scan '<request>'`` (its own device world) and return its JSON line."""
    proc = subprocess.run([sys.executable, "-m", "shardlab.xla_scan", json.dumps(request)], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"subprocess {request} failed (exit {proc.returncode}): " + " | ".join(tail))
    return json.loads(lines[-1])


def compile_vs_devices(p: ScanParams, layers: int, mode: str, devices: tuple[int, ...] = (1, 2, 4, 8)
                       ) -> list[dict[str, Any]]:
    """One fresh process per device count n, mesh (fsdp=n, tensor=1): compile time of the same model.
    Rows ``{num_devices, mesh, compile_s, hlo_instructions, cached}``."""
    for n in devices:
        S.check_sharding(replace(p, mesh_fsdp=n, mesh_tensor=1))
    sizes = dict(hidden=p.hidden, ffn=p.ffn, batch=p.batch, seq=p.seq, seed=p.seed)
    return [in_subprocess({"num_devices": n, "layers": layers, "mode": mode, **sizes}) for n in devices]
