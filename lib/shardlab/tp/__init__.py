"""shardlab.tp — Megatron tensor parallelism written per rank over a `shardlab.comm.Comm`.

mappings       f, g, gather / scatter and the sequence-parallel pair (g_sp, gbar_sp) as autograd functions
layers         ColumnParallelLinear, RowParallelLinear, ParallelMLP, ParallelAttention, ParallelTransformerBlock,
               VocabParallelEmbedding, vocab_range — each with `from_dense(module, comm)`
cross_entropy  vocab_parallel_cross_entropy (b*s all-reduces) and the gathered-logits baseline
programs       per-rank step functions runnable in SimulatedWorld and DistributedWorld
gspmd          the same layers as GSPMD shardings of the dense modules (the compiler views)
case           the cases of notebooks 02-04 (MLP, attention, layer, embedding, cross-entropy) for the harness
"""

from shardlab.tp.cross_entropy import gathered_cross_entropy, vocab_parallel_cross_entropy
from shardlab.tp.layers import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    ParallelTransformerBlock,
    RowParallelLinear,
    VocabParallelEmbedding,
    divide,
    vocab_range,
)
from shardlab.tp.mappings import (
    copy_to_tp_region,
    f,
    g,
    gather_from_sp_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    reduce_scatter_to_sp_region,
    scatter_to_tp_region,
)

__all__ = [
    "ColumnParallelLinear",
    "ParallelAttention",
    "ParallelMLP",
    "ParallelTransformerBlock",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "copy_to_tp_region",
    "divide",
    "f",
    "g",
    "gather_from_sp_region",
    "gather_from_tp_region",
    "gathered_cross_entropy",
    "reduce_from_tp_region",
    "reduce_scatter_to_sp_region",
    "scatter_to_tp_region",
    "vocab_parallel_cross_entropy",
    "vocab_range",
]
