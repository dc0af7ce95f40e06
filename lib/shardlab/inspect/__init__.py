"""Your model on a TPU you don't own: a Hugging Face model's training step, compiled compile-only for a TPU slice.

Design note
-----------
``inspect(model, mesh=..., topology=...)`` (and ``python -m shardlab inspect``) builds the real ``transformers``
model code (``models``: a preset from ``data/models``, a ``config.json``, a dict or a config object) with its
weights on the meta device, gives every parameter a partition spec (``sharding``: FSDP on any axis, Megatron rules
by module name, your regexes), traces one training step — forward, HF's loss, backward, AdamW with its state
donated — with weights, optimizer state and tokens as placeholders (``step``), compiles it with the real XLA:TPU
compiler for the slice (``shardlab.profile.tpu``), and reads the per-chip program: fits or not with the compiler's
message, memory by kind, the largest buffers, every collective on its mesh axes, each beside the planner's
prediction (``analysis``), and the planner's nearest plan that fits. ``output`` renders the result as a terminal
table, an HTML page or JSON; ``config.InspectConfig`` is the one configuration object.

Example::

    from shardlab.inspect import inspect
    r = inspect("llama-3-8b", mesh={"fsdp": 8}, topology="v6e-64" ...)
    r.fits, r.row("total")["compiler"], r.row("total")["ratio"]
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {"InspectResult": "api", "inspect": "api", "run": "api", "InspectConfig": "config",
        "InspectInputError": "config", "make_config": "config"}


def __getattr__(name: str) -> Any:
    """Lazy: ``python -m shardlab`` builds its parser from ``inspect.cli`` without importing torch."""
    if name in _API:
        return getattr(importlib.import_module(f"shardlab.inspect.{_API[name]}"), name)
    raise AttributeError(f"module 'shardlab.inspect' has no attribute {name!r}")


__all__ = ["InspectConfig", "InspectInputError", "InspectResult", "inspect", "make_config", "run"]
