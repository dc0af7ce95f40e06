"""shardlab.formulas — the *formula* view: every analytic prediction as a plain function of sizes.

Each submodule is plain arithmetic (no torch, no XLA) and returns named terms, so a notebook can put each
term next to its measured counterpart (ledger, HLO). Units are bytes, FLOPs, elements or seconds, as named.

Submodules and what they predict:

    common       dtype sizes; payload vs ring-wire bytes of each collective
    blocks       block-matrix partitioning algebra: shard shapes and which blocks each device holds
    tp           Megatron tensor parallelism: the f / g collectives of column- and row-parallel layers,
                 MLP / attention / vocab-parallel embedding + cross-entropy communication per step
    zero         ZeRO model-state memory per stage (Rajbhandari et al. 2020, Fig. 1 / Table 1), DP/ZeRO
                 communication per step, flat-parameter padding waste
    fsdp         FSDP flat-parameter units: all-gather / reduce-scatter payloads per step, per-rank memory
    scan         stacked-layer scan: stacked gradient bytes per device with 1-D vs 2-D sharding (the
                 Llama 3.1 405B / v6e-256 [126, 4K, 16K] case), placeholder host→device transfers
    activations  activation memory per layer (Korthikanti et al. 2022): sbh(34 + 5as/h), with TP, sequence
                 parallelism, selective and full recompute
    flops        training FLOPs per step: 72·B·L·s·h²(1 + s/(6h) + V/(12hL)) and recompute variants, a
                 term-by-term count for GQA / SwiGLU blocks, MFU
    memory       parameter counts, Megatron vocabulary padding, per-device params / grads / optimizer state
                 on a (data, fsdp, tensor) mesh (composes zero + flat-param padding)
    hardware     TPU chip profiles from data/hardware/*.json (HBM, bf16 peak, ICI), slice topologies,
                 roofline step time and communication / compute ratio

`shardlab.planner` composes them into a per-chip plan for a model on a TPU slice.
"""
