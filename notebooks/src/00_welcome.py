# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); a kernel holds one device world
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
n = 1024  # length of the vector summed in the three-views example

# %% [markdown]
# # 00 · Welcome to shardlab
#
# shardlab teaches **and measures** how large models are split across accelerators, on PyTorch/XLA. Every
# notebook answers a question with a number measured three ways that must agree:
#
# | view | what it is | where |
# |---|---|---|
# | **formula** | the paper's algebra (Megatron, ZeRO, Korthikanti et al.) as plain functions | `shardlab.formulas` |
# | **ledger** | our own per-rank code, written Megatron-style (each rank holds its shard and calls collectives), run in an in-process `SimulatedWorld` that records every collective | `shardlab.comm`, `tp`, `fsdp` |
# | **compiler** | the same math as GSPMD `mark_sharding` annotations; collectives and buffers read from the HLO that XLA's SPMD partitioner produced | `shardlab.profile` |
#
# When the three disagree the notebook fails — loudly, with both numbers.
#
# ## The notebooks
# | # | topic |
# |---|---|
# | 01 | block matrices: split by columns → concatenate; by rows → sum |
# | 02 | Megatron MLP: column- then row-parallel, the `f` / `g` operators |
# | 03 | Megatron attention: heads split over devices |
# | 04 | vocab-parallel embedding and cross-entropy |
# | 05 | FSDP flat parameters, exactly as PyTorch shards them; ZeRO memory |
# | 06 | `scan` over layers, 2-D sharding, `shard_as` (the 405B OOM in miniature), placeholder tensors |
# | 07 | planner: from 8 CPU devices to a TPU pod |
#
# ## Notation (used everywhere)
# - Shapes: `b` batch, `s` sequence, `h` hidden, `f` FFN width, `a` heads, `v` vocabulary, `L` layers,
#   `t` tensor-parallel degree, `W` or `p` devices in a group, `Ψ` parameters.
# - `A[I_X, J_Y]`: tensor A with its first dimension split over mesh axis X and its second over Y;
#   an axis not named is replicated. `A[I, J_X]` is "split by columns over X".
# - `A{U_X}`: A holds *unreduced partial sums* over X — each device has a full-size piece that must still be
#   added across X (an all-reduce, or a reduce-scatter if the result may stay split).
# - Bytes are **payload per device**: what one device hands to a collective (all-reduce: its input; all-gather:
#   its shard; reduce-scatter: its full input). The ring model turns payload into bytes sent per device:
#   all-reduce 2(W−1)/W·payload, all-gather (W−1)·payload, reduce-scatter (W−1)/W·payload.
#
# ## Running on a TPU (Kaggle, Colab, Cloud TPU VMs)
# The cell right after the parameters cell installs the pinned `torch==2.9.0`, `torch_xla[tpu]==2.9.0` and the
# JAX pins `shard_as` needs when it runs on Colab or Kaggle, and sets `PJRT_DEVICE=TPU`; on your own machine it
# does nothing. Kaggle's v5e-8 is the free multi-chip option; free Colab gives one TPU chip (set
# `num_devices = 1` there, or use `None` for "all chips"). Timings are always labelled with their device; only
# structural numbers (collectives, bytes, shapes) are comparable across devices.

# %%
import torch

from shardlab import runtime
from shardlab.formulas.common import dtype_bytes, wire_bytes
from shardlab.profile import Recorder, capture_hlo

if not isinstance(n, int) or n < 1:
    raise ValueError(f"n={n!r} must be a positive int")
if isinstance(num_devices, int) and n % num_devices:
    raise ValueError(f"n={n} is not divisible by num_devices={num_devices} (the vector is split evenly)")

world = runtime.setup(num_devices=num_devices)  # env vars, then torch_xla, then SPMD on
rec = Recorder("00_welcome", params=dict(num_devices=num_devices, seed=seed, n=n), results_dir=results_dir,
               world=world)
torch.manual_seed(seed)
print(world)

# %% [markdown]
# ## The device world
# `runtime.setup` must run before anything imports `torch_xla`: it sets `PJRT_DEVICE`, `CPU_NUM_DEVICES` and an
# HLO dump directory, then switches SPMD on. Under SPMD all devices appear as **one** logical XLA device; a
# `Mesh` gives them names, and `mark_sharding` says how a tensor is split over the mesh axes.

# %%
import torch_xla.distributed.spmd as xs

mesh = runtime.mesh((2, num_devices // 2), ("data", "model")) if num_devices % 2 == 0 and num_devices > 1 \
    else runtime.mesh(num_devices, "model")
t = torch.arange(8 * 8, dtype=torch.float32).reshape(8, 8).to(runtime.device())
spec = ("data", "model") if len(mesh.shape()) == 2 else (None, "model")
st = xs.mark_sharding(t, mesh, spec)
print("mesh:", mesh.shape(), " spec:", spec)
print("sharding annotation:", __import__("torch_xla")._XLAC._get_xla_sharding_spec(t))
for shard in st.local_shards[:4]:
    print(f"{shard.shard_device}: indices {shard.indices} -> shard shape {tuple(shard.data.shape)}")

# %%
from shardlab.viz.common import device_color

try:
    import plotly.graph_objects as go

    shape = list(mesh.shape().values()) if len(mesh.shape()) == 2 else [1, num_devices]
    fig = go.Figure()
    for d in range(num_devices):
        r, c = divmod(d, shape[1])
        fig.add_shape(type="rect", x0=c, x1=c + 0.95, y0=-r, y1=-r + 0.95, fillcolor=device_color(d), line_width=0)
        fig.add_annotation(x=c + 0.47, y=-r + 0.47, text=f"device {d}", showarrow=False, font_color="white")
    fig.update_xaxes(visible=False, range=[0, shape[1]])
    fig.update_yaxes(visible=False, range=[-shape[0] + 1, 1])
    fig.update_layout(height=160 + 60 * shape[0], title=f"the mesh {mesh.shape()}: one colour per device, "
                      "in every notebook", margin={"t": 50, "b": 10, "l": 10, "r": 10})
    fig.show()
except ImportError as e:  # plotly is a pinned dependency; this only guards a broken install
    print("plotly unavailable:", e)

# %% [markdown]
# ## Three views of one collective
# The simplest reduction: every device holds a **full-length** vector of `n` partial values and we add them up
# across devices — exactly what the row rule of notebook 01 produces. Three views:
#
# - **formula**: one all-reduce, payload n·4 bytes per device;
# - **ledger**: per-rank code `comm.all_reduce(x_r)` in a `SimulatedWorld`;
# - **compiler**: `x` of shape `[num_devices, n]` sharded by rows, `x.sum(0)` — XLA sums locally, then
#   all-reduces the `[n]` partials.

# %%
from shardlab.comm import SimulatedWorld

parts = torch.randn(num_devices, n)
sim = SimulatedWorld(num_devices)
ledger_out = sim.run(lambda comm: comm.all_reduce(parts[comm.rank]))
print(sim.ledger.summary())

xla_parts = parts.to(runtime.device())
xs.mark_sharding(xla_parts, runtime.mesh(num_devices, "d"), ("d", None))
cap = capture_hlo(lambda: xla_parts.sum(0))
print([c.as_dict() for c in cap.module.collectives])

# %%
formula_bytes = n * dtype_bytes("float32")
if num_devices > 1:
    rec.agree("welcome.sum.all_reduce.count", "count", formula=1, ledger=sim.ledger.count("all_reduce"),
              hlo=cap.module.count("all-reduce"))
    rec.agree("welcome.sum.all_reduce.bytes", "bytes", formula=formula_bytes,
              ledger=sim.ledger.payload_bytes("all_reduce"), hlo=cap.module.bytes("all-reduce"))
    rec.agree("welcome.sum.all_reduce.wire_bytes", "bytes", formula=wire_bytes("all_reduce", formula_bytes,
                                                                              num_devices),
              ledger=sim.ledger.wire_bytes("all_reduce"))
ref = parts.sum(0)
rec.check("welcome.sum.values", all(torch.allclose(o, ref, atol=1e-4) for o in ledger_out)
          and torch.allclose(cap.result.cpu(), ref, atol=1e-4), "ledger and XLA both equal the dense sum")
rec.table("welcome.")

# %% [markdown]
# **Reading the table.** Each row is one quantity; each column one way of getting it. `agree` is checked, not
# eyeballed: the notebook raises if it is False. Bytes in the HLO come from the per-device program, so they are
# per-device numbers, like the ledger's payload.
#
# ## Exercises
# 1. With 8 devices and n = 1024 float32 values, how many bytes does each device *send* in a ring all-reduce?
# 2. The same data as an all-gather of 128-element shards: payload and bytes sent per device?
#
# <details><summary>Answers (asserted below)</summary>
#
# 1. payload 4096 B; ring: 2·7/8·4096 = 7168 B. 2. payload 512 B; ring: 7·512 = 3584 B — half of the
#    all-reduce, because an all-reduce is a reduce-scatter followed by an all-gather.
# </details>

# %%
assert wire_bytes("all_reduce", 1024 * 4, 8) == 7168
assert wire_bytes("all_gather", 128 * 4, 8) == 3584 == wire_bytes("all_reduce", 1024 * 4, 8) / 2
rec.close()["status"]
