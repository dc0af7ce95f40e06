"""Notebook 13's topic: step time, MFU and the bottleneck of a training step, read from the XLA:TPU compiler.

``programs`` builds the graphs (an MLP block's training step split along one mesh axis); ``sweep`` compiles them
for a slice and prices each with :mod:`shardlab.profile.step_time` beside the JAX scaling book's critical
intensity; ``crossovers`` tabulates the crossing per axis (fsdp, tensor, context, expert) and generation (cached
in ``data/time``); ``published`` sets full-size predictions beside published training runs (cached in ``data/time``).
"""
