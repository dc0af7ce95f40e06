"""shardlab.expert — expert parallelism: a top-k routed MoE layer split over ep ranks by expert.

moe        the layer (router, capacity with token dropping, dropless variant, SwiGLU experts), the dense oracle
           (loops over experts) and GShard's dispatch / combine tensors
parallel   per rank over a `shardlab.comm.Comm`: dispatch and combine all-to-alls (differentiable)
drops      tokens dropped vs capacity factor: measured, from the router's loads, under uniform routing
gspmd      GShard's dispatch / combine einsums with experts sharded on an `expert` mesh axis (imports torch_xla
           lazily)
"""

from shardlab.expert.drops import drop_table
from shardlab.expert.moe import (
    Dispatch,
    MoE,
    MoEConfig,
    Reference,
    Routing,
    dispatch_tensors,
    expert_ffn,
    moe_reference,
    route_loop,
    router_probs,
    top_k_gates,
)
from shardlab.expert.parallel import all_to_all, expert_parallel_moe, expert_range, moe_step

__all__ = [
    "Dispatch",
    "MoE",
    "MoEConfig",
    "Reference",
    "Routing",
    "all_to_all",
    "dispatch_tensors",
    "drop_table",
    "expert_ffn",
    "expert_parallel_moe",
    "expert_range",
    "moe_reference",
    "moe_step",
    "route_loop",
    "router_probs",
    "top_k_gates",
]
