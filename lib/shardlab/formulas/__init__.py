"""shardlab.formulas — the *formula* view: every analytic prediction as a plain function of sizes.

Each submodule is plain arithmetic (no torch, no XLA) and returns named terms, so a notebook can put each term next
to its measured counterpart (ledger, HLO). Units are bytes, FLOPs, elements or seconds, as named. ``common`` holds
the shared vocabulary (element sizes, payload vs ring-wire bytes); every other submodule is one topic — blocks, tp,
zero, fsdp, scan, activations, flops, memory, hardware, pipeline, context, expert — and opens with the paper or the
measurement it follows. :mod:`shardlab.planner` composes them into a per-chip plan for a model on a TPU slice.
"""
