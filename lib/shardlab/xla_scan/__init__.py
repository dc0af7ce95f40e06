"""scan over layers on PyTorch/XLA: stacked weights, 2-D sharding, ``shard_as``, placeholder tensors.

Modules (read top-down):

``model``     L identical blocks ``x + gelu(x·W_up)·W_down`` run three ways — Python loop (the oracle),
              ``scan_layers``, ``scan`` over pre-stacked weights — plus the CPU reference.
``sharding``  the 2-D (fsdp, tensor) layout of weights and activations; parsing XLA sharding strings.
``patches``   scoped switches back to torch_xla's pre-fix behaviour (``shard_as_enabled(False)``,
              ``placeholders_enabled(False)``) and placeholder helpers with a clear read error.
``measure``   the sharded model on the device, program size, trace transfers, compile time vs device count
              (one fresh ``python -m shardlab.xla_scan`` per count).
``case``      notebook 06's cases (the stacked step, the ``nn.Linear`` trap, ``shard_as`` on its own), run by
              :mod:`shardlab.core.harness`, and the notebook's measurements beyond one case's views.
``scale``     the 405B seed at full size (placeholders, XLA:TPU compile-only), shard_as off/on.

Formulas live in :mod:`shardlab.formulas.scan`, figures in :mod:`shardlab.xla_scan.figures`, the story in notebook
``06_scan_shard_as``. Importing this package imports nothing; its modules import torch_xla, so call
``shardlab.runtime.setup()`` first.
"""
