# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
world_size = 8  # FSDP ranks N (SimulatedWorld ranks; the GSPMD mesh's fsdp axis)
layer_sizes = [30, 50, 10]  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
batch = 64  # global batch b, split evenly over the N ranks
torch_fsdp_world = 2  # ranks (gloo processes) for PyTorch FSDP1 / FSDP2; 0 skips them (process start-up)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
import time

from shardlab import runtime
from shardlab.fsdp.params import FsdpGspmdParams
from shardlab.profile import Recorder

_t0 = time.perf_counter()
p = FsdpGspmdParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 05b · FSDP as compiler annotations: GSPMD on CPU and TPU, torch_xla FSDPv2, PyTorch FSDP1 and FSDP2
#
# Notebook 05 built FSDP1's FlatParameter by hand. Here FSDP is written the other way: **per parameter**, as
# sharding annotations. Every parameter of shape $(d, \dots)$ is split on dim 0 over the `fsdp` mesh axis with
# `mark_sharding` — `torch.chunk` rows, padded to $c_p = \lceil d/N\rceil$ on $N$ ranks (`world_size`) — exactly the
# layout of PyTorch's
# FSDP2 (`fully_shard`). XLA's SPMD partitioner inserts the collectives itself. FSDP's three steps are written as
# sharding constraints in each Linear: *unshard* = a replicated copy of the weight before forward (and of the
# weights the backward reads, again in backward), the backward saves only the sharded weight, and each gradient
# is made replicated then dim-0 sharded (a reduce-scatter). One SGD step is compiled as **two graphs** —
# forward; backward + update — so only sharded parameters survive between them (FSDP's "free after forward"; the
# flat root unit of notebook 05 keeps its parameters instead).
#
# | graph | collective (XLA:CPU) | payload per device |
# |---|---|---|
# | forward | all-gather of each parameter (an **all-reduce of the full tensor** when $d \le \lfloor N/2 \rfloor$) | $c_p\cdot\text{rest}\cdot e$ ($d\cdot\text{rest}\cdot e$) |
# | backward | the same unshard of each weight that $dX_l = dY_l W_l$ reads (layers 2..L) | same |
# | backward | reduce-scatter of every gradient — **XLA:CPU emits all-reduce + dynamic-slice** | $d\cdot\text{rest}\cdot e$ |
#
# ($e$: bytes per element.)
#
# Four views: the **formula** (`formulas.fsdp.per_param_step_bytes`, which takes the compiler's device kind),
# the **CPU compiler** (the partitioned HLO on this process's devices), the **TPU compiler** (the same graphs
# compiled by XLA:TPU for a TPU slice, compile-only) and, for the flat design, the **ledger** of notebook 05 —
# checked against PyTorch's FSDP1 and FSDP2 running on real processes.

# %%
from dataclasses import replace

from shardlab.core import harness
from shardlab.fsdp import case as fc
from shardlab.fsdp.params import FsdpParams

case = fc.GspmdCase(p)  # dim-0 sharding of every parameter, mesh (fsdp N, replica devices / N)
fc.param_frame(case)

# %% [markdown]
# Per parameter: its padded shard and the collective each compiler uses to replicate it (and the bytes one
# device hands over in forward). The TPU columns come from the formula's TPU rules, explained in §2 (with the
# domain where they hold).
#
# ## 1 · The views
# The CPU view needs `world_size` to tile this process's devices (mesh (fsdp, replica) = (N, devices / N));
# otherwise it is skipped with the reason. The TPU view compiles the same mesh for a v5e slice of the process's
# size — or, when the process cannot tile N, a (N, 1) mesh for an N-chip slice, built in a helper process.

# %%
formula = harness.formula(case)  # device_kind="cpu": what XLA:CPU's partitioner emits
compiler = harness.hlo(case)  # the CPU HLO of both graphs (+ parity with the unsharded SGD step)
tpu = harness.tpu(case)  # XLA:TPU, compile-only
harness.record_compile_s(rec, "fsdp.gspmd.compile_s", tpu)  # XLA:TPU seconds, forward + backward graph (timing)
harness.record(rec, "fsdp.gspmd", formula, compiler, tpu, show=False)

# %% [markdown]
# Counts are collective instructions; `.operands` is how many logical collectives they carry where a compiler
# combined several into one instruction. The CPU column agrees with the formula exactly — including the padding
# of every sharded dimension and the all-reduce form of small dims. The TPU column differs on purpose (it is not
# compared with the CPU formula there); what its program shows, value by value:

# %%
fc.explain(formula, compiler, tpu)

# %% [markdown]
# The formula for `device_kind="tpu"` predicts the TPU column (the TPU view checks it, `fsdp.gspmd.tpu_formula.*`):

# %%
fc.device_frame(case, compiler, tpu)

# %% [markdown]
# ## 2 · CPU vs TPU: four differences
# **Real reduce-scatters.** XLA:CPU's pass pipeline (torch_xla 2.9) never forms a reduce-scatter: it sums each
# full gradient with an all-reduce and keeps its rows with a dynamic-slice (the CPU view counts each such pair as
# the reduce-scatter it implements; XLA:CPU's runtime does run a reduce-scatter when a program contains one — no
# pass here writes one).
# XLA:TPU emits a real reduce-scatter — a fusion calling `%all-reduce-scatter`, counted as a reduce-scatter —
# where it judges it worth it; for gradients as small as these it keeps all-reduce + dynamic-slice too (the
# wider model below shows the reduce-scatter). Either way the payload is the full f32 gradient: the bytes agree.
#
# **Combining.** The TPU compiler merges collectives of the same kind into one *tuple* instruction with $k$
# operands (the all-reduce combiner): all gradient reductions of the backward graph travel in one or two
# instructions, the small unshard all-reduces of the forward in one. Fewer launches, the same bytes — so the
# counts differ and the operands agree.
#
# **bf16 weight gathers.** At torch_xla's default mat-mul precision a TPU matmul reads f32 operands as bf16 (one
# bf16 pass). The compiler moves that conversion before the all-gather, so every weight that a matmul reads is
# gathered in **bf16: half the bytes** (forward, and the backward re-gather for $dX$). Biases, added in f32, stay
# f32. XLA:CPU computes in f32 and gathers f32.
#
# **Vectors by all-reduce.** A bias of 50 on 8 shards has 7-element shards; all-gathering along the minor
# dimension of such a short vector would move less than one 128-lane row per device. XLA:TPU instead writes the
# shard into a zero vector of the padded length $N c_p$ and **all-reduces** it (and combines those all-reduces).
# More bytes (the padding travels), one collective. From 128-element shards on it all-gathers vectors too.
#
# The formula's TPU rules are measured, not derived from the compiler's source: they hold for dim-0 sharding,
# every dimension > 1 and weight shards of at least two rows (`formulas.fsdp.tpu_rules_apply`); outside that the
# notebook says so instead of comparing. Per-chip memory of the backward graph, side by side — XLA:CPU's buffer
# assignment and XLA:TPU's compiled memory statistics; the TPU pads every array to its (8, 128) tiles:

# %%
harness.memory_frame({"cpu (buffer assignment)": compiler, "tpu (compiled memory stats)": tpu})

# %% [markdown]
# ### A wider MLP on the TPU
# The same step for layers 256 → 512 → 128 (TPU only, compile-only). For N > 1 the weight gradients now go
# through a real reduce-scatter fusion (one instruction, two gradients), the bias gradients through one combined
# all-reduce, and the 512-wide bias is gathered or all-reduced depending on its shard length at this N.

# %%
wide = fc.GspmdCase(replace(p, layer_sizes=(256, 512, 128)))
wide_tpu = harness.tpu(wide)
display(harness.record(rec, "fsdp.gspmd_wide", harness.formula(wide), wide_tpu, show=False))
fc.explain(wide_tpu)

# %% [markdown]
# ## 3 · Flat vs per-parameter
# Bytes per device and step for the same model: as one flat FSDP1 unit (notebook 05 — as the root, and as it
# would be if it were not the root) and per parameter on each compiler.

# %%
flat = fc.FlatCase(FsdpParams(world_size=p.world_size, layer_sizes=p.layer_sizes, batch=p.batch, seed=p.seed))
fc.designs_frame(flat, {"per-parameter (formula)": formula, "per-parameter (hlo)": compiler,
                        "per-parameter (tpu)": tpu})

# %% [markdown]
# **Why the columns differ.** (1) *Padding granularity*: the flat design pads the total $n$ once to a multiple
# of $N$; per-parameter sharding pads every sharded dimension to $\lceil d/N \rceil$ (a bias of 10 on 8 shards
# becomes 16). (2) *What the backward re-gathers*: a flat non-root unit re-gathers its whole flat parameter; the
# root keeps it; the per-parameter step (two graphs) gathers only the weights autograd reads for
# $dX_l = dY_l W_l$ — layer 1's input is data and biases are never read. (3) The gradient reduction moves the
# full unpadded gradients per parameter, the flat unit its padded flat gradient. (4) On the TPU, bf16 weight
# gathers halve the unshard bytes, and padded vector all-reduces add a little.
#
# ## 4 · torch_xla's FSDPv2
# `SpmdFullyShardedDataParallel` around every Linear makes the same kind of annotations but shards each
# parameter's **largest** dimension (`shard_maximal=True`) — a $10\times 50$ weight on its 50-wide dim — so its
# formula uses `rule="largest"`. It annotates only parameters and outputs, so the partitioner may choose another
# algorithm (at $N = 2$ on 8 devices it reshards over the replica axis with collective-permutes): then the view
# says so and does not compare.

# %%
v2 = fc.GspmdCase(p, wrapper="torch_xla_fsdpv2")
v2_views = harness.formula(v2), harness.hlo(v2), harness.tpu(v2)
display(harness.record(rec, "fsdp.gspmd_fsdpv2", *v2_views, show=False))
fc.explain(*v2_views)

# %% [markdown]
# ## 5 · PyTorch's own FSDP1 and FSDP2, on real gloo processes
# Same model, the first Linear wrapped as an inner unit inside the root (what an auto-wrap policy does), one
# step on `torch_fsdp_world` gloo processes: `FullyShardedDataParallel` (a FlatParameter per unit) and
# `fully_shard` (FSDP2: per-parameter DTensor shards on dim 0). Our ledger is `FlatUnit` in a `SimulatedWorld`.
# FSDP1 must match it **row by row** — op, phase, payload, order: the root gathers once, the inner unit twice —
# and its shards must match ours after training. FSDP2 issues the **same collectives per unit and phase**, with
# per-parameter payloads (each unit's padded dim-0 shards), and reduce-scatters the root's gradients *first*.

# %%
if p.torch_fsdp_world:
    wt = p.torch_fsdp_world
    small = FsdpParams(world_size=wt, layer_sizes=p.layer_sizes, batch=2 * wt, steps=1, seed=p.seed)
    tcase = fc.FlatCase(small, nested=len(p.layer_sizes) >= 3)
    _t = time.perf_counter()
    torch_view = fc.torch_fsdp(tcase)
    rec.measure("fsdp.torch.gloo_run.wall", time.perf_counter() - _t, "s", "timer", kind="timing")
    display(harness.record(rec, "fsdp.torch", harness.formula(tcase), torch_view))
    display(fc.collectives_frame(torch_view))
else:
    print("PyTorch FSDP skipped (torch_fsdp_world=0)")

# %% [markdown]
# **From FSDP1 to FSDP2.** The FlatParameter made communication efficient (one big all-gather per unit, no
# per-parameter launch overhead) but it is awkward everywhere else: an original parameter can be split across
# two ranks (notebook 05's bar), so per-parameter operations — freezing some weights, per-parameter optimizer
# settings, loading/saving a state dict, mixing dtypes — need views into a shared buffer (`use_orig_params`,
# alignment padding, the `_shard_param_infos` bookkeeping). FSDP2 (`fully_shard`) shards **each parameter on
# dim 0** as a DTensor: every rank holds a well-defined row block of every parameter, state dicts are plain
# DTensors, and it composes with tensor parallelism on a 2-D mesh. Its all-gather still batches all parameters of
# a unit into one call (copy-in/copy-out), so the communication pattern stays FSDP-shaped — exactly the
# per-parameter layout GSPMD uses above. The price is per-parameter padding (row granularity) instead of one pad
# for the whole buffer.
#
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. Per-parameter FSDP on $N = 8$, XLA:CPU: how many bytes does each device hand to the forward all-gather of
#    the f32 weight $W_2$ of shape [10, 50]?
# 2. The same all-gather compiled by XLA:TPU at the default mat-mul precision: how many bytes?
# 3. The f32 bias $b_1$ of shape [50] on $N = 8$, XLA:TPU: how many bytes does each device hand to the
#    collective that unshards it?
# 4. Layers 30 → 50 → 10 → 5 (weights and biases), any $N > 1$: how many gradient reductions (logical
#    collectives) does one step issue?
# 5. PyTorch FSDP2 on $N = 2$ with the first Linear of `(30, 50, 10)` as its own unit: how many bytes does each
#    rank hand to that unit's forward all-gather?
# 6. *Code: an annotation.* Write the partition spec `answer_6` that `xs.mark_sharding(w, mesh, answer_6)` gets
#    for FSDP2's layout of the weight $W_2$ [10, 50] on the mesh (fsdp, replica) of this notebook, $N = 8$: a tuple
#    with one entry per dim of the weight, each a mesh axis name or None. The grader annotates $W_2$ with it,
#    compiles its unshard (a replicated copy) and compares the bytes one device hands to the collectives that
#    replicate it with what FSDP2's rule moves.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # bytes
answer_2 = None  # bytes
answer_3 = None  # bytes
answer_4 = None  # a count
answer_5 = None  # bytes
answer_6 = None  # a partition spec, e.g. (None, "replica")
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5, answer_6), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. The payload of an all-gather is the padded shard: $\lceil 10/8\rceil = 2$ rows of 50 float32.
# 2. The TPU converts the weight to bf16 *before* gathering it (the matmul reads bf16 at the default precision):
#    the same 2 rows at 2 bytes per element.
# 3. Shards of $\lceil 50/8\rceil = 7$ elements are far shorter than a 128-lane row: XLA:TPU replicates the bias
#    with an all-reduce of the zero-padded vector, $8 \cdot 7 = 56$ float32 elements.
# 4. One per parameter (3 weights + 3 biases), however many instructions the compiler packs them into.
# 5. FSDP2 gathers a unit's parameters in one call: weight [50, 30] → 25 rows × 30, bias [50] → 25; (750 + 25)
#    float32 elements.
# 6. `("fsdp", None)`: dim 0 split over fsdp, the rest whole. Its unshard is an all-gather of the padded dim-0 shard,
#    $\lceil 10/8\rceil = 2$ rows × 50 × 4 B — exercise 1's 400 B. `(None, "fsdp")` would gather shards of
#    $\lceil 50/8 \rceil = 7$ columns (280 B), not FSDP2's layout; `(None, None)` leaves nothing to gather.
# </details>

# %%
rec.measure("fsdp.gspmd.notebook.wall", time.perf_counter() - _t0, "s", "timer", kind="timing")
rec.close()["status"]
