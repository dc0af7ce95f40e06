"""Scoped switches that reproduce torch_xla's behaviour *before* two scan fixes.

Design note
-----------
torch_xla 2.9 has no flags for either fix, so each "off" switch is a monkeypatch of one module attribute,
restored on exit (also on error) — never left behind:

``shard_as_enabled(False)``
    Under SPMD, ``Scan.backward`` wraps the per-layer backward in the module-level function
    ``torch_xla.experimental.scan._backward_shard_alike``, which calls ``shard_as(xs[0], grad_x)`` so each
    layer's weight gradient is sharded like the weight.  We replace that attribute with a wrapper that only
    calls ``backward(carry, x)``: the gradient is then whatever the partitioner infers — all-reduced over
    fsdp, 1-D — and so is the stacked gradient it is written into.

``placeholders_enabled(False)``
    ``_scan_impl_flat`` traces the scanned function on fake inputs made by
    ``torch_xla.core.xla_builder.create_placeholder_tensor`` (no device buffer).  Before the fix they were real
    tensors: ``torch.empty(shape).to(device)``, one host→device transfer of the carry and of one xs slice
    per trace.  We swap the builder function for exactly that.

The placeholders themselves (one tensor of any logical size with no memory, reading one, lowering a graph that
consumes one) are :mod:`shardlab.profile.placeholders`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_builder as xb  # imported after runtime.setup() (the notebooks' order)
import torch_xla.experimental.scan as scan_mod


@contextlib.contextmanager
def shard_as_enabled(on: bool = True) -> Iterator[None]:
    """Within the block, scan's backward uses ``shard_as`` iff ``on`` (torch_xla 2.9 default: on)."""
    original = scan_mod._backward_shard_alike
    if not on:
        def _backward_no_shard_alike(carry: Any, x: Any, backward: Any, init: Any, xs: Any) -> Any:
            return backward(carry, x)  # the pre-fix behaviour: no sharding constraint on the gradients

        scan_mod._backward_shard_alike = _backward_no_shard_alike
    try:
        yield
    finally:
        scan_mod._backward_shard_alike = original


@contextlib.contextmanager
def placeholders_enabled(on: bool = True) -> Iterator[None]:
    """Within the block, scan traces with placeholders iff ``on``; off = real zero tensors sent to the device."""
    original = xb.create_placeholder_tensor
    if not on:
        def _real_tensor(shape: Any, dtype: torch.dtype) -> torch.Tensor:
            # pre-fix: a real host tensor moved to the device (one host->device transfer of its bytes)
            return torch.zeros(tuple(shape), dtype=dtype).to(torch_xla.device())

        xb.create_placeholder_tensor = _real_tensor
    try:
        yield
    finally:
        xb.create_placeholder_tensor = original
