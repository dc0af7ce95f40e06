# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips); needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0
tp = 8  # tensor-parallel degree (ranks in the ledger, size of the `tensor` mesh axis)
batch = 1
seq = 8
hidden = 64
ffn = 256  # unused here (notebook 02)
heads = 8  # unused here (notebook 03)
vocab = 50257  # GPT-2's vocabulary: NOT divisible by 8 (50257 = 8 * 6282 + 1)
dtype = "float32"  # "float32" or "bfloat16"
label_smoothing = 0.1  # for the parity section (torch's global definition)

# %% [markdown]
# # 04 · Vocab-parallel embedding and cross-entropy: never move the logits
#
# The largest matrices of a language model are often the embedding table $E$ [V, h] and the logits [b, s, V]
# (V = 50257 for GPT-2, ~128k for Llama 3). Megatron (Shoeybi et al. 2019, §3) splits the **vocabulary**:
#
# - **Embedding** — device $i$ holds rows $E[V_X, H]$, a contiguous range of token ids (`vocab_range`). Each
#   device looks up the ids it owns, writes zeros for the others, and **one all-reduce** of [b, s, h] sums the
#   rows — exactly one device contributes each token.
# - **Output layer + cross-entropy** — the tied output layer gives each device the logits of its vocab range,
#   [b, s, V/p]. Gathering them would move $b\cdot s\cdot V/p$ values per device. Instead, the loss is built from
#   reductions over the vocab: the **max** (for stability), the **target logit**, the **sum of exponentials** —
#   each a per-token number, so three all-reduces of [b, s]: $\mathrm{loss} = \log\sum_j e^{z_j - m} - (z_t - m)$.
#   With label smoothing one more: the sum of the logits. The backward needs **no** communication.
#
# The vocabulary need not divide evenly: ranks own $\lfloor V/p\rfloor$ or $\lceil V/p\rceil$ rows.

# %%
import torch
import torch.nn.functional as F

from shardlab import runtime
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import dtype_bytes
from shardlab.profile import Recorder, agree_payload, capture_hlo, collective_elements
from shardlab.tp.params import check_tp_params

check_tp_params(num_devices=num_devices, tp=tp, batch=batch, seq=seq, hidden=hidden, ffn=ffn, heads=heads,
                vocab=vocab, dtype=dtype, divisible=())
if vocab < tp:
    raise ValueError(f"vocab={vocab} is smaller than tp={tp}: some rank would own no rows")
if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"label_smoothing={label_smoothing} is not in [0, 1]")
if tp == 1:
    raise ValueError("tp=1 communicates nothing: choose tp >= 2 to compare vocab-parallel CE with gathered logits")

world = runtime.setup(num_devices=num_devices)
rec = Recorder("04_vocab_parallel_embedding_ce",
               params=dict(num_devices=num_devices, seed=seed, tp=tp, batch=batch, seq=seq, hidden=hidden, ffn=ffn,
                           heads=heads, vocab=vocab, dtype=dtype, label_smoothing=label_smoothing),
               results_dir=results_dir, world=world)
tdtype = getattr(torch, dtype)
e = dtype_bytes(dtype)
tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=5e-2, atol=5e-2)
torch.manual_seed(seed)
world

# %% [markdown]
# ## 1 · The formulas


# %%
def shard_rows(V, p):
    """Rows per rank: the first V mod p ranks get one extra."""
    return [V // p + (1 if r < V % p else 0) for r in range(p)]


def ce_payloads(b, s, V, p, e, smoothing):
    """(vocab-parallel CE bytes, gathered-logits bytes) per rank; all-gather pads shards to ceil(V/p)."""
    return (3 + int(smoothing > 0)) * b * s * e, b * s * max(shard_rows(V, p)) * e


f_emb = ftp.embedding_all_reduce(batch, seq, hidden, tp, dtype)
f_vp = ftp.vocab_parallel_ce(batch, seq, tp, dtype)
f_ga = ftp.gathered_logits(batch, seq, vocab, tp, dtype)
f_ratio = ftp.ce_saving_ratio(vocab, tp)
assert (f_vp["bytes"], f_ga["bytes"]) == ce_payloads(batch, seq, vocab, tp, e, 0.0)
print(f"rows per rank: {shard_rows(vocab, tp)}")
print(f"embedding: {f_emb}   vocab-parallel CE: {f_vp}   gathered logits: {f_ga}   ratio {f_ratio:.1f}")

# %% [markdown]
# ## 2 · The split, drawn
# Rows of the table and columns of the logits, coloured by owner. With an uneven vocabulary the first
# `vocab % tp` devices own one row more.

# %%
from shardlab.viz import tp as vtp

vtp.ownership_figure(vtp.embedding_panels(vocab, hidden, tp), tp, f"V={vocab} over tp={tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank code
# `VocabParallelEmbedding.from_dense` keeps rows `vocab_range(V, rank, tp)`; `vocab_parallel_cross_entropy` gets
# each rank's logit columns. The oracles are `nn.Embedding` and `torch.nn.functional.cross_entropy` on the full
# logits — including label smoothing (torch's *global* definition: ε/V over the whole vocabulary; Megatron-LM's
# own implementation uses the local vocab and differs by rank at tp > 1, upstream issue 737) and `ignore_index`.

# %%
from shardlab.comm import SimulatedWorld
from shardlab.tp import vocab_range
from shardlab.tp.programs import ce_step, embedding_step

dense_emb = torch.nn.Embedding(vocab, hidden).to(tdtype)
ids = torch.randint(0, vocab, (batch, seq))
ids[0, 0], ids[0, -1] = 0, vocab - 1  # both ends of the table
grad_out = torch.randn(batch, seq, hidden, dtype=tdtype)

sim = SimulatedWorld(tp)
ranks = sim.run(embedding_step, dense_emb, ids, grad_out)
ledger_emb = sim.ledger
out = dense_emb(ids)
(out * grad_out).sum().backward()
rec.check("embedding.parity.output", all(torch.equal(r["out"], out.detach()) for r in ranks),
          "exact: one rank contributes each row, the others add zeros")
rec.check("embedding.parity.grad_weight",
          all(torch.allclose(r["grads"]["weight"], dense_emb.weight.grad[slice(*vocab_range(vocab, i, tp))], **tol)
              for i, r in enumerate(ranks)), "rank i's rows of the gradient == dense rows")

logits = (torch.randn(batch, seq, vocab) * 2).to(tdtype)
target = ids.clone()
if seq > 1:
    target[0, 1] = -100  # an ignored position
ledgers = {}
for eps in (0.0, label_smoothing):
    z = logits.clone().requires_grad_(True)
    want = F.cross_entropy(z.flatten(0, 1).float(), target.flatten(), reduction="none", label_smoothing=eps,
                           ignore_index=-100).view_as(target)
    want.sum().backward()
    for method in ("vocab_parallel", "gather"):
        res = sim.run(ce_step, logits, target, method, eps)
        ledgers[method, eps] = sim.ledger
        ok_loss = all(torch.allclose(r["loss"].float(), want.detach(), **tol) for r in res)
        ok_grad = all(torch.allclose(r["grad_logits"].float(), z.grad[..., slice(*r["range"])].float(), **tol)
                      for r in res)
        rec.check(f"ce.parity.{method}.eps{eps:g}.loss", ok_loss, "per-token loss == F.cross_entropy on every rank")
        rec.check(f"ce.parity.{method}.eps{eps:g}.grad", ok_grad, "logits gradient shard == dense gradient columns")
vtp.ledger_frame(ledgers["vocab_parallel", label_smoothing])

# %%
vtp.ledger_timeline(ledgers["vocab_parallel", label_smoothing],
                    f"vocab-parallel CE (label smoothing {label_smoothing}): [b, s] all-reduces only").show()
vtp.ledger_frame(ledgers["gather", 0.0])

# %% [markdown]
# ## 4 · The compiler: GSPMD
# The dense `nn.Embedding` with its weight annotated `("tensor", None)`; the full logits annotated
# `(None, None, "tensor")`. For the loss, two dense spellings: `vocab_parallel_ce` (max, masked target sum, sum of
# exp — reductions the partitioner can finish with [b, s] all-reduces) and `gathered_ce` (re-annotate the logits as
# replicated, then `F.cross_entropy`: an all-gather). XLA pads an uneven vocabulary to ⌈V/p⌉ rows per device.

# %%
from shardlab.tp import gspmd

dev = runtime.device()
mesh = gspmd.tensor_mesh(tp)
xemb = torch.nn.Embedding(vocab, hidden)
xemb.load_state_dict(dense_emb.float().state_dict())  # on CPU, then to the device, then annotate
dense_emb = dense_emb.to(tdtype)
xemb = gspmd.shard_embedding(xemb.to(tdtype).to(dev), mesh)
cap_emb = capture_hlo(lambda: xemb(ids.to(dev)))
xlogits = gspmd.shard_logits(logits.to(dev), mesh)
xtarget = ids.to(dev)  # no ignored positions in the GSPMD spelling
cap_vp = capture_hlo(gspmd.vocab_parallel_ce, xlogits, xtarget)
cap_ga = capture_hlo(gspmd.gathered_ce, xlogits, xtarget, mesh)
for label, cap in (("embedding", cap_emb), ("vocab-parallel CE", cap_vp), ("gathered CE", cap_ga)):
    print(label, [c.as_dict() for c in cap.module.collectives])
want_nr = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten(), reduction="none").view_as(ids)
rec.check("embedding.parity.xla_output", torch.allclose(cap_emb.result.cpu(), out.detach(), **tol), "GSPMD == dense")
rec.check("ce.parity.xla_vocab_parallel", torch.allclose(cap_vp.result.cpu().float(), want_nr, **tol), "== torch")
rec.check("ce.parity.xla_gathered", torch.allclose(cap_ga.result.cpu().float(), want_nr, **tol), "== torch")

# %% [markdown]
# ## 5 · Three ways, one number
# Bytes are the payload per rank. All-reduce: its input; all-gather: the shard (operand) — padded to ⌈V/p⌉ columns.
# With `dtype="bfloat16"` on CPU, XLA runs bf16 all-reduces in f32; `agree_payload` then reports the HLO bytes with
# that reason and compares elements instead.

# %%
led_vp, led_ga = ledgers["vocab_parallel", 0.0], ledgers["gather", 0.0]
rec.agree("embedding.fwd.all_reduce.count", "count", formula=f_emb["count"],
          ledger=ledger_emb.count("all_reduce", "forward"), hlo=cap_emb.module.count("all-reduce"))
agree_payload(rec, "embedding.fwd.all_reduce.bytes", f_emb["bytes"],
                    ledger_emb.payload_bytes("all_reduce", "forward"), cap_emb.module, "all-reduce", dtype)
rec.agree("ce.vocab_parallel.count", "count", formula=f_vp["count"], ledger=led_vp.count("all_reduce"),
          hlo=cap_vp.module.count("all-reduce"))
agree_payload(rec, "ce.vocab_parallel.bytes", f_vp["bytes"], led_vp.payload_bytes(), cap_vp.module,
                    "all-reduce", dtype)
agree_payload(rec, "ce.gather_logits.bytes", f_ga["bytes"], led_ga.payload_bytes("all_gather"), cap_ga.module,
                    "all-gather", dtype)
# the ratio in elements: dtype-independent (b, s and the element size cancel in the formula too)
rec.agree("ce.saving_ratio", "ratio", formula=f_ratio, ledger=led_ga.payload_bytes() / led_vp.payload_bytes(),
          hlo=collective_elements(cap_ga.module, "all-gather") / collective_elements(cap_vp.module,
                                                                                                "all-reduce"))
f_vps = ftp.vocab_parallel_ce(batch, seq, tp, dtype, label_smoothing)
rec.agree("ce.vocab_parallel_smoothing.bytes", "bytes", formula=f_vps["bytes"],
          ledger=ledgers["vocab_parallel", label_smoothing].payload_bytes())
rec.check("ce.vocab_parallel.no_backward_collectives",
          ledgers["vocab_parallel", label_smoothing].count(phase="backward") == 0, "the backward is local")
rec.table("")

# %% [markdown]
# **Interpretation.** The vocabulary-parallel loss moves $3\,b\,s$ numbers per rank where gathering moves
# $b\,s\,\lceil V/p\rceil$ — a saving of $\lceil V/p\rceil/3$, independent of batch and sequence. The HLO shows the
# partitioner reaching the same plan when the loss is *written* as reductions; written as "replicate, then
# `F.cross_entropy`", it all-gathers. (The HLO parser may flag the max all-reduce as feeding a dynamic-slice —
# that is the target-logit selection, not a reduce-scatter; we count all-reduces here.)
#
# ## 6 · The saving as the vocabulary grows
# The ratio grows linearly in V/p. Ledger points (small b·s, tp from the parameters) sit on the formula's line.

# %%
vocabs = sorted({1000, 8000, 32000, 50257, 128256, vocab})
ledger_ratio = {}
for V in [v for v in vocabs if v <= 60000]:
    zz = torch.randn(1, 2, V)
    tt = torch.randint(0, V, (1, 2))
    sim.run(ce_step, zz, tt, "vocab_parallel", 0.0, -100, False)
    vp_b = sim.ledger.payload_bytes()
    sim.run(ce_step, zz, tt, "gather", 0.0, -100, False)
    ledger_ratio[V] = sim.ledger.payload_bytes() / vp_b
rec.check("ce.saving_ratio.ledger_on_formula_line",
          all(abs(r - ftp.ce_saving_ratio(V, tp)) < 1e-9 * r for V, r in ledger_ratio.items()), str(ledger_ratio))
fig = vtp.saving_ratio_figure(vocabs, sorted({2, 4, 8, tp}))
fig.add_scatter(x=list(ledger_ratio), y=list(ledger_ratio.values()), mode="markers", name=f"ledger, tp={tp}",
                marker=dict(size=12, symbol="x", color="black"))
fig.show()
print(f"V={vocab}, tp={tp}: rows per rank {shard_rows(vocab, tp)}, ratio = ceil(V/p)/3 = {f_ratio:.2f}")

# %% [markdown]
# ### Explore
# Move the sliders (tp, batch, seq, hidden, vocab): the embedding + CE ledger of a small config is recomputed and
# compared with the formula, and the gathered-logits bytes are shown for contrast.

# %%
ui, update = vtp.explorer("embedding_ce", tp=min(tp, 4), batch=batch, seq=min(seq, 8), hidden=min(hidden, 32),
                          vocab=min(vocab, 1003))
shown = update()
rec.check("embedding_ce.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("embedding_ce.explorer.rejects_tiny_vocab", not update(tp=8, vocab=4)["ok"], "vocab=4 < tp=8 is reported")
update(tp=min(tp, 4), vocab=min(vocab, 1003))
ui

# %% [markdown]
# ## Exercises
# 1. Llama 3 has V = 128256. With tp = 8, b·s = 8192 tokens in bf16, how many bytes per rank would gathering the
#    logits hand to the all-gather, and what is the saving ratio of the vocab-parallel loss?
# 2. GPT-2's V = 50257 over tp = 8: which rank owns token 6283, and how many rows does rank 7 own?
# 3. Why does the backward of the vocab-parallel loss need no communication?
#
# <details><summary>Answers (asserted below)</summary>
#
# 1. ⌈128256/8⌉ = 16032 columns: 8192·16032·2 = 262,668,288 bytes (~250 MiB) per rank; ratio 16032/3 = 5344.
# 2. Rank 0 owns [0, 6283), so token 6283 is rank 1's first row; rank 7 owns 6282 rows ([43975, 50257)).
# 3. $\partial\,\mathrm{loss}/\partial z_j = \mathrm{softmax}_j - (1-\varepsilon)[j=t] - \varepsilon/V$: the softmax
#    needs only the already all-reduced max and sum, and each rank's columns are its own.
# </details>

# %%
assert ftp.gathered_logits(1, 8192, 128256, 8, "bf16")["bytes"] == 8192 * 16032 * 2 == 262_668_288
assert ftp.ce_saving_ratio(128256, 8) == 16032 / 3 == 5344
assert vocab_range(50257, 1, 8)[0] == 6283 and vocab_range(50257, 7, 8) == (43975, 50257)
rec.close()["status"]
