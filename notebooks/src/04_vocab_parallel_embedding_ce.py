# %% tags=["parameters"]
num_devices = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
results_dir = None  # where the JSON record goes (the report runner sets it)
seed = 0  # seed of every random tensor
tp = 8  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
batch = 1
seq = 8
hidden = 64
dtype = "float32"  # "float32" or "bfloat16"
vocab = 50257  # GPT-2's vocabulary: NOT divisible by 8 (50257 = 8 * 6282 + 1)
label_smoothing = 0.1  # for the parity section (torch's global definition)
memory_tokens = 0  # b·s of an extra compile-only TPU pair (gathered vs vocab-parallel loss); 0 skips it
answers = None  # exercise answer key (the tests and the report inject it); leave None

# %%
from shardlab import runtime
from shardlab.profile import Recorder
from shardlab.tp.params import VocabParams

p = VocabParams.from_namespace(globals())  # every parameter checked here, before any XLA work
world = runtime.setup(num_devices=p.num_devices)
rec = Recorder.for_params(p, world)
world

# %% [markdown]
# # 04 · Vocab-parallel embedding and cross-entropy: never move the logits
#
# The largest matrices of a language model are often the embedding table $E$ [V, h] and the logits [b, s, V]
# (V = 50257 for GPT-2, 128256 for Llama 3). Megatron (Shoeybi et al. 2019, §3) splits the **vocabulary**:
#
# - **Embedding** — device $i$ holds rows $E[V_X, H]$, a contiguous range of token ids (`vocab_range`). Each
#   device looks up the ids it owns, writes zeros for the others, and **one all-reduce** of [b, s, h] sums the
#   rows — exactly one device contributes each token. The backward (the rows' gradient) is local.
# - **Output layer + cross-entropy** — the tied output layer gives each device the logits of its vocab range,
#   [b, s, V/p]. Gathering them would need an all-gather of the logits. Instead, the loss is built from
#   reductions over the vocab: the **max** (for stability), the **target logit**, the **sum of exponentials** —
#   each a per-token number, so three all-reduces of [b, s]: $\mathrm{loss} = \log\sum_j e^{z_j - m} - (z_t - m)$.
#   With label smoothing one more: the sum of the logits. The loss's own backward needs no communication — each
#   rank's logit gradient is softmax − one-hot on its own columns. The output layer's does: it is $f(x)E_i^\top$,
#   and f's backward sums the input gradient $dx = \sum_i dz_i E_i$ — **one all-reduce of [b, s, h]** in the
#   backward (the planner's "LM-head input grad" term in notebook 07).
# - **Tied embedding** — when the output layer reuses E, $E_i$ gets two gradient contributions, both local to the
#   rank that owns the rows: the lookup's (the gradient arriving at the embedding output, for the tokens in its
#   range) and the output layer's ($dz_i^\top x$). Neither needs communication; section 3 checks both.
#
# The vocabulary need not divide evenly: ranks own $\lfloor V/p\rfloor$ or $\lceil V/p\rceil$ rows, and an
# all-gather pads every shard to $\lceil V/p\rceil$.

# %%
from dataclasses import replace

from shardlab.core import harness
from shardlab.core.views import View
from shardlab.formulas import tp as ftp
from shardlab.tp import vocab_range
from shardlab.tp.case import CE_METHODS, CrossEntropyCase, EmbeddingCase, TiedOutputCase, ce_cases, ce_table_views

emb = EmbeddingCase(p)  # one forward lookup
emb_fb = EmbeddingCase(p, backward=True)  # + the weight gradient
vp, ga = ce_cases(p).values()  # loss + backward, no label smoothing: vocab-parallel and gathered
tied = TiedOutputCase(p)  # lookup, a stand-in model, the tied output layer and the loss: forward + backward

# %% [markdown]
# ## 1 · The formulas, and two ways to count bytes
# Bytes per rank come in two conventions (notebook 00). **Payload**: what one rank hands to the collective — an
# all-reduce's whole input, an all-gather's one shard. **Wire**: what one rank sends in a ring — an all-reduce
# 2(p−1)/p of its payload, an all-gather (p−1) shards. The vocab-parallel loss hands over $3\,b\,s\,e$ bytes and
# sends $3\cdot 2\frac{p-1}{p}\,b\,s\,e$; gathering the logits hands over one shard $b\,s\,\lceil V/p\rceil\,e$ and
# sends $(p-1)\,b\,s\,\lceil V/p\rceil\,e$. Divided, the **payload ratio** $\lceil V/p\rceil/3$ shrinks with p — it
# compares one shard with the whole [b, s] inputs — while the **wire ratio** $p\lceil V/p\rceil/6 \approx V/6$ does
# not: the (p−1) cancels. The wire ratio is the saving (`ce.saving_ratio`); the payload ratio is recorded too
# (`ce.payload_ratio`). And memory: after the all-gather every device holds the padded logits
# [b, s, p⌈V/p⌉] (≈ b·s·V), p times its own shard.

# %%
print(f"rows per rank: {[e - s for s, e in (vocab_range(p.vocab, r, p.tp) for r in range(p.tp))]}")
formula = {c.key: harness.formula(c) for c in (vp, ga)}
print(f"embedding {harness.formula(emb).values}")
print(f"payload ratio ceil(V/p)/3 = {ftp.ce_payload_ratio(p.vocab, p.tp):.1f}, "
      f"wire ratio p·ceil(V/p)/6 = {ftp.ce_wire_ratio(p.vocab, p.tp):.1f}, logits per device "
      f"{ftp.ce_logits_bytes(p.batch, p.seq, p.vocab, p.tp, p.dtype)} bytes")
{key: v.values for key, v in formula.items()}

# %% [markdown]
# ## 2 · The split, drawn
# Rows of the table and columns of the logits, coloured by owner. With an uneven vocabulary the first
# `vocab % tp` devices own one row more.

# %%
from shardlab.tp import figures as vtp

vtp.ownership_figure(vtp.embedding_panels(p.vocab, p.hidden, p.tp), p.tp, f"V={p.vocab} over tp={p.tp} devices").show()

# %% [markdown]
# ## 3 · The ledger: per-rank code
# `VocabParallelEmbedding.from_dense` keeps rows `vocab_range(V, rank, tp)`; `vocab_parallel_cross_entropy` gets
# each rank's logit columns. The oracles are `nn.Embedding` and `torch.nn.functional.cross_entropy` on the full
# logits — including label smoothing (torch's *global* definition: ε/V over the whole vocabulary; Megatron-LM's
# own implementation uses the local vocab and differs by rank at tp > 1: NVIDIA/Megatron-LM#737) and `ignore_index`
# (one position of the targets is ignored).
#
# **The global vocabulary is a required argument.** A rank holding 251 logit columns of an uneven split cannot
# tell V = 1003 (251/251/251/250 over 4 ranks) from V = 1004 without asking the others — one more all-reduce on
# every call — and a wrong guess silently changes the smoothing term ε/V and which rank owns the target. So
# `vocab_parallel_cross_entropy(local, target, comm, vocab=V)` needs `vocab=` and refuses the call without it:

# %%
from shardlab.comm import SimulatedWorld
from shardlab.tp import vocab_parallel_cross_entropy


def without_vocab(comm):
    logits, target = vp.inputs()
    start, end = vocab_range(p.vocab, comm.rank, comm.world_size)
    return vocab_parallel_cross_entropy(logits[..., start:end], target, comm)  # no vocab=


try:
    SimulatedWorld(p.tp).run(without_vocab)
    refused = ""
except Exception as err:  # a rank's ValueError, re-raised by the simulated world
    refused = str(err.__cause__ or err)
print(refused)
rec.check("ce.requires_vocab", "vocab=" in refused, refused or "the call without vocab= was accepted")

# %%
emb_ledger = {c.phase: harness.ledger(c) for c in (emb, emb_fb)}
ledger = {c.key: harness.ledger(c) for c in (vp, ga)}
vtp.ledger_timeline(ledger["vocab_parallel"].detail["ledger"],
                    "vocab-parallel CE, forward + backward: [b, s] all-reduces only").show()
vtp.ledger_frame(ledger["gather_logits"].detail["ledger"])

# %% [markdown]
# **The two ends together.** `tied_lm_step` runs the whole vocab-parallel pipe per rank: the lookup (g), a stand-in
# for the model (tanh), the tied output layer (f, then $xE_i^\top$) and the loss, then the backward. The formula is
# the sum of its parts — the embedding's all-reduce, the loss's three, and the output layer's backward one; the
# oracle is the dense tied model in float64. The ledger's backward must hold exactly one collective, f's, and every
# rank's rows of the tied gradient — lookup and output-layer contributions together — must equal the dense rows.

# %%
tied_views = harness.views(tied, ("formula", "ledger"))
display(harness.record(rec, "tied", *tied_views))
vtp.ledger_frame(tied_views[1].detail["ledger"])

# %% [markdown]
# ## 4 · The compilers
# **CPU.** The dense `nn.Embedding` with its weight annotated `("tensor", None)`; the full logits annotated
# `(None, None, "tensor")`. For the loss, two dense spellings: `vocab_parallel_ce` (max, masked target sum, sum of
# exp — reductions the partitioner can finish with [b, s] all-reduces) and `gathered_ce` (re-annotate the logits as
# replicated, then `F.cross_entropy`: an all-gather). Each runs forward and backward; the logits gradient is kept
# vocab-sharded like the logits (padded to p⌈V/p⌉ columns so that its shards are even). XLA pads an uneven
# vocabulary to ⌈V/p⌉ columns per device. These views need `tp` devices in this process; with fewer they are
# skipped.
#
# **TPU.** The same graphs compiled by XLA:TPU for a v5e slice (compile-only; in a helper process with `tp`
# virtual devices when this process has fewer).

# %%
emb_compiled = [harness.hlo(emb), harness.tpu(emb)]
compiler = {c.key: harness.hlo(c) for c in (vp, ga)}
tpu = {c.key: harness.tpu(c) for c in (vp, ga)}
for key in compiler:  # XLA:CPU and XLA:TPU compile seconds (timing, never compared)
    harness.record_compile_s(rec, f"ce.{key}.compile_s", compiler[key], tpu[key])

# %% [markdown]
# ## 5 · Four ways, one number
# The embedding: one all-reduce of [b, s, h] forward; with the backward still one (formula and ledger).

# %%
display(harness.record(rec, "embedding", harness.formula(emb), emb_ledger["fwd"], *emb_compiled))
harness.record(rec, "embedding", harness.formula(emb_fb), emb_ledger["fwd_bwd"])

# %% [markdown]
# The loss, both methods side by side (`largest_array.elements`: the largest array each compiled program writes
# per device — the logits shard, or the gathered logits), and the ratios gathered / vocab-parallel in both conventions. The
# measured ratios come from elements, so they hold for bf16 too (XLA:CPU all-reduces 16-bit floats in f32).

# %%
views = {key: [formula[key], ledger[key], compiler[key], tpu[key]] for key in formula}
harness.record(rec, "ce", *ce_table_views(views["vocab_parallel"], views["gather_logits"], p))

# %% [markdown]
# **Interpretation.** The vocabulary-parallel loss moves a few numbers per token where gathering moves a slice of
# the vocabulary per token: in wire bytes $p\lceil V/p\rceil/6 \approx V/6$ times less, at every tp. Both
# partitioners reach the same plan when the loss is *written* as reductions; written as "replicate, then
# `F.cross_entropy`", they all-gather, and every device then holds the whole padded logits.
#
# **CPU vs TPU.** XLA:TPU issues the target-logit and sum-of-exponentials all-reduces as **one** tuple
# all-reduce (count 2, operands 3): the all-reduce combiner merges the two independent sums, while the max stays
# alone — it is another reduction (max, not sum) and both sums need its result. XLA:CPU's pass pipeline has no
# combiner. (These two sums are independent in any training step, unlike notebook 02's g and f.) Any
# collective a program issues beyond its method's own is listed in a note above the table: XLA:CPU partitions the
# backward of the gathered `F.cross_entropy` along the vocabulary (the gradient is annotated vocab-sharded) and
# adds a few [b, s] all-reduces there. Neither changes the lesson: the logits stay put, or they all move.
#
# ### Label smoothing
# One more all-reduce (the sum of the logits) for the vocab-parallel loss; the gathered loss moves the same shard.
# Formula and ledger (with the per-rank parity against torch's global definition):

# %%
if p.label_smoothing > 0:
    smooth = [harness.views(c, ("formula", "ledger")) for c in ce_cases(p, smoothing=True).values()]
    display(harness.record(rec, "ce", *ce_table_views(*smooth, p, smoothing=True)))
else:
    print("label_smoothing=0: the smoothed loss is the plain one above")

# %% [markdown]
# ## 6 · The saving as the vocabulary grows
# Both conventions per tp (solid: wire, dashed: payload). The wire lines nearly coincide — the saving does not
# depend on tp (only the padding of p⌈V/p⌉ does) — while the payload lines drop by 2× per doubling of tp. Ledger points (small b·s, the
# notebook's tp) sit on the wire line.

# %%
vocabs = sorted({1000, 8000, 32000, 50257, 128256, p.vocab})
ledger_ratio = {}
for V in [v for v in vocabs if v <= 60000 and v >= p.tp]:  # one case pair per vocabulary, small b·s
    small = [harness.ledger(c) for c in ce_cases(replace(p, batch=1, seq=2, vocab=V), backward=False).values()]
    ledger_ratio[V] = small[1]["gather_logits.wire_bytes"] / small[0]["vocab_parallel.wire_bytes"]
    harness.record(rec, f"ce.by_vocab.V{V}", View("formula", {"saving_ratio": ftp.ce_wire_ratio(V, p.tp)}),
                   View("ledger", {"saving_ratio": ledger_ratio[V]}), show=False)  # the ledger on the formula line
fig = vtp.saving_ratio_figure(vocabs, sorted({2, 4, 8, p.tp}))
fig.add_scatter(x=list(ledger_ratio), y=list(ledger_ratio.values()), mode="markers", name=f"ledger (wire), tp={p.tp}",
                marker=dict(size=12, symbol="x", color="black"))
fig.show()

# %% [markdown]
# ## 7 · Memory: the gathered logits
# Per device, the vocab-parallel loss never holds more than its logits shard [b, s, ⌈V/p⌉] (the
# `largest_array` rows above: the gradient shard); the gathered loss holds the padded [b, s, p⌈V/p⌉] — p times
# more, gigabytes per device for a Llama-3-sized vocabulary and batch (exercise 3). The compiled programs' memory:

# %%
harness.memory_frame({"cpu vocab-parallel": compiler["vocab_parallel"], "cpu gathered": compiler["gather_logits"],
              "tpu vocab-parallel": tpu["vocab_parallel"], "tpu gathered": tpu["gather_logits"]})

# %% [markdown]
# XLA:CPU's temporaries include the gathered logits (and the loss's intermediates of the same size). XLA:TPU's
# compiled memory statistics count only the temporaries it places in main memory (HBM); at these sizes the
# gathered logits fit in on-chip memory and the TPU columns show no temporaries. Set `memory_tokens` (e.g. 512 at
# the default vocab, float32: 103 MB of gathered logits per chip) to compile a forward-only pair for that many
# tokens on the TPU, where the gathered logits no longer fit on chip (a few seconds per compile):

# %%
if p.memory_tokens:
    big = {m: harness.tpu(CrossEntropyCase(replace(p, batch=1, seq=p.memory_tokens), method=m, backward=False))
           for m in CE_METHODS}
    print(f"b·s = {p.memory_tokens}: gathered logits "
          f"{ftp.ce_logits_bytes(1, p.memory_tokens, p.vocab, p.tp, p.dtype)['gathered']:,} bytes per chip")
    display(harness.memory_frame({f"tpu {m}, b·s={p.memory_tokens}": v for m, v in big.items()}))
else:
    print("memory_tokens=0: the large TPU memory comparison is skipped")

# %% [markdown]
# ### Explore
# Move the sliders (tp, batch, seq, hidden, vocab): the embedding + CE ledger of a small config is recomputed and
# compared with the formula, and the gathered-logits bytes are shown for contrast.

# %%
from shardlab.core.explorer import explorer_for

ui, update = explorer_for(p, tp=min(p.tp, 4), batch=p.batch, seq=min(p.seq, 8), hidden=min(p.hidden, 32),
                            vocab=min(p.vocab, 1003))
shown = update()  # what a slider move does; run here so a headless run exercises it too
rec.check("embedding_ce.explorer.update", shown["ok"], f"{shown.get('formula')} vs {shown.get('ledger')}")
rec.check("embedding_ce.explorer.rejects_tiny_vocab", not update(tp=8, vocab=4)["ok"], "vocab=4 < tp=8 is reported")
update(tp=min(p.tp, 4), vocab=min(p.vocab, 1003))
ui

# %% [markdown]
# ## Exercises
# Write your answer into the variable and run the cell: the grader says right or gives a hint.
#
# 1. Llama 3 has V = 128256. With tp = 8 and b·s = 8192 tokens in bf16, how many bytes does each rank send over
#    the wire (ring model) to gather the logits?
# 2. What is the wire saving ratio of the vocab-parallel loss (no label smoothing) for Llama 3 at tp = 8, and at
#    tp = 64? (a list of two numbers)
# 3. In exercise 1's set-up, how many bytes does the gathered logits buffer take on each device?
# 4. GPT-2's V = 50257 over tp = 8: which rank owns token 6283, and how many rows does rank 7 own?
#    (a list of two ints)
# 5. How many collectives does the backward of the vocab-parallel loss issue?
# 6. … and the backward of the vocab-parallel output layer in front of it (logits $= f(x)E_i^\top$)?
# 7. Code: write `answer_7(V, rank, p)` returning the `[start, end)` rows of a V-row table that rank `rank` of `p`
#    owns — contiguous ranges in rank order, the first V mod p ranks one row longer. The grader compares it with
#    the library's `vocab_range` on a grid of V (even and uneven) and p.

# %%
from shardlab.core.exercises import Exercises

ex = Exercises(p.NOTEBOOK, rec, p.answers)
answer_1 = None  # bytes
answer_2 = None  # [ratio at tp=8, ratio at tp=64]
answer_3 = None  # bytes
answer_4 = None  # [rank, rows]
answer_5 = None  # a count
answer_6 = None  # a count
answer_7 = None  # a function (V, rank, p) -> (start, end), e.g. def answer_7(V, rank, p): ...
for n, a in enumerate((answer_1, answer_2, answer_3, answer_4, answer_5, answer_6, answer_7), start=1):
    ex.show(n, a)

# %% [markdown]
# <details><summary>Why (open after trying)</summary>
#
# 1. An all-gather rank hands over its padded shard [b·s, ⌈V/p⌉] and, in a ring, sends p − 1 of them.
# 2. $(p-1)\,b\,s\,\lceil V/p\rceil$ over $3\cdot 2\frac{p-1}{p}\,b\,s$ is $p\lceil V/p\rceil/6$: with V
#    divisible by p that is V/6 whatever p. The payload ratio ⌈V/p⌉/3 would have fallen 8-fold between the two.
# 3. After the all-gather a device holds all p padded shards: b·s·p·⌈V/p⌉ elements.
# 4. 50257 = 8·6282 + 1: rank 0 owns one row more, [0, 6283), so token 6283 is the first row of the next rank;
#    the last rank owns the base 6282 rows.
# 5. $\partial\,\mathrm{loss}/\partial z_j = \mathrm{softmax}_j - (1-\varepsilon)[j=t] - \varepsilon/V$: the softmax
#    needs only the max and the sum that the forward already all-reduced, and each rank's columns are its own.
# 6. One: f's all-reduce of the input gradient [b, s, h]. Every rank's $dz_i E_i$ is a partial sum of $dx$ over its
#    vocab columns (section 3's ledger shows it, tagged `f`).
# 7. `base, extra = divmod(V, p)`, then `start = rank * base + min(rank, extra)` and
#    `end = start + base + (rank < extra)`: the first `extra` ranks each own one of the leftover rows.
# </details>

# %%
rec.close()["status"]
