"""shardlab.fsdp — Fully Sharded Data Parallelism three ways.

    flat_param  pure shard math of PyTorch FSDP1's FlatParamHandle (plan_flat_shards, plan_flat_shards_for)
    unit        FlatUnit: a FULL_SHARD flat-parameter unit over a shardlab.comm Comm (+ ShardSGD / ShardAdam)
    train       per-rank FSDP training program and its unsharded full-batch oracle
    gspmd       per-parameter (dim-0) FSDP under XLA SPMD, collectives read from the partitioned HLO
    torch_ref   PyTorch's own FSDP1 / FSDP2 as per-rank programs for DistributedWorld (gloo); FlatParamHandle
    views       the notebooks' four views: formula / ledger of flat units, formula / CPU HLO / TPU of the
                per-parameter step, PyTorch FSDP1 / FSDP2 against the ledger

Formulas live in shardlab.formulas.fsdp (flat step, per-rank memory, per-parameter step) and
shardlab.formulas.zero (ZeRO).
"""
