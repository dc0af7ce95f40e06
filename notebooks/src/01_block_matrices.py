# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
m = 16  # x is m×k
k = 64  # inner dimension
n = 32  # W is k×n
parts = 4  # p, the number of blocks and of devices in the split; the 2-D grid is 2 by p/2
dtype = "float32"  # "float32" or "bfloat16"
matmul = [64, 128, 32]  # I, J, K of section 7's sharded matmuls A[I, J]·B[J, K] on the (X 2, Y 4) mesh
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.blocks.params import BlocksParams
from shardlab.profile import Recorder

p = BlocksParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 01 · Block matrices: the two rules every sharding scheme is made of
#
# Every tensor-parallel layer, every FSDP all-gather and every GSPMD decision in this suite reduces to two
# facts about a product $y = xW$ with $x$ of shape $m\times k$ and $W$ of shape $k\times n$, split into p blocks
# held by p devices:
#
# 1. **Split W by columns** — $W = [W_1 \dots W_p]$ (`W[K, N_X]`): $y = [xW_1 \dots xW_p]$. Each device computes a
#    column block of $y$ on its own; the blocks are *concatenated*. **No communication.**
# 2. **Split W by rows and x by columns** — $W = [W_1; \dots; W_p]$, $x = [x_1 \dots x_p]$ (`x[M, K_X]`,
#    `W[K_X, N]`): $y = \sum_i x_i W_i$. Each device holds a full-size *partial sum* `y{U_X}`; the partial sums
#    must be *added*: **one all-reduce of m·n elements per device** (none when p = 1: nothing to add).
#
# We check each rule four ways, every view at the same p: the **formula** (this algebra), the **ledger** (per-rank
# code that calls the collective itself, in a `SimulatedWorld` of p ranks), the **compiler** (the collectives in the
# HLO that XLA's SPMD partitioner emitted for `mark_sharding` annotations on this process's devices) and the
# **TPU compiler** (the same graph compiled by XLA:TPU for a TPU slice, compile-only). The notebook fails if they
# disagree.

# %%
from dataclasses import replace

from shardlab.blocks import case as bc
from shardlab.core import harness

cases, skipped = bc.block_cases(p)  # column, row, and the (2, p/2) grid when p is even
for rule, why in skipped.items():
    rec.note(f"blocks.{rule}", f"{rule} section skipped: {why}")
    print(f"{rule} section skipped: {why}")

# %% [markdown]
# ## 1 · The algebra on the CPU
# `shardlab.blocks` splits the operands, forms every per-block product and combines them. Uneven splits follow
# one rule (`numpy.array_split`: the first `n mod p` blocks get one extra row). The check is against the
# dense product in float64, so "equal" means equal up to rounding.

# %%
import torch

from shardlab import blocks

torch.manual_seed(p.seed)
x64 = torch.randn(p.m, p.k, dtype=torch.float64)
w64 = torch.randn(p.k, p.n, dtype=torch.float64)
col = blocks.column_parallel(x64, w64, p.parts)
row = blocks.row_parallel(x64, w64, p.parts)
print("column split: pieces", [tuple(t.shape) for t in col.pieces[0]], "-> concatenated to", tuple(col.result.shape))
print("row split:    partials", [tuple(t.shape) for t in row.partials[0][0]], "-> summed to", tuple(row.result.shape))
err_col = float((col.result - x64 @ w64).abs().max())
err_row = float((row.result - x64 @ w64).abs().max())
rec.check("blocks.algebra.column_equals_dense", err_col < 1e-10, f"max abs err {err_col:.1e}")
rec.check("blocks.algebra.row_equals_dense", err_row < 1e-10, f"max abs err {err_row:.1e}")

# %%
from shardlab.blocks import figures as vb

vb.split_figure(p.m, p.k, p.n, p.parts, "column").show()
vb.split_figure(p.m, p.k, p.n, p.parts, "row").show()

# %% [markdown]
# ### Explore
# Move the sliders: the picture is redrawn and the blocked product is recomputed against the dense one. An
# impossible split (more parts than columns, an odd grid) is reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(p, m=min(p.m, 32), k=min(p.k, 32), n=min(p.n, 32), parts=min(p.parts, 8), kind="row")
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("blocks.explorer.update", shown["ok"], f"max abs err {shown.get('max_abs_err')}")
rec.check("blocks.explorer.rejects_bad_split", not update(parts=33, k=8)["ok"], "parts > k is reported")
update(parts=min(p.parts, 8), k=min(p.k, 32))
ui

# %% [markdown]
# ## 2 · The formula
# Column rule: no collective. Row rule: one all-reduce over the p devices, payload m·n·e bytes per device (e: bytes
# per element), ring wire bytes 2(p−1)/p of that (notebook 00). Independent of k: the partial sums are full-size
# whatever the inner dimension.

# %%
formula = {rule: harness.formula(c) for rule, c in cases.items()}
{rule: v.values for rule, v in formula.items()}

# %% [markdown]
# ## 3 · The ledger: per-rank code that calls the collective itself
# Rank `r` holds only its blocks. In the row rule it computes its partial sum and calls `all_reduce`; in the
# column rule it never talks to anyone. `SimulatedWorld(p)` runs the same function on p ranks in this process
# and records every collective. This is the whole per-rank program:

# %%
import inspect

print(inspect.getsource(blocks.col_rank))
print(inspect.getsource(blocks.row_rank))
ledger = {rule: harness.ledger(c) for rule, c in cases.items()}
ledger["row"].detail["ledger"].summary()

# %% [markdown]
# ## 4 · The compilers: the same products as GSPMD annotations
# Now the real thing: tensors live on a mesh of XLA devices, `mark_sharding` says how each operand is split, and
# XLA's SPMD partitioner decides what to communicate. The mesh is `(copies, model)` = (num_devices / p, p): the
# `model` axis holds the p blocks, and the `copies` axis — whatever devices are left — holds identical copies
# (so the program runs num_devices / p independent groups of p). x and W are annotated `x[M, K_model]`,
# `W[K_model, N]` for the row rule and `W[K, N_model]` (x replicated) for the column rule. When p does not tile
# this process's devices the CPU view is skipped with a note.
#
# The **TPU compiler** compiles the same graph for a v5e slice of num_devices chips — or, when p does not tile
# this process, of p chips, built in a helper process with p virtual devices (skipped, with a note, when no v5e
# slice has p chips).

# %%
compiler = {rule: harness.hlo(c) for rule, c in cases.items()}
tpu = {rule: harness.tpu(c) for rule, c in cases.items()}

# %% [markdown]
# ## 5 · Four ways, one number
# Bytes are the *payload per device*: what one device hands to the collective. The compilers report the operand
# bytes of each collective in the per-device program. (The CPU view also prints the sharding strings torch_xla
# gave x and W — read them as notebook 00 explains; the view checks them against `blocks.tiles`' prediction.)

# %%
import pandas as pd

tables = [harness.record(rec, "blocks", formula[r], ledger[r], compiler[r], tpu[r]) for r in cases]
for r, c in cases.items():  # XLA:CPU (metrics) and XLA:TPU (tpu) compile seconds, timing rows
    harness.record_compile_s(rec, f"blocks.{c.phase}.compile_s", compiler[r], tpu[r])
pd.concat(tables, ignore_index=True)

# %% [markdown]
# When n does not split evenly over p (say n = 10 over 4), XLA pads every column block to ⌈n/p⌉ and — measured on
# both compilers — hands the unevenly split y back whole, through an all-gather: the table then shows that
# collective in the compiler columns, marked "not compared", with the reason. The row rule's partial sums are
# full-size whatever the split of k, so an uneven k changes nothing there.

# %% [markdown]
# ### The 2-D mesh
# Lay the same p devices out as a grid `(r 2, c p/2)`: `x[M_r, K_c]`, `W[K_c, N]`. Each device multiplies its
# $(m/2)\times(k/p_c)$ block of x by its $(k/p_c)\times n$ block of W. The sum runs over `c` only, so XLA needs one
# all-reduce inside each group of $p_c$ = p/2 devices, of $(m/2)\cdot n$ elements per device — half of the 1-D row
# rule's payload, over half as many devices. The ledger runs it as two independent row-rule worlds of p/2 ranks,
# one per row block of x; the compilers put it on a mesh `(copies, r, c)`. The table above has its `grid.*` rows
# (`grid.all_reduce.group_size` is p/2). An odd p has no such grid: then the section is left out, with a note.

# %%
if "grid" in cases:
    vb.split_figure(p.m, p.k, p.n, p.parts, "grid").show()
else:
    print(f"no grid: {skipped['grid']}")

# %% [markdown]
# ### Memory
# Per-device memory of the row rule's programs, side by side: XLA:CPU's buffer assignment (parameters, outputs and
# the heap-simulated peak of temporaries) and XLA:TPU's compiled memory statistics. They are not expected to match:
# the TPU pads every array to its (8, 128) tiles and lays buffers out differently.

# %%
harness.memory_frame({"cpu (buffer assignment)": compiler["row"], "tpu (compiled memory stats)": tpu["row"]})

# %% [markdown]
# ## 6 · What element type the partial sums travel in
# The tables above compare what the views agree on. One thing they legitimately do not: with `dtype="bfloat16"`,
# XLA:CPU's pipeline computes bf16 in f32 — its float-normalisation pass upcasts every bf16 operation (the dot,
# the all-reduce, even an elementwise product are f32 in the optimized program; a choice of this compiler's
# passes, not a missing instruction) — so it all-reduces the f32 partial sums (`to_apply=%add.clone_promoted` in
# the HLO) and converts back to bf16 afterwards: twice the bytes. The TPU adds bf16 partial sums in bf16. The formula takes the device kind (`reduction_dtype(dtype, kind)`) and
# predicts each compiler's element type and bytes; this table checks each compiler against its own prediction
# (in float32 both columns say f32).

# %%
from shardlab.formulas.common import reduction_dtype

carried = [harness.record(rec, "blocks.carried", bc.carried(c), bc.on_device(compiler[r], world.kind, c.phase),
                          bc.on_device(tpu[r], "tpu", c.phase))
           for r, c in cases.items() if r != "column"]
print(f"dtype={p.dtype}: XLA:CPU adds in {reduction_dtype(p.dtype, 'cpu')}, "
      f"the TPU in {reduction_dtype(p.dtype, 'tpu')}")
pd.concat(carried, ignore_index=True)

# %% [markdown]
# **Interpretation.** The column rule is free because nothing is summed; the row rule pays one all-reduce of the
# *output* size, independent of k. That is why Megatron pairs them (notebook 02): a column-parallel layer leaves
# its output split by columns, which is exactly the row-parallel layer's input split — one all-reduce per pair.
# The ledger's per-rank code, the CPU partitioner and the TPU compiler all arrive at the same single collective
# from the same annotations; only the element type the sum travels in depends on the hardware.

# %% [markdown]
# ## 7 · Four sharded-matmul cases, and the one that breaks 2-D gradients
# Sections 1–6 split one operand at a time over one mesh axis. With *both* operands annotated on a 2-D mesh the
# partitioner meets four situations (*How to Scale Your Model*, part 3), named in the notation of notebook 00:
# `A[I_X, J]` is A with its rows split over mesh axis X. On a mesh (X 2, Y 4) of 8 devices — two axes of different
# sizes, so a collective's group size says which axis it runs over — with A [I, J], B [J, K] (`matmul` = (I, J, K)):
#
# 1. **No contracting dimension split** — `A[I_X, J]·B[J, K_Y] = C[I_X, K_Y]`: every device multiplies its blocks;
#    nothing to send.
# 2. **One operand's contracting dimension split** — `A[I, J_X]·B[J, K]`: A must be gathered over X first.
# 3. **Both contracting dimensions split over the same axis** — `A[I, J_X]·B[J_X, K] = C{U_X}`: every device forms a
#    full-size partial sum (section 2's row rule), added by an all-reduce over X (or a reduce-scatter, if C may stay
#    split).
# 4. **Both non-contracting dimensions want the same axis** — `A[I_X, J]·B[J, K_X]`: `C[I_X, K_X]` is not a tiling
#    (each device would need a block of C whose rows and columns both vary with X), so one operand is gathered and C
#    keeps one X.
#
# **The case that combines 3 and 4** is the weight gradient of a 2-D sharded model whose activations are split over
# the tensor axis too: `A[M_X, N_Y]·B[N_Y, M_X]` (the seed of notebook 06, pytorch/xla#8883, with X = tensor and Y =
# fsdp). The contracted N takes Y with it — partial sums over Y — and C can keep X on only one of its two M's. Left
# to itself (case 5) the partitioner gathers B over X and all-reduces over Y, leaving `C[M_X, M]`: 1-D, every Y
# device holding the same copy. Asked for `C[M_X, M_Y]` (case 5b — what `shard_as` asks for in notebook 06) it
# finishes the sum with a reduce-scatter over Y instead, and C is 2-D: |Y| = 4 times smaller per device.
#
# The formula column holds what the algebra fixes (C's elements per device, which collectives, their payload and
# group size); case 4 fixes only that one operand is gathered — which one, and over which axis, is the
# partitioner's choice. The last table lists what each compiler emitted.

# %%
matmuls = bc.matmul_cases(p)
matmul_views = {name: harness.views(c, ("formula", "hlo", "tpu")) for name, c in matmuls.items()}
display(pd.concat([harness.record(rec, "blocks.matmul", *v, show=False) for v in matmul_views.values()],
                  ignore_index=True))
bc.matmul_table(matmuls, {name: v[1:] for name, v in matmul_views.items()})

# %% [markdown]
# **Reading the tables.** Cases 1–3 are sections 1–2 again on a 2-D mesh. Case 4: both partitioners keep A's X and
# gather B — measured: first re-sharding B from X onto Y (a collective-permute), then gathering the smaller Y shards
# over Y's 4 devices. Case 5 is 3 and 4 at once: a gather over X (the conflict) *and* a partial sum over Y (the
# contraction), and C comes out 1-D. Case 5b changes only what is asked of C, and with it the collective that
# finishes the sum: XLA:TPU emits a reduce-scatter over Y; XLA:CPU writes the same sum as an all-reduce followed by
# a `dynamic-slice` (its passes never turn that pair into a reduce-scatter; notebook 00), counted here as the
# reduce-scatter it implements. XLA:TPU gathers its f32 operands in bf16 (its default matmul precision rounds f32
# inputs of a dot to bf16 first), so its all-gather bytes are half XLA:CPU's and the elements are compared instead.
# At smaller sizes XLA:TPU also picks other forms for case 5b's sum (an all-reduce + dynamic-slice at I = 32,
# collective-permutes at I = 16; measured with libtpu 0.0.21): set `matmul` and see.

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. With m = 16, n = 32 in float32 and p = 4, how many bytes does each device hand to the row rule's all-reduce?
# 2. On the 2-D grid (2, 4) of 8 devices, how large is each group of devices that adds partial sums, and how many
#    groups are there? Answer `[group size, groups]`.
# 3. The row rule with m = 16, n = 32, p = 4 in bfloat16: bytes per device in the all-reduce on XLA:CPU and on the
#    TPU? Answer `[cpu, tpu]`.
# 4. In the grid on a 4-device mesh `(r 2, c 2)` (devices 0–3), W is annotated `("c", None)`. Write the sharding
#    string XLA prints for W.
# 5. Predict it, then check the HLO: how many collectives does the compiler emit for the column rule when W's
#    columns split evenly over the p devices? (The grader compiles such a product at this notebook's p and counts.)
# 6. Code (an annotation): section 7's case 5 leaves C 1-D. Write the annotation that makes it 2-D — the spec
#    `answer_6` that `xs.mark_sharding(c, mesh, answer_6)` gets for C [M, M] on the mesh (X 2, Y 4): a tuple with one
#    entry per dim of C, each a mesh axis name or None. The grader compiles case 5 at the default sizes with C
#    annotated by your spec and counts C's elements per device.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # bytes
answer_2 = None  # [group size, groups]
answer_3 = None  # [cpu bytes, tpu bytes]
answer_4 = None  # a string like "{devices=[...]...}"
answer_5 = None  # a count
answer_6 = None  # a spec for C, e.g. ("X", None)
for i, a in enumerate((answer_1, answer_2, answer_3, answer_4), start=1):
    ex.show(i, a)
ex.show(6, answer_6)
even = bc.BlockCase(replace(p, m=8, k=max(8, p.parts), n=4 * p.parts, dtype="float32"), "column")  # even split
col_count = bc.measured("col.collective.count", harness.tpu(even), harness.hlo(even))
if col_count is None:  # both compiler views skipped (e.g. an odd p that neither this world nor a TPU slice has)
    print("exercise 5 is graded against a compiler's program, and no compiler view ran here: "
          f"{compiler['column'].skipped}; {tpu['column'].skipped}")
else:
    ex.show(5, answer_5, count=col_count)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. Each device holds a full m × n partial sum: 16 · 32 · 4 bytes. k and p do not appear.
# 2. Partial sums exist only along the axis that splits k (`c`, 4 devices); each of the 2 row blocks of x has its
#    own group.
# 3. XLA:CPU promotes the bf16 partial sums to f32 (4 bytes each), the TPU keeps bf16 (2 bytes).
# 4. Rows of W cut in 2 by `c`, columns not cut, and the `r` axis (2 devices) holds copies: `[2,1,2]` with
#    `last_tile_dim_replicate`. The ids in `(c, r)` order from the mesh `[[0,1],[2,3]]`: 0,2 then 1,3.
# 5. None: x is replicated — every device already has all of it — and each output column block depends only on
#    its own W block.
# 6. `("X", "Y")` (or `("Y", "X")`): each dim of C on its own axis, so each of the 8 devices holds a different
#    [M/2, M/4] block — 512 elements at the defaults instead of case 5's 2048. The partitioner then finishes the
#    Y partial sums with a reduce-scatter instead of an all-reduce.
# </details>

# %%
rec.close()["status"]
