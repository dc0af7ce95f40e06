"""Megatron tensor-parallel layers: each rank holds its slice and calls the f / g operators.

Design note
-----------
Notation (00_welcome): A[I, J_X] is A with its columns split over the tensor axis X; {U_X} marks a partial
sum that still needs a reduction over X.  p = tp = comm.world_size, rank i holds block i.

    ColumnParallelLinear   Y = X A + b,  A = [A_1, ..., A_p] (split along its 2nd dim)   Y_i = f(X) A_i + b_i
    RowParallelLinear      Y = X A + b,  A = [A_1; ...; A_p] (split along its 1st dim)   Y = g(sum_i X_i A_i) + b
    ParallelMLP            Z = g(gelu(f(X) A_i) B_i) + b2          1 all-reduce forward, 1 backward
    ParallelAttention      heads split: rank i owns heads [i*nh/p, (i+1)*nh/p); Q/K/V column-parallel (one
                           fused f), output projection row-parallel (one g)
    ParallelTransformerBlock  x + Attn(LN(x)), then + MLP(LN(.)); LayerNorms replicated   2 + 2 all-reduces
    VocabParallelEmbedding rows of E split by `vocab_range`; ids outside the rank's range look up a zero
                           row; g sums the ranks' rows                  1 all-reduce forward

The bias of a row-parallel layer is added once, after the reduction (adding it per rank would count it p
times).  `from_dense(module, comm)` copies this rank's slice of a `shardlab.models` module, so a test can
compare with the dense oracle.

Sequence parallelism (Korthikanti et al. 2022, as Megatron-LM implements it): `ParallelMLP(...,
sequence_parallel=True)` takes and returns activations split along the sequence dim, [b, s/p, h].  f becomes
an all-gather of the input (g_sp) and g a reduce-scatter of the output (gbar_sp).  The column-parallel layer
keeps only its s/p input shard for the backward and all-gathers it again there for the weight gradient
(`ColumnParallelLinear(..., sequence_parallel=True)`; Megatron's LinearWithGradAccumulationAndAsync-
Communication), so the stored MLP input is divided by p — the point of SP.  Per linear pair and step:

    forward   all-gather x [b, s/p, h] -> [b, s, h]          reduce-scatter z [b, s, h] -> [b, s/p, h]
    backward  all-gather dz (gbar_sp's backward)             all-gather x again (the re-gather)
              reduce-scatter dx [b, s, h] -> [b, s/p, h]

i.e. the two all-reduces' wire bytes plus one all-gather of [b, s/p, h] (`formulas.tp.sequence_parallel`).

One more collective comes with SP: a parameter that acts on each rank's s/p tokens — the row-parallel layer's
bias (added after the reduce-scatter), a LayerNorm's weight and bias outside the linear pair — gets a per-rank
*partial* gradient.  Megatron tags such parameters ``sequence_parallel`` and, after the backward, sums their
gradients over the tensor-parallel group in one coalesced all-reduce (``finalize_model_grads`` ->
``_allreduce_layernorm_grads``); :func:`allreduce_sequence_parallel_grads` does the same (ledger tag "sp.grads").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlab import models
from shardlab.comm import Comm, phase_scope
from shardlab.tp.mappings import (
    copy_to_tp_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    reduce_scatter_to_sp_region,
)


def divide(n: int, p: int, what: str) -> int:
    """n / p, or an error naming both: divide(100, 8, "hidden") -> "hidden=100 is not divisible by tp=8"."""
    if n % p:
        raise ValueError(f"{what}={n} is not divisible by tp={p}")
    return n // p


def vocab_range(vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous [start, end) rows of a `vocab`-row table owned by `rank`; the first vocab % p ranks get one
    extra row.  vocab_range(10, 2, 4) -> (6, 8)   # sizes 3, 3, 2, 2"""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
    if vocab < world_size:
        raise ValueError(f"vocab={vocab} is smaller than tp={world_size}: some rank would own no rows")
    base, extra = divmod(vocab, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def allreduce_sequence_parallel_grads(module: nn.Module, comm: Comm) -> int:
    """Sum the gradients of ``module``'s parameters tagged ``sequence_parallel`` over the tensor-parallel group:
    one all-reduce of their concatenation (Megatron's coalesced `_allreduce_layernorm_grads`), recorded as a
    backward collective tagged "sp.grads".  Returns the elements reduced (0: nothing tagged, or tp = 1)."""
    grads = [q.grad for q in module.parameters() if getattr(q, "sequence_parallel", False) and q.grad is not None]
    if not grads or comm.world_size == 1:
        return 0
    with phase_scope("backward"):  # after the engine returned, still part of the step's backward
        summed = comm.all_reduce(torch.cat([g.flatten() for g in grads]), tag="sp.grads")  # [n]
    offset = 0
    for g in grads:
        g.copy_(summed[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return offset


def _like(m: nn.Module, dense: nn.Module) -> nn.Module:
    """Move a freshly built parallel module to the dense module's dtype and device."""
    w = next(dense.parameters())
    return m.to(device=w.device, dtype=w.dtype)


def _slice_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


class _SequenceParallelColumnLinear(torch.autograd.Function):
    """Y_i = g_sp(X) A_i + b_i that saves only the s/p shard of X: all-gather in forward, all-gather again in
    backward for dA_i, reduce-scatter dX (Megatron's sequence-parallel linear)."""

    @staticmethod
    def forward(ctx, x, weight, bias, comm, dim):  # x [b, s/p, h] (this rank's sequence chunk)
        ctx.comm, ctx.dim, ctx.has_bias = comm, dim, bias is not None
        ctx.save_for_backward(x, weight)  # the SHARD, not the gathered [b, s, h]
        full = comm.all_gather(x, dim=dim, tag="sp.gather")  # [b, s, h]
        return F.linear(full, weight, bias)  # [b, s, h] @ [h, out/p] -> [b, s, out/p]

    @staticmethod
    def backward(ctx, gy):  # gy [b, s, out/p]
        x, weight = ctx.saved_tensors
        full = ctx.comm.all_gather(x, dim=ctx.dim, tag="sp.regather")  # [b, s/p, h] -> [b, s, h], again
        gx = ctx.comm.reduce_scatter(gy @ weight, dim=ctx.dim, tag="sp.gather")  # [b, s, h] -> [b, s/p, h]
        gw = gy.flatten(0, -2).t() @ full.flatten(0, -2)  # [out/p, b·s] @ [b·s, h] -> [out/p, h]
        gb = gy.flatten(0, -2).sum(0) if ctx.has_bias else None  # [out/p]
        return gx, gw, gb, None, None


class ColumnParallelLinear(nn.Module):
    """Y_i = f(X) A_i + b_i with weight [out/p, in] (nn.Linear layout, rows = output features of block i).

    sequence_parallel: X arrives as [b, s/p, in] and is all-gathered along the sequence (g_sp); only the shard is
    kept for the backward, which all-gathers it again."""

    def __init__(
        self, in_features: int, out_features: int, comm: Comm, bias: bool = True, gather_output: bool = False,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        if sequence_parallel and gather_output:
            raise ValueError("sequence_parallel=True with gather_output=True is not supported (the output stays "
                             "split over the out features)")
        self.comm, self.gather_output, self.sequence_parallel = comm, gather_output, sequence_parallel
        self.out_local = divide(out_features, comm.world_size, "out_features")
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features))
        self.bias = nn.Parameter(torch.zeros(self.out_local)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel and self.comm.world_size > 1:  # [b, s/p, in] -> [b, s, out/p]
            return _SequenceParallelColumnLinear.apply(x, self.weight, self.bias, self.comm, 1)
        y = F.linear(copy_to_tp_region(x, self.comm), self.weight, self.bias)  # [.., in] -> [.., out/p]
        return gather_from_tp_region(y, self.comm) if self.gather_output else y

    @classmethod
    def from_dense(
        cls, dense: nn.Linear, comm: Comm, gather_output: bool = False, sequence_parallel: bool = False
    ) -> ColumnParallelLinear:
        m = _like(cls(dense.in_features, dense.out_features, comm, dense.bias is not None, gather_output,
                      sequence_parallel), dense)
        rows = slice(comm.rank * m.out_local, (comm.rank + 1) * m.out_local)
        _slice_copy(m.weight, dense.weight[rows])
        if m.bias is not None:
            _slice_copy(m.bias, dense.bias[rows])
        return m


class RowParallelLinear(nn.Module):
    """Y = g(X_i A_i) + b with weight [out, in/p]; X_i is this rank's chunk of the input's last dim."""

    def __init__(self, in_features: int, out_features: int, comm: Comm, bias: bool = True) -> None:
        super().__init__()
        self.comm = comm
        self.in_local = divide(in_features, comm.world_size, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None  # replicated
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp_region(F.linear(x, self.weight), self.comm)  # [.., in/p] -> {[.., out]} -> [.., out]
        return y + self.bias if self.bias is not None else y  # once, after the reduction

    @classmethod
    def from_dense(cls, dense: nn.Linear, comm: Comm) -> RowParallelLinear:
        m = _like(cls(dense.in_features, dense.out_features, comm, dense.bias is not None), dense)
        _slice_copy(m.weight, dense.weight[:, comm.rank * m.in_local : (comm.rank + 1) * m.in_local])
        if m.bias is not None:
            _slice_copy(m.bias, dense.bias)
        return m


class ParallelMLP(nn.Module):
    """column -> GeLU -> row.  With sequence_parallel, x and the output are [b, s/p, h] shards (module note), and
    the row bias b2 — added to this rank's s/p tokens only — is tagged ``sequence_parallel``: its gradient is a
    partial sum until :func:`allreduce_sequence_parallel_grads` adds the ranks' parts."""

    def __init__(self, hidden: int, ffn: int, comm: Comm, bias: bool = True, sequence_parallel: bool = False) -> None:
        super().__init__()
        divide(ffn, comm.world_size, "ffn")
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.fc1 = ColumnParallelLinear(hidden, ffn, comm, bias, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear(ffn, hidden, comm, bias)
        self._tag_sp_params()

    def _tag_sp_params(self) -> None:
        if self.sequence_parallel and self.fc2.bias is not None:
            self.fc2.bias.sequence_parallel = True  # type: ignore[attr-defined]  # sees s/p tokens per rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            return self.fc2(F.gelu(self.fc1(x)))  # [b, s, h] -> [b, s, ffn/p] -> [b, s, h]
        y = F.gelu(self.fc1(x))  # [b, s/p, h] -> all-gather -> [b, s, h] -> [b, s, ffn/p]
        z = reduce_scatter_to_sp_region(F.linear(y, self.fc2.weight), self.comm, dim=1)  # -> [b, s/p, h]
        return z + self.fc2.bias if self.fc2.bias is not None else z

    @classmethod
    def from_dense(cls, dense: models.MLP, comm: Comm, sequence_parallel: bool = False) -> ParallelMLP:
        m = cls(dense.fc1.in_features, dense.fc1.out_features, comm, dense.fc1.bias is not None, sequence_parallel)
        m.fc1 = ColumnParallelLinear.from_dense(dense.fc1, comm, sequence_parallel=sequence_parallel)
        m.fc2 = RowParallelLinear.from_dense(dense.fc2, comm)
        m._tag_sp_params()
        return m


class ParallelAttention(nn.Module):
    """Heads split over ranks.  Q/K/V are one fused column-parallel linear (one f), output row-parallel."""

    def __init__(self, hidden: int, heads: int, comm: Comm, bias: bool = True) -> None:
        super().__init__()
        p = comm.world_size
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.comm, self.head_dim = comm, hidden // heads
        self.local_heads = divide(heads, p, "heads")
        self.local_hidden = self.local_heads * self.head_dim
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, comm, bias)  # local rows: [q_i; k_i; v_i]
        self.out = RowParallelLinear(hidden, hidden, comm, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x)  # [b, s, h] -> [b, s, 3 h/p]
        q, k, v = (
            t.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)  # [b, s, h/p] -> [b, nh/p, s, hd]
            for t in qkv.split(self.local_hidden, dim=-1)
        )
        ctx = models.causal_attention(q, k, v)  # [b, nh/p, s, hd]
        return self.out(ctx.transpose(1, 2).reshape(b, s, self.local_hidden))  # [b, s, h/p] -> [b, s, h]

    @classmethod
    def from_dense(cls, dense: models.Attention, comm: Comm) -> ParallelAttention:
        m = _like(cls(dense.hidden, dense.heads, comm, dense.q.bias is not None), dense)
        cols = slice(comm.rank * m.local_hidden, (comm.rank + 1) * m.local_hidden)  # this rank's heads
        _slice_copy(m.qkv.weight, torch.cat([lin.weight[cols] for lin in (dense.q, dense.k, dense.v)]))
        if m.qkv.bias is not None:
            _slice_copy(m.qkv.bias, torch.cat([lin.bias[cols] for lin in (dense.q, dense.k, dense.v)]))
        m.out = RowParallelLinear.from_dense(dense.out, comm)
        return m


class ParallelTransformerBlock(nn.Module):
    """A pre-LayerNorm transformer layer with ParallelAttention and ParallelMLP (no sequence parallelism).

    The LayerNorms run replicated on every rank (their inputs are the full activations, so their gradients are
    identical on every rank without communication); the residual adds are local.  Per step: 2 all-reduces
    forward (each sub-layer's g), 2 backward (each sub-layer's f)."""

    def __init__(self, hidden: int, heads: int, ffn: int, comm: Comm, bias: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = ParallelAttention(hidden, heads, comm, bias)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = ParallelMLP(hidden, ffn, comm, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # [b, s, h]
        return x + self.mlp(self.ln2(x))  # [b, s, h]

    @classmethod
    def from_dense(cls, dense: models.TransformerBlock, comm: Comm) -> ParallelTransformerBlock:
        attn, mlp = dense.attn, dense.mlp
        m = _like(cls(attn.hidden, attn.heads, mlp.fc1.out_features, comm, attn.q.bias is not None), dense)
        m.ln1.load_state_dict(dense.ln1.state_dict())
        m.ln2.load_state_dict(dense.ln2.state_dict())
        m.attn = ParallelAttention.from_dense(attn, comm)
        m.mlp = ParallelMLP.from_dense(mlp, comm)
        return m


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the embedding table; out-of-range ids give zero rows; g sums over ranks."""

    def __init__(self, vocab: int, hidden: int, comm: Comm) -> None:
        super().__init__()
        self.comm, self.vocab = comm, vocab
        self.start, self.end = vocab_range(vocab, comm.rank, comm.world_size)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, hidden))
        nn.init.normal_(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bad = (ids < 0) | (ids >= self.vocab)
        if bad.any():
            raise ValueError(f"token ids {ids[bad].unique()[:5].tolist()} are outside [0, vocab={self.vocab})")
        outside = (ids < self.start) | (ids >= self.end)  # [b, s]
        local = (ids - self.start).masked_fill(outside, 0)  # [b, s] indices into this rank's rows
        rows = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)  # [b, s, h]
        return reduce_from_tp_region(rows, self.comm)  # sum over ranks: exactly one rank owns each id

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Tied output layer, vocab-parallel: f(x) E_i^T -> this rank's logits [b, s, end - start]."""
        return copy_to_tp_region(x, self.comm) @ self.weight.t()  # [b, s, h] @ [h, V_i] -> [b, s, V_i]

    @classmethod
    def from_dense(cls, dense: nn.Embedding, comm: Comm) -> VocabParallelEmbedding:
        m = _like(cls(dense.num_embeddings, dense.embedding_dim, comm), dense)
        _slice_copy(m.weight, dense.weight[m.start : m.end])
        return m
