"""Vocab-parallel cross-entropy: each rank holds logits for its vocab rows; only b*s numbers cross the wire.

Design note
-----------
Torch's definition, per token with logits z over the GLOBAL vocab V, target t and smoothing eps:

    log p_j = z_j - log sum_k exp(z_k)
    loss    = -(1 - eps) log p_t - (eps / V) sum_j log p_j          (0 where t == ignore_index)
            = log S - (1 - eps) z'_t - (eps / V) Z                  with z' = z - m, S = sum_j exp(z'_j),
                                                                    Z = sum_j z'_j

Each of m (max), z'_t, S and Z is a reduction over the vocab, so rank i computes it over its rows and an
all-reduce of b*s values finishes it: 3 all-reduces, plus 1 for Z when eps > 0 — never b*s*V.  Every rank
ends with the same per-token losses.  The backward needs no communication:

    d loss / d z_j = softmax_j - (1 - eps) [j == t] - eps / V

(Megatron-LM's label smoothing uses the local vocab size and a local mean, so its losses differ by rank at
tp > 1 — NVIDIA/Megatron-LM GitHub issue #737; this module keeps torch's global V.)

The baseline it is compared with, `gathered_cross_entropy`, all-gathers the logits (payload b*s*ceil(V/p)
per rank: all-gather needs equal shards, so uneven shards are padded) and calls F.cross_entropy.

The global vocab V is a required argument, never inferred from the local width.  With V = 1003 over p = 4 the
shards are 251/251/251/250: ranks 0-2 would infer 251·4 = 1004, rank 3 250·4 = 1000, and each width is
consistent with its own guess (vocab_range(1004, 0, 4) also has 251 rows), so no rank could notice — the
smoothing term eps/V and the target's row range would silently differ by rank.  Inferring V correctly needs a
collective (an all-reduce of the widths) on every call, an extra row in the ledger that the formula's 3 (or 4)
all-reduces would have to carry; every caller already knows V (it built the embedding with it).  So a call
without `vocab` is rejected with an error that says why.

Example::

    world.run(lambda c: vocab_parallel_cross_entropy(z[..., slice(*vocab_range(V, c.rank, 4))], t, c, vocab=V))
    # == F.cross_entropy(z.flatten(0, 1), t.flatten(), reduction="none").view_as(t) on every rank
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlab.comm import Comm
from shardlab.formulas.common import ceil_div
from shardlab.tp.layers import vocab_range
from shardlab.tp.mappings import gather_from_tp_region


def _check(
    local_logits: torch.Tensor,
    target: torch.Tensor,
    comm: Comm,
    vocab: int | None,
    ignore_index: int,
    label_smoothing: float,
) -> tuple[int, int, int]:
    n = local_logits.shape[-1]
    if vocab is None:
        raise ValueError(
            f"vocab= (the global vocabulary size) is required: rank {comm.rank} holds {n} logits columns, which "
            f"fits a global vocab of {n * comm.world_size} but also any uneven split that gives this rank {n} rows "
            f"(e.g. V=1003 over tp=4 is 251/251/251/250); a local shard cannot tell"
        )
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"vocab={vocab!r} must be a positive int (the global vocabulary size)")
    v = vocab
    start, end = vocab_range(v, comm.rank, comm.world_size)
    if end - start != n:
        raise ValueError(
            f"rank {comm.rank} holds {n} logits columns but vocab_range({v}, {comm.rank}, {comm.world_size}) "
            f"= ({start}, {end}) has {end - start}"
        )
    if local_logits.shape[:-1] != target.shape:
        raise ValueError(f"logits shape {tuple(local_logits.shape)} does not match target {tuple(target.shape)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} is not in [0, 1]")
    bad = ((target < 0) | (target >= v)) & (target != ignore_index)
    if bad.any():
        raise ValueError(
            f"labels {target[bad].unique()[:5].tolist()} are outside [0, vocab={v}) "
            f"and are not ignore_index={ignore_index}"
        )
    return v, start, end


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, target, comm, vocab, start, end, eps, ignore_index):
        keep = target != ignore_index  # [b, s]
        m = comm.all_reduce(z.max(dim=-1).values, op="max", tag="ce.max")  # [b, s]
        zs = z - m.unsqueeze(-1)  # [b, s, V_i]
        mine = (target >= start) & (target < end) & keep  # [b, s] target row lives on this rank
        idx = (target - start).masked_fill(~mine, 0).unsqueeze(-1)  # [b, s, 1]
        zt = zs.gather(-1, idx).squeeze(-1).masked_fill(~mine, 0.0)  # [b, s]
        zt = comm.all_reduce(zt, tag="ce.target")
        e = zs.exp()  # [b, s, V_i]
        s = comm.all_reduce(e.sum(dim=-1), tag="ce.sumexp")  # [b, s]
        loss = s.log() - (1.0 - eps) * zt
        if eps > 0:
            zsum = comm.all_reduce(zs.sum(dim=-1), tag="ce.smooth")  # [b, s]
            loss = loss - eps / vocab * zsum
        loss = loss.masked_fill(~keep, 0.0)
        ctx.save_for_backward(e / s.unsqueeze(-1), idx, mine, keep)  # softmax over this rank's rows
        ctx.eps, ctx.vocab = eps, vocab
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, idx, mine, keep = ctx.saved_tensors
        gz = softmax - ctx.eps / ctx.vocab  # [b, s, V_i]
        gz = gz.scatter_add(-1, idx, -(1.0 - ctx.eps) * mine.unsqueeze(-1).to(gz.dtype))
        gz = gz * (grad * keep).unsqueeze(-1)
        return gz, None, None, None, None, None, None, None


def vocab_parallel_cross_entropy(
    local_logits: torch.Tensor,
    target: torch.Tensor,
    comm: Comm,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    *,
    vocab: int | None = None,
) -> torch.Tensor:
    """Per-token losses [b, s] (same on every rank) from this rank's logits [b, s, V_i].

    `vocab` is the global vocab size V (required; this rank's columns must be `vocab_range(V, rank, tp)`).
    """
    v, start, end = _check(local_logits, target, comm, vocab, ignore_index, label_smoothing)
    if comm.world_size == 1:
        return F.cross_entropy(
            local_logits.flatten(0, -2),
            target.flatten(),
            reduction="none",
            label_smoothing=label_smoothing,
            ignore_index=ignore_index,
        ).view_as(target)
    return _VocabParallelCE.apply(local_logits, target, comm, v, start, end, label_smoothing, ignore_index)


def gathered_cross_entropy(
    local_logits: torch.Tensor,
    target: torch.Tensor,
    comm: Comm,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    *,
    vocab: int | None = None,
) -> torch.Tensor:
    """Baseline: all-gather the logits shards (padded to ceil(V/p)), then dense F.cross_entropy.

    `vocab` (the global V) is required, for the same reason as in `vocab_parallel_cross_entropy`."""
    v, start, end = _check(local_logits, target, comm, vocab, ignore_index, label_smoothing)
    p = comm.world_size
    width = ceil_div(v, p)  # the largest shard
    padded = F.pad(local_logits, (0, width - (end - start)))  # [b, s, V_i] -> [b, s, ceil(V/p)]
    full = gather_from_tp_region(padded, comm)  # [b, s, p * ceil(V/p)]
    keep = torch.cat(
        [
            torch.arange(r * width, r * width + (e - s))
            for r, (s, e) in enumerate(vocab_range(v, r, p) for r in range(p))
        ]
    )
    logits = full.index_select(-1, keep)  # [b, s, V], padding dropped
    return F.cross_entropy(
        logits.flatten(0, -2),
        target.flatten(),
        reduction="none",
        label_smoothing=label_smoothing,
        ignore_index=ignore_index,
    ).view_as(target)
