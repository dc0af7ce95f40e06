"""The planner's terms checked at a small size: formula, ledger, CPU compiler and TPU compiler side by side.

Design
------
Notebook 07's validation section evaluates the planner's per-chip terms at its validation sizes (the ``val_*``
fields of :class:`planner.params.PlannerParams`: T = ``val_tokens`` tokens of width ``val_hidden`` on ``val_world``
ranks; fp32, so 4 bytes per element on every backend) and compares each with what runs. Each part is a case;
:mod:`shardlab.core.harness` runs it through the views:

    part        case                          what runs                              the term (formula view)
    tp_mlp      tp.case.MlpCase(tp_params(p)) notebook 02's case at these sizes     Megatron: 1 + 1 all-reduces
    tp_layer    LayerTermCase(tp_params(p))   attention + MLP (notebook 03's layer) planner.step_comm of a
                                              over tensor = world                    one-layer model: 2 + 2
    dp          DataCase(p)                   tokens split over data = world,        the gradient all-reduce of
                                              weights replicated                     Ψ = 2·h·ffn; ZeRO-0 params
    fsdp        DataCase(p, sharded=True)     weights sharded over data = world      ZeRO-3 parameters
    fsdp_units  UnitsCase(p)                  FlatUnits in a SimulatedWorld: an      formulas.fsdp.flat_step_comm
                                              inner unit (resharded after forward)   per unit, model_state_bytes
                                              and the root unit (not), Adam, 1 step  (flat padding)

    pipeline    PipelineCheck (cached)        notebook 09's SPMD GPipe pipeline,      weights per stage, bytes per
                                              XLA:TPU per-chip bytes at two m         in-flight microbatch

Values are named ``fwd_bwd.<op>.{count,bytes,elements,wire_bytes}`` and ``param.bytes`` / ``model_state.bytes``.
Wire bytes: the formula's ring model (``formulas.common.wire_bytes``) in the formula view; in the measured views
each collective counted chunk by chunk along the ring schedule (``blocks.ring``), so formula = measured tests the
ring factor, not only count × payload. Every step's loss is ½‖out − target‖² (``models.loss``).
The compiled programs run on a mesh (n / world, world) over the process's n devices; the CPU compiler view is
skipped with the reason when world does not tile n, the TPU view compiles for a world-chip slice (in a helper
process when this one has another device count). Parity with the dense oracle (the same module on the CPU, no XLA)
is part of the compiler and ledger views' ``checks``.

Example::

    dp = DataCase(p)
    harness.record(rec, "planner.validate.dp", *harness.views(dp, ("formula", "hlo", "tpu")))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
import torch.nn.functional as F
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)

from shardlab import runtime
from shardlab.blocks import ring
from shardlab.comm import Ledger
from shardlab.core import harness
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import View, traffic
from shardlab.formulas import memory
from shardlab.formulas import pipeline as fpp
from shardlab.formulas.common import wire_bytes
from shardlab.formulas.fsdp import FlatStepComm, flat_step_comm
from shardlab.fsdp.params import FsdpParams
from shardlab.fsdp.train import FlatCase, RankResult, fsdp_rank_program, reference_train
from shardlab.models import loss
from shardlab.pipeline.case import ScheduleCase
from shardlab.pipeline.params import PipelineParams
from shardlab.planner import CommTerm, ModelConfig, PlanConfig, step_comm
from shardlab.planner.params import PlannerParams
from shardlab.profile.hlo import HloModule
from shardlab.profile.record import Recorder
from shardlab.profile.result_files import entry_layout, load_results
from shardlab.profile.tpu import TpuCompile
from shardlab.tp.case import LayerCase, wire_counted
from shardlab.tp.params import AttentionParams

MATRIX_DIR = Path(__file__).resolve().parents[3] / "data" / "scale"

PHASE = "fwd_bwd"  # every check runs one forward + backward step
DTYPE = "float32"
E = 4  # bytes per fp32 element
TOL = dict(rtol=1e-4, atol=1e-5)  # fp32 sums in another order (partitioned vs dense)


def tp_params(p: PlannerParams) -> AttentionParams:
    """The validation sizes as notebooks 02-03's parameters: tensor degree ``val_world``, b = 1, s = ``val_tokens``,
    fp32 (for ``tp.case.MlpCase`` and :class:`LayerTermCase`)."""
    return AttentionParams(tp=p.val_world, batch=1, seq=p.val_tokens, hidden=p.val_hidden, ffn=p.val_ffn,
                           heads=p.val_heads, dtype=DTYPE, seed=p.seed, num_devices=p.num_devices)


def _wire(view: View, ops: tuple[str, ...], module: HloModule) -> View:
    """Add ``fwd_bwd.<op>.wire_bytes`` of a compiled program: each collective's operands counted chunk by chunk
    along the ring schedule (``tp.case.wire_counted``, ``blocks.ring``), not by the formula's factor — so the
    formula's ring model is what formula = compiler tests."""
    for op in ops:
        view.add(f"{PHASE}.{op}.wire_bytes", wire_counted(view, op, module), "bytes")
    return view


def _group_check(view: View, module: HloModule, world: int) -> View:
    sizes = sorted({c.group_size for c in module.collectives})
    view.checks[f"{view.source}.group_size"] = (all(s == world for s in sizes),
                                                f"collective group sizes {sizes}, val_world={world}")
    return view


def only(view: View, *ops: str) -> View:
    """Add a check that the compiled program ``view`` issues no collective other than ``ops`` (HLO spelling)."""
    if view.ran and view.detail is not None and getattr(view.detail, "module", None) is not None:
        found = sorted({c.op for c in view.detail.module.collectives})
        view.checks[f"{view.source}.only_{'_'.join(o.replace('-', '_') for o in ops)}"] = (
            set(found) <= set(ops), f"collectives in the {view.source} program: {found or 'none'}")
    return view


def collectives_frame(views: dict[str, View]) -> pd.DataFrame:
    """The collectives each compiled program chose, side by side: ``{label: hlo or tpu view}`` -> DataFrame."""
    rows = []
    for label, v in views.items():
        if not v.ran or getattr(v.detail, "module", None) is None:
            continue
        for c in v.detail.module.collectives:
            rows.append({"program": label, "op": c.op, "dtype": c.dtype, "operands": c.operands,
                         "per-device operand shapes": " ".join(str(list(s)) for s in c.operand_shapes),
                         "operand bytes": c.operand_bytes, "group": c.group_size})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ tensor parallel
def one_layer_model(p: AttentionParams) -> ModelConfig:
    """A one-layer GPT-style model (GeLU MLP, multi-head attention) of the validation sizes."""
    return ModelConfig("validation", layers=1, hidden=p.hidden, ffn=p.ffn, heads=p.heads, kv_heads=p.heads,
                       vocab=1024, gated_mlp=False)


def layer_term(p: AttentionParams) -> CommTerm | None:
    """The planner's per-layer tensor-axis term for one layer at tensor = ``p.tp`` (None when tp = 1)."""
    terms = step_comm(PlanConfig(one_layer_model(p), data=1, fsdp=1, tensor=p.tp, global_batch=p.batch, seq=p.seq,
                                 recompute="none", act_dtype=DTYPE))
    return next((t for t in terms if t.what.startswith("layer all-reduces")), None)


@dataclass(frozen=True)
class LayerTermCase(LayerCase):
    """Notebook 03's transformer layer (attention + MLP, GSPMD annotations) at the validation sizes, against the
    planner's per-layer term instead of ``formulas.tp``'s; the compilers' wire bytes added, no other collective."""

    p: AttentionParams

    size_name: ClassVar[str] = "val_world"  # notebook 07's name for the tensor degree (in the skip message)
    mesh_text: ClassVar[str] = "(n / val_world, val_world)"

    @property
    def devices(self) -> int:
        return self.p.tp

    def formula(self) -> View:
        t = layer_term(self.p)
        count, payload, wire = (t.count, t.count * t.payload_bytes, t.wire_bytes) if t else (0, 0, 0.0)
        view = traffic(View("formula", detail=t), PHASE, {"all_reduce": count}, {"all_reduce": payload}, DTYPE)
        view.add(f"{PHASE}.all_reduce.wire_bytes", wire, "bytes")
        return view

    def read(self, view: View, module: HloModule) -> View:
        return only(_wire(super().read(view, module), self.ops, module), "all-reduce")


# ------------------------------------------------------------------------------------ data parallel and FSDP
def mlp_tensors(p: PlannerParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, h], A [h, ffn], B [ffn, h] and the target [T, h] of the data-parallel / FSDP steps, seeded."""
    g = torch.Generator().manual_seed(p.seed)
    x = torch.randn(p.val_tokens, p.val_hidden, generator=g)  # [T, h]
    a = torch.randn(p.val_hidden, p.val_ffn, generator=g) / p.val_hidden**0.5  # A [h, ffn]
    b = torch.randn(p.val_ffn, p.val_hidden, generator=g) / p.val_ffn**0.5  # B [ffn, h]
    target = torch.randn(p.val_tokens, p.val_hidden, generator=g)  # [T, h]
    return x, a, b, target


@dataclass(frozen=True)
class ValidationCase(Case):
    """A validation part on ``val_world`` ranks of notebook 07's parameters."""

    p: PlannerParams

    size_name: ClassVar[str] = "val_world"
    mesh_text: ClassVar[str] = "(n / val_world, val_world)"

    @property
    def phase(self) -> str:
        return PHASE

    @property
    def dtype(self) -> str:
        return DTYPE

    @property
    def psi(self) -> int:
        """Parameters of the two MLP weight matrices A [h, ffn] and B [ffn, h]."""
        return 2 * self.p.val_hidden * self.p.val_ffn

    def input_bytes(self) -> int:
        return 2 * self.p.val_tokens // self.p.val_world * self.p.val_hidden * E  # x, target [T_data, h] per device


@dataclass(frozen=True)
class DataCase(ValidationCase):
    """½‖gelu(x A) B − target‖² (notebooks 02-04's loss, ``models.loss``: the gradient depends on the output)
    with the tokens x split over ``data`` = val_world: the weights replicated (data parallel:
    each weight gradient all-reduced over data) or, ``sharded``, annotated by rows over ``data`` (ZeRO-3: the
    partitioner picks its own collectives, so only the parameter bytes are compared)."""

    sharded: bool = False

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return () if self.sharded else ("all_reduce",)

    def formula(self) -> View:
        """Parameters per device: x's and the target's shards + Ψ·4 (stage 0) or Ψ·4 / world (stage 3). Data
        parallel: each weight
        gradient all-reduced once (2 collectives; the planner buckets them into one term of the same bytes),
        payload = the ZeRO stage-0 gradient term Ψ·4."""
        w = self.p.val_world
        st = memory.model_state_bytes(self.psi, fsdp=w if self.sharded else 1, stage=3 if self.sharded else 0,
                                      param_bytes=E, grad_bytes=E)
        if self.sharded:
            view = View("formula", detail=st)
        else:
            count = 2 if w > 1 else 0
            view = traffic(View("formula", detail=st), PHASE, {"all_reduce": count},
                           {"all_reduce": int(st.grads) if count else 0}, DTYPE)
            view.add(f"{PHASE}.all_reduce.wire_bytes", wire_bytes("all_reduce", st.grads, w) if count else 0.0,
                     "bytes")
        view.add("param.bytes", self.input_bytes() + int(st.params), "bytes")
        return view

    def graph(self) -> Step:
        """The weight gradients [dA, dB] (partial sums over each device's tokens, then reduced), NOT synced."""
        n = runtime.current().num_devices
        mesh = runtime.mesh((n // self.p.val_world, self.p.val_world), ("replica", "data"))
        x, a, b, target = (t.to(runtime.device()) for t in mlp_tensors(self.p))
        for t in (x, target):
            xs.mark_sharding(t, mesh, ("data", None))  # [T_data, h]: T / world tokens per device
        for w in (a, b):
            xs.mark_sharding(w, mesh, ("data", None) if self.sharded else (None, None))
            w.requires_grad_(True)
        y = F.gelu(x @ a) @ b  # [T/world, h] @ [h, ffn] @ [ffn, h] -> [T/world, h] per device
        return Step(list(torch.autograd.grad(loss(y, target), (a, b))))

    def oracle(self) -> list[torch.Tensor]:
        """The unsharded computation's weight gradients on the CPU."""
        x, a, b, target = mlp_tensors(self.p)
        a.requires_grad_(True)
        b.requires_grad_(True)
        return list(torch.autograd.grad(loss(F.gelu(x @ a) @ b, target), (a, b)))

    def parity(self, source: str, got: list[torch.Tensor], ref: list[torch.Tensor]) -> Checks:
        what = "weight gradients == dense gradients" if self.sharded else \
            "all-reduced weight gradients == dense gradients"
        return {f"parity.{source}.grads": (all(torch.allclose(g, r, **TOL) for g, r in zip(got, ref, strict=True)),
                                           what)}

    def read(self, view: View, module: HloModule) -> View:
        if view.source == "hlo":  # the entry's array parameters (scalars: torch_xla's lifted loss constants)
            params = [module.instructions[n] for n in module.computations[module.entry]
                      if module.instructions[n].opcode == "parameter"]
            view.add("param.bytes", sum(i.nbytes for i in params if any(a.dims for a in i.shape)), "bytes")
        if self.sharded:
            return view
        return only(_group_check(_wire(view, self.ops, module), module, self.p.val_world), "all-reduce")


# ------------------------------------------------------------------------------------------------ FSDP units
@dataclass(frozen=True)
class UnitsCase(ValidationCase):
    """Our FlatUnit rank program (notebook 05's, ``shardlab.fsdp.train``) on val_world simulated ranks:
    Linear(h, ffn) -> tanh -> Linear(ffn, h + 1) (an uneven numel, so the flat units pad), trained one step with
    Adam; the first Linear is an inner FSDP unit (resharded after forward), the root unit holds the second."""

    ops: ClassVar[tuple[str, ...]] = ("all_gather", "reduce_scatter")

    @property
    def flat(self) -> FlatCase:
        """Notebook 05's case at the validation sizes: one Adam step, the first Linear an inner unit."""
        p = self.p
        return FlatCase(FsdpParams(world_size=p.val_world, layer_sizes=(p.val_hidden, p.val_ffn, p.val_hidden + 1),
                                   batch=p.val_tokens, steps=1, seed=p.seed, num_devices=p.num_devices),
                        nested=True, optimizer="adam")

    def unit_numels(self) -> tuple[int, int]:
        """(inner, root) parameter counts: weights + biases of Linear(h, ffn) and Linear(ffn, h + 1)."""
        h, f = self.p.val_hidden, self.p.val_ffn
        return h * f + f, f * (h + 1) + h + 1

    def formula(self) -> View:
        """flat_step_comm per unit (the inner unit all-gathered in forward and again in backward, the root unit
        once) and the padded ZeRO-3 model state, fp32 Adam (4 + 4 + 8 bytes per element)."""
        inner, root = self.unit_numels()
        w = self.p.val_world
        units: list[FlatStepComm] = [flat_step_comm(inner, w, E), flat_step_comm(root, w, E, root=True)]
        state = memory.model_state_bytes(inner + root, fsdp=w, stage=3, param_bytes=E, grad_bytes=E, k=8,
                                         flat_units=[inner, root])
        counts = {"all_gather": sum(u.all_gather_count for u in units),
                  "reduce_scatter": sum(u.reduce_scatter_count for u in units)}
        payload = {"all_gather": sum(u.all_gather_bytes for u in units),
                   "reduce_scatter": sum(u.reduce_scatter_bytes for u in units)}
        view = traffic(View("formula", detail={"units": units, "state": state}), PHASE, counts, payload, DTYPE,
                       self.ops)
        view.add(f"{PHASE}.wire_bytes", sum(u.wire_bytes(w) for u in units), "bytes")
        view.add("model_state.bytes", state.total, "bytes")
        return view

    def program(self) -> list[Program]:
        return [(fsdp_rank_program, (self.flat,))]

    def oracle(self) -> float:
        """The full-batch loss before any update (unsharded torch)."""
        return reference_train(self.flat)[1][0]

    def parity(self, source: str, got: list[RankResult], ref: float) -> Checks:
        # Training parity of this rank program with unsharded torch.optim is notebook 05's subject (and its tests'):
        # here one Adam step, lr·g/(|g| + eps), would turn summation-order noise in near-zero gradients into
        # differences of up to lr, so only the loss before any update is compared.
        mean = sum(r.losses[0] for r in got) / len(got)  # mean of per-rank means over T / world rows each
        return {"parity.ledger.loss": (abs(mean - ref) <= 1e-5 * abs(ref),
                                       f"mean of the ranks' losses {mean:.6f} == full-batch loss {ref:.6f}")}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[RankResult]) -> View:
        view.add(f"{PHASE}.wire_bytes", ring.ledger_wire_bytes(ledger), "bytes")  # along the ring schedule
        view.add("model_state.bytes", sum(results[0].persistent_bytes.values()), "bytes")
        return view


# ------------------------------------------------------------------------------------------------ pipeline
PIPELINE_PRESET = {"stages": 8, "microbatches": (8, 16), "rows": 512, "hidden": 512}  # one tanh layer per stage, f32
PIPELINE_FILE = MATRIX_DIR / "planner_pipeline.json"


@dataclass
class PipelineCheck:
    """The planner's per-stage terms of a GPipe pipeline against XLA:TPU's per-chip bytes of the circular (SPMD)
    pipeline (``shardlab.pipeline.spmd``: p stages of one layer y = tanh(x W), W [h, h], microbatches [rows, h],
    fp32), compiled at two microbatch counts m: the difference is what one more microbatch costs."""

    stages: int
    rows: int
    hidden: int
    topology: str
    compiler: dict[str, dict[str, int]]  # str(m) -> {"argument", "weights", "checked_temp", "output"} per chip
    compile_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineCheck:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @property
    def message(self) -> int:
        """One microbatch's activation on one stage, [rows, h] fp32: what a stage boundary hands over."""
        return self.rows * self.hidden * E

    def formula(self) -> dict[str, float]:
        """The planner's terms for one stage: its weights (L / p layers of h² elements), and what one more
        microbatch adds — GPipe holds every microbatch in flight (``formulas.pipeline.peak_inflight``), each
        keeping, per layer, the tanh layer's input (for dW) and output (for tanh'); the SPMD loop also keeps one
        slot of its input stream and of its outputs per iteration (T = m + p - 1: one more per microbatch)."""
        (m1, m2), p = sorted(int(m) for m in self.compiler), self.stages
        inflight = fpp.peak_inflight("gpipe", p, m2) - fpp.peak_inflight("gpipe", p, m1)
        kept = inflight / (m2 - m1) * 1 * 2 * self.message  # layers per stage 1, two [rows, h] per layer
        loop = (fpp_iterations(p, m2) - fpp_iterations(p, m1)) / (m2 - m1) * 2 * self.message
        return {"weights per stage": self.hidden**2 * E, "per microbatch (GPipe stage)": kept,
                "per microbatch (+ the SPMD loop's stream and output slots)": kept + loop}

    def measured(self) -> dict[str, float]:
        """The compiler's: the stage's weight argument (W's per-chip shard [v, 1, h, h] in the program's entry
        layout); the temporaries' growth per microbatch between the two compiles."""
        (m1, m2) = sorted(int(m) for m in self.compiler)
        c1, c2 = self.compiler[str(m1)], self.compiler[str(m2)]
        per = (c2["checked_temp"] - c1["checked_temp"]) / (m2 - m1)
        return {"weights per stage": c1["weights"], "per microbatch (GPipe stage)": per,
                "per microbatch (+ the SPMD loop's stream and output slots)": per}

    def text(self) -> str:
        """The comparison in words, from the data (Markdown)."""
        f, c = self.formula(), self.measured()
        k1, k2, k3 = f
        return (f"- Weights per stage: compiler {c[k1]:,.0f} B, planner {f[k1]:,.0f} B.\n"
                f"- One more microbatch: compiler +{c[k2]:,.0f} B per chip; the planner's GPipe stage +{f[k2]:,.0f} B "
                f"({c[k2] / f[k2]:.2f}×), with the SPMD loop's stream and output slots +{f[k3]:,.0f} B "
                f"({c[k3] / f[k3]:.3f}×).")

    def frame(self) -> pd.DataFrame:
        f, c = self.formula(), self.measured()
        return pd.DataFrame([{"term": k, "planner": f[k], "compiler (XLA:TPU)": c[k],
                              "compiler / planner": round(c[k] / f[k], 3)} for k in f]).set_index("term")


def fpp_iterations(p: int, m: int) -> int:
    """The SPMD loop's trip count T = m + p - 1 (GPipe: fill and drain included)."""
    return m + p - 1


def pipeline_check(preset: dict[str, Any] | None = None) -> PipelineCheck:
    """Compile the SPMD GPipe pipeline of ``preset`` (default :data:`PIPELINE_PRESET`) at both microbatch counts
    through the harness's TPU view (notebook 09's ScheduleCase graph)."""
    q = {**PIPELINE_PRESET, **(preset or {})}
    compiler, secs, topo = {}, 0.0, ""
    for m in q["microbatches"]:
        pp = PipelineParams(stages=q["stages"], microbatches=m, virtual=2, batch=m, seq=q["rows"], hidden=q["hidden"],
                            layers=2 * q["stages"], num_devices=runtime.current().num_devices)
        view = harness.tpu(ScheduleCase(pp, "gpipe"))
        if not view.ran:
            raise ValueError(f"the pipeline's TPU view is skipped: {view.skipped}")
        c: TpuCompile = view.detail
        h = q["hidden"]
        w = [a for a in entry_layout(c.hlo_text)[0] if len(a.dims) == 4 and a.dims[-2:] == (h, h)]  # W [v, 1, h, h]
        compiler[str(m)] = {"argument": c.memory.argument, "weights": sum(a.nbytes for a in w),
                            "checked_temp": c.memory.checked_temp, "output": c.memory.output}
        secs, topo = secs + c.compile_s, c.topology
    return PipelineCheck(q["stages"], q["rows"], q["hidden"], topo, compiler, secs)


def record_pipeline(rec: Recorder, pipe: PipelineCheck) -> None:
    """The planner's two pipeline terms (formula) and the checks against the cached compiles: a stage's weights
    exactly; one more microbatch within 5 % of the planner's GPipe stage plus the SPMD loop's two slots."""
    f, c = pipe.formula(), pipe.measured()
    weights, _, per = f
    rec.measure("planner.pipeline_check.weights_per_stage.bytes", f[weights], "bytes", "formula")
    rec.measure("planner.pipeline_check.per_microbatch.bytes", f[per], "bytes", "formula")
    rec.check("planner.pipeline_check: a stage's weights = the compiler's weight argument", f[weights] == c[weights],
              f"{c[weights]:,} vs {f[weights]:,} B")
    rec.check("planner.pipeline_check: one more microbatch costs what the planner + the SPMD loop's slots say (5 %)",
              abs(c[per] / f[per] - 1) < 0.05, f"{c[per]:,.0f} vs {f[per]:,.0f} B")


def load_pipeline(path: Path = PIPELINE_FILE) -> tuple[PipelineCheck, dict[str, Any]]:
    results, source = load_results(path, PipelineCheck.from_dict, "run tools/scale_full_size.py pipeline")
    return results["gpipe"], source
