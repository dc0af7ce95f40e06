# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
generation = "v5e"  # TPU generation compiled for (compile-only): "v5e" or "v6e"
run_tpu = True  # False: formula, ledger, CPU compiler and timings only (no TPU compiles)
layers = 8  # L weight gradients of the data-parallel / FSDP step (combining, overlap)
hidden = 256  # width of those square layers
batch = 64  # global batch of that step, sharded over all devices
bucket_bytes = 1048576  # hand-made gradient buckets for the ledger (DDP's bucket_cap_mb), bytes
bucket_first_bytes = 1048576  # the first bucket's own limit (DDP: dist._DEFAULT_FIRST_BUCKET_BYTES)
gloo_world = 2  # processes for the real all-reduce timings; 0 skips them
gloo_repeats = 5  # timed samples per point (after 2 warm-up rounds)
gloo_numels = [4096, 1048576]  # float32 elements per timed point (all m calls together)
gloo_calls = [1, 8, 32]  # m: the point's elements are split over m all-reduces
mlp_seq = 512  # Megatron MLP (bf16, batch 2, tp equal to num_devices) for overlap and fusion
mlp_hidden = 512
mlp_ffn = 2048
toy_rows = 262144  # memory-order toy on the TPU: one unit = [toy_rows, 256] bf16 per chip
big_layers = 4  # layers of the two large compile-only steps (overlap, weight update)
overlap_hidden = 2048  # the FSDP step of the overlap section (compile-only, bf16): [h, h] weights
overlap_batch = 8192  # and its global batch [B, h]
update_hidden = 512  # the memory-aware weight update (compile-only, bf16, replicated)
update_batch = 256
optimizer = "adam"  # "sgd" or "adam"
search = "small"  # layouts compiled for the TPU: "off", "small" (4 meshes), "full" (every mesh+layout)
auto_sharding = True  # also try XLA's auto-sharding (compile-only) on the Megatron MLP
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.levers.params import LeversParams
from shardlab.profile import Recorder

p = LeversParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 08 · Compiler levers: combining, overlap, memory order, automatic strategy
#
# Alibaba's **TorchAcc** trains PyTorch models on XLA and gets much of its speed and memory not from a new parallel
# layout but from *compiler levers*: it **merges** scattered collectives, **overlaps** communication with compute
# (XLA's latency-hiding scheduler), **reorders** operators and places tensors to cut peak memory (its ROAM work:
# 16 % / 13 % / 27 % less memory than PyTorch, a heuristic and an ILP baseline), and **searches** parallel strategies
# automatically. This notebook measures each lever *off* and *on*, on both compilers the suite has:
#
# - **XLA:CPU** (the partitioned HLO of the 8 virtual devices): torch_xla 2.9's CPU compiler has no collective
#   combiner and no asynchronous collectives, so it shows most levers *off*;
# - **XLA:TPU**, compile-only: the real TPU compiler (`libtpu`) compiles the same traced graph for a TPU slice we do
#   not own. Nothing runs on a TPU; we read the per-chip program, its memory and its schedule.
#
# Times that depend on a TPU are a **model** (hardware numbers from `data/hardware`); times measured here are gloo
# on this machine's CPU cores, labelled as such.
#
# **Five levers, five sections** — each stands on its own: 1 combining collectives, 2 overlap, 3 memory order,
# 4 automatic strategy, 5 fusion; then a summary (off vs on) and the exercises.
# **Letters**: p chips (devices) of the slice; L layers of width h, global batch B, e bytes per element; m collective
# calls (m′ after combining) carrying n elements; α the start-up of one call, β the bandwidth; f and g are Megatron's
# two operators (notebook 02: f identity forward / all-reduce backward, g the reverse).

# %%
import math

import pandas as pd
import torch
import torch.distributed as dist

from shardlab.core import harness
from shardlab.formulas.common import wire_bytes
from shardlab.formulas.flops import linear_stack_step_flops
from shardlab.formulas.hardware import chip, group_axes
from shardlab.levers import case as L
from shardlab.levers import combine as C
from shardlab.levers import figures as VL
from shardlab.levers import fusion as FU
from shardlab.levers import overlap as OV
from shardlab.levers import programs as P
from shardlab.levers import search as S
from shardlab.profile import order as O

chips = world.num_devices  # p in the formulas below
use_tpu = p.run_tpu and world.kind == "cpu"  # on a TPU host the "hlo" programs below are already the TPU's own
if p.run_tpu and not use_tpu:
    print("this kernel runs on a TPU: the compile-only TPU sections are skipped (the hlo views are the TPU's)")

# %% [markdown]
# ## 1 · Combining collectives
# A data-parallel step with L weights reduces L gradients; FSDP gathers L weight shards and reduce-scatters L
# gradients. Issued one by one, each is a separate collective — each pays the start-up cost again. The TPU compiler
# has passes that merge them (`all-reduce-combiner`, `all-gather-combiner`, `reduce-scatter-combiner`); we compile
# the same step with them on and with them disabled (`xla_disable_hlo_passes`).
#
# ### 1.1 · Config → four views

# %%
steps = {mode: L.StepCase(p, mode) for mode in P.MODES}  # formula, XLA:CPU, XLA:TPU with combiners on + off
combine = {mode: L.combining(case, use_tpu, p.generation) for mode, case in steps.items()}
prefix = {"dp": "levers.combine", "fsdp": "levers.combine.fsdp"}
tables = {mode: harness.record(rec, prefix[mode], *views.values()) for mode, views in combine.items()}
display(tables["dp"])
VL.combining_summary(combine["dp"]).assign(step="data parallel")

# %%
display(tables["fsdp"])
VL.combining_summary(combine["fsdp"]).assign(step="FSDP")

# %% [markdown]
# Which of the three passes did it? XLA ignores a pass name it does not know — silently — so each name is verified
# only by its effect: the same programs with one pass disabled at a time (the combiners of the collectives each step
# issues), and a made-up name as the control.

# %%
effects = {}
if use_tpu:
    for mode, case in steps.items():
        frame, effects[mode] = L.pass_effects(case, p.generation)
        rec.check(f"{prefix[mode]}.tpu: an unknown pass name changes nothing",
                  not frame.loc["no-such-pass", "changes the program"], "the control")
        display(frame.assign(step=mode))

# %% [markdown]
# **Interpretation.** The formula and the CPU program agree: one collective per gradient (plus one scalar
# all-reduce for the mean loss) — XLA:CPU has no combiner. With its combiners on, the TPU compiler emits **one
# tuple all-reduce** that carries all L + 1 (data parallel) and, at the default sizes, one reduce-scatter carrying
# all L FSDP gradients; disabling the passes gives one instruction per operand again — and `all-reduce-combiner`
# alone does it for both steps: the TPU reduces FSDP gradients as all-reduces, combines those, and only then turns
# them into a reduce-scatter fusion (`reduce-scatter-combiner` and `all-gather-combiner` change nothing here). The
# operands and the bytes do not change (checked) — only the number of calls does. On a small slice with small gradients the TPU
# compiler may even reduce the FSDP gradients with one tuple all-reduce and keep each chip's shard: the table then
# marks the per-op values as differing, and the `reductions` row (every logical reduction, wherever it went) is
# what must agree. The FSDP all-gathers stay separate: each feeds a different layer's matmul, and the TPU runs them
# asynchronously instead (section 2).
#
# ### 1.2 · What a call costs: m all-reduces of n/m elements on gloo
# Measured for real, on `gloo_world` processes of this machine (CPU, gloo over shared memory/TCP): for each total
# size n (elements) and each m, m all-reduces of n/m float32 elements, median of `gloo_repeats` samples (each the
# slowest rank's time).

# %%
points, fit, spread = [], None, {}
if p.gloo_world:
    points = C.time_all_reduces(p.gloo_world, p.gloo_numels, p.gloo_calls, p.gloo_repeats)
    for pt in points:
        rec.timing(f"levers.combine.gloo.n{pt.numel}.k{pt.calls}", pt.timing)
    try:
        fit, spread = C.fit_points(points), C.fit_spread(points)
    except ValueError as exc:  # timings are noisy on a shared machine: an unresolved fit is reported, not a failure
        rec.note("levers.combine.fit", str(exc))
        print(f"α–β not resolved from these timings: {exc}")
if fit is not None:
    rec.measure("levers.combine.alpha_s", fit.alpha_s, "s", "timer", kind="timing", spread=spread.get("alpha_s"))
    rec.measure("levers.combine.beta_Bps", fit.beta_Bps, "B/s", "timer", kind="timing", spread=spread.get("beta_Bps"))
    rec.measure("levers.combine.fit_r2", fit.r2, "1", "timer", kind="timing")
    print(VL.fit_text(fit, spread))
    VL.timing_figure(points, fit).show()
    display(VL.timing_table(points, fit))
elif not p.gloo_world:
    print("gloo timings skipped (gloo_world=0)")

# %% [markdown]
# **Interpretation.** At a fixed total size the time grows with m: every call pays α again. The α–β model
# $T = m\,\alpha + n\,e/\beta$ (e bytes per element; least squares over all points, relative residuals) separates
# the per-call cost from the per-byte cost; R² and the residual say how well two numbers describe this noisy,
# shared machine. On a TPU the per-call cost is smaller (ICI, no kernel launches through a host), but it is never
# zero — which is why the compiler bothers to combine.
#
# ### 1.3 · Hand-made buckets in the ledger
# DDP's rule (torch 2.9, `Reducer::rebuild_buckets` after the first iteration): take the gradients in the order they
# become ready (about reverse parameter order); close the open bucket once it holds at least its limit — and
# all-reduce each bucket as one flat tensor. The first bucket has its own, small limit, `bucket_first_bytes` (1 MiB,
# `dist._DEFAULT_FIRST_BUCKET_BYTES`: the first gradients to become ready leave in a small bucket, so the first
# all-reduce starts early); every later bucket closes at `bucket_bytes` (`bucket_cap_mb`, 25 MiB by default). DDP uses the small first limit only
# when `bucket_cap_mb` is left at its default; passed explicitly, it is every bucket's limit — as in the curve below,
# which varies it. The formula predicts the number of buckets; PyTorch's own assignment function
# (`dist._compute_bucket_assignment_by_size`) checks the rule; the ledger — every rank's `bucketed_all_reduce` in a
# `SimulatedWorld` — shows the all-reduces actually issued and must agree, move the same bytes at every bucket size,
# and give every rank the exact sums (gradient i on rank r is `(i+1)(r+1)`).

# %%
grad_numel = p.hidden * p.hidden
curve = C.bucket_curve(p.layers, grad_numel, max(chips, 2), fit)  # bucket_cap_mb passed: one limit for every bucket
for row in curve:
    rec.check(f"levers.combine.bucket.{row['bucket_bytes']}: formula = ledger", row["formula"] == row["ledger"],
              f"formula {row['formula']} = ledger {row['ledger']}")
    rec.check(f"levers.combine.bucket.{row['bucket_bytes']}: bytes and sums", row["sums_exact"]
              and row["payload_bytes"] == p.layers * grad_numel * C.ELEMENT_BYTES, "bucketing never changes bytes")
mine = C.bucket_curve(p.layers, grad_numel, max(chips, 2), fit, sizes=[p.bucket_bytes],
                      first_bucket_bytes=p.bucket_first_bytes)[0]
harness.agree(rec, "levers.combine.bucket.count", "count", formula=mine["formula"], ledger=mine["ledger"])
ours = C.buckets([grad_numel * C.ELEMENT_BYTES] * p.layers, p.bucket_bytes, p.bucket_first_bytes)
torchs = dist._compute_bucket_assignment_by_size([torch.empty(grad_numel) for _ in range(p.layers)],
                                                 [p.bucket_first_bytes, p.bucket_bytes])[0]
rec.check("levers.combine.bucket: the rule = PyTorch's DDP", ours == torchs, f"gradients per bucket {[len(b) for b in ours]}")
VL.bucket_figure(curve).show()
pd.DataFrame(curve)

# %% [markdown]
# ### 1.4 · What the TPU's combining saves, by the model
# The TPU program carries the same bytes in fewer calls. With the α measured above, combining m calls into m′ saves
# $(m - m')\,\alpha$ — a model applied to this machine's gloo, not a TPU measurement (the hardware profiles publish
# ICI bandwidth, not a per-call latency, so we do not invent a TPU α).

# %%
saving = VL.saving_table(combine, fit) if use_tpu and fit is not None else pd.DataFrame()
saving

# %% [markdown]
# ## 2 · Overlap: asynchronous collectives and the latency-hiding scheduler
# XLA:TPU can issue a collective asynchronously — a start, later a done — and its **latency-hiding scheduler** moves
# independent work in between. We compile programs with the scheduler on (default) and off
# (`xla_tpu_enable_latency_hiding_scheduler=false`, an XLA:TPU flag passed in the compile options: verified to
# work compile-only) and list, for each collective, its form and the compute placed between its start and done.
#
# ### 2.1 · The Megatron MLP (notebook 02's graph, bf16, tp = num_devices)

# %%
v5 = chip(p.generation)
slice_name = f"{p.generation}-{chips}"  # the slice compiled for (its torus: section 2.3)
mlp = L.mlp_case(p)  # notebook 02's MlpCase: bf16, batch 2, tp = every device
overlap = {}
if use_tpu:
    overlap["mlp"] = {"on": harness.tpu(mlp, p.generation)}  # the scheduler on (XLA:TPU's default)
    mlp_rows, mlp_total = OV.exposed(overlap["mlp"]["on"].detail.module, v5, slice_name)
    display(pd.DataFrame(mlp_rows))
else:
    print("TPU compiles skipped (run_tpu=False)")

# %% [markdown]
# **Interpretation** (measured at the default sizes). The MLP's forward all-reduce (g) and backward all-reduce (f)
# stay two separate all-reduces, and both run **synchronously**: the loss ½‖out − target‖² (notebook 02's step)
# makes the output gradient depend on g's result, f then needs the whole backward before it, and no work independent
# of either is left to do — there is nothing to hide them behind. Overlap needs independent work; the next program
# has plenty.
#
# ### 2.2 · An FSDP step, large enough to matter (compile-only: the inputs are placeholders)

# %%
big = L.StepCase(p, "fsdp", big=True)  # big_layers x [overlap_hidden]², batch overlap_batch, bf16, placeholders
if use_tpu:
    overlap["fsdp"] = L.scheduler_on_off(big, p.generation)
    big_modules = {lhs: v.detail.module for lhs, v in overlap["fsdp"].items()}
    exposure = {lhs: OV.exposed(m, v5, slice_name) for lhs, m in big_modules.items()}
    VL.schedule_figure({f"scheduler {lhs}": OV.schedule(m) for lhs, m in big_modules.items()},
                       "FSDP step on the TPU: matmuls and collectives in schedule order").show()
    display(VL.window_table(exposure["on"][0]))

# %% [markdown]
# ### 2.3 · Exposed communication, a model
# Per chip: a collective takes its ring wire bytes over the ICI links its ring uses — the JAX scaling book's
# per-axis model. A v5e / v6e chip sits in a 2-D torus with 4 links, one to each neighbour; the published
# bidirectional figure (v5e: 400 GB/s) is their sum. A bidirectional ring along one torus axis sends over 2 of the
# links, one way each (v5e: 100 GB/s out of the chip); a group whose chips span both axes uses all 4 (200 GB/s).
# Which axes a group spans follows from where the slice puts its devices (hosts of 2 × 2 chips: the 8-chip groups
# here span both axes of the 2 × 4 slice — the `axes` column; on one axis every transfer would take twice as long).
# The matmuls of a collective's window take their FLOPs at peak; an async collective exposes only what its window
# does not cover, a synchronous one all of it. This is a model — no TPU ran — and it ignores per-call latency,
# HBM-bound work, and that an axis of a slice smaller than the pod is a line, not a ring.
#
# Checked by hand: with the scheduler off, the L weight all-gathers are synchronous, so each exposes the ring time
# of one [h/p, h] shard — (p − 1)·h²e/p bytes over the egress of the axes the p chips span.

# %%
if use_tpu:
    for lhs, (_rows, tot) in exposure.items():
        rec.measure(f"levers.overlap.fsdp.exposed_s.lhs_{lhs}", tot["exposed_s"], "s (model)", "tpu")
        rec.measure(f"levers.overlap.fsdp.async.lhs_{lhs}", sum(c.async_ for c in big_modules[lhs].collectives),
                    "count", "tpu")
    gathers = [r for r in exposure["off"][0] if r["op"] == "all-gather"]
    if chips > 1:
        ring_s = wire_bytes("all_gather", big.grad_bytes // chips, chips) \
            / v5.ici_egress_for(group_axes(slice_name, list(range(chips))))  # one shard's ring, by hand
        rec.check("levers.overlap.fsdp.off: L synchronous all-gathers, each one shard's ring time (by hand)",
                  len(gathers) == big.layers and all(r["form"] == "sync" and math.isclose(r["exposed_s"], ring_s)
                                                     for r in gathers),
                  f"{len(gathers)} all-gathers ({sorted({r['form'] for r in gathers})}), {ring_s * 1e6:.1f} µs each")
    else:
        rec.check("levers.overlap.fsdp.off: one chip gathers nothing", not gathers, f"{len(gathers)} all-gathers")
    on_s, off_s = (exposure[lhs][1]["exposed_s"] for lhs in ("on", "off"))
    rec.check("levers.overlap.fsdp: the scheduler never exposes more", on_s <= off_s,
              f"on {on_s * 1e6:.1f} µs, off {off_s * 1e6:.1f} µs")
    hand = linear_stack_step_flops(big.batch, big.hidden, big.layers, chips)  # 2·(B/p)·h²·(3L − 1)
    for lhs, v in overlap["fsdp"].items():
        priced, unknown = OV.schedule_flops(v.detail.module), exposure[lhs][1]["loops_unknown_trips"]
        loops = len(v.detail.module.while_loops)
        if unknown:  # a loop whose trip count the parser cannot read: its body is priced once, and we say so
            rec.note(f"levers.overlap.fsdp.{lhs}.trips", f"{unknown} of {loops} loops with an unread trip count")
        else:
            rec.check(f"levers.overlap.fsdp.{lhs}: priced matmul FLOPs = 2·(B/p)·h²·(3L−1)", priced == hand,
                      f"{priced} vs {hand} by hand ({loops} windowed-einsum loops, trip counts read from the HLO)")
        print(f"scheduler {lhs}: {loops} loops; matmul FLOPs per chip priced {priced / 1e9:.2f} G, by hand "
              f"{hand / 1e9:.2f} G, the compiler's cost analysis {v.detail.cost.get('flops', 0) / 1e9:.2f} G (all ops)")
    peak = {lhs: rec.measure(f"levers.overlap.fsdp.peak_bytes.lhs_{lhs}", overlap["fsdp"][lhs].detail.memory.peak,
                             "bytes", "tpu") for lhs in ("on", "off")}
    print(f"peak HBM per chip (arguments + outputs + temporaries live at once): scheduler on {VL.mib(peak['on'])}"
          f" MiB, off {VL.mib(peak['off'])} MiB")
    display(VL.exposure_table(exposure))

# %% [markdown]
# **Interpretation** (measured at the default sizes). XLA gathers each weight once and keeps it for the backward
# (L all-gathers, no re-gather). With the scheduler on, the weight all-gathers are async collective fusions with a
# matmul in their window, and the gradient reduce-scatters are decomposed into rings of asynchronous
# collective-permutes interleaved with the gradient matmuls. The model then hides most of the communication; with
# the scheduler off the all-gathers are synchronous, half of the permute windows are empty, and most of it is
# exposed. The decomposition is XLA's *windowed einsum*: a `while` loop whose body multiplies one chunk while the
# previous chunk's partial sums travel to the neighbour (the loop names say `windowed_dot_general_body_rs`). Its
# body runs once per iteration, so the model prices it trip count × body — and the priced FLOPs then equal the
# step's 2·(B/p)·h²·(3L−1) worked out by hand (checked above). The compiler's own cost analysis counts a loop body
# once: it reports fewer FLOPs than the step performs. Overlap is not free: buffers in flight raise the peak
# (printed above: at the defaults 81 MiB with the scheduler on against 60 MiB off). With small sizes (try
# `overlap_hidden=512`) there is little compute to hide behind and the two schedules come out close.
#
# ## 3 · Memory order
# ### 3.1 · The toy: every order of four operators

# %%
toy = O.roam_toy()
orders = O.all_orders(toy)
ext = O.extremes(toy)
rec.check("levers.order.toy: brute force = dynamic programme", (orders[0].peak, orders[-1].peak)
          == (ext.best.peak, ext.worst.peak), f"best {ext.best.peak}, worst {ext.worst.peak}")
ratio = O.peak(toy, ("V0", "V2", "V1", "V3")).peak / O.peak(toy, ("V0", "V1", "V2", "V3")).peak
rec.measure("levers.order.toy.peak_ratio", ratio, "ratio", "formula")
VL.profile_figure({"V0-V1-V2-V3": O.peak(toy, ("V0", "V1", "V2", "V3")),
                   "V0-V2-V1-V3": O.peak(toy, ("V0", "V2", "V1", "V3"))}).show()
pd.DataFrame([{"order": "-".join(pr.order), "peak (MB)": pr.peak, "peak while": pr.peak_op} for pr in orders])

# %% [markdown]
# V0 writes a `small` tensor and a `large` one; V1 expands `small`, V2 shrinks `large`. Running the shrinking branch
# first frees `large` before the expansion allocates: **12 instead of 17 (71 %)** — the effect of the ROAM paper's motivating
# example (Shu et al. 2023, TorchAcc), whose exact sizes we could not obtain: these sizes are ours.
#
# ### 3.2 · Which order does XLA choose?
# The same four operators as tensors (each V a matmul; optimisation barriers keep V0's two outputs and every
# intermediate materialised on the TPU). **XLA:CPU**: we turn its scheduled entry computation into a graph, price
# XLA's order and every other order with the same model, and check the model's price of XLA's order against XLA's
# own number, its buffer assignment's heap simulation. **XLA:TPU**: the compiled temporaries, in units of one
# [rows, 256] tensor.

# %%
toy_cpu = L.OrderToyCase(p, compile_only=False)  # [64, 64] f32 units: XLA:CPU runs it
cap = harness.hlo(toy_cpu).detail
g_cpu = O.graph_from_hlo(cap.module)
ext_cpu, xla_cpu = O.extremes(g_cpu), O.peak(g_cpu)
unit = toy_cpu.unit_bytes
rec.check("levers.order.cpu: the model's price of XLA's order = XLA's heap simulation",
          xla_cpu.peak == cap.module.buffers.temp, f"{xla_cpu.peak / unit:g} = {cap.module.buffers.temp / unit:g} units")
rec.measure("levers.order.toy.cpu.xla_order_units", xla_cpu.peak / unit, "units", "hlo")
rec.measure("levers.order.toy.cpu.heap_temp_units", cap.module.buffers.temp / unit, "units", "hlo")
toy_tpu = toy_units = None
if use_tpu:
    toy_case = L.OrderToyCase(p)  # [toy_rows, 256] bf16 units, placeholders: compile-only
    toy_tpu = harness.tpu(toy_case, p.generation)
    toy_units = rec.measure("levers.order.toy.tpu.temp_units", toy_tpu.detail.memory.temp / toy_case.unit_bytes,
                            "units", "tpu")
print("XLA:CPU's schedule:", " ".join(xla_cpu.order), "| best:", " ".join(ext_cpu.best.order))
VL.order_table(ext_cpu, xla_cpu, cap.module.buffers.temp, unit, toy_units)

# %% [markdown]
# **Interpretation.** XLA:CPU computes both of V0's products first and then both branches: the order our model
# prices at 17 units, and its heap simulation agrees (checked). (In its graph V0 is two separate matmuls, so the
# best order there — `large`, `shrunk`, then `small`, `expanded` — reaches 11.) With the default 128 MiB unit, XLA:TPU's temporaries are 12 units: it ran
# the shrinking branch first, the toy's best order. With smaller units (`toy_rows`) part of the toy fits in the
# TPU's on-chip memory, which HBM temporaries do not count, and the number drops below 12.
#
# ### 3.3 · A real training step
# The data-parallel step of section 1 on XLA:CPU, priced the same way (when the graph is narrow enough for the exact
# search). Here XLA's heap simulation lets an elementwise result reuse its input's buffer, which the model never
# does: the model's price of XLA's order is an upper bound of XLA's number (checked, up to 64 bytes of alignment per
# operator).

# %%
step_cap = combine["dp"]["hlo"].detail
g_step = O.graph_from_hlo(step_cap.module)
ext_step = xla_step = None
try:
    ext_step, xla_step = O.extremes(g_step), O.peak(g_step)
    rec.check("levers.order.step.cpu: XLA's heap simulation <= the model's price of XLA's order",
              step_cap.module.buffers.temp <= xla_step.peak + 64 * len(g_step.ops),
              f"{step_cap.module.buffers.temp} <= {xla_step.peak} bytes")
    display(pd.DataFrame([{"operators": len(g_step.ops), "orders": ext_step.orders, "best KiB": ext_step.best.peak / 1024,
                           "XLA's order KiB": xla_step.peak / 1024, "worst KiB": ext_step.worst.peak / 1024,
                           "heap-simulated temp KiB": step_cap.module.buffers.temp / 1024}]))
except ValueError as exc:
    print(f"exact search skipped: {exc}")

# %% [markdown]
# ### 3.4 · Memory-aware weight update
# The optimizer step compiled **in the same graph as the backward** (each gradient can be consumed by its update as
# soon as it exists) vs **after a separate sync** (the backward's graph returns every gradient; a second graph
# applies the update). Per chip, from the TPU compiler; inputs are placeholders.

# %%
wu = {}
if use_tpu:
    wu = {stage: harness.tpu(L.UpdateCase(p, stage), p.generation) for stage in P.STAGES}
    mem = L.update_memory(wu)  # {"temp" | "peak": {"fused", "separate"}}
    for k in ("fused", "separate"):
        rec.measure(f"levers.order.weight_update.temp_bytes.{k}", mem["temp"][k], "bytes", "tpu")
        rec.measure(f"levers.order.weight_update.peak_bytes.{k}", mem["peak"][k], "bytes", "tpu")
    grads, out = L.UpdateCase(p).weight_bytes, wu["backward"].detail.memory.output
    rec.check("levers.order.weight_update.separate: gradients leave the backward graph", out >= grads,
              f"backward outputs {out} >= gradients {grads}")
    display(VL.memory_table({k: v.detail.memory for k, v in wu.items()}))
    print(f"peak per chip: fused {VL.mib(mem['peak']['fused'])} MiB, separate {VL.mib(mem['peak']['separate'])} MiB "
          f"(the gradients: {VL.mib(grads)} MiB)")

# %% [markdown]
# **Interpretation.** The temporaries hardly move; what moves is *where the gradients live*. Fused, they are
# temporaries that die as soon as their update has read them. Separated, the backward must hand all of them out as
# outputs, and the update graph takes them — plus the weights and the optimizer state — as arguments: its peak holds
# every gradient at once. (These compile-only programs carry no input/output aliasing — a TPU run of torch_xla
# donates the updated weights, which lowers both columns by the weights it updates in place.)
#
# ## 4 · Automatic strategy
# ### 4.1 · XLA's auto-sharding, compile-only
# The MLP graph of section 2.1 with its annotations removed (`xla_tpu_auto_spmd_remove_all_user_shardings`) and
# XLA's auto-sharding pass (`use_auto_spmd_partitioning`, an ILP over every array's sharding on a 1-D mesh of the
# p chips) in place of sharding propagation: what does the solver choose, against Megatron's plan?

# %%
auto = None
if use_tpu and p.auto_sharding:
    auto = S.auto_sharding(mlp, p.generation)
    if not auto.ran:
        print("auto-sharding:", auto.skipped)
    else:
        auto_metrics = {"what": "auto-sharding", **S.metrics(auto.detail)}
        rec.measure("levers.auto.wire_bytes", auto_metrics["wire_bytes"], "bytes", "tpu")
        rec.measure("levers.auto.memory_bytes", auto_metrics["memory_bytes"], "bytes", "tpu")
        print("auto-sharding's parameter shardings:", ", ".join(S.parameter_shardings(auto.detail)))
        display(pd.DataFrame([{"what": "Megatron (annotated)", **S.metrics(overlap["mlp"]["on"].detail)},
                              auto_metrics]).set_index("what"))

# %% [markdown]
# **Interpretation** (measured at the default sizes). The solver does not pick Megatron's two all-reduces: it moves
# weight shards (all-gathers in, reduce-scatters of the weight gradients out) for about the same bytes on the wire
# and much less memory per chip. It prices the whole graph, loss included: with the earlier harness loss
# `(out * grad_out).sum()` — whose backward never waits for the output — it chose another plan (2 all-gathers,
# 1 all-reduce, 1 reduce-scatter, 4.59 MB on the wire). A training step's real loss, computed from the output, is
# the one to hand it.
#
# ### 4.2 · Exhaustive search: every (data, fsdp, tensor) mesh and weight layout
# The Megatron MLP on a p-chip slice, each candidate compiled for the TPU; ranked by the bytes each chip puts on the
# interconnect, then by memory per chip (`mesh` = the degrees data·fsdp·tensor). `search="small"` compiles up to four
# candidates (pure data parallel, pure FSDP, Megatron, and the planner's mesh), `"full"` every mesh and both layouts.
# Two plans have a formula, checked against their compiled programs: Megatron all-reduces the [b, s, h] activation
# twice (g on the output, f on the input gradient), pure data parallelism the two [h, F] weight gradients.

# %%
found = None
if use_tpu and p.search != "off":
    found = S.search(p, p.generation)  # every candidate compiled for the TPU, ranked
    for name, why in found.skipped.items():
        print(f"{name}: skipped ({why})")
    rec.measure("levers.search.best.bytes", int(found.frame.iloc[0]["wire_bytes"]), "bytes", "tpu")
    for _, row in found.frame[found.frame["fits"]].iterrows():
        hand = S.formula_wire_bytes(L.LayoutCase(p, int(row["data"]), int(row["fsdp"]), int(row["tensor"]),
                                                 row["layout"]))
        if hand is not None:
            rec.check(f"levers.search.{row['mesh']} {row['layout']}: wire bytes = formula", row["wire_bytes"] == hand,
                      f"{row['wire_bytes']} = {hand} ({row['ops']})")
    VL.search_figure(found.frame).show()
    display(found.frame[["mesh", "layout", "ops", "payload_bytes", "wire_bytes", "memory_bytes", "compile_s",
                         "megatron", "planner"]])
    print(f"planner's mesh (data, fsdp, tensor): {found.planner}")

# %% [markdown]
# **Interpretation.** The ranking is by communication first: for this block and batch, which axis pays depends on
# whether activations (tensor parallelism moves [b, s, h]) or weights (FSDP and data parallelism move [h, ffn]) are
# larger per chip. Memory per chip falls as weights are sharded. The planner judges a whole layer with its
# attention and a roofline time, so it need not pick the block's cheapest-to-communicate layout.
#
# ## 5 · Fusion
# The kernels each compiler launches for the same block: matmuls, memory-bound kernels (elementwise, reductions,
# copies — each reads and writes memory), collectives, and how many HLO ops disappeared into fusions.

# %%
fus = {}
if chips > 1:  # a smaller MLP of the same shape ratios, f32: XLA:CPU runs it
    fus["XLA:CPU"] = FU.fusion_counts(harness.hlo(L.mlp_case(p, runnable=True)).detail.module)
if use_tpu:
    fus["XLA:TPU"] = FU.fusion_counts(overlap["mlp"]["on"].detail.module)
for k, v in fus.items():  # x·A and ·B forward; dH = dY·Bᵀ, dB = Hᵀ·dY, dX = dH·Aᵀ, dA = xᵀ·dH backward
    rec.check(f"levers.fusion.{k}: 6 matmul kernels (forward 2 + backward 4, by hand)", v["matmul"] == 6, str(v))
    rec.measure(f"levers.fusion.kernels.{'cpu' if k == 'XLA:CPU' else 'tpu'}", v["kernels"], "count",
                "hlo" if k == "XLA:CPU" else "tpu")
pd.DataFrame(fus).fillna(0).astype(int)

# %% [markdown]
# (The CPU column is a smaller MLP of the same shape ratios: it runs, while the TPU program is compile-only.)
#
# ## Summary: the levers, off vs on

# %%
tpu_s, compiles = harness.compile_seconds(combine, effects, overlap, toy_tpu, wu, auto,
                                          found.views if found else None)
rec.measure("levers.tpu.compile_s", tpu_s, "s", "timer", kind="timing", spread={"n": compiles})
print(f"XLA:TPU compile time behind these views: {tpu_s:.1f} s over {compiles} compiles (a compile served from the "
      "committed store counts the seconds it took when stored; a repeat of one in this kernel counts 0)")
VL.summary_table(rec.values, saving, ext_cpu.worst.peak / unit, None if ext_step is None else (ext_step, xla_step),
                 None if found is None else found.frame, chips)

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. With α = 50 µs and β = 10 GB/s, how many **milliseconds** does combining 32 all-reduces of 1 MiB each into one
#    save?
# 2. The toy with other sizes: V0 writes `small` = 2 and `large` = 8, V1 expands `small` into `expanded` = 5, V2
#    shrinks `large` into `shrunk` = 1, V3 writes `out` = 1. What are the peaks of V0-V1-V2-V3 and of V0-V2-V1-V3?
#    (a tuple)
# 3. 24 gradients of 4 MiB each, DDP with its default buckets (`bucket_cap_mb` left at 25 MiB, so the first bucket
#    closes at 1 MiB): how many all-reduces?
# 4. An async all-gather needs 30 µs on the wire; the scheduler put 20 µs of matmuls in its window. How many µs are
#    exposed, by section 2.3's model?
# 5. Code: write DDP's bucket rule — `answer_5(sizes, cap, first)` takes the gradients' sizes in bytes (in the order
#    they become ready) and returns the buckets as lists of gradient indices: close the open bucket once it holds at
#    least its limit, `first` for the first bucket and `cap` for every later one. The grader runs it on a grid of
#    sizes and limits and compares with PyTorch's own `dist._compute_bucket_assignment_by_size`.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # milliseconds (a float)
answer_2 = None  # (peak of V0-V1-V2-V3, peak of V0-V2-V1-V3)
answer_3 = None  # a count
answer_4 = None  # microseconds
answer_5 = None  # a function (sizes, cap, first) -> list of lists of indices, e.g. def answer_5(sizes, cap, first): ...
for k, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5), start=1):
    ex.show(k, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. Combining changes the number of calls, not the bytes: the saving is the start-ups that disappear, $(m-m')\alpha$.
# 2. Walk the orders: an operator's outputs are allocated while its inputs are still live; a tensor dies after its
#    last reader. The expanding branch first keeps `large` alive next to `expanded`; the shrinking branch first frees
#    `large`.
# 3. The first bucket closes at ≥ 1 MiB — after one 4 MiB gradient; each later one at ≥ 25 MiB — after ⌈25/4⌉ = 7:
#    1 + ⌈23/7⌉ = 5 buckets, [1, 7, 7, 7, 2]. Passing `bucket_cap_mb=25` explicitly removes the small first bucket:
#    ⌈24/7⌉ = 4.
# 4. Only what the window does not cover is exposed: $\max(0, 30 - 20)$.
# 5. Keep a running total; after adding a gradient compare it with the open bucket's limit (`first` while no bucket
#    is closed yet, then `cap`); close at ≥; a last, partly filled bucket is a bucket too:
#    `out, cur, held = [], [], 0` / `for i, b in enumerate(sizes): cur.append(i); held += b` / `if held >= (cap if out
#    else first): out.append(cur); cur, held = [], 0` / `return out + [cur] if cur else out`.
# </details>

# %%
rec.close()["status"]
