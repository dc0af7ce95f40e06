# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
ep = 4  # expert-parallel degree: ranks of the ledger, size of the `expert` mesh axis (data: n / ep)
tokens = 128  # S: tokens each device (and each rank) routes — one routing group each
hidden = 64  # h: token width
ffn = 256  # f: each expert's inner width (SwiGLU: 3·h·f weights per expert)
experts = 8  # E, split over ep: E / ep whole experts per device
top_k = 2  # k: experts per token
capacity_factor = 1.25  # cf: C is ceil(cf·k·S/E) slots per expert and group; the rest is dropped
normalize = True  # renormalise each token's k gates to sum to 1 (GShard top-2, Mixtral)
drop_factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]  # cf of the drop table
run_gloo = False  # also run the per-rank code in ep real processes (gloo all_to_all_single; ~5 s)
async_flag = False  # also compile with XLA:TPU's xla_tpu_enable_async_all_to_all (one more compile)
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.expert.params import ExpertParams
from shardlab.profile import Recorder

p = ExpertParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 11 · Expert parallelism: top-k routing, capacity, and the two all-to-alls
#
# A mixture-of-experts layer (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021; Mixtral) replaces
# the MLP with E expert MLPs and a **router** that sends each token to k of them:
#
# $$p = \mathrm{softmax}(x W_r),\quad (g, e) = \mathrm{top}_k(p),\quad y_t = \sum_{j<k} g_{t,j}\,
# \mathrm{Expert}_{e_{t,j}}(x_t),\qquad \mathrm{Expert}(x) = (\mathrm{silu}(xW_1)\circ xW_3)\,W_2$$
#
# with $W_r$: [h, E] and each expert's $W_1, W_3$: [h, f], $W_2$: [f, h] (SwiGLU, 3·h·f weights; the k gates are
# renormalised to sum to 1 when `normalize`). GShard routes tokens in **groups** of S and gives every expert a fixed
# **capacity** of $C = \lceil cf \cdot k \cdot S / E \rceil$ slots per group; the assignments are served in
# priority order (every token's first choice, then every second choice), and an assignment that finds its expert
# full is **dropped** (the residual connection outside the layer carries the token on).
#
# **Expert parallelism** puts E/ep whole experts on each of ep devices. Every device routes its own S tokens, packs
# them into a buffer [E, C, h] (slot c of expert e) and hands it to an **all-to-all**: block j (the E/ep experts of
# device j) goes to device j — the *dispatch*. The experts run where they live, and a second all-to-all brings the
# results home — the *combine*. That is the collective the suite has not shown yet, and it is measured here four
# ways: the **formula**, the **ledger** (per-rank code in a `SimulatedWorld`), and the same layer as GShard's
# annotated einsums compiled by **XLA:CPU** and by **XLA:TPU** (compile-only). The dense layer — Python loops over
# the routing and over the experts — is the oracle for all of them.

# %%
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import torch

from shardlab.core import harness
from shardlab.core.views import View
from shardlab.expert import figures as vexp
from shardlab.expert.case import (
    MoECase,
    async_windows,
    collective_frame,
    compiler_story,
    drops,
    explore,
    gloo_run,
    identical,
    views,
)
from shardlab.formulas import expert as fexp

torch.set_num_threads(1)  # tiny CPU matmuls: intra-op threads only spin against the ranks' threads
step = MoECase(p)  # one MoE layer, forward + backward of ½‖y − target‖²
C = step.slots()
print(f"ep = {p.ep}: mesh (data, expert) = ({step.data}, {p.ep}), {step.groups} routing groups of S = {p.tokens} "
      f"tokens; E = {p.experts} experts, {p.experts // p.ep} per device; k = {p.top_k}, cf = {p.capacity_factor} "
      f"-> C = {C} slots per expert and group")

# %% [markdown]
# ## 1 · The routing at hand
# The router here is random (untrained), as at the start of training: it does not spread the tokens evenly. The
# bars count, per expert, the assignments it kept and dropped over all groups; the dashed line is its capacity in
# all groups together (C per group — an expert can drop in one group while it has room in another). Colour: the
# device that holds the expert.

# %%
loads = step.loads()
vexp.load_figure(loads, C, p.ep).show()

# %% [markdown]
# ## 2 · The formula
# Per device and MoE layer: the dispatch and the combine, each handing over the whole buffer [E, C, h] — the slots
# are paid for whether a token fills them or not — and the same two again backward (the gradients travel the
# reverse way):
#
# $$\text{count} = 2 + 2,\qquad \text{payload} = E \cdot C \cdot h \cdot e \;\ge\; \frac{\text{tokens}\cdot k\cdot
# cf\cdot h\cdot e}{\text{ranks}}\ \ (\text{equal when } E \text{ divides } cf\cdot k\cdot S),\qquad
# \text{wire} = \tfrac{ep-1}{ep}\,\text{payload}$$
#
# The usual statement divides by "ranks": read it as the **devices that route their own tokens**, data × expert —
# on a 2-D mesh each device still routes S = tokens / (data · ep) tokens, and the payload does not depend on ep at
# all; only the wire share does (the block for its own experts stays home). Expert weights per chip:
# $(E/ep)\cdot 3hf\cdot e$. The backward also sums gradients the per-rank code leaves out (`grad_sync`): the
# replicated router's over all devices and, with a data axis, each expert's over it.

# %%
fv, lv = views(step, ("formula", "ledger"))
one = fexp.all_to_all(p.tokens, p.hidden, p.experts, p.top_k, p.capacity_factor, p.ep)["bytes"] // 2 if p.ep > 1 else 0
stated = fexp.statement_bytes(step.groups * p.tokens, p.hidden, p.top_k, p.capacity_factor, step.groups)
rec.check("ep.formula.payload_is_the_buffer", p.ep == 1 or one == p.experts * C * p.hidden * 4,
          f"one all-to-all = E·C·h·e = {p.experts}·{C}·{p.hidden}·4 = {one} B")
rec.check("ep.formula.statement_rounds_up", p.ep == 1 or one >= stated,
          f"E·C·h·e = {one} B >= tokens·k·cf·h·e / ranks = {stated:g} B (equal when E divides cf·k·S)")
pd.Series(fv.values, name="formula", dtype=object)

# %% [markdown]
# ## 3 · The ledger: per-rank code with two all-to-alls
# `moe_step(comm, moe, x, target)` (`shardlab.expert.parallel`) is one rank's layer: its slice of the tokens, a
# replica of the router, its E/ep experts; its backward differentiates ½‖y − target‖² (every view's loss: the output
# gradient y − target depends on the output, as in training). It routes with GShard's vectorised dispatch (a cumulative sum gives every
# assignment its slot), packs the buffer with one einsum, and calls `all_to_all` — an autograd function whose
# backward is the same all-to-all of the gradient (an all-to-all with equal chunks is its own transpose). One
# `SimulatedWorld(ep)` per data group runs it; outputs and the input, router and expert gradients are compared with
# the dense layer (router gradients summed over the ranks, expert gradients over the data groups).

# %%
group0 = [r["loads"] for r in lv.detail["ranks"][0]]
vexp.dispatch_figure(group0, C, p.ep).show() if p.ep > 1 else print("ep = 1: every token stays home")
lv.detail["ledger"].summary()

# %% [markdown]
# The heat map is the dispatch all-to-all of the first group: how many tokens rank i actually sends to rank j. Every
# cell carries the same E/ep · C slots whatever it uses — the all-to-all's payload is set by the capacity, not by
# the routing.
#
# ### The same code in real processes (`run_gloo`)
# `DistributedWorld(ep)` runs the very same `moe_step` in ep processes on a gloo group (`all_to_all_single`). An
# all-to-all moves values without adding any, so outputs and gradients must be bit-identical, and the ledger equal.

# %%
if p.run_gloo and p.ep > 1:
    gloo = gloo_run(step)
    rec.check("ep.gloo.same_ledger", gloo["ledger"] == lv.detail["ledger"],
              f"{len(gloo['ledger'])} collectives, identical rows")
    rec.check("ep.gloo.bit_identical", identical(gloo["ranks"], lv.detail["ranks"][0]),
              "outputs, input and router gradients, rank by rank")
else:
    print("gloo run skipped (run_gloo=False or ep=1): ep processes take several seconds to start")

# %% [markdown]
# ## 4 · The dropless variant
# Drop nothing: size every expert's buffer to the largest load of any expert in any group. The ranks must hand the
# all-to-all equal buffers, so they first agree on C with one all-reduce (max) of a scalar; then every slot row is
# paid for at the worst expert's load. (MegaBlocks, Gale et al. 2023, avoids that padding with block-sparse
# kernels; a static XLA program cannot size a buffer by data at all, so this variant has no compiled view.)

# %%
dropless = MoECase(p, dropless=True)
dl_views = views(dropless, ("formula", "ledger"))
rec.check("ep.dropless.pays_the_worst_load", dropless.slots() >= C or p.ep == 1,
          f"dropless C = {dropless.slots()} (largest load) vs capacity C = {C}")
harness.record(rec, "ep.dropless", *dl_views)

# %% [markdown]
# ## 5 · The compilers: GShard's einsums with experts on an `expert` axis
# The dense layer written as GShard writes it (`shardlab.expert.gspmd`): the dispatch mask and combine weights
# [G, S, E, C] from the routing, `dispatched = einsum("gsec,gsh->egch")`, the experts as batched einsums over e,
# `y = einsum("gsec,egch->gsh")`. Annotations on the mesh (data, expert) = (n / ep, ep): tokens
# `(("data", "expert"), None)` — every device one group —, W1, W3, W2 `("expert", None, None)`, the router
# replicated. `dispatched` is computed where its group's tokens are, then re-annotated sharded by expert: a reshard
# from one dimension to another, which the partitioner emits as one all-to-all within each expert group; the
# experts' output goes back the same way. Both sides of each reshard are pinned (`Reshard`) — without the pins the
# partitioner moved the dispatch mask and all-gathered the tokens instead.

# %%
hv, tv = views(step, ("hlo", "tpu"))
secs = harness.record_compile_s(rec, "ep.compile_s", hv, tv)  # XLA:CPU (metrics) and XLA:TPU seconds
print("compile seconds:", {k: round(v, 2) for k, v in secs.items()})

# %% [markdown]
# ## 6 · Four ways, one number
# Bytes are what one device hands to the collective (notebook 00). `expert_params.per_chip.bytes` is read from the
# compiled programs' parameters (the arrays shaped [E/ep, h, f] and [E/ep, f, h]); `dropped.fraction` is counted
# from the router's loads (formula) and from what the ranks' dispatch kept (ledger); the XLA:CPU program's outputs
# equal the dense layer's, so it kept the same assignments.

# %%
table = harness.record(rec, "ep", fv, lv, hv, tv)
table

# %%
harness.memory_frame({"cpu (buffer assignment)": hv, "tpu (compiled memory stats)": tv})

# %% [markdown]
# **Interpretation.** Formula, per-rank code and both partitioners agree on the all-to-alls: 2 forward + 2
# backward, each the whole [E, C, h] buffer, within the ep devices of an expert group. The expert weights shrink
# with ep; the all-to-all payload per device does not — it is set by the tokens each device routes and the
# capacity. XLA:TPU moves the same *elements* in bf16 — each all-to-all's result feeds matmuls, which it runs on
# bf16 inputs at the default precision, so it converts before the transfer: the table compares elements and marks
# its bytes.
#
# ### What XLA:TPU did with the all-to-alls
# Read from its per-chip program: every collective, its element type, whether it is issued synchronously or as a
# start / done pair, and how many logical collectives one instruction carries (the combiner's tuples).

# %%
for name, view in (("XLA:CPU", hv), ("XLA:TPU", tv)):
    if view.ran:
        print(f"{name}: {compiler_story(view.detail.module)}")
        display(collective_frame(view.detail.module))
    else:
        print(f"{name}: no program here ({view.skipped})")

# %% [markdown]
# At the defaults (measured, v5e): four **synchronous** bf16 all-to-alls, **none combined** and none overlapped with
# other work — each waits for the one before it: the loss ½‖y − target‖² needs the combine's result before the
# backward's first all-to-all can start — while the three expert-weight gradient all-reduces over the data axis
# *are* combined into one tuple all-reduce (the router's stays separate: it runs over another device group, all
# devices). That combining is real: the three gradients are independent of each other (measured the same with a
# loss whose output gradient is a constant). XLA:CPU issues everything synchronously and combines nothing (it writes
# each all-to-all as one array per destination — the `shapes` column — which is still one all-to-all). XLA:TPU can
# issue its all-to-alls asynchronously: its debug option `xla_tpu_enable_async_all_to_all`, off by default in this
# libtpu, turns each into a start / done pair with other work scheduled in between — where the scheduler finds
# some: a pair with nothing between start and done becomes a plain all-to-all again (measured: at these defaults
# all four overlap work; with 4 devices and S = h = 32 the dispatch finds none and stays synchronous).
# `async_flag=True` compiles it and counts that work.

# %%
if p.async_flag and tv.ran:
    flagged = harness.tpu(step, debug_options={"xla_tpu_enable_async_all_to_all": True})
    windows = async_windows(flagged.detail.module)
    print(f"XLA:TPU with xla_tpu_enable_async_all_to_all: {compiler_story(flagged.detail.module)}; "
          f"instructions between each start and done: {windows}")
    rec.measure("ep.async_flag.all_to_all.async", len(windows), "count", "tpu")
    rec.measure("ep.async_flag.all_to_all.overlapped", sum(w > 0 for w in windows), "count", "tpu")
else:
    print("async_flag=False (or no TPU view): the flagged compile is skipped")

# %% [markdown]
# ## 7 · The same layer at every ep
# One case per expert-parallel degree (forward only), formula and ledger: the payload per device stays, the wire
# share (ep − 1)/ep grows, the expert weights per chip fall as 1/ep. (At ep = 1 nothing moves: every device holds
# every expert.)

# %%
by_ep = {}
for e in [e for e in (1, 2, 4, 8) if p.experts % e == 0]:
    c = MoECase(replace(p, ep=e), backward=False)
    f, led = views(c, ("formula", "ledger"))
    harness.record(rec, f"ep.by_ep.ep{e}", f, led, show=False)
    by_ep[e] = {"payload (formula)": f["all_to_all.bytes"], "payload (ledger)": led["all_to_all.bytes"],
                "wire (ledger)": led.detail["ledger"].wire_bytes("all_to_all"),
                "expert weights per chip": f["expert_params.per_chip.bytes"]}
frame = pd.DataFrame(by_ep).T
fig = go.Figure([go.Scatter(x=list(by_ep), y=frame[col], mode="lines+markers", name=col) for col in frame])
fig.update_layout(height=320, xaxis_title="ep", yaxis_title="bytes per device", xaxis_type="log",
                  title="forward: all-to-all payload stays, wire grows to it, expert weights fall as 1/ep")
fig.show()
frame

# %% [markdown]
# ## 8 · Tokens dropped vs capacity factor
# For this routing (the groups above), at every capacity factor of `drop_factors`: **measured** — the assignments
# the vectorised dispatch left without a slot; **formula** — $\sum_{g,e}\max(0, L_{g,e} - C)$ over the loads the
# router chose (exact for the routing at hand: the priority order decides *which* assignments drop, not how many);
# **uniform** — what a router spreading tokens uniformly at random would drop on average (each expert's load in a
# group ~ Binomial(S, k/E)). Fractions are of all assignments.

# %%
rows = drops(step)
for r in rows:
    cf = f"{r['capacity_factor']:g}"
    harness.record(rec, f"ep.drops.cf{cf}", View("formula", {"dropped.fraction": r["formula"], "capacity": r["capacity"]},
                                                {"dropped.fraction": "fraction", "capacity": "count"}),
                   View("ledger", {"dropped.fraction": r["measured"]}, {"dropped.fraction": "fraction"}), show=False)
    rec.measure(f"ep.drops.cf{cf}.uniform.fraction", r["uniform"], "fraction", "formula")
here = [r for r in rows if r["capacity_factor"] == p.capacity_factor]
if here:
    rec.check("ep.drops.same_as_the_layer", here[0]["measured"] == lv["dropped.fraction"],
              f"cf {p.capacity_factor}: table {here[0]['measured']} = the layer's ledger {lv['dropped.fraction']}")
vexp.drop_figure(rows).show()
pd.DataFrame([{k: r[k] for k in ("capacity_factor", "capacity", "dropped", "measured", "formula", "uniform")}
              for r in rows])

# %% [markdown]
# Below cf = 1 the slots cannot hold every assignment even when the router is perfectly even: at cf = 0.5 exactly
# half is dropped, whatever the router does. Above it, what drops is the router's imbalance — more than the uniform
# expectation, because a random router prefers some experts. That is why Switch and GShard add a load-balancing loss,
# and why training runs at cf 1.25–2 or dropless.
#
# ## Explore
# Move the sliders: formula and per-rank code re-run (forward only) for that layer; the status line compares them,
# the table is the first group's dispatch all-to-all. A combination that cannot be split (E not divisible by ep,
# k > E) is reported, not raised.

# %%
ui, update = vexp.explorer(replace(p, hidden=min(p.hidden, 32), ffn=min(p.ffn, 64)), explore)
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("ep.explorer.update", shown["ok"], f"formula {shown.get('formula')} B vs ledger {shown.get('ledger')} B")
rec.check("ep.explorer.rejects_bad_split", not update(ep=3)["ok"], "experts=8 over ep=3 is reported")
update(ep=p.ep)
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. Mixtral 8x7B has h = 4096 and SwiGLU experts with f = 14336, E = 8. With ep = 8 in bf16, how many bytes of
#    expert weights does each chip hold per MoE layer?
# 2. Each device routes S = 4096 tokens, E = 8, k = 2, cf = 1.25, h = 4096, bf16, ep = 8. How many bytes does one
#    device hand to ONE dispatch all-to-all?
# 3. The same layer on a mesh data 2 × expert 4 — each device still routes its own 4096 tokens. How many of those
#    bytes cross the wire from one device (ring model: the block for its own experts stays home)?
# 4. One group of S = 8 tokens, E = 4 experts, k = 2, cf = 1.0. The router's choices load the experts with
#    [6, 5, 3, 2] assignments. What fraction of the 16 assignments is dropped?
# 5. **Code.** Write `answer_5(comm, buf)`: `buf` [E, C, h] is this rank's packed buffer (slot c of expert e).
#    With ONE `comm.all_to_all(buf, 0)`, return the rows each of this rank's E/ep local experts must process:
#    [E/ep, ep·C, h], local expert i's rows ordered source rank 0's C slots first, then rank 1's, …
#    It is run on 4 simulated ranks with E = 8, C = 3, h = 2.

# %%
from shardlab.core.exercises import Exercises
from shardlab.expert.solutions import SOLUTIONS

ex = Exercises(p.NOTEBOOK, rec, p.answers, solutions=SOLUTIONS)
answer_1 = None  # bytes
answer_2 = None  # bytes
answer_3 = None  # bytes
answer_4 = None  # a fraction
answer_5 = None  # a function (comm, buf) -> tensor [E/ep, ep*C, h]
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. E/ep = 1 expert: three [4096, 14336] matrices in bf16, 3 · 4096 · 14336 · 2 = 352,321,536 bytes per layer
#    (32 layers: 11.3 GB — the reason Mixtral is split by expert at all).
# 2. C = ⌈1.25 · 2 · 4096 / 8⌉ = 1280 slots per expert; the buffer [8, 1280, 4096] in bf16 is 83,886,080 bytes,
#    every slot included.
# 3. The payload is the same 83,886,080 bytes (the device routes as many tokens as before); a quarter of it is for
#    its own experts: 3/4 · 83,886,080 = 62,914,560 bytes cross the wire.
# 4. C = ⌈1.0 · 2 · 8 / 4⌉ = 4; experts 0 and 1 drop 2 + 1 = 3 assignments: 3/16 = 0.1875.
# 5. `recv = comm.all_to_all(buf, 0)` is [ep · E/ep, C, h] ordered (source rank, local expert):
#    `recv.reshape(ep, E // ep, C, h).transpose(0, 1).reshape(E // ep, ep * C, h)` — what `expert_parallel_moe`
#    does before running its experts.
# </details>
#
# ## Closing note: the numbers
# From this run's record (the report's `11_expert_parallel.json`). Reproduce: `python -m shardlab report --only 11`,
# or `pytest tests/test_nb_11_expert_parallel.py` (the notebook at several parameter sets), `pytest
# tests/test_expert_*.py`.

# %%
def cell(view: View, name: str) -> object:
    return view.values.get(name, "—") if view.ran else "—"


names = ("all_to_all.count", "all_to_all.bytes", "all_to_all.elements", "fwd.all_to_all.count",
         "expert_params.per_chip.bytes", "grad_sync.all_reduce.count", "grad_sync.all_reduce.operands",
         "dropped.fraction")
display(pd.DataFrame({n: {v.source: cell(v, n) for v in (fv, lv, hv, tv)} for n in names}).T)
pd.Series({f"{k} ({detail})": "ok" if ok else "FAILED" for v in (lv, hv) if v.ran
           for k, (ok, detail) in v.checks.items() if k.startswith("parity")}, name="parity with the dense layer",
          dtype=object)

# %%
rec.close()["status"]
