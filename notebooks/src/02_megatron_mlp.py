# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
tp = 4  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
batch = 2
seq = 8
hidden = 64
dtype = "float32"  # "float32" or "bfloat16"
ffn = 256  # MLP inner size (4 * hidden in GPT)
run_gloo = True  # also run the per-rank code in tp real processes (torch.distributed, gloo)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.profile import Recorder
from shardlab.tp.params import MlpParams

p = MlpParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 02 · Megatron MLP: column-parallel, GeLU, row-parallel — one all-reduce each way
#
# The transformer MLP is $z = \mathrm{GeLU}(xA)\,B$ with the activation $x$: [b·s, h], $A$: [h, F], $B$: [F, h]
# (F = `ffn`, the FFN width; lower-case letters are activations, capital X a mesh axis — notebook 00's notation).
# Megatron (Shoeybi et al. 2019, §3) splits **A by columns** and **B by rows**:
#
# $$A = [A_1, \dots, A_p] \;(A[H, F_X]),\qquad B = \begin{bmatrix}B_1\\ \vdots \\ B_p\end{bmatrix}\;(B[F_X, H])$$
#
# Device $i$ computes $y_i = \mathrm{GeLU}(xA_i)$ on its own — GeLU is elementwise, so the column split needs no
# communication — then the partial $z_i = y_iB_i$ (`z{U_X}`), and **one all-reduce** sums them. The paper names the
# two operators: **f** (forward: copy, backward: all-reduce) before the MLP and **g** (forward: all-reduce,
# backward: identity) after it. So per MLP: 1 all-reduce of [b, s, h] forward, 1 backward (the input gradient).
#
# Four views, one number: the **formula** (this algebra), the **ledger** (per-rank code in a `SimulatedWorld`),
# the **compiler** (the HLO XLA's SPMD partitioner produced on the CPU devices for `mark_sharding` annotations on
# the dense module) and the **TPU compiler** (the same graph compiled by XLA:TPU for a TPU slice, compile-only).

# %%
from dataclasses import replace

from shardlab.blocks import ring
from shardlab.core import harness
from shardlab.tp.case import MlpCase, same_results

fwd = MlpCase(p, backward=False)  # one forward
fb = MlpCase(p, backward=True)  # forward + backward of the loss ½‖out − target‖²

# %% [markdown]
# ## 1 · The formula
# One all-reduce forward (g) and one backward (f, only when the input needs a gradient), each of the activation
# [b, s, h]: payload $b\cdot s\cdot h\cdot e$ bytes per rank. Independent of F — the big matrices never move.

# %%
formula = {c.phase: harness.formula(c) for c in (fwd, fb)}
{phase: v.values for phase, v in formula.items()}

# %% [markdown]
# ## 2 · The split, drawn
# Each cell is coloured by the device that holds it: A by column blocks, B by the matching row blocks — device
# $i$'s GeLU output $y_i$ is exactly the input rows its $B_i$ needs.

# %%
from shardlab.tp import figures as vtp

vtp.ownership_figure(vtp.mlp_panels(min(p.hidden, 64), min(p.ffn, 256), p.tp), p.tp,
                     f"MLP weights over tp={p.tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank Megatron code
# `ParallelMLP.from_dense(dense, comm)` keeps rank $r$'s slice ($A_r$: `fc1` rows, $B_r$: `fc2` columns in
# `nn.Linear` layout). `SimulatedWorld(tp)` runs the step on `tp` ranks in this process (threads; autograd runs in
# each rank's thread) and records every collective; every rank's output and gradients are compared with the dense
# module's. The step's loss is ½‖out − target‖² with a fixed random target: its output gradient, out − target,
# depends on the output as in training (so the backward's f must wait for the forward's g), and is not all ones
# (which would hide a transposed gradient).

# %%
ledger = {c.phase: harness.ledger(c) for c in (fwd, fb)}
led_fb = ledger["fwd_bwd"].detail["ledger"]
vtp.ledger_timeline(led_fb, f"MLP forward + backward, tp={p.tp}: g forward, f backward").show()
vtp.ledger_frame(led_fb)

# %% [markdown]
# ### The same per-rank code in real processes
# `DistributedWorld(tp)` spawns `tp` processes that join a `torch.distributed` gloo group and run the very same
# `mlp_step`. Its ledger must be identical; its results equal up to summation order (gloo may add the ranks'
# partial sums in another order than the simulated world's rank order).

# %%
if p.run_gloo and p.tp > 1:
    gloo = harness.gloo(fb)
    rec.check("mlp.gloo.same_ledger", gloo["ledger"] == led_fb, f"{len(led_fb)} collectives, identical rows")
    rec.check("mlp.gloo.same_results", same_results(gloo["ranks"], ledger["fwd_bwd"].detail["ranks"], p.dtype),
              "outputs and input gradients")
else:
    print("gloo run skipped (run_gloo=False or tp=1)")

# %% [markdown]
# ## 4 · The compilers
# **CPU.** The same dense `models.MLP`, moved to XLA, `fc1.weight` annotated `("tensor", None)` and `fc2.weight`
# `(None, "tensor")` on a mesh (data = num_devices / tp, tensor = tp); the input replicated. We read the
# collectives from the partitioned HLO of one forward and one forward + backward step. This view needs `tp`
# devices in this process; with fewer it is skipped (the other views still run at `tp`).
#
# **TPU.** The same graph, not executed, handed to XLA:TPU for a v5e slice of the same size — or, when this process
# has fewer devices than `tp`, rebuilt in a helper process on `tp` virtual devices for a `tp`-chip slice.

# %%
compiler = {c.phase: harness.hlo(c) for c in (fwd, fb)}
tpu = {c.phase: harness.tpu(c) for c in (fwd, fb)}

# %% [markdown]
# ## 5 · Four ways, one number
# Bytes are the payload per rank (notebook 00): for an all-reduce, its input; the compilers report the operand
# bytes of the collective per device.

# %%
tables = [harness.record(rec, "mlp", formula[ph], ledger[ph], compiler[ph], tpu[ph]) for ph in ("fwd", "fwd_bwd")]
harness.record_compile_s(rec, "mlp.fwd_bwd.compile_s", compiler["fwd_bwd"], tpu["fwd_bwd"])  # XLA:CPU and XLA:TPU seconds
tables[0]

# %%
tables[1]

# %% [markdown]
# **Interpretation.** The views agree: the per-rank code issues exactly the all-reduces the paper predicts, and
# both partitioners, given only the weight shardings, derive the same plan — one all-reduce of the activation each
# way. The bytes scale with b·s·h, not with ffn: doubling the MLP width doubles each device's FLOPs but not its
# communication.
#
# **CPU vs TPU.** Run with `dtype="bfloat16"`: XLA:CPU's pipeline upcasts bf16 to f32 (a float-normalisation
# choice of its passes), so it computes the dot in f32 and all-reduces the f32 partial sums (twice the formula's
# bytes — the table marks that value and compares elements instead), while the TPU program all-reduces bf16, as
# the formula says. Both compilers issue the two all-reduces one after the other and **synchronously** (measured
# below): f's input gradient needs the output gradient, which needs the forward's output, which needs g — and
# nothing independent of them is left to run beside either (notebook 08, section 2). With a loss whose output
# gradient is a constant, `(out * grad_out).sum()`, the two would be independent, and XLA:TPU's all-reduce combiner
# merged them into one tuple all-reduce at these sizes — an artefact of that loss, which is why this suite's
# steps compute their loss from the output.

# %%
for v in (compiler["fwd_bwd"], tpu["fwd_bwd"]):
    if v.ran:
        forms = [f"{c.op} ({c.form}, {c.operands} operand{'s' if c.operands > 1 else ''})"
                 for c in v.detail.module.collectives]
        print(f"{v.source}: {'; '.join(forms)}")

# %%
harness.memory_frame({"cpu (buffer assignment)": compiler["fwd_bwd"], "tpu (compiled memory stats)": tpu["fwd_bwd"]})

# %% [markdown]
# Per-device memory of the two programs, side by side: XLA:CPU's buffer assignment (parameters, outputs and the
# heap-simulated peak of temporaries) and XLA:TPU's compiled memory statistics (arguments, outputs, temporaries).
# They are not expected to match: the TPU pads every array to its (8, 128) tiles and fuses differently.
#
# ### The same step at every tp
# One case per tensor-parallel degree, all in this process: the formula, the ledger at that many ranks, and the
# CPU compiler wherever tp tiles this process's devices. The payload per rank does not move with tp — each rank
# hands the whole [b, s, h] activation to each all-reduce; only how many partial sums are added changes.

# %%
import plotly.graph_objects as go

by_tp = {}
for t in [t for t in (1, 2, 4, 8) if p.ffn % t == 0]:
    by_tp[t] = harness.views(MlpCase(replace(p, tp=t)), ("formula", "ledger", "hlo"))
    harness.record(rec, f"mlp.by_tp.tp{t}", *by_tp[t], show=False)
fig = go.Figure([go.Scatter(x=list(by_tp), y=[next((v.get("fwd_bwd.all_reduce.bytes") for v in vs
                                                    if v.source == src and v.ran), None) for vs in by_tp.values()],
                            mode="lines+markers", name=src) for src in ("formula", "ledger", "hlo")])
fig.update_layout(height=300, xaxis_title="tp", yaxis_title="all-reduce payload per rank (bytes)",
                  title="forward + backward: the same bytes at every tp > 1")
fig.show()

# %% [markdown]
# ## 6 · Sequence parallelism (Korthikanti et al. 2022)
# Keep the activations outside the MLP split along the sequence: f becomes an **all-gather** (payload: the shard
# [b, s/p, h]) and g a **reduce-scatter** (payload: the full [b, s, h]). Forward, that moves exactly the wire bytes
# of the all-reduce it replaces — an all-reduce *is* a reduce-scatter followed by an all-gather. Megatron's variant
# then keeps only the s/p shard of the MLP's input for the backward (the stored input shrinks by p, like the
# LayerNorm and dropout work outside the MLP) and **all-gathers it again** in the backward to form the weight
# gradient: per MLP, one extra all-gather of (p−1)/p·b·s·h·e wire bytes buys a p-fold smaller saved input.
#
# **One more collective comes with SP.** The row-parallel bias b2 is now added to each rank's s/p tokens only (after
# the reduce-scatter), so its gradient on a rank is a *partial* sum over those tokens — and so are a LayerNorm's
# weight and bias in a full layer, which under SP also run on the s/p shard. One all-reduce over the tensor-parallel
# group per step adds them (Megatron tags such parameters `sequence_parallel` and coalesces all their gradients
# into one all-reduce, `_allreduce_layernorm_grads`): here h elements, b2's. The formula takes their count
# (`sp_params`), the ledger shows the `sp.grads` all-reduce, and the parity check compares b2's gradient on every
# rank with the dense one. The wire bytes below are counted along the ring schedule of notebook 00
# (`ring.ledger_wire_bytes`), not by the formula's factors.

# %%
if p.seq % p.tp == 0:
    sp = MlpCase(p, backward=True, sequence_parallel=True)
    sp_formula, sp_ledger = harness.formula(sp), harness.ledger(sp)
    display(harness.record(rec, "mlp.sp", sp_formula, sp_ledger))
    f_sp, led_sp = sp_formula.detail, sp_ledger.detail["ledger"]
    regather = f_sp["wire_bytes"] - f_sp["all_reduce_wire_bytes"]  # the formula's backward re-gather of the shard
    sp_wire = ring.ledger_wire_bytes(led_sp, "all_gather") + ring.ledger_wire_bytes(led_sp, "reduce_scatter")
    plain_wire = ring.ledger_wire_bytes(led_fb)  # counted along the ring schedule, not the formula's factors
    rec.check("mlp.sp.wire_is_all_reduce_plus_regather", abs(sp_wire - (plain_wire + regather)) < 1e-6,
              f"{sp_wire} vs {plain_wire} + {regather}")
    vtp.ledger_timeline(led_sp, "sequence-parallel MLP: all-gather, reduce-scatter, backward re-gather").show()
else:
    print(f"seq={p.seq} is not divisible by tp={p.tp}: sequence parallelism skipped")

# %% [markdown]
# ### Explore
# Move the sliders: the formula is recomputed and the small config re-runs in a `SimulatedWorld`; the status line
# compares formula and ledger. An impossible split (ffn = 4·hidden not divisible by tp) is reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(p, tp=min(p.tp, 4), batch=p.batch, seq=min(p.seq, 16), hidden=min(p.hidden, 32))
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("mlp.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("mlp.explorer.rejects_bad_split", not update(tp=3, hidden=16)["ok"], "ffn=64 over tp=3 is reported")
update(tp=min(p.tp, 4), hidden=min(p.hidden, 32))
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. GPT-3 175B has h = 12288. With b = 1, s = 2048 in bf16 and tp = 8, how many bytes does each rank hand to the
#    MLP's forward all-reduce?
# 2. If the MLP is the model's first module and its input does not need a gradient (it is fed the output of a frozen
#    embedding directly, with no LayerNorm or attention in between), how many all-reduces does one MLP forward +
#    backward step issue at tp = 8?
# 3. Suppose A were split by rows instead (so x by columns). How many all-reduces would one MLP *forward* need?
# 4. Code: write rank i's half of the MLP after the GeLU — `answer_4(comm, y_i, b_i, bias)` with this rank's GeLU
#    output y_i [b·s, F/p], its row block B_i [F/p, h] of B and the bias b2 [h] (the same on every rank) — returning
#    the full output z = y B + b2 [b·s, h] on every rank. The grader runs it on 4 ranks of a `SimulatedWorld`:
#    every rank's z must equal the dense product, with exactly one all-reduce of [b·s, h].

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # bytes (an int)
answer_2 = None  # a count
answer_3 = None  # a count
answer_4 = None  # a function (comm, y_i, b_i, bias) -> tensor, e.g. def answer_4(comm, y_i, b_i, bias): ...
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. The forward all-reduce carries the whole activation [b, s, h] in the model's dtype: tp only decides how many
#    partial sums are added, not how big each is.
# 2. f's backward all-reduce exists to sum the input gradient; without one, only g's forward all-reduce is left.
#    (Behind a trainable LayerNorm or attention — any MLP but the first module — the input *does* need a gradient.)
# 3. GeLU is not additive — GeLU(a + b) ≠ GeLU(a) + GeLU(b) — so the partial sums of $XA$ must be added *before*
#    GeLU, and the row-parallel B still needs its own all-reduce after it (the paper's argument, §3).
# 4. `return comm.all_reduce(y_i @ b_i) + bias`: the partial product y_i B_i is a full-size [b·s, h] partial sum,
#    one all-reduce (g) adds the p of them, and the bias is added once, *after* the sum — added before it, every
#    rank's copy would be counted p times.
# </details>

# %%
rec.close()["status"]
