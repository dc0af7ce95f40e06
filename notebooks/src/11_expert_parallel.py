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
    identical,
)
from shardlab.expert.moe import moe_reference
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
from fractions import Fraction

fv, lv = harness.views(step, ("formula", "ledger"))
stated = fexp.statement_bytes(step.groups * p.tokens, p.hidden, p.top_k, p.capacity_factor, step.groups)
if p.ep > 1:  # the ledger's payload is the size of the tensor the per-rank code handed over, not a formula
    handed = lv["fwd.all_to_all.bytes"] // 2 if "fwd.all_to_all.bytes" in lv.values else lv["all_to_all.bytes"] // 2
    whole = Fraction(str(p.capacity_factor)) * p.top_k * p.tokens % p.experts == 0
    rec.check("ep.ledger.payload_vs_statement", handed >= stated and (handed == stated) == whole,
              f"one all-to-all handed {handed} B; tokens·k·cf·h·e / ranks = {stated:g} B; equal exactly when E "
              f"divides cf·k·S (here {'it does' if whole else 'it does not: C rounds up'})")
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
    gloo = harness.gloo(step)
    rec.check("ep.gloo.same_ledger", gloo["ledger"] == lv.detail["ledger"],
              f"{len(gloo['ledger'])} collectives, identical rows")
    rec.check("ep.gloo.bit_identical", identical(gloo["ranks"], lv.detail["ranks"][0]),
              "outputs, input and router gradients, rank by rank")
else:
    print("gloo run skipped (run_gloo=False or ep=1): ep processes take several seconds to start")

# %% [markdown]
# ## 4 · The dropless variant
# Drop nothing: size every expert's buffer to the largest load of any expert in any group. This per-rank code uses
# a **fixed-size** all-to-all (`all_to_all` with equal chunks, like the compiled programs): with equal chunks every
# rank must hand the same buffer, so the ranks first agree on C with one all-reduce (max) of a scalar, and every slot
# row is paid for at the worst expert's load. That padding belongs to the equal-chunk collective, not to dropless
# routing: Megatron-Core's token dispatcher first all-to-alls the per-expert counts and then moves exactly the kept
# rows with variable splits (`all_to_all_single` with input / output split sizes), so the wire carries no empty
# slots; MegaBlocks (Gale et al. 2023) removes the padding from the expert *compute* (block-sparse matmuls over the
# tokens an expert really got), not from the collective. A static XLA program cannot size a buffer by data at all,
# so this variant has no compiled view. The dropless C is the largest load, which exceeds the capacity C exactly when
# the capacity layer drops something (at a large capacity factor it is the smaller of the two).

# %%
dropless = MoECase(p, dropless=True)
dl_views = harness.views(dropless, ("formula", "ledger"))
ref_dl = dropless.oracle()  # the dense layer's loops, no capacity
worst = max(max(r["loads"]) for group in dl_views[1].detail["ranks"] for r in group)  # what the ranks counted
rec.check("ep.dropless.slots_are_the_worst_load", dropless.slots() == worst and ref_dl["dropped"] == 0,
          f"dropless C = {dropless.slots()} = the largest load the ranks counted ({worst}); the loops drop "
          f"{ref_dl['dropped']}")
moe_dl, x_dl, _ = dropless.tensors()  # the same groups, routed by the dense layer's loops WITH the capacity
cap_dropped = sum(len(r.dropped) for r in moe_reference(x_dl, moe_dl, dropless.groups).routings)
rec.check("ep.dropless.larger_exactly_when_capacity_drops", (worst > C) == (cap_dropped > 0),
          f"largest load {worst} vs capacity C = {C}; with the capacity the loops drop {cap_dropped} assignments "
          "of these groups")
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
hv, tv = harness.views(step, ("hlo", "tpu"))
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
    f, led = harness.views(c, ("formula", "ledger"))
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
# the vectorised dispatch (cumulative sums, the code every view runs) left without a slot; **loops** — the dense
# oracle's routing, Python loops walking the assignments in priority order (an independent implementation: the
# check is that the two agree); **formula** — $\sum_{g,e}\max(0, L_{g,e} - C)$ over the loads the router chose
# (shown, not a check: any fill-until-full rule drops exactly that many — the priority order decides *which*
# assignments drop, not how many); **lower bound** — $\max(0,\ 1 - E\cdot C/(k\cdot S))$: a group's E·C slots hold
# at most E·C of its k·S assignments; **uniform** — what a router spreading tokens uniformly at random would drop on
# average (each expert's load in a group ~ Binomial(S, k/E)). Fractions are of all assignments.

# %%
rows = drops(step)
for r in rows:
    cf = f"{r['capacity_factor']:g}"
    rec.measure(f"ep.drops.cf{cf}.capacity", r["capacity"], "count", "formula")
    rec.measure(f"ep.drops.cf{cf}.dropped.fraction", r["formula"], "fraction", "formula")
    rec.measure(f"ep.drops.cf{cf}.dropped.fraction", r["measured"], "fraction", "ledger")
    rec.measure(f"ep.drops.cf{cf}.uniform.fraction", r["uniform"], "fraction", "formula")
    rec.check(f"ep.drops.cf{cf}.dispatch_equals_loops", r["measured"] == r["loops"],
              f"vectorised dispatch {r['measured']:.6f} = priority-order loops {r['loops']:.6f}")
    rec.check(f"ep.drops.cf{cf}.at_least_the_slot_bound", r["measured"] >= r["lower_bound"],
              f"dropped {r['measured']:.6f} >= 1 − E·C/(k·S) = {r['lower_bound']:.6f}")
by_cf = sorted(rows, key=lambda r: r["capacity_factor"])
rec.check("ep.drops.never_more_with_more_capacity",
          all(a["measured"] >= b["measured"] for a, b in zip(by_cf, by_cf[1:], strict=False)),
          "dropped fraction non-increasing in cf: " + ", ".join(f"{r['capacity_factor']:g}: {r['measured']:.4f}"
                                                                for r in by_cf))
vexp.drop_figure(rows).show()
drop_frame = pd.DataFrame([{k: r[k] for k in ("capacity_factor", "capacity", "dropped", "measured", "loops", "formula",
                                              "lower_bound", "uniform")} for r in rows])
drop_frame

# %% [markdown]
# Below cf = 1 the slots cannot hold every assignment even when the router is perfectly even: the lower bound
# $1 - E\cdot C/(k\cdot S)$ is positive, and it is only a bound — it is reached when every expert of every group is at
# least full; an expert the router leaves short of C wastes slots and the others drop more (the table's rows below
# cf 1, measured against their bound, printed next). Above cf = 1 what drops is the router's imbalance. That is why
# Switch and GShard add a load-balancing loss (section 9), and why training runs at cf 1.25–2 or dropless.

# %%
for r in by_cf:
    if r["lower_bound"] > 0:
        print(f"cf {r['capacity_factor']:g}: C = {r['capacity']}, bound {r['lower_bound']:.4f}, measured "
              f"{r['measured']:.4f} (+{r['measured'] - r['lower_bound']:.4f}: slots left empty by a light expert)")

# %% [markdown]
# ## 9 · The remedy: the load-balancing loss and the router z-loss
# Switch Transformer (Fedus et al. 2021, eq. 4–6) adds to the training loss
#
# $$\mathcal{L}_{aux} = \alpha\cdot E\cdot\sum_{i=1}^{E} f_i\,P_i,\qquad f_i = \tfrac{1}{S}\#\{t:\ i\in
# \mathrm{top}_k(t)\},\quad P_i = \tfrac{1}{S}\sum_t p_{t,i}$$
#
# per routing group: $f_i$ (the fraction of tokens routed to expert i, $\sum_i f_i = k$) carries no gradient, $P_i$
# does, so the gradient lowers the probability of the experts that already get many tokens; a uniform router scores
# $\alpha k$. ST-MoE (Zoph et al. 2022, eq. 5) adds the **router z-loss** $\tfrac{1}{S}\sum_t(\log\sum_e
# e^{z_{t,e}})^2$ over the router logits z: it keeps the logits small, so the float32 softmax stays accurate (it
# balances nothing). `shardlab.expert.moe.load_balancing_loss` and `router_z_loss` compute them in the layer
# (`moe_reference` returns both); the checks compare them with Mixtral's `load_balancing_loss_func` from
# transformers (group by group, α = 1: the same sum) and with a Python loop over tokens.

# %%
import math

from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from shardlab.expert.balance import train_router
from shardlab.expert.moe import dispatch_tensors, router_logits, top_k_gates

moe0, x0, _ = step.tensors()
ref0 = moe_reference(x0, moe0, step.groups)
with torch.no_grad():
    logits0 = router_logits(x0, moe0.router).double()  # [G·S, E]
    hf = sum(float(load_balancing_loss_func((lg,), p.experts, p.top_k)) for lg in logits0.chunk(step.groups)) / step.groups
z_loop = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits0.tolist()) / len(logits0)
rec.check("ep.router.aux_equals_transformers", math.isclose(float(ref0.aux), hf, rel_tol=1e-5),
          f"layer {float(ref0.aux):.6f} vs transformers' Mixtral load_balancing_loss_func {hf:.6f} (mean of groups)")
rec.check("ep.router.z_loss_equals_a_loop", math.isclose(float(ref0.z), z_loop, rel_tol=1e-5),
          f"layer {float(ref0.z):.6f} vs a Python loop over tokens {z_loop:.6f}")
print(f"this router: aux (α = 1) = {float(ref0.aux):.4f} (uniform: k = {p.top_k}), z-loss = {float(ref0.z):.4f}")

# %% [markdown]
# **Does it reduce the drops?** A few optimizer steps say. `train_router` shifts the tokens by one shared offset
# (real hidden states share a mean direction; the notebook's zero-mean tokens do not, so its random router is
# already balanced in expectation and its drops are binomial noise, which no loss removes), freezes the experts and
# runs 30 Adam steps (lr 0.01) on the router only, minimising the task loss ½‖y − target‖² per token plus
# α·aux (plus 0.01·z in the last row), through GShard's einsum layer at this notebook's capacity factor.

# %%
runs = {"task only (α = 0)": train_router(p, step.groups, 0.0), "α = 0.1": train_router(p, step.groups, 0.1),
        "α = 1": train_router(p, step.groups, 1.0), "α = 1, z-loss 0.01": train_router(p, step.groups, 1.0, z_coef=0.01)}
balance_frame = pd.DataFrame({name: {"dropped at step 0": h[0]["dropped"], "dropped after 30": h[-1]["dropped"],
                                     "aux at step 0": h[0]["aux"], "aux after 30": h[-1]["aux"],
                                     "z-loss after 30": h[-1]["z"], "task loss after 30": h[-1]["task"]}
                              for name, h in runs.items()}).T
fig = go.Figure([go.Scatter(y=[r["dropped"] for r in h], mode="lines", name=name) for name, h in runs.items()])
fig.update_layout(height=300, xaxis_title="Adam step (router only)", yaxis_title="dropped fraction",
                  title=f"router training at cf {p.capacity_factor:g}: the task alone collapses, the aux loss holds")
fig.show()
balance_frame.round(4)

# %%
task_only, balanced = runs["task only (α = 0)"][-1], runs["α = 1"][-1]
print(f"after 30 steps: task only drops {task_only['dropped']:.4f} (aux {task_only['aux']:.3f}), with α = 1 "
      f"{balanced['dropped']:.4f} (aux {balanced['aux']:.3f}); start {runs['α = 1'][0]['dropped']:.4f}")

# %% [markdown]
# Read the table: trained on the task alone, the router collapses — the experts it favours get more tokens, their
# gradients favour them more — and the drops grow step by step; the aux loss pulls $P_i$ down where $f_i$ is high
# and holds the drops (measured at the defaults: 0.675 of the assignments dropped after 30 task-only steps, 0.298
# with α = 1, from 0.029; at cf 2.0: 0.409 vs 0). Switch's α = 0.01 is small against *its* cross-entropy loss; what
# counts is α against the task loss's gradient, here ½‖y − target‖² per token. The z-loss changes little here:
# it shrinks the logits (the z column), not the imbalance.
#
# ## 10 · What the [S, E, C] dispatch tensors cost, beside permute + grouped GEMM
# GShard's einsum form (sections 3 and 5) builds per group a dispatch mask and combine weights [S, E, C] —
# S·E·C ≈ cf·k·S² entries each, **quadratic** in the tokens a device routes — and multiplies by them: the dispatch
# einsum("sec,sh->ech") and the combine einsum("sec,ech->sh") cost 2·S·E·C·h FLOPs each, against the experts'
# 2·E·C·3hf, a ratio 2S/(3f) whatever E, k and cf. A sort-based dispatch (MegaBlocks; Megatron's token dispatcher;
# MaxText's sparse-matmul path) instead permutes the k·S token-expert rows into expert order (a gather, no FLOPs),
# runs one grouped GEMM over them and scatter-adds the results (2·k·S·h FLOPs). `formulas.expert.dispatch_cost`:

# %%
cost_here = fexp.dispatch_cost(p.tokens, p.experts, p.top_k, p.capacity_factor, p.hidden, p.ffn)
cost_mixtral = fexp.dispatch_cost(4096, 8, 2, 1.25, 4096, 14336, "bfloat16")  # S = 4096 tokens per device
gates0, experts0 = top_k_gates(logits0[:p.tokens].softmax(-1), p.top_k, p.normalize)  # the first group [S, k]
d_here = dispatch_tensors(gates0[None], experts0[None], p.experts, C)
rec.check("ep.dispatch.tensor_entries", d_here.mask[0].numel() == cost_here["entries"],
          f"the first group's dispatch mask holds {d_here.mask[0].numel()} entries = S·E·C = {cost_here['entries']}")
from shardlab import planner as P

mix = P.plan(P.PlanConfig("mixtral-8x7b", "v6e-64", fsdp=8, expert=8, global_batch=64))
s_mix = mix.micro_batch * mix.config.seq // mix.config.context  # the tokens one chip routes: one group
slots_mix = fexp.capacity(s_mix, 8, 2, mix.model.capacity_factor) * 8 / (2 * s_mix)
print(f"einsums / experts: {cost_here['einsum_over_experts']:.3f} here, {cost_mixtral['einsum_over_experts']:.3f} "
      f"Mixtral-sized; the two [S, E, C] tensors: {cost_here['tensor_bytes']:,} B here vs the group's tokens "
      f"{p.tokens * p.hidden * 4:,} B, {cost_mixtral['tensor_bytes'] / 2**20:.0f} MiB Mixtral-sized")
print(f"planner, Mixtral 8x7B on v6e-64 (fsdp 8 × expert 8, S = {s_mix} tokens per chip): the experts run "
      f"E·C = {slots_mix:g} × k·S slots; hardware FLOPs {mix.flops.hardware:.4g} (model {mix.flops.model:.4g}, "
      f"recompute {mix.flops.recompute:.4g}, empty slots {mix.flops.hardware - mix.flops.model - mix.flops.recompute:.4g})")
pd.DataFrame({"this notebook's layer (f32)": cost_here, "Mixtral-sized, S = 4096 (bf16)": cost_mixtral}).T

# %% [markdown]
# At the defaults (printed above) the two einsums cost a third of the experts' own FLOPs (2S/(3f) with S = 128,
# f = 256) and the two [S, E, C] tensors weigh ten times the tokens they route; Mixtral-sized (S = 4096 tokens per
# device, f = 14336) the einsums add 19 % to the expert FLOPs and the two tensors are 160 MiB per group and layer in
# bf16 — growing as S², which is why large-S training dispatches by permutation. The planner (notebook 07) counts
# neither the einsums nor the tensors (it assumes a permute + grouped GEMM), but its hardware FLOPs include the
# capacity's empty slots: the experts run E·C = ceil(cf·k·S/E)·E slots per group, filled or not — at cf 1.25, a
# quarter more expert FLOPs than the model FLOPs count (Mixtral on v6e-64: 1.18e16 FLOPs per step, the last figure
# printed above; the model-FLOP MFU bound falls from 0.75 to 0.63).

# %% [markdown]
# ## Explore
# Move the sliders: formula and per-rank code re-run (forward only) for that layer; the status line compares them,
# the table is the first group's dispatch all-to-all. A combination that cannot be split (E not divisible by ep,
# k > E) is reported, not raised.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(replace(p, hidden=min(p.hidden, 32), ffn=min(p.ffn, 64)))
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("ep.explorer.update", shown["ok"], f"formula {shown.get('formula')} B vs ledger {shown.get('ledger')} B")
bad_ep = next(e for e in range(2, p.experts + 2) if p.experts % e)  # the smallest ep that does not divide E
rec.check("ep.explorer.rejects_bad_split", not update(ep=bad_ep)["ok"],
          f"experts={p.experts} over ep={bad_ep} is reported")
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
