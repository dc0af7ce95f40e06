"""Memory levers of TorchAcc, measured: FlashAttention as a TPU custom call, ROAM's operator order, the
memory-aware weight-update schedule.

- ``pallas_tpu``: the two scoped private-API fixes that let torch_xla trace a Pallas kernel for a TPU it
  does not have (compile-only);
- ``flash``: one attention core, flash vs plain, per-chip temporaries and the longest sequence that fits;
- ``graph``: a training step (forward, backward, Adam) as an operator DAG with buffer sizes and lifetimes
  (``torch.fx`` trace), in ``levers.order``'s memory model;
- ``ilp``: the exact operator order as an integer program (scipy ``milp`` / HiGHS), greedy, program order;
- ``roam``: the split at memory-insensitive operators, each part solved exactly;
- ``update_schedule``: per parameter, the Adam update as soon as its gradient exists or at the end.
"""
