# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
tp = 4  # tensor-parallel degree (ranks in the ledger, size of the `tensor` mesh axis)
batch = 2
seq = 8
hidden = 64
ffn = 256  # MLP inner size (4 * hidden in GPT)
heads = 8  # unused here (notebook 03); kept so all TP notebooks take the same parameters
vocab = 1000  # unused here (notebook 04)
dtype = "float32"  # "float32" or "bfloat16"
run_gloo = True  # also run the per-rank code in tp real processes (torch.distributed, gloo)

# %% [markdown]
# # 02 · Megatron MLP: column-parallel, GeLU, row-parallel — one all-reduce each way
#
# The transformer MLP is $Z = \mathrm{GeLU}(XA)\,B$ with $X$: [b·s, h], $A$: [h, ffn], $B$: [ffn, h].
# Megatron (Shoeybi et al. 2019, §3) splits **A by columns** and **B by rows** (notation of 00_welcome):
#
# $$A = [A_1, \dots, A_p] \;(A[H, F_X]),\qquad B = \begin{bmatrix}B_1\\ \vdots \\ B_p\end{bmatrix}\;(B[F_X, H])$$
#
# Device $i$ computes $Y_i = \mathrm{GeLU}(XA_i)$ on its own — GeLU is elementwise, so the column split needs no
# communication — then the partial $Z_i = Y_iB_i$ (`Z{U_X}`), and **one all-reduce** sums them. The paper names the
# two operators: **f** (forward: copy, backward: all-reduce) before the MLP and **g** (forward: all-reduce,
# backward: identity) after it. So per MLP: 1 all-reduce of [b, s, h] forward, 1 backward (the input gradient).
#
# Three views, one number: **formula** (this algebra), **ledger** (per-rank code in `SimulatedWorld`), **compiler**
# (the HLO XLA's SPMD partitioner produced for `mark_sharding` annotations on the dense module).

# %%
import torch

from shardlab import models, runtime
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import dtype_bytes
from shardlab.profile import Recorder, agree_payload, capture_hlo
from shardlab.tp.params import check_tp_params

# Validate every parameter before any XLA work (errors name the parameter and the rule).
check_tp_params(num_devices=num_devices, tp=tp, batch=batch, seq=seq, hidden=hidden, ffn=ffn, heads=heads,
                vocab=vocab, dtype=dtype, divisible=("ffn",))
if not isinstance(run_gloo, bool):
    raise ValueError(f"run_gloo={run_gloo!r} must be True or False")

world = runtime.setup(num_devices=num_devices)
rec = Recorder("02_megatron_mlp", params=dict(num_devices=num_devices, seed=seed, tp=tp, batch=batch, seq=seq,
                                               hidden=hidden, ffn=ffn, heads=heads, vocab=vocab, dtype=dtype,
                                               run_gloo=run_gloo),
               results_dir=results_dir, world=world)
tdtype = getattr(torch, dtype)
e = dtype_bytes(dtype)
tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=5e-2, atol=5e-2)
torch.manual_seed(seed)
world

# %% [markdown]
# ## 1 · The formula
# One all-reduce forward (g) and one backward (f, only when the input needs a gradient), each of the activation
# [b, s, h]: payload $b\cdot s\cdot h\cdot e$ bytes per rank. Independent of ffn — the big matrices never move.


# %%
def mlp_comm(b, s, h, p, e, backward):
    """Megatron MLP all-reduces: (count, payload bytes per rank)."""
    n = (1 + int(backward)) if p > 1 else 0
    return n, n * b * s * h * e


f_fwd = ftp.mlp_all_reduce(batch, seq, hidden, tp, dtype)
f_fb = ftp.mlp_all_reduce(batch, seq, hidden, tp, dtype, backward=True)
assert (f_fwd["count"], f_fwd["bytes"]) == mlp_comm(batch, seq, hidden, tp, e, False)
assert (f_fb["count"], f_fb["bytes"]) == mlp_comm(batch, seq, hidden, tp, e, True)
print(f"forward: {f_fwd}   forward+backward: {f_fb}")

# %% [markdown]
# ## 2 · The split, drawn
# Each cell is coloured by the device that holds it: A by column blocks, B by the matching row blocks — device
# $i$'s GeLU output $Y_i$ is exactly the input rows its $B_i$ needs.

# %%
from shardlab.viz import tp as vtp

vtp.ownership_figure(vtp.mlp_panels(min(hidden, 64), min(ffn, 256), tp), tp,
                     f"MLP weights over tp={tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank Megatron code
# `ParallelMLP.from_dense(dense, comm)` keeps rank $r$'s slice ($A_r$: `fc1` rows, $B_r$: `fc2` columns in
# `nn.Linear` layout). `SimulatedWorld(tp)` runs the step on `tp` ranks in this process (threads; autograd runs in
# each rank's thread) and records every collective. The output gradient is a fixed random tensor (not ones).

# %%
from shardlab.comm import SimulatedWorld
from shardlab.tp.programs import mlp_step

dense = models.MLP(hidden, ffn).to(tdtype)
x = torch.randn(batch, seq, hidden, dtype=tdtype)
grad_out = torch.randn(batch, seq, hidden, dtype=tdtype)

sim = SimulatedWorld(tp)
sim.run(mlp_step, dense, x)  # forward only
ledger_fwd = sim.ledger
ranks = sim.run(mlp_step, dense, x, grad_out)  # forward + backward
ledger_fb = sim.ledger

# dense oracle
xr = x.clone().requires_grad_(True)
out = dense(xr)
(out * grad_out).sum().backward()
c = ffn // tp
ok_out = all(torch.allclose(r["out"].float(), out.detach().float(), **tol) for r in ranks)
ok_gx = all(torch.allclose(r["grad_x"].float(), xr.grad.float(), **tol) for r in ranks)
ok_gw = all(torch.allclose(r["grads"]["fc1.weight"].float(), dense.fc1.weight.grad[i * c:(i + 1) * c].float(), **tol)
            and torch.allclose(r["grads"]["fc2.weight"].float(), dense.fc2.weight.grad[:, i * c:(i + 1) * c].float(),
                               **tol) for i, r in enumerate(ranks))
rec.check("mlp.parity.output", ok_out, "every rank's output == dense output")
rec.check("mlp.parity.grad_input", ok_gx, "every rank's input gradient == dense")
rec.check("mlp.parity.grad_weights", ok_gw, "rank i's A_i, B_i gradients == dense slices")
vtp.ledger_frame(ledger_fb)

# %%
vtp.ledger_timeline(ledger_fb, f"MLP forward + backward, tp={tp}: g forward, f backward").show()

# %% [markdown]
# ### The same per-rank code in real processes
# `DistributedWorld(tp)` spawns `tp` processes that join a `torch.distributed` gloo group and run the very same
# `mlp_step`. Its ledger must be identical; its results equal up to summation order (gloo may add the ranks'
# partial sums in another order than the simulated world's rank order).

# %%
if run_gloo and tp > 1:
    from shardlab.comm import DistributedWorld

    dworld = DistributedWorld(tp)
    gloo_ranks = dworld.run(mlp_step, dense, x, grad_out)
    rec.check("mlp.gloo.same_ledger", dworld.ledger == ledger_fb, f"{len(dworld.ledger)} collectives, identical rows")
    rec.check("mlp.gloo.same_results", all(torch.allclose(g["out"].float(), r["out"].float(), **tol)
                                           and torch.allclose(g["grad_x"].float(), r["grad_x"].float(), **tol)
                                           for g, r in zip(gloo_ranks, ranks, strict=True)), "outputs and input gradients")
else:
    print("gloo run skipped (run_gloo=False or tp=1)")

# %% [markdown]
# ## 4 · The compiler: GSPMD on the dense module
# The same dense `models.MLP`, moved to XLA, with `fc1.weight` annotated `("tensor", None)` and `fc2.weight`
# `(None, "tensor")` on a mesh (data = num_devices / tp, tensor = tp). The input is replicated. We read the
# collectives from the partitioned HLO of one forward and one forward + backward step.

# %%
from shardlab.tp import gspmd

dev = runtime.device()
mesh = gspmd.tensor_mesh(tp)
xmlp = models.MLP(hidden, ffn)
xmlp.load_state_dict(dense.float().state_dict())  # create on CPU, move, then annotate (xla-notes.md)
xmlp = gspmd.shard_mlp(xmlp.to(tdtype).to(dev), mesh)
dense = dense.to(tdtype)
xd, god = x.to(dev), grad_out.to(dev)
cap_fwd = capture_hlo(gspmd.step, xmlp, xd)
cap_fb = capture_hlo(gspmd.step, xmlp, xd, god)
for label, cap in (("forward", cap_fwd), ("forward+backward", cap_fb)):
    print(label, [c.as_dict() for c in cap.module.collectives])
rec.check("mlp.parity.xla_output", torch.allclose(cap_fb.result[0].cpu().float(), out.detach().float(), **tol),
          "GSPMD output == dense")
rec.check("mlp.parity.xla_grad_input", torch.allclose(cap_fb.result[1].cpu().float(), xr.grad.float(), **tol),
          "GSPMD input gradient == dense")
rec.check("mlp.hlo.group_size", all(c.group_size == tp for cap in (cap_fwd, cap_fb) for c in cap.module.collectives),
          f"every collective runs within groups of tp={tp}")

# %% [markdown]
# ## 5 · Three ways, one number
# Bytes are the payload per rank (design.md): for an all-reduce, its input. The HLO reports operand bytes per device.
# (With `dtype="bfloat16"` on CPU, XLA runs the all-reduce in f32 — its CPU backend does not reduce in bf16 — so the
# HLO bytes are twice the formula's; `agree_payload` then says so and compares elements instead.)

# %%
for phase, f, led, cap in (("fwd", f_fwd, ledger_fwd, cap_fwd), ("fwd_bwd", f_fb, ledger_fb, cap_fb)):
    rec.agree(f"mlp.{phase}.all_reduce.count", "count", formula=f["count"], ledger=led.count("all_reduce"),
              hlo=cap.module.count("all-reduce"))
    agree_payload(rec, f"mlp.{phase}.all_reduce.bytes", f["bytes"], led.payload_bytes("all_reduce"),
                        cap.module, "all-reduce", dtype)
rec.check("mlp.hlo.no_other_collectives", cap_fb.module.count("all-gather") == 0, "only all-reduces")
rec.measure("mlp.fwd_bwd.compile_s", cap_fb.metrics.compile_s, "s", "metrics", kind="timing")
rec.table("mlp.")

# %% [markdown]
# **Interpretation.** All three views agree: the per-rank code issues exactly the all-reduces the paper predicts,
# and XLA's partitioner, given only the weight shardings, derives the same plan — one all-reduce of the
# activation each way. The bytes scale with b·s·h, not with ffn: doubling the MLP width doubles each device's
# FLOPs but not its communication.
#
# ## 6 · Sequence parallelism (Korthikanti et al. 2022)
# Keep the activations outside the MLP split along the sequence: f becomes an **all-gather** (payload: the shard
# [b, s/p, h]) and g a **reduce-scatter** (payload: the full [b, s, h]). The ring wire bytes are the same as the
# all-reduce's — an all-reduce *is* a reduce-scatter followed by an all-gather — but LayerNorm/dropout work and
# memory outside the MLP drop by p.

# %%
if seq % tp == 0:
    sim.run(mlp_step, dense, x, grad_out, sequence_parallel=True)
    led_sp = sim.ledger
    f_sp = ftp.sequence_parallel(batch, seq, hidden, tp, dtype)
    rec.agree("mlp.sp.all_gather.bytes", "bytes", formula=f_sp["all_gather.bytes"],
              ledger=led_sp.payload_bytes("all_gather"))
    rec.agree("mlp.sp.reduce_scatter.bytes", "bytes", formula=f_sp["reduce_scatter.bytes"],
              ledger=led_sp.payload_bytes("reduce_scatter"))
    rec.agree("mlp.sp.wire_bytes", "bytes", formula=f_sp["wire_bytes"], ledger=led_sp.wire_bytes())
    regather = f_sp["wire_bytes"] - f_sp["all_reduce_wire_bytes"]  # the backward re-gather of the s/p shard
    rec.check("mlp.sp.wire_is_all_reduce_plus_regather",
              abs(led_sp.wire_bytes() - (ledger_fb.wire_bytes() + regather)) < 1e-6,
              f"{led_sp.wire_bytes()} vs {ledger_fb.wire_bytes()} + {regather}")
    vtp.ledger_timeline(led_sp, "sequence-parallel MLP: all-gather / reduce-scatter").show()
else:
    print(f"seq={seq} is not divisible by tp={tp}: sequence parallelism skipped")

# %% [markdown]
# ### Explore
# Move the sliders: the formula is recomputed and the small config re-runs in a `SimulatedWorld`; the status line
# compares formula and ledger. An impossible split (ffn = 4·hidden not divisible by tp) is reported, not raised.

# %%
ui, update = vtp.explorer("mlp", tp=min(tp, 4), batch=batch, seq=min(seq, 16), hidden=min(hidden, 32))
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("mlp.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("mlp.explorer.rejects_bad_split", not update(tp=3, hidden=16)["ok"], "ffn=64 over tp=3 is reported")
update(tp=min(tp, 4), hidden=min(hidden, 32))
ui

# %% [markdown]
# ## Exercises
# 1. GPT-3 175B has h = 12288. With b = 1, s = 2048 in bf16 and tp = 8, how many bytes does each rank hand to the
#    MLP's forward all-reduce?
# 2. If the input does not need a gradient (the first layer after a frozen embedding), how many all-reduces does one
#    MLP step issue?
# 3. Why is the GeLU applied *before* the all-reduce and not after, and what would splitting A by rows instead cost?
#
# <details><summary>Answers (asserted below)</summary>
#
# 1. 1·2048·12288·2 = 50,331,648 bytes (48 MiB). 2. One — f's backward all-reduce only exists for an input gradient.
# 3. GeLU is elementwise on column blocks, so each device can apply it to its own $XA_i$. Splitting A by rows would
#    leave partial sums of $XA$ — and GeLU(sum) ≠ sum of GeLUs — so an all-reduce would be needed *before* GeLU,
#    i.e. two per MLP forward (the paper's argument, §3).
# </details>

# %%
assert ftp.mlp_all_reduce(1, 2048, 12288, 8, "bf16")["bytes"] == 1 * 2048 * 12288 * 2 == 50_331_648
assert ftp.mlp_all_reduce(1, 2048, 12288, 8, "bf16", backward=True, input_requires_grad=False)["count"] == 1
_xs = torch.randn(4, 6, dtype=torch.float64)
assert not torch.allclose(torch.nn.functional.gelu(_xs[:, :3] + _xs[:, 3:]),
                          torch.nn.functional.gelu(_xs[:, :3]) + torch.nn.functional.gelu(_xs[:, 3:]))
rec.close()["status"]
