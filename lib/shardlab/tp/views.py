"""Megatron tensor parallelism, four views of one configuration: formula, ledger, CPU compiler, TPU compiler.

Design
------
A configuration dataclass (:class:`MlpConfig`, ...) fixes sizes, dtype, phase and the seed of the weights,
so every view computes the same step from the same numbers::

    formula(cfg)    the paper's algebra                       (shardlab.formulas.tp)
    ledger(cfg)     per-rank Megatron code in a SimulatedWorld (shardlab.tp.layers / programs)
    compiler(cfg)   the dense module with mark_sharding on the CPU devices; the HLO of XLA's partitioner
    tpu(cfg)        the same graph compiled by XLA:TPU for a TPU topology (compile-only)

Configurations (the views dispatch on the type):

    MlpConfig               Z = gelu(X A) B, A column-, B row-parallel (notebook 02)
    AttentionConfig         heads split; fused QKV column-parallel, output row-parallel (notebook 03)
    TransformerLayerConfig  pre-LayerNorm layer: attention + MLP, LayerNorms replicated (notebook 03)
    EmbeddingConfig         vocab rows split by `vocab_range` (uneven V allowed) (notebook 04)
    CrossEntropyConfig      vocab-sharded logits; "vocab_parallel" reductions or "gather" (notebook 04)

Each view returns a :class:`shardlab.views.View` whose values are named ``<phase>.<op>.{count,bytes,elements}``
(``phase`` = ``fwd`` or ``fwd_bwd``); the cross-entropy's are ``<key>.{count,bytes,elements,wire_bytes,
largest_array.elements}`` with ``key`` = vocab_parallel / gather_logits (+ ``_smoothing``), and
:func:`ce_table_views` adds the two ratios gathered / vocab-parallel (``saving_ratio``: wire bytes per rank,
``payload_ratio``: payload per rank). The compiler view runs on a mesh (data = n / tp, tensor = tp) over the
process's n devices and is skipped (with the reason) when tp does not tile them; the TPU view compiles the
same mesh for an n-chip topology, or — when the process has fewer devices than tp — a (1, tp) mesh for a
tp-chip topology in a helper process (``shardlab.profile.tpu.compile_program``). Parity with the dense
oracle is part of the ledger and compiler views (``View.checks``); so are structural invariants of the compiled
programs (:func:`program_extras`: collectives within tp groups, nothing sharded gathered, attention scores
of local heads only) and, for attention, how many [b, nh/p, s, s] arrays each compiler writes — a fusion
decision recorded but never compared (``View.differs``).

Example::

    cfg = MlpConfig(tp=4, batch=2, seq=8, hidden=64, ffn=256)
    record(rec, "mlp", formula(cfg), ledger(cfg), compiler(cfg), tpu(cfg))
    vp, ga = (CrossEntropyConfig(8, 1, 8, 50257, method=m) for m in CE_METHODS)
    views = {c.key: [formula(c), ledger(c), compiler(c), tpu(c)] for c in (vp, ga)}
    record(rec, "ce", *ce_table_views(views["vocab_parallel"], views["gather_logits"], 50257, 8))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import torch
import torch.nn.functional as F

from shardlab import models, runtime
from shardlab.comm import SimulatedWorld
from shardlab.formulas import tp as ftp
from shardlab.formulas.common import dtype_bytes, wire_bytes
from shardlab.tp import gspmd
from shardlab.tp.layers import vocab_range
from shardlab.tp.programs import attention_step, ce_step, embedding_step, mlp_step, transformer_layer_step
from shardlab.views import View, build_graph, collectives_view, compiler, formula, ledger, ledger_view, merge, traffic

TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "bfloat16": dict(rtol=5e-2, atol=5e-2)}


@dataclass(frozen=True)
class MlpConfig:
    """One Megatron MLP step: Z = gelu(X A) B, A column-parallel, B row-parallel over tp ranks."""

    tp: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    dtype: str = "float32"
    backward: bool = True  # forward + backward of (out * grad_out).sum(), or forward only
    sequence_parallel: bool = False  # activations outside the MLP split along the sequence (Korthikanti et al.)
    seed: int = 0

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> MlpConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, hidden=p.hidden, ffn=p.ffn, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


def mlp_inputs(cfg: MlpConfig) -> tuple[models.MLP, torch.Tensor, torch.Tensor | None]:
    """The dense oracle and its inputs, the same for every view: (MLP, x [b, s, h], grad_out [b, s, h])."""
    g = torch.Generator().manual_seed(cfg.seed)
    dt = getattr(torch, cfg.dtype)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        dense = models.MLP(cfg.hidden, cfg.ffn).to(dt)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt)  # [b, s, h]
    grad_out = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt) if cfg.backward else None
    return dense, x, grad_out


def dense_step(cfg: MlpConfig) -> dict[str, torch.Tensor]:
    """The oracle: output, input gradient and weight gradients of the unsharded module on the CPU."""
    dense, x, grad_out = mlp_inputs(cfg)
    x = x.clone().requires_grad_(cfg.backward)
    out = dense(x)
    res = {"out": out.detach()}
    if grad_out is not None:
        (out * grad_out).sum().backward()
        res |= {"grad_x": x.grad, "fc1.weight": dense.fc1.weight.grad, "fc2.weight": dense.fc2.weight.grad}
    return res


def _close(a: torch.Tensor, b: torch.Tensor, dtype: str) -> bool:
    return torch.allclose(a.float(), b.float(), **TOL[dtype])


# --------------------------------------------------------------------------------------------------- views
@formula.register
def _(cfg: MlpConfig) -> View:
    if cfg.sequence_parallel:
        f = ftp.sequence_parallel(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
        ops = ("all_gather", "reduce_scatter")
        return traffic(View("formula", detail=f), cfg.phase, {op: f[f"{op}.count"] for op in ops},
                       {op: f[f"{op}.bytes"] for op in ops}, cfg.dtype, ops)
    f = ftp.mlp_all_reduce(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
    return traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)


@ledger.register
def _(cfg: MlpConfig) -> View:
    dense, x, grad_out = mlp_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(mlp_step, dense, x, grad_out, sequence_parallel=cfg.sequence_parallel)
    if cfg.sequence_parallel:  # outputs and input gradients are sequence shards: put them back together
        ranks = [dict(r, out=torch.cat([q["out"] for q in ranks], dim=1),
                      grad_x=torch.cat([q["grad_x"] for q in ranks], dim=1) if cfg.backward else None)
                 for r in ranks]
    ops = ("all_gather", "reduce_scatter") if cfg.sequence_parallel else ("all_reduce",)
    view = ledger_view(sim.ledger, cfg.phase, ops, detail={"ledger": sim.ledger, "ranks": ranks})
    ref, c = dense_step(cfg), cfg.ffn // cfg.tp
    view.checks["parity.ledger.output"] = (all(_close(r["out"], ref["out"], cfg.dtype) for r in ranks),
                                           "every rank's output == dense output")
    if cfg.backward:
        view.checks["parity.ledger.grad_input"] = (
            all(_close(r["grad_x"], ref["grad_x"], cfg.dtype) for r in ranks), "every rank's input gradient == dense")
        view.checks["parity.ledger.grad_weights"] = (
            all(_close(r["grads"]["fc1.weight"], ref["fc1.weight"][i * c:(i + 1) * c], cfg.dtype)
                and _close(r["grads"]["fc2.weight"], ref["fc2.weight"][:, i * c:(i + 1) * c], cfg.dtype)
                for i, r in enumerate(ranks)), "rank i's A_i, B_i gradients == dense slices")
    return view


def _mesh_problem(tp: int, n: int) -> str | None:
    return runtime.axis_problem(tp, n, "tp", "(data, tensor) = (n / tp, tp)")


@build_graph.register
def _(cfg: MlpConfig) -> list[torch.Tensor]:
    """The GSPMD step on the current world, NOT synced: [out, (input grad, *weight grads)]."""
    dense, x, grad_out = mlp_inputs(cfg)
    dev = runtime.device()
    mlp = gspmd.shard_mlp(dense.to(dev), gspmd.tensor_mesh(cfg.tp))  # created on CPU, moved, then annotated
    return gspmd.step(mlp, x.to(dev), grad_out.to(dev) if grad_out is not None else None)


@compiler.register
def _(cfg: MlpConfig) -> View:
    from shardlab.profile import capture_hlo

    world = runtime.current()
    problem = _mesh_problem(cfg.tp, world.num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(build_graph, cfg)
    view = collectives_view("hlo", cap.module, cfg.phase, ("all_reduce",), cfg.dtype, detail=cap)
    ref = dense_step(cfg)
    view.checks["parity.hlo.output"] = (_close(cap.result[0].cpu(), ref["out"], cfg.dtype), "GSPMD output == dense")
    if cfg.backward:
        view.checks["parity.hlo.grad_input"] = (_close(cap.result[1].cpu(), ref["grad_x"], cfg.dtype),
                                                "GSPMD input gradient == dense")
    view.checks["hlo.group_size"] = (all(c.group_size == cfg.tp for c in cap.module.collectives),
                                     f"every collective runs within groups of tp={cfg.tp}")
    return view


def tpu(cfg: Any, generation: str = "v5e") -> View:
    """The same graph compiled by XLA:TPU (compile-only) — see the module docstring for the topology rule."""
    from shardlab.profile import tpu as T

    fits = _mesh_problem(cfg.tp, runtime.current().num_devices) is None
    topology, why = T.view_topology(cfg.tp, fits, generation)
    if topology is None:
        return View.skip("tpu", why)
    comp = T.compile_program(build_graph, cfg, topology)
    if not comp.fits:
        view = View("tpu", detail=comp)
        view.notes.append(f"does not fit on {topology}: {comp.oom.message.splitlines()[0]}")
        return view
    view = collectives_view("tpu", comp.module, cfg.phase, collective_ops(cfg), cfg.dtype, detail=comp)
    view.notes.append(f"XLA:TPU {topology}: {comp.num_chips} chips, compiled in {comp.compile_s:.2f} s")
    return program_extras(cfg, view, comp.module)


@singledispatch
def collective_ops(cfg: Any) -> tuple[str, ...]:
    """The collectives a configuration's compiled program is read for (the MLP: its all-reduces)."""
    return ("all_reduce",)


@singledispatch
def program_extras(cfg: Any, view: View, module: Any) -> View:
    """Configuration-specific values and checks read from a compiled program (hlo or tpu); none by default."""
    return view


# ------------------------------------------------------------------------------------------ real processes
def gloo_run(cfg: MlpConfig) -> dict[str, Any]:
    """The ledger's per-rank program in ``tp`` real processes (torch.distributed, gloo): {ledger, ranks}."""
    from shardlab.comm import DistributedWorld

    dense, x, grad_out = mlp_inputs(cfg)
    world = DistributedWorld(cfg.tp)
    ranks = world.run(mlp_step, dense, x, grad_out, sequence_parallel=cfg.sequence_parallel)
    return {"ledger": world.ledger, "ranks": ranks}


def same_results(a: list[dict[str, Any]], b: list[dict[str, Any]], cfg: MlpConfig) -> bool:
    """Outputs and input gradients equal rank by rank (up to summation order: the dtype's tolerance)."""
    return all(_close(x["out"], y["out"], cfg.dtype)
               and (x["grad_x"] is None or _close(x["grad_x"], y["grad_x"], cfg.dtype))
               for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------------------- helpers (03, 04)
FLOAT_TYPES = ("f32", "bf16", "f16", "f64")
# Instructions that only rename or move a buffer that another instruction wrote.
_ALIASES = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy-start", "copy-done")


def _squeeze(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def written_arrays(module: Any) -> list[tuple[str, Any]]:
    """(opcode, array) of every float array the scheduled entry computation writes (aliases, parameters and
    constants left out); a multi-output fusion contributes each of its arrays."""
    out = []
    for name in module.computations[module.entry]:
        ins = module.instructions[name]
        if ins.opcode in _ALIASES:
            continue
        out += [(ins.opcode, a) for a in ins.shape if a.dtype in FLOAT_TYPES]
    return out


def _wire(view: View, key: str, op: str, tp: int) -> View:
    """Add ``<key>.wire_bytes`` (ring model, from the view's payload ``<key>.bytes``; not compared where the
    payload is not)."""
    if not view.ran:
        return view
    view.add(f"{key}.wire_bytes", float(wire_bytes(op, view[f"{key}.bytes"], tp)), "bytes")
    if f"{key}.bytes" in view.differs:
        view.differs[f"{key}.wire_bytes"] = view.differs[f"{key}.bytes"]
    return view


def _group_and_gather_checks(cfg: Any, view: View, module: Any, gathers: bool = False) -> None:
    src = view.source
    view.checks[f"{src}.group_size"] = (all(c.group_size == cfg.tp for c in module.collectives),
                                        f"every collective runs within groups of tp={cfg.tp}")
    if not gathers:
        view.checks[f"{src}.no_all_gather"] = (not any(c.op == "all-gather" for c in module.collectives),
                                               "nothing sharded is gathered")


# ------------------------------------------------------------------------------------------------ attention
@dataclass(frozen=True)
class AttentionConfig:
    """One Megatron self-attention step: heads split over tp ranks — Q/K/V column-parallel (one fused f), the
    output projection row-parallel (one g)."""

    tp: int
    batch: int
    seq: int
    hidden: int
    heads: int
    dtype: str = "float32"
    backward: bool = True  # forward + backward of (out * grad_out).sum(), or forward only
    seed: int = 0

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> AttentionConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, hidden=p.hidden, heads=p.heads, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


def _inputs(cfg: Any, make: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """The dense module (``make()`` under the config's seed) and x, grad_out [b, s, h] in the config's dtype."""
    g = torch.Generator().manual_seed(cfg.seed)
    dt = getattr(torch, cfg.dtype)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        dense = make().to(dt)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt)  # [b, s, h]
    grad_out = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt) if cfg.backward else None
    return dense, x, grad_out


def attention_inputs(cfg: AttentionConfig) -> tuple[models.Attention, torch.Tensor, torch.Tensor | None]:
    return _inputs(cfg, lambda: models.Attention(cfg.hidden, cfg.heads))


def _dense_grads(dense: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The oracle: output, input gradient and every parameter gradient of the unsharded module on the CPU."""
    x = x.clone().requires_grad_(grad_out is not None and x.is_floating_point())
    out = dense(x)
    res = {"out": out.detach()}
    if grad_out is not None:
        (out * grad_out).sum().backward()
        res |= {"grad_x": x.grad, **{n: q.grad for n, q in dense.named_parameters()}}
    return res


def _attention_slices(ref: dict[str, torch.Tensor], prefix: str, rank: int, cols: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of a dense attention's gradients, named like ParallelAttention's parameters."""
    c = slice(rank * cols, (rank + 1) * cols)  # this rank's heads: rows of W_Q/W_K/W_V, columns of W_O
    return {f"{prefix}qkv.weight": torch.cat([ref[f"{prefix}{n}.weight"][c] for n in "qkv"]),
            f"{prefix}qkv.bias": torch.cat([ref[f"{prefix}{n}.bias"][c] for n in "qkv"]),
            f"{prefix}out.weight": ref[f"{prefix}out.weight"][:, c], f"{prefix}out.bias": ref[f"{prefix}out.bias"]}


def _parity(view: View, ranks: list[dict[str, Any]], ref: dict[str, torch.Tensor], want: list[dict[str, Any]],
            dtype: str, what: str) -> View:
    src = view.source
    view.checks[f"parity.{src}.output"] = (all(_close(r["out"], ref["out"], dtype) for r in ranks),
                                           "every rank's output == dense output")
    if "grad_x" in ref:
        view.checks[f"parity.{src}.grad_input"] = (all(_close(r["grad_x"], ref["grad_x"], dtype) for r in ranks),
                                                   "every rank's input gradient == dense")
        view.checks[f"parity.{src}.grad_weights"] = (
            all(_close(r["grads"][n], w[n], dtype) for r, w in zip(ranks, want, strict=True) for n in w), what)
    return view


@formula.register
def _(cfg: AttentionConfig) -> View:
    f = ftp.attention_all_reduce(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
    return traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)


@ledger.register
def _(cfg: AttentionConfig) -> View:
    dense, x, grad_out = attention_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(attention_step, dense, x, grad_out)
    view = ledger_view(sim.ledger, cfg.phase, ("all_reduce",), detail={"ledger": sim.ledger, "ranks": ranks})
    ref = _dense_grads(dense, x, grad_out)
    want = [_attention_slices(ref, "", i, cfg.hidden // cfg.tp) for i in range(cfg.tp)] if cfg.backward else []
    return _parity(view, ranks, ref, want, cfg.dtype, "rank i's Q/K/V/O gradients == dense slices of its heads")


@build_graph.register
def _(cfg: AttentionConfig) -> list[torch.Tensor]:
    """The GSPMD attention step on the current world, NOT synced: [out, (input grad, *weight grads)]."""
    dense, x, grad_out = attention_inputs(cfg)
    dev = runtime.device()
    attn = gspmd.shard_attention(dense.to(dev), gspmd.tensor_mesh(cfg.tp))
    return gspmd.step(attn, x.to(dev), grad_out.to(dev) if grad_out is not None else None)


def score_arrays(cfg: AttentionConfig, module: Any) -> list[tuple[str, Any]]:
    """Float arrays of the local scores' shape [b, nh/p, s, s] (size-1 dims ignored) the program writes."""
    want = _squeeze((cfg.batch, cfg.heads // cfg.tp, cfg.seq, cfg.seq))
    return [(op, a) for op, a in written_arrays(module) if _squeeze(a.dims) == want]


@program_extras.register
def _(cfg: AttentionConfig, view: View, module: Any) -> View:
    _group_and_gather_checks(cfg, view, module)  # heads stay sharded: no q/k/v all-gather
    src = view.source
    if cfg.tp > 1:  # no device holds all heads' [s, s] (or [s, hd]) blocks
        full = _squeeze((cfg.batch, cfg.heads, cfg.seq, cfg.seq))
        view.checks[f"{src}.scores_stay_local"] = (
            not any(_squeeze(a.dims) == full for _, a in written_arrays(module)),
            f"no [b, nh={cfg.heads}, s, s] array: each device computes the scores of its {cfg.heads // cfg.tp} heads")
    name = f"{cfg.phase}.scores.arrays"
    if cfg.head_dim == cfg.seq:
        view.notes.append(f"{name} not counted: head_dim = seq = {cfg.seq}, so q, k, v have the scores' shape")
        return view
    scores = score_arrays(cfg, module)
    view.add(name, len(scores), "count")
    types = sorted({a.dtype for _, a in scores})
    view.differs[name] = (f"a fusion decision of this compiler, not part of the algorithm: {len(scores)} "
                          f"[b, nh/p, s, s] arrays written ({'/'.join(types) or 'none'})")
    return view


@compiler.register
def _(cfg: AttentionConfig) -> View:
    return _compiled(cfg, attention_inputs, ("all_reduce",))


def _compiled(cfg: Any, inputs: Any, ops: tuple[str, ...]) -> View:
    """The CPU compiler view of a dense-module step: collectives, parity of output and input gradient, extras."""
    from shardlab.profile import capture_hlo

    problem = _mesh_problem(cfg.tp, runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(build_graph, cfg)
    view = collectives_view("hlo", cap.module, cfg.phase, ops, cfg.dtype, detail=cap)
    dense, x, grad_out = inputs(cfg)
    ref = _dense_grads(dense, x, grad_out)
    view.checks["parity.hlo.output"] = (_close(cap.result[0].cpu(), ref["out"], cfg.dtype), "GSPMD output == dense")
    if grad_out is not None and ref["grad_x"] is not None:
        view.checks["parity.hlo.grad_input"] = (_close(cap.result[1].cpu(), ref["grad_x"], cfg.dtype),
                                                "GSPMD input gradient == dense")
    elif grad_out is not None:  # integer input (token ids): the first gradient is the weight's
        (name, _), = dense.named_parameters()
        view.checks["parity.hlo.grad_weight"] = (_close(cap.result[1].cpu(), ref[name], cfg.dtype),
                                                 "GSPMD weight gradient == dense")
    return program_extras(cfg, view, cap.module)


# ------------------------------------------------------------------------------------- transformer layer
@dataclass(frozen=True)
class TransformerLayerConfig:
    """One pre-LayerNorm transformer layer, x + Attn(LN(x)) then + MLP(LN(.)): attention and MLP each Megatron-
    split (one f, one g), the LayerNorms replicated. Per step 2 + 2 all-reduces of [b, s, h]."""

    tp: int
    batch: int
    seq: int
    hidden: int
    heads: int
    ffn: int
    dtype: str = "float32"
    backward: bool = True
    seed: int = 0

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> TransformerLayerConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, hidden=p.hidden, heads=p.heads, ffn=p.ffn, dtype=p.dtype,
                  seed=p.seed)
        return cls(**{**kw, **overrides})


def layer_inputs(cfg: TransformerLayerConfig) -> tuple[models.TransformerBlock, torch.Tensor, torch.Tensor | None]:
    return _inputs(cfg, lambda: models.TransformerBlock(cfg.hidden, cfg.heads, cfg.ffn))


@formula.register
def _(cfg: TransformerLayerConfig) -> View:
    f = ftp.transformer_layer_all_reduce(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
    return traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)


@ledger.register
def _(cfg: TransformerLayerConfig) -> View:
    dense, x, grad_out = layer_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(transformer_layer_step, dense, x, grad_out)
    view = ledger_view(sim.ledger, cfg.phase, ("all_reduce",), detail={"ledger": sim.ledger, "ranks": ranks})
    ref = _dense_grads(dense, x, grad_out)
    want = []
    if cfg.backward:
        c, f = cfg.hidden // cfg.tp, cfg.ffn // cfg.tp
        for i in range(cfg.tp):
            w = _attention_slices(ref, "attn.", i, c)
            w |= {"mlp.fc1.weight": ref["mlp.fc1.weight"][i * f:(i + 1) * f],
                  "mlp.fc1.bias": ref["mlp.fc1.bias"][i * f:(i + 1) * f],
                  "mlp.fc2.weight": ref["mlp.fc2.weight"][:, i * f:(i + 1) * f], "mlp.fc2.bias": ref["mlp.fc2.bias"]}
            w |= {n: ref[n] for n in ref if n.startswith("ln")}  # replicated LayerNorms: the full gradient
            want.append(w)
    return _parity(view, ranks, ref, want, cfg.dtype,
                   "rank i's attention/MLP gradients == dense slices; LayerNorm gradients == dense on every rank")


@build_graph.register
def _(cfg: TransformerLayerConfig) -> list[torch.Tensor]:
    """The GSPMD layer step on the current world, NOT synced: [out, (input grad, *parameter grads)]."""
    dense, x, grad_out = layer_inputs(cfg)
    dev = runtime.device()
    block = gspmd.shard_transformer_block(dense.to(dev), gspmd.tensor_mesh(cfg.tp))
    return gspmd.step(block, x.to(dev), grad_out.to(dev) if grad_out is not None else None)


@program_extras.register
def _(cfg: TransformerLayerConfig, view: View, module: Any) -> View:
    _group_and_gather_checks(cfg, view, module)
    return view


@compiler.register
def _(cfg: TransformerLayerConfig) -> View:
    return _compiled(cfg, layer_inputs, ("all_reduce",))


# ------------------------------------------------------------------------------------------------ embedding
@dataclass(frozen=True)
class EmbeddingConfig:
    """Vocab-parallel embedding lookup: rows of E [V, h] split by `vocab_range` (uneven V: the first V mod p
    ranks own one row more); each rank looks up the ids it owns, zeros elsewhere, and g sums the ranks' rows."""

    tp: int
    batch: int
    seq: int
    hidden: int
    vocab: int
    dtype: str = "float32"
    backward: bool = False  # + backward of (out * grad_out).sum(): the weight gradient (no communication)
    seed: int = 0

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> EmbeddingConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, hidden=p.hidden, vocab=p.vocab, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


def token_ids(cfg: Any) -> torch.Tensor:
    """[b, s] token ids, seeded; the first and the last id are 0 and V - 1 (both ends of the table)."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
    ids.view(-1)[0], ids.view(-1)[-1] = 0, cfg.vocab - 1
    return ids


def embedding_inputs(cfg: EmbeddingConfig) -> tuple[models.Embedding, torch.Tensor, torch.Tensor | None]:
    dense, _, grad_out = _inputs(cfg, lambda: models.Embedding(cfg.vocab, cfg.hidden))
    return dense, token_ids(cfg), grad_out


@formula.register
def _(cfg: EmbeddingConfig) -> View:
    f = ftp.embedding_all_reduce(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype)  # the backward adds none
    return traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)


@ledger.register
def _(cfg: EmbeddingConfig) -> View:
    dense, ids, grad_out = embedding_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(embedding_step, dense, ids, grad_out)
    view = ledger_view(sim.ledger, cfg.phase, ("all_reduce",), detail={"ledger": sim.ledger, "ranks": ranks})
    ref = _dense_grads(dense, ids, grad_out)
    view.checks["parity.ledger.output"] = (all(torch.equal(r["out"], ref["out"]) for r in ranks),
                                           "exact: one rank contributes each row, the others add zeros")
    if cfg.backward:
        view.checks["parity.ledger.grad_weight"] = (
            all(_close(r["grads"]["weight"], ref["weight"][slice(*vocab_range(cfg.vocab, i, cfg.tp))], cfg.dtype)
                for i, r in enumerate(ranks)), "rank i's rows of the gradient == dense rows")
        view.checks["ledger.no_backward_collectives"] = (sim.ledger.count(phase="backward") == 0,
                                                         "the weight gradient of a lookup is local")
    return view


@build_graph.register
def _(cfg: EmbeddingConfig) -> list[torch.Tensor]:
    """The GSPMD lookup on the current world, NOT synced: [out, (weight grad)]."""
    dense, ids, grad_out = embedding_inputs(cfg)
    dev = runtime.device()
    emb = gspmd.shard_embedding(dense.to(dev), gspmd.tensor_mesh(cfg.tp))
    return gspmd.step(emb, ids.to(dev), grad_out.to(dev) if grad_out is not None else None)


@program_extras.register
def _(cfg: EmbeddingConfig, view: View, module: Any) -> View:
    _group_and_gather_checks(cfg, view, module)  # the table stays sharded
    return view


@compiler.register
def _(cfg: EmbeddingConfig) -> View:
    return _compiled(cfg, embedding_inputs, ("all_reduce",))


# -------------------------------------------------------------------------------------------- cross-entropy
CE_METHODS = ("vocab_parallel", "gather")


@dataclass(frozen=True)
class CrossEntropyConfig:
    """Per-token cross-entropy of vocab-sharded logits [b, s, V] (torch's definition: label smoothing over the
    GLOBAL vocab, ``ignore_index`` -100 at one position when s > 1), then backward of the summed loss.

    ``method``: "vocab_parallel" (reductions over the vocab: 3 all-reduces of [b, s], 4 with label smoothing) or
    "gather" (all-gather the logits, then the dense loss). Values are named ``<key>.<quantity>`` with ``key``
    vocab_parallel / gather_logits (+ ``_smoothing`` when label_smoothing > 0).
    ``placeholders``: logits and targets are placeholder tensors (no memory, no values) — for compile-only TPU
    programs at sizes this machine could not hold; the ledger and the CPU compiler views skip such a config.
    """

    tp: int
    batch: int
    seq: int
    vocab: int
    dtype: str = "float32"
    method: str = "vocab_parallel"
    label_smoothing: float = 0.0
    backward: bool = True
    seed: int = 0
    placeholders: bool = False

    def __post_init__(self) -> None:
        if self.method not in CE_METHODS:
            raise ValueError(f"method={self.method!r} is not one of {CE_METHODS}")

    @property
    def key(self) -> str:
        base = "gather_logits" if self.method == "gather" else "vocab_parallel"
        return base + ("_smoothing" if self.label_smoothing > 0 else "")

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @property
    def op(self) -> str:
        return "all_gather" if self.method == "gather" else "all_reduce"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> CrossEntropyConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, vocab=p.vocab, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


IGNORE_INDEX = -100


def ce_inputs(cfg: CrossEntropyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, s, V] (N(0, 2²), seeded) in the config's dtype and targets [b, s]: token ids with both ends of
    the vocab, and ``IGNORE_INDEX`` at position (0, 1) when s > 1."""
    g = torch.Generator().manual_seed(cfg.seed)
    logits = (torch.randn(cfg.batch, cfg.seq, cfg.vocab, generator=g) * 2).to(getattr(torch, cfg.dtype))
    target = token_ids(cfg)
    if cfg.seq > 1:
        target[0, 1] = IGNORE_INDEX
    return logits, target


def dense_ce(cfg: CrossEntropyConfig) -> dict[str, torch.Tensor]:
    """The oracle: torch's per-token loss [b, s] of the full logits and its gradient [b, s, V] (in f32)."""
    logits, target = ce_inputs(cfg)
    z = logits.float().requires_grad_(True)
    loss = F.cross_entropy(z.flatten(0, 1), target.flatten(), reduction="none", label_smoothing=cfg.label_smoothing,
                           ignore_index=IGNORE_INDEX).view_as(target)
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": z.grad}


def _ce_names(cfg: CrossEntropyConfig, view: View) -> View:
    """``<phase>.<op>.<q>`` -> ``<key>.<q>``, plus ``<key>.wire_bytes`` (ring model)."""
    view = view.renamed(lambda n: n.replace(f"{cfg.phase}.{cfg.op}.", f"{cfg.key}.", 1))
    return _wire(view, cfg.key, cfg.op, cfg.tp)


@formula.register
def _(cfg: CrossEntropyConfig) -> View:
    if cfg.method == "gather":
        f = ftp.gathered_logits(cfg.batch, cfg.seq, cfg.vocab, cfg.tp, cfg.dtype)
    else:
        f = ftp.vocab_parallel_ce(cfg.batch, cfg.seq, cfg.tp, cfg.dtype, cfg.label_smoothing)
    view = traffic(View("formula", detail=f), cfg.phase, {cfg.op: f["count"]}, {cfg.op: f["bytes"]}, cfg.dtype,
                   (cfg.op,))
    view = _ce_names(cfg, view)
    if cfg.backward and cfg.tp > 1:
        mem = ftp.ce_logits_bytes(cfg.batch, cfg.seq, cfg.vocab, cfg.tp, cfg.dtype)
        view.add(f"{cfg.key}.largest_array.elements",
                 mem["gathered" if cfg.method == "gather" else "vocab_parallel"] // dtype_bytes(cfg.dtype), "elements")
    return view


@ledger.register
def _(cfg: CrossEntropyConfig) -> View:
    if cfg.placeholders:
        return View.skip("ledger", "placeholder logits have no values to compute with")
    logits, target = ce_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(ce_step, logits, target, cfg.method, cfg.label_smoothing, IGNORE_INDEX, cfg.backward)
    view = ledger_view(sim.ledger, cfg.phase, (cfg.op,), detail={"ledger": sim.ledger, "ranks": ranks})
    view = _ce_names(cfg, view)
    ref = dense_ce(cfg)
    view.checks[f"parity.ledger.{cfg.key}.loss"] = (all(_close(r["loss"], ref["loss"], cfg.dtype) for r in ranks),
                                                    "per-token loss == F.cross_entropy on every rank")
    if cfg.backward:
        view.checks[f"parity.ledger.{cfg.key}.grad"] = (
            all(_close(r["grad_logits"], ref["grad"][..., slice(*r["range"])], cfg.dtype) for r in ranks),
            "logits gradient shard == dense gradient columns")
        view.checks[f"ledger.{cfg.key}.no_backward_collectives"] = (sim.ledger.count(phase="backward") == 0,
                                                                    "the backward is local")
    return view


@build_graph.register
def _(cfg: CrossEntropyConfig) -> list[torch.Tensor]:
    """The GSPMD loss (+ backward of its sum) on the current world, NOT synced: [loss, (logits grad)]."""
    import torch_xla.distributed.spmd as xs

    dev = runtime.device()
    mesh = gspmd.tensor_mesh(cfg.tp)
    spec = (None, None, gspmd.AXIS)
    if cfg.placeholders:  # compile-only: nothing allocated; annotate a value computed from the placeholder
        from torch_xla.core.xla_builder import create_placeholder_tensor

        leaf = create_placeholder_tensor((cfg.batch, cfg.seq, cfg.vocab), getattr(torch, cfg.dtype))
        target = create_placeholder_tensor((cfg.batch, cfg.seq), torch.int64)
        z = gspmd.shard_logits(leaf.requires_grad_(cfg.backward) * 1, mesh)  # [b, s, V/p] per device
    else:
        logits, target = ce_inputs(cfg)
        leaf = z = gspmd.shard_logits(logits.to(dev), mesh).requires_grad_(cfg.backward)
        target = target.to(dev)
    if cfg.method == "gather":
        loss = gspmd.gathered_ce(z, target, mesh, cfg.label_smoothing, IGNORE_INDEX)
    else:
        loss = gspmd.vocab_parallel_ce(z, target, cfg.label_smoothing, IGNORE_INDEX)
    if not cfg.backward:
        return [loss]
    loss.sum().backward()
    # Returned padded to [b, s, p ceil(V/p)] (even shards): measured with libtpu 0.0.21, XLA:TPU returns an
    # UNEVENLY sharded output replicated — an all-gather of the gradient that no training step would issue (the
    # gradient feeds the output layer's backward, it is not a program output); XLA:CPU keeps it sharded.
    pad = cfg.tp * ftp.shard_width(cfg.vocab, cfg.tp) - cfg.vocab
    grad = F.pad(leaf.grad, (0, pad)) if pad else leaf.grad
    xs.mark_sharding(grad, mesh, spec)  # the gradient stays a vocab shard, like the logits it belongs to
    return [loss, grad]


@collective_ops.register
def _(cfg: CrossEntropyConfig) -> tuple[str, ...]:
    return (cfg.op,)


@program_extras.register
def _(cfg: CrossEntropyConfig, view: View, module: Any) -> View:
    view = _ce_names(cfg, view)
    _group_and_gather_checks(cfg, view, module, gathers=cfg.method == "gather")
    others = [c for c in module.collectives if c.op != cfg.op.replace("_", "-")]
    if others:
        kinds = sorted({f"{c.op} {c.dtype}{list(c.shape[0])}" for c in others})
        view.notes.append(f"{cfg.key}: the {view.source} program also issues {len(others)} other collective(s) "
                          f"({', '.join(kinds)}): the partitioner's choice for the backward, not part of the method")
    if cfg.backward:
        largest = max((math.prod(a.dims) for _, a in written_arrays(module)), default=0)
        view.add(f"{cfg.key}.largest_array.elements", largest, "elements")
    return view


@compiler.register
def _(cfg: CrossEntropyConfig) -> View:
    from shardlab.profile import capture_hlo

    if cfg.placeholders:
        return View.skip("hlo", "placeholder logits cannot be executed (compile-only TPU programs)")
    problem = _mesh_problem(cfg.tp, runtime.current().num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(build_graph, cfg)
    view = collectives_view("hlo", cap.module, cfg.phase, (cfg.op,), cfg.dtype, detail=cap)
    ref = dense_ce(cfg)
    view.checks[f"parity.hlo.{cfg.key}.loss"] = (_close(cap.result[0].cpu(), ref["loss"], cfg.dtype),
                                                 "GSPMD loss == F.cross_entropy")
    if cfg.backward:
        view.checks[f"parity.hlo.{cfg.key}.grad"] = (
            _close(cap.result[1].cpu()[..., :cfg.vocab], ref["grad"], cfg.dtype), "GSPMD logits gradient == dense")
    return program_extras(cfg, view, cap.module)


def ce_table_views(vocab_parallel: list[View], gather: list[View], vocab: int, tp: int,
                   label_smoothing: float = 0.0) -> list[View]:
    """One view per source that has both programs: their values together plus the two ratios, gathered /
    vocab-parallel, named ``saving_ratio`` (wire bytes per rank, ring model) and ``payload_ratio`` (payload per
    rank) (+ ``_smoothing``). Measured views compute them from ELEMENTS (dtype-free: XLA:CPU reduces 16-bit
    floats in f32 but gathers them as they are); the formula view from ``formulas.tp``'s named ratios."""
    suffix = "_smoothing" if label_smoothing > 0 else ""
    out = []
    for vp in vocab_parallel:
        ga = next((g for g in gather if g.source == vp.source), None)
        if ga is None:
            continue
        view = merge(vp, ga)
        if view.ran:
            if view.source == "formula":
                wire, payload = (ftp.ce_wire_ratio(vocab, tp, label_smoothing),
                                 ftp.ce_payload_ratio(vocab, tp, label_smoothing))
            else:
                vp_el = next(v for n, v in vp.values.items() if n.endswith(".elements") and "largest" not in n)
                ga_el = next(v for n, v in ga.values.items() if n.endswith(".elements") and "largest" not in n)
                wire = wire_bytes("all_gather", ga_el, tp) / wire_bytes("all_reduce", vp_el, tp)
                payload = ga_el / vp_el
            view.add(f"saving_ratio{suffix}", wire, "ratio")
            view.add(f"payload_ratio{suffix}", payload, "ratio")
        out.append(view)
    return out
