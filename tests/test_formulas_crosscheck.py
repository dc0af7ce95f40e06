"""Cross-check: every formula that has a small-scale measurement in notebooks 02–06, evaluated at that
notebook's DEFAULT sizes (read from its `parameters` cell), against a measurement made here, independently of
the notebook run: the partitioned HLO (`capture_hlo`) or the per-rank ledger (`SimulatedWorld`).

Why exact: every quantity is a count or a byte size fixed by shapes and dtypes (structural), so formula and
measurement must be equal, not close. A notebook whose source has not landed yet is skipped with the reason.

    notebook                 formula                                   measured by
    02 Megatron MLP          tp.mlp_all_reduce (fwd, fwd+bwd)          HLO of tp.gspmd.shard_mlp
    03 Megatron attention    tp.attention_all_reduce                   HLO of tp.gspmd.shard_attention
    03 (transformer layer)   planner TP layer term = tp.transformer_   HLO of a sharded models.TransformerBlock
                             layer_all_reduce
    04 embedding + CE        tp.embedding_all_reduce,                  HLO of shard_embedding / vocab_parallel_ce
                             tp.vocab_parallel_ce
    05 FSDP flat params      fsdp.flat_step_comm, zero.padded_numel,   ledger of fsdp.train.fsdp_rank_program;
                             memory.model_state_bytes (stage 3 + pad)  the unit's persistent tensor bytes
    05 (sizes)               zero.zero_comm stage 0 (DP all-reduce)    HLO of a batch-sharded MLP
    06 scan + shard_as       scan.shard_as_saving (1-D / 2-D bytes)    compiler-assigned gradient shardings
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas import memory as fmem
from shardlab.formulas import tp as ftp
from shardlab.formulas import zero as fzero
from shardlab.formulas.common import dtype_bytes, wire_bytes
from shardlab.report.notebooks import read_parameters

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def notebook_defaults(stem: str) -> dict[str, Any]:
    """Plain values of the notebook's parameters cell, read the way the report reads them; skip if not built."""
    path = NOTEBOOKS / f"{stem}.ipynb"
    if not path.exists():
        pytest.skip(f"notebooks/{stem}.ipynb has not landed yet")
    params, error = read_parameters(path)
    assert error is None, error
    return params


def test_defaults_parser_reads_the_parameters_cell():
    d = notebook_defaults("07_planner")  # our own notebook: known values
    assert d["num_devices"] == 8 and d["model"] == "llama-3-8b" and d["fsdp"] == 8


# --------------------------------------------------------------------------------------------- TP (02-04)
def _tp_setup(xla_world: Any, p: dict[str, Any]) -> tuple[Any, Any, Any]:
    import torch

    from shardlab import runtime
    from shardlab.tp import gspmd

    if xla_world.num_devices % p["tp"]:
        pytest.skip(f"tp={p['tp']} does not divide the {xla_world.num_devices}-device world")
    return torch, runtime.device(), gspmd.tensor_mesh(p["tp"])


@pytest.mark.xla
def test_02_mlp_all_reduces_vs_hlo(xla_world):
    from shardlab import models
    from shardlab.profile import capture_hlo
    from shardlab.tp import gspmd

    p = notebook_defaults("02_megatron_mlp")
    torch, dev, mesh = _tp_setup(xla_world, p)
    dt = getattr(torch, p["dtype"])
    torch.manual_seed(p["seed"])
    mlp = gspmd.shard_mlp(models.MLP(p["hidden"], p["ffn"]).to(dt).to(dev), mesh)
    x = torch.randn(p["batch"], p["seq"], p["hidden"], dtype=dt).to(dev)  # [b, s, h] replicated
    g = torch.randn(p["batch"], p["seq"], p["hidden"], dtype=dt).to(dev)
    for backward, args in ((False, (mlp, x)), (True, (mlp, x, g))):
        m = capture_hlo(gspmd.step, *args).module
        f = ftp.mlp_all_reduce(p["batch"], p["seq"], p["hidden"], p["tp"], p["dtype"], backward=backward)
        assert m.count("all-reduce") == f["count"]
        assert m.bytes("all-reduce") == f["bytes"]
        assert all(c.group_size == p["tp"] for c in m.collectives)


@pytest.mark.xla
def test_03_transformer_layer_planner_term_vs_hlo(xla_world):
    from shardlab import models
    from shardlab import planner as P
    from shardlab.profile import capture_hlo
    from shardlab.tp import gspmd

    p = notebook_defaults("03_megatron_attention")  # its transformer-layer section
    torch, dev, mesh = _tp_setup(xla_world, p)
    b, s, h, a, f, t = p["batch"], p["seq"], p["hidden"], p["heads"], p["ffn"], p["tp"]
    cfg = P.ModelConfig("xcheck", layers=1, hidden=h, ffn=f, heads=a, kv_heads=a, vocab=p["vocab"], gated_mlp=False)
    dt = getattr(torch, p["dtype"])
    plan = P.plan(P.PlanConfig(cfg, f"v5e-{t}", data=1, fsdp=1, tensor=t, global_batch=b, seq=s, recompute="none",
                               act_dtype=p["dtype"]))
    term = next(x for x in plan.comm if x.what.startswith("layer all-reduces"))
    assert (term.count, term.count * term.payload_bytes) == tuple(
        ftp.transformer_layer_all_reduce(b, s, h, t, p["dtype"]).values())
    torch.manual_seed(p["seed"])
    blk = models.TransformerBlock(h, a, f).to(dt).to(dev)
    gspmd.shard_attention(blk.attn, mesh)
    gspmd.shard_mlp(blk.mlp, mesh)
    x, g = torch.randn(b, s, h, dtype=dt).to(dev), torch.randn(b, s, h, dtype=dt).to(dev)
    m = capture_hlo(gspmd.step, blk, x, g).module
    assert m.count("all-reduce") == term.count
    assert m.bytes("all-reduce") == term.count * term.payload_bytes
    hlo_wire = sum(wire_bytes("all-reduce", c.operand_bytes, c.group_size) for c in m.collectives)
    assert hlo_wire == pytest.approx(term.wire_bytes, rel=1e-12)


@pytest.mark.xla
def test_03_attention_all_reduces_vs_hlo(xla_world):
    from shardlab import models
    from shardlab.profile import capture_hlo
    from shardlab.tp import gspmd

    p = notebook_defaults("03_megatron_attention")
    torch, dev, mesh = _tp_setup(xla_world, p)
    torch.manual_seed(p.get("seed", 0))
    dt = getattr(torch, p["dtype"])
    attn = gspmd.shard_attention(models.Attention(p["hidden"], p["heads"]).to(dt).to(dev), mesh)
    x = torch.randn(p["batch"], p["seq"], p["hidden"], dtype=dt).to(dev)
    g = torch.randn(p["batch"], p["seq"], p["hidden"], dtype=dt).to(dev)
    m = capture_hlo(gspmd.step, attn, x, g).module
    f = ftp.attention_all_reduce(p["batch"], p["seq"], p["hidden"], p["tp"], p["dtype"], backward=True)
    assert (m.count("all-reduce"), m.bytes("all-reduce")) == (f["count"], f["bytes"])


@pytest.mark.xla
def test_04_embedding_and_vocab_parallel_ce_vs_hlo(xla_world):
    from shardlab import models
    from shardlab.profile import capture_hlo
    from shardlab.tp import gspmd

    p = notebook_defaults("04_vocab_parallel_embedding_ce")
    torch, dev, mesh = _tp_setup(xla_world, p)
    b, s, h, V, t = p["batch"], p["seq"], p["hidden"], p["vocab"], p["tp"]
    torch.manual_seed(p.get("seed", 0))
    emb = gspmd.shard_embedding(models.Embedding(V, h).to(dev), mesh)
    ids = torch.randint(0, V, (b, s)).to(dev)
    m = capture_hlo(lambda: emb(ids)).module  # forward: one all-reduce of [b, s, h]
    f = ftp.embedding_all_reduce(b, s, h, t, "float32")
    assert (m.count("all-reduce"), m.bytes("all-reduce")) == (f["count"], f["bytes"])
    logits = gspmd.shard_logits(torch.randn(b, s, V).to(dev), mesh)  # [b, s, V/t] per device
    target = torch.randint(0, V, (b, s)).to(dev)
    m = capture_hlo(lambda: gspmd.vocab_parallel_ce(logits, target)).module
    f = ftp.vocab_parallel_ce(b, s, t, "float32")
    assert (m.count("all-reduce"), m.bytes("all-reduce")) == (f["count"], f["bytes"])


# --------------------------------------------------------------------------------------------- FSDP (05)
def _fsdp_cfg(p: dict[str, Any]) -> Any:
    from shardlab.fsdp.train import TrainConfig

    return TrainConfig(layer_sizes=tuple(p["layer_sizes"]), batch=p["batch"], steps=1, optimizer="adam",
                       use_orig_params=p["align"], seed=p["seed"])


def test_05_flat_unit_comm_and_memory_vs_ledger():
    from shardlab.comm import SimulatedWorld
    from shardlab.fsdp.train import fsdp_rank_program

    p = notebook_defaults("05_fsdp_flat_params")
    w, sizes = p["world_size"], p["layer_sizes"]
    if p["align"]:
        pytest.skip("alignment padding default: numel needs the alignment plan, not the bare parameter count")
    numel = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:], strict=True))  # Linear weights + biases
    sim = SimulatedWorld(w)
    results = sim.run(fsdp_rank_program, _fsdp_cfg(p))
    led = sim.ledger
    f = ffsdp.flat_step_comm(numel, w, elem_bytes=4)
    assert led.count("all_gather") == f.all_gather_count
    assert led.payload_bytes("all_gather") == f.all_gather_bytes
    assert led.count("reduce_scatter") == f.reduce_scatter_count
    assert led.payload_bytes("reduce_scatter") == f.reduce_scatter_bytes
    assert led.wire_bytes() == pytest.approx(f.wire_bytes(w), rel=1e-12)
    # ZeRO-3 volume: 3·(W-1)/W·P elements per rank (P padded), as zero_comm(exact=True) says
    padded = fzero.padded_numel(numel, w)
    assert led.wire_bytes() == pytest.approx(fzero.zero_comm(padded, w, 3, exact=True).total * 4, rel=1e-12)
    # persistent model state per rank (fp32 param + grad shards, Adam m and v) = the planner's composition
    measured = results[0].persistent_bytes
    formula = fmem.model_state_bytes(numel, fsdp=w, stage=3, param_bytes=4, grad_bytes=4, k=8, flat_units=[numel])
    assert sum(measured.values()) == formula.total
    assert measured["param_shard"] == padded // w * 4


@pytest.mark.xla
def test_05_sizes_data_parallel_all_reduce_vs_hlo(xla_world):
    import torch
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime
    from shardlab.profile import capture_hlo

    p = notebook_defaults("05_fsdp_flat_params")
    n = xla_world.num_devices
    sizes, batch = p["layer_sizes"], p["batch"]
    if batch % n:
        pytest.skip(f"batch={batch} does not split over {n} devices")
    dev = runtime.device()
    mesh = runtime.mesh((n,), ("data",))
    torch.manual_seed(p["seed"])
    ws = [torch.randn(i, o).to(dev) for i, o in zip(sizes[:-1], sizes[1:], strict=True)]  # [in, out] each
    for w_ in ws:
        xs.mark_sharding(w_, mesh, (None, None))
        w_.requires_grad_(True)
    x = torch.randn(batch, sizes[0]).to(dev)
    xs.mark_sharding(x, mesh, ("data", None))  # x[I_data, :]

    def step():
        y = x
        for i, w_ in enumerate(ws):
            y = y @ w_  # [B/n, in] @ [in, out]
            y = torch.tanh(y) if i < len(ws) - 1 else y
        return torch.autograd.grad(y.square().sum(), ws)

    m = capture_hlo(step).module
    psi = sum(i * o for i, o in zip(sizes[:-1], sizes[1:], strict=True))
    assert m.bytes("all-reduce") == fmem.model_state_bytes(psi, stage=0, grad_bytes=4).grads
    hlo_wire = sum(wire_bytes("all-reduce", c.operand_bytes, c.group_size) for c in m.collectives
                   if c.op == "all-reduce")
    assert hlo_wire == pytest.approx(fzero.zero_comm(psi, n, 0, exact=True).all_reduce * 4, rel=1e-12)


# --------------------------------------------------------------------------------------------- scan (06)
@pytest.mark.xla
@pytest.mark.slow
def test_06_stacked_gradient_bytes_1d_vs_2d(xla_world):
    from shardlab.formulas import scan as fscan
    from shardlab.xla_scan import measure as X
    from shardlab.xla_scan import model as M

    p = notebook_defaults("06_scan_shard_as")
    try:  # shard_as (every SPMD scan backward) needs jax + torchax (+ flax), xla-notes.md
        X.require_shard_as_deps()
    except RuntimeError as e:
        pytest.skip(f"scan backward dependencies missing: {e}")
    if p["mesh_fsdp"] * p["mesh_tensor"] != xla_world.num_devices:
        pytest.skip("mesh does not tile the device world")
    cfg = M.StackConfig(max(p["layers_sweep"]), p["hidden"], p["ffn"], p["batch"], p["seq"])
    formula = fscan.shard_as_saving(cfg.layers, list(cfg.weight_shapes.values()), p["mesh_fsdp"], p["mesh_tensor"],
                                    dtype=str(cfg.dtype))
    on = X.measure_step(cfg, "scan", p["mesh_fsdp"], p["mesh_tensor"], p["seed"], shard_as=True)
    off = X.measure_step(cfg, "scan", p["mesh_fsdp"], p["mesh_tensor"], p["seed"], shard_as=False)
    assert sum(on.grad_bytes.values()) == formula.on_bytes
    assert sum(off.grad_bytes.values()) == formula.off_bytes
    assert dtype_bytes(cfg.dtype) == 4
