"""scan over layers on PyTorch/XLA: stacked weights, 2-D sharding, ``shard_as``, placeholder tensors.

Modules (read top-down):

``model``     L identical blocks ``x + gelu(x·W_up)·W_down`` run three ways — Python loop (the oracle),
              ``scan_layers``, ``scan`` over pre-stacked weights — plus the CPU reference.
``sharding``  the 2-D (fsdp, tensor) layout of weights and activations; parsing XLA sharding strings.
``patches``   scoped switches back to torch_xla's pre-fix behaviour (``shard_as_enabled(False)``,
              ``placeholders_enabled(False)``) and placeholder helpers with a clear read error.
``measure``   one compiled step per (mode, L): timings from metrics, structure from the partitioned HLO,
              gradient specs; trace transfers; fresh-subprocess runs for compile time vs device count.
``demos``     ``shard_as`` on its own.
``views``     the notebook's views of one configuration (formula, CPU compiler, TPU compiler), the compile
              sweep, the ``nn.Linear`` flattening trap vs einsum, trace transfers, the explorer's run.

Formulas live in :mod:`shardlab.formulas.scan`, figures in :mod:`shardlab.viz.scan`, the story in notebook
``06_scan_shard_as``. Nothing here imports torch_xla at import time: call ``shardlab.runtime.setup()`` first.
"""
