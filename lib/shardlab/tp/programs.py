"""Per-rank programs: one forward (+ backward) step of a dense module's tensor-parallel version.

Design note
-----------
Module-level functions `fn(comm, ...)` so both worlds can run them (DistributedWorld pickles them into spawned
processes).  Each builds its layer with `from_dense`, runs forward and, if `target` is given, backward of
:func:`loss` = ½‖out − target‖² (the output gradient out − target depends on the output, as in training, so the
backward's f needs the forward's g; the target is a fixed random tensor, not zeros or ones, which would hide
transposition mistakes).  Each returns plain tensors: the output, the input gradient and this
rank's parameter gradients (names as in the parallel module), for comparison with the dense oracle, and
`saved_bytes`: the activation bytes autograd stored for the backward on this rank (every tensor packed by
`torch.autograd.graph.saved_tensors_hooks`, one count per storage, parameters excluded) — the measured
counterpart of `formulas.activations`.

    results = SimulatedWorld(4).run(mlp_step, dense_mlp, x, target)
    results[r]["out"], results[r]["grad_x"], results[r]["grads"]["fc1.weight"]   # rank r's slice
"""

from __future__ import annotations

from typing import Any

import torch

from shardlab import models
from shardlab.comm import Comm
from shardlab.models import loss
from shardlab.tp.cross_entropy import gathered_cross_entropy, vocab_parallel_cross_entropy
from shardlab.tp.layers import (
    ParallelAttention,
    ParallelMLP,
    ParallelTransformerBlock,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    vocab_range,
)


def _step(
    module: torch.nn.Module, x: torch.Tensor, target: torch.Tensor | None, input_grad: bool = True
) -> dict[str, Any]:
    x = x.detach().clone().requires_grad_(input_grad and x.is_floating_point())
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes of the activations kept for the backward

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # this rank's thread only
        out = module(x)
    if target is not None:
        loss(out, target).backward()
    return {
        "out": out.detach(),
        "grad_x": x.grad,
        "grads": {n: p.grad for n, p in module.named_parameters()},
        "saved_bytes": sum(saved.values()),
    }


def mlp_step(
    comm: Comm,
    dense: models.MLP,
    x: torch.Tensor,
    target: torch.Tensor | None = None,
    sequence_parallel: bool = False,
    input_grad: bool = True,
) -> dict[str, Any]:
    """x: [b, s, h] (full; sliced along seq here when sequence_parallel, and then the sequence-parallel bias
    gradient is all-reduced after the backward)."""
    mlp = ParallelMLP.from_dense(dense, comm, sequence_parallel=sequence_parallel)
    if sequence_parallel and x.shape[1] % comm.world_size:
        raise ValueError(f"seq={x.shape[1]} is not divisible by tp={comm.world_size} (sequence parallelism gives "
                         "every rank an equal slice of the sequence)")
    if not sequence_parallel:
        return _step(mlp, x, target, input_grad)
    x = x.chunk(comm.world_size, dim=1)[comm.rank]  # [b, s, h] -> [b, s/p, h]
    if target is not None:
        target = target.chunk(comm.world_size, dim=1)[comm.rank]
    res = _step(mlp, x, target, input_grad)
    if target is not None:  # b2 saw this rank's tokens only: sum its gradient over the group (in place)
        allreduce_sequence_parallel_grads(mlp, comm)
    return res


def attention_step(
    comm: Comm, dense: models.Attention, x: torch.Tensor, target: torch.Tensor | None = None, input_grad: bool = True
) -> dict[str, Any]:
    return _step(ParallelAttention.from_dense(dense, comm), x, target, input_grad)


def transformer_layer_step(
    comm: Comm, dense: models.TransformerBlock, x: torch.Tensor, target: torch.Tensor | None = None
) -> dict[str, Any]:
    """x: [b, s, h] (full, replicated). One pre-LayerNorm layer: attention then MLP, each with its f and g."""
    return _step(ParallelTransformerBlock.from_dense(dense, comm), x, target)


def embedding_step(
    comm: Comm, dense: torch.nn.Embedding, ids: torch.Tensor, target: torch.Tensor | None = None
) -> dict[str, Any]:
    return _step(VocabParallelEmbedding.from_dense(dense, comm), ids, target, input_grad=False)


def tied_lm_step(
    comm: Comm, dense: torch.nn.Embedding, ids: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> dict[str, Any]:
    """The tied, vocab-parallel embedding and output layer around a stand-in model (tanh): ids [b, s] -> E[ids]
    (g: all-reduce [b, s, h]) -> tanh -> f -> x E_i^T [b, s, V_i] -> vocab-parallel CE -> backward of its sum.
    Returns the per-token loss and this rank's rows of the tied weight's gradient (both contributions: the
    lookup's and the output layer's)."""
    emb = VocabParallelEmbedding.from_dense(dense, comm)
    x = torch.tanh(emb(ids))  # [b, s, h]: the model between the two ends
    logits = emb.logits(x)  # f(x) E_i^T: [b, s, V_i]; f's backward all-reduces dx [b, s, h]
    loss = vocab_parallel_cross_entropy(logits, target, comm, label_smoothing, ignore_index, vocab=emb.vocab)
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": emb.weight.grad, "range": (emb.start, emb.end)}


def ce_step(
    comm: Comm,
    logits: torch.Tensor,
    target: torch.Tensor,
    method: str = "vocab_parallel",
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    backward: bool = True,
) -> dict[str, Any]:
    """logits: FULL [b, s, V]; this rank keeps columns vocab_range(V, rank, p), then computes the loss by
    `method` ("vocab_parallel" or "gather") and backward of loss.sum() -> grad of its logits shard."""
    fns = {"vocab_parallel": vocab_parallel_cross_entropy, "gather": gathered_cross_entropy}
    if method not in fns:
        raise ValueError(f"method={method!r} is not one of {sorted(fns)}")
    v = logits.shape[-1]
    start, end = vocab_range(v, comm.rank, comm.world_size)
    local = logits[..., start:end].detach().clone().requires_grad_(backward)  # [b, s, V_i]
    loss = fns[method](local, target, comm, label_smoothing, ignore_index, vocab=v)  # [b, s]
    if backward:
        loss.sum().backward()
    return {"loss": loss.detach(), "grad_logits": local.grad, "range": (start, end)}

