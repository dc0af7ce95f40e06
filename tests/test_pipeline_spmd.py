"""The SPMD (circular) pipeline on torch_xla: outputs and gradients against the dense layer-by-layer oracle, the
loop's trip count against v m + p - 1 and the bubble formula, the collective-permute of one shard per iteration,
how the shift is written (cat / pad vs roll vs a concatenated zeros block), a 2-D stage x data mesh (data
parallelism, and FSDP), and XLA:TPU's program (compile-only): the permutes asynchronous.

Tolerance: float32; the pipeline runs the same matmuls on the same rows as the oracle, only the einsum's
batching differs (an [p, rows, h] x [p, h, h] batch vs one [m, rows, h] x [h, h] matmul): outputs within 1e-5,
gradients within 1e-5 of their largest entry (measured ~1e-6 and ~3e-7)."""

from __future__ import annotations

import importlib.util
from functools import partial

import pytest
import torch

from shardlab.formulas.pipeline import idle_fraction
from shardlab.pipeline.spmd import check_spmd, dense_forward, init, pipeline_loss, pipeline_step, read_program

F32 = 4
N = 8  # the session's devices


def _build(p: int, m: int, v: int = 1, rows: int = 8, h: int = 64, data: bool = False, **kw):
    """The step on the 8-device world: mesh (stage, data) = (p, 8 / p); `data` splits the rows over the second
    axis (else it holds copies)."""
    from shardlab import runtime

    x, w = init(p, m, v, rows, h)
    mesh = runtime.mesh((p, N // p), ("stage", "data"))
    dev = runtime.device()
    return pipeline_step(x.to(dev), w.to(dev), mesh, data_axis="data" if data else None, **kw)


def _build_from(cfg: dict):
    return _build(**cfg)


def _capture(**cfg):
    from shardlab.profile import capture_hlo

    cap = capture_hlo(partial(_build, **cfg))
    return cap, read_program(cap.module)


def _check_parity(result, p: int, m: int, v: int = 1, rows: int = 8, h: int = 64, backward: bool = True,
                  **_kw) -> None:
    x, w = init(p, m, v, rows, h)
    if backward:
        x.requires_grad_(True)
        w.requires_grad_(True)
    ref = dense_forward(x, w)
    torch.testing.assert_close(result[0].cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    if backward:
        gx, gw = torch.autograd.grad(pipeline_loss(ref), (x, w))
        for got, want in ((result[2], gx), (result[3], gw)):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.xla
def test_gpipe_forward_and_backward_equal_the_dense_model(xla_world) -> None:
    cfg = dict(p=8, m=8, how="pad")
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    p, m, rows, h = 8, 8, 8, 64
    T = m + p - 1
    assert got["trip_counts"] == [T, T]  # the forward loop and autograd's reversed loop
    assert (T - m) / T == pytest.approx(idle_fraction(p, m))  # bubble iterations = the formula
    shard = rows * h * F32  # one [1, rows, h] slot per device
    assert got["collective_permute.bytes_per_iteration"] == [shard, shard]  # one forward, one backward
    assert got["collective_permute.pairs"] == [p - 1, p - 1]  # s -> s + 1, and back
    assert got.get("all_reduce.in_loop", 0) == got.get("all_gather.in_loop", 0) == 0  # the shifts only
    in_loop = 2 * T  # every iteration, bubble included
    assert got["collective_permute.step_count"] - (got["collective_permute.count"] - 2) == in_loop


@pytest.mark.xla
@pytest.mark.parametrize("shift", ["cat", "pad", "roll", "cat_zeros"])
def test_how_the_shift_is_written_decides_the_collective(xla_world, shift: str) -> None:
    cfg = dict(p=8, m=8, how=shift, backward=False)
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    permutes_in_loop = got.get("collective_permute.in_loop", 0)
    if shift in ("cat", "pad"):  # one collective-permute of one shard: p pairs (cat is circular) or p - 1
        assert permutes_in_loop == 1
        assert got["collective_permute.pairs"] == [8 if shift == "cat" else 7]
        assert got.get("all_to_all.in_loop", 0) == 0
    elif shift == "roll":  # two all-to-alls and an all-gather, no permute
        assert (permutes_in_loop, got["all_to_all.in_loop"], got["all_gather.in_loop"]) == (0, 2, 1)
    else:  # the same values as pad, written with a zeros block: the partitioner reshards with all-to-alls
        assert (permutes_in_loop, got["all_to_all.in_loop"]) == (0, 2)  # (3 for a lone shift outside a loop)


@pytest.mark.xla
@pytest.mark.parametrize("m", [8, 16])
def test_circular_pipeline_runs_v_m_plus_p_minus_1_iterations(xla_world, m: int) -> None:
    cfg = dict(p=8, m=m, v=2, backward=False)
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    T = 2 * m + 8 - 1
    assert got["trip_counts"] == [T]
    assert (T - 2 * m) / T == pytest.approx(idle_fraction(8, m, 2))
    assert got["collective_permute.pairs"] == [8]  # the last stage hands back to the first


@pytest.mark.xla
def test_stage_by_data_mesh_splits_the_rows_and_sums_the_weight_gradient(xla_world) -> None:
    """p = 4 on 8 devices: two pipelines side by side on halves of every microbatch (data parallelism). Each
    permute moves half a slot; W's gradient is summed over the data axis (XLA:CPU: inside the backward loop)."""
    cfg = dict(p=4, m=4, data=True, how="pad")
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    T = 4 + 4 - 1
    assert got["trip_counts"] == [T, T]
    assert got["collective_permute.bytes_per_iteration"] == [8 // 2 * 64 * F32] * 2
    assert got["collective_permute.pairs"] == [(4 - 1) * 2] * 2  # p - 1 shifts in each of the 2 pipelines
    reduces = [c for c in cap.module.collectives if c.op == "all-reduce" and c.in_while]
    assert [c.group_size for c in reduces] == [2] and reduces[0].operand_bytes == 64 * 64 * F32


@pytest.mark.xla
def test_stage_by_fsdp_mesh(xla_world) -> None:
    cfg = dict(p=4, m=4, data=True, fsdp=True, backward=False)
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    assert got["collective_permute.bytes_per_iteration"] == [8 // 2 * 64 * F32]
    gathers = [c for c in cap.module.collectives if c.op == "all-gather"]  # W's [h / 2, h] shard, gathered whole
    assert [(c.group_size, c.operand_bytes) for c in gathers] == [(2, 64 // 2 * 64 * F32)]
    assert got["trip_counts"] == [4 + 4 - 1]


@pytest.mark.xla
def test_python_loop_unrolls_the_same_permutes(xla_world) -> None:
    cfg = dict(p=8, m=4, how="pad", loop="python", backward=False)
    cap, got = _capture(**cfg)
    _check_parity(cap.result, **cfg)
    assert got["trip_counts"] == []
    shard = 8 * 64 * F32
    permutes = [c for c in cap.module.collectives if c.op == "collective-permute" and c.operand_bytes == shard]
    assert len(permutes) == 4 + 8 - 1


@pytest.mark.xla
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (the XLA:TPU compiler) not installed")
def test_xla_tpu_issues_the_permutes_asynchronously(xla_world) -> None:
    from shardlab.profile import tpu

    res = tpu.compile_program(_build_from, {"p": 8, "m": 8, "how": "pad"}, "v5e-8")
    assert res.fits
    got = read_program(res.module)
    T = 8 + 8 - 1
    assert got["trip_counts"] == [T, T]
    loop_permutes = [c for c in res.module.collectives if c.op == "collective-permute" and c.in_while]
    assert len(loop_permutes) == 2 and all(c.form == "start-done" for c in loop_permutes)
    assert [c.operand_bytes for c in loop_permutes] == [8 * 64 * F32] * 2
    assert len(got["collective_permute.windows"]) == 2  # both async: a window each between start and done


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="m=2 must be >= p=4"):
        check_spmd(4, 2, 2)
    with pytest.raises(ValueError, match="shift='pad' drops the last stage's slot"):
        check_spmd(4, 4, 2, "pad")
    with pytest.raises(ValueError, match="shift='rotate'"):
        check_spmd(4, 4, 1, "rotate")
    with pytest.raises(ValueError, match="loop='while'"):
        check_spmd(4, 4, 1, "cat", "while")


@pytest.mark.xla
def test_ledger_sends_vs_compiler_permutes_on_the_same_model(xla_world) -> None:
    """The per-stage GPipe program on the same layers: same outputs' loss and weight gradients; its sends are
    the permutes' useful part — the SPMD loop also shifts during the p - 1 bubble iterations of each pass."""
    from shardlab.comm import SimulatedWorld
    from shardlab.formulas.pipeline import p2p_traffic
    from shardlab.pipeline.programs import merge_results, pipeline_program
    from shardlab.pipeline.schedules import build
    from shardlab.pipeline.spmd import microbatch_loss, stage_modules

    p, m, rows, h = 8, 8, 8, 64
    cap, got = _capture(p=p, m=m, how="pad")
    x, w = init(p, m, 1, rows, h)
    layers, names, boundary = stage_modules(w, rows)
    world = SimulatedWorld(p)
    results = world.run(pipeline_program, build("gpipe", p, m), layers, names, boundary,
                        x.flatten(0, 1), torch.zeros(m * rows), microbatch_loss)
    loss, grads = merge_results(results)
    torch.testing.assert_close(loss, cap.result[1].cpu(), rtol=1e-5, atol=0)
    gw = cap.result[3].cpu()
    for s in range(p):
        torch.testing.assert_close(grads[f"w.0.{s}"], gw[0, s], rtol=1e-5, atol=1e-5 * gw.abs().max().item())

    sends = sum(led.count("send") for led in world.ledgers)
    message = rows * h * F32
    assert sends == p2p_traffic(p, m, rows, 1, h)["count"] == 2 * m * (p - 1)
    assert {e.payload_bytes for led in world.ledgers for e in led.select("send")} == {message}
    T = got["trip_counts"][0]
    transfers = sum(pairs * T for pairs in got["collective_permute.pairs"])  # every in-loop permute, every iteration
    assert transfers == sends + 2 * (p - 1) ** 2  # (m + p - 1)(p - 1) per direction


# ------------------------------------------------------------------------------- 1F1B: the backward in the loop
def _build_1f1b(p: int, m: int, rows: int = 8, h: int = 64, data: bool = False):
    from shardlab import runtime
    from shardlab.pipeline.spmd_1f1b import one_f_one_b_step

    x, w = init(p, m, 1, rows, h)
    mesh = runtime.mesh((p, N // p), ("stage", "data"))
    dev = runtime.device()
    return one_f_one_b_step(x.to(dev), w.to(dev), mesh, data_axis="data" if data else None)


def _build_1f1b_from(cfg: dict):
    return _build_1f1b(**cfg)


@pytest.mark.xla
@pytest.mark.parametrize(("p", "m", "data"), [(8, 8, False), (4, 3, True), (2, 5, True)])
def test_1f1b_loop_gradients_equal_autograd_of_the_dense_model(xla_world, p: int, m: int, data: bool) -> None:
    """The hand-written backward in the loop body against autograd through the dense layers (m < p included):
    exact up to fp32 rounding of differently batched matmuls. One loop of m + 2 (p - 1) ticks, two shifts per
    tick, each stage's stash 2 p - 1 slots deep."""
    from shardlab.profile import capture_hlo

    cap = capture_hlo(partial(_build_1f1b, p=p, m=m, data=data))
    _check_parity(cap.result, p, m)
    got = read_program(cap.module)
    T = m + 2 * (p - 1)  # counted by hand: microbatch m - 1 leaves stage 0's backward at tick (m - 1) + 2 (p - 1)
    assert got["trip_counts"] == [T]
    r = N // p if data else 1
    assert got["collective_permute.pairs"] == [(p - 1) * (N // p)] * 2  # forward s -> s+1, backward s+1 -> s
    assert got["collective_permute.bytes_per_iteration"] == [8 // r * 64 * F32] * 2
    stash = [a.dims for lp in cap.module.while_loops for a in lp.state if len(a.dims) == 4 and a.dims[0] == 1]
    assert stash == [(1, 2 * p - 1, 8 // r, 64)] * 2  # inputs and outputs, 2 p - 1 slots each, per chip


def test_1f1b_loop_order_is_one_forward_one_backward_with_a_double_warm_up() -> None:
    """The order the masks encode, as action lists: valid (every F before its B, microbatches in order), the
    steady state alternates F and B, and stage s holds at most min(2 (p - 1 - s) + 1, m) microbatches — counted
    by `peak_inflight` on the lists, against PyTorch-1F1B's min(p - s, m)."""
    from shardlab.pipeline.schedules import one_f_one_b, peak_inflight
    from shardlab.pipeline.spmd_1f1b import tick_schedule

    for p, m in [(4, 8), (3, 2), (5, 12), (2, 1)]:
        sched = tick_schedule(p, m)
        sched.validate()
        assert peak_inflight(sched) == [min(2 * (p - 1 - s) + 1, m) for s in range(p)]
        assert peak_inflight(one_f_one_b(p, m)) == [min(p - s, m) for s in range(p)]
        last = [a.kind for a in sched.devices[p - 1]]
        assert last == ["F", "B"] * m  # the last stage: F then B of the same microbatch, every tick


@pytest.mark.xla
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (the XLA:TPU compiler) not installed")
def test_1f1b_loop_memory_grows_slower_with_m_than_gpipe(xla_world) -> None:
    """XLA:TPU's peak per chip at m = 8 and m = 32 (p = 8): GPipe's autograd loop saves every iteration (and
    torch_xla's scan saves the carried weight once per iteration), so its peak grows faster with m than the
    1F1B loop's, whose O(m) buffers are only the microbatch stream in and the outputs out."""
    from shardlab.profile import tpu

    peak = {}
    for m in (8, 32):
        for name, fn, cfg in (("gpipe", _build_from, {"p": 8, "m": m, "how": "pad"}),
                              ("1f1b", _build_1f1b_from, {"p": 8, "m": m})):
            res = tpu.compile_program(fn, cfg, "v5e-8")
            assert res.fits
            peak[name, m] = res.memory.peak
    assert peak["1f1b", 32] - peak["1f1b", 8] < peak["gpipe", 32] - peak["gpipe", 8]
    assert peak["1f1b", 32] < peak["gpipe", 32]


@pytest.mark.xla
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
def test_roll_is_lowered_by_torch_xla_not_by_the_partitioner(xla_world) -> None:
    """torch_xla's HLO for torch.roll, before partitioning: concatenate(x, x) + dynamic-slice at a constant offset.
    JAX's static jnp.roll (run in a child process: one PJRT client per process) lowers to slice + concatenate —
    the `cat` shift, which the partitioner turns into one collective-permute."""
    import os
    import subprocess
    import sys

    import torch_xla

    from shardlab import runtime

    lowered = torch_xla._XLAC._get_xla_tensors_hlo([torch.roll(torch.zeros(8, 4, 16, device=runtime.device()), 1, 0)])
    assert "concatenate(" in lowered and "dynamic-slice(" in lowered and " slice(" not in lowered
    code = ("import jax, jax.numpy as jnp; "
            "print(jax.jit(lambda x: jnp.roll(x, 1, 0)).lower(jnp.zeros((8, 4, 16))).as_text())")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert "stablehlo.slice" in text and "stablehlo.concatenate" in text and "dynamic_slice" not in text
