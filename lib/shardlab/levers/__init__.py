"""Compiler levers (the ones TorchAcc relies on), each measured off vs on, on XLA:CPU and XLA:TPU (compile-only).

- ``programs``: the graphs (DP / FSDP step, memory-order toy, fused or separate weight update, MLP layouts);
- ``case``: those graphs as cases of notebook 08's ``LeversParams`` — combining in four views (formula, CPU
  compiler, TPU compiler with its combiner passes on and off), the scheduler on / off, the update's memory;
- ``combine``: the α–β model, gloo timings of k all-reduces of n/k elements, hand-made buckets (DDP's rule);
- ``overlap``: matmul FLOPs, async windows and a model of exposed communication time;
- (the operator-order simulator it uses — peak memory of every order, XLA's chosen order — is shared with
  notebook 08b: ``shardlab.profile.order``)
- ``search``: layouts ranked by communication and memory, the planner's choice, XLA's auto-sharding;
- ``fusion``: kernels by kind (matmul, memory-bound, collective) in a compiled program;
- ``params``, ``solutions``, ``figures``, ``topic``: the notebook's dataclass, exercises, figures, registry entry.
"""
