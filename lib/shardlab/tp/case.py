"""Megatron tensor parallelism as cases: the MLP, attention, a layer, the embedding and the cross-entropy.

Design
------
Each case holds its notebook's parameters ``p`` (:mod:`shardlab.core.params`: ``MlpParams`` for 02 — ``MlpCase``,
``AttentionParams`` for 03 — ``AttentionCase``, ``LayerCase``, ``VocabParams`` for 04 — ``EmbeddingCase``,
``TiedOutputCase``, ``CrossEntropyCase``) and the variant it shows; :mod:`shardlab.core.harness` runs it through the
four views. A :class:`TpCase` subclass mostly names things: its dense module, per-rank step, formula and GSPMD
annotation, and which slice of the dense gradients each rank must hold.

Values are named ``<phase>.<op>.{count,bytes,elements}`` (phase ``fwd`` / ``fwd_bwd``); the cross-entropy's
``<key>.{count,bytes,elements,wire_bytes,largest_array.elements}`` with key vocab_parallel / gather_logits
(+ ``_smoothing``), and :func:`ce_table_views` adds the ratios gathered / vocab-parallel. The mesh is
(data, tensor) = (n / tp, tp) over the process's n devices; the per-rank program runs on tp ranks. Compiled
programs are also checked for structure (:meth:`TpCase.read`: collectives within tp groups, nothing sharded
gathered, attention scores of local heads only) and, for attention, how many [b, nh/p, s, s] arrays each
compiler writes — a fusion decision recorded but never compared (``View.differs``).

Example::

    case = MlpCase(MlpParams(tp=4))
    harness.record(rec, "mlp", *harness.views(case))      # formula, ledger, hlo, tpu
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
import torch_xla.distributed.spmd as xs  # tp.case is imported after runtime.setup() (the notebooks' order)
from torch_xla.core.xla_builder import create_placeholder_tensor

from shardlab import models, runtime
from shardlab.blocks import ring
from shardlab.comm import Ledger
from shardlab.core import harness
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import COMPILERS, View, merge, traffic
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import dtype_bytes
from shardlab.models import loss
from shardlab.profile.hlo import Array, HloModule
from shardlab.tp import gspmd
from shardlab.tp.layers import vocab_range
from shardlab.tp.params import AttentionParams, MlpParams, VocabParams
from shardlab.tp.programs import (
    attention_step,
    ce_step,
    embedding_step,
    mlp_step,
    tied_lm_step,
    transformer_layer_step,
)

TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "bfloat16": dict(rtol=5e-2, atol=5e-2)}
FLOAT_TYPES = ("f32", "bf16", "f16", "f64")
_ALIASES = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy-start", "copy-done")
IGNORE_INDEX = -100
CE_METHODS = ("vocab_parallel", "gather")


def close(a: torch.Tensor, b: torch.Tensor, dtype: str) -> bool:
    return torch.allclose(a.float(), b.float(), **TOL[dtype])


def _squeeze(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def written_arrays(module: HloModule) -> list[tuple[str, Array]]:
    """(opcode, array) of every float array the scheduled entry computation writes (aliases, parameters and
    constants left out); a multi-output fusion contributes each of its arrays."""
    out = []
    for name in module.computations[module.entry]:
        ins = module.instructions[name]
        if ins.opcode not in _ALIASES:
            out += [(ins.opcode, a) for a in ins.shape if a.dtype in FLOAT_TYPES]
    return out


def dense_grads(dense: torch.nn.Module, x: torch.Tensor, target: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The oracle: output, input gradient and every parameter gradient of the unsharded module on the CPU (the
    same loss as the per-rank and GSPMD steps, ``models.loss``)."""
    x = x.clone().requires_grad_(target is not None and x.is_floating_point())
    out = dense(x)
    res = {"out": out.detach()}
    if target is not None:
        loss(out, target).backward()
        res |= {"grad_x": x.grad, **{n: q.grad for n, q in dense.named_parameters()}}
    return res


@dataclass(frozen=True)
class TpCase(Case):
    """A forward (+ backward of ½‖out − target‖², ``models.loss``) step of a dense module, Megatron-split over
    tp ranks. A subclass names, as class attributes, the dense module and the parameters that size it, its
    per-rank ``step``, its ``formulas.tp`` function and its GSPMD annotation (``tp.gspmd``)."""

    backward: bool = True

    dense_cls: ClassVar[Callable[..., torch.nn.Module]]  # the dense module: dense_cls(*(p.<size> for size in sizes))
    sizes: ClassVar[tuple[str, ...]] = ()
    step: ClassVar[Callable[..., dict[str, Any]]]  # the per-rank program: fn(comm, dense, x, target)
    formula_fn: ClassVar[Callable[..., dict[str, int]]]  # fn(batch, seq, hidden, tp, dtype, backward=...)
    shard_fn: ClassVar[Callable[[torch.nn.Module, xs.Mesh], torch.nn.Module]]  # annotates the dense module
    gathers: ClassVar[bool] = False  # True: the program may all-gather (read() checks the group sizes only)
    grads_text: ClassVar[str] = "rank i's parameter gradients == dense slices"

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    def dense(self) -> torch.nn.Module:
        return self.dense_cls(*(getattr(self.p, n) for n in self.sizes))

    def inputs(self) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]:
        """The dense module (built under the seed) and x, target [b, s, h] in the dtype, the same for every view."""
        p, dt = self.p, getattr(torch, self.dtype)
        g = torch.Generator().manual_seed(p.seed)
        with torch.random.fork_rng():
            torch.manual_seed(p.seed)
            dense = self.dense().to(dt)
        x = torch.randn(p.batch, p.seq, p.hidden, generator=g).to(dt)  # [b, s, h]
        target = torch.randn(p.batch, p.seq, p.hidden, generator=g).to(dt) if self.backward else None
        return dense, x, target

    def program(self) -> list[Program]:
        return [(self.step, self.inputs())]

    def oracle(self) -> dict[str, torch.Tensor]:
        return dense_grads(*self.inputs())

    def formula(self) -> View:
        p = self.p
        f = self.formula_fn(p.batch, p.seq, p.hidden, p.tp, p.dtype, backward=self.backward)
        return traffic(View("formula", detail=f), self.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                       p.dtype)

    def want_grads(self, ref: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        """Rank ``rank``'s share of the dense gradients, named like its parallel module's parameters."""
        return {}

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        dt = self.dtype
        if source == "hlo":  # the executed GSPMD program: [out, input grad, *parameter grads]
            checks = {"parity.hlo.output": (close(got[0], ref["out"], dt), "GSPMD output == dense")}
            if self.backward and ref.get("grad_x") is not None:
                checks["parity.hlo.grad_input"] = (close(got[1], ref["grad_x"], dt), "GSPMD input gradient == dense")
            elif self.backward:  # integer input (token ids): the first gradient is the weight's
                name = next(n for n in ref if n not in ("out", "grad_x"))
                checks["parity.hlo.grad_weight"] = (close(got[1], ref[name], dt), "GSPMD weight gradient == dense")
            return checks
        checks = {"parity.ledger.output": (all(close(r["out"], ref["out"], dt) for r in got),
                                           "every rank's output == dense output")}
        if self.backward and ref.get("grad_x") is not None:
            checks["parity.ledger.grad_input"] = (all(close(r["grad_x"], ref["grad_x"], dt) for r in got),
                                                  "every rank's input gradient == dense")
        if self.backward:
            checks["parity.ledger.grad_weights"] = (
                all(close(r["grads"][n], w, dt) for i, r in enumerate(got) for n, w in self.want_grads(ref, i).items()),
                self.grads_text)
        return checks

    def shard(self, module: torch.nn.Module, mesh: xs.Mesh) -> torch.nn.Module:
        return self.shard_fn(module, mesh)

    def graph(self) -> Step:
        """The GSPMD step on the current world, NOT synced: [out, (input grad, *parameter grads)]."""
        dense, x, target = self.inputs()
        dev = runtime.device()
        module = self.shard(dense.to(dev), gspmd.tensor_mesh(self.p.tp))  # created on CPU, moved, then annotated
        return Step(gspmd.step(module, x.to(dev), target.to(dev) if target is not None else None))

    def read(self, view: View, module: HloModule) -> View:
        src = view.source
        view.checks[f"{src}.group_size"] = (all(c.group_size == self.p.tp for c in module.collectives),
                                            f"every collective runs within groups of tp={self.p.tp}")
        if not self.gathers:
            view.checks[f"{src}.no_all_gather"] = (not any(c.op == "all-gather" for c in module.collectives),
                                                   "nothing sharded is gathered")
        return view


def _mlp_slices(ref: dict[str, torch.Tensor], prefix: str, rank: int, cols: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of a dense MLP's gradients: columns of A (fc1), rows of B (fc2), b2 whole (SP: summed)."""
    c = slice(rank * cols, (rank + 1) * cols)
    return {f"{prefix}fc1.weight": ref[f"{prefix}fc1.weight"][c], f"{prefix}fc1.bias": ref[f"{prefix}fc1.bias"][c],
            f"{prefix}fc2.weight": ref[f"{prefix}fc2.weight"][:, c], f"{prefix}fc2.bias": ref[f"{prefix}fc2.bias"]}


# ------------------------------------------------------------------------------------------------------ MLP
@dataclass(frozen=True)
class MlpCase(TpCase):
    """One Megatron MLP step: Z = gelu(X A) B, A column-parallel, B row-parallel over tp ranks."""

    p: MlpParams | AttentionParams
    sequence_parallel: bool = False  # activations outside the MLP split along the sequence (Korthikanti et al.)

    dense_cls, sizes = models.MLP, ("hidden", "ffn")
    step, formula_fn, shard_fn = staticmethod(mlp_step), staticmethod(ftp.mlp_all_reduce), staticmethod(gspmd.shard_mlp)
    gathers = True  # group sizes only: the sequence-parallel program gathers
    grads_text = "rank i's A_i, b1_i, B_i gradients == dense slices, b2's == dense"

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        if not self.sequence_parallel:
            return ("all_reduce",)
        return ("all_gather", "reduce_scatter") + (("all_reduce",) if self.backward else ())  # + b2's grad sum

    def program(self) -> list[Program]:
        return [(partial(mlp_step, sequence_parallel=self.sequence_parallel), self.inputs())]

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        if source == "ledger" and self.sequence_parallel:  # outputs and input gradients are sequence shards
            out = torch.cat([r["out"] for r in got], dim=1)
            gx = torch.cat([r["grad_x"] for r in got], dim=1) if self.backward else None
            got = [dict(r, out=out, grad_x=gx) for r in got]
        return super().parity(source, got, ref)

    def formula(self) -> View:
        if not self.sequence_parallel:
            return super().formula()
        p = self.p
        f = ftp.sequence_parallel(p.batch, p.seq, p.hidden, p.tp, p.dtype, backward=self.backward,
                                  sp_params=p.hidden)  # b2 [h] acts on each rank's s/p tokens
        return traffic(View("formula", detail=f), self.phase, {op: f[f"{op}.count"] for op in self.ops},
                       {op: f[f"{op}.bytes"] for op in self.ops}, p.dtype, self.ops)

    def want_grads(self, ref: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        return _mlp_slices(ref, "", rank, self.p.ffn // self.p.tp)


def same_results(a: list[dict[str, Any]], b: list[dict[str, Any]], dtype: str) -> bool:
    """Outputs and input gradients equal rank by rank (up to summation order: the dtype's tolerance)."""
    return all(close(x["out"], y["out"], dtype) and (x["grad_x"] is None or close(x["grad_x"], y["grad_x"], dtype))
               for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------------ attention
def _attention_slices(ref: dict[str, torch.Tensor], prefix: str, rank: int, cols: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of a dense attention's gradients, named like ParallelAttention's parameters."""
    c = slice(rank * cols, (rank + 1) * cols)  # this rank's heads: rows of W_Q/W_K/W_V, columns of W_O
    return {f"{prefix}qkv.weight": torch.cat([ref[f"{prefix}{n}.weight"][c] for n in "qkv"]),
            f"{prefix}qkv.bias": torch.cat([ref[f"{prefix}{n}.bias"][c] for n in "qkv"]),
            f"{prefix}out.weight": ref[f"{prefix}out.weight"][:, c], f"{prefix}out.bias": ref[f"{prefix}out.bias"]}


@dataclass(frozen=True)
class AttentionCase(TpCase):
    """One Megatron self-attention step: heads split over tp ranks — Q/K/V column-parallel (one fused f), the
    output projection row-parallel (one g).

    ``separate_qkv``: the GSPMD graph computes Q, K, V with three separate projections
    (``gspmd.SeparateQkvAttention``; the per-rank program still applies one f before them). A compiler that then
    all-reduces more input gradients than the formula's one f records the count as differing, with the reason.
    ``specs``: annotate the dense module's parameters with these ``{name: spec}`` instead of Megatron's layout
    (``gspmd.shard_attention``) — what an exercise's answer is compiled with."""

    p: AttentionParams
    separate_qkv: bool = False
    specs: dict[str, tuple] | None = None

    sizes = ("hidden", "heads")
    step, formula_fn = staticmethod(attention_step), staticmethod(ftp.attention_all_reduce)
    shard_fn = staticmethod(gspmd.shard_attention)
    grads_text = "rank i's Q/K/V/O gradients == dense slices of its heads"

    @property
    def dense_cls(self) -> type[models.Attention]:  # type: ignore[override]
        return gspmd.SeparateQkvAttention if self.separate_qkv else models.Attention

    def want_grads(self, ref: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        return _attention_slices(ref, "", rank, self.p.hidden // self.p.tp)

    def shard(self, module: torch.nn.Module, mesh: xs.Mesh) -> torch.nn.Module:
        if self.specs is not None:
            return gspmd.shard_params(module, mesh, self.specs)
        return super().shard(module, mesh)

    def score_arrays(self, module: HloModule) -> list[tuple[str, Array]]:
        """Float arrays of the local scores' shape [b, nh/p, s, s] (size-1 dims ignored) the program writes."""
        p = self.p
        want = _squeeze((p.batch, p.heads // p.tp, p.seq, p.seq))
        return [(op, a) for op, a in written_arrays(module) if _squeeze(a.dims) == want]

    def read(self, view: View, module: HloModule) -> View:
        view = super().read(view, module)  # heads stay sharded: no q/k/v all-gather
        p, src, count = self.p, view.source, f"{self.phase}.all_reduce.count"
        f_count = self.formula()[count]
        got = view.get(f"{self.phase}.all_reduce.operands", view.get(count))
        if self.separate_qkv and got is not None and got > f_count:
            for q in ("count", "bytes", "elements"):
                view.differs[f"{self.phase}.all_reduce.{q}"] = (
                    f"{COMPILERS[src]}'s partitioner all-reduced the input gradient of each of the three "
                    f"projections separately ({got} all-reduces, the formula's one f gives {f_count})")
        if p.tp > 1:  # no device holds all heads' [s, s] (or [s, hd]) blocks
            full = _squeeze((p.batch, p.heads, p.seq, p.seq))
            view.checks[f"{src}.scores_stay_local"] = (
                not any(_squeeze(a.dims) == full for _, a in written_arrays(module)),
                f"no [b, nh={p.heads}, s, s] array: each device computes the scores of its {p.heads // p.tp} heads")
        name = f"{self.phase}.scores.arrays"
        if p.hidden // p.heads == p.seq:
            view.notes.append(f"{name} not counted: head_dim = seq = {p.seq}, so q, k, v have the scores' shape")
            return view
        scores = self.score_arrays(module)
        view.add(name, len(scores), "count")
        types = sorted({a.dtype for _, a in scores})
        view.differs[name] = (f"a fusion decision of this compiler, not part of the algorithm: {len(scores)} "
                              f"[b, nh/p, s, s] arrays written ({'/'.join(types) or 'none'})")
        return view


@dataclass(frozen=True)
class LayerCase(TpCase):
    """One pre-LayerNorm transformer layer, x + Attn(LN(x)) then + MLP(LN(.)): attention and MLP each Megatron-
    split (one f, one g), the LayerNorms replicated. Per step 2 + 2 all-reduces of [b, s, h]."""

    p: AttentionParams

    dense_cls, sizes = models.TransformerBlock, ("hidden", "heads", "ffn")
    step, formula_fn = staticmethod(transformer_layer_step), staticmethod(ftp.transformer_layer_all_reduce)
    shard_fn = staticmethod(gspmd.shard_transformer_block)
    grads_text = "rank i's attention/MLP gradients == dense slices; LayerNorm gradients == dense on every rank"

    def want_grads(self, ref: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        p = self.p
        return (_attention_slices(ref, "attn.", rank, p.hidden // p.tp) | _mlp_slices(ref, "mlp.", rank, p.ffn // p.tp)
                | {n: ref[n] for n in ref if n.startswith("ln")})  # replicated LayerNorms: the full gradient


# ------------------------------------------------------------------------------------------------ embedding
def token_ids(p: VocabParams) -> torch.Tensor:
    """[b, s] token ids, seeded; the first and the last id are 0 and V - 1 (both ends of the table)."""
    g = torch.Generator().manual_seed(p.seed + 1)
    ids = torch.randint(0, p.vocab, (p.batch, p.seq), generator=g)
    ids.view(-1)[0], ids.view(-1)[-1] = 0, p.vocab - 1
    return ids


@dataclass(frozen=True)
class EmbeddingCase(TpCase):
    """Vocab-parallel embedding lookup: rows of E [V, h] split by `vocab_range` (uneven V: the first V mod p
    ranks own one row more); each rank looks up the ids it owns, zeros elsewhere, and g sums the ranks' rows."""

    p: VocabParams
    backward: bool = False  # + backward of ½‖out − target‖²: the weight gradient (no communication)

    dense_cls, sizes = torch.nn.Embedding, ("vocab", "hidden")
    step, shard_fn = staticmethod(embedding_step), staticmethod(gspmd.shard_embedding)

    def inputs(self) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]:
        dense, _, target = super().inputs()
        return dense, token_ids(self.p), target

    def formula(self) -> View:
        p = self.p
        f = ftp.embedding_all_reduce(p.batch, p.seq, p.hidden, p.tp, p.dtype)  # the backward adds none
        return traffic(View("formula", detail=f), self.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                       p.dtype)

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        if source == "hlo":
            return super().parity(source, got, ref)
        p = self.p
        checks = {"parity.ledger.output": (all(torch.equal(r["out"], ref["out"]) for r in got),
                                           "exact: one rank contributes each row, the others add zeros")}
        if self.backward:
            checks["parity.ledger.grad_weight"] = (
                all(close(r["grads"]["weight"], ref["weight"][slice(*vocab_range(p.vocab, i, p.tp))], self.dtype)
                    for i, r in enumerate(got)), "rank i's rows of the gradient == dense rows")
        return checks

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        if self.backward:
            view.checks["ledger.no_backward_collectives"] = (ledger.count(phase="backward") == 0,
                                                             "the weight gradient of a lookup is local")
        return view


@dataclass(frozen=True)
class TiedOutputCase(TpCase):
    """The tied vocab-parallel embedding and output layer around a stand-in model (``programs.tied_lm_step``):
    lookup (g), tanh, output layer (f, then x E_i^T), vocab-parallel loss, backward. Per step: forward 1 all-reduce of
    [b, s, h] and 3 (4 with label smoothing) of [b, s]; backward exactly 1 — the output layer's f, dx [b, s, h].
    The tied weight's gradient is the sum of the lookup's contribution (rows of the ids) and the output layer's
    (dlogits_iᵀ x), both local to the rank that owns the rows. Formula and ledger only (per-rank code)."""

    p: VocabParams
    smoothing: bool = False

    @property
    def label_smoothing(self) -> float:
        return float(self.p.label_smoothing) if self.smoothing else 0.0

    def inputs(self) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """The dense embedding (seeded, in the dtype), ids [b, s] and target ids [b, s] (``IGNORE_INDEX`` at (0, 1)
        when s > 1)."""
        p = self.p
        with torch.random.fork_rng():
            torch.manual_seed(p.seed)
            dense = torch.nn.Embedding(p.vocab, p.hidden).to(getattr(torch, self.dtype))
        target = token_ids(replace(p, seed=p.seed + 1))
        if p.seq > 1:
            target[0, 1] = IGNORE_INDEX
        return dense, token_ids(p), target

    def program(self) -> list[Program]:
        return [(tied_lm_step, (*self.inputs(), self.label_smoothing, IGNORE_INDEX))]

    def oracle(self) -> dict[str, torch.Tensor]:
        """The dense tied model on the CPU, in float64: per-token loss and the tied weight's gradient (and its
        lookup part). float64 because a float32 softmax over V = 50257 columns is off by ~3e-5 relative (its
        normaliser sums 50257 terms in one pass, measured), more than the per-rank code's error."""
        dense, ids, target = self.inputs()

        def tied(weight: torch.Tensor, lookup_weight: torch.Tensor) -> torch.Tensor:
            logits = torch.tanh(F.embedding(ids, lookup_weight)) @ weight.t()  # [b, s, V]
            return F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none",
                                   label_smoothing=self.label_smoothing, ignore_index=IGNORE_INDEX).view_as(target)

        w = dense.weight.detach().double().requires_grad_(True)
        per_token = tied(w, w)
        per_token.sum().backward()
        lookup = w.detach().clone().requires_grad_(True)
        (lookup_grad,) = torch.autograd.grad(tied(w.detach(), lookup).sum(), lookup)
        return {"loss": per_token.detach(), "weight": w.grad, "lookup": lookup_grad}

    def formula(self) -> View:
        p, b, s = self.p, self.p.batch, self.p.seq
        parts = [ftp.embedding_all_reduce(b, s, p.hidden, p.tp, p.dtype),
                 ftp.vocab_parallel_ce(b, s, p.tp, p.dtype, self.label_smoothing),
                 ftp.output_layer_all_reduce(b, s, p.hidden, p.tp, p.dtype, backward=True)]
        view = traffic(View("formula", detail=parts), self.phase, {"all_reduce": sum(f["count"] for f in parts)},
                       {"all_reduce": sum(f["bytes"] for f in parts)}, p.dtype)
        view.add("bwd.all_reduce.count", parts[2]["count"], "count")
        view.add("bwd.all_reduce.bytes", parts[2]["bytes"], "bytes")
        return view

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        dt, rows = self.dtype, [slice(*r["range"]) for r in got]
        ids = set(token_ids(self.p).flatten().tolist())
        lookup_rows = set(torch.nonzero(ref["lookup"].abs().sum(1)).flatten().tolist())
        return {"parity.ledger.loss": (all(close(r["loss"], ref["loss"], dt) for r in got),
                                       "per-token loss == the dense tied model's, on every rank"),
                "parity.ledger.grad_weight": (all(close(r["grad"], ref["weight"][i], dt) for r, i in zip(got, rows,
                                                                                                       strict=True)),
                                              "rank i's rows of the tied gradient == dense rows (both contributions)"),
                "dense.lookup_rows": (lookup_rows <= ids, "the lookup's contribution touches only the ids' rows")}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        bwd = ledger.select(phase="backward")
        view.add("bwd.all_reduce.count", bwd.count("all_reduce"), "count")
        view.add("bwd.all_reduce.bytes", bwd.payload_bytes("all_reduce"), "bytes")
        view.checks["ledger.bwd.is_f"] = ([e.tag for e in bwd] == ["f"] if self.p.tp > 1 else not len(bwd),
                                          f"the backward's collectives: {[(e.tag, e.shape) for e in bwd]}")
        return view


# -------------------------------------------------------------------------------------------- cross-entropy
@dataclass(frozen=True)
class CrossEntropyCase(TpCase):
    """Per-token cross-entropy of vocab-sharded logits [b, s, V] (torch's definition: label smoothing over the
    GLOBAL vocab, ``ignore_index`` -100 at one position when s > 1), then backward of the summed loss.

    ``method``: "vocab_parallel" (reductions over the vocab: 3 all-reduces of [b, s], 4 with label smoothing) or
    "gather" (all-gather the logits, then the dense loss). ``smoothing``: use ``p.label_smoothing`` (else 0).
    ``placeholders``: logits and targets are placeholder tensors (no memory, no values) — for compile-only TPU
    programs at sizes this machine could not hold; the ledger and CPU compiler views skip such a case.
    """

    p: VocabParams
    method: str = "vocab_parallel"
    smoothing: bool = False
    placeholders: bool = False

    def __post_init__(self) -> None:
        if self.method not in CE_METHODS:
            raise ValueError(f"method={self.method!r} is not one of {CE_METHODS}")

    @property
    def label_smoothing(self) -> float:
        return float(self.p.label_smoothing) if self.smoothing else 0.0

    @property
    def key(self) -> str:
        base = "gather_logits" if self.method == "gather" else "vocab_parallel"
        return base + ("_smoothing" if self.label_smoothing > 0 else "")

    @property
    def op(self) -> str:
        return "all_gather" if self.method == "gather" else "all_reduce"

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.op,)

    @property
    def gathers(self) -> bool:  # type: ignore[override]
        return self.method == "gather"

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Logits [b, s, V] (N(0, 2²), seeded) in the dtype and targets [b, s]: token ids with both ends of the
        vocab, and ``IGNORE_INDEX`` at position (0, 1) when s > 1."""
        p = self.p
        g = torch.Generator().manual_seed(p.seed)
        logits = (torch.randn(p.batch, p.seq, p.vocab, generator=g) * 2).to(getattr(torch, self.dtype))
        target = token_ids(p)
        if p.seq > 1:
            target[0, 1] = IGNORE_INDEX
        return logits, target

    def oracle(self) -> dict[str, torch.Tensor]:
        """torch's per-token loss [b, s] of the full logits and its gradient [b, s, V] (in f32)."""
        if self.placeholders:
            return None  # type: ignore[return-value]
        logits, target = self.inputs()
        z = logits.float().requires_grad_(True)
        loss = F.cross_entropy(z.flatten(0, 1), target.flatten(), reduction="none",
                               label_smoothing=self.label_smoothing, ignore_index=IGNORE_INDEX).view_as(target)
        loss.sum().backward()
        return {"loss": loss.detach(), "grad": z.grad}

    def program(self) -> list[Program]:
        if self.placeholders:
            return []
        return [(ce_step, (*self.inputs(), self.method, self.label_smoothing, IGNORE_INDEX, self.backward))]

    def not_executable(self) -> str | None:
        return "placeholder logits cannot be executed (compile-only TPU programs)" if self.placeholders else None

    def renamed(self, view: View, wire: float | None = None) -> View:
        """``<phase>.<op>.<q>`` -> ``<key>.<q>``, plus ``<key>.wire_bytes``: the formula's ring model for the
        formula view; for a measured view ``wire``, the bytes its collectives send counted along the ring schedule
        (:func:`wire_counted`) — so formula = measured on wire tests the formula's factor."""
        view = view.renamed(lambda n: n.replace(f"{self.phase}.{self.op}.", f"{self.key}.", 1))
        if view.ran and wire is not None:
            view.add(f"{self.key}.wire_bytes", float(wire), "bytes")
            if f"{self.key}.bytes" in view.differs:
                view.differs[f"{self.key}.wire_bytes"] = view.differs[f"{self.key}.bytes"]
        return view

    def formula(self) -> View:
        p, b, s = self.p, self.p.batch, self.p.seq
        if self.method == "gather":
            f = ftp.gathered_logits(b, s, p.vocab, p.tp, self.dtype)
        else:
            f = ftp.vocab_parallel_ce(b, s, p.tp, self.dtype, self.label_smoothing)
        view = self.renamed(traffic(View("formula", detail=f), self.phase, {self.op: f["count"]},
                                    {self.op: f["bytes"]}, self.dtype, self.ops), f["wire_bytes"])
        if self.backward and p.tp > 1:
            mem = ftp.ce_logits_bytes(b, s, p.vocab, p.tp, self.dtype)
            view.add(f"{self.key}.largest_array.elements",
                     mem["gathered" if self.method == "gather" else "vocab_parallel"] // dtype_bytes(self.dtype),
                     "elements")
        return view

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        k, dt = self.key, self.dtype
        if source == "hlo":
            checks = {f"parity.hlo.{k}.loss": (close(got[0], ref["loss"], dt), "GSPMD loss == F.cross_entropy")}
            if self.backward:
                checks[f"parity.hlo.{k}.grad"] = (close(got[1][..., :self.p.vocab], ref["grad"], dt),
                                                  "GSPMD logits gradient == dense")
            return checks
        checks = {f"parity.ledger.{k}.loss": (all(close(r["loss"], ref["loss"], dt) for r in got),
                                              "per-token loss == F.cross_entropy on every rank")}
        if self.backward:
            checks[f"parity.ledger.{k}.grad"] = (
                all(close(r["grad_logits"], ref["grad"][..., slice(*r["range"])], dt) for r in got),
                "logits gradient shard == dense gradient columns")
        return checks

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        view = self.renamed(view, wire_counted(view, self.op))
        if self.backward:
            view.checks[f"ledger.{self.key}.no_backward_collectives"] = (ledger.count(phase="backward") == 0,
                                                                         "the backward is local")
        return view

    def graph(self) -> Step:
        """The GSPMD loss (+ backward of its sum) on the current world, NOT synced: [loss, (logits grad)]."""
        p, b, s = self.p, self.p.batch, self.p.seq
        mesh = gspmd.tensor_mesh(p.tp)
        if self.placeholders:  # compile-only: nothing allocated; annotate a value computed from the placeholder
            leaf = create_placeholder_tensor((b, s, p.vocab), getattr(torch, self.dtype))
            target = create_placeholder_tensor((b, s), torch.int64)
            z = gspmd.shard_logits(leaf.requires_grad_(self.backward) * 1, mesh)  # [b, s, V/p] per device
        else:
            logits, target = self.inputs()
            leaf = z = gspmd.shard_logits(logits.to(runtime.device()), mesh).requires_grad_(self.backward)
            target = target.to(runtime.device())
        if self.method == "gather":
            loss = gspmd.gathered_ce(z, target, mesh, self.label_smoothing, IGNORE_INDEX)
        else:
            loss = gspmd.vocab_parallel_ce(z, target, self.label_smoothing, IGNORE_INDEX)
        if not self.backward:
            return Step([loss])
        loss.sum().backward()
        # Returned padded to [b, s, p ceil(V/p)] (even shards): measured with libtpu 0.0.21, XLA:TPU returns an
        # UNEVENLY sharded output replicated — an all-gather of the gradient that no training step would issue (the
        # gradient feeds the output layer's backward, it is not a program output); XLA:CPU keeps it sharded.
        pad = p.tp * ftp.shard_width(p.vocab, p.tp) - p.vocab
        grad = F.pad(leaf.grad, (0, pad)) if pad else leaf.grad
        xs.mark_sharding(grad, mesh, (None, None, gspmd.AXIS))  # the gradient stays a vocab shard, like the logits
        return Step([loss, grad])

    def read(self, view: View, module: HloModule) -> View:
        view = super().read(self.renamed(view, wire_counted(view, self.op, module)), module)
        others = [c for c in module.collectives if c.op != self.op.replace("_", "-")]
        if others:
            kinds = sorted({f"{c.op} {c.dtype}{list(c.shape[0])}" for c in others})
            view.notes.append(f"{self.key}: the {view.source} program also issues {len(others)} other collective(s) "
                              f"({', '.join(kinds)}): the partitioner's choice for the backward, not part of the "
                              "method")
        if self.backward:
            largest = max((math.prod(a.dims) for _, a in written_arrays(module)), default=0)
            view.add(f"{self.key}.largest_array.elements", largest, "elements")
        return view


def wire_counted(view: View, op: str, module: HloModule | None = None, per_element: bool = False) -> float:
    """Bytes (``per_element``: elements) one rank sends for the ``op`` collectives of a measured view — a
    ledger (its entries) or a compiled program (``module``, else the view's ``detail.module``) — counted chunk
    by chunk along the ring schedule (:func:`shardlab.blocks.ring.wire_bytes`), not by the formula's factor."""
    if view.source == "ledger":
        items = [(math.prod(e.shape), e.group_size, e.payload_bytes // max(math.prod(e.shape), 1))
                 for e in view.detail["ledger"].select(op)]
    else:
        module = module if module is not None else view.detail.module
        items = [(math.prod(s), c.group_size, c.operand_bytes // max(sum(math.prod(t) for t in c.operand_shapes), 1))
                 for c in module.collectives if c.op == op.replace("_", "-") for s in c.operand_shapes]
    return sum(ring.wire_bytes(op, n, g, 1 if per_element else size) for n, g, size in items if n)


def ce_cases(p: VocabParams, **variant: Any) -> dict[str, CrossEntropyCase]:
    """Both methods of one variant: ``{key: case}``."""
    cases = (CrossEntropyCase(p, method=m, **variant) for m in CE_METHODS)
    return {c.key: c for c in cases}


def ce_table_views(vocab_parallel: list[View], gather: list[View], p: VocabParams, smoothing: bool = False
                   ) -> list[View]:
    """One view per source that has both programs: their values together plus the two ratios, gathered /
    vocab-parallel, named ``saving_ratio`` (wire per rank) and ``payload_ratio`` (payload per rank) (+
    ``_smoothing``). Measured views compute them from ELEMENTS (dtype-free: XLA:CPU reduces 16-bit floats in f32
    but gathers them as they are), the wire counted along the ring schedule (:func:`wire_counted`); the formula
    view from ``formulas.tp``'s named ratios."""
    ls = float(p.label_smoothing) if smoothing else 0.0
    suffix = "_smoothing" if ls > 0 else ""
    out = []
    for vp in vocab_parallel:
        ga = next((g for g in gather if g.source == vp.source), None)
        if ga is None:
            continue
        view = merge(vp, ga)
        if view.ran:
            if view.source == "formula":
                wire, payload = ftp.ce_wire_ratio(p.vocab, p.tp, ls), ftp.ce_payload_ratio(p.vocab, p.tp, ls)
            else:  # wire elements counted along the ring schedule; payload elements as recorded
                vp_el = next(v for n, v in vp.values.items() if n.endswith(".elements") and "largest" not in n)
                ga_el = next(v for n, v in ga.values.items() if n.endswith(".elements") and "largest" not in n)
                wire = (wire_counted(ga, "all_gather", per_element=True)
                        / wire_counted(vp, "all_reduce", per_element=True))
                payload = ga_el / vp_el
            view.add(f"saving_ratio{suffix}", wire, "ratio")
            view.add(f"payload_ratio{suffix}", payload, "ratio")
        out.append(view)
    return out


def explore(kind: str, tp: int, batch: int, seq: int, hidden: int, heads: int, vocab: int) -> dict[str, Any]:
    """Formula vs ledger of one small configuration (forward + backward; ffn = 4·hidden) for notebooks 02-04's
    explorers: ``kind`` "mlp", "attention" or "embedding_ce" (the embedding, then the vocab-parallel loss) through
    ``harness.ledger`` and ``harness.formula``, counts and payload bytes summed: ``{"formula", "ledger": {"count",
    "bytes"}, "ledger_obj"}`` (+ ``"gathered_bytes"``, the gathered logits' payload, for embedding_ce)."""
    sizes = dict(tp=tp, batch=batch, seq=seq, hidden=hidden)
    if kind == "mlp":
        cases: list[TpCase] = [MlpCase(MlpParams(**sizes, ffn=4 * hidden))]
    elif kind == "attention":
        cases = [AttentionCase(AttentionParams(**sizes, heads=heads, ffn=4 * hidden))]
    elif kind == "embedding_ce":
        cases = [EmbeddingCase(VocabParams(**sizes, vocab=vocab), backward=True),
                 CrossEntropyCase(VocabParams(**sizes, vocab=vocab))]
    else:
        raise ValueError(f"kind={kind!r} is not one of 'mlp', 'attention', 'embedding_ce'")
    ledgers = [harness.ledger(c) for c in cases]
    led = Ledger([replace(e, seq=i) for i, e in enumerate(e for v in ledgers for e in v.detail["ledger"])])

    def total(views: list[View]) -> dict[str, int]:
        return {q: sum(x for v in views for n, x in v.values.items() if n.endswith(f".{q}"))
                for q in ("count", "bytes")}

    res = {"formula": total([harness.formula(c) for c in cases]), "ledger": total(ledgers), "ledger_obj": led}
    if kind == "embedding_ce":
        res["gathered_bytes"] = ftp.gathered_logits(batch, seq, vocab, tp)["bytes"]
    return res
