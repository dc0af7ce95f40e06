# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
stages = 4  # p: pipeline stages, the devices of the `stage` mesh axis and the ranks of the ledger
microbatches = 8  # m: microbatches per step (a multiple of stages: Megatron-LM's interleaved rule)
virtual = 2  # v: model chunks per device in the interleaved schedule (at least 2)
batch = 8  # sequences per step; one microbatch holds batch / microbatches of them
seq = 16  # tokens per sequence
hidden = 64  # h: the activation every cut hands over is [batch / m, seq, hidden]
heads = 4
ffn = 256  # MLP width of each transformer block
layers = 8  # transformer blocks, at least stages * virtual (a block's worth for every chunk)
vocab = 4096  # large next to hidden: the embedding and the LM head make the model's ends heavy
fsdp = True  # also compile the SPMD pipeline with its weights sharded over the second mesh axis
run_gloo = False  # also run the pipeline in `stages` real processes (gloo): ours and PyTorch's (slow)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.pipeline.params import PipelineParams
from shardlab.profile import Recorder

p = PipelineParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 09 · Pipeline parallelism: the bubble, the schedules, an automatic split, and what the compilers make of it
#
# Cut the model into **p stages**, one per device, and stream **m microbatches** through them: stage s works on
# microbatch i while stage s + 1 works on microbatch i − 1. Each stage boundary carries one activation forward and
# one gradient backward per microbatch — **point-to-point sends**, the one kind of communication the suite has not
# shown yet. The price is the **bubble**: at the start of a step the later stages wait for the first microbatch, at
# the end the earlier ones wait for the last backward.
#
# Four views, as in every notebook: the **formula** (Huang et al. 2019; Narayanan et al. 2021, §2.2), the
# **ledger** (each device's program, sends and receives recorded, in a `SimulatedWorld`), and the two
# **compilers**, which see the pipeline as ONE SPMD program (the GSPMD paper's circular pipeline, §3.3, as MaxText
# writes it) whose sends have become collective-permutes — GPipe's order when autograd differentiates the loop,
# 1F1B's when the backward is written into the loop body.

# %%
from fractions import Fraction

import pandas as pd
import torch

from shardlab.core import harness
from shardlab.formulas import pipeline as fpp
from shardlab.pipeline import figures as vpp
from shardlab.pipeline.case import (
    FsdpCase,
    ScheduleCase,
    ShiftCase,
    model_and_batch,
    spmd_ledger,
    traced_model,
)
from shardlab.pipeline.schedules import build
from shardlab.pipeline.timeline import simulate

torch.set_num_threads(1)  # tiny CPU matmuls: intra-op threads only spin against each other (and the ranks' threads)
P, M, V = p.stages, p.microbatches, p.virtual
SCHEDULES = ("gpipe", "1f1b", "interleaved")
cases = {s: ScheduleCase(p, s) for s in SCHEDULES}

# %% [markdown]
# ## 1 · The formula — and its two conventions
# Let $t_f$, $t_b$ be one microbatch's forward and backward through one stage. GPipe (Huang et al. 2019) runs every
# forward, then every backward; the step takes $(m + p - 1)(t_f + t_b)$ of which each device works $m(t_f + t_b)$.
# The bubble is $(p-1)(t_f + t_b)$, and it is quoted two ways — we keep both, under two names:
#
# | name | definition | GPipe / 1F1B | interleaved (v chunks per device) |
# |---|---|---|---|
# | `bubble_fraction` | bubble time / **step** time (the share of the step a device idles) | $\frac{p-1}{m+p-1}$ | $\frac{p-1}{vm+p-1}$ |
# | `bubble_ratio` | bubble time / **ideal** time (Narayanan et al.'s "bubble time fraction") | $\frac{p-1}{m}$ | $\frac{p-1}{vm}$ |
#
# **1F1B** (PipeDream-Flush) has the same bubble but starts each backward as soon as it can: stage s holds at most
# p − s microbatches' activations instead of m. **Interleaved 1F1B** gives each device v model chunks (stage k on
# device k mod p); the bubble shrinks by v, the boundaries — and so the sends — grow from p − 1 to pv − 1.
# Point-to-point bytes per step: $2m(pv-1)$ messages of one activation [b/m, s, h].

# %%
fr = {s: harness.formula(c) for s, c in cases.items()}
pd.DataFrame({s: {k.split(".", 1)[1]: v for k, v in f.values.items() if k.startswith(s + ".")}
              for s, f in fr.items()}, dtype=object)

# %% [markdown]
# ## 2 · The schedules, drawn
# A schedule is each device's ordered list of actions (`1F0`: stage 1, forward, microbatch 0). The timeline places
# every action as soon as its device is free and its input exists (the previous stage's forward, the next stage's
# backward), with backward = 2 × forward; idle time is hatched. The bubble is then *measured* from the order —
# exactly, in fractions — and must equal the formula.

# %%
timelines = {}
for s in SCHEDULES:
    sched = build(s, P, M, cases[s].v)
    sched.validate()
    t = timelines[s] = simulate(sched, forward=1, backward=2)
    v = cases[s].v
    rec.check(f"pp.{s}.timeline.bubble_fraction", t.idle_fraction == Fraction(P - 1, v * M + P - 1),
              f"measured {t.idle_fraction} = (p-1)/(vm+p-1)")
    rec.check(f"pp.{s}.timeline.bubble_ratio", t.bubble_ratio == Fraction(P - 1, v * M),
              f"measured {t.bubble_ratio} = (p-1)/(vm)")
    vpp.timeline_figure(t, formula=fpp.bubble_ratio(P, M, v)).show()

# %% [markdown]
# GPipe and 1F1B leave the same idle area — 1F1B only moves it — but on device 0 GPipe holds all m microbatches'
# activations at the turn, 1F1B at most p. The interleaved schedule's blocks are v times shorter, and so is its
# ramp.
#
# ### PyTorch's own schedules as the reference
# `torch.distributed.pipelining` ships `ScheduleGPipe`, `Schedule1F1B` and `ScheduleInterleaved1F1B`. Its
# single-stage schedules decide their order while they run; `torch_orders` runs PyTorch's own `_step_microbatches`
# on a recording stage, and reads the multi-stage schedules' `pipeline_order` (built on a fake process group). Ours
# must be the same lists, device by device. (PyTorch's *drawing* of 1F1B, `_get_pipeline_order()`, is not what it
# runs in torch 2.9.0: on the last rank it starts at F1 and draws a forward of microbatch m, which does not exist.)

# %%
from shardlab.pipeline.torch_ref import as_schedule, torch_drawn_order, torch_orders

for s in SCHEDULES:
    ours = [list(d) for d in build(s, P, M, cases[s].v).devices]
    rec.check(f"pp.{s}.torch_order", ours == torch_orders(s, P, M, cases[s].v),
              f"every device's action list == torch.distributed.pipelining's ({sum(map(len, ours))} actions)")
drawn = [a for a in torch_drawn_order("1f1b", P, M)[P - 1] if a is not None]
print(f"PyTorch's 1F1B drawing, last rank: starts at {drawn[0]}, draws {P - 1}F{M}: "
      f"{any(a.kind == 'F' and a.microbatch == M for a in drawn)}; it runs {torch_orders('1f1b', P, M)[P - 1][0]} first")

# %% [markdown]
# **Zero bubble** (Qi et al. 2024). A layer's backward is two matmuls: the input gradient dx = dy · Wᵀ, which the
# previous stage waits for, and the weight gradient dW = xᵀ · dy, which nobody waits for until the optimizer step.
# Split B into `I` (dx) and `W` (dW): the `I`s stay on the critical path, the `W`s move into the idle slots of the
# drain. The price is memory: x and dy stay alive from `I` until their `W` runs. PyTorch ships these schedules
# (`ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`, whose V-shaped placement puts the first and the last
# chunk on device 0); we read their orders and time them the same way (I = W = one forward per chunk).

# %%
zb = {name: simulate(as_schedule(name, P, M, 2), forward=1, backward=2) for name in ("interleaved_zb", "zbv")}
i2 = simulate(build("interleaved", P, M, 2), forward=1, backward=2)  # the same two chunks per device
rec.check("pp.zero_bubble.smaller", all(t.bubble_ratio < i2.bubble_ratio for t in zb.values()),
          ", ".join(f"{k} {t.bubble_ratio}" for k, t in zb.items()) + f" < interleaved 1F1B's {i2.bubble_ratio} (v=2)")
vpp.timeline_figure(zb["zbv"], title=f"PyTorch's ZBVZeroBubble: p={P}, m={M}").show()

# %% [markdown]
# **The p2p term.** So far a send cost nothing. `simulate(..., p2p=c)` makes every dependency between two devices
# wait c more time units (a send's latency plus its bytes over the link). GPipe's step grows by exactly 2(p − 1)·c:
# the first microbatch crosses p − 1 boundaries forward, the last one p − 1 back, and everything else overlaps.
# 1F1B's grows more: in its steady state each device alternates a forward and a backward that wait for messages
# from both neighbours, so latency lands on the critical path once per round trip. Interleaving multiplies the
# boundaries: p v − 1 of them. This is the reason to overlap the p2p with compute (and to batch a forward send
# with a backward receive, §4).

# %%
c = Fraction(1, 10)  # one send's latency, in units of a stage's forward
p2p_rows = {}
for s in SCHEDULES:
    sched = build(s, P, M, cases[s].v)
    grow = (simulate(sched, 1, 2, p2p=c).makespan - simulate(sched, 1, 2).makespan) / c
    p2p_rows[s] = {"step grows by (× c)": grow, "2 (p − 1)": 2 * (P - 1), "2 (p v − 1)": 2 * (P * cases[s].v - 1)}
rec.check("pp.timeline.p2p_gpipe_round_trip", p2p_rows["gpipe"]["step grows by (× c)"] == 2 * (P - 1),
          f"GPipe's step grows by {p2p_rows['gpipe']['step grows by (× c)']} c = 2(p-1) c: one round trip")
rec.check("pp.timeline.p2p_1f1b_at_least", p2p_rows["1f1b"]["step grows by (× c)"] >= 2 * (P - 1),
          f"1F1B's step grows by {p2p_rows['1f1b']['step grows by (× c)']} c >= 2(p-1) c")
pd.DataFrame(p2p_rows, dtype=object)

# %% [markdown]
# ## 3 · The automatic split (TorchAcc's)
# TorchAcc pipelines at the FX-graph level: it traces the model, finds where it can cut, and picks the cut points.
# We do the same on a small language model with **heavy ends** (vocabulary V = `vocab` next to h = `hidden`): trace
# with `torch.fx`, count each node's FLOPs with PyTorch's `FlopCounterMode`, keep the positions after which exactly
# one tensor is still needed (between blocks, or between a block's attention and its MLP), and choose the p − 1 cuts
# that minimise the slowest stage — exactly, by dynamic programming over the node order. The usual alternative cuts
# by layer count: L/p blocks per stage, the embedding first, the LM head and the loss last. The embedding is heavy in
# parameters (V·h) but costs no matmul FLOPs (it is a gather); the head is heavy in FLOPs (2·b·s·h·V forward).

# %%
from shardlab.formulas.flops import transformer_flops
from shardlab.pipeline.split import best_cuts, brute_force_cuts, compare_splits

traced = traced_model(p)
splits = compare_splits(traced, P, M)
display(vpp.split_figure({r: [3 * s.flops for s in c.stages] for r, c in splits.items()},
                         {r: [s.layers for s in c.stages] for r, c in splits.items()}))
for rule, c in splits.items():
    rec.measure(f"pp.split.max_stage_cost.{rule}", c.max_cost, "flops", "formula")
    rec.measure(f"pp.split.gpipe_step.{rule}", c.gpipe_step, "flop_time", "formula")
# the DP against every cut set, for 2 .. p + 1 stages on the traced costs and on seeded random costs over the same
# cut positions (where no single node dominates: the optimum is then not just the heaviest node, as it can be here)
gen = torch.Generator().manual_seed(p.seed)
random_costs = (torch.rand(len(traced.train_costs), generator=gen) + 0.5).tolist()
tries, untied = 0, 0
for costs in (traced.train_costs, random_costs):
    for n in range(2, min(P + 1, len(traced.frontier) + 1) + 1):
        dp, brute = best_cuts(costs, traced.frontier, n), brute_force_cuts(costs, traced.frontier, n)
        tries += dp.max_cost == brute.max_cost
        untied += brute.max_cost > max(costs)
rec.check("pp.split.dp_equals_brute_force", tries == 2 * (min(P + 1, len(traced.frontier) + 1) - 1),
          f"{tries} (cost vector, stage count) settings: DP's slowest stage = the best of every cut set; in {untied} "
          "of them the optimum exceeds the heaviest single node")
tf = transformer_flops(p.batch, p.seq, p.layers, p.hidden, p.ffn, p.heads, p.heads, p.vocab, gated_mlp=False)
rec.check("pp.split.costs_add_up", sum(traced.train_costs) == tf.model,
          f"traced nodes {sum(traced.train_costs):.4g} = formulas.flops {tf.model:.4g} FLOPs per step")
last = transformer_flops(p.batch, p.seq, p.layers // P, p.hidden, p.ffn, p.heads, p.heads, p.vocab, gated_mlp=False)
if p.layers % P == 0:
    rec.check("pp.split.even_last_stage", splits["even"].stages[-1].flops * 3 == last.model,
              f"even split's last stage = {p.layers // P} blocks + the head = {last.model:.4g} FLOPs")
pd.DataFrame({r: {"slowest stage (GFLOP)": c.max_cost / 1e9, "GPipe step (GFLOP-time)": c.gpipe_step / 1e9,
                  "1F1B step, timed (GFLOP-time)": c.one_f_one_b_step / 1e9,
                  "layers per stage": " | ".join(", ".join(s.layers) for s in c.stages)} for r, c in splits.items()},
             dtype=object)

# %% [markdown]
# The even split puts the LM head (2·b·s·h·V FLOPs forward, several blocks' worth at this vocabulary) on the last
# stage with L/p blocks beside it; every other stage then waits for it each microbatch. The automatic split gives
# the head a stage of its own (or nearly) and spreads the blocks over the rest. With unequal stages the slowest one
# sets the pace: the step is $\sum_s (f_s + b_s) + (m-1)\max_s(f_s + b_s)$ (a flow shop; `pipeline_step_time`); the
# table's third row times the 1F1B order on the same stage costs with the simulator.
#
# **At full size.** A planner that divides the whole model's FLOPs by the chips assumes equal stages. Llama 3 8B
# (32 layers, V = 128,256) at pp = 4 with 8 layers per stage: the last stage also runs the head (and the loss), and
# does more than a quarter of the work:

# %%
l3 = dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256)  # Llama 3 8B's published config
whole = transformer_flops(1, 8192, 32, **l3).model
last8 = transformer_flops(1, 8192, 8, **l3).model  # 8 blocks + the head
rec.measure("pp.split.llama3_8b_pp4.last_stage_over_mean", last8 / (whole / 4), "ratio", "formula")
print(f"Llama 3 8B, seq 8192, pp 4, 8 blocks per stage: last stage {last8 / 1e12:.2f} TFLOP per sequence vs the mean "
      f"{whole / 4 / 1e12:.2f}: {last8 / (whole / 4):.3f}x — the step is paced by it, not by whole / chips")

# %% [markdown]
# **Activation memory per stage.** FLOPs are half the story. Under 1F1B stage s holds min(p − s, m) microbatches'
# activations at once (GPipe: all m), so the first stages hold the most — and what one microbatch leaves behind
# differs per stage: the last holds the head's logits and the loss's log-probabilities ([b/m · s, V] each). Measured
# here with `torch.autograd.graph.saved_tensors_hooks` on each stage's GraphModule (one microbatch, the last stage
# with its loss; every saved tensor once per storage, parameters excluded) — the bytes autograd really keeps, which
# the traced nodes' output sizes do not bound (one block: 458,752 B of node outputs, more saved).

# %%
from shardlab.pipeline.split import even_cuts, split, stage_saved_bytes

_, tokens, targets = model_and_batch(p)
mb = p.batch // M
held = {}
for rule, cuts in (("auto", splits["auto"].cuts), ("even", even_cuts(traced, P))):
    per_mb = stage_saved_bytes(split(traced, cuts), tokens[:mb], targets[:mb])
    held[rule] = [b * min(P - s, M) for s, b in enumerate(per_mb)]
    rec.measure(f"pp.split.saved_bytes_per_microbatch.{rule}", per_mb, "bytes", "metrics")
    rec.measure(f"pp.split.1f1b_held_bytes_max.{rule}", max(held[rule]), "bytes", "metrics")
pd.DataFrame({f"{r}: held under 1F1B (KiB)": [b / 1024 for b in v] for r, v in held.items()},
             index=[f"stage {s}" for s in range(P)]).round(1)

# %% [markdown]
# A split that balances FLOPs alone can put the heaviest activations where the most microbatches wait: the stage
# with the most in flight (stage 0) decides whether 1F1B's memory fits, the head's stage whether its FLOPs keep up.
# Production splits weigh both (Megatron-LM's `--account-for-embedding-in-pipeline-split` and
# `--account-for-loss-in-pipeline-split` count the ends as a layer each, so the first and last stages get fewer
# blocks).
#
# ## 4 · The ledger: each device's program, every send recorded
# `pipeline_program(comm, schedule, stages, ...)` walks its device's action list: a forward receives the activation
# (`comm.recv`), runs its stage and sends the output on; a backward receives the output gradient, runs autograd and
# sends the input gradient back. Here sends are buffered (the simulated world copies the tensor into the peer's
# mailbox) and receives block. That does not make every valid order safe: an order can pass `validate()` and still
# deadlock (below) — and on NCCL a large send is not buffered at all, it completes when the peer posts its receive.
# A 1F1B steady state that first sends its activation forward and then waits for the gradient coming back would
# have both neighbours blocked in their sends; PyTorch's schedules post them together (`batch_isend_irecv` of a
# forward send with a backward receive), as Megatron-LM's `send_forward_recv_backward` does. The stages are the
# automatic split's GraphModules (p v of them for the interleaved schedule). Loss and **every parameter gradient**
# must equal the unsplit model's (up to fp32 summation order: m partial sums instead of one matmul over the whole
# batch).

# %%
from shardlab.pipeline.schedules import Action, Schedule

# each list alone is valid, together a cycle: device 0 waits in B(0,0) for device 1's B(1,0), which runs after
# F(1,1), which needs device 0's F(0,1) — queued behind B(0,0)
cycle = Schedule("cycle", 2, 2, 1, ((Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)),
                                    (Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0), Action("B", 1, 1))))
cycle.validate()  # passes
try:
    simulate(cycle)
    deadlocked = ""
except ValueError as exc:
    deadlocked = str(exc)
rec.check("pp.ledger.valid_order_can_deadlock", bool(deadlocked), deadlocked or "the cycle ran")
print(deadlocked)

# %%
led = {s: harness.ledger(c) for s, c in cases.items()}
pd.DataFrame({s: {k.split(".", 1)[1]: x for k, x in v.values.items()} for s, v in led.items()}, dtype=object)

# %% [markdown]
# The ledger's bubble is timed from what the programs *did*: each device's executed actions, each waiting for the
# actions whose sends it received — the messages in the ledger, not the schedule's dependency rule
# (`timeline.replay`). Its peak in-flight count is what each program really held in memory at once (interleaved:
# in chunks, 1/v of a stage). And each device's sends and receives, in order, must be exactly the ones PyTorch's
# order of the same schedule needs (`*.ledger.p2p_as_pytorch`).
#
# ### Real processes (`run_gloo`)
# The same programs in `stages` gloo processes, then **PyTorch's own pipelining** in the same processes:
# `PipelineStage` + `ScheduleGPipe` / `Schedule1F1B` / `ScheduleInterleaved1F1B`. One patch was needed: torch 2.9.0's
# `PipelineStage` warms its communicators up (`_get_init_p2p_neighbors_ops`) by sending an int64 scalar into a
# float32 buffer; NCCL does not check, gloo aborts ("Received data size doesn't match expected size", 8 vs 4 bytes).
# The warm-up only creates NCCL communicators, so `torch_pipeline_program` replaces it with no ops; then all three
# schedules run — shapes given up front, or (1F1B) inferred at run time by PyTorch's own metadata exchange.

# %%
if p.run_gloo:
    from shardlab.comm import Ledger
    from shardlab.pipeline.programs import merge_results

    gloo = dict(zip(cases, harness.gloo_runs(list(cases.values())), strict=True))  # one start-up for all
    for s in SCHEDULES:
        ours = gloo[s]["ranks"]
        loss, grads = merge_results(ours)
        ref = cases[s].oracle()
        sim_sends = [b for r in led[s].detail["ranks"] for b in r["sends"]]
        gl_sends = [e.payload_bytes for lg in gloo[s]["ledgers"] for e in lg if e.op == "send"]
        rec.check(f"pp.{s}.gloo.same_sends", sorted(gl_sends) == sorted(sim_sends),
                  f"{len(gl_sends)} sends, {sum(gl_sends)} bytes in gloo = the simulated world's")
        rec.check(f"pp.{s}.gloo.parity", torch.allclose(loss, ref["loss"], rtol=1e-6) and
                  cases[s].parity("ledger", ours, ref)[f"{s}.parity.ledger.grads"][0], "loss and gradients")
        theirs = gloo[s]["reference"]  # PyTorch's pipelining, run after ours in the same processes
        t_loss = next(r["loss"] for r in theirs if r["loss"] is not None)
        t_grads = {k: g for r in theirs for k, g in r["grads"].items()}
        scale = max(g.abs().max().item() for g in ref["grads"].values())
        rec.check(f"pp.{s}.torch.parity", torch.allclose(t_loss, ref["loss"], rtol=1e-6) and all(
            torch.allclose(t_grads[k], g, rtol=1e-5, atol=1e-5 * scale) for k, g in ref["grads"].items()),
                  "PyTorch's pipelining: loss and gradients == the unsplit model's")
        key = [sorted((e.op, e.peer, e.shape) for e in Ledger.from_records(r["p2p"])) for r in theirs]
        mine = [sorted((e.op, e.peer, e.shape) for e in lg) for lg in gloo[s]["ledgers"]]
        rec.check(f"pp.{s}.torch.same_p2p", key == mine, "PyTorch's isend / irecv ops == our sends / recvs, per rank")
else:
    print("gloo runs skipped (run_gloo=False): ours and PyTorch's pipelining in real processes take ~10-30 s")

# %% [markdown]
# ## 5 · The compilers: the pipeline as ONE SPMD program
# Under SPMD there is no "device 2's program": every device runs the same program on its shard. The pipeline
# becomes (`shardlab.pipeline.spmd`, the GSPMD paper's §3.3, MaxText's `pipeline.py`):
#
# - stage weights **stacked** W [v, p, h, h] and sharded over a `stage` mesh axis — stacking needs identical
#   stages, so an SPMD pipeline pipelines the repeated layers (MaxText keeps embedding and head outside); here each
#   stage is one tanh layer, handing over the same [b/m · s, h] activation as the language model's cut;
# - every stage's current activation in ONE buffer `state` [p, rows, h], sharded the same way;
# - a loop (`torch_xla`'s `scan`: one While loop) whose iteration shifts the buffer by one stage, feeds the next
#   microbatch into slot 0, and runs all stages at once — each device its own slot, locally.
#
# The shift is the only communication: one **collective-permute** of one shard per iteration, and autograd's
# reversed loop has the mirror permute. The loop runs T = v·m + p − 1 iterations, p − 1 of them filling or draining
# — **the bubble is the trip count**: (T − v·m)/T. GPipe uses a shift with zeros in front (`pad`), interleaved
# becomes the **circular** pipeline (v repeats; the last stage hands back to the first with a wrap-round `cat`;
# compiled forward only here — its backward loop mirrors it, and GPipe's program shows the backward).
# The mesh is (stage, data) = (p, n / p): the `data` axis runs n / p pipelines side by side on slices of every
# microbatch (data parallelism).
#
# **1F1B as one SPMD loop.** Autograd differentiates the whole forward loop before its reversed loop runs — GPipe's
# order. To get 1F1B's, write the backward into the loop body (`shardlab.pipeline.spmd_1f1b`): in each **tick**
# every stage runs, masked, one forward slot (stage s: microbatch t − s) and one backward slot (microbatch
# t − 2(p − 1) + s; the last stage differentiates the microbatch it has just run forward, from its loss). Two shifts
# per tick: activations s → s + 1, gradients s + 1 → s. Microbatch i's backward reaches stage s 2(p − 1 − s) ticks
# after its forward, so each stage keeps a stash of **2p − 1 slots whatever m is**, where GPipe's autograd loop
# keeps all m + p − 1 iterations. The price: m + 2(p − 1) ticks of forward + backward instead of m + p − 1 of each —
# a masked tick costs what a useful one does, so the loop idles 2(p − 1)/(m + 2(p − 1)) of its ticks, about twice
# GPipe's share (MaxText makes a trade of this kind with `pipeline_delay_activation_forwarding`). Its steady state
# is one forward and one backward per tick, as 1F1B; its warm-up is 2(p − 1 − s) forwards, twice PyTorch's
# Schedule1F1B's, because in a lockstep loop a gradient moves one stage per tick like an activation. The
# gradients are written by hand and checked against autograd through the dense layers.

# %%
hlo = {s: harness.hlo(c) for s, c in cases.items()}
tpu = {s: harness.tpu(c) for s, c in cases.items()}
harness.record_compile_s(rec, "pp.gpipe.compile_s", hlo["gpipe"], tpu["gpipe"])
harness.record_compile_s(rec, "pp.1f1b.compile_s", hlo["1f1b"], tpu["1f1b"])

from shardlab.pipeline.schedules import peak_inflight
from shardlab.pipeline.spmd_1f1b import tick_schedule

ticks = tick_schedule(P, M)  # the 1F1B loop's order, read from its masks, as action lists
ticks.validate()
tick_held = peak_inflight(ticks)
_ = rec.check("pp.spmd.1f1b.order_holds_2p_minus_1", tick_held == [min(2 * (P - 1 - s) + 1, M) for s in range(P)],
              f"the loop's order holds {tick_held} microbatches per stage (PyTorch's 1F1B: "
              f"{peak_inflight(build('1f1b', P, M))}); the stash has 2p - 1 = {2 * P - 1} slots")

# %% [markdown]
# ### The ledger on the compiled program's own layers
# The per-stage GPipe program runs the SPMD pipeline's tanh layers too: its loss and gradients equal the dense
# layers' (which the compiled program was checked against above), and its sends are the compiled loop's transfers
# minus the ones that carry no microbatch. Which ones those are, `spmd.idle_transfers` finds by following every
# slot through the loop (a for-loop, no formula): iteration t's shift carries what stage s computed at t − 1,
# microbatch t − 1 − s, so (p − 1)² of the (p − 1)(m + p − 1) pair-transfers of each pass carry nothing — and only
# iteration 0 shifts no microbatch at all. The transfers are counted in the compiled HLO (source-target pairs of
# each in-loop collective-permute × its trip count).

# %%
gp = cases["gpipe"]
mine = spmd_ledger(gp)
want = gp.oracle()["spmd"]
rec.check("pp.spmd.ledger.parity", torch.allclose(mine["loss"], want["loss"], rtol=1e-5) and all(
    torch.allclose(mine["grads"][f"w.0.{s}"], want["gw"][0, s], rtol=1e-5, atol=1e-5 * want["gw"].abs().max().item())
    for s in range(P)), "per-stage GPipe on the tanh layers == dense layers (loss, weight gradients)")
from shardlab.pipeline.spmd import idle_transfers

idle = idle_transfers(P, M)
got = next((v for v in (hlo["gpipe"], tpu["gpipe"]) if v.ran and "spmd.p2p.count" in v.values), None)
if got is not None:  # forward and autograd's mirror pass: twice the idle ones
    rec.check("pp.spmd.transfers_are_sends_plus_idle", got.values["spmd.p2p.count"] == mine["sends"] + 2 * idle["idle"],
              f"{got.source}: {got.values['spmd.p2p.count']} transfers in the compiled loops = {mine['sends']} sends "
              f"of the per-stage program + 2 x {idle['idle']} that carry no microbatch (followed slot by slot); "
              f"iterations shifting nothing: {idle['idle_iterations']} per pass")
if hlo["gpipe"].ran:  # what the loops carry per chip: the [T, ...] stacks are one slot per iteration
    for loop in hlo["gpipe"].detail.module.while_loops:
        print(f"XLA:CPU loop {loop.name}: {', '.join(str(a) for a in loop.state if a.dims[:1] == (P + M - 1,))}")
harness.memory_frame({f"{s} {src}": v for s in ("gpipe", "1f1b") for src, v in (("cpu", hlo[s]), ("tpu", tpu[s]))})

# %% [markdown]
# **Per-chip memory: the trade.** GPipe's forward loop saves what its backward needs for *every* iteration — the
# loops above carry stacks with a leading dimension T = m + p − 1 (the input stream, the outputs, and the saved
# activations [T, 1, rows / (n/p), h] per chip, bubble iterations included) — and the backward loop reads them in
# reverse: all m microbatches' activations are alive at the turn, as in GPipe's timeline. `torch_xla`'s scan also
# saves its carried weights once per iteration (a [T, 1, h, h] stack per chip): it cannot tell a loop-invariant carry
# from a changing one. The circular pipeline is differentiated the same way, so it has the interleaved schedule's
# bubble but GPipe's memory: v·m + p − 1 iterations saved. The 1F1B loop carries its two [1, 2p − 1, rows, h]
# stashes instead; what still grows with m is only the microbatches streaming in and the outputs and input
# gradients streaming out. XLA:TPU's peak per chip at m and 2m shows the slopes:

# %%
from dataclasses import replace

slope = {}
if all(tpu[s].ran and tpu[s].values.get("fits", 1) for s in ("gpipe", "1f1b")):
    p2 = replace(p, microbatches=2 * M, batch=2 * p.batch)  # the same microbatch, twice as many
    for s in ("gpipe", "1f1b"):
        twice = harness.tpu(ScheduleCase(p2, s))
        slope[s] = (twice.detail.memory.peak - tpu[s].detail.memory.peak) / M
        rec.measure(f"pp.spmd.{s}.tpu.peak_bytes_per_microbatch", slope[s], "bytes", "tpu")
    rec.check("pp.spmd.1f1b.memory_grows_slower", slope["1f1b"] < slope["gpipe"],
              f"XLA:TPU peak per chip grows {slope['1f1b']:,.0f} B per microbatch under the 1F1B loop, "
              f"{slope['gpipe']:,.0f} B under GPipe's")
    display(pd.DataFrame({s: {f"peak, m = {M}": tpu[s].detail.memory.peak, "peak per extra microbatch": slope[s]}
                          for s in slope}, dtype=object))
else:
    print("XLA:TPU views not compiled here: the memory slopes need them")
#
# ### What XLA:TPU does with the permutes
# Read from its per-chip program: each in-loop collective-permute is issued **asynchronously** (a start and a
# done), and `collective_permute.windows` lists, per permute, how many instructions the scheduler put between start
# and done and how many of them do matmul work — whether the shift is overlapped with a stage's matmul. The forward
# shift has nothing to hide behind: the iteration's matmul needs the shifted slot. The backward shift can: the
# weight gradient of the iteration (x^T · dy) does not wait for the gradient travelling to the previous stage — at
# the defaults XLA:TPU schedules one matmul fusion inside that window. XLA:CPU runs every collective synchronously.

# %%
from shardlab.pipeline.spmd import read_program

for s, view in tpu.items():
    if view.ran and view.values.get("fits", 1):
        got = read_program(view.detail.module)
        rec.measure(f"pp.{s}.tpu.collective_permute.async", len(got["collective_permute.windows"]), "count", "tpu")
        overlapped = sum(1 for _, dots in got["collective_permute.windows"] if dots)
        rec.measure(f"pp.{s}.tpu.collective_permute.overlapped", overlapped, "count", "tpu")
        print(f"{s}: in-loop permutes (instructions between start and done, of them matmul work): "
              f"{got['collective_permute.windows']}")
    else:
        print(f"{s}: no XLA:TPU program here ({view.skipped})")

# %% [markdown]
# ## 6 · Four ways, one number
# Per schedule: the formula, the ledger (language model, automatic split), and the two compilers (the SPMD
# program): bubble by formula = by the executed order = by the compiled trip count (GPipe, interleaved); sends by
# formula = ledger; the loop's transfers (`spmd.*p2p.count`, bubble iterations included) by formula = both
# compilers. The 1F1B loop's trip count gives its own idle share (`spmd.1f1b.bubble_fraction`, 2(p − 1) of
# m + 2(p − 1) ticks), not 1F1B's timeline bubble, and its stash depth is read from the loop state.

# %%
tables = {s: harness.record(rec, "pp", fr[s], led[s], hlo[s], tpu[s]) for s in SCHEDULES}
tables["gpipe"]

# %%
tables["1f1b"]

# %%
tables["interleaved"]

# %% [markdown]
# **Interpretation.** The bubble is a property of the order alone: formula, timed order and the compiled loop's
# trip count agree for GPipe and interleaved (the circular pipeline's v·m + p − 1 iterations), and 1F1B has
# GPipe's bubble with p instead of m microbatches held. What the SPMD programs hold is another matter: GPipe's and
# the circular pipeline's autograd loops keep every iteration (the circular one has the interleaved bubble with
# GPipe's memory), the 1F1B loop 2p − 1 slots for a longer loop. The ledger's sends are exactly 2m(pv − 1)
# activations of [b/m, s, h]; the compiled loops move more — they shift in every iteration, fill and drain
# included. XLA:CPU and XLA:TPU agree on the permutes (one per iteration per direction) but not on the
# data-parallel gradient sum: XLA:TPU all-reduces W's gradient once after the loop, XLA:CPU inside it, once per
# iteration.
#
# ## 7 · How the shift is written decides the collective
# The same values — slot s + 1 ← slot s — written four ways, each compiled alone on the (stage, data) mesh. The
# formula is the data movement: every slot moves to the next device, one collective-permute of one shard.

# %%
shift_rows = {}
for how in ("cat", "pad", "roll", "cat_zeros"):
    c = ShiftCase(p, how)
    views = [harness.formula(c), harness.hlo(c), harness.tpu(c)]
    harness.record(rec, "pp", *views, show=False)
    shift_rows[how] = {v.source: ", ".join(f"{v.values[f'shift.{how}.{op}.count']} {op.replace('_', '-')}"
                                           for op in c.shift_ops if v.values[f"shift.{how}.{op}.count"]) or "none"
                       for v in views if v.ran}
pd.DataFrame(shift_rows).T

# %% [markdown]
# `torch.cat([state[-1:], state[:-1]])` (the wrap-round) and `F.pad(state[:-1], ...)` are recognised as shifts by
# both partitioners: one collective-permute. `torch.roll` is not — and that is torch_xla's doing, not the
# partitioners': torch_xla lowers a roll to `concatenate(x, x)` followed by a `dynamic-slice` at a constant offset
# (printed below), which the partitioners then reshard over the sharded axis (XLA:CPU with all-to-alls and
# all-gathers, XLA:TPU with several permutes; how many depends on the mesh). JAX lowers a static `jnp.roll` to
# slice + concatenate — the `cat` form, one permute. Concatenating a **new zeros block** instead of padding
# computes the same values, yet XLA:CPU reshards it with all-to-alls (XLA:TPU finds the permute). In a pipeline
# that collective runs in every iteration: write the shift as `cat` or `pad`.

# %%
import torch_xla

rolled = torch.roll(torch.randn(P, 4, 8).to(runtime.device()), 1, 0)
lowered = torch_xla._XLAC._get_xla_tensors_hlo([rolled])  # the graph torch_xla hands to XLA, unpartitioned
roll_ops = [op for op in ("concatenate", "dynamic-slice", " slice(") if op in lowered]
rec.check("pp.shift.roll.torch_xla_lowering", roll_ops == ["concatenate", "dynamic-slice"],
          f"torch_xla's HLO for torch.roll, before any partitioning, uses {roll_ops}")
print("\n".join(line.strip() for line in lowered.splitlines() if "=" in line and "parameter" not in line))
#
# ## 8 · A 2-D mesh: stage × fsdp
# The `data` axis can also shard the weights (ZeRO-3 / FSDP inside the pipeline): W [1, p, h, h] split over stage
# and data, so each stage must gather its layer's shards before its matmul. The formula: one all-gather of the
# layer per iteration beside the shift — FSDP gathers a weight when it is used.

# %%
if p.fsdp:
    fc = FsdpCase(p)
    fviews = [harness.formula(fc), harness.hlo(fc), harness.tpu(fc)]
    display(harness.record(rec, "pp", *fviews))
else:
    print("2-D mesh skipped (fsdp=False)")

# %% [markdown]
# ## Explore
# Move p, m and v: the formulas and the timed orders of the three schedules, device 0's activations (in
# stage-microbatches) and the point-to-point traffic of one step with this notebook's [b/m, s, h] activation. Our
# interleaved order follows Megatron-LM's rule (m a multiple of p); PyTorch 2.9's `ScheduleInterleaved1F1B` runs
# more (m % max(1, m // p) == 0, e.g. p = 4, m = 6), so there the explorer times PyTorch's own order — its bubble
# is the formula's while m ≥ p, larger below. A combination neither can run is reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

msg = p.batch // M * p.seq * p.hidden * 4
ui, update = explorer_for(p, p=P, m=M, v=V, message_bytes=msg)
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("pp.explorer.update", shown["ok"], f"p={shown['p']} m={shown['m']} v={shown['v']}: timed = formula")
theirs = update(m=P + 1)  # not a multiple of p, but one round: PyTorch's order runs
rec.check("pp.explorer.pytorch_order_where_megatron_refuses", theirs["torch"] == ["interleaved"]
          and not theirs["errors"], f"m={P + 1}: interleaved timed in PyTorch's order, no error")
bad = update(m=2 * P + 1)  # two rounds of p do not divide 2p + 1: PyTorch refuses too
rec.check("pp.explorer.rejects_bad_combination", not bad["ok"] and bool(bad["errors"]), "; ".join(bad["errors"]))
update(m=M)
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. GPipe with p = 8 stages and m = 32 microbatches: what share of the step does each device idle
#    (`bubble_fraction`, a number between 0 and 1)?
# 2. Interleaved 1F1B with p = 8, v = 4, m = 32: how many point-to-point sends does one training step make, all
#    devices together (activations forward and gradients backward)?
# 3. 1F1B with p = 8, m = 32: how many microbatches' activations does stage 0 hold at most?
# 4. **Code.** Write `answer_4(p, m, s)` returning stage s's 1F1B action list as `[("F", 0), ("F", 1), ("B", 0), ...]`
#    (kind, microbatch). It is run on several (p, m, s), including m < p.
# 5. The SPMD GPipe program with p = 8 and m = 24 (forward and backward loops): how many collective-permutes does
#    it execute per step inside its loops?

# %%
from shardlab.core.exercises import Exercises
from shardlab.pipeline.solutions import SOLUTIONS

ex = Exercises(p.NOTEBOOK, rec, p.answers, solutions=SOLUTIONS)
answer_1 = None  # a fraction of the step
answer_2 = None  # a count
answer_3 = None  # a count
answer_4 = None  # a function (p, m, s) -> [(kind, microbatch), ...]
answer_5 = None  # a count
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. (p − 1)/(m + p − 1) = 7/39 ≈ 0.18 of the step; the paper's convention (bubble over ideal time) says 7/32.
# 2. p·v = 32 stages in a row have 31 boundaries; each of the 32 microbatches crosses each once forward and once
#    backward: 2·32·31 = 1984 (GPipe or 1F1B at p = 8: 2·32·7 = 448).
# 3. p − 1 = 7 warm-up forwards and one more before its first backward: 8 (GPipe: all 32).
# 4. `warm = min(p - 1 - s, m)` forwards; then while forwards remain: one forward, then the oldest backward; then
#    the remaining backwards. Stage p − 1 has no warm-up: F0 B0 F1 B1 …
# 5. T = m + p − 1 = 31 iterations, one permute each, and the backward loop as many: 62. Each permute moves p − 1 = 7
#    shards; of a pass's 7·31 = 217 pair-transfers, (p − 1)² = 49 carry no microbatch (the fill's and the drain's
#    empty slots), yet only iteration 0 shifts nothing at all — count them with `spmd.idle_transfers(8, 24)`.
# </details>
#
# ## Closing note: the numbers
# From this run's record (the report's `09_pipeline.json`). Reproduce: `python -m shardlab report --only 09`, or
# `pytest tests/test_nb_09_pipeline.py` (the notebook at several parameter sets), `pytest tests/test_pipeline_*.py`.

# %%
def val(s: str, name: str, src: str) -> str:
    """The value of pp.<name> in schedule s's view from src, formatted; "—" where that view did not run."""
    v = {"formula": fr, "ledger": led, "hlo": hlo, "tpu": tpu}[src][s]
    x = v.values.get(name) if v.ran else None
    return "—" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)


rows = {}
for s, c in cases.items():
    k = c.spmd_key
    rows[s] = {
        "bubble_fraction: formula": val(s, f"{s}.bubble_fraction", "formula"),
        "… by the executed order (ledger)": val(s, f"{s}.bubble_fraction", "ledger"),
        "… by the trip count (cpu / tpu)": f"{val(s, f'{s}.bubble_fraction', 'hlo')} / "
                                           f"{val(s, f'{s}.bubble_fraction', 'tpu')}",
        "trip count (cpu / tpu)": f"{val(s, f'{k}.trip_count', 'hlo')} / {val(s, f'{k}.trip_count', 'tpu')}",
        "sends per step: count / bytes (formula = ledger)": f"{val(s, f'{s}.p2p.count', 'ledger')} / "
                                                            f"{val(s, f'{s}.p2p.bytes', 'ledger')}",
        "loop transfers per step (cpu / tpu; circular: forward)": f"{val(s, f'{k}.p2p.count', 'hlo')} / "
                                                                  f"{val(s, f'{k}.p2p.count', 'tpu')}",
        "peak in flight (formula / ledger)": f"{val(s, f'{s}.peak_inflight_microbatches', 'formula')} / "
                                             f"{val(s, f'{s}.peak_inflight_microbatches', 'ledger')}",
        "SPMD program holds, per stage (formula)": f"{fpp.spmd_loop(s, P, M, c.v)['held']} "
                                                   + ("stash slots" if s == "1f1b" else "iterations (autograd)"),
    }
display(pd.DataFrame(rows, dtype=object))
print(f"split: slowest stage auto {splits['auto'].max_cost / 1e9:.4f} vs even {splits['even'].max_cost / 1e9:.4f} "
      f"GFLOP per step; GPipe step even / auto = {splits['even'].gpipe_step / splits['auto'].gpipe_step:.3f}")

# %%
rec.close()["status"]
