"""shardlab.formulas — the *formula* view: every analytic prediction as a plain function of sizes.

Each submodule is plain arithmetic (no torch, no XLA) and returns named terms, so a notebook can put each
term next to its measured counterpart (ledger, HLO). Units are bytes, FLOPs, elements or seconds, as named.

Submodules and what they predict:

    common       ceil_div, recompute policies, dtype sizes (shardlab.dtypes); payload vs ring-wire bytes
    blocks       block-matrix partitioning algebra: shard shapes and which blocks each device holds
    tp           Megatron tensor parallelism: the f / g collectives of column- and row-parallel layers,
                 MLP / attention / vocab-parallel embedding + cross-entropy communication per step
    zero         ZeRO model-state memory per stage (Rajbhandari et al. 2020, Fig. 1 / Table 1), DP/ZeRO
                 communication per step, flat-parameter padding waste
    fsdp         FSDP flat-parameter units (root and non-root): all-gather / reduce-scatter payloads per step,
                 per-rank memory; per-parameter FSDP (FSDP2 / GSPMD dim 0) as XLA's partitioner emits it
    scan         stacked-layer scan: stacked gradient bytes per device with 1-D vs 2-D sharding (the
                 Llama 3.1 405B / v6e-256 [126, 4K, 16K] case), placeholder host→device transfers
    activations  activation memory per layer: the paper's GPT block sbh(34 + 5as/h) (Korthikanti et al. 2022)
                 and Llama blocks (GQA, SwiGLU, flash attention), with TP, sequence parallelism, recompute
    flops        training FLOPs per step: 72·B·L·s·h²(1 + s/(6h) + V/(12hL)), recompute variants (the paper's
                 selective-recompute line and a forward-only count), a term-by-term count for GQA / SwiGLU
                 blocks, MFU
    memory       parameter counts, Megatron vocabulary padding, per-device params / grads / optimizer state
                 on a (data, fsdp, tensor) mesh (composes zero + flat-param padding)
    hardware     TPU chip profiles from data/hardware/*.json (published and compiler-usable HBM, bf16 peak, ICI),
                 slice topologies, roofline step time and communication / compute ratio
    pipeline     pipeline parallelism: bubble ratio (Narayanan et al. 2021) vs idle fraction (GPipe), in-flight
                 microbatches, point-to-point traffic, step time
    context      context parallelism: ring / all-gather / Ulysses bytes, per-rank score memory, causal work
    expert       expert parallelism: capacity, dispatch / combine all-to-all bytes, expert weights, dropped tokens

`shardlab.planner` composes them into a per-chip plan for a model on a TPU slice.
"""
