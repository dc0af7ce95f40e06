"""shardlab.fsdp — Fully Sharded Data Parallelism three ways.

    flat_param  pure shard math of PyTorch FSDP1's FlatParamHandle (plan_flat_shards, plan_flat_shards_for)
    unit        FlatUnit: a FULL_SHARD flat-parameter unit over a shardlab.comm Comm (+ ShardSGD / ShardAdam)
    train       FlatCase (notebook 05): the per-rank FSDP training program, its unsharded oracle, the formula
    gspmd       per-parameter (dim-0) FSDP under XLA SPMD: the step's two graphs, collectives classified
    torch_ref   PyTorch's own FSDP1 / FSDP2 as per-rank programs for DistributedWorld (gloo); FlatParamHandle
    case        GspmdCase (notebook 05b) through the harness, PyTorch FSDP1 / FSDP2 against a FlatCase's ledger,
                the notebooks' tables

Formulas live in shardlab.formulas.fsdp (flat step, per-rank memory, per-parameter step) and
shardlab.formulas.zero (ZeRO).
"""
