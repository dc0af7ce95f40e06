"""shardlab.context — context parallelism: attention over a sequence split across cp ranks.

attention   the dense oracle (PyTorch's scaled_dot_product_attention) and its einsum form, sequence layouts
            (contiguous, zig-zag), causal block kinds, the online-softmax state and FlashAttention's block backward
ring        ring attention per rank over a `shardlab.comm.Comm` (send / recv): forward and a hand-written
            backward that rings too; the blocks each rank computed (causal balance)
balance     causal balance: work per rank counted from the ring's trace, contiguous vs zig-zag, beside the formula
ulysses     DeepSpeed-Ulysses per rank: all-to-alls from sequence shards to head shards and back
gspmd       the same as GSPMD programs on torch_xla (imports torch_xla lazily): all-gather CP (q, k, v sharded
            on the sequence), the SPMD ring (K/V stacked on a `context` axis, shifted by slice + concatenate;
            unrolled or inside scan) and Ulysses (re-annotation from sequence- to head-sharded)
"""

from shardlab.context.attention import (
    LAYOUTS,
    SoftmaxState,
    block_backward,
    block_kind,
    chunk_ids,
    dense_attention,
    reference_attention,
    shard_sequence,
    unshard_sequence,
)
from shardlab.context.balance import measure as measure_balance
from shardlab.context.balance import work_from_trace
from shardlab.context.ring import Block, RingAttention, ring_attention, ring_attention_step
from shardlab.context.ulysses import ulysses_attention, ulysses_step

__all__ = [
    "LAYOUTS",
    "Block",
    "RingAttention",
    "SoftmaxState",
    "block_backward",
    "block_kind",
    "measure_balance",
    "chunk_ids",
    "dense_attention",
    "reference_attention",
    "ring_attention",
    "ring_attention_step",
    "shard_sequence",
    "ulysses_attention",
    "ulysses_step",
    "unshard_sequence",
    "work_from_trace",
]
