# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
cp = 8  # context-parallel degree: ranks of the ring, size of the `context` mesh axis
batch = 1  # b
seq = 128  # s: the whole sequence, split into cp chunks (contiguous) or 2·cp chunks (zig-zag)
heads = 8  # hq: query heads
kv_heads = 2  # hkv: key/value heads (grouped-query attention when fewer than heads)
head_dim = 16  # d
causal = True  # causal mask (a decoder); False: every query sees every key
layout = "zigzag"  # how the ring ranks hold the sequence: "contiguous" or "zigzag" (2·cp chunks)
ulysses = False  # also DeepSpeed-Ulysses (all-to-alls; with kv_heads = heads when kv_heads < cp)
run_gloo = False  # also run the per-rank ring in cp real processes (torch.distributed, gloo)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.context.params import ContextParams
from shardlab.profile import Recorder

p = ContextParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 10 · Context parallelism: all-gather, the ring, and the causal balance
#
# Long sequences do not fit one device: the attention scores alone are s × s per head. **Context parallelism** splits
# the *sequence* over cp devices — every layer's activations, q, k and v included, hold s/cp positions per device.
# Everything outside attention is position-wise and needs nothing from other devices; attention contracts every query
# with every key, so the keys and values must travel. Two ways are taught here, and a third for contrast:
#
# - **all-gather CP** (Llama 3, Dubey et al. 2024 §3.3.2): all-gather K and V, attend with the local queries;
# - **ring attention** (Liu, Zaharia & Abbeel 2023): K/V blocks travel around a ring of cp devices in cp − 1 steps,
#   and an online softmax (Milakov & Gimelshein 2018; FlashAttention) folds each visiting block into the local result;
# - **DeepSpeed-Ulysses** (Jacobs et al. 2023): all-to-alls trade sequence shards for head shards.
#
# Notation: batch b, sequence s, query heads hq, key/value heads hkv (grouped-query attention when hkv < hq), head
# dim d, e bytes per element; **one block** is one device's K (or V) shard, b·(s/cp)·hkv·d elements. The sequence
# layout is *contiguous* (device r holds chunk r of cp) or *zig-zag* (2·cp chunks; device r holds chunks r and
# 2cp − 1 − r). Four views, one number, as in every notebook: the **formula** (`shardlab.formulas.context`), the
# **ledger** (per-rank code in a `SimulatedWorld`), **XLA:CPU**'s partitioned program and **XLA:TPU**'s (compile-only).

# %%
from dataclasses import replace

import pandas as pd

from shardlab.context import figures as vcp
from shardlab.context.case import AllGatherCase, RingCase, UlyssesCase, ulysses_params
from shardlab.core import harness
from shardlab.formulas import context as fcp

kv = (p.batch, p.seq, p.kv_heads, p.head_dim, p.cp)  # what the K/V traffic depends on (float32)
print(f"one K (or V) block: b·(s/cp)·hkv·d·e = {fcp.kv_block_bytes(*kv)} bytes")

# %% [markdown]
# ## 1 · The formulas
# **Ring, forward:** cp − 1 steps, each sending the K block and the V block this device holds to the next device:
# $2(\mathrm{cp}-1)$ sends, $(\mathrm{cp}-1)\cdot 2\cdot b\cdot\frac{s}{\mathrm{cp}}\cdot h_{kv}\cdot d\cdot e$ bytes
# per device per layer. **Backward**, two ways: the per-rank ring keeps only its own K/V and rings them again, while
# the gradient accumulators dK, dV travel cp steps to come home — $2(\mathrm{cp}-1) + 2\,\mathrm{cp}$ blocks; autograd
# through an SPMD ring keeps every visiting block (cp times the K/V memory) and sends only dK, dV back —
# $2(\mathrm{cp}-1)$ blocks. **All-gather CP** moves the same forward wire bytes (each device receives the cp − 1
# blocks it lacks, of K and of V), as two all-gathers whose payload is one block each; its backward is two
# reduce-scatters of the full dK, dV. What differs is **memory**, and the scores are not it: with a flash kernel
# (online softmax over key tiles — which the planner requires for cp > 1) neither variant materialises scores, each
# holds one tile at a time; only a dense kernel would hold s/cp × s/cp scores per visiting block (ring) or s/cp × s
# (all-gather) — the `scores` column below, per head, without flash. The difference is the **K/V held at once**.
# Forward, the ring holds its own K and V block and the one in flight (4 blocks); all-gather CP the whole K and V
# (2cp blocks). Backward, the hand-written ring (section 3) holds its saved K and V, the visiting K and V with their
# dK, dV accumulators, and the next of each in flight (10 blocks); all-gather CP the gathered K, V and the full
# dK, dV partial sums before the reduce-scatter (4cp blocks); autograd through an SPMD ring (section 4) saves every
# visiting block — cp blocks of K and of V, as much as all-gather CP. The `kv_backward` column counts those.

# %%
fwd_ring = fcp.ring_p2p(*kv)
formulas = pd.DataFrame({
    "ring forward": fwd_ring,
    "ring backward (ring)": fcp.ring_p2p(*kv, phase="backward", backward="ring"),
    "ring backward (saved)": fcp.ring_p2p(*kv, phase="backward", backward="saved"),
    "all-gather forward": fcp.allgather_kv(*kv)["all_gather"],
    "all-gather backward": fcp.allgather_kv(*kv, backward=True)["reduce_scatter"],
}).T
memory = pd.DataFrame({m: fcp.memory(p.batch, p.seq, p.heads, p.kv_heads, p.head_dim, p.cp, method=m)
                       for m in ("ring", "allgather")}).T.rename(columns={
    "kv": "K/V held, forward (B)", "kv_backward": "K/V and dK/dV held, backward (B)",
    "scores": "scores of one block without flash (B)"})
display(formulas)
memory

# %% [markdown]
# ## 2 · All-gather CP as GSPMD annotations
# q, k, v [b, s, h, d] annotated `(None, "context", None, None)` on a mesh (data, context) = (n/cp, cp); attention
# written densely (`shardlab.context.gspmd.allgather_attention`). The partitioner cannot compute a device's scores
# [b, hq, s/cp, **s**] from its own key shard — the contraction runs over every key — so it must bring K and V
# whole. `GatherKV` says how: a replicated copy of k and v (forward: **all-gather**), and in its backward the K/V
# gradient pinned replicated, then sequence-sharded again (a **reduce-scatter**; without that pin the partitioner
# moved the O(s²) score gradient instead — measured in `shardlab.context.gspmd`'s note). The per-rank program
# (`shardlab.context.allgather`) does the same with `comm.all_gather` and its reduce-scatter backward. Every
# forward + backward step of this notebook differentiates the loss ½‖out − target‖² (a fixed random target): its
# output gradient out − target depends on the output, as in training, so no backward collective can run before the
# forward's have delivered.

# %%
ag_views = harness.views(AllGatherCase(p, backward=True))  # forward + backward of ½‖out − target‖²
harness.record(rec, "cp", *ag_views)

# %% [markdown]
# The all-gathers are the forward's (`cp.allgather.*`), the reduce-scatters the backward's.
#
# **What each compiler emitted, and why.** XLA:CPU: two all-gathers of one block (the payload the formula names),
# and one all-reduce of each full gradient cut to this device's share by a dynamic-slice, counted as the
# reduce-scatter it implements: XLA:CPU's runtime has a reduce-scatter, but its pass pipeline never forms one from
# all-reduce + dynamic-slice. XLA:TPU (lines above): the all-gathers move **bf16** (the default matmul precision
# reads f32 operands as bf16, so the compiler converts before sending: half the bytes, the same elements), and the
# two K/V gradient reductions are **combined** into one instruction carrying both — a combining of collectives that
# are truly independent: dK and dV each wait for the output's gradient, neither for the other (measured the same
# with a loss whose output gradient is a constant). At these sizes it is an all-reduce + dynamic-slice; at
# s = 1024 it was one reduce-scatter (`shardlab.context.gspmd`).

# %% [markdown]
# ## 3 · Ring attention per rank
# `shardlab.context.ring.ring_attention_step` runs on each of cp ranks: rank r keeps its query chunks and at step t
# holds the K/V block that started on rank (r − t) mod cp; it sends that block on (buffered) before folding it into
# its online softmax, and receives the next one. Under a causal mask a block whose keys all lie in the future is
# skipped. The backward (`RingAttention.backward`) is written by hand and rings again.

# %%
vcp.ring_figure(p.cp, p.layout).show()

# %%
ring_fwd, ring_step = RingCase(p), RingCase(p, backward=True, scan=True)
step_ledger = harness.ledger(ring_step)  # forward + the ring backward, every rank vs dense attention
other = harness.ledger(replace(ring_step, p=replace(p, causal=not p.causal)))  # parity with the other mask too
for name, (ok, detail) in other.checks.items():
    rec.check(f"cp.{'causal' if not p.causal else 'no_mask'}.{name}", ok, detail)
led = step_ledger.detail["ledger"]
display(pd.DataFrame([(mask, n, ok, d) for mask, v in ((p.causal, step_ledger), (not p.causal, other))
                      for n, (ok, d) in v.checks.items()], columns=["causal", "check", "ok", "detail"]))
led.summary()

# %% [markdown]
# Every rank's output and its q, k, v gradients equal PyTorch's `scaled_dot_product_attention` on the whole sequence
# (float32; the ring adds the same terms in another order), with the notebook's mask and with the other one. The
# ledger holds only sends and receives, each one block.
#
# ### The same per-rank code in real processes
# `DistributedWorld(cp)` runs the very same function in cp processes joined by a gloo group (`run_gloo=True`).
# Point-to-point transfers add nothing up, so the results must be bit-identical, and the ledgers identical.

# %%
if p.run_gloo:
    gloo = harness.gloo(ring_step)
    rec.check("cp.ring.gloo.same_ledger", gloo["ledger"] == led, f"{len(led)} sends and receives, identical rows")
    rec.check("cp.ring.gloo.same_results", all(
        all(a[n] is None and b[n] is None or bool((a[n] == b[n]).all()) for n in ("out", "grad_q", "grad_k", "grad_v"))
        for a, b in zip(gloo["ranks"], step_ledger.detail["ranks"], strict=True)), "bit-identical outputs and gradients")
else:
    print("gloo run skipped (run_gloo=False)")

# %% [markdown]
# ## 4 · The ring as one SPMD program, through both compilers
# Manual-sharding regions would give each device its local block, but in torch_xla 2.9 their results carry no
# autograd history and a `collective_permute` inside one aborts the process (`shardlab.context.gspmd`). What works:
# stack q, k, v on a leading axis annotated `context` ([cp, b, s/cp, h, d], row r = rank r's chunks, K and V
# concatenated so one transfer moves both) and **shift** the K/V stack by one row between steps, written as
# slice + concatenate — one collective-permute of one shard (`torch.roll` would compile to two all-to-alls and an
# all-gather). The loop is either unrolled (cp steps in the graph) or inside torch_xla's `scan` (one `while` loop).
#
# **Counting, one unit for every view: block transfers.** The formula counts sends of one block; the ledger's send
# rows carry one block each; a compiler's collective-permutes are counted as they execute (× the loop's trip count)
# by the elements each device sends, divided by one block — a stacked K/V permute is two. Each compiler's own
# instruction count is recorded beside it (`collective_permute.count`, `.executed`).

# %%
ring_views = harness.views(ring_fwd)
harness.record(rec, "cp", *ring_views)

# %%
step_views = [harness.formula(ring_step), step_ledger, harness.hlo(ring_step), harness.tpu(ring_step)]
harness.record_compile_s(rec, "cp.ring.scan.fwd_bwd.compile_s", *step_views[2:])
harness.record(rec, "cp", *step_views)

# %% [markdown]
# **Interpretation.** Forward, every view sends 2(cp − 1) blocks per device — the paper's ring, the per-rank code
# and both compiled programs. Inside `scan` the program holds **one** collective-permute per loop body, executed
# cp − 1 times (the trip count read from the program), and autograd's backward is a second loop with the opposite
# shift: 2(cp − 1) blocks back, the `saved` formula — the per-rank ring's own backward sends 2cp more because it
# keeps only its own block and rings K and V again. Memory is the price: autograd saved every visiting block.
#
# **What XLA:TPU did with the permutes** (read from its program; the lines printed above each table): every permute
# is **asynchronous** (a start/done pair the scheduler can overlap with the block's attention math), **none is
# combined**, and the forward's K/V travel in **bf16** while the backward's dK/dV travel in f32. In the unrolled
# ring, the first shift is one cyclic permute; **each later one is split in two**: a shift over all pairs but the
# wrap-around (devices 0 → 1 … cp−2 → cp−1), and a single-pair permute that brings device 0 its next block straight
# from the device that *started* with it (at step t: device cp − t, which still holds it as an input) instead of
# from device cp − 1 — the same elements, with no device waiting for the previous step's transfer to reach the end
# of the ring. XLA:CPU emits one cyclic permute per shift, synchronous, f32. Inside `scan` XLA:TPU does not split:
# the loop body is one program for every step.

# %%
harness.memory_frame({"all-gather (cpu)": ag_views[2], "scan ring (cpu)": step_views[2],
                      "all-gather (tpu)": ag_views[3], "scan ring (tpu)": step_views[3]})

# %% [markdown]
# Per-device memory of the two forward + backward programs (XLA:CPU's buffer assignment, XLA:TPU's compiled memory
# statistics). The formula's lesson (section 1) is about what one step of attention holds; these programs also keep
# what autograd saved for the backward — and autograd through the scan ring saves every visiting K/V block and each
# step's intermediates, cp − 1 times over, which is exactly what the per-rank ring's hand-written backward avoids
# by ringing K and V again (`RingCase(p, backward=True, scan=True, remat=True)` lets scan recompute instead). At
# these sizes XLA:TPU's padding of 16-wide arrays to 128-lane tiles also weighs in: read the columns as what each
# compiler allocated, and raise `seq` to see the terms that grow with it.

# %% [markdown]
# ## 5 · Causal balance: contiguous vs zig-zag
# Under a causal mask query i sees keys 0 … i. With the contiguous split, device r computes r full blocks and its
# diagonal block; the last device does about 2cp − 1 times the first one's work, and every ring step waits for
# the busiest. The zig-zag split (2·cp chunks, device r holding chunks r and 2cp − 1 − r: ring-flash-attention's
# layout, Megatron-LM's context parallelism and Llama 3's) pairs an early chunk with a late one: every device
# computes the same number of unmasked scores. (Brandon et al. 2023's *striped* attention is the other remedy:
# round-robin tokens, device r holding positions r, r + cp, r + 2cp, …) Below: the formula
# (`formulas.context.causal_work`) and the blocks each rank of the per-rank ring actually computed (read from its
# trace) — both use the block rule (c² per full block, c(c + 1)/2 per diagonal one), so each is checked against a
# brute-force count instead: the (query, key) pairs the causal mask allows over the positions each rank holds,
# counted one by one.

# %%
from shardlab.context.balance import measure

balance = measure(p.seq, p.cp, batch=p.batch, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim, seed=p.seed)
for row in balance:
    rec.measure(f"cp.causal.work.{row['layout']}", row["formula_elements"], "elements", "formula")
    rec.measure(f"cp.causal.work.{row['layout']}", row["elements"], "elements", "ledger")
    rec.check(f"cp.causal.work.{row['layout']}.brute_force", row["formula_elements"] == row["brute_force"]
              and row["elements"] == row["brute_force"],
              f"formula {row['formula_elements']}, ring trace {row['elements']}, pairs counted {row['brute_force']}")
    harness.agree(rec, f"cp.causal.max_over_mean_work.{row['layout']}", "ratio",
                  formula=fcp.max_over_mean(row["formula_elements"]), ledger=row["max_over_mean"])
vcp.causal_figure(p.cp).show()
pd.DataFrame([{"layout": r["layout"], "work per rank (counted)": r["elements"], "blocks per rank": r["blocks"],
               "max / mean": round(r["max_over_mean"], 4)} for r in balance])

# %% [markdown]
# The counts equal the closed form rank by rank. Contiguous: max / mean tends to (2cp − 1)/cp for long chunks (the
# last rank's cp − 1 full blocks and its diagonal over the average: a step as slow as if almost twice the work were
# spread evenly); zig-zag: exactly 1. The SPMD program of section 4 has no such
# imbalance — and no such saving: every device runs the same program, computes every block and masks it, so the
# zig-zag layout there only changes which positions a device holds. The same holds for all-gather CP with a
# **dense masked** kernel (this notebook's `shardlab.context.allgather`: the whole [s/cp, s] block, masked), and
# only for it: a causal flash kernel skips the key tiles above the diagonal, so a device holding the last contiguous
# chunk does about 2cp − 1 times the work of the first, which is why Llama 3 splits the sequence into 2·cp chunks for its
# all-gather CP as well.

# %% [markdown]
# ### The same layer at every cp
# Formula and per-rank ring (forward, in a `SimulatedWorld`) for each cp that splits the sequence: the bytes one
# device sends, (cp − 1)/cp · 2·b·s·hkv·d·e, are linear in s and nearly flat in cp — they *grow* towards the whole
# K and V as cp grows ((cp − 1)/cp of it: the table's second column) — context parallelism divides memory and
# compute by cp, not the traffic per device — and the contiguous split's imbalance grows towards 2 while zig-zag
# stays at 1.

# %%
import plotly.graph_objects as go

by_cp = {}
for c in [c for c in sorted({2, 4, 8, p.cp}) if p.seq % (2 * c) == 0]:
    by_cp[c] = {row["layout"]: row for row in measure(p.seq, c, batch=p.batch, heads=p.heads, kv_heads=p.kv_heads,
                                                      head_dim=p.head_dim, seed=p.seed)}
    harness.agree(rec, f"cp.by_cp.cp{c}.ring.p2p.bytes", "bytes", ledger=by_cp[c][p.layout]["send_bytes"],
                  formula=fcp.ring_p2p(p.batch, p.seq, p.kv_heads, p.head_dim, c)["bytes"])
    for layout, row in by_cp[c].items():
        harness.agree(rec, f"cp.by_cp.cp{c}.max_over_mean_work.{layout}", "ratio",
                      formula=fcp.max_over_mean(row["formula_elements"]), ledger=row["max_over_mean"])
fig = go.Figure([go.Scatter(x=list(by_cp), y=[by_cp[c][lay]["max_over_mean"] for c in by_cp], mode="lines+markers",
                            name=lay) for lay in ("contiguous", "zigzag")])
fig.update_layout(height=300, xaxis_title="cp", yaxis_title="max / mean work per rank", xaxis_type="log",
                  title=f"causal attention, s = {p.seq}: the busiest rank over the average (counted)")
fig.show()
whole_kv = 2 * p.batch * p.seq * p.kv_heads * p.head_dim * 4  # all of K and V, float32
pd.DataFrame({c: {"ring forward bytes / device (ledger)": rows[p.layout]["send_bytes"],
                  "of the whole K and V": round(rows[p.layout]["send_bytes"] / whole_kv, 4),
                  "contiguous max / mean": round(rows["contiguous"]["max_over_mean"], 4)}
              for c, rows in by_cp.items()}).T

# %% [markdown]
# ## 6 · DeepSpeed-Ulysses: all-to-alls instead of a ring
# Each device trades its s/cp positions of all heads for all s positions of hq/cp query heads and hkv/cp key/value
# heads: one all-to-all each for q, k, v, dense attention per head group, one all-to-all back for the output —
# 4 forward, 4 backward, payload b·(s/cp)·(2hq + 2hkv)·d·e per direction. Unlike the ring its traffic falls as
# 1/cp. The hard rule is that cp divides the **query** heads: when it does not divide the key/value heads, K and V
# are replicated first (each K/V head copied to the query heads that read it — here all the way to multi-head
# attention, hkv = hq, as `ulysses_params` does), which costs K/V traffic and memory but runs. (Run with
# `ulysses=True`: forward and backward through the four views.)

# %%
if p.ulysses:
    pu, why = ulysses_params(p)
    print(why)
    if pu is not None:  # forward + backward: the forward's 4 all-to-alls, then their 4 gradients
        display(harness.record(rec, "cp", *harness.views(UlyssesCase(pu, backward=True))))

# %% [markdown]
# XLA:CPU writes each all-to-all as one array per destination device (a tuple of cp equal chunks — one all-to-all,
# not cp combined ones). XLA:TPU issues every one synchronously and none combined, in the step's order: q, k, v, the
# output, then the output's gradient (it is computed from the output) and dq, dk, dv. Half of them travel in bf16 —
# q, k, v and the output's gradient, each read next by a matmul at the default precision — and half in f32 (the
# output, and dq, dk, dv on their way home; the line above the table lists them): its bytes differ, its elements
# agree.

# %% [markdown]
# ### Explore
# Move the sliders: the formula is recomputed and a small ring (forward + backward) runs in a `SimulatedWorld`; the
# status line compares the formula's sends with the ledger's and the work per rank with the count. An impossible
# split (seq not divisible by the layout's chunks) is reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(p, cp=min(p.cp, 4), seq=32, kv_heads=min(p.kv_heads, 4), layout=p.layout, causal=True)
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("cp.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("cp.explorer.rejects_bad_split", not update(cp=3, seq=32, layout="zigzag")["ok"],
          "seq=32 over the 6 zig-zag chunks of cp=3 is reported")
update(cp=min(p.cp, 4), seq=32, layout=p.layout)
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. Llama 3 8B has hkv = 8 key/value heads of d = 128. Training one sequence of s = 131072 tokens (b = 1) in bf16 with
#    ring attention over cp = 16 devices: how many bytes does each device send in one layer's **forward**?
# 2. Causal attention, contiguous split, s = 16 over cp = 4: how many unmasked score elements (per batch row and
#    head) does each rank compute? A list of 4 ints.
# 3. With hq = 32 query heads and hkv = 8 key/value heads, what is the largest cp DeepSpeed-Ulysses can use
#    without replicating any key/value head?
# 4. Predict it, then check the program: how many collective-permute instructions does the `scan` ring's forward +
#    backward program contain?
# 5. Code: the ring's merge step. Two key blocks gave partial attention results `o1, o2` [b, h, c, d] with their
#    log-sum-exps `l1, l2` [b, h, c] (log Σ exp of each query's scores over that block). Write
#    `answer_5(o1, l1, o2, l2)` returning the attention output over both blocks together — and keep it finite when
#    the scores are large.

# %%
from shardlab.context.solutions import SOLUTIONS
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers, solutions=SOLUTIONS)
compiled = next((v for v in step_views[2:] if v.ran), None)
answer_1 = None  # bytes (an int)
answer_2 = None  # a list of 4 ints
answer_3 = None  # an int
answer_4 = None  # a count
answer_5 = None  # a function (o1, l1, o2, l2) -> tensor, e.g. def answer_5(o1, l1, o2, l2): ...
for n, a in enumerate((answer_1, answer_2, answer_3), start=1):
    ex.show(n, a)
ex.show(4, answer_4, count=compiled.get("ring.scan.fwd_bwd.collective_permute.count") if compiled else None)
ex.show(5, answer_5)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. (cp − 1) steps × 2 blocks (K and V) × b·(s/cp)·hkv·d·e = (cp − 1)/cp · 2·b·s·hkv·d·e: linear in s and
#    nearly flat in cp — 15/16 of the whole K and V (536,870,912 bytes) at cp = 16, half of it at cp = 2. Adding
#    devices shrinks each block as fast as it adds steps, so the traffic per device does not fall with cp.
# 2. Rank r holds queries [4r, 4r + 4): r full 4 × 4 blocks of earlier keys plus its own diagonal block (4·5/2):
#    16r + 10.
# 3. Each device gets hq/cp query heads and hkv/cp key/value heads after the all-to-all; whole GQA groups need cp to
#    divide hkv: 8. Replicating K/V heads first lifts that to the hard rule, cp | hq: up to 32, at the price of
#    moving and holding the copies.
# 4. `scan` traces the loop body once: one shift of the stacked K/V per body, one loop forward, and autograd's
#    backward of the scan is one more loop with the opposite shift — however many trips they run.
# 5. With lᵢ = exp(lseᵢ) the two blocks' softmax denominators, out = (l₁·o₁ + l₂·o₂)/(l₁ + l₂); dividing by
#    exp(lse) with lse = logaddexp(l1, l2) gives o₁·exp(l1 − lse) + o₂·exp(l2 − lse), which never overflows — the
#    update `SoftmaxState.update` applies at every ring step.
# </details>

# %%
rec.close()["status"]
