# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
world_size = 8  # FSDP ranks W (must divide num_devices for the GSPMD section)
layer_sizes = [30, 50, 10]  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
align = False  # True: alignment padding like use_orig_params (16-byte parameter starts)
steps = 3  # training steps for the parity check
batch = 64  # global batch, split evenly over the W ranks
torch_fsdp_world = 2  # ranks (gloo processes) for PyTorch FSDP1 / FSDP2; 0 skips it (process start-up ~20 s)

# %% [markdown]
# # 05 · FSDP: one flat parameter, sharded exactly as PyTorch does it
#
# Fully Sharded Data Parallelism (ZeRO stage 3) keeps only $1/W$ of every parameter, gradient and optimizer
# state on each of $W$ ranks. PyTorch's first implementation (FSDP1) does it with a **FlatParameter**: all
# parameters of a wrapped module are concatenated into one 1-D buffer of $N$ elements, padded to
# $P = W\cdot c$ with $c = \lceil N/W \rceil$, and rank $r$ keeps the slice $[rc, (r+1)c)$. One training step
# of one unit then issues
#
# | when | collective | payload per rank |
# |---|---|---|
# | before forward | all-gather (unshard) | $c\,b$ |
# | before backward (the unsharded copy was freed after forward) | all-gather | $c\,b$ |
# | after backward | reduce-scatter of the flat gradient (averaged) | $P\,b$ |
#
# We measure this three ways: the **formula** (`shardlab.formulas.fsdp`, `.zero`), the **ledger** (our own
# per-rank `FlatUnit` in a `SimulatedWorld` that records every collective) and the **compiler** (per-parameter
# FSDP as GSPMD annotations; collectives read from the partitioned HLO). The shard math itself is checked
# against PyTorch's own `FlatParamHandle`.

# %%
import time

import torch

from shardlab import runtime
from shardlab.profile import Recorder

_t0 = time.perf_counter()
# Validate every parameter before any XLA work (errors name the parameter and the rule).
if not isinstance(num_devices, int) or num_devices < 1:
    raise ValueError(f"num_devices={num_devices!r} must be a positive int")
if not isinstance(world_size, int) or world_size < 1:
    raise ValueError(f"world_size={world_size!r} must be an int >= 1")
if num_devices % world_size:
    raise ValueError(f"world_size={world_size} does not divide num_devices={num_devices} (the GSPMD mesh is "
                     f"(world_size, num_devices // world_size))")
if (not isinstance(layer_sizes, list | tuple) or len(layer_sizes) < 2
        or not all(isinstance(d, int) and d >= 1 for d in layer_sizes)):
    raise ValueError(f"layer_sizes={layer_sizes!r} must be a list of >= 2 positive ints (MLP widths)")
if not isinstance(align, bool):
    raise ValueError(f"align={align!r} must be True or False")
if not isinstance(steps, int) or steps < 1:
    raise ValueError(f"steps={steps!r} must be an int >= 1")
if not isinstance(batch, int) or batch < 1 or batch % world_size:
    raise ValueError(f"batch={batch!r} is not a positive multiple of world_size={world_size}")
if not isinstance(torch_fsdp_world, int) or not 0 <= torch_fsdp_world <= 4:
    raise ValueError(f"torch_fsdp_world={torch_fsdp_world!r} must be an int in [0, 4] (0 skips PyTorch FSDP)")

world = runtime.setup(num_devices=num_devices)
rec = Recorder("05_fsdp_flat_params", params=dict(num_devices=num_devices, seed=seed, world_size=world_size,
                                                   layer_sizes=list(layer_sizes), align=align, steps=steps,
                                                   batch=batch, torch_fsdp_world=torch_fsdp_world),
               results_dir=results_dir, world=world)
torch.manual_seed(seed)
world

# %% [markdown]
# ## 1 · The flat layout — formula
# Parameters are flattened in module registration order (a shared parameter once). With `align=True`
# (`use_orig_params=True` in PyTorch) every parameter starts at a multiple of 16 bytes (4 float32 elements):
# padding filled with the named constant `FLAT_PARAM_PADDING_VALUE = 42` goes *between* parameters, and the
# total is padded to a multiple of $W$. Then `torch.chunk` semantics: $c=\lceil N/W\rceil$, and because
# `chunk` may return fewer than $W$ chunks, trailing ranks can be **empty** ($N=6, W=4$: 2, 2, 2, 0 — not
# 2, 2, 1, 1); each shard is zero-padded to $c$.

# %%
from shardlab.fsdp.flat_param import FLAT_PARAM_PADDING_VALUE, plan_flat_shards, plan_flat_shards_for

print("alignment padding is filled with FLAT_PARAM_PADDING_VALUE =", FLAT_PARAM_PADDING_VALUE)
from shardlab.fsdp.train import TrainConfig, make_model

cfg = TrainConfig(layer_sizes=tuple(layer_sizes), batch=batch, steps=steps, optimizer="adam",
                  use_orig_params=align, seed=seed)
model = make_model(cfg)
names = [n for n, _ in model.named_parameters()]
plan = plan_flat_shards_for(model, world_size, use_orig_params=align)
b = 4  # float32 bytes


def flat_numel_formula(sizes, w, aligned):
    """N by hand: sum of numels, plus (aligned) padding to 4-element starts and to a multiple of w."""
    numels = [n for a, o in zip(sizes[:-1], sizes[1:], strict=True) for n in (a * o, o)]  # weight [o, a], bias [o]
    total = 0
    for n in numels:
        if aligned and total % 4:
            total += 4 - total % 4
        total += n
    if aligned and total % w:
        total += w - total % w
    return total


N = flat_numel_formula(list(layer_sizes), world_size, align)
c = -(-N // world_size)
print(f"numels {list(plan.numels)} -> N = {N}, c = ceil({N}/{world_size}) = {c}, P = {c * world_size}")
for r in plan.ranks[: min(world_size, 4)]:
    print(f"rank {r.rank}: flat [{r.start}, {r.end}] real {r.numel_unpadded} + pad {r.numel_padded}:",
          [tuple(p) for p in r.params])
rec.agree("fsdp.flat.numel", "elements", formula=N, ledger=plan.flat_numel)
_ = rec.agree("fsdp.flat.shard_numel", "elements", formula=c, ledger=plan.shard_numel)

# %% [markdown]
# The "ledger" column above is `shardlab.fsdp.flat_param`'s plan. Its oracle is PyTorch itself: we build
# PyTorch's `FlatParamHandle` for every rank on a *fake* process group (no communication — the handle only
# needs rank and world size), call `shard()` and compare every field of its shard metadata.

# %%
import copy

import torch.distributed as dist
from torch.distributed.fsdp._flat_param import FlatParamHandle, HandleShardingStrategy
from torch.testing._internal.distributed.fake_pg import FakeStore


def torch_handle(rank):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        m = copy.deepcopy(model)
        h = FlatParamHandle(list(m.parameters()), m, torch.device("cpu"), HandleShardingStrategy.FULL_SHARD,
                            False, None, None, False, dist.group.WORLD, align)
        h.shard()
        return h.flat_param
    finally:
        dist.destroy_process_group()


mismatches = []
for r in range(world_size):
    fp = torch_handle(r)
    theirs = {i: tuple(info)[1:] for i, info in enumerate(fp._shard_param_infos) if info.in_shard}
    ours = {p.param_index: tuple(p)[1:] for p in plan.ranks[r].params}
    if (theirs != ours or fp.numel() != plan.shard_numel or fp._shard_numel_padded != plan.ranks[r].numel_padded
            or list(fp._numels_with_padding) != [s.numel for s in plan.segments]):
        mismatches.append(r)
rec.check("fsdp.flat.matches_torch_flat_param_handle", not mismatches, f"ranks differing: {mismatches}")
print("PyTorch FlatParamHandle agrees on every rank:", not mismatches)

# %% [markdown]
# ## 2 · The flat buffer, drawn
# Top bar: the padded flat parameter, one colour per parameter, alignment padding light grey (hatched),
# shard padding dark grey. Bottom bar: which rank owns which slice (device colours). A parameter that crosses
# a dashed line is split between ranks — `ShardParamInfo.intra_start..intra_end` (inclusive) says which part.

# %%
from shardlab.viz import fsdp as vf

vf.flat_buffer_figure(plan, names).show()

# %% [markdown]
# **Explorer.** Change the widths, the world size and the alignment; the bar and the padding count update.
# (Executed headless below with one programmatic update so the code path is tested.)

# %%
ui, update = vf.explorer(tuple(layer_sizes), world_size, align)
shown = update(world_size=max(1, world_size - 1), use_orig_params=not align)
rec.check("fsdp.viz.explorer_update", shown["ok"] and shown["plan"].world_size == max(1, world_size - 1))
ui

# %% [markdown]
# ## 3 · Padding waste: W·ceil(N/W) − N
# Without alignment the waste is at most $W-1$ elements per flat parameter; alignment adds up to 3 float32
# elements per parameter boundary. Negligible for a 7B model, visible for small units and many ranks.

# %%
import plotly.graph_objects as go

from shardlab.formulas.zero import padding_waste

ws = list(range(1, 17))
waste_plain = [plan_flat_shards(list(plan.numels), w).padding_numel for w in ws]
waste_align = [plan_flat_shards(list(plan.numels), w, align=4).padding_numel for w in ws]
rec.check("fsdp.padding.formula_matches_plan", waste_plain == [padding_waste(sum(plan.numels), w) for w in ws],
          "W·ceil(N/W) - N equals the plan's padding for W = 1..16")
fig = go.Figure([go.Bar(x=ws, y=waste_plain, name="chunk padding only"),
                 go.Bar(x=ws, y=waste_align, name="with use_orig_params alignment")])
fig.update_layout(barmode="group", height=300, xaxis_title="world size W", yaxis_title="padding elements",
                  title=f"padding for N = {sum(plan.numels)} parameters")
fig.show()
print("examples:", {f"N={n},W={w}": padding_waste(n, w) for n, w in [(10, 4), (6, 4), (2060, 14), (7_500_000_000, 64)]})

# %% [markdown]
# ## 4 · One training step on the ledger, vs the formula
# `FlatUnit(model, comm)` keeps its shard, all-gathers before forward, frees the unsharded copy after
# forward, all-gathers again when the backward reaches it (a hook on the unit's output), reduce-scatters the
# flat gradient (divided by $W$: every rank's loss is a mean over its $B/W$ rows) and runs Adam on its shard.

# %%
from shardlab.comm import SimulatedWorld
from shardlab.formulas.fsdp import flat_rank_memory, flat_step_comm
from shardlab.fsdp.train import fsdp_rank_program, reference_train
from shardlab.fsdp.unit import unflatten

sim = SimulatedWorld(world_size)
_t = time.perf_counter()
results = sim.run(fsdp_rank_program, cfg)
train_s = time.perf_counter() - _t
one_step = list(sim.ledger)[: len(sim.ledger) // steps]
print(sim.ledger.summary() if len(sim.ledger) else "world_size 1: no communication")
f = flat_step_comm(plan.flat_numel, world_size, elem_bytes=b, root=True)  # the whole model is one (root) unit
led_ag = sum(e.payload_bytes for e in one_step if e.op == "all_gather")
led_rs = sum(e.payload_bytes for e in one_step if e.op == "reduce_scatter")
if world_size > 1:
    rec.agree("fsdp.flat.padded_numel", "elements", formula=c * world_size,
              ledger=one_step[-1].payload_bytes // b)
    rec.check("fsdp.step.order", [(e.op, e.phase) for e in one_step] == [
        ("all_gather", "forward"), ("reduce_scatter", "backward")],  # root unit: not resharded after forward
        str([(e.op, e.phase) for e in one_step]))
else:
    rec.measure("fsdp.flat.padded_numel", c * world_size, "elements", "formula")
# W = 1: the formula itself says "no collectives" (counts 0) and the ledger records none
rec.agree("fsdp.step.all_gather.bytes", "bytes", formula=f.all_gather_bytes, ledger=led_ag)
rec.agree("fsdp.step.reduce_scatter.bytes", "bytes", formula=f.reduce_scatter_bytes, ledger=led_rs)
rec.measure("fsdp.step.wall", train_s / steps, "s", "timer", kind="timing")
print(f"per step: all-gather {led_ag} B (= c·b = {c}·{b}: the root unit gathers once), reduce-scatter {led_rs} B (= P·b = {c * world_size}·{b})")

# %% [markdown]
# ## 5 · Per-rank memory vs ZeRO
# ZeRO's per-device model state for mixed-precision Adam is $(2+2+K)\Psi$ with $K=12$; stage 3 divides all of
# it by $N$. Our unit trains in float32 with Adam: 4 (param) + 4 (grad) + 8 (exp_avg, exp_avg_sq) = 16 bytes
# per element — the same 16 as $2+2+12$. With $\Psi$ = the padded flat numel $P$ the measured bytes of the
# shard tensors must equal $16P/N$ exactly; with $\Psi$ = the true parameter count the gap is the padding.

# %%
from shardlab.formulas.zero import zero_memory

P = plan.padded_numel
measured = results[0].persistent_bytes
per_rank = sum(measured.values())
z3 = zero_memory(P, world_size, 3, k=8, param_bytes=4, grad_bytes=4)
rec.agree("fsdp.memory.per_rank.bytes", "bytes", formula=int(z3.total), ledger=per_rank)
rec.check("fsdp.memory.all_ranks_equal", all(sum(r.persistent_bytes.values()) == per_rank for r in results))
mem = flat_rank_memory(plan.flat_numel, world_size, elem_bytes=b)
rec.check("fsdp.memory.peak_unsharded", results[0].peak_unsharded_bytes == mem.unsharded_param + mem.unsharded_grad,
          f"measured {results[0].peak_unsharded_bytes} B, formula 2·P·b = {2 * P * b} B")
psi = sum(plan.numels)
stages = [zero_memory(psi, world_size, s, k=8, param_bytes=4, grad_bytes=4).total for s in range(4)]
fig = go.Figure([go.Bar(x=[f"stage {s}" for s in range(4)], y=stages, name=f"ZeRO formula, Ψ = {psi}"),
                 go.Bar(x=["stage 3"], y=[per_rank], name="measured FlatUnit shard tensors")])
fig.update_layout(barmode="group", height=300, yaxis_title="bytes per rank",
                  title=f"model state per rank, W = {world_size} (fp32 Adam: 16 B/param)")
fig.show()
print("measured", measured, "| padding costs", per_rank - stages[3], "B per rank")
print("paper check, 7.5B on N = 64:", [round(zero_memory(7.5e9, 64, s).total / 1e9, 1) for s in range(4)], "GB")
_ = rec.check("fsdp.zero.paper_figure_1", [round(zero_memory(7.5e9, 64, s).total / 1e9, 1) for s in range(4)]
              == [120.0, 31.4, 16.6, 1.9])

# %% [markdown]
# ## 6 · Training parity
# The oracle is the same model trained **unsharded on the full batch** with `torch.optim.Adam`. The mean loss
# over $B$ rows is the average of the $W$ per-rank means over $B/W$ rows, so the averaged reduce-scattered
# gradient is the full-batch gradient, and Adam is elementwise: the shards must reassemble into the same
# parameters (up to float summation order).

# %%
ours = unflatten(plan, [r.shard for r in results], results[0].shapes)
ref, ref_losses = reference_train(cfg)
err = max(float((a - r_).abs().max()) for a, r_ in zip(ours, ref, strict=True))
print(f"max |FSDP - unsharded| after {steps} steps: {err:.2e}; full-batch losses {[round(x, 5) for x in ref_losses]}")
_ = rec.check("fsdp.parity.params_match_unsharded", err < 1e-5, f"max abs err {err:.2e}")

# %% [markdown]
# ## 7 · The compiler's view: per-parameter FSDP under GSPMD
# FSDPv2-style: each weight's dim 0 is sharded over an `fsdp` mesh axis with `mark_sharding` (activations
# kept batch-sharded, like torch_xla's `SpmdFullyShardedDataParallel`), and XLA's partitioner inserts the
# collectives. FSDP's three steps are written as sharding constraints in each Linear (`gspmd._FsdpLinear`):
# *unshard* = a replicated copy of the weight before forward and again in backward (→ all-gather), the
# backward saves only the sharded weight, and the gradient is made replicated then dim-0 sharded
# (→ all-reduce + dynamic-slice). Annotating only the parameters is not enough: on mesh (fsdp 2, replica 4)
# the partitioner then picks another algorithm that also uses the replica axis (collective-permutes plus an
# all-gather over the 4 replica devices — torch_xla's wrapper below shows it). With $W=1$ nothing is sharded
# and the formula and the HLO both say: no collective. We compile the forward and the backward+SGD update as two graphs (only sharded parameters
# survive between them — FSDP's "free after forward") and read the collectives from the partitioned HLO.
# **On CPU XLA never emits `reduce-scatter`: it emits all-reduce + dynamic-slice; we count each such
# all-reduce (the non-scalar all-reduces of the backward graph) as one reduce-scatter.**

# %%
from shardlab.formulas.fsdp import per_param_step_bytes
from shardlab.fsdp.gspmd import gspmd_step, mlp_backward_needed

g = gspmd_step(TrainConfig(layer_sizes=tuple(layer_sizes), batch=batch, optimizer="sgd", seed=seed), world_size)
gf = per_param_step_bytes(g.shapes, world_size, mlp_backward_needed(make_model(cfg)), elem_bytes=b)
rec.agree("fsdp.gspmd.step.collective.bytes", "bytes", formula=gf.total, hlo=g.measured.total)
rec.agree("fsdp.gspmd.step.all_gather.bytes", "bytes", formula=gf.all_gather_forward + gf.all_gather_backward,
          hlo=g.measured.all_gather_forward + g.measured.all_gather_backward)
rec.agree("fsdp.gspmd.step.reduce_scatter.bytes", "bytes", formula=gf.reduce_scatter, hlo=g.measured.reduce_scatter)
rec.agree("fsdp.gspmd.step.reduce_scatter.count", "count", formula=gf.reduce_scatter_count,
          hlo=g.measured.reduce_scatter_count)
rec.measure("fsdp.gspmd.step.all_reduce_dynamic_slice.count", g.rs_pairs_with_dynamic_slice, "count", "hlo")
rec.measure("fsdp.step.collective.bytes", led_ag + led_rs, "bytes", "ledger")
rec.measure("fsdp.step.collective.bytes", f.all_gather_bytes + f.reduce_scatter_bytes, "bytes", "formula")
print(f"HLO: {g.measured}\nloss all-reduce (not FSDP traffic): {g.other_all_reduce_bytes} B; "
      f"{g.rs_pairs_with_dynamic_slice}/{g.measured.reduce_scatter_count} gradient all-reduces were seen feeding a "
      "dynamic-slice by the parser (uneven dims add a pad/slice step in between)")

# torch_xla's own FSDPv2 wrapper (SpmdFullyShardedDataParallel around every Linear): it shards each parameter's
# LARGEST dimension (shard_maximal=True), so its formula uses rule="largest".
# It annotates only parameters and outputs, so the partitioner may choose a different algorithm (strict=False:
# report it instead of raising); the FSDP formula is compared only with an FSDP-shaped HLO.
g2 = gspmd_step(TrainConfig(layer_sizes=tuple(layer_sizes), batch=batch, optimizer="sgd", seed=seed), world_size,
                wrapper="torch_xla_fsdpv2", strict=False)
gf2 = per_param_step_bytes(g2.shapes, world_size, mlp_backward_needed(make_model(cfg)), elem_bytes=b,
                           rule="largest")
if g2.is_fsdp:
    rec.agree("fsdp.gspmd_fsdpv2.step.collective.bytes", "bytes", formula=gf2.total, hlo=g2.measured.total)
else:  # a different algorithm: measure what it moves, do not pretend it is the FSDP algebra
    for op, nbytes in g2.resharding.items():
        rec.measure(f"fsdp.gspmd_fsdpv2.step.{op.replace('-', '_')}.bytes", nbytes, "bytes", "hlo")
    rec.measure("fsdp.gspmd_fsdpv2.step.all_gather_all_reduce.bytes", g2.measured.total, "bytes", "hlo")
    rec.measure("fsdp.gspmd_fsdpv2.step.collective.bytes", gf2.total, "bytes", "formula")
    print(f"torch_xla FSDPv2 at W={world_size}: the partitioner resharded over the replica axis, {g2.resharding} "
          f"B besides all-gathers/all-reduces of {g2.measured.total} B; the per-parameter formula ({gf2.total} B) "
          "describes a different algorithm and is not compared")
import pandas as pd


def _col(ag_f, ag_b, rs):
    return [ag_f, ag_b, rs, ag_f + ag_b + rs]


pd.DataFrame({
    "flat FSDP1 (ledger)": _col(led_ag // 2, led_ag // 2, led_rs),
    "dim-0 GSPMD (HLO)": _col(*g.measured[:3]),
    "torch_xla FSDPv2, largest dim (HLO)" + ("" if g2.is_fsdp else " + resharding, see above"): _col(*g2.measured[:3]),
}, index=["forward all-gather B", "backward all-gather B", "reduce-scatter B", "total B"])

# %% [markdown]
# **Why the columns differ.** (1) *Padding granularity*: the flat design pads the total $N$ once to a
# multiple of $W$; per-parameter sharding pads every sharded dimension to $\lceil d/W \rceil$ (a bias of 10 on
# 8 ranks becomes 16; torch_xla's FSDPv2 shards a $10\times 50$ weight on its 50-wide dim instead of its 10 rows). (2) *What the backward regathers*: FSDP1 regathers the whole flat parameter; the
# compiler gathers only the weights autograd reads for $dX_l = dY_l W_l$ — layer 1's input is data and biases
# are never read — so the backward all-gather is smaller. (3) The gradient reduce-scatter moves the full
# unpadded gradients in both, plus the flat design's padding.
#
# ## 8 · PyTorch's own FSDP1 and FSDP2, on real gloo processes
# Same model, `FullyShardedDataParallel` (one FlatParameter) and `fully_shard` (FSDP2, per-parameter DTensor
# shards on dim 0), in `torch_fsdp_world` gloo processes (one launch runs both; process start-up dominates).

# %%
if torch_fsdp_world:
    from shardlab.comm import DistributedWorld
    from shardlab.formulas.fsdp import per_param_shard
    from shardlab.fsdp.torch_ref import torch_fsdp_both_program

    wt = torch_fsdp_world
    small = TrainConfig(layer_sizes=tuple(layer_sizes), batch=wt * 2, steps=1, optimizer="adam",
                        use_orig_params=align, seed=seed)
    _t = time.perf_counter()
    both = DistributedWorld(wt).run(torch_fsdp_both_program, small)
    rec.measure("fsdp.torch.gloo_run.wall", time.perf_counter() - _t, "s", "timer", kind="timing")
    t1, t2 = [x[0] for x in both], [x[1] for x in both]
    plan_t = plan_flat_shards_for(make_model(small), wt, use_orig_params=align)
    ours_t = SimulatedWorld(wt).run(fsdp_rank_program, small)
    ok1 = all(t["shard_numel"] == plan_t.shard_numel and t["numel_padded"] == plan_t.ranks[r].numel_padded
              and torch.allclose(t["shard"], ours_t[r].shard, rtol=1e-5, atol=1e-6) for r, t in enumerate(t1))
    rec.check("fsdp.torch.fsdp1_matches_flat_unit", ok1, f"W={wt}: shard sizes, padding and trained shards")
    ok2 = all((p["local_shape"], p["padded_shape"]) == per_param_shard(p["orig_shape"], wt, r)
              for r, t in enumerate(t2) for p in t["params"])
    rec.check("fsdp.torch.fsdp2_per_param_shards", ok2, "dim-0 chunk rule, padded to ceil(d0/W)")
    print("FSDP1 shard numel per rank", [t["shard_numel"] for t in t1], "(ours", plan_t.shard_numel, ")")
    print("FSDP2 local shard shapes on rank", wt - 1, [p["local_shape"] for p in t2[-1]["params"]],
          "padded", [p["padded_shape"] for p in t2[-1]["params"]])

# %% [markdown]
# **From FSDP1 to FSDP2.** The FlatParameter made communication efficient (one big all-gather per unit, no
# per-parameter launch overhead) but it is awkward everywhere else: an original parameter can be split across
# two ranks (see the bar above), so per-parameter operations — freezing some weights, per-parameter optimizer
# settings, loading/saving a state dict, mixing dtypes — need views into a shared buffer
# (`use_orig_params`, alignment padding, the `_shard_param_infos` bookkeeping). FSDP2 (`fully_shard`) shards
# **each parameter on dim 0** as a DTensor: every rank holds a well-defined row block of every parameter, state
# dicts are plain DTensors, and it composes with tensor parallelism on a 2-D mesh. The all-gather still
# batches all parameters of a unit into one call (copy-in/copy-out), so the communication pattern stays
# FSDP-shaped — exactly the per-parameter layout GSPMD uses above. The price is per-parameter padding (row
# granularity) instead of one pad for the whole buffer.

# %% [markdown]
# ## 9 · Exercises (answers are asserted — expand the cell after trying)
# 1. A flat parameter of $N=10$ elements on $W=4$ ranks: how many zero-padding elements does each rank hold?
# 2. `layer_sizes = [30, 50, 10]` with `use_orig_params=True` on $W=8$: how many alignment-padding elements?
# 3. ZeRO stage 3, Ψ = 7.5B, N = 64, K = 12: GB of model state per device?
# 4. For N = 2060 parameters, which $W \le 16$ wastes the most padding, and how much?
# 5. Per step, how many bytes does each rank *send* on the wire (ring model) for the default flat unit?

# %% jupyter={"source_hidden": true}
ans1 = [0, 0, 0, 2]  # c = 3: 3, 3, 3, 1 real
ans2 = 4  # 1500 + 50 = 1550 -> +2 to 1552; +500 +10 = 2062 -> +2 to 2064 (multiple of 8)
ans3 = 1.875  # 16 · 7.5e9 / 64 bytes
ans4 = (14, 12)  # 14 · ceil(2060/14) = 14 · 148 = 2072
assert [r.numel_padded for r in plan_flat_shards([10], 4).ranks] == ans1
assert plan_flat_shards_for(make_model(TrainConfig(layer_sizes=(30, 50, 10))), 8, True).align_padding_numel == ans2
assert zero_memory(7.5e9, 64, 3).total / 1e9 == ans3
assert max((padding_waste(2060, w), w) for w in range(1, 17))[::-1] == ans4
wire = f.wire_bytes(world_size)
ans5 = (world_size - 1) * c * b + (world_size - 1) / world_size * c * world_size * b  # root: 1 all-gather
assert abs(sum(e.wire_bytes for e in one_step) - ans5) < 1e-6 and abs(wire - ans5) < 1e-6
rec.check("fsdp.exercises", True, "all answers asserted")
print("exercise answers:", ans1, ans2, ans3, ans4, ans5)

# %%
rec.measure("fsdp.notebook.wall", time.perf_counter() - _t0, "s", "timer", kind="timing")
rec.table("fsdp.")

# %%
rec.close()
