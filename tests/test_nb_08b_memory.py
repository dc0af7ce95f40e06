"""Notebook 08b through papermill: every in-notebook check must pass (the graded answer key included) at the
defaults and at two other legal parameter sets (4 devices with the heads split over 4 chips and a GPT-2 step; 1 device
with one MLP layer and no unsplit integer program), and the recorded values equal oracles worked out here: the
planner's attention terms by hand (6·a·s²/t and 4·a·s/t bytes), the flash program's three custom calls, the step's
DAG re-traced and priced by a live-bytes walk written here (not ``profile.order``'s simulator, which the code uses),
the best update schedule by brute force over every schedule (up to 8 update units)."""

from __future__ import annotations

import itertools

import pytest

from shardlab.memory import graph as G
from shardlab.memory import update_schedule as U
from shardlab.memory.params import MemoryParams
from shardlab.profile import order as O


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


def _check_attention(by, heads: int, seq: int, tensor: int) -> None:  # type: ignore[no-untyped-def]
    a = heads // tensor  # heads per chip
    assert by[("levers.flash.temp_bytes.plain", "formula")] == 6 * a * seq * seq  # P, dP, dS: 3 x bf16 [a, s, s]
    assert by[("levers.flash.temp_bytes.flash", "formula")] == 4 * a * seq  # one fp32 log-sum-exp per query
    assert by[("levers.flash.custom_calls.flash", "tpu")] == 3  # forward, dq, dk/dv
    assert by[("levers.flash.custom_calls.plain", "tpu")] == 0
    assert by[("levers.flash.square_bytes.flash", "tpu")] == 0
    assert by[("levers.flash.square_bytes.plain", "tpu")] >= 2 * a * seq * seq  # one bf16 [a, s, s] array at least
    # the compiler holds more than the planner's terms (recorded with the reason, not compared)
    assert by[("levers.flash.temp_bytes.flash", "tpu")] > by[("levers.flash.temp_bytes.flash", "formula")]


def live_peak(g: O.Graph, order: list[str] | tuple[str, ...]) -> int:
    """The memory model of ``profile.order`` (its module note) walked here independently: an operator's counted outputs
    are allocated when it runs (the peak is taken then), and a counted tensor that is not a graph output is freed
    once the operator that reads or writes it last in ``order`` has run."""
    pos = {n: i for i, n in enumerate(order)}
    size = {t: b for op in g.ops for t, b in op.outputs}
    counted = {t for t in size if g.count_outputs or t not in g.outputs}
    last: dict[str, int] = {}
    for op in g.ops:
        for t in (*op.inputs, *(t for t, _ in op.outputs)):
            if t in counted and t not in g.outputs:
                last[t] = max(last.get(t, -1), pos[op.name])
    ops = {op.name: op for op in g.ops}
    live = peak = 0
    for i, name in enumerate(order):
        live += sum(b for t, b in ops[name].outputs if t in counted)
        peak = max(peak, live)
        live -= sum(size[t] for t, at in last.items() if at == i)
    return peak


def _check_step(by, p: MemoryParams, tpu: bool = True) -> None:  # type: ignore[no-untyped-def]
    step = G.trace_step(p)  # the same step traced here, priced by the walk above
    program = [op.name for op in step.graph.ops]
    assert by[("levers.roam.peak_bytes.program", "formula")] == live_peak(step.graph, program)
    ilp = by[("levers.roam.peak_bytes.ilp", "formula")]
    assert ilp <= live_peak(step.graph, program)
    up = U.plan(step)
    for choice in ("eager", "end"):
        assert by[(f"levers.update_schedule.peak_bytes.{choice}", "formula")] == \
            live_peak(step.graph, U.order_for(up, U.uniform(up, choice)))
    best = by[("levers.update_schedule.peak_bytes.best", "formula")]
    if len(up.params) <= 8:  # every one of the 2^P schedules, each priced by the walk above
        assert best == min(live_peak(step.graph, U.order_for(up, dict(zip(up.params, c, strict=True))))
                           for c in itertools.product(("eager", "end"), repeat=len(up.params)))
    assert by[("levers.roam.peak_bytes.xla", "hlo")] > 0
    assert ("levers.roam.solve_s.split", "timer") in by
    if tpu:
        for choice in ("eager", "end", "best"):
            assert by[(f"levers.update_schedule.peak_bytes.{choice}", "tpu")] > 0


@pytest.mark.notebook
def test_notebook_08b_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("08b_memory")
    by = _by(record)
    _check_attention(by, heads=4, seq=2048, tensor=1)
    _check_step(by, MemoryParams())
    assert ("levers.roam.solve_s.unsplit", "timer") in by and ("levers.roam.peak_bytes.xla", "tpu") in by
    assert not record["skipped"]
    assert not any(name.startswith("levers.flash.seq_max_fit") for name, _ in by)  # full size only
    checks = {c["name"] for c in record["checks"]}
    assert {"levers.roam.ilp_equals_brute_force", "exercise.5.answer_key"} <= checks
    # the checks on the full-size results are made only when they are measured (full_size=True): on the cache they
    # could not fail (tests/test_memory_flash.py checks the cache against the same rules)
    assert not any(c.startswith(("levers.flash.sweep", "levers.flash.seq_max_fit", "levers.flash.undercount",
                                 "levers.roam.gpt2")) for c in checks)


@pytest.mark.notebook
def test_notebook_08b_four_devices_gpt2(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """Heads split over 4 chips (GQA 2:1, the plain softmax in bf16), a one-block GPT-2 step."""
    sizes = dict(model="gpt2", layers=1, hidden=32, step_heads=2, step_seq=8, step_batch=1)
    record = run_notebook("08b_memory", num_devices=4, seq=2048, heads=8, kv_heads=4, tensor=4, softmax_fp32=False,
                          **sizes)
    by = _by(record)
    _check_attention(by, heads=8, seq=2048, tensor=4)
    _check_step(by, MemoryParams(**sizes))
    # one block: no later backward to force the updates before, so eager and end are the same lazy graph
    assert by[("levers.update_schedule.peak_bytes.eager", "tpu")] == by[("levers.update_schedule.peak_bytes.end",
                                                                          "tpu")]


@pytest.mark.notebook
def test_notebook_08b_one_device(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """One device, one MLP layer, the unsplit integer program skipped (unsplit_limit_s=0)."""
    sizes = dict(layers=1, hidden=32, ffn=64)
    record = run_notebook("08b_memory", num_devices=1, unsplit_limit_s=0, **sizes)
    by = _by(record)
    _check_attention(by, heads=4, seq=2048, tensor=1)
    _check_step(by, MemoryParams(**sizes))
    assert ("levers.roam.solve_s.unsplit", "timer") not in by


@pytest.mark.notebook
def test_notebook_08b_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="seq=1536 is not divisible by 1024"):
        run_notebook("08b_memory", seq=1536)
