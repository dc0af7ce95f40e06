"""Planner: what a sharding plan costs per chip before you rent the pod.

Design note
-----------
`plan(PlanConfig(...))` composes the formula modules (no torch, no XLA) for a decoder-only transformer on a
TPU slice with a (data, fsdp, tensor) mesh. :class:`PlanConfig` is the one declaration of a plan's inputs (type,
default, comment); notebook 07's parameters (``shardlab.params.PlannerParams``) extend it, so ``plan(p)`` plans the
notebook's own parameters and nothing copies them:

    memory per chip   model state (`formulas.memory` -> `formulas.zero`, flat-unit padding), activations
                      (`formulas.activations.block_activation_bytes`: the model's own block — GQA KV heads,
                      SwiGLU or GeLU, flash attention or stored scores — plus what one layer's backward holds
                      at the peak: the layer being recomputed, and without flash attention the scores'
                      gradients, `attention_backward_bytes`), logits, the largest FSDP unit being gathered (a
                      layer, or a vocabulary matrix when that is larger: Llama 3's 128K x 4096 embedding is 2.4
                      layers of 8B)
    comm per step     (`step_comm(cfg)`, also for meshes no slice has) DP all-reduce over `data`, ZeRO / FSDP
                      all-gather + reduce-scatter over `fsdp`
                      (`formulas.fsdp.flat_step_comm`: one flat unit per layer, resharded after forward, and
                      the root unit — embedding, final norm, LM head — which PyTorch FSDP does not reshard
                      after forward), Megatron TP all-reduces over `tensor` (`formulas.tp`: 4 per layer +
                      embedding / LM head / cross-entropy; SP swaps each pair for all-gathers + reduce-scatters
                      and re-gathers each layer input in the backward); payload and ring-wire bytes per chip
                      (`formulas.common.wire_bytes`)
    FLOPs             `formulas.flops.transformer_flops` (model and hardware FLOPs incl. recompute)
    time              `formulas.hardware.roofline`: max(compute, comm) per chip; MFU (`formulas.flops.mfu`)
                      = model FLOPs / (step · chips · peak) — an upper bound: the roofline assumes overlap
    verdict           fits if the per-chip total is within (1 - fit_margin) of the HBM the XLA:TPU compiler lets
                      a program use (`hbm_usable_bytes` of data/hardware: its capacity check counts arguments +
                      temporaries against exactly that figure; the ~258 MiB it lists as reserved lie outside
                      it); "at risk" between that and the capacity; the reason in words

Assumptions, stated once: bf16 params/grads + fp32 Adam state (ZeRO's K = 12); Megatron's vocabulary
padding to a multiple of 128·tensor; 16-bit activations without dropout, per the table in
`formulas.activations` (flash attention keeps only a log-sum-exp, no s² scores; without it the softmax is
stored); logits kept in fp32 for the loss; the layer being recomputed under full recompute holds its full
activations once. `Plan.notes` names the block variant used.

The fit margin (default 10 %) is the compiler's heap packing, which a sum of terms cannot see. Compiled with
XLA:TPU for the planner's slice (full Llama steps without a flash kernel, parameters and AdamW state donated to
their updates; `shardlab.planner_verdict`), the two steps near the capacity used 1.006x and 1.085x of it and
lost 3.65 and 9.42 GiB of their temporaries to fragmentation (Llama 3 8B on v6e-8, 70B on v6e-64); the
compiler's totals were 0.99x to 1.07x the planner's. The 8B v6e-8 plan adds up to 99.4 % of the capacity and
the compiler ran out of memory: a total within 10 % of the capacity is not a verdict the formulas can give.

Every bad input raises ValueError naming the values, before any arithmetic:
    >>> plan(PlanConfig("llama-3-8b", "v5e-8", data=2, fsdp=2, tensor=1))
    Traceback (most recent call last):
    ValueError: data=2 × fsdp=2 × tensor=1 = 4 does not equal the 8 chips of v5e-8
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from shardlab.formulas import activations as act
from shardlab.formulas import hardware as hw
from shardlab.formulas import memory as mem
from shardlab.formulas import tp as tp_f
from shardlab.formulas.common import RECOMPUTE_POLICIES, ceil_div, dtype_bytes, wire_bytes
from shardlab.formulas.flops import FlopTerms, mfu, transformer_flops
from shardlab.formulas.fsdp import flat_step_comm
from shardlab.formulas.zero import zero_comm
from shardlab.presets import MODEL_PRESETS, ModelConfig, model_from, model_preset

__all__ = ["MODEL_PRESETS", "CommTerm", "ModelConfig", "Plan", "PlanConfig", "model_from", "model_preset", "plan",
           "step_comm"]


@dataclass(frozen=True)
class PlanConfig:
    """What a plan is of: a model on a TPU slice, the mesh degrees, the batch, and the planner's assumptions."""

    model: ModelConfig | str | dict = "llama-3-8b"  # a preset name, or custom sizes as a dict (see shardlab.presets)
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
    act_dtype: str = "bfloat16"  # activations on the wire (the TP collectives)
    logits_bytes: int = 4  # bytes per logit for the loss (fp32)
    fit_margin: float = 0.10  # "fits" only under (1 - fit_margin) x usable HBM: the compiler's heap packing


class CommTerm(NamedTuple):
    axis: str  # "data" | "fsdp" | "tensor"
    what: str  # e.g. "grad all-reduce"
    op: str  # collective
    count: int  # calls per step
    payload_bytes: float  # per call, per chip
    wire_bytes: float  # all calls, per chip (ring model)


@dataclass
class Plan:
    config: PlanConfig
    model: ModelConfig
    chip: str
    chips: int
    padded_vocab: int
    num_params: int
    micro_batch: int  # sequences per data-parallel rank
    memory: dict[str, float]  # per chip, bytes, by category
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
            "degrees": {"data": c.data, "fsdp": c.fsdp, "tensor": c.tensor}, "recompute": c.recompute,
            "padded_vocab": self.padded_vocab, "num_params": self.num_params,
            "memory": dict(self.memory), "memory_total": self.memory_total, "hbm_bytes": self.hbm_bytes,
            "comm": [t._asdict() for t in self.comm], "comm_payload_bytes": self.comm_payload_bytes,
            "comm_wire_bytes": self.comm_wire_bytes, "flops": self.flops._asdict(),
            "roofline": self.roofline._asdict(), "mfu": self.mfu, "fits": self.fits, "at_risk": self.at_risk,
            "fit_limit_bytes": self.fit_limit_bytes, "phases": dict(self.phases), "peak_phase": self.peak_phase,
            "verdict": self.verdict,
            "config": {f.name: getattr(c, f.name) for f in fields(PlanConfig) if f.name != "model"},
        }


def _validate(cfg: PlanConfig, m: ModelConfig, chips: int | None) -> int:
    """Every rule of a configuration (``chips``: the slice's chip count, None = not tied to a slice)."""
    d, f, t = cfg.data, cfg.fsdp, cfg.tensor
    sizes = (("data", d), ("fsdp", f), ("tensor", t), ("global_batch", cfg.global_batch), ("seq", cfg.seq))
    sizes += (("param_bytes", cfg.param_bytes), ("grad_bytes", cfg.grad_bytes), ("logits_bytes", cfg.logits_bytes))
    for name, v in sizes:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")
    for name, v in (("sequence_parallel", cfg.sequence_parallel), ("flash_attention", cfg.flash_attention)):
        if not isinstance(v, bool):
            raise ValueError(f"{name}={v!r} must be True or False")
    k = cfg.optimizer_k
    if isinstance(k, bool) or not isinstance(k, int | float) or k < 0:
        raise ValueError(f"optimizer_k={k!r} must be a number >= 0 (optimizer bytes per parameter)")
    dtype_bytes(cfg.act_dtype)  # a known element type, or ValueError naming it
    if chips is not None and d * f * t != chips:
        raise ValueError(f"data={d} × fsdp={f} × tensor={t} = {d * f * t} does not equal "
                         f"the {chips} chips of {cfg.topology}")
    for name, v in (("hidden", m.hidden), ("heads", m.heads), ("ffn", m.ffn)):
        if v % t:
            raise ValueError(f"{name}={v} is not divisible by tensor={t}")
    if m.kv_heads % t and t % m.kv_heads:
        raise ValueError(f"kv_heads={m.kv_heads} and tensor={t}: one must divide the other")
    if cfg.global_batch % (d * f):
        raise ValueError(f"global_batch={cfg.global_batch} is not divisible by data × fsdp = {d * f}")
    if cfg.sequence_parallel and cfg.seq % t:
        raise ValueError(f"seq={cfg.seq} is not divisible by tensor={t} (sequence parallelism)")
    if cfg.recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute={cfg.recompute!r} is not one of {RECOMPUTE_POLICIES}")
    margin = cfg.fit_margin
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
        raise ValueError(f"fit_margin={margin!r} must be a number in [0, 1) (a fraction of the usable HBM)")
    stage = (3 if f > 1 else 0) if cfg.zero_stage is None else cfg.zero_stage
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={stage!r} must be one of 0, 1, 2, 3")
    return stage


def _term(axis: str, what: str, op: str, count: int, payload: float, world: int) -> CommTerm:
    return CommTerm(axis, what, op, count, payload, count * wire_bytes(op, payload, world))


def _comm_terms(cfg: PlanConfig, m: ModelConfig, pc: mem.ParamCounts, stage: int, b: int) -> list[CommTerm]:
    """Collectives of one training step, per chip, on each mesh axis."""
    d, f, t = cfg.data, cfg.fsdp, cfg.tensor
    comm: list[CommTerm] = []
    psi_local = pc.total / t
    if f > 1 and stage == 3:  # FSDP: one flat unit per layer (resharded after forward) + the root unit
        units = (("layer", m.layers, pc.per_layer, False),
                 ("root: embedding + final norm + LM head", 1, pc.embedding + pc.final_norm + pc.lm_head, True))
        for what, n, numel, root in units:
            fc = flat_step_comm(ceil_div(numel, t), f, cfg.param_bytes, root=root)
            when = "fwd only: not resharded" if root else "fwd+bwd"
            comm.append(_term("fsdp", f"param all-gather ({what} unit, {when})", "all-gather",
                              n * fc.all_gather_count, fc.all_gather_payload_bytes, f))
            comm.append(_term("fsdp", f"grad reduce-scatter ({what} unit)", "reduce-scatter",
                              n * fc.reduce_scatter_count, fc.reduce_scatter_payload_bytes, f))
    elif f > 1 and stage in (1, 2):  # ZeRO-1/2: reduce-scatter Ψ grads, all-gather Ψ updated params
        zc = zero_comm(psi_local, f, stage)  # elements
        rs, ag = zc.reduce_scatter * cfg.grad_bytes, zc.all_gather * cfg.param_bytes / f  # ag payload: shard
        comm.append(_term("fsdp", "grad reduce-scatter", "reduce-scatter", 1, rs, f))
        comm.append(_term("fsdp", "param all-gather", "all-gather", 1, ag, f))
    elif f > 1:
        g = psi_local * cfg.grad_bytes
        comm.append(_term("fsdp", "grad all-reduce (stage 0)", "all-reduce", 1, g, f))
    if d > 1:  # HSDP: only the reduced shard crosses replicas
        g = psi_local / (f if stage >= 2 else 1) * cfg.grad_bytes
        comm.append(_term("data", "grad all-reduce", "all-reduce", 1, g, d))
    if t > 1:  # Megatron (formulas.tp): g after attention and MLP (fwd, + recompute), f before them (bwd)
        bsh = dict(batch=b, seq=cfg.seq, hidden=m.hidden, tp=t, dtype=cfg.act_dtype)
        x = b * cfg.seq * m.hidden * dtype_bytes(cfg.act_dtype)  # one [b, s, h] activation
        if cfg.sequence_parallel:  # Megatron SP: each f/g pair -> all-gathers [b, s/t, h] + reduce-scatters
            step = tp_f.sequence_parallel(**bsh, sublayers=2 * m.layers, backward=True)  # fwd + bwd of 2L pairs
            again = (tp_f.sequence_parallel(**bsh, sublayers=2 * m.layers, backward=False)  # recomputed forward
                     if cfg.recompute == "full" else dict.fromkeys(step, 0))
            regather = step["all_gather.regather.count"]
            n_ag = step["all_gather.count"] + again["all_gather.count"] - regather
            n_rs = step["reduce_scatter.count"] + again["reduce_scatter.count"]
            comm.append(_term("tensor", "layer all-gathers (SP: g_sp fwd, gbar_sp bwd)", "all-gather", n_ag, x / t,
                              t))
            comm.append(_term("tensor", "layer input re-gathers (SP, bwd)", "all-gather", regather, x / t, t))
            comm.append(_term("tensor", "layer reduce-scatters (SP)", "reduce-scatter", n_rs, x, t))
        else:
            layer = tp_f.transformer_layer_all_reduce(**bsh, backward=True)  # 2 fwd + 2 bwd per layer
            n = m.layers * layer["count"]
            if cfg.recompute == "full":  # the recomputed forward issues its 2 g all-reduces again
                n += m.layers * tp_f.transformer_layer_all_reduce(**bsh, backward=False)["count"]
            comm.append(_term("tensor", "layer all-reduces (g fwd, f bwd)", "all-reduce", n, x, t))
        emb = tp_f.embedding_all_reduce(**bsh)
        comm.append(_term("tensor", "vocab-parallel embedding fwd", "all-reduce", emb["count"], x, t))
        # the column-parallel LM head's f: backward all-reduce of its input gradient [b, s, h]
        comm.append(_term("tensor", "LM-head input grad (f, bwd)", "all-reduce", 1, x, t))
        ce = tp_f.vocab_parallel_ce(b, cfg.seq, t, dtype="float32")  # max, target logit, sum-exp of [b, s]
        comm.append(_term("tensor", "vocab-parallel cross-entropy", "all-reduce", ce["count"],
                          ce["bytes"] / ce["count"], t))
    return comm


def step_comm(cfg: PlanConfig) -> list[CommTerm]:
    """The communication terms of ``plan(cfg)`` for a (data, fsdp, tensor) mesh of any size, without the slice.

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
    stage = _validate(cfg, m, None)
    pc = mem.param_count(m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, mem.padded_vocab(m.vocab, cfg.tensor),
                         m.gated_mlp)
    return _comm_terms(cfg, m, pc, stage, cfg.global_batch // (cfg.data * cfg.fsdp))


def plan(cfg: PlanConfig) -> Plan:
    """Per-chip memory, communication, FLOPs, step time, MFU and a verdict for one configuration."""
    m = model_from(cfg.model)
    profile, chips = hw.topology(cfg.topology)
    stage = _validate(cfg, m, chips)
    d, f, t = cfg.data, cfg.fsdp, cfg.tensor
    v_pad = mem.padded_vocab(m.vocab, t)
    pc = mem.param_count(m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, v_pad, m.gated_mlp)
    b = cfg.global_batch // (d * f)  # micro-batch per data-parallel rank
    s, h = cfg.seq, m.hidden

    # ---- memory per chip
    units = [pc.per_layer] * m.layers + [pc.embedding + pc.lm_head + pc.final_norm]  # per layer + the root unit
    st = mem.model_state_bytes(pc.total, t, f, stage, cfg.param_bytes, cfg.grad_bytes, cfg.optimizer_k, units)

    def layer_activations(recompute: str) -> float:
        return act.block_activation_bytes(s, b, h, m.ffn, m.heads, m.kv_heads, t, cfg.sequence_parallel, recompute,
                                          gated_mlp=m.gated_mlp, flash_attention=cfg.flash_attention,
                                          dropout=False).total

    kept = m.layers * layer_activations(cfg.recompute)  # kept for the backward, all step long
    # Two transient phases that do not overlap; the peak holds the larger (measured with XLA:TPU: at the
    # recomputed layer's attention backward the logits are gone; see the module note):
    #   layer backward: the layer being recomputed holds its activations once (selective: its attention core),
    #                   without a flash kernel its attention backward holds dP and dS next to P, and its FSDP unit
    #                   is gathered (params + full gradient);
    #   LM head:        the [b, s, V/t] fp32 logits and the gathered vocabulary matrix (+ its full gradient).
    work = {"full": layer_activations("none"), "selective": layer_activations("none") - layer_activations("selective"),
            "none": 0.0}[cfg.recompute]
    work += act.attention_backward_bytes(s, b, m.heads, t, cfg.flash_attention)
    fsdp3 = stage == 3 and f > 1
    layer_unit = pc.per_layer / t * (cfg.param_bytes + cfg.grad_bytes) if fsdp3 else 0.0
    logits = b * s * v_pad / t * cfg.logits_bytes  # [b, s, V/t] fp32
    vocab_unit = max(pc.embedding, pc.lm_head) / t * (cfg.param_bytes + cfg.grad_bytes) if fsdp3 else 0.0
    phases = {"layer backward": work + layer_unit, "LM head": logits + vocab_unit}
    peak_phase = max(phases, key=lambda k: phases[k])
    layer_peak = peak_phase == "layer backward"
    memory = {
        "params": st.params, "grads": st.grads, "optimizer": st.optimizer, "padding": st.padding,
        "activations": kept + (work if layer_peak else 0.0),
        "logits": 0.0 if layer_peak else logits,
        "fsdp_gathered_unit": layer_unit if layer_peak else vocab_unit,  # unsharded params + their full gradient
    }

    comm = _comm_terms(cfg, m, pc, stage, b)

    # ---- FLOPs, roofline, MFU, verdict
    fl = transformer_flops(cfg.global_batch, s, m.layers, h, m.ffn, m.heads, m.kv_heads, v_pad, m.gated_mlp,
                           cfg.recompute)
    wire = sum(c.wire_bytes for c in comm)
    rl = hw.roofline(fl.hardware / chips, wire, profile)
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
    kv = f"GQA {m.kv_heads} KV heads" if m.kv_heads < m.heads else "multi-head attention"
    attn = ("flash attention (log-sum-exp kept, no s² scores)" if cfg.flash_attention else
            "no flash attention: softmax stored, and P, dP, dS [b, a/t, s, s] in one layer's backward")
    block = (f"activations: {'SwiGLU' if m.gated_mlp else 'GeLU'} MLP, {kv}, "
             f"{attn}"
             f", no dropout, 16-bit, recompute={cfg.recompute}"
             f"{', sequence parallel' if cfg.sequence_parallel else ''} (formulas.activations)")
    notes = [f"vocabulary padded {m.vocab} -> {v_pad} (multiple of 128·tensor = {128 * t})",
             f"ZeRO stage {stage} over fsdp={f}; micro-batch {b} sequence(s) of {s} tokens per "
             "data-parallel rank", block]
    other = "LM head" if layer_peak else "layer backward"
    if layer_peak:
        what = ("the recomputed layer's activations" if cfg.recompute == "full" else "one layer's backward") \
            + ("" if cfg.flash_attention else " with P, dP, dS") + (" and its gathered FSDP unit" if fsdp3 else "")
    else:
        what = "fp32 logits" + (" and the gathered vocabulary matrix" if fsdp3 else "")
    notes.append(f"peak in the {peak_phase} ({phases[peak_phase] / 1e9:.2f} GB of transients: {what}); "
                 f"the {other} needs {phases[other] / 1e9:.2f} GB at another moment")
    return Plan(cfg, m, profile.name, chips, v_pad, pc.total, b, memory, usable, comm, fl, rl,
                mfu_value, total <= limit, verdict, notes, phases, peak_phase)
