"""Notebook 09 through papermill: every in-notebook check must pass (schedules = PyTorch's orders, timed bubble =
formula, parity with the unsplit model, the compiled loops, the answer key) at the defaults and at other legal
parameter sets; the recorded numbers equal the arithmetic done here by hand:

    message        (batch / m) * seq * hidden * 4 bytes (one float32 activation [b/m, s, h])
    sends          2 m (p v - 1) per step (every boundary crossed forward and backward by every microbatch)
    bubble         (p - 1) / (v m + p - 1) of the step; the compiled loop runs T = v m + p - 1 iterations
    in flight      GPipe m; 1F1B p on stage 0; interleaved min((v - 1) p + 2 (p - 1) + 1, v m) chunks
    loop shifts    GPipe: p - 1 transfers per iteration each way, 2 (p - 1) T per step; circular: p T (forward)
    1F1B loop      T1 = m + 2 (p - 1) ticks, two shifts of p - 1 transfers per tick, a 2 p - 1 slot stash
"""

from __future__ import annotations

import pytest


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


def _check_schedules(by, p: int, m: int, v: int, message: int, sources: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    for s, vv in (("gpipe", 1), ("1f1b", 1), ("interleaved", v)):
        sends = 2 * m * (p * vv - 1)
        for src in ("formula", "ledger"):
            assert by[(f"pp.{s}.p2p.count", src)] == sends
            assert by[(f"pp.{s}.p2p.bytes", src)] == sends * message
            assert by[(f"pp.{s}.bubble_fraction", src)] == pytest.approx((p - 1) / (vv * m + p - 1))
            assert by[(f"pp.{s}.bubble_ratio", src)] == pytest.approx((p - 1) / (vv * m))
        inflight = {"gpipe": m, "1f1b": min(p, m), "interleaved": min((v - 1) * p + 2 * (p - 1) + 1, v * m)}[s]
        assert by[(f"pp.{s}.peak_inflight_microbatches", "ledger")] == inflight
    T, Tc = m + p - 1, v * m + p - 1
    for src in sources:  # the compilers: trip counts and the loops' shifts
        assert by[("pp.spmd.trip_count", src)] == T
        assert by[("pp.spmd.circular.trip_count", src)] == Tc
        assert by[("pp.gpipe.bubble_fraction", src)] == pytest.approx((p - 1) / T)
        assert by[("pp.interleaved.bubble_fraction", src)] == pytest.approx((p - 1) / Tc)
        assert by[("pp.spmd.p2p.count", src)] == 2 * (p - 1) * T
        assert by[("pp.spmd.p2p.bytes", src)] == 2 * (p - 1) * T * message
        assert by[("pp.spmd.circular.p2p.count", src)] == p * Tc
        assert by[("pp.spmd.collective_permute.count", src)] == 2
        assert by[("pp.spmd.collective_permute.step_count", src)] == 2 * T
        assert ("pp.1f1b.bubble_fraction", src) not in by  # the 1F1B loop's idle share is its own quantity:
        T1 = m + 2 * (p - 1)  # the 1F1B loop: a forward and a backward slot per tick
        assert by[("pp.spmd.1f1b.trip_count", src)] == T1
        assert by[("pp.spmd.1f1b.bubble_fraction", src)] == pytest.approx(2 * (p - 1) / T1)
        assert by[("pp.spmd.1f1b.stash_slots", src)] == 2 * p - 1
        assert by[("pp.spmd.1f1b.p2p.count", src)] == 2 * (p - 1) * T1
        assert by[("pp.spmd.1f1b.collective_permute.count", src)] == 2
        assert by[("pp.spmd.1f1b.collective_permute.step_count", src)] == 2 * T1


@pytest.mark.notebook
def test_notebook_09_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("09_pipeline")
    by = _by(record)
    p, m, v, message = 4, 8, 2, 8 // 8 * 16 * 64 * 4
    _check_schedules(by, p, m, v, message, ("hlo", "tpu"))
    r = 8 // p  # two pipelines side by side on the (stage, data) = (4, 2) mesh: half a slot per permute
    for src in ("formula", "hlo", "tpu"):
        assert by[("pp.spmd.collective_permute.bytes", src)] == 2 * message // r
        for how in ("pad", "cat"):
            assert by[(f"pp.shift.{how}.collective_permute.count", src)] == 1
        assert by[("pp.spmd.fsdp.trip_count", src)] == m + p - 1
        assert by[("pp.spmd.fsdp.all_gather.elements", src)] == 64 // r * 64  # one stage's [h / 2, h] shard
    assert by[("pp.spmd.all_reduce.in_loop.step_count", "tpu")] == 0  # W's gradient summed once, after the loop
    assert by[("pp.shift.roll.all_to_all.count", "hlo")] >= 1  # XLA:CPU reshards a roll with all-to-alls
    assert by[("pp.split.max_stage_cost.auto", "formula")] < by[("pp.split.max_stage_cost.even", "formula")]
    assert by[("pp.gpipe.tpu.collective_permute.async", "tpu")] >= 2
    # the 1F1B loop's peak grows more slowly with m than GPipe's autograd loop (XLA:TPU, measured at m and 2m)
    slope = {k: by[(f"pp.spmd.{k}.tpu.peak_bytes_per_microbatch", "tpu")] for k in ("gpipe", "1f1b")}
    assert slope["1f1b"] < slope["gpipe"]
    # Llama 3 8B at pp 4, seq 8192: the last stage (8 blocks + the LM head) over a quarter of the model, by hand
    h, kv, ffn, vocab, s = 4096, 1024, 14336, 128256, 8192
    block = 6 * s * (2 * h * h + 2 * h * kv + 3 * h * ffn) + 3 * 4 * s * s * h  # weights + attention, training
    head = 6 * s * h * vocab
    ratio = (8 * block + head) / ((32 * block + head) / 4)
    assert by[("pp.split.llama3_8b_pp4.last_stage_over_mean", "formula")] == pytest.approx(ratio, rel=1e-12)
    assert 1.15 < ratio < 1.17  # the LM head and loss make the last stage ~16 % heavier


@pytest.mark.notebook
def test_notebook_09_four_devices_one_pipeline(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """stages = num_devices = 4: one pipeline (no data axis): a whole slot per permute; m = p. The 2-D section
    (8 devices: a helper process for XLA:TPU) is left out here, the defaults run it."""
    record = run_notebook("09_pipeline", num_devices=4, stages=4, microbatches=4, batch=4, seq=8, hidden=32,
                          heads=2, ffn=64, vocab=512, fsdp=False)
    by = _by(record)
    message = 4 // 4 * 8 * 32 * 4
    _check_schedules(by, 4, 4, 2, message, ("hlo", "tpu"))
    for src in ("formula", "hlo", "tpu"):
        assert by[("pp.spmd.collective_permute.bytes", src)] == 2 * message  # a whole slot per permute
    assert not any(name.startswith("pp.spmd.fsdp.") for name, _ in by)


@pytest.mark.notebook
@pytest.mark.slow  # gloo processes: our programs and PyTorch's pipelining (~20-40 s)
def test_notebook_09_one_device_with_gloo(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """One device, p = 2: the CPU compiler is skipped with a note, XLA:TPU compiles a 2-chip slice in a helper
    process; the gloo section runs ours and PyTorch's pipelining in 2 real processes."""
    record = run_notebook("09_pipeline", num_devices=1, stages=2, microbatches=4, virtual=2, batch=4, seq=8,
                          hidden=32, heads=2, ffn=64, layers=4, vocab=512, fsdp=False, run_gloo=True)
    by = _by(record)
    message = 4 // 4 * 8 * 32 * 4
    _check_schedules(by, 2, 4, 2, message, ("tpu",))
    assert ("pp.spmd.trip_count", "hlo") not in by
    names = {c["name"] for c in record["checks"]}
    for s in ("gpipe", "1f1b", "interleaved"):
        assert {f"pp.{s}.gloo.same_sends", f"pp.{s}.torch.parity", f"pp.{s}.torch.same_p2p"} <= names


@pytest.mark.notebook
def test_notebook_09_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="microbatches=6 is not divisible by stages=4"):
        run_notebook("09_pipeline", microbatches=6, batch=6)
