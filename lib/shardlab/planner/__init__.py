"""Planner: what a sharding plan costs per chip before you rent the pod.

Design note
-----------
`plan(PlanConfig(...))` composes the formula modules (no torch, no XLA) for a decoder-only transformer (dense, or a
mixture of experts) on a TPU slice with a (data, pipeline, fsdp, context, tensor, expert) mesh — MaxText's axis
order, the last axis fastest. :class:`PlanConfig` is the one declaration of a plan's inputs (type, default,
comment); notebook 07's parameters (``shardlab.planner.params.PlannerParams``) extend it, so ``plan(p)`` plans the
notebook's own parameters and nothing copies them. The batch is split over data x fsdp x expert (GShard: every
device routes its own tokens), the sequence over context, the layers over pipeline stages, every weight over tensor,
the experts over expert:

    memory per chip   of the heavier pipeline stage (the first holds the embedding and the most microbatches in
                      flight, the last the LM head): model state (`formulas.memory` -> `formulas.zero`; FSDP
                      padding per unit or per parameter), kept activations (`formulas.activations`: the model's own
                      block — GQA, SwiGLU or GeLU, flash or stored scores, a mixture-of-experts MLP's slots — per
                      microbatch, times the microbatches the schedule holds in flight, `formulas.pipeline`), and the
                      larger of two transient phases: one layer's backward (the recomputed layer, without flash the
                      scores' gradients, its gathered FSDP unit, the context-parallel K/V working set
                      `formulas.context.memory`) or the LM head (fp32 logits, the gathered vocabulary matrix)
    comm per step     (`step_comm(cfg)`, also for meshes no slice has) per mesh axis: gradient all-reduces over
                      the replicas (data, and context / expert for the weights they replicate); ZeRO / FSDP over
                      `fsdp` by ``fsdp_rule`` — "gspmd": per parameter, what XLA:TPU compiles for the verdict
                      step's annotations (measured), "fsdp1": PyTorch FSDP's flat units (`formulas.fsdp`); Megatron
                      TP over `tensor` (`formulas.tp`, with sequence parallelism's norm-gradient all-reduce);
                      point-to-point sends between `pipeline` stages (`formulas.pipeline.p2p_traffic`); ring sends
                      or all-gathers of K/V over `context` (`formulas.context`); dispatch / combine all-to-alls
                      over `expert` (`formulas.expert`); payload and ring-wire bytes per chip
    FLOPs             `formulas.flops.transformer_flops` (model and hardware FLOPs incl. recompute; an MoE token
                      through its top-k experts; the hardware count adds the capacity's empty slots — the experts
                      run E·C = ceil(cf·k·S/E)·E slots per group of S tokens, filled or not — but not the
                      [S, E, C] dispatch / combine einsums: a sort-based permute + grouped GEMM needs none)
    time              `formulas.hardware.roofline`: each collective's wire bytes over the ICI links its group
                      uses (`formulas.hardware.group_axes`: the torus axes the group spans on the slice; a send
                      one link one way), max(compute + pipeline bubble, comm); MFU (`formulas.flops.mfu`) = model
                      FLOPs / (step · chips · peak) — an upper bound: the roofline assumes overlap
    verdict           fits if the per-chip total is within (1 - fit_margin) of the HBM the XLA:TPU compiler lets
                      a program use (`hbm_usable_bytes` of data/hardware: its capacity check counts arguments +
                      temporaries against exactly that figure); "at risk" between that and the capacity

Assumptions, stated once: bf16 params/grads + fp32 Adam state (ZeRO's K = 12); Megatron's vocabulary padding to
a multiple of 128·tensor; 16-bit activations without dropout (`formulas.activations`); logits kept in fp32 for
the loss; under full recompute the layer being recomputed holds its full activations once; context parallelism
needs a flash-style (blockwise) attention; a pipeline stage holds L / pipeline layers, the first stage the
embedding, the last the final norm and LM head. `Plan.notes` names what was used.

**Which terms were fitted.** Three terms were chosen after compiling seven full training steps with XLA:TPU
(`shardlab.planner.verdict`): the backward's 6·a·s²·b/t bytes of s × s buffers without flash, the peak as the
larger of two phases instead of their sum, and the 10 % fit margin (the compiler's heap packing). Agreement on
those seven compiles is a regression, not a validation; notebook 07 shows the configurations held out from the
fit separately (`planner.verdict.HOLDOUT`), and the numbers come from the cached compiles, not from this text.

Every bad input raises ValueError naming the values, before any arithmetic:
    >>> plan(PlanConfig("llama-3-8b", "v5e-8", data=2, fsdp=2, tensor=1))
    Traceback (most recent call last):
    ValueError: data=2 × fsdp=2 × tensor=1 = 4 does not equal the 8 chips of v5e-8
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from shardlab.formulas import activations as act
from shardlab.formulas import context as fcp
from shardlab.formulas import expert as fep
from shardlab.formulas import hardware as hw
from shardlab.formulas import memory as mem
from shardlab.formulas import pipeline as fpp
from shardlab.formulas import tp as tp_f
from shardlab.formulas.common import RECOMPUTE_POLICIES, ceil_div, dtype_bytes, wire_bytes
from shardlab.formulas.flops import FlopTerms, mfu, transformer_flops
from shardlab.formulas.fsdp import flat_step_comm
from shardlab.formulas.presets import MODEL_PRESETS, ModelConfig, model_from, model_preset
from shardlab.formulas.zero import zero_comm

__all__ = ["FSDP_RULES", "MESH_AXES", "MODEL_PRESETS", "CommTerm", "ModelConfig", "Plan", "PlanConfig", "model_from",
           "model_preset", "plan", "step_comm"]

MESH_AXES = ("data", "pipeline", "fsdp", "context", "tensor", "expert")  # the device mesh, the last axis fastest
FSDP_RULES = ("gspmd", "fsdp1")
CONTEXT_METHODS = ("ring", "allgather")
NORM_GATHER_BYTES = 4  # XLA:TPU all-gathers the bf16 RMSNorm weights of the verdict step in fp32 (measured)


@dataclass(frozen=True)
class PlanConfig:
    """What a plan is of: a model on a TPU slice, the mesh degrees, the batch, and the planner's assumptions."""

    model: ModelConfig | str | dict = "llama-3-8b"  # a preset name, or custom sizes as a dict (see formulas.presets)
    topology: str = "v6e-8"  # a TPU slice of data/hardware: v5e-8, v6e-8, v6e-256, v5p-128, ...
    data: int = 1  # data-parallel replicas
    fsdp: int = 8  # ZeRO-3 / FSDP sharding degree
    tensor: int = 1  # Megatron tensor-parallel degree
    recompute: str = "full"  # none | selective | full
    global_batch: int = 8  # sequences per step
    seq: int = 8192  # tokens per sequence
    zero_stage: int | None = None  # ZeRO stage over the fsdp axis; None: 3 if fsdp > 1 else 0
    sequence_parallel: bool = False  # Megatron sequence parallelism on the tensor axis
    flash_attention: bool = True  # a flash kernel: no s x s scores stored or held in the backward
    param_bytes: int = 2  # bytes per parameter (bf16)
    grad_bytes: int = 2  # bytes per gradient (bf16)
    optimizer_k: float = 12  # ZeRO's K, optimizer bytes per parameter: fp32 master + Adam m, v
    act_dtype: str = "bfloat16"  # activations on the wire (the TP, pipeline, context and expert collectives)
    logits_bytes: int = 4  # bytes per logit for the loss (fp32)
    fit_margin: float = 0.10  # "fits" only under (1 - fit_margin) x usable HBM: the compiler's heap packing
    offload: bool = False  # with recompute="full": the kept layer inputs live in host memory, none in HBM
    fsdp_rule: str = "gspmd"  # FSDP comm: gspmd (per parameter, as XLA:TPU compiles it) | fsdp1 (PyTorch flat units)
    pipeline: int = 1  # pipeline stages (the `pipeline` mesh axis); the model's layers split evenly over them
    microbatches: int = 1  # microbatches per step (each data replica's batch split m ways)
    schedule: str = "1f1b"  # pipeline schedule: gpipe | 1f1b | interleaved
    virtual: int = 1  # model chunks per pipeline device (interleaved 1F1B; 1 otherwise)
    context: int = 1  # context-parallel degree: the sequence split over `context`
    context_method: str = "ring"  # ring (K/V blocks sent round the ring) | allgather (K/V all-gathered)
    expert: int = 1  # expert-parallel degree: a mixture-of-experts model's experts split over `expert`


class CommTerm(NamedTuple):
    axis: str  # a mesh axis ("data" | "pipeline" | "fsdp" | "context" | "tensor" | "expert"), or axes joined by "+"
    what: str  # e.g. "grad all-reduce"
    op: str  # collective (or "send": point to point)
    count: int  # calls per step
    payload_bytes: float  # per call, per chip
    wire_bytes: float  # all calls, per chip (ring model; a send: its payload)


@dataclass
class Plan:
    config: PlanConfig
    model: ModelConfig
    chip: str
    chips: int
    padded_vocab: int
    num_params: int
    micro_batch: int  # sequences per microbatch on one data replica
    memory: dict[str, float]  # per chip, bytes, by category (the heavier pipeline stage)
    hbm_bytes: int  # per chip: the capacity the XLA:TPU compiler lets a program use (hbm_usable_bytes)
    comm: list[CommTerm]
    flops: FlopTerms
    roofline: hw.Roofline
    mfu: float
    fits: bool
    verdict: str
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # transient bytes of "layer backward" and "LM head"
    peak_phase: str = ""  # the larger phase: the one whose transients are in ``memory``
    ici_axes: dict[str, int] = field(default_factory=dict)  # CommTerm.axis -> torus axes its group spans
    stage: str = ""  # the pipeline stage ``memory`` is of: "first", "last" (or "" without a pipeline)

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    @property
    def fit_limit_bytes(self) -> float:
        """Per chip: the most a plan may need and still be called "fits" ((1 - fit_margin) x usable HBM)."""
        return self.hbm_bytes * (1 - self.config.fit_margin)

    @property
    def at_risk(self) -> bool:
        """Within the fit margin: under the compiler's capacity, over the fit limit (``fits`` is False)."""
        return self.fit_limit_bytes < self.memory_total <= self.hbm_bytes

    @property
    def comm_payload_bytes(self) -> float:
        return sum(t.count * t.payload_bytes for t in self.comm)

    @property
    def comm_wire_bytes(self) -> float:
        return sum(t.wire_bytes for t in self.comm)

    def as_dict(self) -> dict:
        c = self.config
        return {
            "model": self.model.name, "topology": c.topology, "chip": self.chip, "chips": self.chips,
            "degrees": {a: getattr(c, a) for a in MESH_AXES}, "recompute": c.recompute,
            "padded_vocab": self.padded_vocab, "num_params": self.num_params,
            "memory": dict(self.memory), "memory_total": self.memory_total, "hbm_bytes": self.hbm_bytes,
            "comm": [t._asdict() for t in self.comm], "comm_payload_bytes": self.comm_payload_bytes,
            "comm_wire_bytes": self.comm_wire_bytes, "flops": self.flops._asdict(),
            "roofline": self.roofline._asdict(), "mfu": self.mfu, "fits": self.fits, "at_risk": self.at_risk,
            "fit_limit_bytes": self.fit_limit_bytes, "phases": dict(self.phases), "peak_phase": self.peak_phase,
            "ici_axes": dict(self.ici_axes), "stage": self.stage, "verdict": self.verdict,
            "config": {f.name: getattr(c, f.name) for f in fields(PlanConfig) if f.name != "model"},
        }


def _int(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}={v!r} must be an integer >= 1")


def _validate(cfg: PlanConfig, m: ModelConfig, chips: int | None) -> int:
    """Every rule of a configuration (``chips``: the slice's chip count, None = not tied to a slice)."""
    for name in (*MESH_AXES, "global_batch", "seq", "param_bytes", "grad_bytes", "logits_bytes", "microbatches",
                 "virtual"):
        _int(name, getattr(cfg, name))
    if cfg.offload is not False and (cfg.offload is not True or cfg.recompute != "full"):
        raise ValueError(f"offload={cfg.offload!r} must be True or False, and True only with recompute='full' "
                         f"(not {cfg.recompute!r}): it moves the layer inputs full recompute keeps to host memory")
    for name, v in (("sequence_parallel", cfg.sequence_parallel), ("flash_attention", cfg.flash_attention)):
        if not isinstance(v, bool):
            raise ValueError(f"{name}={v!r} must be True or False")
    k = cfg.optimizer_k
    if isinstance(k, bool) or not isinstance(k, int | float) or k < 0:
        raise ValueError(f"optimizer_k={k!r} must be a number >= 0 (optimizer bytes per parameter)")
    dtype_bytes(cfg.act_dtype)  # a known element type, or ValueError naming it
    for name, v, allowed in (("fsdp_rule", cfg.fsdp_rule, FSDP_RULES), ("recompute", cfg.recompute,
                             RECOMPUTE_POLICIES), ("context_method", cfg.context_method, CONTEXT_METHODS)):
        if v not in allowed:
            raise ValueError(f"{name}={v!r} is not one of {allowed}")
    degrees = {a: getattr(cfg, a) for a in MESH_AXES}
    if chips is not None and math.prod(degrees.values()) != chips:  # data, fsdp, tensor always; the rest when used
        product = " × ".join(f"{a}={v}" for a, v in degrees.items() if a in ("data", "fsdp", "tensor") or v > 1)
        raise ValueError(f"{product} = {math.prod(degrees.values())} does not equal the {chips} chips of "
                         f"{cfg.topology}")
    t, pp, cp, ep = cfg.tensor, cfg.pipeline, cfg.context, cfg.expert
    for name, v in (("hidden", m.hidden), ("heads", m.heads), ("ffn", m.ffn)):
        if v % t:
            raise ValueError(f"{name}={v} is not divisible by tensor={t}")
    if m.kv_heads % t and t % m.kv_heads:
        raise ValueError(f"kv_heads={m.kv_heads} and tensor={t}: one must divide the other")
    splits, named = cfg.data * cfg.fsdp * ep, "data × fsdp" + (" × expert" if ep > 1 else "")
    if cfg.global_batch % splits:
        raise ValueError(f"global_batch={cfg.global_batch} is not divisible by {named} = {splits}")
    if cfg.global_batch // splits % cfg.microbatches:
        raise ValueError(f"microbatches={cfg.microbatches} does not divide the {cfg.global_batch // splits} "
                         f"sequence(s) of one data replica (global_batch / ({named}))")
    fpp.check_pipeline(pp, cfg.microbatches, cfg.virtual, cfg.schedule)
    if m.layers % (pp * cfg.virtual):
        raise ValueError(f"layers={m.layers} is not divisible by pipeline × virtual = {pp * cfg.virtual} "
                         "(every model chunk holds whole layers)")
    if cfg.seq % cp:
        raise ValueError(f"seq={cfg.seq} is not divisible by context={cp}")
    if cp > 1 and not cfg.flash_attention:
        raise ValueError(f"context={cp} needs flash_attention=True: context parallelism computes attention block by "
                         "block (no s × s scores)")
    if cfg.sequence_parallel and cfg.seq // cp % t:
        raise ValueError(f"seq / context = {cfg.seq // cp} is not divisible by tensor={t} (sequence parallelism)")
    if ep > 1 and (not m.moe or m.experts % ep):
        raise ValueError(f"expert={ep} needs a mixture-of-experts model whose experts divide by it "
                         f"({m.name}: experts={m.experts})")
    margin = cfg.fit_margin
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
        raise ValueError(f"fit_margin={margin!r} must be a number in [0, 1) (a fraction of the usable HBM)")
    stage = (3 if cfg.fsdp > 1 else 0) if cfg.zero_stage is None else cfg.zero_stage
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={stage!r} must be one of 0, 1, 2, 3")
    return stage


def _term(axis: str, what: str, op: str, count: int, payload: float, world: int) -> CommTerm:
    return CommTerm(axis, what, op, count, payload, count * wire_bytes(op, payload, world))


class _Sizes(NamedTuple):
    """What one chip's share of the plan is: batch, sequence, layers, parameters (per tensor rank)."""

    b: int  # sequences per microbatch
    s: int  # tokens per sequence on this chip (seq / context)
    layers: int  # layers per pipeline stage
    pc: mem.ParamCounts  # whole model, padded vocabulary
    layer_local: float  # one layer's parameters on one tensor rank (experts / expert too)
    inflight: dict[str, int]  # "first" / "last" stage: microbatches (interleaved: chunk-microbatches) held


def _sizes(cfg: PlanConfig, m: ModelConfig) -> _Sizes:
    v_pad = mem.padded_vocab(m.vocab, cfg.tensor)
    pc = mem.param_count(m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, v_pad, m.gated_mlp, experts=m.experts)
    b = cfg.global_batch // (cfg.data * cfg.fsdp * cfg.expert) // cfg.microbatches
    layer_local = pc.dense_per_layer / cfg.tensor + pc.expert_per_layer / (cfg.tensor * cfg.expert)
    pp, m_, v = cfg.pipeline, cfg.microbatches, cfg.virtual
    held = {"first": 1, "last": 1} if pp == 1 else {  # one stage: each microbatch's backward frees it (accumulation)
        "first": fpp.peak_inflight(cfg.schedule, pp, m_, v, 0), "last": fpp.peak_inflight(cfg.schedule, pp, m_, v,
                                                                                          pp - 1)}
    return _Sizes(b, cfg.seq // cfg.context, m.layers // pp, pc, layer_local, held)


def _fsdp_terms(cfg: PlanConfig, m: ModelConfig, z: _Sizes, stage: int, ends: tuple[str, ...]) -> list[CommTerm]:
    """ZeRO / FSDP over `fsdp` for the stage holding ``ends`` ("embedding", "head"). With microbatches (gradient
    accumulation, a pipeline) the parameters are gathered again for every microbatch; the accumulated gradient is
    reduce-scattered once per step."""
    f, t, pb, mb = cfg.fsdp, cfg.tensor, cfg.param_bytes, cfg.microbatches
    pc, h = z.pc, m.hidden
    if f == 1:
        return []
    head = pc.lm_head + pc.final_norm if "head" in ends else 0
    emb = pc.embedding if "embedding" in ends else 0
    psi_local = z.layers * z.layer_local + (emb + head) / t
    if stage in (1, 2):  # ZeRO-1/2: reduce-scatter Ψ grads, all-gather Ψ updated params
        zc = zero_comm(psi_local, f, stage)  # elements
        return [_term("fsdp", "grad reduce-scatter", "reduce-scatter", 1, zc.reduce_scatter * cfg.grad_bytes, f),
                _term("fsdp", "param all-gather", "all-gather", 1, zc.all_gather * pb / f, f)]
    if stage == 0:
        return [_term("fsdp", "grad all-reduce (stage 0)", "all-reduce", 1, psi_local * cfg.grad_bytes, f)]
    out: list[CommTerm] = []
    if cfg.fsdp_rule == "fsdp1":  # PyTorch FSDP1: one flat unit per layer, resharded after forward; the root not
        root = [("root: " + " + ".join(n for n, on in (("embedding", emb), ("final norm + LM head", head)) if on),
                 1, emb + head, True)] if emb + head else []
        for what, n, numel, is_root in [("layer", z.layers, z.layer_local * t, False), *root]:
            fc = flat_step_comm(ceil_div(int(numel), t), f, pb, root=is_root)
            when = "fwd only: not resharded" if is_root else "fwd+bwd"
            out.append(_term("fsdp", f"FSDP1 flat unit: param all-gather ({what} unit, {when})", "all-gather",
                             mb * n * fc.all_gather_count, fc.all_gather_payload_bytes, f))
            out.append(_term("fsdp", f"FSDP1 flat unit: grad reduce-scatter ({what} unit)", "reduce-scatter",
                             n * fc.reduce_scatter_count, fc.reduce_scatter_payload_bytes, f))
        return out
    # GSPMD per parameter (07's annotations: every fsdp-sharded dimension is h, padded to ceil(h/f) rows):
    # each layer weight gathered before its forward and again for its backward, its gradient reduce-scattered;
    # the LM head (+ final norm) gathered once and kept for the backward; the embedding, sharded on h, never
    # gathered — its lookup runs on the h-slice and two all-to-alls re-shard the activations (measured, tensor 1)
    rows = ceil_div(h, f) / h  # one chip's padded share of an h-dimension
    norms = 2 * h  # the two RMSNorm weights of a layer (replicated over tensor)
    matrices = z.layer_local - norms / t  # one tensor rank's weight matrices (the planner splits every weight by t)
    layer_gather = matrices * rows * pb + norms * rows * NORM_GATHER_BYTES
    out.append(_term("fsdp", "param all-gather (per parameter: each layer weight fwd + bwd)", "all-gather",
                     mb * 2 * z.layers, layer_gather, f))
    out.append(_term("fsdp", "grad reduce-scatter (per parameter: each layer gradient)", "reduce-scatter",
                     z.layers, z.layer_local * cfg.grad_bytes, f))
    if head:
        out.append(_term("fsdp", "param all-gather (LM head + final norm, once: kept for the backward)",
                         "all-gather", mb, pc.lm_head / t * rows * pb + h * rows * NORM_GATHER_BYTES, f))
        out.append(_term("fsdp", "grad reduce-scatter (LM head + final norm)", "reduce-scatter", 1,
                         head / t * cfg.grad_bytes, f))
    if emb:
        x = z.b * z.s * h * dtype_bytes(cfg.act_dtype)  # [b, s, h] of one microbatch, re-sharded batch <-> h
        out.append(_term("fsdp", "embedding output all-to-all (h-sharded lookup -> batch; and back in the bwd)",
                         "all-to-all", 2 * mb, x, f))
    return out


def _comm_terms(cfg: PlanConfig, m: ModelConfig, z: _Sizes, stage: int, ends: tuple[str, ...]) -> list[CommTerm]:
    """Collectives of one training step, per chip of the stage holding ``ends``, on each mesh axis."""
    f, t, pp, cp, ep, mb = cfg.fsdp, cfg.tensor, cfg.pipeline, cfg.context, cfg.expert, cfg.microbatches
    pc, h, e = z.pc, m.hidden, dtype_bytes(cfg.act_dtype)
    comm = _fsdp_terms(cfg, m, z, stage, ends)
    head = pc.lm_head + pc.final_norm if "head" in ends else 0
    emb = pc.embedding if "embedding" in ends else 0
    # replicas: a weight's gradient is summed over the devices that hold the same shard and see other tokens
    shard = f if stage >= 2 else 1  # HSDP: only the reduced shard crosses replicas
    dense = (z.layers * pc.dense_per_layer + emb + head) / t
    for kind, numel, axes in (("dense", dense, ("data", "context", "expert")),
                              ("expert", z.layers * pc.expert_per_layer / (t * ep), ("data", "context"))):
        group = [a for a in axes if getattr(cfg, a) > 1]
        n = math.prod(getattr(cfg, a) for a in group)
        if numel and n > 1:
            what = "grad all-reduce" + ("" if group == ["data"] else f" over {' × '.join(group)}") + \
                (" (expert weights)" if kind == "expert" else "")
            comm.append(_term("+".join(group), what, "all-reduce", 1, numel / shard * cfg.grad_bytes, n))
    x = z.b * z.s * h * e  # one [b, s, h] activation of a microbatch on this chip
    again = cfg.recompute == "full"  # the recomputed forward repeats the forward's collectives
    if t > 1:  # Megatron (formulas.tp): g after attention and MLP (fwd, + recompute), f before them (bwd)
        bsh = dict(batch=z.b, seq=z.s, hidden=h, tp=t, dtype=cfg.act_dtype)
        if cfg.sequence_parallel:  # Megatron SP: each f/g pair -> all-gathers [b, s/t, h] + reduce-scatters
            step = tp_f.sequence_parallel(**bsh, sublayers=2 * z.layers, backward=True)
            fwd = (tp_f.sequence_parallel(**bsh, sublayers=2 * z.layers, backward=False) if again
                   else dict.fromkeys(step, 0))
            regather = step["all_gather.regather.count"]
            n_ag = step["all_gather.count"] + fwd["all_gather.count"] - regather
            n_rs = step["reduce_scatter.count"] + fwd["reduce_scatter.count"]
            comm.append(_term("tensor", "layer all-gathers (SP: g_sp fwd, gbar_sp bwd)", "all-gather", mb * n_ag,
                              x / t, t))
            comm.append(_term("tensor", "layer input re-gathers (SP, bwd)", "all-gather", mb * regather, x / t, t))
            comm.append(_term("tensor", "layer reduce-scatters (SP)", "reduce-scatter", mb * n_rs, x, t))
            # the norms act on each rank's s/t tokens: their gradients are partial sums, added once per step
            sp = tp_f.sp_grad_elements(h, z.layers, norm="rmsnorm", row_biases=False, final_norm="head" in ends)
            comm.append(_term("tensor", "SP norm-weight grad all-reduce (bwd, once per step)", "all-reduce", 1,
                              sp * cfg.grad_bytes, t))
        else:
            layer = tp_f.transformer_layer_all_reduce(**bsh, backward=True)  # 2 fwd + 2 bwd per layer
            n = z.layers * layer["count"]
            if again:  # the recomputed forward issues its 2 g all-reduces again
                n += z.layers * tp_f.transformer_layer_all_reduce(**bsh, backward=False)["count"]
            comm.append(_term("tensor", "layer all-reduces (g fwd, f bwd)", "all-reduce", mb * n, x, t))
        if emb:
            comm.append(_term("tensor", "vocab-parallel embedding fwd", "all-reduce",
                              mb * tp_f.embedding_all_reduce(**bsh)["count"], x, t))
        if head:  # the column-parallel LM head's f: backward all-reduce of its input gradient [b, s, h]
            comm.append(_term("tensor", "LM-head input grad (f, bwd)", "all-reduce", mb, x, t))
            ce = tp_f.vocab_parallel_ce(z.b, z.s, t, dtype="float32")  # max, target logit, sum-exp of [b, s]
            comm.append(_term("tensor", "vocab-parallel cross-entropy", "all-reduce", mb * ce["count"],
                              ce["bytes"] / ce["count"], t))
    if pp > 1:  # one activation forward, one gradient backward per microbatch per stage boundary
        msg = z.b * z.s * h * e / (t if cfg.sequence_parallel else 1)
        traffic = fpp.p2p_traffic(pp, mb, z.b, z.s, h, cfg.act_dtype, v=cfg.virtual)
        sends = max(traffic[f"device.{r}.count"] for r in range(pp))
        comm.append(_term("pipeline", "stage boundary sends (activation fwd, gradient bwd)", "send", int(sends), msg,
                          2))
    if cp > 1:
        kv, hd = max(m.kv_heads // t, 1), h // m.heads  # K/V heads on one tensor rank
        kw = dict(batch=z.b, seq=cfg.seq, kv_heads=kv, head_dim=hd, cp=cp, dtype=cfg.act_dtype)
        n = mb * z.layers
        if cfg.context_method == "ring":
            ring = fcp.ring_p2p(**kw, phase="step")
            count = ring["count"] + (fcp.ring_p2p(**kw, phase="forward")["count"] if again else 0)
            comm.append(_term("context", "ring attention K/V block sends (fwd, bwd: K/V and dK/dV)", "send",
                              n * count, fcp.kv_block_bytes(**kw), 2))
        else:
            ag = fcp.allgather_kv(**kw, backward=True)
            comm.append(_term("context", "K, V all-gathers (fwd" + (", recompute)" if again else ")"), "all-gather",
                              n * 2 * (1 + again), ag["all_gather"]["bytes"] / 2, cp))
            comm.append(_term("context", "dK, dV reduce-scatters (bwd)", "reduce-scatter", n * 2,
                              ag["reduce_scatter"]["bytes"] / 2, cp))
    if ep > 1:  # dispatch + combine per MoE layer forward, the same backward (+ the recomputed forward)
        a2a = fep.all_to_all(z.b * z.s, h, m.experts, m.top_k, m.capacity_factor, ep, cfg.act_dtype, backward=True)
        comm.append(_term("expert", "MoE dispatch / combine all-to-alls (fwd, bwd" + (", recompute)" if again
                                                                                      else ")"),
                          "all-to-all", mb * z.layers * (a2a["count"] + 2 * again), a2a["bytes"] / a2a["count"],
                          ep))
    return comm


def _ends(pp: int, which: str) -> tuple[str, ...]:
    """What the pipeline stage ``which`` holds besides its layers."""
    if pp == 1:
        return ("embedding", "head")
    return ("embedding",) if which == "first" else ("head",)


def step_comm(cfg: PlanConfig, stage: str = "last") -> list[CommTerm]:
    """The communication terms of ``plan(cfg)`` for a mesh of any size, without the slice (of pipeline stage
    ``stage``, "first" or "last", when pipeline > 1).

    ``cfg.topology`` is not read: the degrees need not multiply to a TPU slice's chip count (notebook 07 checks
    these terms against the compiler at 2 ranks, a size no TPU slice has). Every other rule of :func:`plan`
    applies.

    >>> one_layer = ModelConfig("one layer", layers=1, hidden=128, ffn=512, heads=8, kv_heads=8, vocab=1024,
    ...                         gated_mlp=False)
    >>> terms = step_comm(PlanConfig(one_layer, data=1, fsdp=1, tensor=2, global_batch=1, seq=64,
    ...                              recompute="none", act_dtype="float32"))
    >>> [(t.what, t.count, t.payload_bytes) for t in terms][0]     # 2 fwd (g) + 2 bwd (f), each [1, 64, 128] f32
    ('layer all-reduces (g fwd, f bwd)', 4, 32768)
    """
    m = model_from(cfg.model)
    zero = _validate(cfg, m, None)
    return _comm_terms(cfg, m, _sizes(cfg, m), zero, _ends(cfg.pipeline, stage))


def ici_axes(cfg: PlanConfig, terms: list[CommTerm]) -> dict[str, int]:
    """Torus axes each term's group spans on ``cfg.topology`` (its devices' coordinates, device order as the
    compile-only topologies list them): ``{term.axis: axes}``."""
    mesh = {a: getattr(cfg, a) for a in MESH_AXES}
    out = {}
    for term in terms:
        if term.axis not in out:
            group = hw.mesh_group(mesh, tuple(term.axis.split("+")))
            out[term.axis] = max(hw.group_axes(cfg.topology, group), 1)
    return out


def comm_seconds(terms: list[CommTerm], axes: dict[str, int], chip: hw.ChipProfile) -> float:
    """Σ wire / egress: a collective over a group spanning k torus axes sends over 2k links
    (``ChipProfile.ici_egress_for(k)``); a send goes to one neighbour, one link one way."""
    total = 0.0
    for t in terms:
        egress = chip.ici_link_bytes_per_s / 2 if t.op == "send" else chip.ici_egress_for(axes[t.axis])
        total += t.wire_bytes / egress
    return total


def _stage_memory(cfg: PlanConfig, m: ModelConfig, z: _Sizes, zero: int, which: str
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Per-chip memory of pipeline stage ``which`` ("first" / "last"): categories and the two transient phases."""
    f, t, pp = cfg.fsdp, cfg.tensor, cfg.pipeline
    pc, h, s, b = z.pc, m.hidden, z.s, z.b
    ends = _ends(pp, which)
    head = pc.lm_head + pc.final_norm if "head" in ends else 0
    emb = pc.embedding if "embedding" in ends else 0
    local = z.layers * z.layer_local * t + emb + head  # parameters of this stage before the tensor split
    fsdp3 = zero == 3 and f > 1
    units = [int(z.layer_local * t)] * z.layers + ([emb + head] if emb + head else [])
    st = mem.model_state_bytes(int(local), t, f, zero, cfg.param_bytes, cfg.grad_bytes, cfg.optimizer_k,
                               units if cfg.fsdp_rule == "fsdp1" else None)
    padding = st.padding
    if fsdp3 and cfg.fsdp_rule == "gspmd":  # per parameter: each h-dimension padded to ceil(h/f) rows per chip
        padding = local / t * (ceil_div(h, f) / h - 1 / f) * (cfg.param_bytes + cfg.grad_bytes + cfg.optimizer_k)

    def layer_act(recompute: str) -> float:
        terms = act.block_activation_bytes(s, b, h, m.ffn, m.heads, m.kv_heads, t, cfg.sequence_parallel,
                                           recompute, gated_mlp=m.gated_mlp, flash_attention=cfg.flash_attention,
                                           dropout=False)
        if not m.moe or recompute == "full":
            return terms.total
        moe = act.moe_mlp_activation_bytes(s, b, h, m.ffn, m.experts, m.top_k, m.capacity_factor, t,
                                           cfg.sequence_parallel, m.gated_mlp)
        return terms.total - terms.mlp + moe

    chunk = z.layers // (cfg.virtual if cfg.schedule == "interleaved" else 1)  # layers of one in-flight item
    kept = z.inflight[which] * chunk * layer_act(cfg.recompute)  # kept for the backward
    if cfg.offload:  # full recompute's kept layer inputs are in host memory (an offloaded scan residual)
        kept = 0.0
    # Two transient phases that do not overlap; the peak holds the larger (measured with XLA:TPU: at the
    # recomputed layer's attention backward the logits are gone):
    #   layer backward: the layer being recomputed holds its activations once (selective: its attention core),
    #                   without a flash kernel its attention backward holds dP and dS next to P, its FSDP unit is
    #                   gathered (params + full gradient), context parallelism holds K/V blocks;
    #   LM head:        the [b, s, V/t] fp32 logits and the gathered vocabulary matrix (+ its full gradient).
    work = {"full": layer_act("none"), "selective": layer_act("none") - layer_act("selective"),
            "none": 0.0}[cfg.recompute]
    work += act.attention_backward_bytes(s, b, m.heads, t, cfg.flash_attention)
    if cfg.context > 1:
        work += fcp.memory(b, cfg.seq, m.heads // t, max(m.kv_heads // t, 1), h // m.heads, cfg.context,
                           cfg.act_dtype, "ring" if cfg.context_method == "ring" else "allgather")["kv"]
    unit_bytes = cfg.param_bytes + cfg.grad_bytes  # a gathered unit: its parameters and their full gradient
    layer_unit = z.layer_local * unit_bytes if fsdp3 else 0.0
    phases = {"layer backward": work + layer_unit}
    logits = vocab_unit = 0.0
    if head:
        logits = b * s * mem.padded_vocab(m.vocab, t) / t * cfg.logits_bytes  # [b, s, V/t] fp32
        vocab = max(emb, pc.lm_head) if cfg.fsdp_rule == "fsdp1" else pc.lm_head  # gspmd: the embedding never is
        vocab_unit = vocab / t * unit_bytes if fsdp3 else 0.0
        phases["LM head"] = logits + vocab_unit
    layer_peak = max(phases, key=lambda k: phases[k]) == "layer backward"
    memory = {"params": st.params, "grads": st.grads, "optimizer": st.optimizer, "padding": padding,
              "activations": kept + (work if layer_peak else 0.0), "logits": 0.0 if layer_peak else logits,
              "fsdp_gathered_unit": layer_unit if layer_peak else vocab_unit}
    return memory, phases


def plan(cfg: PlanConfig) -> Plan:
    """Per-chip memory, communication, FLOPs, step time, MFU and a verdict for one configuration."""
    m = model_from(cfg.model)
    profile, chips = hw.topology(cfg.topology)
    zero = _validate(cfg, m, chips)
    z = _sizes(cfg, m)
    stages = ("first", "last") if cfg.pipeline > 1 else ("first",)
    per_stage = {w: _stage_memory(cfg, m, z, zero, w) for w in stages}
    which = max(stages, key=lambda w: sum(per_stage[w][0].values()))
    memory, phases = per_stage[which]
    peak_phase = max(phases, key=lambda k: phases[k])
    comm = _comm_terms(cfg, m, z, zero, _ends(cfg.pipeline, "last"))
    axes = ici_axes(cfg, comm)

    # ---- FLOPs, roofline, MFU, verdict
    ffn = m.top_k * m.ffn if m.moe else m.ffn  # an MoE token goes through its top-k experts
    fl = transformer_flops(cfg.global_batch, cfg.seq, m.layers, m.hidden, ffn, m.heads, m.kv_heads,
                           mem.padded_vocab(m.vocab, cfg.tensor), m.gated_mlp, cfg.recompute)
    if m.moe:  # hardware: the experts run all E·C slots of a group (S = this chip's b·s tokens), filled or not
        per_token = fep.capacity(z.b * z.s, m.experts, m.top_k, m.capacity_factor) * m.experts / (z.b * z.s)
        fwd_experts = 2.0 * cfg.global_batch * cfg.seq * m.layers * ffn * (3 if m.gated_mlp else 2) * m.hidden
        fl = fl._replace(hardware=fl.hardware + (per_token / m.top_k - 1) * fwd_experts
                         * (4 if cfg.recompute == "full" else 3))
    bubble = fpp.bubble_ratio(cfg.pipeline, cfg.microbatches, cfg.virtual) if cfg.pipeline > 1 else 0.0
    wire = sum(c.wire_bytes for c in comm)
    rl = hw.roofline(fl.hardware / chips, wire, profile, comm_s=comm_seconds(comm, axes, profile),
                     bubble_ratio=bubble)
    mfu_value = mfu(fl.model, rl.step_s, chips, profile.bf16_peak_flops_per_s)
    total = sum(memory.values())
    top = sorted(memory.items(), key=lambda kv: -kv[1])[:2]
    top_s = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in top)
    usable = profile.hbm_usable_bytes  # what the XLA:TPU compiler lets one chip's program use
    hbm_s = f"{usable / 2**30:.2f} GiB usable HBM ({usable / 1e9:.1f} GB)"
    limit = usable * (1 - cfg.fit_margin)
    if total <= limit:
        verdict = f"fits: {total / 1e9:.2f} GB per chip of {hbm_s}, {100 * total / usable:.0f} %; largest: {top_s}"
    elif total <= usable:
        verdict = (f"at risk: {total / 1e9:.2f} GB per chip is {100 * total / usable:.0f} % of {hbm_s}, within the "
                   f"{100 * cfg.fit_margin:.0f} % the compiler's heap packing can take; largest: {top_s}")
    else:
        verdict = (f"does not fit: needs {total / 1e9:.2f} GB per chip but a {profile.name} chip has {hbm_s} "
                   f"({total / usable:.2f}×); largest: {top_s}")
    return Plan(cfg, m, profile.name, chips, mem.padded_vocab(m.vocab, cfg.tensor), z.pc.total, z.b, memory, usable,
                comm, fl, rl, mfu_value, total <= limit, verdict, _notes(cfg, m, z, zero, phases, peak_phase, axes,
                                                                          which, bubble),
                phases, peak_phase, axes, which if cfg.pipeline > 1 else "")


def _notes(cfg: PlanConfig, m: ModelConfig, z: _Sizes, zero: int, phases: dict[str, float], peak_phase: str,
           axes: dict[str, int], which: str, bubble: float) -> list[str]:
    """What the plan assumed and where its peak is, in words."""
    t, f = cfg.tensor, cfg.fsdp
    v_pad = mem.padded_vocab(m.vocab, t)
    kv = f"GQA {m.kv_heads} KV heads" if m.kv_heads < m.heads else "multi-head attention"
    attn = ("flash attention (log-sum-exp kept, no s² scores)" if cfg.flash_attention else
            "no flash attention: softmax stored, and P, dP, dS [b, a/t, s, s] in one layer's backward")
    mlp = (f"mixture of {m.experts} {'SwiGLU' if m.gated_mlp else 'GeLU'} experts (top {m.top_k}, capacity factor "
           f"{m.capacity_factor})" if m.moe else f"{'SwiGLU' if m.gated_mlp else 'GeLU'} MLP")
    rule = {"gspmd": " (per parameter, as XLA:TPU compiles it)", "fsdp1": " (PyTorch FSDP1 flat units)"}
    notes = [f"vocabulary padded {m.vocab} -> {v_pad} (multiple of 128·tensor = {128 * t})",
             f"ZeRO stage {zero} over fsdp={f}{rule[cfg.fsdp_rule] if zero == 3 and f > 1 else ''}; microbatches "
             f"of {z.b} sequence(s) of {z.s} tokens per chip",
             f"activations: {mlp}, {kv}, {attn}, no dropout, 16-bit, recompute={cfg.recompute}"
             f"{', sequence parallel' if cfg.sequence_parallel else ''} (formulas.activations)"]
    if cfg.pipeline > 1:
        notes.append(f"pipeline: {cfg.pipeline} stages of {z.layers} layers, {cfg.microbatches} microbatches, "
                     f"{cfg.schedule}{f' v={cfg.virtual}' if cfg.virtual > 1 else ''}: bubble {bubble:.3f} of the "
                     f"ideal time; {z.inflight['first']} microbatch(es) in flight on the first stage, "
                     f"{z.inflight['last']} on the last; memory is the {which} stage's (the heavier), comm the last "
                     "stage's (it holds the LM head)")
    if cfg.context > 1:
        notes.append(f"context: sequence split {cfg.context} ways ({cfg.context_method}; formulas.context)")
    if cfg.expert > 1:
        notes.append(f"expert: {m.experts // cfg.expert} of {m.experts} experts per chip; each chip routes its own "
                     "tokens (formulas.expert)" + ("; with tensor > 1 each tensor rank sends its copy" if t > 1
                                                   else ""))
    if zero == 3 and f > 1 and cfg.fsdp_rule == "gspmd" and cfg.recompute == "full":
        notes.append("full recompute: XLA:TPU gathered some layer weights a third time in the backward (measured "
                     "+10 % all-gather bytes on a 4-layer Llama); not modelled")
    links = ", ".join(f"{a}: {k} torus ax{'is' if k == 1 else 'es'}" for a, k in axes.items())
    if links:
        notes.append(f"comm time per group's ICI links ({links}; a send: one link one way); rings assumed to wrap "
                     "around (a slice smaller than the pod has lines: up to 2x slower, not modelled)")
    other = next((k for k in phases if k != peak_phase), None)
    fsdp3 = zero == 3 and f > 1
    if peak_phase == "layer backward":
        what = ("the recomputed layer's activations" if cfg.recompute == "full" else "one layer's backward") \
            + ("" if cfg.flash_attention else " with P, dP, dS") + (" and its gathered FSDP unit" if fsdp3 else "")
    else:
        what = "fp32 logits" + (" and the gathered vocabulary matrix" if fsdp3 else "")
    notes.append(f"peak in the {peak_phase} ({phases[peak_phase] / 1e9:.2f} GB of transients: {what})"
                 + (f"; the {other} needs {phases[other] / 1e9:.2f} GB at another moment" if other else ""))
    return notes
