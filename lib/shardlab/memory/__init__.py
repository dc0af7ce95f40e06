"""Memory levers of TorchAcc, measured (notebook 08b): FlashAttention as a TPU custom call, ROAM's operator order, the
memory-aware weight-update schedule.

- ``params``: notebook 08b's parameters (light: read before ``runtime.setup()``); every size below comes from them;
- ``pallas_tpu``: the two scoped private-API fixes that let torch_xla trace a Pallas kernel for a TPU it
  does not have (compile-only);
- ``flash``: one attention core, flash vs plain: the graph, the planner's terms, per-chip rows, the longest fit;
- ``graph``: a training step (forward, backward, Adam) as an operator DAG with buffer sizes and lifetimes
  (``torch.fx`` trace), in ``profile.order``'s memory model;
- ``ilp``: the exact operator order as an integer program (scipy ``milp`` / HiGHS), greedy, program order;
- ``roam``: the split at memory-insensitive operators, each part solved exactly;
- ``update_schedule``: per parameter, the Adam update as soon as its gradient exists or at the end;
- ``xla_step``: the same step on the XLA device, for both compilers;
- ``case``: the cases notebook 08b runs through ``shardlab.core.harness``;
- ``full_size``: the full-size measurements and their cache in ``data/memory/`` (``python -m shardlab.memory``);
- ``solutions``: notebook 08b's graded exercises.
"""
