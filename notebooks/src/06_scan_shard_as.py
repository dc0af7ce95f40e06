# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
layers_sweep = [2, 4]  # L values of the compile curves, each >= 2
hidden = 64  # H: W_up [H, F] is split H over fsdp
ffn = 256  # F: split over tensor
batch = 8  # B: split over fsdp
seq = 8  # S: split over tensor in the nn.Linear trap
mesh_fsdp = 2  # mesh (fsdp, tensor); the CPU sections need fsdp × tensor devices
mesh_tensor = 4
devices_sweep = []  # compile time vs device count, one fresh process per count
placeholder_hiddens = [64, 256]  # model widths for the trace-transfer growth
full_size = False  # compile the 405B-size seed with XLA:TPU (minutes); False: show the cached compiles
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
import time

from shardlab import runtime
from shardlab.params import ScanParams
from shardlab.profile import Recorder

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
# $x[B_{fsdp}, S, H]$, $W_{up}[H_{fsdp}, F_{tensor}]$, $W_{down}[F_{tensor}, H_{fsdp}]$
# (notation from notebook 00: $A[I_X, J_Y]$ = dim I split over mesh axis X, $\{U_X\}$ = unreduced over X).
# Every measured view — the **formula**, the **CPU compiler** (XLA's SPMD partitioner on this process's
# devices) and the **TPU compiler** (the same graph compiled by XLA:TPU for a TPU slice, compile-only) — is one
# view of a case in `shardlab.xla_scan.case`, run by `shardlab.harness`.

# %%
from shardlab import harness
from shardlab.xla_scan import case as C

L = max(p.layers_sweep)
on = C.ScanCase(p, layers=L)  # pre-stacked scan at L = max(layers_sweep), shard_as on
off = C.ScanCase(p, layers=L, shard_as=False)  # the same step as before the fix

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
cases = [C.ScanCase(p, layers=n, mode=mode) for n in sorted(set(p.layers_sweep)) for mode in C.MODES]
sweep = [(c, harness.hlo(c)) for c in cases]  # every mode at every L: compiled and run on the CPU devices
rows = C.record_sweep(rec, sweep)
rows

# %% [markdown]
# ## 2 · Compile time and graph size vs L
# Timing numbers come from torch_xla's metrics (`CompileTime`, `ExecuteReplicatedTime`) and are noisy on a
# shared 2-core machine; graph size is the instruction count of the partitioned per-device HLO (structural,
# exact). XLA:CPU outlines large elementwise ops into `parallel_*` computations once their size passes a
# threshold; `hlo_instructions` counts such a call once (`hlo_instructions_raw` counts everything).

# %%
from shardlab.viz.scan import bytes_vs_layers, compile_curves, explorer, tiling_figure
from shardlab.xla_scan.sharding import layer_spec

if rows is not None:
    compile_curves(rows.to_dict("records")).show()

# %% [markdown]
# **Reading the curves.** The loop's graph is L blocks long (instructions ≈ L × one block), so tracing,
# partitioning and compiling all grow with L. `scan_layers` puts one block in the loop but still `stack`s the
# L per-layer weights before it and slices the L gradients out after it, inside the graph, on every call:
# its size grows with L, by a few instructions per layer instead of a whole block. Pre-stacked `scan` holds
# weights as `[L, …]` parameters, so the program is the same for every L — only shapes change.
#
# Published TPU figures ([PyTorch/XLA's scan guide](https://docs.pytorch.org/xla/release/r2.8/features/scan.html):
# a 50-layer decoder trained on one TPU chip): the maximum compile time dropped from 1 min 03 s with a Python for
# loop to 19 s with `scan_layers`. What transfers to CPU: the *graph sizes* — backend-independent up to the CPU
# outlining noted above, with the same L-linear vs constant shapes. What does not: absolute seconds (XLA:CPU compiles this small MLP in about a second) and the
# ratio at small L, where fixed costs dominate. The default sweep is short to keep the notebook fast; run with
# `layers_sweep=[2, 4, 8, 16, 32, 64]` to see the loop's compile time pull away.
#
# **Compile time vs device count.** GSPMD partitions once for all devices, so compile time should not grow
# with their number. Each count needs its own process (one device world per process), so
# `devices_sweep=[1, 2, 4, 8]` runs each in a fresh subprocess with mesh (fsdp = n, tensor = 1).

# %%
C.devices_sweep(rec, p, L)

# %% [markdown]
# GSPMD partitions once into one per-device program, whatever the count: its size is the same for every count
# above 1 (one device needs no collectives, so its program is a little smaller) — that part of the claim
# holds. The seconds did *not* stay flat on this 2-core host: in every run we made, 8 devices compiled slower
# than 1–2 (e.g. 4.0 s vs 0.7 s at L = 64), and within one 8-device process mesh (8, 1) compiled ~3× slower
# than (2, 4). So on XLA:CPU the time depends on the mesh and count beyond the program size; we have not
# broken down where (PJRT CPU client vs partitioner). Timings are noisy here; the sizes are exact.
#
# ## 3 · 2-D sharding and `shard_as`
# ### Why the gradient loses its fsdp split
# The weight gradient is $dW_{up} = x^\top \cdot dh$ ($dh$: the gradient at $xW_{up}$), a sum over the batch (and
# sequence) rows. The batch is split over fsdp, so each device can only form a *partial* sum — the rule for a
# contraction over a split dimension:
#
# $$x^\top[H, B_{fsdp}] \cdot dh[B_{fsdp}, F_{tensor}] = dW_{up}[H, F_{tensor}]\{U_{fsdp}\}$$
#
# The contracted dimension carried the fsdp split, and it is gone from the result: fsdp appears nowhere in
# $dW_{up}$'s tiling, only in the pending sum. Something must add the fsdp partial sums. If nobody asks for a
# particular sharding of $dW$, the partitioner's natural finish is an **all-reduce over fsdp**: every fsdp
# device ends up with the whole sum, $dW[H, F_{tensor}]$ — **1-D**, replicated fsdp times. Asked for
# $dW[H_{fsdp}, F_{tensor}]$ (the weight's own sharding), it uses a **reduce-scatter over fsdp** instead: each
# device keeps only its 1/fsdp share of the sum.
#
# Inside `scan` that one choice is not local. The backward `While` writes $dW_l$ into slice $l$ of the stacked
# gradient `[L, H, F]`, which is part of the loop's carried state — and a `While`'s carried state has **one**
# sharding, the same on every iteration. So the per-layer gradient's 1-D sharding becomes the sharding of the
# whole stack: $L·H·F/t$ elements per device instead of $L·H·F/(f·t)$, **fsdp times more**. torch_xla's fix
# wraps the per-layer backward in `shard_as(weight_slice, grad_slice)` ("shard these two alike"), so the
# partitioner is asked for the weight's sharding and picks the reduce-scatter.
#
# Predict before you run the next cell: with `shard_as` off, which collective and over which mesh axis finishes
# $dW$ in the backward body? And with it on? (Exercises 3 and 4 grade your answer against the program.)

# %% [markdown]
# ### Formula, CPU compiler, TPU compiler
# The same pre-stacked scan at L = max(`layers_sweep`) with `shard_as` on (torch_xla's default) and off (the
# scoped monkeypatch `shard_as_enabled(False)` replaces `torch_xla.experimental.scan._backward_shard_alike` with
# a wrapper that only calls the backward — the behaviour before the fix — and restores it on exit). Per device:
# the stacked gradients' shapes and bytes, and the reductions over fsdp in the backward `While` body (bytes are
# what one device hands to the collective: the whole partial gradient, for an all-reduce and a reduce-scatter
# alike).

# %%
views = {c.tag: harness.views(c, ("formula", "hlo", "tpu")) for c in (on, off)}
harness.record(rec, "shard_as.on", *views["on"])

# %%
harness.record(rec, "shard_as.off", *views["off"])

# %%
C.contrast(rec, views["on"], views["off"])

# %% [markdown]
# **Interpretation.** Both compilers do what the formula says: without `shard_as` the weight gradients are
# finished by an all-reduce over fsdp and come out 1-D (`[L, H, F/t]`), with it by a reduce-scatter over fsdp
# and 2-D (`[L, H/f, F/t]`); the stacked gradients differ by exactly the fsdp factor. The backward `While`'s
# loop state holds an array of exactly each stacked gradient's per-device shape in every program (checked) — the
# carried sharding *is* the stack's — so the loop state is larger without `shard_as` by the stacked gradients'
# difference (give or take a few bytes of loop bookkeeping).
#
# **CPU vs TPU.** XLA:CPU has no reduce-scatter: it all-reduces and then cuts its share out with a
# dynamic-slice (the table counts that pair as the reduce-scatter it is). XLA:TPU, at the default sizes, emits a
# real reduce-scatter, and its collective combiner merges the two weights' reductions into one tuple instruction
# (count 1 with 2 operands; the operands and bytes agree). Both are the compiler's choices: at other sizes XLA:TPU
# also finishes one of them as all-reduce + dynamic-slice (a `[tpu]` note above the table says so when it
# happens); the number of logical reductions stays the same. The loop states are each compiler's own: XLA:TPU's
# holds bf16 copies of some saved tensors in this f32 model (at torch_xla's default matmul precision XLA:TPU
# multiplies f32 operands in bf16) and other bookkeeping, so the totals differ while the stacked gradients inside
# them are identical. At this small size the TPU compiler reproduces the 1-D vs 2-D difference exactly; at the
# seed's full size it reproduces the seed's out-of-memory error too (section "At full size" below).

# %%
harness.memory_frame({f"cpu · {t} (buffer assignment)": views[t][1] for t in ("on", "off")}
             | {f"tpu · {t} (compiled memory stats)": views[t][2] for t in ("on", "off")})

# %% [markdown]
# Per-device memory of the four programs. XLA:CPU's buffer assignment and XLA:TPU's compiled memory statistics
# are not expected to match each other (tiling, fusion and what each counts as temporary differ); within each
# compiler, OFF exceeds ON by the stacked gradients' difference (the outputs, on TPU).

# %%
points = C.stacked_bytes_points(sweep, views)  # measured: CPU at every L of the sweep (on), both compilers at L
bytes_vs_layers(C.stacked_bytes_lines(p, list(range(1, 2 * L + 1))), points).show()
if views["on"][1].ran:
    tiling_figure({f"shard_as {t}": layer_spec(views[t][1]["grad_spec"]) for t in ("on", "off")}, "H", "F").show()

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
C.transposed(rec, p, L)

# %% [markdown]
# ### The seed case: `[126, 4K, 16K]` on v6e-256
# PyTorch/XLA's report of the OOM ([pytorch/xla#8883](https://github.com/pytorch/xla/issues/8883), "Use shard_as
# to improve sharding and avoid OOM", March 2025) describes Llama 3.1 405B on v6e-256 with 2-D (FSDP + TP) sharding: in the backward `scan`, a
# per-layer gradient of shape `[1, 4K, 16K]` was all-reduced over the FSDP axis and written into a stacked
# `[126, 4K, 16K]` output, too large for one chip (126 = the model's layers). Those are per-chip shapes: the
# logical weight is `[126, 16K, 16K]` (o_proj's, the gradient [torchprime#160](https://github.com/AI-Hypercomputer/torchprime/issues/160) names; q_proj has the same
# shape), and 4K = 16K / 4 is the tensor split — so the mesh below is (fsdp 64, tensor 4), our reading of the
# 256 chips. Per chip, in bf16, against the 31.25 GiB of HBM the XLA:TPU compiler lets one v6e chip's program use
# (32 GiB published):

# %%
C.seed_table(rec)

# %% [markdown]
# 2-D: 252 MiB per chip for this array on every mesh. 1-D at (64, 4): 15.75 GiB per chip — half of a v6e
# chip's usable HBM for *one* weight's stacked gradient, with the other large weights' beside it, on top of
# weights, optimizer state and activations. `shard_as` divides it by 64.
#
# ### At full size: the real thing
# The seed's own sizes, compiled by XLA:TPU for a TPU slice (compile-only): **126 layers, hidden 16384, q_proj
# and o_proj [16384, 16384] each** (the two weights the report names), bf16, every weight and the input a
# placeholder — nothing is allocated, so a 405B-size step is only lowered and compiled. The block is
# $h = x + \mathrm{silu}(x W_q^\top) W_o^\top$ with $W_q[16384_{tensor}, 16384_{fsdp}]$,
# $W_o[16384_{fsdp}, 16384_{tensor}]$, $x[16_{fsdp}, 1024, 16384]$ (batch 16 × sequence 1024), on a mesh
# **fsdp 16 × tensor 4 of a v6e:8x8 slice** (64 chips). The seed's per-chip buffer `[126, 4K, 16K]` is set by the
# tensor split alone (16384 / 4 = 4K); the fsdp size only sets how much smaller the 2-D version is, so 64 chips
# show what 256 did (and 256 CPU devices, the graph's own world, are too many for this host). The 126 per-layer
# weights are stacked **inside the step**, as `scan_layers` does and the seed did, and the 126 per-layer
# gradients come out.
#
# Five compiles tell the story; at full size they take from ten seconds to a few minutes each on this 2-core
# host — more than this notebook's budget. So by default the table shows the compiles measured with
# `full_size=True` (the cache names how and when); `full_size=True` compiles them again here and records them.

# %%
from shardlab.xla_scan import scale as S

if p.full_size:
    full, _ = S.story()  # the five compiles, in a helper process with 64 CPU devices
    S.record_story(rec, "scale.405b", full, S.FULL_SIZE)
    cached, _ = S.load_story()
    rec.check("scale.405b: every verdict the text below describes holds for this compiler",
              {k: (r.fits, r.runs) for k, r in full.items()} == {k: (r.fits, r.runs) for k, r in cached.items()},
              str({k: (r.fits, r.runs) for k, r in full.items()}))
    print("compiled now")
else:
    full, source = S.load_story()
    about = f"cached: {source['command']}, {source['measured']}, libtpu {source['versions']['libtpu']}"
    rec.note("scale.405b", f"full-size compiles not run (full_size=False); the table shows the {about}")
    print(about)
S.story_frame(full, S.FULL_SIZE)

# %%
seed_off, seed_on = full["in_graph.off"], full["in_graph.on"]
print("shard_as off:", seed_off.message)
for size, shape, label in seed_off.largest[:2]:
    print(f"  {size / 2**30:.2f} GiB  {shape}  {label}")
print(f"shard_as on: fits; arguments {seed_on.argument_bytes / 2**30:.2f} GiB + temporaries "
      f"{seed_on.temp_bytes / 2**30:.2f} GiB checked, outputs {seed_on.output_bytes / 2**30:.2f} GiB; "
      f"per-layer gradients {S.grad_sharding(seed_on, S.FULL_SIZE)}: {seed_on.grad_shapes['q']}")

# %% [markdown]
# **The seed, reproduced.** Without `shard_as` the compiler refuses the step: *"Ran out of memory in memory space
# hbm. Used 36.56G of 31.25G hbm. Exceeded hbm capacity by 5.32G."* Its two largest allocations are the two
# stacked gradient buffers, `bf16[126,4096,16384]` and `bf16[126,16384,4096]`, 15.75 GiB each — the seed's
# `[126, 4K, 16K]` for q_proj and its transpose for o_proj, **1-D**: all-reduced over fsdp, split only over
# tensor. Their labels (`broadcast(constant)`) say what they are: the zero-initialised stacks the backward `While`
# writes each layer's gradient into. The two alone are 31.5 GiB, more than the chip's 31.25; the compiler stopped
# at the program (its message lists the arguments as "0B": not evaluated). With `shard_as` the same step fits:
# 2.00 GiB of arguments + 7.08 GiB of temporaries (11.05 GiB with the outputs), and each layer's gradient leaves
# **2-D**, `bf16[1024,4096]` per chip — 16 times smaller (the compiler returns q's with the fsdp and tensor
# splits swapped relative to the weight's [4096, 1024]; either way 1/64 of the layer).
#
# **Two contrasts explain it.**
#
# * **Held stacking** (weights held as `[126, …]` parameters, the step returns the stacked gradient): without
#   `shard_as` the gradients leave 1-D, `[126, 4096, 16384]` and `[126, 16384, 4096]` — **31.50 GiB of outputs**,
#   and the compile succeeds. The compiler's capacity check counts arguments and temporaries, not outputs: the
#   program needs 38.71 GiB live at its peak and could not run. The same 1-D stack, moved from a temporary to an
#   output, turns a compile error into a program that fails later.
# * **An update in the graph** (`w - lr·g` in the same step, held stacking): `shard_as` off and on give the same
#   program — the same bytes, and the updated weights leave 2-D, `[126, 4096, 1024]`. The update is elementwise
#   with the 2-D weight, so sharding propagation asks for the gradient sharded like the weight and carries that
#   back into the backward loop: the all-reduce becomes the reduce-scatter that `shard_as` asks for by hand.
#
# So this compiler (libtpu 0.0.21) needs `shard_as` **exactly when nothing in the same graph ties a gradient to its
# weight** — when the step ends at the gradients (returned, or sliced back out per layer as `scan_layers` does)
# instead of consuming them in an update. Then the 1-D stack is either a temporary that does not fit (in-graph
# stacking: a compile error) or an output that does not fit (held stacking: compiles, cannot run). With the
# optimizer's update in the same graph, propagation finds the weight's sharding on its own. The formula's
# dependence on the mesh holds at full size too: the 1-D buffer is `[126, 16384/tensor, 16384]`, so tensor = 8
# halves it (7.88 GiB per weight) and two of them no longer exceed the chip.
#
# The same five compiles at this notebook's size (the parameters' mesh, L = max(`layers_sweep`), bf16) run in
# a second: nothing is near the capacity, but the shardings are the same — 1-D without `shard_as` and without
# an update, 2-D otherwise, identical programs with the update.

# %%
small_case = S.small_case(p)
small, why = S.story(small_case)  # a v6e slice of fsdp x tensor chips (a helper process if that is not 8)
if why:
    print(f"[tpu] skipped: {why}")
    rec.skip("scale.small", "tpu", why)
else:
    S.record_story(rec, "scale.small", small, small_case)
    display(S.story_frame(small, small_case, unit="KiB"))
#
# ### `shard_as` on its own, and the `nn.Linear` trap
# `shard_as(a, b)` only says "a and b are sharded alike"; the partitioner copies the annotated one.

# %%
demo = C.shard_as_demo(p)  # None when the mesh does not tile this process
if demo is not None:
    rec.check("shard_as.demo.copies_sharding", demo.b_spec_with == demo.a_spec and "replicated" in
              demo.b_spec_without, str(demo))
    display(demo)
harness.record(rec, "linear_trap", *C.linear_trap(p))

# %% [markdown]
# `F.linear(x, W)` on `x[B, S, H]` lowers to a reshape to `[B·S, H]`, a 2-D dot, and a reshape back. With
# `x[B_fsdp, S_tensor, H]`, device (i, j) holds batch rows $[iB/f, (i+1)B/f)$ and positions $[jS/t, (j+1)S/t)$;
# in the merged index $b·S + s$ that block is one contiguous run only when it is a single batch row ($B/f = 1$)
# or all of S ($t = 1$). Otherwise no tiling of the merged dim describes it: the merged dim keeps the batch split
# only, the sequence split is undone (an all-gather), and each device multiplies $t$ times the rows — the table's
# `linear.rows` against `einsum.rows`. torch_xla's einsum patch (`XLAPatchedLinear`) keeps a 3-D dot and both
# splits; our block uses `einsum` for that reason. The checks hold for every mesh: rows as the formula says, and
# data moves exactly when the rows grow.
#
# XLA:TPU did not fall into the trap here: its per-chip dot keeps the batch and sequence dims apart (see the
# note above the table), so `F.linear` and einsum compile to the same per-chip work. The trap is a property of
# the flattened 2-D dot reaching the partitioner, which this XLA:CPU pipeline lets happen and this XLA:TPU
# pipeline did not — measured, for this small case.
#
# ## 4 · Placeholder tensors
# A placeholder has a shape and a dtype and no device buffer: it lowers to an HLO parameter.

# %%
from shardlab.xla_scan import patches as P

rss0 = P.current_rss_bytes()
big = P.placeholder((1 << 34,))  # 2^34 float32 = 64 GiB
rss_grew_mib = (P.current_rss_bytes() - rss0) / 2**20
hlo = P.lowered_hlo([big * 2.0])  # lowered, never executed (executing it would crash torch_xla 2.9)
try:
    P.read(big)
    read_error = None
except P.PlaceholderReadError as e:
    read_error = str(e)
rec.check("placeholder.no_memory", rss_grew_mib < 100, f"RSS grew {rss_grew_mib:.1f} MiB for 64 GiB logical")
rec.check("placeholder.lowers_to_parameter", "f32[17179869184]{0} parameter(" in hlo, hlo.splitlines()[0])
rec.check("placeholder.read_error_is_clear", read_error is not None and "placeholder" in read_error, str(read_error))
print(f"logical {P.logical_bytes(big) / 2**30:.0f} GiB, RSS grew {rss_grew_mib:.1f} MiB\n{read_error}")

# %% [markdown]
# **Tracing must not move data.** The upstream report ([pytorch/xla#8612](https://github.com/pytorch/xla/issues/8612),
# "Placeholder tensors", January 2025) compared one model run with a for loop and with `scan`: *"From the metrics, it transfers 23 GiB compared
# to 182 MiB when using for loops. The metric `IrValueTensorToXlaData` has a large count (>200) under scan
# compared to 0 under for loop."* The cause: scan traced its function on fake inputs that were real device tensors.
# The fix ([pytorch/xla#8785](https://github.com/pytorch/xla/pull/8785)) makes them placeholders; torch_xla 2.9, used here, has it.
#
# We trace one forward+backward step (twice; the second is measured, after torch_xla has cached its scalar
# constants) and read `OutboundData` — host→device bytes despite the name — and the same
# `IrValueTensorToXlaData` count. `placeholders_enabled(False)` swaps torch_xla's placeholder factory for the
# pre-fix `torch.zeros(shape).to(device)`: one real transfer per fake input, replicated to every device.

# %%
tt = C.transfers(p, L)
if tt is None:
    why = C.mesh_problem(p, world.num_devices)
    print(f"[metrics] skipped: {why}")
    rec.skip("placeholder.trace", "metrics", why)
else:
    display(C.record_transfers(rec, p, tt))

# %% [markdown]
# Without placeholders one trace sends $3BSH + 2BSF + 4HF$ elements (fake carry and one layer's weights for
# the forward scan; fake grad carry and one slice of each saved activation — $x$, $xW_{up}$,
# $\mathrm{gelu}(xW_{up})$, $W_{up}$, $W_{down}$ — for the backward), times the device count: the $HF$ term
# makes it grow with the square of the width, and every fake input counts once in `IrValueTensorToXlaData`. With
# placeholders our trace moves 0 bytes, like the loop. We do not reconstruct the upstream 23 GiB: the report
# names neither the model's size nor what the for loop's 182 MiB were.
#
# ## 5 · Explorer
# Pick a mesh, L and hidden; the small case re-runs with shard_as on and off (two compiles).

# %%
if rows is not None:
    widget, update = explorer(lambda f, t, n, h: C.explore(p, f, t, n, h),
                              [(p.mesh_fsdp, p.mesh_tensor), (p.mesh_tensor, p.mesh_fsdp)],
                              sorted(set(p.layers_sweep), reverse=True), [p.hidden, 2 * p.hidden])
    display(widget)
    probe = update()  # headless: exercise the code path once (the default choice is already compiled)
    rec.check("explorer.runs", probe["off"]["stacked grads B"] > probe["on"]["stacked grads B"], str(probe))

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. On a mesh (fsdp = 8, tensor = 1), with L = 4, H = 128, F = 512, how many times larger is the stacked
#    gradient without `shard_as`?
# 2. The seed case on mesh (fsdp 16, tensor 16) in bf16: how many GiB per chip does the 1-D stacked gradient
#    `[126, 16384, 16384]` take?
# 3. *Predict, then check the HLO.* With `shard_as` off, which collective over which mesh axis finishes the
#    weight gradients in the backward `While` body? Answer as `"<collective> <axis>"`, e.g. `"all-gather tensor"`.
#    The grader compares with the reductions that the OFF program has and the ON program does not.
# 4. *Predict, then check the HLO.* And with `shard_as` on — what replaces it?
# 5. `F.linear` on `x[B=8, S=8, H]` split as `x[B_fsdp, S_tensor, H]` on mesh (fsdp 4, tensor 2): how many rows
#    does each device's 2-D dot multiply on XLA:CPU?
# 6. *Predict, then check the metrics.* How many host→device transfers does one trace of this block make
#    without placeholders?

# %%
from shardlab.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
program = next((t for t in (1, 2) if views["on"][t].ran and views["off"][t].ran), None)  # CPU, else TPU
changed = C.what_shard_as_changed(views["off"][program], views["on"][program], p) if program else (None, None)
answer_1 = None  # a ratio
answer_2 = None  # GiB (a number)
answer_3 = None  # "<collective> <axis>"
answer_4 = None  # "<collective> <axis>"
answer_5 = None  # rows (an int)
answer_6 = None  # a count
ex.show(1, answer_1)
ex.show(2, answer_2)
ex.show(3, answer_3, changed=changed[0])
ex.show(4, answer_4, changed=changed[1])
ex.show(5, answer_5)
ex.show(6, answer_6)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. 2-D splits each layer's gradient over fsdp × tensor = 8 devices; all-reduced over fsdp, only the tensor split
#    (1) is left, so all 8 devices hold the whole thing: 8 times more.
# 2. The logical array is 126 · 16384 · 16384 · 2 B = 63 GiB; 1-D keeps only the tensor split: 63 / 16 GiB.
# 3. $x^\top[H, B_{fsdp}] \cdot dh[B_{fsdp}, F_{tensor}] = dW[H, F_{tensor}]\{U_{fsdp}\}$: the partial sums live on
#    the fsdp axis, and with no sharding requested for $dW$ the partitioner sums them where every device gets the
#    whole result — an all-reduce over fsdp.
# 4. `shard_as` requests $dW[H_{fsdp}, F_{tensor}]$: sum and keep only your share — a reduce-scatter over fsdp
#    (on XLA:CPU an all-reduce followed by a dynamic-slice of the share).
# 5. B/f = 2 batch rows per device, split again in S by t = 2: not contiguous in the 64 merged rows, so only the
#    batch split survives: 64 / 4 = 16 rows (einsum: 64 / 8 = 8).
# 6. Forward scan: the carry and one layer's W_up and W_down (3); backward scan: the gradient carry and one slice
#    of each of the 5 tensors the block saves (x, x·W_up, gelu(x·W_up), W_up, W_down): 9.
# </details>

# %%
rec.measure("notebook.wall_s", time.perf_counter() - _t0, "s", "timer", kind="timing")
rec.close()["status"]
