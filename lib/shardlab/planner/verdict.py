"""The planner checked by the compiler: one Llama training step traced with placeholders, compiled for a TPU slice.

Design note
-----------
``shardlab.planner.plan`` predicts per-chip memory by formula. Here the same model is traced on the CPU device
world as one training step — embedding, ``scan`` over the real L decoder layers (stacked weights), final norm,
LM head, cross-entropy, backward, AdamW — with every weight, optimizer state and the tokens as placeholders
(nothing is allocated), then compiled by the XLA:TPU compiler for the planner's slice: a :class:`VerdictCase`
holds the plan (a ``planner.PlanConfig``; notebook 07's parameters are one) and its ``graph()`` is the step, which
the harness's TPU view (:func:`shardlab.core.harness.tpu`) compiles. The trace makes the planner's default assumptions
(bf16 parameters and gradients, fp32 AdamW state, ZeRO-3 over fsdp, no sequence parallelism); a plan that assumes
otherwise is refused with the reason.

Representation (stated once, every choice visible in the numbers):

    params      bf16 ``[L, out, in]`` (torch layout) 2-D sharded: q, k, v, gate, up -> [∅, out_tensor, in_fsdp];
                o, down -> [∅, out_fsdp, in_tensor]; norms [∅, H_fsdp]; embedding / LM head [V_tensor, H_fsdp]
    optimizer   fp32 master, exp_avg, exp_avg_sq placeholders sharded like the parameter; the AdamW update is
                traced as elementwise ops (``m' = β1·m + (1-β1)·g`` ...). The step returns the new state, donated
                into the old buffers (below).
    recompute   ``full``: a partition function for scan's AOTAutograd trace that saves only the layer's inputs
                (the carry and the weight slices — scan does not copy slices that alias its inputs), so the
                backward recomputes the layer; ``none``: torch's default partition (save what the backward uses).
    attention   plain causal softmax attention: the [b, a/t, s, s] scores exist in the program (no flash kernel).
    activations x [B_(data,fsdp), S, H] between layers, tensor-sharded inside the block (Megatron).

Donation. torch_xla's optimizer step updates parameters and AdamW state in place, so ``graph()`` returns a
``tpu.Step`` that donates every parameter and state placeholder to its update (:func:`adamw_step`).
``donate=False`` compiles the same graph without: the updated state is then a second copy among the outputs,
which the capacity check does not count — the measured difference (Llama 3 70B fits without donation, not with
it) is in :mod:`shardlab.profile.tpu`. The donated verdict is the realistic one.

Per-chip comparison (:func:`check`, :meth:`PlannerCheck.rows`), compiler bytes from ``TpuMemory`` (the numbers
the capacity check counts, not ``temp_size_in_bytes``) or from the out-of-memory message:

    planner term                                     compiler
    params                                           bf16 entry arguments (a fitting program's layout header)
    optimizer                                        fp32 entry arguments
    params + optimizer (+ padding)                   all arguments (an out-of-memory message lists them, unless
                                                     the program alone was over: then "not evaluated")
    grads + activations + logits + gathered unit     the temporaries the check counts (checked_temp), or the
                                                     message's "program"
    total                                            arguments + temporaries (``checked``), or the message's "Used"

The planner's columns are its flash verdict (its default, a step with a flash kernel) and its no-flash verdict —
the attention traced here has no flash kernel, so the no-flash column is the one the compiler checks.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch._functorch.partitioners import _extract_fwd_bwd_modules, _is_primal, default_partition
from torch.fx import GraphModule
from torch_xla.experimental.scan import scan

from shardlab import runtime
from shardlab.core import harness
from shardlab.core.case import Case
from shardlab.formulas import hardware
from shardlab.planner import ModelConfig, Plan, PlanConfig, model_from, plan
from shardlab.profile.placeholders import placeholder
from shardlab.profile.record import Recorder
from shardlab.profile.result_files import entry_layout, load_results
from shardlab.profile.tpu import Step, TpuCompile, get_topology
from shardlab.profile.tpu_worker import TpuWorkerError

LAYER_SPECS: dict[str, tuple[str, ...]] = {  # torch layout [out, in]; stacked with a leading unsplit L
    "q": ("tensor", "fsdp"), "k": ("tensor", "fsdp"), "v": ("tensor", "fsdp"), "o": ("fsdp", "tensor"),
    "gate": ("tensor", "fsdp"), "up": ("tensor", "fsdp"), "down": ("fsdp", "tensor"),
    "ln1": ("fsdp",), "ln2": ("fsdp",),
}
ADAMW = {"b1": 0.9, "b2": 0.95, "lr": 1e-4, "eps": 1e-8, "wd": 0.1}
RECOMPUTE = ("full", "none")
GIB = 1024**3
# What the traced step does, as planner assumptions: a plan that assumes otherwise is not what it compiles
TRACED = {"zero_stage": (None, 3), "sequence_parallel": (False,), "param_bytes": (2,), "grad_bytes": (2,),
          "optimizer_k": (12,), "logits_bytes": (4,), "pipeline": (1,), "context": (1,), "expert": (1,),
          "microbatches": (1,)}
PLAN_KEYS = ("model", "topology", "data", "fsdp", "tensor", "global_batch", "seq", "recompute", "fit_margin")


@dataclass(frozen=True)
class VerdictCase(Case):
    """One Llama training step of the plan ``p`` (a :class:`PlanConfig`; notebook 07's ``PlannerParams`` is one),
    traced with placeholders and compiled by XLA:TPU for the plan's slice."""

    p: PlanConfig
    layers: int | None = None  # override L (quick checks); None = the model's
    donate: bool = True  # parameters and AdamW state aliased to their updates (torch_xla's in-place step)

    ops: ClassVar[tuple[str, ...]] = ()  # read as memory, not collectives
    size_name: ClassVar[str] = "data·fsdp·tensor"

    def __post_init__(self) -> None:
        """Every rule, before any XLA work: the planner's own (the mesh tiles the slice, divisibility, known names),
        then what this trace needs; errors name the values."""
        p = self.p
        if p.recompute not in RECOMPUTE:
            raise ValueError(f"recompute={p.recompute!r} must be one of {RECOMPUTE} (the trace's partition function)")
        if self.layers is not None and (isinstance(self.layers, bool) or not isinstance(self.layers, int)
                                        or self.layers < 1):
            raise ValueError(f"layers={self.layers!r} must be None or an int >= 1")
        for name, allowed in TRACED.items():
            if getattr(p, name) not in allowed:
                raise ValueError(f"{name}={getattr(p, name)!r}: the traced step assumes {name} in {allowed}")
        self.plan()
        m = model_from(p.model)
        if m.moe:
            raise ValueError(f"model={m.name!r} has {m.experts} experts: the traced step is a dense Llama")
        if m.heads % p.tensor or m.kv_heads % p.tensor:
            raise ValueError(f"heads={m.heads} and kv_heads={m.kv_heads} must both be divisible by "
                             f"tensor={p.tensor} (the traced attention shards heads over tensor)")

    @property
    def devices(self) -> int:
        return self.p.data * self.p.fsdp * self.p.tensor

    def mesh_problem(self, num_devices: int) -> str | None:
        if self.devices != num_devices:  # the mesh (data, fsdp, tensor) spans every device of the world
            return f"the mesh needs {self.size_name}={self.devices} devices; this process has {num_devices}"
        return None

    @property
    def phase(self) -> str:
        return f"planner verdict {self.model.name} {self.p.topology}"

    @property
    def generation(self) -> str:
        """The chip generation of the plan's slice (``v6e-8``: ``v6e``), as ``data/hardware`` resolves it."""
        return hardware.topology(self.p.topology)[0].name

    @property
    def model(self) -> ModelConfig:
        m = model_from(self.p.model)
        return m if self.layers is None else replace(m, layers=self.layers, name=f"{m.name}-L{self.layers}")

    @property
    def config(self) -> dict[str, Any]:
        """The configuration as the cached results store it."""
        return {k: getattr(self.p, k) for k in PLAN_KEYS} | {"layers": self.layers, "donate": self.donate}

    def plan(self, flash_attention: bool = True) -> Plan:
        return plan(replace(self.p, model=self.model, flash_attention=flash_attention))

    def compile_options(self) -> dict[str, Any]:
        return {"donate": self.donate}

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: xs.Mesh,
                  spec: tuple[Any, ...]) -> torch.Tensor:
        """The attention core of one layer: q, k, v [B, a, S, hd] (K/V already expanded to a heads, sharded
        ``spec``) -> [B, a, S, hd]. Plain causal softmax attention, the softmax in fp32: the [B, a, S, S] scores
        exist in the program. A subclass may swap the kernel (``memory.full_size.FlashVerdictCase``)."""
        b, a, s, hd = q.shape
        scores = torch.einsum("bash,bath->bast", q, k) / math.sqrt(hd)  # [B, a, S, S]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        pr = torch.softmax(scores.masked_fill(~causal, float("-inf")).float(), dim=-1).to(q.dtype)
        return torch.einsum("bast,bath->bash", pr, v)  # [B, a, S, hd]

    def tracing(self) -> contextlib.AbstractContextManager[Any]:
        """A context the whole step is traced in (none here; a kernel that needs one says so)."""
        return contextlib.nullcontext()

    def graph(self) -> Step:
        """One training step on this process's world: ``[loss, *new state]``, each parameter and AdamW state
        placeholder donated to its update."""
        with self.tracing():
            return self._step()

    def _step(self) -> Step:
        p, m = self.p, self.model
        L, H, F, a, kvh, V = m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, self.plan().padded_vocab
        hd = H // a
        b, s = p.global_batch, p.seq
        mesh = runtime.mesh((p.data, p.fsdp, p.tensor), ("data", "fsdp", "tensor"))
        ba = ("data", "fsdp")  # the batch is split over data and fsdp
        dt = torch.bfloat16

        def marked(shape: tuple[int, ...], spec: tuple[str | tuple[str, ...] | None, ...],
                   dtype: torch.dtype = dt) -> torch.Tensor:
            t = placeholder(shape, dtype) * 1  # a placeholder cannot carry an annotation; its product can
            xs.mark_sharding(t, mesh, spec)
            return t

        def ann(t: torch.Tensor, spec: tuple[str | tuple[str, ...] | None, ...]) -> torch.Tensor:
            return xs.mark_sharding_with_gradients(t, mesh, spec)

        kv = kvh * hd
        shapes = {"q": (H, H), "k": (kv, H), "v": (kv, H), "o": (H, H), "up": (F, H), "down": (H, F),
                  "ln1": (H,), "ln2": (H,)}
        if m.gated_mlp:
            shapes["gate"] = (F, H)
        params: dict[str, tuple[torch.Tensor, torch.Tensor, tuple[str | None, ...]]] = {}  # leaf, annotated, spec
        for name, shp in shapes.items():
            spec = (None, *LAYER_SPECS[name])
            leaf = placeholder((L, *shp), dt).requires_grad_(True)  # [L, out, in]
            w = leaf * 1
            xs.mark_sharding(w, mesh, spec)
            params[name] = (leaf, w, spec)
        for name, shp, spec in (("embed", (V, H), ("tensor", "fsdp")), ("lm_head", (V, H), ("tensor", "fsdp")),
                                ("norm", (H,), ("fsdp",))):
            leaf = placeholder(shp, dt).requires_grad_(True)
            w = leaf * 1
            xs.mark_sharding(w, mesh, spec)
            params[name] = (leaf, w, spec)
        tokens = marked((b, s), (ba, None), torch.int64)  # [B, S]
        labels = marked((b, s), (ba, None), torch.int64)

        def layer(x: torch.Tensor, w: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
            x = ann(x, (ba, None, None))  # [B, S, H]
            h = _rmsnorm(x, w["ln1"])
            q = ann(torch.einsum("bsh,oh->bso", h, w["q"]), (ba, None, "tensor")).view(b, s, a, hd)
            k = ann(torch.einsum("bsh,oh->bso", h, w["k"]), (ba, None, "tensor")).view(b, s, kvh, hd)
            v = ann(torch.einsum("bsh,oh->bso", h, w["v"]), (ba, None, "tensor")).view(b, s, kvh, hd)
            q = ann(q.transpose(1, 2), (ba, "tensor", None, None))  # [B, a, S, hd]
            rep = a // kvh  # GQA: each K/V head serves `rep` query heads
            k = k.transpose(1, 2)[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)
            v = v.transpose(1, 2)[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)
            ctx = self.attention(q, k, v, mesh, (ba, "tensor", None, None))  # [B, a, S, hd]
            ctx = ctx.transpose(1, 2).reshape(b, s, H)  # [B, S, H_tensor]
            x = x + torch.einsum("bsi,oi->bso", ann(ctx, (ba, None, "tensor")), w["o"])  # [B, S, H]
            h = _rmsnorm(x, w["ln2"])
            u = ann(torch.einsum("bsh,fh->bsf", h, w["up"]), (ba, None, "tensor"))  # [B, S, F_tensor]
            if "gate" in w:
                u = torch.nn.functional.silu(ann(torch.einsum("bsh,fh->bsf", h, w["gate"]), (ba, None, "tensor"))) * u
            else:
                u = torch.nn.functional.gelu(u)
            return x + torch.einsum("bsf,hf->bsh", u, w["down"]), None  # [B, S, H]

        partition = full_recompute_partition if p.recompute == "full" else default_partition
        x = ann(torch.nn.functional.embedding(tokens, params["embed"][1]), (ba, None, None))  # [B, S, H]
        x, _ = scan(layer, x, {n: params[n][1] for n in shapes}, partition_fn=partition)
        x = _rmsnorm(x, params["norm"][1])
        logits = ann(torch.einsum("bsh,vh->bsv", x, params["lm_head"][1]), (ba, None, "tensor"))  # [B, S, V_tensor]
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, V), labels.view(-1))
        loss.backward()
        outs: list[torch.Tensor] = [loss]
        donate: dict[int, torch.Tensor] = {}  # output index -> the placeholder whose buffer it reuses
        for leaf, _, spec in params.values():
            adamw_step(outs, donate, leaf, leaf.grad, spec, mesh)
        return Step(outs, donate)


def adamw_step(outs: list[torch.Tensor], donate: dict[int, torch.Tensor], param: torch.Tensor, grad: torch.Tensor,
               spec: tuple[str | tuple[str, ...] | None, ...], mesh: xs.Mesh) -> None:
    """AdamW's update of the placeholder ``param``, as torch_xla's optimizer step makes it: fp32 master, exp_avg and
    exp_avg_sq placeholders sharded like the parameter, the elementwise update (:data:`ADAMW`), and the new
    parameter (in its dtype), master, exp_avg, exp_avg_sq appended to ``outs``, each donated into its old buffer."""
    c, g = ADAMW, grad.float()
    raw = [placeholder(tuple(param.shape), torch.float32) for _ in range(3)]  # fp32 master, exp_avg, exp_avg_sq
    master, m1, m2 = (r * 1 for r in raw)
    for t in (master, m1, m2):
        xs.mark_sharding(t, mesh, spec)
    m1 = c["b1"] * m1 + (1 - c["b1"]) * g
    m2 = c["b2"] * m2 + (1 - c["b2"]) * g * g
    master = master - c["lr"] * (m1 / (m2.sqrt() + c["eps"]) + c["wd"] * master)
    for src, new in zip((param, *raw), (master.to(param.dtype), master, m1, m2), strict=True):
        donate[len(outs)] = src
        outs.append(new)


def case_of(config: dict[str, Any]) -> VerdictCase:
    """The case a cached result's ``config`` describes (:attr:`VerdictCase.config`)."""
    return VerdictCase(PlanConfig(**{k: config[k] for k in PLAN_KEYS}), config.get("layers"),
                       config.get("donate", True))


def full_recompute_partition(joint_module: GraphModule, _joint_inputs: Any, *, num_fwd_outputs: int,
                             **_: Any) -> tuple[GraphModule, GraphModule]:
    """AOTAutograd partition that saves only the primals (layer input and weight slices): the backward graph is
    extracted from primals + tangents, so it recomputes every forward op it needs (full activation recompute)."""
    saved = [n for n in joint_module.graph.nodes if _is_primal(n) and n.users]
    return _extract_fwd_bwd_modules(joint_module, saved, [], num_fwd_outputs=num_fwd_outputs)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@dataclass
class PlannerCheck:
    """Planner terms next to the compiler's per-chip bytes for one configuration (bytes; ratio = compiler/planner)."""

    config: dict[str, Any]
    topology: str  # the slice compiled for (v6e-8)
    compile_s: float
    donated: bool
    compiler_fits: bool
    planner_fits: bool  # the planner's default: a flash kernel
    planner_no_flash_fits: bool  # the attention that was traced
    planner_at_risk: dict[str, bool]  # "flash" / "no_flash": within the fit margin (fits is False then)
    planner: dict[str, float]  # plan.memory, flash attention
    planner_no_flash: dict[str, float]  # the same with flash_attention=False
    capacity_bytes: int
    compiler: dict[str, int | None] = field(default_factory=dict)  # params, optimizer, arguments, temp, total, ...
    message: str = ""  # the compiler's first line when it ran out of memory
    largest: list[tuple[int, str, str]] = field(default_factory=list)  # (bytes, shape, XLA label) from the message
    arguments_evaluated: bool = True  # False: out of memory in the program alone ("arguments 0B")

    @property
    def total(self) -> int | None:
        """The compiler's per-chip bytes as its capacity check counted them (a lower bound when the arguments
        were not evaluated)."""
        return self.compiler.get("total")

    def agrees(self, flash: bool = False) -> bool:
        """Does the planner's verdict (no flash: the attention traced here) agree with the compiler's?"""
        return (self.planner_fits if flash else self.planner_no_flash_fits) == self.compiler_fits

    def rows(self) -> list[dict[str, Any]]:
        """One row per compared term: planner (flash / no flash), compiler, ratios (None where not measured)."""
        p, q, c = self.planner, self.planner_no_flash, self.compiler
        state = ("params", "optimizer", "padding")
        rest = ("grads", "activations", "logits", "fsdp_gathered_unit")
        terms = [("params", p["params"], q["params"], c.get("params")),
                 ("optimizer", p["optimizer"], q["optimizer"], c.get("optimizer")),
                 ("params + optimizer (arguments)", sum(p[k] for k in state), sum(q[k] for k in state),
                  c.get("arguments")),
                 ("grads + activations + logits + gathered unit (temporaries)", sum(p[k] for k in rest),
                  sum(q[k] for k in rest), c.get("temp")),
                 ("total (what the capacity check counts)", sum(p.values()), sum(q.values()), c.get("total"))]
        return [{"term": t, "planner": a, "planner_no_flash": b, "compiler": x,
                 "ratio": (x / a) if x is not None and a else None,
                 "ratio_no_flash": (x / b) if x is not None and b else None} for t, a, b, x in terms]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows": self.rows()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlannerCheck:
        """Inverse of :meth:`as_dict` (JSON turns tuples into lists)."""
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        kw["largest"] = [tuple(x) for x in kw.get("largest", [])]
        return cls(**kw)

    def replanned(self) -> PlannerCheck:
        """The same compile with the planner's side recomputed by the current planner (cached compiles keep their
        compiler numbers; the formulas are always today's)."""
        case = case_of(self.config)
        flash, no_flash = case.plan(True), case.plan(False)
        return replace(self, planner_fits=flash.fits, planner_no_flash_fits=no_flash.fits,
                       planner_at_risk={"flash": flash.at_risk, "no_flash": no_flash.at_risk},
                       planner=dict(flash.memory), planner_no_flash=dict(no_flash.memory))


def check(case: VerdictCase) -> PlannerCheck:
    """Compile ``case``'s training step for the planner's slice (the harness's TPU view) and compare with the
    planner's terms; ValueError with the reason when the view is skipped here (no libtpu, no such slice)."""
    view = harness.tpu(case, case.generation)
    if not view.ran:
        raise ValueError(f"{case.p.topology}: {view.skipped}")
    c: TpuCompile = view.detail
    flash, no_flash = case.plan(True), case.plan(False)
    res = PlannerCheck(case.config, c.topology, c.compile_s, case.donate, c.fits, flash.fits, no_flash.fits,
                       {"flash": flash.at_risk, "no_flash": no_flash.at_risk}, dict(flash.memory),
                       dict(no_flash.memory), get_topology(c.topology).hbm_bytes or flash.hbm_bytes)
    return replace(res, **compiler_side(c))


def compiler_side(c: TpuCompile) -> dict[str, Any]:
    """The :class:`PlannerCheck` fields a compile gives (``compiler``, and for out of memory ``message``,
    ``largest``, ``arguments_evaluated``): from the compiled program's memory, or from the out-of-memory message —
    both forms (the capacity check's breakdown; one array larger than the chip: arguments not evaluated, the array
    a lower bound of the program)."""
    if c.fits and c.memory is not None and c.hlo_text is not None:
        m = c.memory
        args = [x for x in entry_layout(c.hlo_text)[0] if x.dims]  # scalars: torch_xla's lifted constants
        return {"compiler": {"params": sum(x.nbytes for x in args if x.dtype == "bf16"),
                             "optimizer": sum(x.nbytes for x in args if x.dtype == "f32"),
                             "arguments": m.argument, "temp": m.checked_temp, "total": m.checked,
                             "outputs": m.output, "alias": m.alias, "peak": m.peak, "temp_size": m.temp}}
    if c.oom is not None:
        o = c.oom
        return {"message": o.first_line, "arguments_evaluated": o.arguments_evaluated,
                "compiler": {"arguments": o.arguments, "temp": o.program, "total": o.used,
                             "fragmentation": o.fragmentation},
                "largest": [(b.size, b.shape, b.label) for b in o.buffers[:5]]}
    return {}


COMPILE_FIELDS = ("config", "topology", "donated", "compiler_fits", "compiler", "message", "largest",
                  "arguments_evaluated")  # what a compile decides (compile_s and the planner's side excluded)


def compile_differences(live: PlannerCheck, cached: PlannerCheck) -> dict[str, tuple[Any, Any]]:
    """``{field: (live, cached)}`` for every field a compile decides that differs (empty: the cache is what the
    code produces). JSON round trip first, so tuples and lists compare equal."""
    a, b = PlannerCheck.from_dict(json.loads(json.dumps(live.as_dict()))), cached
    return {k: (getattr(a, k), getattr(b, k)) for k in COMPILE_FIELDS if getattr(a, k) != getattr(b, k)}


# ------------------------------------------------------------------------------------------ notebook helpers
# preset x slice x the planner's mesh (data, fsdp, tensor) x global batch: 8 chips FSDP over all, 64 chips 2-D
MATRIX: tuple[tuple[str, str, tuple[int, int, int], int], ...] = (
    ("llama-3-8b", "v5e-8", (1, 8, 1), 8),
    ("llama-3-8b", "v6e-8", (1, 8, 1), 8),
    ("llama-3-8b", "v6e-64", (1, 16, 4), 16),
    ("llama-3-70b", "v5e-8", (1, 8, 1), 8),
    ("llama-3-70b", "v6e-8", (1, 8, 1), 8),
    ("llama-3-70b", "v6e-64", (1, 16, 4), 16),
    ("llama-3.1-405b", "v6e-64", (1, 16, 4), 16),
)
MATRIX_FILE = Path(__file__).resolve().parents[3] / "data" / "scale" / "planner_verdict.json"


def matrix_cases(seq: int = 8192) -> dict[str, VerdictCase]:
    """``{"<preset>.<slice>": VerdictCase}`` for every row of :data:`MATRIX` (full recompute, donated)."""
    return {f"{m}.{topo}": VerdictCase(PlanConfig(m, topo, data=d, fsdp=f, tensor=t, global_batch=b, seq=seq))
            for m, topo, (d, f, t), b in MATRIX}


def matrix(cases: dict[str, VerdictCase] | None = None) -> dict[str, PlannerCheck]:
    """Compile every case (a few minutes each at full size) and compare with the planner."""
    return {k: check(c) for k, c in (cases or matrix_cases()).items()}


def verdict_frame(results: dict[str, PlannerCheck]) -> pd.DataFrame:
    """One row per preset x slice: the compiler's verdict and bytes next to the planner's (no flash: what was
    traced; flash: the planner's default), with ratios compiler / planner."""
    def verdict(fits: bool, at_risk: bool) -> str:
        return "fits" if fits else ("at risk" if at_risk else "no")

    rows = []
    for key, r in results.items():
        row = {k["term"]: k for k in r.rows()}
        total = row["total (what the capacity check counts)"]
        temp = row["grads + activations + logits + gathered unit (temporaries)"]
        cfg = r.config
        rows.append({
            "preset · slice": key, "mesh (d, f, t)": (cfg["data"], cfg["fsdp"], cfg["tensor"]),
            "compiler": "fits" if r.compiler_fits else "out of memory",
            "compiler GiB": ("" if r.arguments_evaluated else "≥ ") + (f"{r.total / GIB:.2f}" if r.total else "–"),
            "planner no flash GiB": round(total["planner_no_flash"] / GIB, 2),
            "compiler / planner": None if total["ratio_no_flash"] is None else round(total["ratio_no_flash"], 3),
            "planner no flash": verdict(r.planner_no_flash_fits, r.planner_at_risk["no_flash"]),
            "agree": r.agrees(),
            "temporaries compiler / planner": None if temp["ratio_no_flash"] is None
            else round(temp["ratio_no_flash"], 3),
            "planner flash GiB": round(total["planner"] / GIB, 2),
            "planner flash": verdict(r.planner_fits, r.planner_at_risk["flash"]),
            "compile s": round(r.compile_s, 1),
        })
    return pd.DataFrame(rows).set_index("preset · slice")


def terms_frame(r: PlannerCheck) -> pd.DataFrame:
    """The term-by-term comparison of one configuration (GiB; ratios compiler / planner). The planner's
    temporaries are listed one by one too ("· grads" ...): the compiler's program does not separate them."""
    rows = [{"term": x["term"], "planner flash": round(x["planner"] / GIB, 2),
             "planner no flash": round(x["planner_no_flash"] / GIB, 2),
             "compiler": None if x["compiler"] is None else round(x["compiler"] / GIB, 2),
             "ratio (no flash)": None if x["ratio_no_flash"] is None else round(x["ratio_no_flash"], 3)}
            for x in r.rows()]
    parts = [{"term": f"· {k}", "planner flash": round(r.planner[k] / GIB, 2),
              "planner no flash": round(r.planner_no_flash[k] / GIB, 2), "compiler": None, "ratio (no flash)": None}
             for k in ("grads", "activations", "logits", "fsdp_gathered_unit")]
    return pd.DataFrame(rows[:4] + parts + rows[4:]).set_index("term")


def measure_verdict(rec: Recorder, name: str, r: PlannerCheck, live: bool) -> None:
    """``<name>.{per_chip.bytes,fits}`` from the planner (formula, no flash: the attention traced) always, and from
    the compiler (tpu, with its compile seconds) when ``live``."""
    rec.measure(f"{name}.per_chip.bytes", sum(r.planner_no_flash.values()), "bytes", "formula")
    rec.measure(f"{name}.fits", int(r.planner_no_flash_fits), "1", "formula")
    if live:
        if r.total is not None:
            rec.measure(f"{name}.per_chip.bytes", r.total, "bytes", "tpu")
        rec.measure(f"{name}.fits", int(r.compiler_fits), "1", "tpu")
        rec.measure(f"{name}.compile_s", r.compile_s, "s", "tpu", kind="timing")


def record_matrix(rec: Recorder, results: dict[str, PlannerCheck], live: bool,
                  prefix: str = "planner.compiler") -> None:
    """``<prefix>.<preset>.<slice>.{per_chip.bytes,fits}`` from the planner (formula, no flash: the attention
    traced) always, and from the compiler (tpu) when ``live``; checks that the verdicts agree."""
    for key, r in results.items():
        name = f"{prefix}.{key}"
        measure_verdict(rec, name, r, live)
        rec.check(f"{name}: the planner's verdict (no flash, as traced) agrees with the compiler's", r.agrees(),
                  f"planner {'fits' if r.planner_no_flash_fits else 'no'} "
                  f"({sum(r.planner_no_flash.values()) / GIB:.2f} GiB), compiler "
                  f"{'fits' if r.compiler_fits else r.message} ({(r.total or 0) / GIB:.2f} GiB)")


def load_matrix(path: Path = MATRIX_FILE) -> tuple[dict[str, PlannerCheck], dict[str, Any]]:
    """The cached compiler verdicts, the planner's side recomputed now (:meth:`PlannerCheck.replanned`)."""
    results, source = load_results(path, PlannerCheck.from_dict, "run notebook 07 with full_size=True (or "
                                   "tools/scale_full_size.py planner) to measure the full-size compiles")
    return {k: r.replanned() for k, r in results.items()}, source


# ----------------------------------------------------------------------------------- held out from the fit
# The planner's fitted terms (6·a·s²·b/t, the phase max, the 10 % margin) were chosen after the MATRIX compiles.
# These configurations were not among them: a validation, not a regression.
HOLDOUT: dict[str, dict[str, Any]] = {
    "llama-3-8b.v6e-8.seq4096": dict(model="llama-3-8b", topology="v6e-8", fsdp=8, global_batch=8, seq=4096),
    "llama-3-8b.v6e-16": dict(model="llama-3-8b", topology="v6e-16", fsdp=16, global_batch=16, seq=8192),
    "llama-3-8b.v6e-8.recompute-none": dict(model="llama-3-8b", topology="v6e-8", fsdp=8, global_batch=8,
                                            seq=8192, recompute="none"),
}
HOLDOUT_FILE = MATRIX_FILE.with_name("planner_holdout.json")


def holdout_cases() -> dict[str, VerdictCase]:
    return {k: VerdictCase(PlanConfig(**kw)) for k, kw in HOLDOUT.items()}


def load_holdout(path: Path = HOLDOUT_FILE) -> tuple[dict[str, PlannerCheck], dict[str, Any]]:
    """The cached held-out compiles (:data:`HOLDOUT`), the planner's side recomputed now."""
    results, source = load_results(path, PlannerCheck.from_dict, "run tools/scale_full_size.py holdout (minutes "
                                   "per compile) to measure the held-out configurations")
    return {k: r.replanned() for k, r in results.items()}, source


def _gib(x: float | None) -> str:
    return "–" if x is None else f"{x / GIB:.2f}"


def _ratio(x: float | None, digits: int = 3) -> str:
    """A ratio for the generated text; "–" where the compiler gave no number."""
    return "–" if x is None else f"{x:.{digits}f}"


def verdict_text(results: dict[str, PlannerCheck], holdout: dict[str, PlannerCheck] | None = None) -> str:
    """The numbers of notebook 07's "Reading the verdicts", generated from the compiles (Markdown)."""
    agree = sum(r.agrees() for r in results.values())
    near = {k: r for k, r in results.items() if r.arguments_evaluated and r.total}
    totals = "; ".join(f"{k} {_gib(r.total)} vs {_gib(sum(r.planner_no_flash.values()))} GiB "
                       f"({r.total / sum(r.planner_no_flash.values()):.3f})" for k, r in near.items())
    state = [x["ratio"] for r in results.values() for x in r.rows()[:2] if x["ratio"] is not None]
    lower = {k: r for k, r in results.items() if not r.arguments_evaluated}
    temp = [x["ratio_no_flash"] for r in lower.values() for x in r.rows()
            if x["term"].startswith("grads +") and x["ratio_no_flash"] is not None]
    frag = "; ".join(f"{k}: {_gib(r.compiler.get('fragmentation'))} of its {_gib(r.compiler.get('temp'))} GiB "
                     "program" for k, r in near.items() if r.compiler.get("fragmentation"))
    over = "; ".join(f"{k} by {(r.total - r.capacity_bytes) / 2**20:.0f} MiB" for k, r in near.items()
                     if not r.compiler_fits)
    flash = "; ".join(f"{k} {_gib(sum(r.planner.values()))} GiB "
                      f"({'fits' if r.planner_fits else 'at risk' if r.planner_at_risk['flash'] else 'no'})"
                      for k, r in near.items())
    lines = [f"- The planner's no-flash verdict agrees with the compiler's on **{agree} of {len(results)}** rows.",
             f"- Rows near the capacity (arguments evaluated), compiler vs planner total: {totals}.",
             f"- Parameters and optimizer state, compiler / planner: {min(state):.3f} to {max(state):.3f}."
             if state else "",
             f"- Fragmentation in the out-of-memory messages: {frag}; out of memory {over}." if frag else "",
             f"- The '≥' rows (the compiler stopped at the program alone): temporaries {min(temp):.2f}–"
             f"{max(temp):.2f}× the planner's." if temp else "",
             f"- With a flash kernel (the planner's default; not what was traced): {flash}."]
    if holdout:
        lines.append(holdout_text(holdout))
    return "\n".join(x for x in lines if x)


def holdout_text(holdout: dict[str, PlannerCheck]) -> str:
    """One line per held-out compile: verdicts and the total, compiler / planner (no flash); "–" where the
    compiler gave no number."""
    rows = []
    for k, r in holdout.items():
        by_term = {x["term"].split(" ", 1)[0]: x for x in r.rows()}
        total, temp = by_term["total"], by_term["grads"]
        at_least = "" if r.arguments_evaluated else "≥ "  # the program alone: a lower bound
        rows.append(f"{k}: verdicts {'agree' if r.agrees() else 'DISAGREE'}, total {at_least}{_gib(r.total)} vs "
                    f"{_gib(total['planner_no_flash'])} GiB (compiler / planner {at_least}"
                    f"{_ratio(total['ratio_no_flash'])}; temporaries {_ratio(temp['ratio_no_flash'], 2)})")
    return "- Held out from the fit: " + "; ".join(rows) + "."


# -------------------------------------------------------------------------------------------- item: FSDP rule
RULE_MODEL = {"name": "small-llama", "layers": 4, "hidden": 1024, "ffn": 2048, "heads": 8, "kv_heads": 8,
              "vocab": 4096, "gated_mlp": True}  # small enough to compile in seconds, Llama-shaped
RULE_FILE = MATRIX_FILE.with_name("planner_fsdp_rule.json")
OPS = ("all-gather", "reduce-scatter", "all-to-all")


@dataclass
class RuleCheck:
    """FSDP bytes per chip and step by collective: the compiled verdict step against both pricing rules."""

    config: dict[str, Any]
    topology: str
    compiler: dict[str, int]  # op -> Σ runs × per-chip operand bytes (all-reduce + dynamic-slice = reduce-scatter)
    gspmd: dict[str, float]  # the planner's fsdp terms, fsdp_rule="gspmd"
    fsdp1: dict[str, float]  # fsdp_rule="fsdp1"
    compile_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuleCheck:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def replanned(self) -> RuleCheck:
        """The planner's two columns recomputed now (the compiler's are cached)."""
        p = PlanConfig(**{k: self.config[k] for k in PLAN_KEYS})
        return replace(self, gspmd=rule_bytes(p, "gspmd"), fsdp1=rule_bytes(p, "fsdp1"))

    def frame(self) -> pd.DataFrame:
        rows = []
        for op in OPS:
            c = self.compiler.get(op, 0)
            rows.append({"collective": op, "compiler (XLA:TPU)": c, "GSPMD rule": self.gspmd.get(op, 0),
                         "FSDP1 flat units": self.fsdp1.get(op, 0),
                         "GSPMD / compiler": round(self.gspmd.get(op, 0) / c, 4) if c else None,
                         "FSDP1 / compiler": round(self.fsdp1.get(op, 0) / c, 4) if c else None})
        return pd.DataFrame(rows).set_index("collective")


def rule_bytes(p: PlanConfig, rule: str) -> dict[str, float]:
    """The planner's fsdp-axis bytes per chip and step (Σ count × payload) by collective, under ``rule``."""
    out: dict[str, float] = {}
    for t in plan(replace(p, fsdp_rule=rule)).comm:
        if t.axis == "fsdp":
            out[t.op] = out.get(t.op, 0.0) + t.count * t.payload_bytes
    return out


def rule_case(recompute: str = "none") -> VerdictCase:
    """07's verdict step for :data:`RULE_MODEL`, FSDP over the 8 chips of a v5e-8, batch 8 × 64 tokens."""
    return VerdictCase(PlanConfig(RULE_MODEL, "v5e-8", fsdp=8, global_batch=8, seq=64, recompute=recompute))


def rule_check(case: VerdictCase) -> RuleCheck:
    """Compile ``case`` (harness TPU view) and sum its fsdp collectives by op, next to both rules."""
    view = harness.tpu(case, case.generation)
    if not view.ran:
        raise ValueError(f"{case.p.topology}: {view.skipped}")
    c: TpuCompile = view.detail
    mod = c.module
    total: dict[str, int] = {}
    for x in mod.collectives:
        op = "reduce-scatter" if (x.op == "all-reduce" and x.feeds_dynamic_slice) else x.op
        total[op] = total.get(op, 0) + (mod.runs(x.computation) or 1) * x.operand_bytes
    return RuleCheck(case.config, c.topology, total, rule_bytes(case.p, "gspmd"), rule_bytes(case.p, "fsdp1"),
                     c.compile_s)


def load_rule(path: Path = RULE_FILE) -> tuple[dict[str, RuleCheck], dict[str, Any]]:
    results, source = load_results(path, RuleCheck.from_dict, "run tools/scale_full_size.py fsdp-rule")
    return {k: r.replanned() for k, r in results.items()}, source


def record_rules(rec: Recorder, rules: dict[str, RuleCheck]) -> None:
    """``planner.fsdp_rule.<recompute>.<op>.bytes`` of the GSPMD rule (formula) and the check that its all-gather
    and reduce-scatter bytes are the compiler's with recompute none (the compiler's numbers are cached: checked,
    not recorded as a measurement)."""
    ops = ("all-gather", "reduce-scatter")
    for recompute, r in rules.items():
        for op in ops:
            rec.measure(f"planner.fsdp_rule.{recompute}.{op.replace('-', '_')}.bytes", r.gspmd.get(op, 0), "bytes",
                        "formula")
    if "none" in rules:
        r = rules["none"]
        rec.check("planner.fsdp_rule: the GSPMD rule's all-gather and reduce-scatter bytes = the compiler's "
                  "(recompute none)", all(r.gspmd.get(op, 0) == r.compiler.get(op, 0) for op in ops),
                  str({op: (r.gspmd.get(op), r.compiler.get(op)) for op in ops}))


def rule_text(rules: dict[str, RuleCheck]) -> str:
    """Per recompute policy: each rule's bytes against the compiler's, by collective (Markdown, from the data)."""
    lines = []
    for recompute, r in rules.items():
        parts = []
        for op in OPS:
            c = r.compiler.get(op, 0)
            if not c:
                continue
            parts.append(f"{op} {c:,} B: GSPMD rule {100 * (r.gspmd.get(op, 0) / c - 1):+.1f} %, FSDP1 "
                         f"{100 * (r.fsdp1.get(op, 0) / c - 1):+.1f} %")
        lines.append(f"- recompute={recompute}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def matching(results: dict[str, PlannerCheck], p: PlanConfig) -> str | None:
    """The key of the row whose configuration is the plan ``p``'s (model, slice, degrees, batch, sequence,
    recompute), or None."""
    m = model_from(p.model)
    for key, r in results.items():
        c = r.config
        if (model_from(c["model"]) == m and c["topology"] == p.topology
                and (c["data"], c["fsdp"], c["tensor"]) == (p.data, p.fsdp, p.tensor)
                and (c["global_batch"], c["seq"], c["recompute"]) == (p.global_batch, p.seq, p.recompute)):
            return key
    return None


def compiled_or_cached(rec: Recorder, live: bool) -> tuple[dict[str, PlannerCheck], dict[str, PlannerCheck], str]:
    """Notebook 07's two sets of full-size compiles — the matrix the planner's terms were fitted to and the
    configurations held out from the fit — compiled now (``live``: tens of minutes) or read from ``data/scale``
    (the planner's side always computed now), recorded (``planner.compiler.*``, ``planner.holdout.*``); and a line
    saying where the compiler's numbers come from."""
    if live:
        results, held, about = matrix(), matrix(holdout_cases()), "compiled now"
    else:
        (results, source), (held, _) = load_matrix(), load_holdout()
        about = (f"compiler numbers cached: {source['command']}, {source['measured']}, "
                 f"libtpu {source['versions']['libtpu']}")
        rec.note("planner.compiler", f"full-size compiles not run (full_size=False); {about}")
    record_matrix(rec, results, live)
    record_matrix(rec, held, live, prefix="planner.holdout")
    return results, held, about


def your_plan(results: dict[str, PlannerCheck], p: PlanConfig, live: bool) -> tuple[str, pd.DataFrame | None]:
    """Where the plan ``p`` stands among the compiles: the row it is, or (``live``) its own compile."""
    name = f"your plan ({model_from(p.model).name} on {p.topology})"
    mine = matching(results, p)
    if mine:
        return f"{name} is the row {mine!r} above", None
    if not live:
        return f"{name} is not a row above: full_size=True compiles it too", None
    yours, why = check_plan(p)
    return f"{name}: " + (why or "compiled"), None if yours is None else verdict_frame({"your plan": yours})


def check_plan(p: PlanConfig) -> tuple[PlannerCheck | None, str]:
    """Compile the plan ``p`` as the matrix does (``(None, why)`` when this check cannot trace it: a recompute
    policy other than full / none, an assumption the trace does not make, heads the tensor degree does not divide,
    a slice with no compile-only topology, or a helper process that fails — e.g. 256 CPU devices)."""
    try:
        return check(VerdictCase(p)), ""
    except (ValueError, TpuWorkerError) as exc:
        return None, str(exc).split("\n", 1)[0]
