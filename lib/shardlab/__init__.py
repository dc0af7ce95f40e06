"""shardlab: teach and measure how large models are split across accelerators, on PyTorch/XLA.

Every number is measured three ways that must agree: the formula (``shardlab.formulas``), the ledger
(per-rank code in ``shardlab.comm`` / ``tp`` / ``fsdp``) and the compiler (``shardlab.profile`` reading the
HLO XLA's SPMD partitioner produced). Importing ``shardlab`` does not import torch_xla: call
``shardlab.runtime.setup()`` first.
"""

__version__ = "0.1.0"
