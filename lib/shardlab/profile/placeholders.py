"""Placeholders: XLA tensors of any logical size with no device buffer, for graphs that are only compiled.

Design note: :func:`placeholder` makes one (lowers to an HLO parameter, allocates nothing); :func:`read` turns
torch_xla's misleading "async operation is in flight" error into :class:`PlaceholderReadError`. A graph that
*consumes* a placeholder must only be lowered (:func:`lowered_hlo`): executing it segfaults torch_xla 2.9, so nothing
here runs one. Shared by notebook 06's trace transfers, the planner's compiler verdicts and ``shardlab.inspect``.
torch_xla is imported at the top: import this module after ``shardlab.runtime.setup()``.
"""

from __future__ import annotations

import math
import os
import resource

import torch
import torch_xla
import torch_xla.core.xla_builder as xb  # imported after runtime.setup() (the notebooks' order)


class PlaceholderReadError(RuntimeError):
    """Reading the value of a placeholder tensor, which holds no device buffer."""


def placeholder(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An XLA tensor of logical ``shape`` with no device buffer (lowers to an HLO parameter).

    >>> p = placeholder((1 << 34,))   # 64 GiB of float32, allocates nothing
    """
    shape = tuple(shape)
    if not shape or any((not isinstance(d, int)) or d < 0 for d in shape):
        raise ValueError(f"placeholder shape={shape} must be a non-empty tuple of ints >= 0")
    return xb.create_placeholder_tensor(shape, dtype)


def current_rss_bytes() -> int:
    """Resident memory of this process now (``/proc/self/statm``; peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def logical_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape) * t.element_size()


def is_placeholder_data(t: torch.Tensor) -> bool:
    """True if ``t`` is a device-data tensor whose PjRt buffer is null (a placeholder)."""
    try:
        torch_xla._XLAC._unsafe_buffer_pointer(t)
    except RuntimeError as e:
        return "buffer is null" in str(e)
    return False


def depends_on_placeholder(t: torch.Tensor) -> bool:
    """True if the lazy graph producing ``t`` reads a placeholder (checked without executing anything)."""
    _ids, leaves = torch_xla._XLAC._get_tensors_xla_device_data_node([t])
    return any(is_placeholder_data(v) for v in leaves)


def read(t: torch.Tensor) -> torch.Tensor:
    """``t.cpu()``, or :class:`PlaceholderReadError` when ``t`` is (or is computed from) a placeholder.

    The check runs *before* anything executes: in torch_xla 2.9 reading a placeholder raises a misleading
    "async operation is in flight" error, and executing a graph computed from one segfaults the process.
    """
    if depends_on_placeholder(t):
        raise PlaceholderReadError(
            f"tensor of shape {list(t.shape)} ({t.dtype}) is a placeholder or is computed from one: it has no "
            "device buffer, so it has no value to read (and executing its graph would crash torch_xla 2.9). "
            "Placeholders are for tracing/lowering (lowered_hlo); use real tensors to run."
        )
    try:
        return t.cpu()
    except RuntimeError as e:
        if "in flight" not in str(e):
            raise
        raise PlaceholderReadError(
            f"tensor of shape {list(t.shape)} has no device buffer (torch_xla said: "
            f"{str(e).strip().splitlines()[0][:160]!r})"
        ) from None


def lowered_hlo(outputs: list[torch.Tensor]) -> str:
    """Pre-partitioning HLO text of the graph producing ``outputs`` — lowered, never executed."""
    return torch_xla._XLAC._get_xla_tensors_hlo(list(outputs))
