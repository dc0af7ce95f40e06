# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
layers_sweep = [2, 8, 64]  # L values of the compile curves, each >= 2
layers = 4  # L of the shard_as sections, the small seed story and the trace transfers (>= 2)
hidden = 64  # h: W_up [h, F] is split h over fsdp
ffn = 256  # F: split over tensor
batch = 8  # b: split over fsdp
seq = 8  # s: split over tensor in the nn.Linear trap
mesh_fsdp = 2  # mesh (fsdp, tensor); the CPU sections need fsdp × tensor devices
mesh_tensor = 4
devices_sweep = []  # compile time vs device count, one fresh process per count
placeholder_hiddens = [64, 256]  # model widths for the trace-transfer growth
full_size = False  # compile the 405B-size seed with XLA:TPU (minutes); False: show the cached compiles
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
import time

from shardlab import runtime
from shardlab.profile import Recorder
from shardlab.xla_scan.params import ScanParams

_t0 = time.perf_counter()
p = ScanParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 06 · scan over layers, 2-D sharding and `shard_as`: the 405B OOM in miniature
#
# A deep model is L copies of one block. PyTorch/XLA traces Python into one graph, so a Python `for` loop
# over L blocks gives a graph L blocks long — compile time grows with L. `scan` instead puts *one* block
# inside an XLA `While` loop and feeds it slice $i$ of weights stacked as `W[L, d_in, d_out]`. Three lessons,
# each measured before and after the fix:
#
# 1. **Compile time**: loop vs `scan_layers` vs scan over pre-stacked weights.
# 2. **`shard_as`**: on a 2-D mesh (fsdp, tensor) the weight gradient left the backward loop body all-reduced
#    over fsdp — 1-D sharded — and the whole stacked gradient inherited that sharding. In PyTorch/XLA's
#    Llama 3.1 405B run on v6e-256 this stacked buffer, `[126, 4K, 16K]` per chip, did not fit.
#    `shard_as(weight, grad)` in scan's backward keeps the gradient sharded like the weight.
# 3. **Placeholders**: tracing scan used to send real (fake-valued) tensors to the device; placeholder tensors
#    have a shape and no buffer.
#
# The block (`shardlab.xla_scan.model`): $y = x + \mathrm{gelu}(x W_{up}) W_{down}$ with
# $x[b_{fsdp}, s, h]$, $W_{up}[h_{fsdp}, F_{tensor}]$, $W_{down}[F_{tensor}, h_{fsdp}]$ — b, s, h: batch, sequence,
# hidden; F: the MLP width; L: layers (notation from notebook 00: $A[I_X, J_Y]$ = dim I split over mesh axis X,
# $\{U_X\}$ = unreduced over X). A mesh axis's name also stands for its size: $h/\text{fsdp}$ is h split fsdp ways.
# Every measured view — the **formula**, the **CPU compiler** (XLA's SPMD partitioner on this process's
# devices) and the **TPU compiler** (the same graph compiled by XLA:TPU for a TPU slice, compile-only) — is one
# view of a case in `shardlab.xla_scan.case`, run and recorded by `shardlab.core.harness`.

# %% [markdown]
# ## 1 · Three ways to run L blocks — and the loop is the oracle
#
# | mode | what the graph holds | grows with L? |
# |---|---|---|
# | `loop` | L copies of the block | yes: instructions ∝ L |
# | `scan_layers` | one block in a `While`, plus `torch.stack` of the L per-layer weights and the un-stacking of their gradients, every call | partly: 2 ops per weight per layer |
# | `scan` (pre-stacked) | one block in a `While`; weights already `[L, …]`, sliced with `torch.func.functional_call` | no |
#
# Every step below is one forward+backward on the sharded model; outputs and all gradients are compared with
# a plain CPU `for` loop over the same seeded weights, relative to the largest reference value (approximate
# to 1e-5: XLA reorders float32 sums). `W_down` is initialised GPT-2 style, scaled by $1/\sqrt{2L}$, so the
# residual stream stays O(1) at any depth.

# %%
from shardlab.core import harness
from shardlab.xla_scan import sections as C

sweep = [(c, harness.hlo(c)) for c in C.sweep_cases(p)]  # every mode at every L of layers_sweep, on the CPU devices
rows = C.record_sweep(rec, sweep)
rows

# %% [markdown]
# ## 2 · Compile time and graph size vs L
# Timing numbers come from torch_xla's metrics (`CompileTime`, `ExecuteReplicatedTime`) and are noisy on a
# shared 2-core machine; graph size is the instruction count of the partitioned per-device HLO (structural,
# exact). XLA:CPU outlines large elementwise ops into `parallel_*` computations once their size passes a
# threshold; `hlo_instructions` counts such a call once (`hlo_instructions_raw` counts everything).

# %%
from shardlab.xla_scan.figures import bytes_vs_layers, compile_curves, tiling_figure
from shardlab.xla_scan.sharding import layer_spec

if rows is not None:
    compile_curves(rows.to_dict("records")).show()

# %% [markdown]
# **Reading the curves.** The loop's graph is L blocks long (instructions ≈ L × one block), so tracing,
# partitioning and compiling all grow with L. `scan_layers` puts one block in the loop but still `stack`s the
# L per-layer weights before it and slices the L gradients out after it, inside the graph, on every call:
# its size grows with L, by a few instructions per layer instead of a whole block. Pre-stacked `scan` holds
# weights as `[L, …]` parameters, so the program is the same for every L — only shapes change (checked).
#
# The seconds follow the loop's size: its compile time grows with L, pre-stacked scan's barely moves, and
# somewhere between the sweep's points the loop overtakes it. `scan_layers` is the exception on this CPU: it
# compiled *slower* than the loop at every L in every run we made, although at large L its program is a fraction of
# the loop's — the published TPU figures
# ([PyTorch/XLA's scan guide](https://docs.pytorch.org/xla/release/r2.8/features/scan.html): a 50-layer decoder
# on one TPU chip, 1 min 03 s with a Python loop, 19 s with `scan_layers`) are about XLA:TPU, and that ordering
# does not transfer to XLA:CPU. What does transfer: the *graph sizes*, backend-independent up to the CPU outlining
# noted above. On this shared host the loop's seconds at L = 32 were within noise of scan's in some of our runs,
# at L = 64 clearly above them in every run (the default sweep ends there); add points
# (`layers_sweep=[2, 8, 16, 32, 64]`) to see the curves in more detail.
#
# **Compile time vs device count.** GSPMD partitions once for all devices, so compile time should not grow
# with their number. Each count needs its own process (one device world per process), so
# `devices_sweep=[1, 2, 4, 8]` runs each in a fresh subprocess with mesh (fsdp = n, tensor = 1).

# %%
C.devices_sweep(rec, p, p.layers)

# %% [markdown]
# GSPMD partitions once into one per-device program, whatever the count: its size is the same for every count
# above 1 (one device needs no collectives, so its program is a little smaller) — that part of the claim
# holds (checked when the sweep runs). The seconds did *not* stay flat on this 2-core host: in every run we
# made, 8 devices compiled slower than 1–2, and within one 8-device process mesh (8, 1) compiled slower than
# (2, 4). So on XLA:CPU the time depends on the mesh and count beyond the program size; we have not broken down
# where (PJRT CPU client vs partitioner). Timings are noisy here; the sizes are exact.
#
# ## 3 · 2-D sharding and `shard_as`
# ### Why the gradient loses its fsdp split
# The weight gradient is $dW_{up} = x^\top \cdot dh$ ($dh$: the gradient at $xW_{up}$), a sum over the batch (and
# sequence) rows. The batch is split over fsdp, so each device can only form a *partial* sum — the rule for a
# contraction over a split dimension:
#
# $$x^\top[h, b_{fsdp}] \cdot dh[b_{fsdp}, F_{tensor}] = dW_{up}[h, F_{tensor}]\{U_{fsdp}\}$$
#
# The contracted dimension carried the fsdp split, and it is gone from the result: fsdp appears nowhere in
# $dW_{up}$'s tiling, only in the pending sum. Something must add the fsdp partial sums. If nobody asks for a
# particular sharding of $dW$, the partitioner's natural finish is an **all-reduce over fsdp**: every fsdp
# device ends up with the whole sum, $dW[h, F_{tensor}]$ — **1-D**, replicated fsdp times. Asked for
# $dW[h_{fsdp}, F_{tensor}]$ (the weight's own sharding), it uses a **reduce-scatter over fsdp** instead: each
# device keeps only its 1/fsdp share of the sum.
#
# Inside `scan` that one choice is not local. The backward `While` writes $dW_l$ into slice $l$ of the stacked
# gradient `[L, h, F]`, which is part of the loop's carried state — and a `While`'s carried state has **one**
# sharding, the same on every iteration. So the per-layer gradient's 1-D sharding becomes the sharding of the
# whole stack: $L·h·F/\text{tensor}$ elements per device instead of $L·h·F/(\text{fsdp}·\text{tensor})$, **fsdp
# times more**. torch_xla's fix wraps the per-layer backward in `shard_as(weight_slice, grad_slice)` ("shard these
# two alike"), so the partitioner is asked for the weight's sharding and picks the reduce-scatter.
#
# Predict before you run the next cell: with `shard_as` off, which collective and over which mesh axis finishes
# $dW$ in the backward body? And with it on? (Exercises 3 and 4 grade your answer against the program.)
#
# ### Formula, CPU compiler, TPU compiler
# The pre-stacked scan at L = `layers` with `shard_as` on (torch_xla's default) and off (the scoped monkeypatch
# `shard_as_enabled(False)` replaces `torch_xla.experimental.scan._backward_shard_alike` with a wrapper that only
# calls the backward — the behaviour before the fix — and restores it on exit). Per device: the stacked
# gradients' shapes and bytes, and the reductions over fsdp in the backward `While` body (bytes are what one
# device hands to the collective: the whole partial gradient, for an all-reduce and a reduce-scatter alike).

# %%
views, table = C.shard_as_views(rec, p)  # recorded as shard_as.on.* and shard_as.off.*
table

# %%
C.contrast(rec, views["on"], views["off"])

# %% [markdown]
# **Interpretation.** Both compilers do what the formula says: without `shard_as` the weight gradients are
# finished by an all-reduce over fsdp and come out 1-D (`[L, h, F/tensor]`), with it by a reduce-scatter over fsdp
# and 2-D (`[L, h/fsdp, F/tensor]`); the stacked gradients differ by exactly the fsdp factor. The backward
# `While`'s loop state holds an array of exactly each stacked gradient's per-device shape in every program
# (checked) — the carried sharding *is* the stack's — so the loop state is larger without `shard_as` by the
# stacked gradients' difference (give or take a few bytes of loop bookkeeping).
#
# **CPU vs TPU.** XLA:CPU's pass pipeline (torch_xla 2.9) never turns an all-reduce + dynamic-slice into a
# reduce-scatter: it all-reduces and then cuts its share out with a dynamic-slice (the table counts that pair as
# the reduce-scatter it implements; XLA:CPU's runtime does run a reduce-scatter when a program contains one — no
# pass here writes one). XLA:TPU's passes do that rewrite: at the default sizes it emits a real reduce-scatter,
# and its collective combiner merges the two weights' reductions into one tuple instruction (count 1 with 2
# operands; the operands and bytes agree). Both are the compiler's choices: at other sizes XLA:TPU also finishes
# one of them as all-reduce + dynamic-slice (a note says so when it happens); the number of logical reductions
# stays the same. The loop states are each compiler's own: XLA:TPU's holds bf16 copies of some saved tensors in
# this f32 model (at torch_xla's default matmul precision XLA:TPU multiplies f32 operands in bf16) and other
# bookkeeping, so the totals differ while the stacked gradients inside them are identical.

# %%
harness.memory_frame({f"cpu · {t} (buffer assignment)": views[t][1] for t in ("on", "off")}
                     | {f"tpu · {t} (compiled memory stats)": views[t][2] for t in ("on", "off")})

# %% [markdown]
# Per-device memory of the four programs. XLA:CPU's buffer assignment and XLA:TPU's compiled memory statistics
# are not expected to match each other (tiling, fusion and what each counts as temporary differ); within each
# compiler, OFF exceeds ON by the stacked gradients' difference (the outputs, on TPU).

# %%
points = C.stacked_bytes_points(sweep, views)  # measured: CPU at every L of the sweep (on), both compilers at L
bytes_vs_layers(C.stacked_bytes_lines(p, list(range(1, max(*p.layers_sweep, p.layers) + 1))), points).show()
if views["on"][1].ran:
    tiling_figure({f"shard_as {t}": layer_spec(views[t][1]["grad_spec"]) for t in ("on", "off")}, "h", "F").show()

# %% [markdown]
# The stacked gradient grows linearly with L in both cases; its slope is the per-layer gradient, fsdp times
# steeper when it is 1-D. The tiling picture shows one layer's W_up gradient: 2-D, each tile on one device; 1-D,
# each tile held by fsdp devices.
#
# **Per-layer gradients** (`scan_layers` returns them un-stacked, so each layer's has its own sharding string)
# follow the same rule, and on the **transposed mesh** (fsdp ↔ tensor sizes swapped) the penalty is the new
# fsdp size — compiled by XLA:TPU, which is fast for a second mesh because nothing runs.

# %%
C.layer_grad_specs(rec, p, min(p.layers_sweep))

# %%
C.transposed(rec, p, p.layers)

# %% [markdown]
# ### The seed's layout: two result dims that want the same mesh axis
# The block above splits only x's batch, $x[b_{fsdp}, s, h]$, so its weight gradient has no conflicting axis:
# the 1-D result is simply what an all-reduce over the contracted axis leaves. The seed's model (torchprime's
# `llama-fsdp-tp.yaml`, the configuration of pytorch/xla#8883) shards **every decoder activation
# `[fsdp, None, tensor]`** — x is $x[b_{fsdp}, s, h_{tensor}]$ — and then
#
# $$x^\top[h_{tensor}, b_{fsdp}] \cdot dh[b_{fsdp}, F_{tensor}] = dW_{up}[h_?, F_?]\{U_{fsdp}\}$$
#
# is notebook 01's conflicting-axis matmul $A[M_X, N_Y]\cdot B[N_Y, M_X]$: the contracted b takes fsdp with it
# (partial sums over fsdp, as before), and both result dims ask for tensor — the result can keep it on only one
# of h and F. The same step with the activations laid out as the seed's (`layout="seed"`), shard_as off and on,
# through the same three views (recorded as `shard_as.seed_layout.*`):

# %%
seed_views, _ = C.shard_as_views(rec, p, layout="seed")
display(C.layout_frame(seed_views))
C.layout_notes(seed_views)

# %% [markdown]
# Without `shard_as` every gradient is 1-D again, the same bytes as with the batch-only layout — but *which*
# dim keeps tensor is now the compiler's choice (the shapes in the table; the formula predicts the bytes and
# the 1-D/2-D kind, not the orientation, so the shapes are recorded and not compared). With `shard_as` the
# request is 2-D for both weights; where a compiler still leaves one 1-D, the lines under the table say which and
# what its backward body does instead, and those values are recorded with that reason rather than compared. The
# forward changes too (x's h is now split, so the block's first matmul gathers or re-shards it); the views read
# only the backward's fsdp reductions.
#
# ### The seed case: `[126, 4K, 16K]` on v6e-256
# PyTorch/XLA's report of the OOM ([pytorch/xla#8883](https://github.com/pytorch/xla/issues/8883), "Use shard_as
# to improve sharding and avoid OOM", March 2025) describes Llama 3.1 405B on v6e-256 with 2-D (FSDP + TP)
# sharding — weights `[tensor, fsdp]` / `[fsdp, tensor]` and every activation `[fsdp, None, tensor]` — where in
# the backward `scan` a per-layer gradient of shape `[1, 4K, 16K]` was all-reduced over the FSDP axis and written
# into a stacked `[126, 4K, 16K]` output, too large for one chip (126 = the model's layers). Those are per-chip
# shapes: the logical weight is `[126, 16K, 16K]` (o_proj's, the gradient
# [torchprime#160](https://github.com/AI-Hypercomputer/torchprime/issues/160) names; q_proj has the same shape),
# and 4K = 16K / 4 is the tensor split — so the mesh below is (fsdp 64, tensor 4), our reading of the 256 chips.
# Per chip, in bf16, against the HBM the XLA:TPU compiler lets one v6e chip's program use:

# %%
C.seed_table(rec)

# %% [markdown]
# 2-D is the same small buffer on every mesh; 1-D keeps only the tensor split, so at (64, 4) *one* weight's stacked
# gradient takes half of a chip's usable HBM, with the other large weights' beside it, on top of weights,
# optimizer state and activations. `shard_as` divides it by fsdp = 64.
#
# ### At full size: the real thing
# The seed's own sizes, compiled by XLA:TPU for a TPU slice (compile-only): **126 layers, hidden 16384, q_proj
# and o_proj [16384, 16384] each** (the two weights the report names), bf16, every weight and the input a
# placeholder — nothing is allocated, so a 405B-size step is only lowered and compiled. The block is
# $x + \mathrm{silu}(x W_q^\top) W_o^\top$ with $W_q[16384_{tensor}, 16384_{fsdp}]$,
# $W_o[16384_{fsdp}, 16384_{tensor}]$, $x[16_{fsdp}, 1024, 16384]$ (batch 16 × sequence 1024), on a mesh
# **fsdp 16 × tensor 4 of a v6e-64 slice** (64 chips). The seed's per-chip buffer `[126, 4K, 16K]` is set by the
# tensor split alone (16384 / 4 = 4K); the fsdp size only sets how much smaller the 2-D version is, so 64 chips
# show what 256 did (and 256 CPU devices, the graph's own world, are too many for this host). The 126 per-layer
# weights are stacked **inside the step**, as `scan_layers` does and the seed did, and the 126 per-layer
# gradients come out. The cases, each with `shard_as` off and on:
#
# * **in-graph** — the seed as just described, activations $x[b_{fsdp}, s, h]$;
# * **held** — the weights held as `[126, …]` parameters, the step returns the stacked gradient;
# * **update** — held stacking, and the optimizer's update $W - \mathrm{lr}\cdot dW$ in the same graph;
# * **in_graph_update** — in-graph stacking *and* the update in the graph: the seed's real training step;
# * **seed_layout** — in-graph, with the seed's activation layout $x[b_{fsdp}, s, h_{tensor}]$.
#
# At full size a compile takes from fifteen seconds to ten minutes on this 2-core host — more than this notebook's
# budget. So by default the table shows the compiles measured with `tools/scale_full_size.py seed` (the cache names
# how and when); `full_size=True` compiles them again here and records them.

# %%
from IPython.display import Markdown

from shardlab.xla_scan import scale as S

full = S.full_story(rec, p)
S.story_frame(full, S.FULL_SIZE)

# %%
Markdown(S.story_text(full, S.FULL_SIZE))

# %% [markdown]
# **The seed, reproduced.** Without `shard_as` the compiler refuses the step, and its two largest allocations are
# the seed's buffers: the stacked gradients of q_proj and o_proj, **1-D** (all-reduced over fsdp, split only over
# tensor), the zero-initialised stacks (`broadcast(constant)`) the backward `While` writes each layer's gradient
# into (checked against the formula's `[126, 16384/tensor, 16384]`). With `shard_as` the step fits and each
# layer's gradient leaves **2-D**. The contrasts explain it:
#
# * **held**: the same 1-D stacks leave the step as *outputs*. The compiler's capacity check counts arguments
#   and temporaries, not outputs, so the compile succeeds — but the step could not run: a compile error turned
#   into a program that fails later.
# * **update** (held): `shard_as` off and on give the same program, the updated weights 2-D. The update is
#   elementwise with the 2-D weight, so sharding propagation asks for the gradient sharded like the weight and
#   carries that back into the backward loop.
# * **in_graph_update**, the seed's real training step: both compile and leave 2-D, with no 1-D stack —
#   propagation finds the weight's sharding here too — but not the same program: without `shard_as` it needs more
#   temporaries.
# * **seed_layout**: the seed's activation layout fails the same way, the 1-D stacks oriented on the activation's
#   side (tensor kept on q's *input* dim), and fits with `shard_as`.
#
# So on this compiler (libtpu 0.0.21), at this size and mesh (fsdp 16 × tensor 4, batch 16 × 1024, q and o, SGD):
# `shard_as` decides whether the step compiles when it ends at the gradients (returned, or sliced back out per
# layer as `scan_layers` does), with either activation layout; with the optimizer's update in the same graph the
# step compiles and leaves 2-D either way, and with in-graph stacking `shard_as` still saves temporaries. Another
# optimizer, mesh or model was not compiled here. The 1-D buffer is `[126, 16384/tensor, 16384]`: tensor = 8
# would halve it (the table above, mesh (32, 8)).
#
# The same compiles at this notebook's size (its mesh, L = `layers`, bf16) take a few seconds: nothing is near the
# capacity, but the shardings are the same (checked for every case), and held + update gives identical programs
# (checked); for in-graph + update compare the temporaries column.

# %%
S.small_story(rec, p)  # a v6e slice of fsdp x tensor chips (a helper process if that is not this process's count)

# %% [markdown]
# ### At its own size: v6e-256, traced on 8 devices
# The seed ran on **v6e-256**, fsdp 64 × tensor 4 — 256 chips, more CPU devices than a torch_xla trace may have
# here. But the graph before partitioning holds global shapes; only its shardings name devices. So the stack is
# traced on a mesh (fsdp 2, tensor 4) of 8 CPU devices with the same global shapes, every sharding is rewritten to
# the real mesh, and XLA:TPU partitions that for the real slice (`shardlab.profile.retarget`; exact: the tests
# compare it with direct compiles at 8 and 64 chips, and at 64 chips it gives the cached direct compile's bytes).
# In-graph stacking, gradients out, one sequence of 1024 tokens per fsdp rank (the same per-chip work on every
# slice), `shard_as` off and on, on 64, 128 and 256 chips. Cached (`tools/retarget_full_size.py pod`, each compile in
# a fresh process: its peak host memory is its own); `full_size=True` compiles v6e-256 again here.

# %%
from shardlab.xla_scan import pod

pod.pod_table(rec, p)

# %% [markdown]
# The seed's failure, at its own size: without `shard_as` no slice fits, and the two largest allocations are the
# seed's `[126, 4K, 16K]` stacks (q's and o's stacked gradients, 1-D: split over tensor only) — the same size on
# every slice, because it depends on tensor = 4 alone; with `shard_as` each layer's gradient leaves 2-D, divided by
# fsdp, and the step fits with room to spare. The trace (8 devices) and the host memory of a compile stay about
# the same from 64 to 256 chips; compile seconds depend more on this shared host's load than on the chip count.

# %% [markdown]
# ## 4 · `shard_as` on its own, and the `nn.Linear` trap
# `shard_as(a, b)` only says "a and b are sharded alike"; the partitioner copies the annotated one.

# %%
demo = C.shard_as_demo(p)  # None when the mesh does not tile this process
if demo is not None:
    rec.check("shard_as.demo.copies_sharding", demo.b_spec_with == demo.a_spec and "replicated" in
              demo.b_spec_without, str(demo))
    display(demo)
harness.record(rec, "linear_trap", *C.linear_trap(p))

# %% [markdown]
# `F.linear(x, W)` on `x[b, s, h]` lowers to a reshape to `[b·s, h]`, a 2-D dot, and a reshape back. With
# `x[b_fsdp, s_tensor, h]`, device (i, j) holds batch rows $[i·b/\text{fsdp}, (i+1)·b/\text{fsdp})$ and positions
# $[j·s/\text{tensor}, (j+1)·s/\text{tensor})$; in the merged index $i_b·s + i_s$ that block is one contiguous run
# only when it is a single batch row ($b/\text{fsdp} = 1$) or all of s ($\text{tensor} = 1$). Otherwise no tiling of
# the merged dim describes it: the merged dim keeps the batch split only, the sequence split is undone (an
# all-gather), and each device multiplies tensor times the rows — the table's `linear.rows` against `einsum.rows`.
# torch_xla's einsum patch (`XLAPatchedLinear`) keeps a 3-D dot and both splits; our block uses `einsum` for that
# reason. The checks hold for every mesh: rows as the formula says, and data moves exactly when the rows grow.
#
# XLA:TPU did not fall into the trap here: its per-chip dot keeps the batch and sequence dims apart (see the
# note above the table), so `F.linear` and einsum compile to the same per-chip work. The trap is a property of
# the flattened 2-D dot reaching the partitioner, which this XLA:CPU pipeline lets happen and this XLA:TPU
# pipeline did not — measured, for this small case.
#
# ## 5 · Placeholder tensors
# A placeholder has a shape and a dtype and no device buffer: it lowers to an HLO parameter.

# %%
print(C.placeholder_demo(rec))  # a 64 GiB placeholder: its memory, its lowering, reading it (each checked)

# %% [markdown]
# **Tracing must not move data.** The upstream report ([pytorch/xla#8612](https://github.com/pytorch/xla/issues/8612),
# "Placeholder tensors", January 2025) compared one model run with a for loop and with `scan`: *"From the metrics,
# it transfers 23 GiB compared to 182 MiB when using for loops. The metric `IrValueTensorToXlaData` has a large
# count (>200) under scan compared to 0 under for loop."* The cause: scan traced its function on fake inputs that
# were real device tensors. The fix ([pytorch/xla#8785](https://github.com/pytorch/xla/pull/8785)) makes them
# placeholders; torch_xla 2.9, used here, has it.
#
# We trace one forward+backward step at L = `layers` (twice; the second is measured, after torch_xla has cached its
# scalar constants) and read `OutboundData` — host→device bytes despite the name — and the same
# `IrValueTensorToXlaData` count. `placeholders_enabled(False)` swaps torch_xla's placeholder factory for the
# pre-fix `torch.zeros(shape).to(device)`: one real transfer per fake input, replicated to every device.

# %%
C.record_trace(rec, p)

# %% [markdown]
# Without placeholders one trace sends $3bsh + 2bsF + 4hF$ elements (fake carry and one layer's weights for
# the forward scan; fake grad carry and one slice of each saved activation — $x$, $xW_{up}$,
# $\mathrm{gelu}(xW_{up})$, $W_{up}$, $W_{down}$ — for the backward), times the device count: the $hF$ term
# makes it grow with the square of the width, and every fake input counts once in `IrValueTensorToXlaData`. With
# placeholders our trace moves 0 bytes, like the loop. We do not reconstruct the upstream 23 GiB: the report
# names neither the model's size nor what the for loop's 182 MiB were.
#
# ## 6 · Explorer
# Pick a mesh, L and hidden; the small case re-runs with shard_as on and off (two compiles).

# %%
if rows is not None:
    from shardlab.core.explorer import explorer_for

    widget, update = explorer_for(p)  # mesh, L and hidden among the notebook's own sizes
    display(widget)
    probe = update()  # headless: exercise the code path once (the default choice is already compiled)
    rec.check("explorer.runs", probe["off"]["stacked grads B"] > probe["on"]["stacked grads B"], str(probe))

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. On a mesh (fsdp = 8, tensor = 1), with L = 4, h = 128, F = 512, how many times larger is the stacked
#    gradient without `shard_as`?
# 2. The seed case on mesh (fsdp 16, tensor 16) in bf16: how many GiB per chip does the 1-D stacked gradient
#    `[126, 16384, 16384]` take?
# 3. *Predict, then check the HLO.* With `shard_as` off, which collective over which mesh axis finishes the
#    weight gradients in the backward `While` body? Answer as `"<collective> <axis>"`, e.g. `"all-gather tensor"`.
#    The grader compares with the reductions that the OFF program has and the ON program does not.
# 4. *Predict, then check the HLO.* And with `shard_as` on — what replaces it?
# 5. `F.linear` on `x[b=8, s=8, h]` split as `x[b_fsdp, s_tensor, h]` on mesh (fsdp 4, tensor 2): how many rows
#    does each device's 2-D dot multiply on XLA:CPU?
# 6. *Predict, then check the metrics.* How many host→device transfers does one trace of this block make
#    without placeholders?
# 7. *Code: `shard_as` by hand.* Write the per-rank function `answer_7(comm, x, dh)` of one fsdp rank (tensor = 1):
#    `x` [rows, h] and `dh` [rows, F] are this rank's batch rows. Return this rank's block of $dW_{up} = x^\top
#    dh$ sharded like $W_{up}[h_{fsdp}, F]$ — rows $[r·h/\text{fsdp}, (r+1)·h/\text{fsdp})$ of the full sum — with
#    one collective. The grader runs it on 4 ranks of a `SimulatedWorld` and compares with the dense gradient
#    and with the collectives the 2-D gradient needs.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
program = next((t for t in (1, 2) if views["on"][t].ran and views["off"][t].ran), None)  # CPU, else TPU
changed = C.what_shard_as_changed(views["off"][program], views["on"][program], p) if program else (None, None)
answer_1 = None  # a ratio
answer_2 = None  # GiB (a number)
answer_3 = None  # "<collective> <axis>"
answer_4 = None  # "<collective> <axis>"
answer_5 = None  # rows (an int)
answer_6 = None  # a count
answer_7 = None  # a function (comm, x, dh) -> tensor, e.g. def answer_7(comm, x, dh): ...
measured = {3: {"changed": changed[0]}, 4: {"changed": changed[1]}}  # exercises 3, 4: what the programs show
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5, answer_6, answer_7), start=1):
    ex.show(n, a, **measured.get(n, {}))

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. 2-D splits each layer's gradient over fsdp × tensor = 8 devices; all-reduced over fsdp, only the tensor split
#    (1) is left, so all 8 devices hold the whole thing: 8 times more.
# 2. The logical array is 126 · 16384 · 16384 · 2 B = 63 GiB; 1-D keeps only the tensor split: 63 / 16 GiB.
# 3. $x^\top[h, b_{fsdp}] \cdot dh[b_{fsdp}, F_{tensor}] = dW[h, F_{tensor}]\{U_{fsdp}\}$: the partial sums live on
#    the fsdp axis, and with no sharding requested for $dW$ the partitioner sums them where every device gets the
#    whole result — an all-reduce over fsdp.
# 4. `shard_as` requests $dW[h_{fsdp}, F_{tensor}]$: sum and keep only your share — a reduce-scatter over fsdp
#    (on XLA:CPU an all-reduce followed by a dynamic-slice of the share).
# 5. b/fsdp = 2 batch rows per device, split again in s by tensor = 2: not contiguous in the 64 merged rows, so only
#    the batch split survives: 64 / 4 = 16 rows (einsum: 64 / 8 = 8).
# 6. Forward scan: the carry and one layer's W_up and W_down (3); backward scan: the gradient carry and one slice
#    of each of the 5 tensors the block saves (x, x·W_up, gelu(x·W_up), W_up, W_down): 9.
# 7. `return comm.reduce_scatter(x.T @ dh)`: each rank's `x.T @ dh` [h, F] is its partial sum over its own rows;
#    the reduce-scatter adds the four and leaves rank r block r of dim 0. `comm.all_reduce(...)` and a slice give
#    the same numbers, but every rank held the whole [h, F] sum first — the 1-D gradient `shard_as` removes.
# </details>

# %%
rec.measure("notebook.wall_s", time.perf_counter() - _t0, "s", "timer", kind="timing")
rec.close()["status"]
