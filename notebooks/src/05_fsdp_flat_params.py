# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
world_size = 8  # FSDP ranks N (SimulatedWorld ranks; the GSPMD mesh's fsdp axis)
layer_sizes = [30, 50, 10]  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
batch = 64  # global batch b, split evenly over the N ranks
align = False  # True: alignment padding like use_orig_params (16-byte parameter starts)
steps = 3  # training steps for the parity check
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
import time

from shardlab import runtime
from shardlab.fsdp.params import FsdpParams
from shardlab.profile import Recorder

_t0 = time.perf_counter()
p = FsdpParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 05 · FSDP: one flat parameter, sharded exactly as PyTorch does it
#
# Fully Sharded Data Parallelism (ZeRO stage 3) keeps only $1/N$ of every parameter, gradient and optimizer
# state on each of $N$ ranks (`world_size`; ZeRO's N). PyTorch's first implementation (FSDP1) does it with a
# **FlatParameter**: all parameters of a wrapped module — a *unit* — are concatenated into one 1-D buffer of
# $n$ elements, padded to $n_{pad} = N\cdot c$ with $c = \lceil n/N \rceil$, and rank $r$ keeps the slice
# $[rc, (r+1)c)$. One training step of one unit issues, with $e$ bytes per element:
#
# | when | collective | payload per rank | which units |
# |---|---|---|---|
# | before forward | all-gather (unshard) | $c\,e$ | every unit |
# | before backward (the unsharded copy was freed after forward) | all-gather | $c\,e$ | every unit **but the root** |
# | after backward | reduce-scatter of the flat gradient (averaged) | $n_{pad}\,e$ | every unit |
#
# The **root** is the outermost unit — the one whose forward runs first. PyTorch does not free its parameters
# after forward (they would be gathered again at once for the backward), so a model wrapped as a single unit —
# the root — issues **one** all-gather per step; a *nested* unit (a submodule wrapped first, as an auto-wrap
# policy does) frees after forward and gathers **twice**.
#
# Two views here, and PyTorch itself as the oracle: the **formula** (`shardlab.formulas.fsdp`, `.zero`), the
# **ledger** (our per-rank `FlatUnit` in a `SimulatedWorld`, which records every collective — no devices needed)
# and PyTorch's own `FlatParamHandle`. The same FSDP written as compiler annotations (GSPMD, on CPU and TPU),
# torch_xla's FSDPv2 and PyTorch's FSDP1 / FSDP2 on real processes are notebook 05b.

# %%
from dataclasses import replace

from shardlab.core import harness
from shardlab.fsdp.case import FlatCase, flat_param_handle_check

case = FlatCase(p)  # the MLP as one (root) unit
formula, ledger = harness.formula(case), harness.ledger(case)  # the ledger runs `steps` training steps on N ranks

# %% [markdown]
# ## 1 · The flat layout
# Parameters are flattened in module registration order (a shared parameter once). With `align=True`
# (`use_orig_params=True` in PyTorch) every parameter starts at a multiple of 16 bytes (4 float32 elements):
# padding filled with the named constant `FLAT_PARAM_PADDING_VALUE = 42` goes *between* parameters, and the
# total is padded to a multiple of $N$. Then `torch.chunk` semantics: $c=\lceil n/N\rceil$, and because
# `chunk` may return fewer than $N$ chunks, trailing ranks can be **empty** ($n=6, N=4$: 2, 2, 2, 0 — not
# 2, 2, 1, 1); each shard is zero-padded to $c$ (exercise 7 asks you to write this rule).

# %%
from shardlab.fsdp.flat_param import FLAT_PARAM_PADDING_VALUE

plan = ledger.detail["plans"][""]
print("alignment padding is filled with FLAT_PARAM_PADDING_VALUE =", FLAT_PARAM_PADDING_VALUE)
print(f"numels {list(plan.numels)} -> n = {formula['flat.numel']}, c = ceil({formula['flat.numel']}/{p.world_size})"
      f" = {formula['flat.shard_numel']}, n_pad = {formula['flat.padded_numel']}")
for r in plan.ranks[: min(p.world_size, 4)]:
    print(f"rank {r.rank}: flat [{r.start}, {r.end}] real {r.numel_unpadded} + pad {r.numel_padded}:",
          [tuple(x) for x in r.params])

# %% [markdown]
# The plan above is `shardlab.fsdp.flat_param` — integer arithmetic, no process group. Its oracle is PyTorch
# itself: `FlatParamHandle` built for every rank on a *fake* process group (the handle only needs rank and world
# size), sharded, every field of its shard metadata compared.

# %%
ok, bad_ranks = flat_param_handle_check(case)
rec.check("fsdp.flat.matches_torch_flat_param_handle", ok, f"ranks differing: {bad_ranks}")
print("PyTorch FlatParamHandle agrees on every rank:", ok)

# %% [markdown]
# ## 2 · The flat buffer, drawn
# Top bar: the padded flat parameter, one colour per parameter, alignment padding light grey (hatched),
# shard padding dark grey. Bottom bar: which rank owns which slice (device colours). A parameter that crosses
# a dashed line is split between ranks — `ShardParamInfo.intra_start..intra_end` (inclusive) says which part.

# %%
from shardlab.fsdp import figures as vf

names = [n for n, _ in case.model().named_parameters()]
vf.flat_buffer_figure(plan, names).show()

# %% [markdown]
# **Explorer.** Change the widths, the world size and the alignment; the bar and the padding count update.
# (Executed headless below with one programmatic update so the code path is tested.)

# %%
from shardlab.core.explorer import explorer_for
from shardlab.formulas.fsdp import flat_numel

ui, update = explorer_for(p, layer_sizes=p.layer_sizes, world_size=p.world_size, use_orig_params=p.align)
w = max(1, p.world_size - 1)  # move two widgets; the drawn plan must be that configuration's (formula by hand)
shown = update(world_size=w, use_orig_params=not p.align)
n = flat_numel(list(plan.numels), w, align=0 if p.align else 4)
rec.check("fsdp.viz.explorer_update", shown["ok"] and shown["plan"].padded_numel == w * -(-n // w),
          f"explorer: n_pad {shown.get('plan') and shown['plan'].padded_numel}; by hand N·ceil(n/N) = {w * -(-n // w)}")
ui

# %% [markdown]
# ## 3 · Padding waste: N·ceil(n/N) − n
# Without alignment the waste is at most $N-1$ elements per flat parameter; alignment adds up to 3 float32
# elements per parameter boundary. Negligible for a 7B model, visible for small units and many ranks.

# %%
import plotly.graph_objects as go

from shardlab.formulas.zero import padding_waste
from shardlab.fsdp.flat_param import plan_flat_shards

ws = list(range(1, 17))
waste_plain = [plan_flat_shards(list(plan.numels), w).padding_numel for w in ws]
waste_align = [plan_flat_shards(list(plan.numels), w, align=4).padding_numel for w in ws]
rec.check("fsdp.padding.formula_matches_plan", waste_plain == [padding_waste(sum(plan.numels), w) for w in ws],
          "N·ceil(n/N) - n equals the plan's padding for N = 1..16")
for w, plain, aligned in zip(ws, waste_plain, waste_align, strict=True):  # the report's padding-vs-N chart
    rec.measure(f"fsdp.padding.W{w}.chunk", plain, "elements", "ledger")
    rec.measure(f"fsdp.padding.W{w}.aligned", aligned, "elements", "ledger")
fig = go.Figure([go.Bar(x=ws, y=waste_plain, name="chunk padding only"),
                 go.Bar(x=ws, y=waste_align, name="with use_orig_params alignment")])
fig.update_layout(barmode="group", height=300, xaxis_title="ranks N (world_size)", yaxis_title="padding elements",
                  title=f"padding for n = {sum(plan.numels)} parameters")
fig.show()
print("examples:", {f"n={n},N={w}": padding_waste(n, w) for n, w in [(10, 4), (6, 4), (2060, 14), (7_500_000_000, 64)]})

# %% [markdown]
# ## 4 · One training step: formula vs ledger
# `FlatUnit(model, comm)` keeps its shard and all-gathers before forward. This model is a single unit, so it is
# the **root**: like PyTorch it keeps the unsharded parameters from forward to backward instead of freeing and
# re-gathering them. After backward it reduce-scatters the flat gradient (divided by $N$: every rank's loss is a
# mean over its $b/N$ rows of the global batch b) and runs Adam on its shard. The ledger's numbers are one step's collectives and the
# shard tensors each rank keeps; its checks include the order of the collectives and parity with unsharded
# training (below).

# %%
step_table = harness.record(rec, "fsdp", formula, ledger)
rec.measure("fsdp.step.wall", ledger.detail["wall_s"] / p.steps, "s", "timer", kind="timing")
one_step = ledger.detail["one_step"]
print(one_step.summary().to_string(index=False) if len(one_step) else "world_size 1: no communication")
step_table

# %% [markdown]
# With $N = 1$ the formula itself says "no collectives" (counts 0) and the ledger records none.
#
# ## 5 · Nested units: the root gathers once, every other unit twice
# Wrap the first Linear as its own unit first, then the whole model — what an auto-wrap policy does. The outer
# unit is the root and owns only the parameters no inner unit owns (the second Linear); the inner unit frees its
# parameters after its forward, so the backward gathers them again. Per step: root 1 all-gather + 1 reduce-scatter,
# inner 2 + 1. The ledger's order is the order PyTorch FSDP1 issues them (notebook 05b checks it against PyTorch
# on real processes): root all-gather, inner all-gather (forward); inner all-gather, inner reduce-scatter, root
# reduce-scatter (backward — the root's gradient reduction comes last).

# %%
from shardlab.tp import figures as vtp

if len(p.layer_sizes) >= 3:
    nested = FlatCase(replace(p, steps=1), nested=True)
    nested_ledger = harness.ledger(nested)
    display(harness.record(rec, "fsdp.nested", harness.formula(nested), nested_ledger))
    vtp.ledger_timeline(nested_ledger.detail["one_step"],
                        f"one step, inner unit (Linear 0) + root unit, N = {p.world_size}").show()
else:
    print(f"layer_sizes={list(p.layer_sizes)} has one Linear: no inner unit to nest (needs >= 3 widths)")

# %% [markdown]
# ## 6 · Per-rank memory vs ZeRO
# ZeRO's per-device model state for mixed-precision Adam is $(2+2+K)\Psi$ with $K=12$; stage 3 divides all of
# it by $N$. Our unit trains in float32 with Adam: 4 (param) + 4 (grad) + 8 (exp_avg, exp_avg_sq) = 16 bytes
# per element — the same 16 as $2+2+12$. With $\Psi$ = the padded flat numel $n_{pad}$ the measured bytes of the
# shard tensors equal $16\,n_{pad}/N$ exactly (the table above: `fsdp.memory.per_rank.bytes`); with $\Psi$ = the
# true parameter count the gap is the padding.

# %%
from shardlab.formulas.zero import zero_memory

measured = ledger.detail["ranks"][0].persistent_bytes
per_rank = ledger["memory.per_rank.bytes"]
psi = sum(plan.numels)
stages = [zero_memory(psi, p.world_size, s, k=8, param_bytes=4, grad_bytes=4).total for s in range(4)]
fig = go.Figure([go.Bar(x=[f"stage {s}" for s in range(4)], y=stages, name=f"ZeRO formula, Ψ = {psi}"),
                 go.Bar(x=["stage 3"], y=[per_rank], name="measured FlatUnit shard tensors")])
fig.update_layout(barmode="group", height=300, yaxis_title="bytes per rank",
                  title=f"model state per rank, N = {p.world_size} (fp32 Adam: 16 B/param)")
fig.show()
print("measured", measured, "| padding costs", per_rank - stages[3], "B per rank")
paper = [round(zero_memory(7.5e9, 64, s).total / 1e9, 1) for s in range(4)]
print("paper check, 7.5B on N = 64:", paper, "GB")
_ = rec.check("fsdp.zero.paper_figure_1", paper == [120.0, 31.4, 16.6, 1.9], f"{paper} GB")

# %% [markdown]
# ## 7 · Training parity
# The oracle is the same model trained **unsharded on the full batch** with `torch.optim.Adam`. The mean loss
# over $b$ rows is the average of the $N$ per-rank means over $b/N$ rows, so the averaged reduce-scattered
# gradient is the full-batch gradient, and Adam is elementwise: the shards must reassemble into the same
# parameters, up to float summation order (the ledger view's check `fsdp.parity.params_match_unsharded`).

# %%
print(ledger.checks["parity.params_match_unsharded"][1])

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. A flat parameter of $n=10$ elements on $N=4$ ranks: how many zero-padding elements does each rank hold?
#    (a list of 4 ints)
# 2. `layer_sizes = (30, 50, 10)` with `use_orig_params=True` on $N=8$: how many alignment-padding elements?
# 3. ZeRO stage 3, Ψ = 7.5B, N = 64, K = 12: GB of model state per device?
# 4. For n = 2060 parameters, which $N \le 16$ wastes the most padding, and how much? (as `(N, waste)`)
# 5. `layer_sizes = (30, 50, 10)` as one unit on $N = 8$ ranks (float32): how many bytes does each rank *send*
#    per step on the wire (ring model)?
# 6. Same model, but the first Linear wrapped as its own unit inside the root: how many all-gathers per step?
# 7. *Code: FSDP1's shard by hand.* Write `answer_7(flat, rank, world_size)`: given the padded-for-alignment flat
#    parameter (a 1-D tensor of n elements), return rank `rank`'s shard as FSDP1 keeps it — `torch.chunk`'s chunk,
#    zero-padded to $c$ elements. The grader runs it for every rank of five (n, N) pairs (an uneven split, an empty
#    trailing rank, more ranks than elements) and compares with PyTorch's own `FlatParamHandle._get_shard`.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # a list of 4 ints
answer_2 = None  # elements
answer_3 = None  # GB (1 GB = 1e9 bytes)
answer_4 = None  # (N, waste)
answer_5 = None  # bytes
answer_6 = None  # a count
answer_7 = None  # a function (flat, rank, world_size) -> tensor, e.g. def answer_7(flat, rank, world_size): ...
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5, answer_6, answer_7), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. $c = \lceil 10/4 \rceil = 3$: `torch.chunk` hands out 3, 3, 3 and the last 1 element; every shard is padded
#    to $c$.
# 2. Parameters 1500, 50, 500, 10: after 1500 + 50 = 1550 the 500-weight must start at a multiple of 4 (1552),
#    and 2062 is padded to a multiple of 8 (2064): two pads of 2.
# 3. Stage 3 divides all $(2+2+K)\Psi = 16\Psi$ bytes by $N$: $16 \cdot 7.5\cdot10^9 / 64$.
# 4. $N\lceil n/N\rceil - n$ is largest where $n$ is just above a multiple of $N$: $14 \cdot 148 = 2072$.
# 5. The model is the root unit: **one** all-gather, $(N-1)\,c\,e = 7 \cdot 258 \cdot 4$, plus one
#    reduce-scatter, $\frac{N-1}{N}\,n_{pad}\,e = \frac78 \cdot 2064 \cdot 4$. A non-root unit would add a second
#    all-gather: ZeRO-3's $3\Psi$ instead of $2\Psi$.
# 6. The inner unit is not the root: it frees after forward and gathers again in backward (2); the root once (1).
# 7. `c = -(-flat.numel() // world_size)`; `shard = flat[rank * c:(rank + 1) * c]` (a slice past the end is
#    empty, as `torch.chunk` then hands out no chunk); `torch.cat([shard, flat.new_zeros(c - shard.numel())])`.
# </details>

# %%
rec.measure("fsdp.notebook.wall", time.perf_counter() - _t0, "s", "timer", kind="timing")
rec.close()["status"]
