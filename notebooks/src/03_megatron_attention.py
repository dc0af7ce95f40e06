# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
tp = 4  # tensor-parallel degree (ranks in the ledger, size of the `tensor` mesh axis)
batch = 2
seq = 8
hidden = 64
ffn = 256  # used by the transformer-layer section (attention + MLP)
heads = 8
vocab = 1000  # unused here (notebook 04)
dtype = "float32"  # "float32" or "bfloat16"

# %% [markdown]
# # 03 · Megatron attention: heads split over devices — again one all-reduce each way
#
# Self-attention is embarrassingly parallel over heads. Megatron (Shoeybi et al. 2019, §3, Fig. 3b) gives device
# $i$ the heads $[i\cdot n_h/p, (i+1)\cdot n_h/p)$: the Q, K and V projections are **column-parallel** (each
# device holds the columns of its heads, $W_Q[H, (N\,D)_X]$), the attention core runs on local heads only, and the
# output projection is **row-parallel** ($W_O[(N\,D)_X, H]$), leaving a partial sum `Z{U_X}` that **one
# all-reduce** (g) completes. As in the MLP, one f before (copy forward, all-reduce backward) and one g after.
# Q, K and V share **one** f: Megatron fuses them into one column-parallel linear, so the input gradient is one
# sum and one all-reduce, not three.
#
# Requirement: `heads` divisible by `tp` (whole heads per device).

# %%
import torch

from shardlab import models, runtime
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import dtype_bytes
from shardlab.profile import Recorder, agree_payload, capture_hlo
from shardlab.tp.params import check_tp_params

check_tp_params(num_devices=num_devices, tp=tp, batch=batch, seq=seq, hidden=hidden, ffn=ffn, heads=heads,
                vocab=vocab, dtype=dtype, divisible=("heads", "ffn"))
if hidden % heads:
    raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")

world = runtime.setup(num_devices=num_devices)
rec = Recorder("03_megatron_attention", params=dict(num_devices=num_devices, seed=seed, tp=tp, batch=batch, seq=seq,
                                                     hidden=hidden, ffn=ffn, heads=heads, vocab=vocab, dtype=dtype),
               results_dir=results_dir, world=world)
tdtype = getattr(torch, dtype)
e = dtype_bytes(dtype)
tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=5e-2, atol=5e-2)
torch.manual_seed(seed)
world

# %% [markdown]
# ## 1 · The formula
# Same pattern as the MLP: forward 1 all-reduce of [b, s, h], backward 1 more when the input needs a gradient.
# Nothing depends on the number of heads or on s² — the attention matrix never leaves its device.


# %%
def attention_comm(b, s, h, p, e, backward):
    """Megatron attention all-reduces: (count, payload bytes per rank)."""
    n = (1 + int(backward)) if p > 1 else 0
    return n, n * b * s * h * e


f_fwd = ftp.attention_all_reduce(batch, seq, hidden, tp, dtype)
f_fb = ftp.attention_all_reduce(batch, seq, hidden, tp, dtype, backward=True)
assert (f_fwd["count"], f_fwd["bytes"]) == attention_comm(batch, seq, hidden, tp, e, False)
assert (f_fb["count"], f_fb["bytes"]) == attention_comm(batch, seq, hidden, tp, e, True)
print(f"forward: {f_fwd}   forward+backward: {f_fb}")

# %% [markdown]
# ## 2 · The split, drawn
# Columns of $W_Q, W_K, W_V$ grouped by head: device $i$ owns whole heads. $W_O$ is split by the matching rows.

# %%
from shardlab.viz import tp as vtp

vtp.ownership_figure(vtp.attention_panels(min(hidden, 64), heads, tp), tp,
                     f"attention weights, {heads} heads over tp={tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank Megatron code
# `ParallelAttention.from_dense` stacks rank $r$'s rows of $W_Q, W_K, W_V$ into one fused column-parallel weight
# $[q_r; k_r; v_r]$ of shape [3h/p, h] and keeps columns of $W_O$. Causal attention on $n_h/p$ local heads.

# %%
from shardlab.comm import SimulatedWorld
from shardlab.tp.programs import attention_step

dense = models.Attention(hidden, heads).to(tdtype)
x = torch.randn(batch, seq, hidden, dtype=tdtype)
grad_out = torch.randn(batch, seq, hidden, dtype=tdtype)

sim = SimulatedWorld(tp)
sim.run(attention_step, dense, x)
ledger_fwd = sim.ledger
ranks = sim.run(attention_step, dense, x, grad_out)
ledger_fb = sim.ledger

xr = x.clone().requires_grad_(True)
out = dense(xr)
(out * grad_out).sum().backward()
c = hidden // tp
ok_w = True
for i, r in enumerate(ranks):
    cols = slice(i * c, (i + 1) * c)
    want_qkv = torch.cat([getattr(dense, n).weight.grad[cols] for n in "qkv"])
    ok_w &= torch.allclose(r["grads"]["qkv.weight"].float(), want_qkv.float(), **tol)
    ok_w &= torch.allclose(r["grads"]["out.weight"].float(), dense.out.weight.grad[:, cols].float(), **tol)
rec.check("attention.parity.output", all(torch.allclose(r["out"].float(), out.detach().float(), **tol) for r in ranks),
          "every rank's output == dense output")
rec.check("attention.parity.grad_input",
          all(torch.allclose(r["grad_x"].float(), xr.grad.float(), **tol) for r in ranks), "input gradient == dense")
rec.check("attention.parity.grad_weights", bool(ok_w), "rank i's Q/K/V/O gradients == dense slices of its heads")
vtp.ledger_frame(ledger_fb)

# %%
vtp.ledger_timeline(ledger_fb, f"attention forward + backward, tp={tp}").show()

# %% [markdown]
# ## 4 · The compiler: GSPMD on the dense module
# `shard_attention` annotates $W_Q, W_K, W_V$ by output rows `("tensor", None)` and $W_O$ by input columns
# `(None, "tensor")`. Two details of the dense `models.Attention` matter to the partitioner (measured on
# torch_xla 2.9): Q/K/V come from **one** einsum over the stacked weights — three separate projections gave three
# backward all-reduces of the input gradient — and the attention core keeps (b, heads) as separate batch dims
# (`@` merges them into one dim that cannot be heads-sharded, and the partitioner then all-gathered q, k, v).

# %%
from shardlab.tp import gspmd

dev = runtime.device()
mesh = gspmd.tensor_mesh(tp)
xattn = models.Attention(hidden, heads)
xattn.load_state_dict(dense.float().state_dict())
dense = dense.to(tdtype)
xattn = gspmd.shard_attention(xattn.to(tdtype).to(dev), mesh)
xd, god = x.to(dev), grad_out.to(dev)
cap_fwd = capture_hlo(gspmd.step, xattn, xd)
cap_fb = capture_hlo(gspmd.step, xattn, xd, god)
for label, cap in (("forward", cap_fwd), ("forward+backward", cap_fb)):
    print(label, [c.as_dict() for c in cap.module.collectives])
rec.check("attention.parity.xla_output",
          torch.allclose(cap_fb.result[0].cpu().float(), out.detach().float(), **tol), "GSPMD output == dense")
rec.check("attention.parity.xla_grad_input",
          torch.allclose(cap_fb.result[1].cpu().float(), xr.grad.float(), **tol), "GSPMD input gradient == dense")

# %% [markdown]
# ## 5 · Three ways, one number

# %%
for phase, f, led, cap in (("fwd", f_fwd, ledger_fwd, cap_fwd), ("fwd_bwd", f_fb, ledger_fb, cap_fb)):
    rec.agree(f"attention.{phase}.all_reduce.count", "count", formula=f["count"], ledger=led.count("all_reduce"),
              hlo=cap.module.count("all-reduce"))
    agree_payload(rec, f"attention.{phase}.all_reduce.bytes", f["bytes"], led.payload_bytes("all_reduce"),
                        cap.module, "all-reduce", dtype)  # bf16 on CPU: XLA reduces in f32 -> elements
rec.check("attention.hlo.no_all_gather", cap_fb.module.count("all-gather") == 0,
          "heads stay sharded: no q/k/v all-gather")
rec.measure("attention.fwd_bwd.compile_s", cap_fb.metrics.compile_s, "s", "metrics", kind="timing")
rec.table("attention.")

# %% [markdown]
# **Interpretation.** Attention costs the same communication as the MLP: the all-reduce moves the output
# activation, never the s×s scores nor the K/V of other heads. A full transformer layer is therefore
# attention + MLP = **2 all-reduces forward and 2 backward**, volume $4\,b\,s\,h$ elements per step per layer —
# the ledger of one layer (without LayerNorm, which runs replicated) shows it:

# %%
from shardlab.tp.programs import mlp_step

dense_mlp = models.MLP(hidden, ffn).to(tdtype)


def layer_step(comm):
    a = attention_step(comm, dense, x, grad_out)
    return mlp_step(comm, dense_mlp, a["out"], grad_out)


sim.run(layer_step)
f_layer = ftp.transformer_layer_all_reduce(batch, seq, hidden, tp, dtype)
rec.agree("layer.fwd_bwd.all_reduce.count", "count", formula=f_layer["count"], ledger=sim.ledger.count("all_reduce"))
rec.agree("layer.fwd_bwd.all_reduce.bytes", "bytes", formula=f_layer["bytes"], ledger=sim.ledger.payload_bytes())
vtp.ledger_timeline(sim.ledger, "attention then MLP (each with its own backward): 2 + 2 all-reduces").show()

# %% [markdown]
# ### Explore
# Move the sliders (tp, batch, seq, hidden, heads): formula and ledger of the small config are recomputed. Heads
# not divisible by tp, or hidden not divisible by heads, are reported, not raised.

# %%
ui, update = vtp.explorer("attention", tp=min(tp, 4), batch=batch, seq=min(seq, 16), hidden=min(hidden, 32),
                          heads=min(heads, 8) if min(hidden, 32) % min(heads, 8) == 0 else 4)
shown = update()
rec.check("attention.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("attention.explorer.rejects_bad_heads", not update(tp=4, heads=6, hidden=24)["ok"],
          "heads=6 over tp=4 is reported")
update(tp=min(tp, 4), heads=4, hidden=min(hidden, 32))
ui

# %% [markdown]
# ## Exercises
# 1. A model with 12 heads: which tensor-parallel degrees from {1, 2, 3, 4, 6, 8, 12} can this layer use?
# 2. With b = 8, s = 1024, h = 4096 in bf16, what is one layer's all-reduce volume per step (forward + backward)?
# 3. If Q, K and V were three *independent* column-parallel layers each with its own f, how many all-reduces would
#    one attention forward + backward issue?
#
# <details><summary>Answers (asserted below)</summary>
#
# 1. The divisors of 12: 1, 2, 3, 4, 6, 12 (not 8). 2. 4·8·1024·4096·2 = 268,435,456 bytes (256 MiB).
# 3. 1 forward (g) + 3 backward (one per f) = 4 — which is why Megatron fuses QKV (and why the GSPMD version needs
#    the stacked einsum).
# </details>

# %%
assert [p for p in (1, 2, 3, 4, 6, 8, 12) if 12 % p == 0] == [1, 2, 3, 4, 6, 12]
assert ftp.transformer_layer_all_reduce(8, 1024, 4096, 8, "bf16")["bytes"] == 4 * 8 * 1024 * 4096 * 2 == 268_435_456
assert 1 + 3 == 4
rec.close()["status"]
