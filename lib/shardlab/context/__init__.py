"""shardlab.context — context parallelism: attention over a sequence split across cp ranks (notebook 10).

params      the notebook's parameters (light: read before ``runtime.setup()``; this package imports nothing at import)
attention   the dense oracle (PyTorch's scaled_dot_product_attention) and its einsum form, sequence layouts
            (contiguous, zig-zag), causal block kinds, the online-softmax state and FlashAttention's block backward
allgather   all-gather CP per rank (Llama 3): gather k and v, attend with the local queries; backward reduce-scatters
ring        ring attention per rank over a `shardlab.comm.Comm` (send / recv): forward and a hand-written
            backward that rings too; the blocks each rank computed (causal balance)
balance     causal balance: work per rank counted from the ring's trace, contiguous vs zig-zag, beside the formula
ulysses     DeepSpeed-Ulysses per rank: all-to-alls from sequence shards to head shards and back
gspmd       the same as GSPMD programs on torch_xla (imported after ``runtime.setup()``): all-gather CP, the SPMD
            ring (K/V stacked on a `context` axis, shifted by slice + concatenate; unrolled or inside scan) and
            Ulysses (re-annotation from sequence- to head-sharded)
case        the cases the harness runs through the four views (formula, ledger, XLA:CPU, XLA:TPU)
solutions   reference solutions of the notebook's exercises
"""
