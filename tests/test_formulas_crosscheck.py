"""Cross-check: every formula that has a small-scale measurement in notebooks 02–06, evaluated at that
notebook's DEFAULT sizes (read from its `parameters` cell), against a measurement made here, independently of
the notebook run: the partitioned HLO (`capture_hlo`) or the per-rank ledger (`SimulatedWorld`).

Why exact: every quantity is a count or a byte size fixed by shapes and dtypes (structural), so formula and
measurement must be equal, not close. A notebook whose source has not landed yet is skipped with the reason.

    notebook                 formula                                   measured by
    02 Megatron MLP          tp.mlp_all_reduce (fwd, fwd+bwd)          HLO of tp.gspmd.shard_mlp
    03 Megatron attention    tp.attention_all_reduce                   tp.views.compiler(AttentionConfig)
    03 (transformer layer)   planner TP layer term = tp.transformer_   tp.views.compiler(TransformerLayerConfig)
                             layer_all_reduce
    04 embedding + CE        tp.embedding_all_reduce,                  tp.views.compiler(EmbeddingConfig /
                             tp.vocab_parallel_ce, tp.gathered_logits,   CrossEntropyConfig), the notebook's
                             tp.ce_logits_bytes                          own views
    05 FSDP flat params      FlatCase.formula: flat_step_comm, zero    harness.ledger(FlatCase): FlatUnit
                             (root unit, nested)                       per rank; + zero.zero_comm,
                                                                       memory.model_state_bytes (stage 3 + pad)
    05 (sizes)               zero.zero_comm stage 0 (DP all-reduce)    HLO of a batch-sharded MLP
    05b per-parameter FSDP   GspmdCase.formula("cpu")                  harness.hlo(GspmdCase): HLO
    06 scan + shard_as       scan.shard_as_saving (1-D / 2-D bytes)    compiler-assigned gradient shardings
"""

from __future__ import annotations

import dataclasses
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
def _tp_setup(xla_world: Any, p: dict[str, Any]) -> tuple[Any, Any, Any]:  # 02 (the exemplar's own test)
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
    target = torch.randn(p["batch"], p["seq"], p["hidden"], dtype=dt).to(dev)  # the step's loss ½‖out − target‖²
    for backward, args in ((False, (mlp, x)), (True, (mlp, x, target))):
        m = capture_hlo(gspmd.step, *args).module
        f = ftp.mlp_all_reduce(p["batch"], p["seq"], p["hidden"], p["tp"], p["dtype"], backward=backward)
        assert m.count("all-reduce") == f["count"]
        assert m.bytes("all-reduce") == f["bytes"]
        assert all(c.group_size == p["tp"] for c in m.collectives)


def _tp_params(stem: str) -> Any:
    """The notebook's parameter dataclass at its defaults (read from its parameters cell)."""
    from shardlab.core.topics import notebook_params

    cls = notebook_params()[stem]
    d = notebook_defaults(stem)
    return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}}).validate()


def _hlo_view(view: Any) -> Any:
    if not view.ran:
        pytest.skip(f"compiler view skipped: {view.skipped}")
    bad = {n: d for n, (ok, d) in view.checks.items() if not ok}
    assert not bad, bad
    return view


@pytest.mark.xla
def test_03_transformer_layer_planner_term_vs_hlo(xla_world):
    from shardlab import planner as P
    from shardlab.core import harness
    from shardlab.tp.case import LayerCase

    p = _tp_params("03_megatron_attention")  # its transformer-layer section
    b, s, h, a, f, t = p.batch, p.seq, p.hidden, p.heads, p.ffn, p.tp
    cfg = P.ModelConfig("xcheck", layers=1, hidden=h, ffn=f, heads=a, kv_heads=a, vocab=1000, gated_mlp=False)
    plan = P.plan(P.PlanConfig(cfg, f"v5e-{t}", data=1, fsdp=1, tensor=t, global_batch=b, seq=s, recompute="none",
                               act_dtype=p.dtype))
    term = next(x for x in plan.comm if x.what.startswith("layer all-reduces"))
    assert (term.count, term.count * term.payload_bytes) == tuple(
        ftp.transformer_layer_all_reduce(b, s, h, t, p.dtype).values())
    view = _hlo_view(harness.hlo(LayerCase(p)))  # the notebook's own view
    m = view.detail.module
    assert view["fwd_bwd.all_reduce.count"] == m.count("all-reduce") == term.count
    assert view["fwd_bwd.all_reduce.bytes"] == term.count * term.payload_bytes
    # the compiled all-reduces' wire bytes walked along the ring schedule (blocks.ring), not by the formula's factor
    from shardlab.tp.case import wire_counted

    assert wire_counted(view, "all_reduce") == pytest.approx(term.wire_bytes, rel=1e-12)


@pytest.mark.xla
def test_03_attention_all_reduces_vs_hlo(xla_world):
    from shardlab.core import harness
    from shardlab.tp.case import AttentionCase

    p = _tp_params("03_megatron_attention")
    for backward in (False, True):
        view = _hlo_view(harness.hlo(AttentionCase(p, backward=backward)))
        f = ftp.attention_all_reduce(p.batch, p.seq, p.hidden, p.tp, p.dtype, backward=backward)
        ph = "fwd_bwd" if backward else "fwd"
        assert (view[f"{ph}.all_reduce.count"], view[f"{ph}.all_reduce.bytes"]) == (f["count"], f["bytes"])
        m = view.detail.module  # and straight from the parsed module
        assert (m.count("all-reduce"), m.bytes("all-reduce")) == (f["count"], f["bytes"])


@pytest.mark.xla
def test_04_embedding_and_vocab_parallel_ce_vs_hlo(xla_world):
    from shardlab.core import harness
    from shardlab.tp.case import CrossEntropyCase, EmbeddingCase

    p = _tp_params("04_vocab_parallel_embedding_ce")
    b, s, h, V, t = p.batch, p.seq, p.hidden, p.vocab, p.tp
    emb = _hlo_view(harness.hlo(EmbeddingCase(p)))  # forward: one all-reduce of [b, s, h]
    f = ftp.embedding_all_reduce(b, s, h, t, p.dtype)
    assert (emb.detail.module.count("all-reduce"), emb.detail.module.bytes("all-reduce")) == (f["count"], f["bytes"])
    vp = _hlo_view(harness.hlo(CrossEntropyCase(p, method="vocab_parallel")))
    f = ftp.vocab_parallel_ce(b, s, t, p.dtype)
    assert (vp.detail.module.count("all-reduce"), vp.detail.module.bytes("all-reduce")) == (f["count"], f["bytes"])
    ga = _hlo_view(harness.hlo(CrossEntropyCase(p, method="gather")))
    f = ftp.gathered_logits(b, s, V, t, p.dtype)
    assert (ga.detail.module.count("all-gather"), ga.detail.module.bytes("all-gather")) == (f["count"], f["bytes"])
    hlo_wire = sum(wire_bytes("all-gather", c.operand_bytes, c.group_size) for c in ga.detail.module.collectives
                   if c.op == "all-gather")
    assert hlo_wire == pytest.approx(f["wire_bytes"], rel=1e-12)
    mem = ftp.ce_logits_bytes(b, s, V, t, p.dtype)  # the largest array of each program, in elements
    assert vp["vocab_parallel.largest_array.elements"] * dtype_bytes(p.dtype) == mem["vocab_parallel"]
    assert ga["gather_logits.largest_array.elements"] * dtype_bytes(p.dtype) == mem["gathered"]


# --------------------------------------------------------------------------------------------- FSDP (05)
def test_05_flat_unit_comm_and_memory_vs_ledger():
    """The notebook's own views at its defaults (root unit, then nested), plus two relations the views do not
    use: ZeRO-3's communication volume and the planner's model-state composition."""
    from shardlab.core import harness
    from shardlab.fsdp.train import FlatCase

    p = dataclasses.replace(_tp_params("05_fsdp_flat_params"), steps=1)  # the notebook's defaults, one step
    w = p.world_size
    for nested in (False, True):
        case = FlatCase(p, nested=nested)
        f, led = harness.formula(case), harness.ledger(case)
        rows = harness.compare([f, led])
        assert all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]
        assert all(ok for ok, _ in led.checks.values()), led.checks
    led = harness.ledger(FlatCase(p))
    numel, padded = led["flat.numel"], led["flat.padded_numel"]
    # ZeRO-3 volume 3·(W-1)/W·P less the backward all-gather the root unit skips: (W-1)/W·P (P padded)
    zc = fzero.zero_comm(padded, w, 3, exact=True)
    assert led["step.wire.bytes"] == pytest.approx((zc.total - zc.all_gather / 2) * 4, rel=1e-12)
    # persistent model state per rank (fp32 param + grad shards, Adam m and v) = the planner's composition
    formula = fmem.model_state_bytes(numel, fsdp=w, stage=3, param_bytes=4, grad_bytes=4, k=8, flat_units=[numel])
    assert led["memory.per_rank.bytes"] == formula.total
    assert led.detail["ranks"][0].persistent_bytes["param_shard"] == padded // w * 4
    assert ffsdp.flat_step_comm(numel, w, root=True).reduce_scatter_payload_bytes == padded * 4


@pytest.mark.xla
def test_05b_per_parameter_step_vs_hlo(xla_world):
    from shardlab.core import harness
    from shardlab.fsdp.case import GspmdCase

    p = _tp_params("05b_fsdp_gspmd")
    if xla_world.num_devices % p.world_size:
        pytest.skip(f"world_size={p.world_size} does not tile the {xla_world.num_devices}-device world")
    case = GspmdCase(p)
    f, h = case.formula("cpu"), harness.hlo(case)
    assert not h.differs and all(r["agree"] for r in harness.compare([f, h]))
    assert all(ok for ok, _ in h.checks.values()), h.checks


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
    """The notebook's own view functions at its defaults: the formula view's stacked-gradient bytes, per-device shapes
    and fsdp reductions equal the CPU compiler's; and the formula itself equals shard_as_saving's bytes."""
    from shardlab.core import harness
    from shardlab.formulas import scan as fscan
    from shardlab.xla_scan import case as C
    from shardlab.xla_scan import measure as X
    from shardlab.xla_scan.model import weight_shapes
    from shardlab.xla_scan.params import ScanParams

    p = ScanParams(**{k: v for k, v in notebook_defaults("06_scan_shard_as").items() if k != "answers"})
    try:  # shard_as (every SPMD scan backward) needs jax + torchax (+ flax)
        X.require_shard_as_deps()
    except RuntimeError as e:
        pytest.skip(f"scan backward dependencies missing: {e}")
    if p.mesh_fsdp * p.mesh_tensor != xla_world.num_devices:
        pytest.skip("mesh does not tile the device world")
    for flag in (True, False):
        case = C.ScanCase(p, p.layers, shard_as=flag)  # the notebook's views (L = layers)
        formula, hlo = harness.formula(case), harness.hlo(case)
        for name in formula.values:
            assert hlo[name] == formula[name], (flag, name)
        saving = fscan.shard_as_saving(case.layers, list(weight_shapes(p.hidden, p.ffn).values()), p.mesh_fsdp,
                                       p.mesh_tensor)
        assert formula["stacked_grads.bytes"] == (saving.on_bytes if flag else saving.off_bytes)
    assert dtype_bytes(case.dtype) == 4
