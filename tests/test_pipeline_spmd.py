"""The SPMD (circular) pipeline on torch_xla: outputs and gradients against the dense layer-by-layer oracle, the
loop's trip count against v m + p - 1 and the bubble formula, the collective-permute of one shard per iteration,
how the shift is written (cat / pad vs roll vs a concatenated zeros block), a 2-D stage x fsdp mesh, and
XLA:TPU's program (compile-only): the permutes asynchronous.

Tolerance: float32; the pipeline runs the same matmuls on the same rows as the oracle, only the einsum's
batching differs (an [p, mb, h] x [p, h, h] batch vs one [m, mb, h] x [h, h] matmul): outputs within 1e-5,
gradients within 1e-5 of their largest entry (measured ~1e-6 and ~3e-7)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from shardlab.formulas.pipeline import idle_fraction
from shardlab.pipeline.spmd import SpmdPipeline, build_graph, dense_forward, init, pipeline_loss, read_program

F32 = 4


def _capture(cfg: SpmdPipeline):
    from shardlab.profile import capture_hlo

    cap = capture_hlo(build_graph, cfg)
    return cap, read_program(cap.module)


def _check_parity(cfg: SpmdPipeline, result) -> None:
    x, w = init(cfg)
    if cfg.backward:
        x.requires_grad_(True)
        w.requires_grad_(True)
    ref = dense_forward(x, w)
    torch.testing.assert_close(result[0].cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    if cfg.backward:
        gx, gw = torch.autograd.grad(pipeline_loss(ref), (x, w))
        for got, want in ((result[2], gx), (result[3], gw)):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.xla
def test_gpipe_forward_and_backward_equal_the_dense_model(xla_world) -> None:
    cfg = SpmdPipeline(p=8, m=8, shift="pad")
    cap, got = _capture(cfg)
    _check_parity(cfg, cap.result)
    T = cfg.m + cfg.p - 1
    assert got["trip_counts"] == [T, T]  # the forward loop and autograd's reversed loop
    assert (T - cfg.m) / T == pytest.approx(idle_fraction(cfg.p, cfg.m))  # bubble iterations = the formula
    shard = cfg.micro_batch * cfg.hidden * F32  # one [1, mb, h] slot per device
    assert got["collective_permute.bytes_per_iteration"] == [shard, shard]  # one forward, one backward
    assert got["collective_permute.pairs"] == [cfg.p - 1, cfg.p - 1]  # s -> s + 1, and back
    in_loop = 2 * T  # every iteration, bubble included
    assert got["collective_permute.step_count"] - (got["collective_permute.count"] - 2) == in_loop


@pytest.mark.xla
@pytest.mark.parametrize("shift", ["cat", "pad", "roll", "cat_zeros"])
def test_how_the_shift_is_written_decides_the_collective(xla_world, shift: str) -> None:
    cfg = SpmdPipeline(p=8, m=8, shift=shift, backward=False)
    cap, got = _capture(cfg)
    _check_parity(cfg, cap.result)
    permutes_in_loop = got.get("collective_permute.in_loop", 0)
    if shift in ("cat", "pad"):  # one collective-permute of one shard: p pairs (cat is circular) or p - 1
        assert permutes_in_loop == 1
        assert got["collective_permute.pairs"] == [cfg.p if shift == "cat" else cfg.p - 1]
        assert got.get("all_to_all.in_loop", 0) == 0
    elif shift == "roll":  # two all-to-alls and an all-gather, no permute
        assert (permutes_in_loop, got["all_to_all.in_loop"], got["all_gather.in_loop"]) == (0, 2, 1)
    else:  # the same values as pad, written with a zeros block: the partitioner reshards with all-to-alls
        assert (permutes_in_loop, got["all_to_all.in_loop"]) == (0, 2)  # (3 for a lone shift outside a loop)


@pytest.mark.xla
@pytest.mark.parametrize("m", [8, 16])
def test_circular_pipeline_runs_v_m_plus_p_minus_1_iterations(xla_world, m: int) -> None:
    cfg = SpmdPipeline(p=8, m=m, v=2, backward=False)
    cap, got = _capture(cfg)
    _check_parity(cfg, cap.result)
    T = cfg.v * m + cfg.p - 1
    assert got["trip_counts"] == [T]
    assert (T - cfg.v * m) / T == pytest.approx(idle_fraction(cfg.p, m, cfg.v))
    assert got["collective_permute.pairs"] == [cfg.p]  # the last stage hands back to the first


@pytest.mark.xla
def test_stage_by_fsdp_mesh(xla_world) -> None:
    cfg = SpmdPipeline(p=4, m=4, fsdp=2, backward=False)
    cap, got = _capture(cfg)
    _check_parity(cfg, cap.result)
    assert got["collective_permute.bytes_per_iteration"] == [cfg.micro_batch // cfg.fsdp * cfg.hidden * F32]
    assert got["all_gather.in_loop"] == 1  # FSDP: each stage gathers its weight's fsdp shards every iteration
    assert got["trip_counts"] == [cfg.m + cfg.p - 1]


@pytest.mark.xla
def test_python_loop_unrolls_the_same_permutes(xla_world) -> None:
    cfg = SpmdPipeline(p=8, m=4, shift="pad", loop="python", backward=False)
    cap, got = _capture(cfg)
    _check_parity(cfg, cap.result)
    assert got["trip_counts"] == []
    shard = cfg.micro_batch * cfg.hidden * F32
    permutes = [c for c in cap.module.collectives if c.op == "collective-permute" and c.operand_bytes == shard]
    assert len(permutes) == cfg.m + cfg.p - 1


@pytest.mark.xla
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (the XLA:TPU compiler) not installed")
def test_xla_tpu_issues_the_permutes_asynchronously(xla_world) -> None:
    from shardlab.profile import tpu

    cfg = SpmdPipeline(p=8, m=8, shift="pad")
    res = tpu.compile_program(build_graph, cfg, "v5e:2x4")
    assert res.fits
    got = read_program(res.module)
    T = cfg.m + cfg.p - 1
    assert got["trip_counts"] == [T, T]
    loop_permutes = [c for c in res.module.collectives if c.op == "collective-permute" and c.in_while]
    assert len(loop_permutes) == 2 and all(c.form == "start-done" for c in loop_permutes)
    assert [c.operand_bytes for c in loop_permutes] == [cfg.micro_batch * cfg.hidden * F32] * 2


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="m=2 must be >= p=4"):
        SpmdPipeline(p=4, m=2, v=2)
    with pytest.raises(ValueError, match="shift='pad' drops the last stage's slot"):
        SpmdPipeline(p=4, m=4, v=2, shift="pad")
    with pytest.raises(ValueError, match="shift='rotate'"):
        SpmdPipeline(shift="rotate")
    with pytest.raises(ValueError, match="divisible by fsdp=3"):
        SpmdPipeline(micro_batch=8, fsdp=3)


@pytest.mark.xla
def test_ledger_sends_vs_compiler_permutes_on_the_same_model(xla_world) -> None:
    """The per-stage GPipe program on the same layers: same outputs' loss and weight gradients; its sends are
    the permutes' useful part — the SPMD loop also shifts during the p - 1 bubble iterations of each pass."""
    from shardlab.comm import SimulatedWorld
    from shardlab.formulas.pipeline import p2p_traffic
    from shardlab.pipeline.programs import merge_results, pipeline_program
    from shardlab.pipeline.schedules import build
    from shardlab.pipeline.spmd import microbatch_loss, stage_modules

    cfg = SpmdPipeline(p=8, m=8, shift="pad")
    cap, got = _capture(cfg)
    layers, names, boundary = stage_modules(cfg)
    x, _ = init(cfg)
    world = SimulatedWorld(cfg.p)
    results = world.run(pipeline_program, build("gpipe", cfg.p, cfg.m), layers, names, boundary,
                        x.flatten(0, 1), torch.zeros(cfg.m * cfg.micro_batch), microbatch_loss)
    loss, grads = merge_results(results)
    torch.testing.assert_close(loss, cap.result[1].cpu(), rtol=1e-5, atol=0)
    gw = cap.result[3].cpu()
    for s in range(cfg.p):
        torch.testing.assert_close(grads[f"w.0.{s}"], gw[0, s], rtol=1e-5, atol=1e-5 * gw.abs().max().item())

    sends = sum(led.count("send") for led in world.ledgers)
    message = cfg.micro_batch * cfg.hidden * F32
    assert sends == p2p_traffic(cfg.p, cfg.m, cfg.micro_batch, 1, cfg.hidden)["count"] == 2 * cfg.m * (cfg.p - 1)
    assert {e.payload_bytes for led in world.ledgers for e in led.select("send")} == {message}
    T = got["trip_counts"][0]
    transfers = sum(pairs * T for pairs in got["collective_permute.pairs"])  # every in-loop permute, every iteration
    assert transfers == sends + 2 * (cfg.p - 1) ** 2  # (m + p - 1)(p - 1) per direction
