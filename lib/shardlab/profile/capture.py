"""Capture the partitioned HLO of one step: run, sync, read the new dump files, parse, clean up.

Design: ``runtime.setup()`` points ``--xla_dump_to`` at a per-process directory (fixed for the life of the
process: XLA reads the flag once). :func:`capture_hlo` lists that directory, runs ``fn``, cuts the lazy graph with
``torch_xla.sync()``, waits for the devices, and parses the files that appeared: each compiled
``SyncTensorsGraph`` module's ``*after_optimizations.txt`` (per-device program) and its buffer assignment.
The files are deleted afterwards. ``.cpu()`` of a sharded tensor compiles a ``ReplicateShardedData`` module;
the dump filter (``--xla_dump_hlo_module_re=SyncTensorsGraph``) already keeps those out.

A graph torch_xla has compiled before is served from its cache and dumps nothing, so parsed modules are
memoised by torch_xla's graph hash of the returned tensors: return every tensor the step produces
(outputs *and* gradients), or the hash will not identify the step.

Example::

    cap = capture_hlo(lambda: x @ w)          # x: [m, k] sharded by columns, w: [k, n] by rows
    cap.module.count("all-reduce")            # 1
    cap.metrics.compile_s                     # seconds spent compiling this step (0 when cached)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardlab import runtime
from shardlab.profile.hlo import HloModule, parse_hlo
from shardlab.profile.metrics import MetricsDelta, metrics_delta

if TYPE_CHECKING:
    import torch

_CACHE: dict[str, list[HloModule]] = {}
_AFTER = "after_optimizations.txt"
_BUFFERS = "after_optimizations-buffer-assignment.txt"


class HloNotCaptured(RuntimeError):
    """No module was compiled for the step and none is cached for its graph."""


@dataclass
class Capture:
    result: Any
    modules: list[HloModule]
    metrics: MetricsDelta
    cached: bool  # True when torch_xla served the step from its compile cache

    @property
    def module(self) -> HloModule:
        """The step's main module (the largest one compiled)."""
        return max(self.modules, key=lambda m: m.instruction_count)


def xla_tensors(obj: Any) -> list[torch.Tensor]:
    """All XLA tensors in a nested result (tensor, list/tuple/dict thereof)."""
    # torch and torch_xla are imported in the functions, not at the top: the report runner imports shardlab.profile
    # without torch (1.2 s of import, measured), and torch_xla must wait for runtime.setup()
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj] if obj.device.type == "xla" else []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for o in obj for t in xla_tensors(o)]
    return []


def _graph_hash(tensors: list[torch.Tensor]) -> str | None:
    import torch_xla

    if not tensors:
        return None
    try:
        return str(torch_xla._XLAC._get_graph_hash(tensors))
    except (AttributeError, RuntimeError):
        return None


def read_dumps(dump_dir: str | os.PathLike[str], names: set[str]) -> list[HloModule]:
    """Parse the after-optimizations modules among ``names`` (files in ``dump_dir``)."""
    root = Path(dump_dir)
    modules = []
    for name in sorted(names):
        if not name.endswith(_AFTER):
            continue
        prefix = name[: -len(_AFTER)]
        buf = root / f"{prefix}{_BUFFERS}"
        text = (root / name).read_text()
        modules.append(parse_hlo(text, buf.read_text() if buf.exists() else None))
    return modules


def capture_hlo(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Capture:
    """Run ``fn(*args, **kwargs)`` as one XLA step and return its parsed post-partitioning HLO."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    world = runtime.current()
    if not world.dump_dir:
        raise RuntimeError("HLO capture needs runtime.setup(dump_hlo=True) (the default)")
    dump = Path(world.dump_dir)
    before = set(os.listdir(dump))
    with metrics_delta() as md:
        result = fn(*args, **kwargs)
        key = _graph_hash(xla_tensors(result))
        torch_xla.sync()
        xm.wait_device_ops()
    new = set(os.listdir(dump)) - before
    try:
        modules = read_dumps(dump, new)
    finally:
        for name in new:
            (dump / name).unlink(missing_ok=True)
    modules = [m for m in modules if not re.search("ReplicateShardedData", m.name)]
    if modules:
        if key:
            _CACHE[key] = modules
        return Capture(result, modules, md, cached=False)
    if key and key in _CACHE:
        return Capture(result, _CACHE[key], md, cached=True)
    raise HloNotCaptured(
        "no SyncTensorsGraph module was compiled for this step and none is cached for its graph: the step "
        "was probably compiled earlier without returning the same tensors. Return every output/gradient "
        "tensor from fn, or capture the step the first time it runs."
    )
