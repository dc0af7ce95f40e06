# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
tp = 4  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
batch = 2
seq = 8
hidden = 64
dtype = "float32"  # "float32" or "bfloat16"
ffn = 256  # MLP inner size of the transformer-layer section (attention + MLP)
heads = 4  # head dim hidden / heads = 16 differs from seq = 8, so the [s, s] score arrays are countable
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.profile import Recorder
from shardlab.tp.params import AttentionParams

p = AttentionParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 03 · Megatron attention: heads split over devices — again one all-reduce each way
#
# Self-attention is embarrassingly parallel over heads. Megatron (Shoeybi et al. 2019, §3, Fig. 3b) gives device
# $i$ the heads $[i\cdot n_h/p, (i+1)\cdot n_h/p)$: the Q, K and V projections are **column-parallel** (each
# device holds the columns of its heads, $W_Q[H, (N\,D)_X]$), the attention core runs on local heads only, and the
# output projection is **row-parallel** ($W_O[(N\,D)_X, H]$), leaving a partial sum `z{U_X}` that **one
# all-reduce** (g) completes. As in the MLP (notebook 02), one f before (copy forward, all-reduce backward) and one
# g after. Q, K and V share **one** f: f is applied once to the input, and autograd adds the three projections'
# input gradients before f's backward all-reduces them — one all-reduce, not three. (Megatron also fuses the three
# weights into one column-parallel linear, `query_key_value`: one large GEMM instead of three smaller ones, for
# efficiency; the communication is the same.) Requirement: `heads` divisible by `tp` (whole heads per device).
#
# Four views, one number: the **formula**, the **ledger** (per-rank code in a `SimulatedWorld`), the **compiler**
# (XLA's SPMD partitioner on the CPU devices) and the **TPU compiler** (the same graph compiled by XLA:TPU for a
# TPU slice, compile-only).

# %%
from shardlab.core import harness
from shardlab.core.views import COMPILERS
from shardlab.tp.case import AttentionCase, LayerCase

fwd = AttentionCase(p, backward=False)  # one forward
fb = AttentionCase(p, backward=True)  # forward + backward of the loss ½‖out − target‖²

# %% [markdown]
# ## 1 · The formula
# Same pattern as the MLP: forward 1 all-reduce of [b, s, h], backward 1 more when the input needs a gradient.
# Nothing depends on the number of heads or on s² — the attention matrix never leaves its device.

# %%
formula = {c.phase: harness.formula(c) for c in (fwd, fb)}
{phase: v.values for phase, v in formula.items()}

# %% [markdown]
# ## 2 · The split, drawn
# Columns of $W_Q, W_K, W_V$ grouped by head: device $i$ owns whole heads. $W_O$ is split by the matching rows.

# %%
from shardlab.tp import figures as vtp

vtp.ownership_figure(vtp.attention_panels(min(p.hidden, 64), p.heads, p.tp), p.tp,
                     f"attention weights, {p.heads} heads over tp={p.tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank Megatron code
# `ParallelAttention.from_dense` stacks rank $r$'s rows of $W_Q, W_K, W_V$ into one fused column-parallel weight
# $[q_r; k_r; v_r]$ of shape [3h/p, h] and keeps the matching columns of $W_O$; causal attention runs on the
# $n_h/p$ local heads. Every rank's output, input gradient and weight gradients are compared with the dense module.

# %%
ledger = {c.phase: harness.ledger(c) for c in (fwd, fb)}
led_fb = ledger["fwd_bwd"].detail["ledger"]
vtp.ledger_timeline(led_fb, f"attention forward + backward, tp={p.tp}: g forward, f backward").show()
vtp.ledger_frame(led_fb)

# %% [markdown]
# ## 4 · The compilers
# **CPU.** The dense `models.Attention` on a mesh (data = num_devices / tp, tensor = tp): $W_Q, W_K, W_V$
# annotated by output rows `("tensor", None)`, $W_O$ by input columns `(None, "tensor")`. Two details of the dense
# module matter to the partitioner (measured on torch_xla 2.9): Q/K/V come from **one** einsum over the stacked
# weights — with three separate projections XLA:CPU's partitioner all-reduces each projection's input gradient on
# its own (section 5 compiles that too) — and the attention core keeps (b, heads) as separate batch dims (`@`
# merges them into one dim that cannot be heads-sharded, and the partitioner then all-gathered q, k, v). This view
# needs `tp` devices in this process; with fewer it is skipped.
#
# **TPU.** The same graph, not executed, compiled by XLA:TPU for a v5e slice of the same size — or, when this
# process has fewer devices than `tp`, rebuilt in a helper process on `tp` virtual devices for a `tp`-chip slice.

# %%
compiler = {c.phase: harness.hlo(c) for c in (fwd, fb)}
tpu = {c.phase: harness.tpu(c) for c in (fwd, fb)}

# %% [markdown]
# ## 5 · Four ways, one number
# Bytes are the payload per rank (notebook 00): for an all-reduce, its input. `scores.arrays` counts the
# [b, n_h/p, s, s] arrays each compiled program writes — how the compiler lowered the attention core.

# %%

tables = [harness.record(rec, "attention", formula[ph], ledger[ph], compiler[ph], tpu[ph]) for ph in ("fwd", "fwd_bwd")]
harness.record_compile_s(rec, "attention.fwd_bwd.compile_s", compiler["fwd_bwd"], tpu["fwd_bwd"])
tables[0]

# %%
tables[1]

# %% [markdown]
# **Interpretation.** Attention costs the same communication as the MLP: the all-reduce moves the output
# activation, never the s×s scores nor the K/V of other heads — both partitioners keep every score array at
# $n_h/p$ heads (checked: no all-gather, no array with all heads' scores).
#
# **CPU vs TPU.** First, both compilers issue g and f as two all-reduces: the loss is computed from the output, so
# the backward's f needs the forward's g, and there is nothing to merge. (With a loss whose output gradient is a
# constant, `(out * grad_out).sum()`, the two are independent, and XLA:TPU's all-reduce combiner merged them into
# one tuple all-reduce at these sizes — an artefact of that loss, measured.) Second, **the attention core is
# lowered differently** (`scores.arrays`): XLA:CPU writes the scores and several steps of the softmax after
# them (the scaled and masked scores, the exponentials, the probabilities) as separate [b, n_h/p, s, s] arrays;
# XLA:TPU fuses the scaling, the mask and parts of the softmax into the matmul kernels around them and writes
# fewer. It places them in on-chip memory at these sizes: the TPU's temporaries below are 0 because its compiled
# memory statistics count only the temporaries it puts in main memory (HBM). Neither changes a collective: the
# scores of a head never leave the device that owns the head.

# %%
harness.memory_frame({"cpu (buffer assignment)": compiler["fwd_bwd"], "tpu (compiled memory stats)": tpu["fwd_bwd"]})

# %% [markdown]
# **Three separate projections.** The same step with Q, K and V computed by three `nn.Linear` calls instead of the
# stacked einsum (`gspmd.SeparateQkvAttention`), compiled by both partitioners. The per-rank code has one f either
# way, so formula and ledger say 2; what each compiler made of it:

# %%
sep = AttentionCase(p, backward=True, separate_qkv=True)
sep_views = [harness.formula(sep), harness.ledger(sep), harness.hlo(sep), harness.tpu(sep)]
display(harness.record(rec, "attention.separate_qkv", *sep_views, show=False))
for v in sep_views[2:]:
    if v.ran:
        n = v.get("fwd_bwd.all_reduce.operands", v["fwd_bwd.all_reduce.count"])
        print(f"{COMPILERS[v.source]}: {n} all-reduces "
              f"({'one per projection in the backward' if n > 2 else 'the input gradients added first, one f'})")

# %% [markdown]
# So "three projections, three all-reduces" is not a law of tensor parallelism: it is one partitioner's lowering.
# XLA:CPU's partitioner all-reduces the three partial input gradients one by one; XLA:TPU's passes add them first
# and issue one, as Megatron's per-rank code does with its single f. This suite's dense module uses the stacked
# einsum so that both compilers show the paper's count.

# %% [markdown]
# ## 6 · A transformer layer: attention + MLP
# A pre-LayerNorm layer, $x + \mathrm{Attn}(\mathrm{LN}(x))$ then $+\,\mathrm{MLP}(\mathrm{LN}(\cdot))$: each
# sub-layer brings its own f and g, the LayerNorms run replicated (their inputs are the full activations, so
# their gradients agree on every rank without communication). Per layer and step: **2 all-reduces forward and 2
# backward**, volume $4\,b\,s\,h$ elements. The same four views, on `models.TransformerBlock`
# (`ParallelTransformerBlock` per rank; `shard_attention` + `shard_mlp` for the compilers).

# %%
layer_views = harness.views(LayerCase(p))
display(harness.record(rec, "layer", *layer_views))
vtp.ledger_timeline(layer_views[1].detail["ledger"],
                    "attention then MLP: g, g forward; f (MLP), f (attention) backward").show()

# %% [markdown]
# Four all-reduces on both compilers, one after the other: g (attention), g (MLP), then in the backward f (MLP),
# f (attention) — each needs the result of the one before, so XLA:TPU has nothing to combine.
#
# ### Explore
# Move the sliders (tp, batch, seq, hidden, heads): formula and ledger of the small config are recomputed. Heads
# not divisible by tp, or hidden not divisible by heads, are reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(p, tp=min(p.tp, 4), batch=p.batch, seq=min(p.seq, 16), hidden=min(p.hidden, 32),
                            heads=min(p.heads, 8) if min(p.hidden, 32) % min(p.heads, 8) == 0 else 4)
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("attention.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("attention.explorer.rejects_bad_heads", not update(tp=4, heads=6, hidden=24)["ok"],
          "heads=6 over tp=4 is reported")
update(tp=min(p.tp, 4), heads=4, hidden=min(p.hidden, 32))
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. A model with 12 heads: which tensor-parallel degrees from {1, 2, 3, 4, 6, 8, 12} can this layer use?
#    (a list, ascending)
# 2. With b = 8, s = 1024, h = 4096 in bf16, what is one transformer layer's all-reduce payload per rank and step
#    (forward + backward), in bytes?
# 3. Same layer at tp = 8: how many bytes does each rank send over the wire for those all-reduces (ring model)?
# 4. If Q, K and V were three *independent* column-parallel layers each with its own f, how many all-reduces would
#    one attention forward + backward issue?
# 5. Code (annotations): write Megatron's attention layout as GSPMD annotations — `answer_5`, a dict from the dense
#    `models.Attention`'s parameter names (`"q.weight"`, `"k.weight"`, `"v.weight"`, `"out.weight"`, and their
#    `.bias`; nn.Linear layout, weight [out, in]) to a spec over the mesh axes `("data", "tensor")`; parameters you
#    leave out stay replicated. The grader compiles a forward + backward step at this notebook's defaults: it must
#    gather nothing and issue exactly Megatron's all-reduces.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # a list of ints
answer_2 = None  # bytes
answer_3 = None  # bytes
answer_4 = None  # a count
answer_5 = None  # a dict {parameter name: spec}, e.g. {"q.weight": (None, "tensor"), ...}
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. Whole heads per device: tp must divide the head count (8 does not divide 12).
# 2. Two all-reduces forward (attention's g, the MLP's g) and two backward (their f's), each of the activation
#    [b, s, h]: four activations in the model's dtype.
# 3. A ring all-reduce sends 2 (p−1)/p of its payload per rank: a little under twice the payload.
# 4. One g forward, and one f backward per projection — an f per projection is the mistake; one f before the three
#    (or one fused linear) adds the three gradients first. XLA:CPU's partitioner lowers three separate projections
#    that way (section 5: 4 all-reduces; XLA:TPU adds first and issues one), which is why our dense module uses one
#    stacked einsum.
# 5. Heads are output rows of W_Q, W_K, W_V: `("tensor", None)` for each weight (and `("tensor",)` for their biases,
#    or leave the biases replicated); W_O takes the heads as its input columns: `(None, "tensor")`, its bias
#    replicated. Then no device ever needs another device's heads: one all-reduce forward (g), one backward (f).
# </details>

# %%
rec.close()["status"]
