"""torch_xla's Pallas kernels traced for a TPU this machine does not have: two private-API fixes, scoped.

Design note
-----------
``torch_xla.experimental.custom_kernel.flash_attention`` traces a JAX Pallas kernel
(``jax.experimental.pallas.ops.tpu.flash_attention``) in ``custom_kernel.trace_pallas``, extracts the Mosaic
payload from the lowered module and inserts it into the lazy graph as a ``tpu_custom_call``. Nothing runs: the
graph is only compiled, compile-only, by XLA:TPU (``shardlab.profile.tpu``). On a CPU-only host (torch_xla 2.9.0,
jax 0.7.1, libtpu 0.0.21) that path fails twice, and each failure has a one-line fix:

1. ``trace_pallas`` lowers with ``jax.jit(kernel).lower(...)`` on JAX's default backend — CPU here — where Pallas
   refuses a TPU kernel: "Only interpret mode is supported on CPU backend". :func:`_trace_pallas_for_tpu` is the
   same function lowering for the TPU platform explicitly: ``jax.jit(...).trace(...).lower(lowering_platforms=
   ("tpu",))``; the payload extraction (``custom_kernel._extract_backend_config``) is unchanged.
2. XLA:TPU then refuses the kernel: "Failed to deserialize the Mosaic module: Unsupported version: expected <= 7
   but got 8" — jax 0.7.1 writes Mosaic IR version 8 unless it sees an older cloud TPU, libtpu 0.0.21 reads up to 7.
   ``jax._src.tpu_custom_call.get_ir_version`` returning :data:`MOSAIC_IR_VERSION` makes it write version 7.

:func:`pallas_for_tpu_compile` applies both as monkeypatches of those two module attributes for the duration of a
``with`` block and restores the originals on exit, also on error. It is meant for the tracing step of a
compile-only graph (the payload is fixed when the kernel is traced; the later XLA:TPU compile needs nothing
patched). On a TPU host neither fix is wanted: ``active=False`` leaves everything as shipped.

Two caches do not know about the IR version: torch_xla's payload cache (``trace_pallas_arg_to_payload``, keyed by
kernel and shapes; :func:`_trace_pallas_for_tpu` adds the platform and the version to its key) and JAX's lowering
cache (measured: a kernel lowered once with version 8 came back as version 8 inside the block). The block therefore
calls ``jax.clear_caches()`` on entry and on exit whenever it changes the IR version.

Example::

    >>> with pallas_for_tpu_compile():                        # doctest: +SKIP
    ...     o = custom_kernel.flash_attention(q, k, v, causal=True)   # a tpu_custom_call in the lazy graph
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

# torch_xla must not be imported before runtime.setup(): this module is imported by memory.flash / memory.case,
# which the notebook imports after it
import jax
import jax._src.tpu_custom_call as tcc
import jax.experimental.pallas.tpu  # noqa: F401  (registers Pallas's Mosaic lowering for the TPU platform)
import torch
import torch_xla.experimental.custom_kernel as ck

MOSAIC_IR_VERSION = 7  # the newest Mosaic serialization libtpu 0.0.21 reads
PLATFORM = "tpu"


def _trace_pallas_for_tpu(kernel: Callable[..., Any], *args: Any, static_argnums: Any = None,
                          static_argnames: Any = None, use_cache: bool = False, **kwargs: Any) -> tuple[str, list[Any]]:
    """``custom_kernel.trace_pallas`` lowering for the TPU platform: ``(payload, tensor arguments)``.

    Same contract as the original (tensors become ``jax.ShapeDtypeStruct``; other arguments pass through; the
    payload cache is used the same way), with ``lower(lowering_platforms=("tpu",))`` instead of the default backend.
    """
    jax_args, tensor_args = [], []
    for arg in args:
        if torch.is_tensor(arg):
            jax_args.append(ck.to_jax_shape_dtype_struct(arg))
            tensor_args.append(arg)
        else:
            jax_args.append(arg)
    key: tuple[Any, ...] = ()
    if use_cache:  # keyed like the original, plus the IR version in force (the original's key has neither)
        key = (PLATFORM, tcc.get_ir_version is _ir_version, jax.config.jax_default_matmul_precision, kernel,
               static_argnums,
               tuple(static_argnames) if static_argnames is not None else static_argnames, tuple(jax_args),
               repr(sorted(kwargs.items())).encode())
        if key in ck.trace_pallas_arg_to_payload:
            return ck.trace_pallas_arg_to_payload[key], tensor_args
    jitted = jax.jit(kernel, static_argnums=static_argnums, static_argnames=static_argnames)
    ir = jitted.trace(*jax_args, **kwargs).lower(lowering_platforms=(PLATFORM,)).compiler_ir()
    payload = ck._extract_backend_config(ir)
    if payload is None:
        raise RuntimeError(f"no tpu_custom_call in the module lowered for {kernel!r}: not a Pallas TPU kernel")
    if use_cache:
        ck.trace_pallas_arg_to_payload[key] = payload
    return payload, tensor_args


def _ir_version(ctx: Any) -> int:
    return MOSAIC_IR_VERSION


def patched() -> dict[str, bool]:
    """Which of the two fixes are in force: ``{"platform": ..., "ir_version": ...}``."""
    return {"platform": ck.trace_pallas is _trace_pallas_for_tpu, "ir_version": tcc.get_ir_version is _ir_version}


@contextlib.contextmanager
def pallas_for_tpu_compile(active: bool = True, platform: bool = True, ir_version: bool = True) -> Iterator[None]:
    """Within the block, Pallas kernels traced by torch_xla lower for the TPU platform with Mosaic IR v7.

    ``active=False`` (e.g. on a TPU host, where the shipped path works) changes nothing; ``platform`` /
    ``ir_version`` apply one fix alone (to show that each is needed). The originals are restored on exit.
    """
    if not active:
        yield
        return
    saved = ck.trace_pallas, tcc.get_ir_version
    changes_version = ir_version and tcc.get_ir_version is not _ir_version
    if changes_version:
        jax.clear_caches()  # no lowering made with the shipped version may be reused inside
    if platform:
        ck.trace_pallas = _trace_pallas_for_tpu
    if ir_version:
        tcc.get_ir_version = _ir_version
    try:
        yield
    finally:
        ck.trace_pallas, tcc.get_ir_version = saved
        if changes_version:
            jax.clear_caches()  # nor a version-7 lowering outside
