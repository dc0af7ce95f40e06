"""Per-device pipeline programs: GPipe, 1F1B and interleaved 1F1B on the stages of the automatic split, in the
SimulatedWorld and in gloo processes; loss and every gradient against the unsplit model, the ledger's sends
against formulas.pipeline.p2p_traffic, and PyTorch's own pipelining (PipelineStage + its schedules on gloo)
as a second reference, down to its point-to-point ops.

Tolerance: float32, gradients compared with rtol 1e-5 and atol 1e-5 x the largest |gradient| entry of the whole
model.  The unsplit backward reduces a weight gradient over all b s rows inside one matmul; the pipeline adds m
partial sums (one per microbatch), so the two differ by rounding only: we see at most ~3e-7 of the largest entry
(a few fp32 ulps times the accumulation depth), a ~35x margin.  The atol is global, not per parameter: the key
biases' gradients are exactly 0 in exact arithmetic (softmax ignores a constant added to every key score) and
~1e-10 of rounding noise in both runs.  The loss is a sum of m microbatch means either way."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from shardlab.comm import DistributedWorld, Ledger, RankError, SimulatedWorld
from shardlab.formulas.pipeline import p2p_traffic
from shardlab.pipeline.model import TinyLM, batch
from shardlab.pipeline.programs import dense_step, merge_results, pipeline_program
from shardlab.pipeline.schedules import build, peak_inflight
from shardlab.pipeline.split import best_cuts, split, trace
from shardlab.pipeline.torch_ref import torch_pipeline_program

CFG = SimpleNamespace(vocab=256, hidden=32, heads=2, ffn=64, layers=4, seq=8)
B = 8  # batch


@pytest.fixture(scope="module")
def setup():
    model = TinyLM(CFG.vocab, CFG.hidden, CFG.heads, CFG.ffn, CFG.layers)
    tokens, targets = batch(CFG.vocab, CFG.seq, B)
    traced = trace(model, tokens)
    loss, grads = dense_step(copy.deepcopy(model), tokens, targets)
    return traced, tokens, targets, loss, grads


def _stages(traced, n: int):
    return split(traced, best_cuts(traced.train_costs, traced.frontier, n).cuts)


def _assert_parity(loss, grads, ref_loss, ref_grads) -> None:
    assert set(grads) == set(ref_grads)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    scale = max(g.abs().max().item() for g in ref_grads.values())
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize(
    "name,p,m,v", [("gpipe", 2, 4, 1), ("1f1b", 4, 4, 1), ("1f1b", 2, 8, 1), ("interleaved", 2, 4, 2),
                   ("interleaved", 2, 2, 4), ("gpipe", 1, 2, 1), ("interleaved", 1, 4, 3)],
)
def test_simulated_pipeline_equals_the_unsplit_model(setup, name: str, p: int, m: int, v: int) -> None:
    traced, tokens, targets, ref_loss, ref_grads = setup
    sched = build(name, p, m, v)
    stages = _stages(traced, p * v)
    world = SimulatedWorld(p)
    results = world.run(pipeline_program, sched, copy.deepcopy(stages.modules), stages.param_names,
                        stages.boundary, tokens, targets)
    _assert_parity(*merge_results(results), ref_loss, ref_grads)
    assert [r["order"] for r in results] == [list(d) for d in sched.devices]  # each device ran its list, in order
    assert [r["peak_held"] for r in results] == peak_inflight(sched)  # held activations = counted from the order

    f = p2p_traffic(p, m, B // m, CFG.seq, CFG.hidden, "float32", v=v)
    for r, led in enumerate(world.ledgers):
        assert led.count("send") == f[f"device.{r}.count"]
        assert led.payload_bytes("send") == f[f"device.{r}.bytes"]
        assert led.wire_bytes() == f[f"device.{r}.bytes"]  # recv rows carry no wire bytes
        acts, grads = led.select("send", tag="act"), led.select("send", tag="grad")
        assert {e.phase for e in acts} <= {"forward"} and {e.phase for e in grads} <= {"backward"}
        assert {e.shape for e in led.select("send")} <= {(B // m, CFG.seq, CFG.hidden)}
    assert sum(led.count("send", tag="act") for led in world.ledgers) == f["forward.count"]
    assert sum(led.count("recv") for led in world.ledgers) == f["count"]


def test_a_schedule_for_another_world_size_is_refused(setup) -> None:
    traced, tokens, targets, *_ = setup
    stages = _stages(traced, 2)
    with pytest.raises(RankError, match="p=2 devices but the world has 3 ranks"):
        SimulatedWorld(3).run(pipeline_program, build("gpipe", 2, 2), stages.modules, stages.param_names,
                              stages.boundary, tokens, targets)


# ---- real processes (gloo): our program, and PyTorch's pipelining --------------------------------------------
@pytest.mark.slow  # two gloo processes, ~5 s
def test_gloo_runs_our_program_with_the_simulated_ledger(setup) -> None:
    traced, tokens, targets, ref_loss, ref_grads = setup
    sched = build("1f1b", 2, 4)
    stages = _stages(traced, 2)
    args = (sched, stages.modules, stages.param_names, stages.boundary, tokens, targets)
    sim = SimulatedWorld(2)
    sim.run(pipeline_program, *copy.deepcopy(args))
    gloo = DistributedWorld(2)
    results = gloo.run(pipeline_program, *args)
    assert gloo.ledgers == sim.ledgers
    _assert_parity(*merge_results(results), ref_loss, ref_grads)  # 1 thread per process: other fp32 rounding


@pytest.mark.slow  # two gloo processes per schedule, ~5-10 s each
@pytest.mark.parametrize("name,m,v,shapes_up_front", [("gpipe", 4, 1, True), ("interleaved", 4, 2, False)])
def test_pytorch_pipelining_on_gloo_matches_the_unsplit_model_and_our_sends(
    setup, name: str, m: int, v: int, shapes_up_front: bool
) -> None:
    traced, tokens, targets, ref_loss, ref_grads = setup
    p = 2
    stages = _stages(traced, p * v)
    results = DistributedWorld(p).run(torch_pipeline_program, name, m, list(stages.modules),
                                      list(stages.param_names), tokens, targets, shapes_up_front)
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    grads = {k: g for r in results for k, g in r["grads"].items()}
    _assert_parity(loss, grads, ref_loss, ref_grads)

    sim = SimulatedWorld(p)
    sim.run(pipeline_program, build(name, p, m, v), copy.deepcopy(stages.modules), stages.param_names,
            stages.boundary, tokens, targets)
    for r in range(p):  # PyTorch batches its ops differently: compare the multiset of (op, peer, shape, dtype)
        theirs = Ledger.from_records(results[r]["p2p"])
        key = [(e.op, e.peer, e.shape, e.dtype) for e in theirs]
        assert sorted(key) == sorted((e.op, e.peer, e.shape, e.dtype) for e in sim.ledgers[r])


def _torch_step_with_warmup(comm, stages, names, tokens, targets):
    """PyTorch's ScheduleGPipe exactly as documented, the stage's communicator warm-up left in."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from shardlab.pipeline.model import lm_loss

    stage = PipelineStage(stages[comm.rank], comm.rank, comm.world_size, torch.device("cpu"))
    sched = ScheduleGPipe(stage, 2, loss_fn=lm_loss)
    if comm.rank == 0:
        sched.step(tokens)
    else:
        sched.step(target=targets)


@pytest.mark.slow  # ~4 s: documents what does not run
def test_pytorch_pipelining_warmup_aborts_on_gloo(setup) -> None:
    # torch 2.9.0: _get_init_p2p_neighbors_ops sends an int64 scalar and receives into a float32 [1] buffer;
    # gloo aborts the process ("8 vs 4. Received data size doesn't match expected size", SIGABRT).
    traced, tokens, targets, *_ = setup
    stages = _stages(traced, 2)
    with pytest.raises(RankError, match="exited with code -6|Connection reset by peer"):  # whichever rank dies first
        DistributedWorld(2, timeout_s=60).run(_torch_step_with_warmup, list(stages.modules),
                                              list(stages.param_names), tokens, targets)


def _tanh_run(name: str, p: int, m: int, rows: int = 4, h: int = 8):
    """The schedule's per-device programs on p tanh layers (cheap), in a SimulatedWorld, with each action's
    send / recv rows (as ScheduleCase's ledger view records them)."""
    import itertools

    from shardlab.pipeline.spmd import init, microbatch_loss, stage_modules

    x, w = init(p, m, 1, rows, h)
    layers, names, boundary = stage_modules(w, rows)
    world = SimulatedWorld(p)
    sched = build(name, p, m)
    results = world.run(pipeline_program, sched, layers, names, boundary, x.flatten(0, 1), torch.zeros(m * rows),
                        microbatch_loss)
    for r, res in enumerate(results):
        rows_ = list(world.ledgers[r])
        res["p2p"] = [[(e.op, e.peer) for e in rows_[a:b] if e.op in ("send", "recv")]
                      for a, b in itertools.pairwise(res["rows"])]
    return sched, results


def test_replay_times_the_recorded_messages() -> None:
    """The bubble of what the devices did, timed from their messages alone, is the paper's (p - 1)/(m + p - 1)
    (a fraction written by hand here); a receive whose send is missing is reported, not timed."""
    from fractions import Fraction

    from shardlab.pipeline.timeline import replay

    for name, p, m in (("gpipe", 4, 8), ("1f1b", 4, 8), ("1f1b", 3, 2)):
        sched, results = _tanh_run(name, p, m)
        t = replay(sched, [r["order"] for r in results], [r["p2p"] for r in results])
        assert t.idle_fraction == Fraction(p - 1, m + p - 1)
        assert t.makespan == 3 * (m + p - 1)  # F = 1, B = 2 per stage
    sched, results = _tanh_run("1f1b", 2, 2)
    messages = [r["p2p"] for r in results]
    messages[0] = [[row for row in rows if row[0] != "send"] for rows in messages[0]]  # device 0 never sends
    with pytest.raises(ValueError, match="received message 0 from device 0, which sent 0"):
        replay(sched, [r["order"] for r in results], messages)


@pytest.mark.xla
def test_p2p_rows_tell_the_schedules_apart(xla_world) -> None:
    """The ledger check compares each device's sends and receives with the ones PyTorch's order needs: GPipe's
    run does not pass as 1F1B's (so the check can fail), and each run passes as its own."""
    from shardlab.pipeline.case import p2p_of_order
    from shardlab.pipeline.torch_ref import torch_orders

    p, m = 4, 8
    runs = {name: _tanh_run(name, p, m) for name in ("gpipe", "1f1b")}
    for name, (sched, results) in runs.items():
        got = [[row for rows in r["p2p"] for row in rows] for r in results]
        for ref in ("gpipe", "1f1b"):
            want = p2p_of_order(torch_orders(ref, p, m), p, sched.device_of)
            assert (got == want) == (name == ref)


# ---- the harness: several schedules and PyTorch's pipelining in one gloo start-up ------------------------------
@pytest.mark.slow  # one start-up of two gloo processes, three schedules, ours and PyTorch's (~10-20 s)
def test_harness_runs_every_schedule_and_pytorchs_in_one_gloo_start_up() -> None:
    """``harness.gloo_runs`` (one start-up): per schedule, every rank's ledger equals the SimulatedWorld's rank by
    rank — numbered from 0, as if the schedule ran alone — and its sends are the schedule's (formula's count and
    bytes); ours and PyTorch's pipelining (the case's reference program) both equal the unsplit model, and
    PyTorch's point-to-point ops are ours."""
    from shardlab.core import harness
    from shardlab.pipeline.case import ScheduleCase
    from shardlab.pipeline.params import PipelineParams

    p = PipelineParams(stages=2, microbatches=4, virtual=2, batch=4, seq=8, hidden=32, heads=2, ffn=64, layers=4,
                       vocab=256, fsdp=False, run_gloo=True).validate()
    cases = [ScheduleCase(p, s) for s in ("gpipe", "1f1b", "interleaved")]
    runs = harness.gloo_runs(cases)
    for case, run in zip(cases, runs, strict=True):
        ((fn, args),) = case.program()
        sim = SimulatedWorld(case.ranks)
        sim.run(fn, *args)
        assert run["ledgers"] == sim.ledgers and run["ledger"] == sim.ledgers[0], case.schedule
        f = case.formula()
        sends = [e.payload_bytes for lg in run["ledgers"] for e in lg if e.op == "send"]
        assert (len(sends), sum(sends)) == (f[f"{case.schedule}.p2p.count"], f[f"{case.schedule}.p2p.bytes"])
        ref = case.oracle()
        _assert_parity(*merge_results(run["ranks"]), ref["loss"], ref["grads"])
        theirs = run["reference"]
        loss = next(r["loss"] for r in theirs if r["loss"] is not None)
        _assert_parity(loss, {k: g for r in theirs for k, g in r["grads"].items()}, ref["loss"], ref["grads"])
        for r in range(case.ranks):  # PyTorch batches its ops differently: the multiset of (op, peer, shape, dtype)
            key = sorted((e.op, e.peer, e.shape, e.dtype) for e in Ledger.from_records(theirs[r]["p2p"]))
            assert key == sorted((e.op, e.peer, e.shape, e.dtype) for e in run["ledgers"][r]), (case.schedule, r)


def test_one_gloo_start_up_needs_one_world_size() -> None:
    from shardlab.core import harness
    from shardlab.pipeline.case import ScheduleCase
    from shardlab.pipeline.params import PipelineParams

    a = ScheduleCase(PipelineParams(stages=2, microbatches=4, layers=4), "gpipe")
    b = ScheduleCase(PipelineParams(stages=4, microbatches=4, layers=8), "gpipe")
    rule = r"same number of ranks \(one process group\): ScheduleCase\(gpipe\) on 2, ScheduleCase\(gpipe\) on 4"
    with pytest.raises(ValueError, match=rule):
        harness.gloo_runs([a, b])
    with pytest.raises(ValueError, match="at least one case"):
        harness.gloo_runs([])


@pytest.mark.xla
def test_a_gloo_rank_unpickles_its_programs_without_torch_xla(xla_world) -> None:
    """What ``harness.gloo_runs`` ships to each rank (its rank runner, the case's program and PyTorch's reference,
    pickled by module) loads in a fresh interpreter without importing torch_xla or pandas — a rank that imported
    torch_xla paid ~2.7 s of CPU for nothing, one that imported the harness ~0.3 s."""
    import pickle
    import subprocess
    import sys

    from shardlab.core import harness
    from shardlab.fsdp.params import FsdpParams
    from shardlab.fsdp.torch_ref import TorchFsdpCase
    from shardlab.pipeline.case import ScheduleCase
    from shardlab.pipeline.params import PipelineParams
    from shardlab.tp.case import MlpCase
    from shardlab.tp.params import MlpParams

    blobs = [pickle.dumps(harness.run_programs)]  # what each rank runs: the cases' programs, then references
    for case in (ScheduleCase(PipelineParams(), "1f1b"), MlpCase(MlpParams(tp=4), backward=True),
                 TorchFsdpCase(FsdpParams(world_size=2))):
        blobs.append(pickle.dumps(harness._groups(case)[0]))
        ref = case.reference_program()
        if ref is not None:
            blobs.append(pickle.dumps(ref))
    code = ("import pickle, sys\nimport shardlab.comm.distributed\n"
            "for b in pickle.loads(sys.stdin.buffer.read()):\n    pickle.loads(b)\n"
            "print(sorted(m for m in ('torch_xla', 'jax', 'plotly', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(blobs), capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "[]", out.stdout
