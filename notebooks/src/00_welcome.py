# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
n = 1024  # elements of each rank's vector in the collectives
world_size = 8  # ranks in the collectives (2, 4 or 8)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.blocks.params import WelcomeParams
from shardlab.profile import Recorder

p = WelcomeParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)  # env vars, then torch_xla, then SPMD on
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 00 · Welcome to shardlab
#
# shardlab teaches **and measures** how large models are split across accelerators, on PyTorch/XLA. Every
# notebook answers a question with a number measured four ways that must agree.
#
# **Words used before they are explained** (each notebook explains its own at length):
# - **f and g** — Megatron-LM's two communication operators for tensor parallelism (Shoeybi et al. 2019): **f**
#   sits where a replicated activation enters a layer split over devices (forward: identity; backward: an
#   all-reduce of the input gradient), **g** where that layer's partial sums leave it (forward: an all-reduce;
#   backward: identity). The letters f and g mean only these two operators in every notebook.
# - **ZeRO** — sharding a data-parallel model's optimizer state (stage 1), also its gradients (stage 2), also its
#   parameters (stage 3) over the data-parallel devices, instead of replicating them (Rajbhandari et al. 2020).
#   PyTorch's FSDP with FULL_SHARD is ZeRO stage 3.
# - **SPMD, GSPMD** — single program, multiple data: every device runs the same program on its own block of the
#   data. GSPMD is XLA's SPMD *partitioner* (Xu et al. 2021): from sharding annotations on a few tensors it derives
#   one per-device program and inserts the collectives it needs.
# - **HLO** — XLA's intermediate representation, a text program of operations on arrays. The *partitioned* HLO is
#   the per-device program the partitioner produced; its collectives are what the compiler views count.
# - **PJRT** — the runtime interface torch_xla uses to reach devices; `PJRT_DEVICE=CPU` or `TPU` picks the kind.
# - **collectives** — all-reduce, all-gather, reduce-scatter: section 2 shows what each does.
#
# | view | what it is | where |
# |---|---|---|
# | **formula** | the paper's algebra (Megatron, ZeRO, Korthikanti et al.) as plain functions | `shardlab.formulas` |
# | **ledger** | our own per-rank code, written Megatron-style (each rank holds its shard and calls collectives), run in an in-process `SimulatedWorld` that records every collective | `shardlab.comm`, `tp`, `fsdp` |
# | **compiler** | the same math as GSPMD `mark_sharding` annotations; collectives and buffers read from the HLO that XLA's SPMD partitioner produced on this machine's devices (XLA:CPU) | `shardlab.profile` |
# | **TPU compiler** | the same traced graph handed to the real XLA:TPU compiler (`libtpu`) for a TPU slice we do not own — compile-only, nothing runs on a TPU: the per-chip program, its collectives and its memory | `shardlab.profile.tpu` |
#
# When views disagree where they must agree, the notebook fails — loudly, with both numbers. Where the two
# compilers legitimately differ (the TPU keeps bf16 in bf16 and merges independent collectives, and its passes
# turn an all-reduce + slice into a real reduce-scatter; XLA:CPU's passes do neither), the table shows both and
# the notebook says why.
#
# ## The notebooks
# | # | topic |
# |---|---|
# | 01 | block matrices: split by columns → concatenate; by rows → sum (one all-reduce); a 2-D mesh; the four sharded-matmul cases and the conflicting-axis one |
# | 02 | Megatron MLP: column- then row-parallel, the `f` / `g` operators, sequence parallelism |
# | 03 | Megatron attention: heads split over devices |
# | 04 | vocab-parallel embedding and cross-entropy |
# | 05 | FSDP flat parameters: the FlatParameter itself, exactly as PyTorch shards it; ZeRO memory |
# | 05b | FSDP under GSPMD, compared collective by collective with PyTorch's FSDP1 and FSDP2 |
# | 06 | `scan` over layers, 2-D sharding, `shard_as` (the 405B OOM in miniature), placeholder tensors |
# | 07 | planner: from 8 CPU devices to a TPU pod |
# | 08 | compiler levers (TorchAcc's): combining collectives, overlapping them with compute, memory order, automatic sharding |
#
# ## Notation (used everywhere; one letter, one meaning)
# - Sizes: `b` batch, `s` sequence, `h` hidden, `F` FFN width (notebook 02's parameter `ffn`), `n_h` heads, `V`
#   vocabulary, `L` layers, `p` devices in a group (a ring, a tensor-parallel group: `tp` = p), `e` bytes per
#   element, `Ψ` parameters. `W` is always a weight matrix, never a device count.
# - `A[I_X, J_Y]`: tensor A with its first dimension split over mesh axis X and its second over Y;
#   an axis not named is replicated. `A[I, J_X]` is "split by columns over X". Capital `X`, `Y` are mesh axes;
#   activations are written lower-case (`x`, `y`).
# - `A{U_X}`: A holds *unreduced partial sums* over X — each device has a full-size piece that must still be
#   added across X (an all-reduce, or a reduce-scatter if the result may stay split).
# - Bytes are **payload per device**: what one device hands to a collective (all-reduce: its input; all-gather:
#   its shard; reduce-scatter: its full input). The ring model turns payload into bytes sent per device:
#   all-reduce 2(p−1)/p·payload, all-gather (p−1)·payload, reduce-scatter (p−1)/p·payload (section 3 shows why).
#
# ## Running on a TPU (Kaggle, Colab, Cloud TPU VMs)
# The cell right after the parameters cell installs the pinned `torch==2.9.0`, `torch_xla[tpu]==2.9.0` (which
# brings `libtpu`) and the JAX pins when it runs on Colab or Kaggle, and sets `PJRT_DEVICE=TPU`; on your own
# machine it does nothing. What runs where:
#
# - **Free Colab: one v5e chip** → set `num_devices = 1`. Formula and ledger run at the notebook's own sizes (they
#   need no devices), and the TPU-compiler view compiles the multi-chip program for a slice of the right size
#   (in a helper process). The compiler views that need more devices than one chip are skipped, each with a
#   printed note; nothing fails for it.
# - **Kaggle: a v5e-8** (eight chips) → `num_devices = 8`: everything runs, and the compiler column *is* the TPU's
#   own program, so the separate TPU-compiler view steps aside.
# - **This machine** (CPU, 8 virtual devices by default): everything runs; the compiler column is XLA:CPU and the
#   TPU-compiler column the real TPU compiler, compile-only (from the pinned `libtpu` wheel; the hosted cell
#   installs it only on TPU runtimes, so on a hosted *CPU* runtime the TPU-compiler view is skipped with a note).
#
# Timings are always labelled with their device; only structural numbers (collectives, bytes, shapes) are
# comparable across devices.

# %% [markdown]
# ## 1 · Devices, meshes and sharding strings
# `runtime.setup` must run before anything imports `torch_xla`: it sets `PJRT_DEVICE`, `CPU_NUM_DEVICES` and an
# HLO dump directory, then switches SPMD on. Under SPMD all devices appear as **one** logical XLA device; a
# `Mesh` gives them names (axes), and `mark_sharding(t, mesh, spec)` says, per tensor dimension, which mesh axis
# splits it. XLA records the result as a **sharding string**, and you will meet those strings in every HLO dump.
# Here are a few, on a mesh of this process's devices, next to what `shardlab.blocks.tiles` predicts for them.

# %%
import torch
import torch_xla
import torch_xla.distributed.spmd as xs

from shardlab.blocks import collective_figures as vc
from shardlab.blocks import tiles

data_axis = 2 if world.num_devices % 2 == 0 and world.num_devices >= 4 else 1
mesh_shape, axes = (data_axis, world.num_devices // data_axis), ("data", "model")
mesh = runtime.mesh(mesh_shape, axes)
specs = {"(None, 'model')": (None, "model"), "('model', None)": ("model", None),
         "('data', 'model')": ("data", "model"), "(None, None)": (None, None)}
strings = {}
for label, spec in specs.items():
    t = torch.arange(64.0).reshape(8, 8).to(runtime.device())  # created on the CPU, moved, then annotated
    xs.mark_sharding(t, mesh, spec)
    strings[label] = torch_xla._XLAC._get_xla_sharding_spec(t)
    predicted = tiles.sharding_string(mesh_shape, axes, spec)
    rec.check(f"welcome.sharding.{label}", strings[label] == predicted,
              f"torch_xla {strings[label]} vs predicted {predicted}")
    same = "the same" if strings[label] == predicted else predicted
    print(f"mesh {dict(zip(axes, mesh_shape, strict=True))}, spec {label:>18}: {strings[label]:<58} predicted: {same}")
if world.num_devices == 1:
    print("this process has one device: every tensor lives whole on it, so every string is {replicated}; the "
          "explanation below uses a mesh (data 2, model 4) of 8 devices (predicted strings, no devices needed)")
vc.tiles_figure({k: strings[k] for k in list(specs)[:3]}, (8, 8), world.num_devices).show()

# %% [markdown]
# ### Reading a sharding string
# Take `W[K, N_model]`: an [8, 8] tensor with spec `(None, "model")` on a mesh `(data 2, model 4)` of 8 devices.
# XLA writes
#
# `{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}`
#
# - **`[1,4,2]` — the tile assignment dims.** One count per tensor dim: how many blocks (*tiles*) that dim is cut
#   into. Rows: 1 (not split); columns: 4 (the `model` axis). A sharded tensor is a grid of blocks — notebook 01
#   is about exactly these blocks.
# - **`last_tile_dim_replicate` — the last count is copies, not a dim.** The assignment has one extra, last
#   entry: how many devices hold a copy of each tile. The spec does not name the `data` axis, so every column
#   block lives on 2 devices. Without the flag every tile lives on exactly one device; `{replicated}` means one
#   tile, held by every device.
# - **`0,4,1,5,2,6,3,7` — the device order.** The device ids, row-major over `[1,4,2]`: tile (0, 0) is on
#   devices 0 and 4, tile (0, 1) on 1 and 5, … It is the mesh's id array `[[0,1,2,3],[4,5,6,7]]` with its axes
#   reordered — the axes the spec names first (dim by dim), the unnamed ones (the copies) last — and flattened:
#   `(model, data)` order gives 0,4 · 1,5 · 2,6 · 3,7.
#
# `tiles.tile_devices` reads a string back into that array (shape `(*tiles, copies)`):

# %%
tiles.tile_devices(tiles.sharding_string((2, 4), ("data", "model"), (None, "model")), rank=2)

# %% [markdown]
# ## 2 · What the three collectives do
# Every rank (device) starts with its own tensor; a collective is one call that every rank makes together.
# The picture runs the per-rank code (`comm.all_reduce(x)`, `comm.reduce_scatter(x)`, `comm.all_gather(x)`)
# in a `SimulatedWorld` on *rank arithmetic* — rank r holds the value r + 1 — and draws what each rank held
# before and what the call returned:
#
# - **all-reduce**: every rank hands in a full tensor and gets back the elementwise sum over ranks
#   (1 + 2 + … + p everywhere). Payload: the whole tensor.
# - **reduce-scatter**: the same sum, but rank r keeps only block r of it. Payload: the whole tensor; result: 1/p.
# - **all-gather**: rank r hands in its block and every rank gets all p blocks, in rank order. Payload: one block.
#
# An all-reduce is a reduce-scatter followed by an all-gather — the next section builds it that way.

# %%
vc.before_after(p.world_size).show()

# %% [markdown]
# ## 3 · Why a ring all-reduce costs each device 2(p−1)/p of its payload
# Put the p ranks in a ring; rank r only ever sends to rank r + 1. Cut every rank's vector into p chunks.
#
# 1. **Reduce-scatter, p − 1 steps.** At step i, rank r sends chunk r − i (mod p) — its own copy at step 1, after
#    that the partial sum it built at the step before — and the receiver adds it to its own copy. After p − 1 steps
#    rank r holds chunk r summed over all ranks.
# 2. **All-gather, p − 1 steps.** At step i, rank r sends the complete chunk r − i + 1, and the receiver keeps it.
#    After p − 1 steps every rank has every complete chunk.
#
# Each step every rank sends exactly one chunk of payload/p bytes, so each rank sends 2(p − 1)·payload/p — just
# under twice the payload whatever p is: the *bytes* per device barely change with p, because each link only ever
# carries 1/p of the data at a time. The *steps* do change: 2(p − 1) of them, and each pays a fixed start-up α
# (latency, synchronisation) before its chunk travels. So the time is, in the α–β model,
#
# $$T_\text{ring} \approx 2(p-1)\,\alpha \;+\; \frac{2(p-1)}{p}\,\frac{\text{payload}}{\beta}$$
#
# — for a large payload the second term dominates and the time is flat in p; for a small one the first does, and a
# ring over many devices is slow. `shardlab.blocks.ring.simulate` runs this schedule on real tensors and counts the
# steps and what each rank sent; below it is drawn for 4 ranks, then counted for every ring size and compared with
# the formulas.

# %%
from shardlab.blocks import ring

ring4 = ring.simulate("all_reduce", [torch.full((4,), float(r + 1)) for r in range(4)])
vc.ring_figure(ring4).show()

# %%
import pandas as pd

from shardlab.formulas.common import ring_steps, ring_time_s, wire_bytes

rows = []
for w in sorted(w for w in {2, 4, 8, p.world_size} if p.n % w == 0):  # even chunks: every rank sends alike
    vectors = [torch.randn(p.n, generator=torch.Generator().manual_seed(p.seed + r)) for r in range(w)]
    for op, inputs, payload in (("all_reduce", vectors, p.n * 4),
                                ("reduce_scatter", vectors, p.n * 4),
                                ("all_gather", [v[: p.n // w] for v in vectors], p.n // w * 4)):
        trace = ring.simulate(op, inputs)
        sent = [trace.sent_bytes(r) for r in range(w)]
        if op == "all_reduce":
            dense = torch.stack(vectors).sum(0)
            rec.check(f"welcome.ring.all_reduce.W{w}.sum",
                      all(torch.allclose(r, dense, atol=1e-4) for r in trace.results),
                      "every rank's ring result == the sum of the vectors")
        formula = wire_bytes(op, payload, w)
        rows.append({"p": w, "op": op, "payload bytes": payload, "latency steps": trace.steps,
                     "sent by each rank": sent[0], "formula": formula, "sent / payload": round(sent[0] / payload, 4)})
        rec.check(f"welcome.ring.{op}.W{w}.sent_bytes", all(s == formula for s in sent),
                  f"every rank sent {sorted(set(sent))} bytes, the ring formula says {formula}")
        rec.check(f"welcome.ring.{op}.W{w}.steps", trace.steps == ring_steps(op, w),
                  f"the simulation took {trace.steps} steps, the formula says {ring_steps(op, w)}")
pd.DataFrame(rows)

# %% [markdown]
# The all-reduce's bytes approach 2 × the payload as p grows while its steps grow as 2(p − 1); the all-gather's
# payload is one shard, so its (p − 1)·shard is the same (p − 1)/p of the *gathered* vector that the
# reduce-scatter sends — half of the all-reduce each, in half the steps.
#
# What the two terms mean in time, for an all-reduce of a small (4 KiB) and a large (64 MiB) payload. α and β are
# stated here, not measured: α = 240 µs per step and β = 1.2 GB/s are the per-call start-up and the bandwidth
# notebook 08 fits for gloo all-reduces on the reference machine (its baseline, rounded) — a CPU transport, far
# slower than a TPU's links; the *shape* of the curves is the point.

# %%
alpha_s, beta_Bps = 240e-6, 1.2e9  # stated (notebook 08's gloo fit on the reference machine, rounded)
pd.DataFrame([{"p": w, "payload": label, "steps": ring_steps("all_reduce", w),
               "latency 2(p−1)α [ms]": ring_steps("all_reduce", w) * alpha_s * 1e3,
               "bandwidth 2(p−1)/p·payload/β [ms]": wire_bytes("all_reduce", nbytes, w) / beta_Bps * 1e3,
               "T_ring [ms]": ring_time_s("all_reduce", nbytes, w, alpha_s, beta_Bps) * 1e3}
              for label, nbytes in (("4 KiB", 4096), ("64 MiB", 64 * 2**20)) for w in (2, 8, 64, 256)]).round(3)

# %% [markdown]
# At 4 KiB the latency term is all there is, and it grows 255-fold from p = 2 to 256. At 64 MiB the bandwidth term
# dominates over tens of devices and grows less than 2× from p = 2 to 256 — but with gloo's large α the 510
# start-ups of a 256-device ring cost about as much as the bytes. That is why frameworks bucket many small
# gradients into one all-reduce (notebook 08), and why large groups are not one flat ring (trees, rings of rings,
# or the torus axes of a TPU slice).
#
# ## 4 · Four views of one collective
# Now the same three collectives, each measured four ways at `world_size` = p ranks, every rank holding a vector of
# `n` float32 values (for the all-gather: a shard of n/p):
#
# - **formula**: one collective, payload per device (n·4 bytes, or (n/p)·4 for the all-gather's shard), ring wire
#   bytes;
# - **ledger**: the per-rank code of section 2 in a `SimulatedWorld(p)`; its wire bytes are counted chunk by chunk
#   along section 3's ring schedule (`ring.ledger_wire_bytes`), so formula = ledger on wire tests the formula;
# - **compiler**: `x` of shape `[p, n]` sharded by rows over a mesh axis of p devices (device r holds row r), then
#   `x.sum(0)` (XLA sums locally, then all-reduces the partial sums), the same sum asked to stay split along its
#   dim 0 (a reduce-scatter), and `x * 2` asked for on every device (an all-gather). The mesh is
#   `(num_devices / p, p)`; when p does not tile this process's devices the view is skipped, with a note;
# - **TPU compiler**: the same graph compiled for a v5e slice — of `num_devices` chips, or of p chips in a helper
#   process when p does not tile this process.

# %%
from shardlab.blocks.case import CollectiveCase, measured
from shardlab.core import harness

cases = {
    "sum": CollectiveCase(p, "all_reduce", (p.n,), label="sum"),
    "gather": CollectiveCase(p, "all_gather", (p.n // p.world_size,), label="gather"),
    "scatter": CollectiveCase(p, "reduce_scatter", (p.n,), label="scatter"),
}
views = {k: harness.views(c) for k, c in cases.items()}  # formula, ledger, hlo, tpu

# %%
tables = [harness.record(rec, "welcome", *v) for v in views.values()]
for k, v in views.items():  # XLA:CPU (metrics) and XLA:TPU (tpu) compile seconds, timing rows
    harness.record_compile_s(rec, f"welcome.{k}.compile_s", v[2], v[3])
pd.concat(tables, ignore_index=True)

# %% [markdown]
# **Reading the table.** Each row is one quantity; each column one way of getting it. `agree` is checked, not
# eyeballed: the notebook raises if it is False. The compilers' bytes are the operand of the collective in the
# per-device program, so they are per-device numbers, like the ledger's payload. Wire bytes exist only where an
# algorithm is assumed (the formula's ring model, the ledger's collectives walked through the ring schedule); the
# HLO names the collective, not the algorithm that will run it.
#
# **CPU vs TPU: the reduce-scatter.** XLA:CPU never emits a reduce-scatter here: the partitioner writes the sum as
# an all-reduce of the whole vector followed by a `dynamic-slice` of each device's block, and XLA:CPU's pass
# pipeline (torch_xla 2.9) has no pass that turns that pair into a reduce-scatter — its runtime does run one when
# the HLO contains it (measured with a hand-written reduce-scatter). The table counts the pair as the
# reduce-scatter it implements. XLA:TPU's passes do the rewrite, picking the form by shape and size: in our runs
# (libtpu 0.0.21) a 1-D vector stayed an all-reduce + `dynamic-slice` at every size we tried, a [32, 128] float32
# block too, and a [64, 256] one became a real reduce-scatter, whose result is 1/p of its operand. This run, both
# forms:

# %%
big_views = harness.views(CollectiveCase(p, "reduce_scatter", (64, 256), label="scatter_64x256"))
display(harness.record(rec, "welcome", *big_views))
for label, v in (("the n-element vector", views["scatter"][3]), ("the [64, 256] block", big_views[3])):
    if v.ran:
        c = v.detail.module.collectives[0]
        form = "all-reduce + dynamic-slice" if c.feeds_dynamic_slice else f"{c.op} ({c.form})"
        print(f"TPU, {label}: {form}, operand {c.operand_bytes} B, result {c.result_bytes} B per chip")

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint. Exercises 1–4 are
# "predict it, then check": the grader compares your number with what the notebook measures — the ring simulation
# for 1–3, the compiler's program for 4.
#
# 1. A ring all-reduce over p = 8 devices: how many steps does it take?
# 2. With p = 8 and a vector of 1024 float32 values, how many bytes does each device *send* in that ring
#    all-reduce?
# 3. The same data as a ring all-gather of 128-element float32 shards: how many bytes does each device send?
# 4. Each of the p devices holds a shard of 256 float32 values; the program asks for the gathered tensor on every
#    device. What operand bytes does the compiler's all-gather show per device?
# 5. A tensor [8, 8] on the mesh `(data 2, model 4)` of devices 0–7, spec `(None, "data")`: write the sharding string
#    XLA prints for it.
# 6. Code: write the per-rank function `answer_6(comm, x)` that returns the all-reduce of `x` (a 1-D tensor whose
#    length divides by the world size) **without** calling `comm.all_reduce` — only `comm.reduce_scatter` and
#    `comm.all_gather`. The grader runs it on 4 ranks of a `SimulatedWorld`: every rank must get the sum, and its
#    ledger must send exactly the wire bytes of a ring all-reduce.

# %%
from shardlab.core.exercises import Exercises

ring8 = ring.simulate("all_reduce", [torch.zeros(1024)] * 8)
gather8 = ring.simulate("all_gather", [torch.zeros(128)] * 8)
shard_views = harness.views(CollectiveCase(p, "all_gather", (256,), label="exercise_gather"))
harness.record(rec, "welcome", *shard_views, show=False)

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # a count
answer_2 = None  # bytes
answer_3 = None  # bytes
answer_4 = None  # bytes
answer_5 = None  # a string like "{devices=[...]...}"
answer_6 = None  # a function (comm, x) -> tensor, e.g. def answer_6(comm, x): ...
ex.show(1, answer_1, steps=ring8.steps)
ex.show(2, answer_2, sent=ring8.sent_bytes(0))
ex.show(3, answer_3, sent=gather8.sent_bytes(0))
ex.show(4, answer_4, operand_bytes=measured("exercise_gather.all_gather.bytes", shard_views[3], shard_views[2]))
ex.show(5, answer_5)
ex.show(6, answer_6)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. p − 1 steps of reduce-scatter, then p − 1 of all-gather.
# 2. Every step each device sends one chunk of payload/p; there are 2(p − 1) steps. So 2(p − 1)/p of the payload —
#    nearly the same fraction of bytes on 64 devices, in 126 steps instead of 14.
# 3. An all-gather is only the second half of the ring: p − 1 steps of one shard each. Half of exercise 2 — an
#    all-reduce *is* a reduce-scatter plus an all-gather.
# 4. The operand of an all-gather is what one device contributes, its own shard: 256 × 4 bytes, whatever p is. The
#    result is p times larger.
# 5. One tile count per tensor dim (rows not split, columns cut in 2 by `data`), then the copies (`model`'s 4
#    devices hold each tile), flagged `last_tile_dim_replicate`. The device ids in `(data, model)` order are the
#    mesh's own order.
# 6. `part = comm.reduce_scatter(x)` leaves rank r with block r of the sum (p − 1 ring steps), then
#    `return comm.all_gather(part)` hands every rank every block (p − 1 more): together (p − 1)/p + (p − 1)/p of the
#    payload — the ring all-reduce of section 3, written as its two phases.
# </details>

# %%
rec.close()["status"]
