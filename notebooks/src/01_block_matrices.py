# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
m = 16  # x is m×k
k = 64  # inner dimension
n = 32  # W is k×n
parts = 4  # blocks in the CPU algebra section
dtype = "float32"  # "float32" or "bfloat16" for the XLA section

# %% [markdown]
# # 01 · Block matrices: the two rules every sharding scheme is made of
#
# Every tensor-parallel layer, every FSDP all-gather and every GSPMD decision in this suite reduces to two
# facts about a product $Y = xW$ with $x$ of shape $m\times k$ and $W$ of shape $k\times n$:
#
# 1. **Split W by columns** — $W = [W_1 \dots W_p]$ (`W[K, N_X]`): $Y = [xW_1 \dots xW_p]$. Each device computes a
#    column block of $Y$ on its own; the blocks are *concatenated*. **No communication.**
# 2. **Split W by rows and x by columns** — $W = [W_1; \dots; W_p]$, $x = [x_1 \dots x_p]$ (`x[M, K_X]`,
#    `W[K_X, N]`): $Y = \sum_i x_i W_i$. Each device holds a full-size *partial sum* `Y{U_X}`; the partial sums
#    must be *added*: **one all-reduce of m·n elements per device.**
#
# We check each rule three ways — the **formula** (this algebra), the **ledger** (per-rank code that calls the
# collective itself, in `SimulatedWorld`) and the **compiler** (the collectives in the HLO that XLA's SPMD
# partitioner emitted for `mark_sharding` annotations) — and the notebook fails if they disagree.

# %%
import torch

from shardlab import blocks, runtime
from shardlab.dtypes import hlo_name
from shardlab.formulas import blocks as F
from shardlab.formulas.common import dtype_bytes, reduction_dtype
from shardlab.profile import Recorder, capture_hlo

# Validate every parameter before any XLA work (errors name the parameter and the rule).
for _name, _v in {"m": m, "k": k, "n": n, "parts": parts, "num_devices": num_devices}.items():
    if not isinstance(_v, int) or _v < 1:
        raise ValueError(f"{_name}={_v!r} must be a positive int")
if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={dtype!r} must be 'float32' or 'bfloat16'")
blocks.split_sizes(k, parts, "k")  # parts may not exceed k or n
blocks.split_sizes(n, parts, "n")
for _name, _v in {"k": k, "n": n}.items():
    if _v % num_devices:
        raise ValueError(f"{_name}={_v} is not divisible by num_devices={num_devices} (the 1-D mesh shards it evenly)")
grid_cols = num_devices // 2 if num_devices >= 2 else 1
if num_devices >= 2 and (num_devices % 2 or m % 2 or k % grid_cols):
    raise ValueError(f"the 2-D mesh (2, {grid_cols}) needs an even num_devices={num_devices}, m={m} divisible by 2 "
                     f"and k={k} divisible by {grid_cols}")

world = runtime.setup(num_devices=num_devices)
rec = Recorder("01_block_matrices", params=dict(num_devices=num_devices, seed=seed, m=m, k=k, n=n, parts=parts,
                                                dtype=dtype), results_dir=results_dir, world=world)
torch.manual_seed(seed)
world

# %% [markdown]
# ## 1 · The algebra on the CPU
# `shardlab.blocks` splits the operands, forms every per-block product and combines them. Uneven splits follow
# one rule (`numpy.array_split`: the first `n mod p` blocks get one extra row). The check is against the
# dense product in float64, so "equal" means equal up to rounding.

# %%
x64 = torch.randn(m, k, dtype=torch.float64)
w64 = torch.randn(k, n, dtype=torch.float64)
col = blocks.column_parallel(x64, w64, parts)
row = blocks.row_parallel(x64, w64, parts)
print("column split: pieces", [tuple(p.shape) for p in col.pieces[0]], "-> concatenated to", tuple(col.result.shape))
print("row split:    partials", [tuple(p.shape) for p in row.partials[0][0]], "-> summed to", tuple(row.result.shape))
err_col = float((col.result - x64 @ w64).abs().max())
err_row = float((row.result - x64 @ w64).abs().max())
rec.check("blocks.algebra.column_equals_dense", err_col < 1e-10, f"max abs err {err_col:.1e}")
rec.check("blocks.algebra.row_equals_dense", err_row < 1e-10, f"max abs err {err_row:.1e}")

# %%
from shardlab.viz import blocks as vb

vb.split_figure(m, k, n, parts, "column").show()
vb.split_figure(m, k, n, parts, "row").show()

# %% [markdown]
# ### Explore
# Move the sliders: the picture is redrawn and the blocked product is recomputed against the dense one. An
# impossible split (more parts than columns, an odd grid) is reported, not raised.

# %%
ui, update = vb.explorer(m=min(m, 32), k=min(k, 32), n=min(n, 32), parts=min(parts, 8), kind="row")
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("blocks.explorer.update", shown["ok"], f"max abs err {shown.get('max_abs_err')}")
rec.check("blocks.explorer.rejects_bad_split", not update(parts=33, k=8)["ok"], "parts > k is reported")
update(parts=min(parts, 8), k=min(k, 32))
ui

# %% [markdown]
# ## 2 · The ledger: per-rank code that calls the collective itself
# Rank `r` holds only its blocks. In the row rule it computes its partial sum and calls `all_reduce`; in the
# column rule it never talks to anyone. `SimulatedWorld` runs the same function on `parts` ranks in this process
# and records every collective.

# %%
from shardlab.comm import SimulatedWorld

b = dtype_bytes("float32")  # the ledger runs in float32 on the CPU
x32, w32 = x64.float(), w64.float()


def row_rank(comm):
    xs = blocks.split_cols(x32, comm.world_size)[comm.rank]  # [m, k_r]
    ws = blocks.split_rows(w32, comm.world_size)[comm.rank]  # [k_r, n]
    return comm.all_reduce(xs @ ws)  # [m, n] partial -> sum


def col_rank(comm):
    ws = blocks.split_cols(w32, comm.world_size)[comm.rank]  # [k, n_r]
    return x32 @ ws  # [m, n_r]: this rank's column block of Y


sim = SimulatedWorld(parts)
y_row = sim.run(row_rank)
ledger_row = sim.ledger
y_col = sim.run(col_rank)
ledger_col = sim.ledger
rec.check("blocks.ledger.row_equals_dense", all(torch.allclose(y, x32 @ w32, atol=1e-4) for y in y_row), "every rank")
rec.check("blocks.ledger.col_equals_dense", torch.allclose(torch.cat(y_col, 1), x32 @ w32, atol=1e-4), "concat")
ledger_row.summary()

# %% [markdown]
# ## 3 · The compiler: the same products as GSPMD annotations on XLA
# Now the real thing: tensors live on a mesh of `num_devices` XLA devices, `mark_sharding` says how each operand
# is split, and XLA's SPMD partitioner decides what to communicate. We read its per-device program from the HLO
# dump: every collective, its shape on one device and its bytes.

# %%
import torch_xla.distributed.spmd as xs

tdtype = getattr(torch, dtype)
# XLA:CPU has no bf16 arithmetic: it promotes a bf16 dot and the all-reduce of its partial sums to f32.
wire_dtype = reduction_dtype(dtype, world.kind)
eb = dtype_bytes(wire_dtype)
dev = runtime.device()
mesh1 = runtime.mesh(num_devices, "model")


def on_xla(t, mesh, spec):
    t = t.to(tdtype).to(dev)  # create on the CPU, then move, then annotate (xla-notes.md)
    xs.mark_sharding(t, mesh, spec)
    return t


# column rule: x replicated, W[K, N_model]
xc, wc = x32.to(tdtype).to(dev), on_xla(w32, mesh1, (None, "model"))
cap_col = capture_hlo(lambda: xc @ wc)
# row rule: x[M, K_model], W[K_model, N]
xr, wr = on_xla(x32, mesh1, (None, "model")), on_xla(w32, mesh1, ("model", None))
cap_row = capture_hlo(lambda: xr @ wr)
for label, cap in (("column", cap_col), ("row", cap_row)):
    print(f"{label}: {[c.as_dict() for c in cap.module.collectives]}")

# %%
tol = 1e-3 if dtype == "float32" else 5e-2  # sharded sums add in a different order: approximate
ref = (x32.to(tdtype) @ w32.to(tdtype)).float()
rec.check("blocks.xla.col_equals_dense", torch.allclose(cap_col.result.cpu().float(), ref, rtol=tol, atol=tol * k),
          "Y from the column-sharded product")
rec.check("blocks.xla.row_equals_dense", torch.allclose(cap_row.result.cpu().float(), ref, rtol=tol, atol=tol * k),
          "Y from the row-sharded product")

# %% [markdown]
# ### The 2-D mesh
# On a `(2, num_devices/2)` mesh with axes `(r, c)`: `x[M_r, K_c]`, `W[K_c, N]`. Each device multiplies its
# $(m/2)\times(k/p_c)$ block of x by its $(k/p_c)\times n$ block of W. The sum runs over `c` only, so XLA needs one
# all-reduce inside each group of $p_c$ devices, of $(m/2)\cdot n$ elements per device — half of the 1-D row rule.

# %%
if num_devices >= 2:
    mesh2 = runtime.mesh((2, grid_cols), ("r", "c"))
    xg, wg = on_xla(x32, mesh2, ("r", "c")), on_xla(w32, mesh2, ("c", None))
    cap_grid = capture_hlo(lambda: xg @ wg)
    grid_hlo = cap_grid.module.collectives
    print([c.as_dict() for c in grid_hlo])
    rec.check("blocks.xla.grid_equals_dense",
              torch.allclose(cap_grid.result.cpu().float(), ref, rtol=tol, atol=tol * k), "Y from the 2-D product")
    rec.check("blocks.grid.groups", all(len(g) == grid_cols for c in grid_hlo for g in c.replica_groups),
              f"replica groups of size p_c={grid_cols}")

# %% [markdown]
# ## 4 · Three ways, one number
# Bytes are the *payload per device* (design.md): what one device hands to the collective.

# %%
rec.agree("blocks.col.collective.count", "count", formula=F.col_split_collectives(),
          ledger=len(ledger_col), hlo=cap_col.module.count("any"))
rec.check("blocks.row.all_reduce.dtype", all(c.dtype == hlo_name(wire_dtype)
                                             for c in cap_row.module.collectives),
          f"predicted {wire_dtype} on {world.kind}, HLO {[c.dtype for c in cap_row.module.collectives]}")
fr = F.row_split_all_reduce(m, n, wire_dtype)
rec.agree("blocks.row.all_reduce.count", "count", formula=fr["count"], ledger=ledger_row.count("all_reduce"),
          hlo=cap_row.module.count("all-reduce"))
rec.agree("blocks.row.all_reduce.bytes", "bytes", formula=fr["bytes"],
          ledger=ledger_row.payload_bytes("all_reduce") * eb // b, hlo=cap_row.module.bytes("all-reduce"))
if num_devices >= 2:
    fg = F.grid_all_reduce(m, n, (2, grid_cols), wire_dtype)
    rec.agree("blocks.grid.collective.bytes", "bytes", formula=fg["bytes"], hlo=cap_grid.module.bytes("any"))
for name, cap in (("col", cap_col), ("row", cap_row)):
    rec.measure(f"blocks.{name}.compile_s", cap.metrics.compile_s, "s", "metrics", kind="timing")
rec.table("blocks.")

# %% [markdown]
# The ledger runs in float32, so its bytes are scaled by the element size of the HLO's collective: the *count of
# elements* is what the per-rank code decides; the element size is a property of the tensors.
#
# **bfloat16 on the CPU.** Run this notebook with `dtype="bfloat16"` and the all-reduce still carries f32: XLA:CPU
# has no bf16 arithmetic, so its float-normalization pass computes the dot in f32 and all-reduces the f32 partial
# sums (`to_apply=%add.clone_promoted` in the HLO), converting back to bf16 afterwards. On a TPU the same program
# reduces in bf16 and moves half the bytes. The formula takes the element type the platform reduces in
# (`reduction_dtype`), and the notebook checks that prediction against the dtype printed in the HLO.
#
# **Interpretation.** The column rule is free because nothing is summed; the row rule pays one all-reduce of the
# *output* size, independent of k. That is why Megatron pairs them (notebook 02): a column-parallel layer leaves
# its output split by columns, which is exactly the row-parallel layer's input split — one all-reduce per pair.

# %% [markdown]
# ## Exercises
# 1. With m = 16, n = 32 in float32, how many bytes does each device hand to the row rule's all-reduce?
# 2. On the 2-D mesh (2, 4), how large is each replica group, and how many groups are there?
# 3. Why does the column rule need no collective even though x is used by every device?
#
# <details><summary>Answers (asserted below)</summary>
#
# 1. 16·32·4 = 2048 bytes. 2. Groups of 4 devices (the `c` axis), 2 groups. 3. x is replicated: every device
#    already has all of it, and each output column block depends only on its own W block.
# </details>

# %%
assert F.row_split_all_reduce(16, 32, "float32")["bytes"] == 16 * 32 * 4 == 2048
assert F.grid_all_reduce(16, 32, (2, 4))["group_size"] == 4
if num_devices == 8:
    assert len(cap_grid.module.collectives[0].replica_groups) == 2
rec.close()["status"]
